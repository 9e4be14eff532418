// Shared device helpers for the CUDA kernels: tensor views, element loads/stores, block-format
// decoding, warp/block reductions and the error word.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda-backend.h"
#include "ferry/tensor.h"

namespace ferry::cuda {

// A tensor as a kernel sees it: device address of element 0, elements per dim, byte strides.
struct TV {
    char* p;
    int64_t ne[4];
    int64_t nb[4];
};

inline TV tv(const Tensor* t) {
    TV v;
    v.p = device_ptr(t);
    for (int d = 0; d < 4; d++) {
        v.ne[d] = t->ne[d];
        v.nb[d] = static_cast<int64_t>(t->nb[d]);
    }
    return v;
}

// Host: checks the launch that was just queued.
inline Status launch_status(const char* what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        return Status::errorf("CUDA: %s: kernel launch failed: %s", what, cudaGetErrorString(e));
    }
    return Status::ok();
}

inline unsigned n_blocks(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads;
    return static_cast<unsigned>(b < 1 ? 1 : (b > 0x7fffffff ? 0x7fffffff : b));
}

// Programmatic dependent launch (sm_90; FERRY_CUDA_PDL=0 turns it off): a kernel launched
// with launch_pdl may start while the kernel before it in the stream is still running (once
// every block of that one has called pdl_trigger), so its launch and whatever it does before
// pdl_wait (prefetching weights) overlap that kernel's tail. It must call pdl_wait before it
// reads anything an earlier kernel wrote or writes anything; pdl_wait returns once the
// previous kernel has completed and its writes are visible. Both are no-ops in a kernel
// launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Asks for the 128-byte lines of [p, p + n) in L2 (a hint; lanes of a warp share the work).
__device__ __forceinline__ void prefetch_l2(const char* p, int64_t n, int lane) {
    for (int64_t o = static_cast<int64_t>(lane) * 128; o < n; o += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
    }
}

// Weights asked for in L2 (L2Ask) by warp gw of a launch's W: the gw-th of W runs of each
// range, a multiple of 256 bytes, with one bulk prefetch (nothing comes back to the SM). Lane 0.
__device__ __forceinline__ void l2_ask(const L2Ask& a, int64_t gw, int64_t W) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
    for (int j = 0; j < 3; j++) {
        if (j >= a.n) break;
        const int64_t per = (static_cast<int64_t>(a.bytes[j]) / 256 + W - 1) / W * 256;
        const int64_t o0 = gw * per, o1 = min(static_cast<int64_t>(a.bytes[j]), o0 + per);
        if (o0 >= o1) continue;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a.p[j] + o0),
                     "r"(static_cast<uint32_t>(o1 - o0))
                     : "memory");
    }
#endif
}

bool pdl_enabled();

// Bulk copies from global into shared memory on the copy engine of the multiprocessor (sm_90
// cp.async.bulk, completion counted in bytes on an mbarrier): a thread issues a whole stage of
// weights with one instruction and no registers held, and the block waits on the barrier's
// phase. Addresses and sizes must be multiples of 16 bytes. On older architectures these
// compile to nothing; their launchers never choose a kernel that uses them (sm_90 only).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
                 : "memory");
#endif
}
// Makes initialized barriers visible to the copy engine (then a __syncthreads for the block).
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// One arrival that also announces `bytes` of copies to come on this phase.
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
#endif
}
// Weights are read once a token, 2.5 GB of them (1B F16) through a 50 MB L2: marked
// evict-first, they leave L2 to what is read again soon (the activations, the KV cache, the
// kernels' code). Measured on an H100 (bench/results/cuda.md, stop 42 call C, side by side):
// 1B tg128 F16 936-949 t/s against 911-929, Q4_0 1,645-1,677 against 1,616-1,638, BF16
// 941-952 against 916-925. The matrix-vector forms' weight reads take it: every bulk copy,
// the F32/F16/BF16 loads and the streaming form's Q4_0 and Q6_K block-lane loads (the int8
// kernel's and the float kernel's direct reads of the other formats do not: their decoders
// also read copies in shared memory, where a global-only load is an error).
// -DFERRY_CUDA_NO_EVICT_FIRST builds the plain reads, for before/after measurements.
#ifndef FERRY_CUDA_NO_EVICT_FIRST
#define FERRY_CUDA_EVICT_FIRST 1
#endif
__device__ __forceinline__ uint64_t l2_evict_first() {
    uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}
__device__ __forceinline__ void bulk_to_smem(void* dst, const void* src, uint32_t bytes,
                                             uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef FERRY_CUDA_EVICT_FIRST
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
        "[%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(l2_evict_first())
        : "memory");
#else
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
#endif
#endif
}
// A weight's 16 or 4 bytes from global memory (read-only for the kernel), evict-first in L2.
__device__ __forceinline__ uint4 ld_weight16(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && defined(FERRY_CUDA_EVICT_FIRST)
    uint4 v;
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(l2_evict_first()));
    return v;
#else
    return *static_cast<const uint4*>(p);
#endif
}
__device__ __forceinline__ uint32_t ld_weight4(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && defined(FERRY_CUDA_EVICT_FIRST)
    uint32_t v;
    asm volatile("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;"
                 : "=r"(v)
                 : "l"(p), "l"(l2_evict_first()));
    return v;
#else
    return *static_cast<const uint32_t*>(p);
#endif
}
// Orders this thread's earlier shared-memory accesses before its later bulk copies (a slot
// read by the warp, then refilled by one of its lanes after a __syncwarp).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n\t.reg .pred done;\n"
        "WAIT_%=:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
        "@!done bra WAIT_%=;\n}" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
#endif
}

// 16-byte asynchronous copies from global into shared memory (sm_80 cp.async, L2 only): the
// thread issues them and goes on; cp_async_wait_all (then a __syncthreads for other
// threads' copies) waits for the thread's own. Addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src)
                 : "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_all;" ::: "memory");
#endif
}

template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t st, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// ---------------------------------------------------------------------------------------------
// Device side

// FERRY_HD: the element decoders below (and the matrix-vector kernels' block decoders in
// mv-common.cuh) compile for the host too, so that tests/test_cuda_decoders.cu checks them
// against the CPU dequantizers on a machine without a GPU. Device code is the same as with
// __device__ alone.
#define FERRY_HD __host__ __device__ __forceinline__
// #pragma unroll inside FERRY_HD functions (the host compiler does not know it).
#ifdef __CUDA_ARCH__
#define FERRY_UNROLL _Pragma("unroll")
#else
#define FERRY_UNROLL
#endif

FERRY_HD float bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    return std::bit_cast<float>(u);
#endif
}

// dp4a, funnel_r and byte_perm: the intrinsics __dp4a, __funnelshift_r and __byte_perm on the
// device, and their definitions in the CUDA math API on the host (the block-lane decoders'
// host test): the sum of a's and b's signed bytes multiplied pairwise, plus c; the low 32 bits
// of hi:lo shifted right by sh % 32; byte n of the result is byte ((s >> 4n) & 7) of y:x.
FERRY_HD int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++) {
        c += static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i)) *
             static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
    }
    return c;
#endif
}
FERRY_HD uint32_t funnel_r(uint32_t lo, uint32_t hi, uint32_t sh) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, sh);
#else
    return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (sh & 31u));
#endif
}
FERRY_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t in = (static_cast<uint64_t>(y) << 32) | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) {
        const uint32_t sel = (s >> (4 * n)) & 7u;
        r |= static_cast<uint32_t>((in >> (8 * sel)) & 0xffu) << (8 * n);
    }
    return r;
#endif
}

FERRY_HD float h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
FERRY_HD float bf2f(uint16_t h) {
    return bits_to_float(static_cast<uint32_t>(h) << 16);
}
FERRY_HD uint16_t f2h(float f) {
    return __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ uint16_t f2bf(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
FERRY_HD uint16_t ld16(const char* p) {
    return *reinterpret_cast<const uint16_t*>(p);
}
// Four bytes at a 2-byte aligned address (block formats keep only fp16 alignment).
FERRY_HD uint32_t ld32_a2(const char* p) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(q[0]) | (static_cast<uint32_t>(q[1]) << 16);
}

// Records the first data error (op + 1, offending value, range end, position) and lets the
// kernel skip the write.
__device__ __forceinline__ void report_error(DeviceError* err, Op op, int64_t value, int64_t limit,
                                             int64_t where) {
    if (atomicCAS(&err->code, 0, static_cast<int32_t>(op) + 1) == 0) {
        err->value = static_cast<int32_t>(value);
        err->limit = limit;
        err->where = where;
        __threadfence_system();
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* sh /* >= 32 floats */) {
    v = warp_sum(v);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    const int nw = blockDim.x / 32;
    v = l < nw ? sh[l] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* sh) {
    v = warp_max(v);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    const int nw = blockDim.x / 32;
    v = l < nw ? sh[l] : -INFINITY;
    return warp_max(v);
}

// ---------------------------------------------------------------------------------------------
// ROPE's rotation for pair i of n_dims at position pos: (cos, sin) of the angle computed in
// double from the exact power, as the reference and the CPU kernel do (long positions keep
// full precision), divided by frequency factor i when ff is given (F32, stride ff_nb0). Every
// kernel that rotates (ROPE, and the decode products' rope epilogue) calls this one function,
// so a fused rotation is bit for bit the unfused one.
__device__ __forceinline__ float2 rope_cos_sin(double pos, int i, int n_dims, double base,
                                               double fscale, const char* ff, int64_t ff_nb0) {
    const double f =
        ff ? static_cast<double>(*reinterpret_cast<const float*>(ff + i * ff_nb0)) : 1.0;
    const double theta = pos * fscale * pow(base, -2.0 * i / static_cast<double>(n_dims)) / f;
    double sd, cd;
    sincos(theta, &sd, &cd);
    return make_float2(static_cast<float>(cd), static_cast<float>(sd));
}

// ---------------------------------------------------------------------------------------------
// Element i of a row of any storage type (block formats decoded with the GGUF formulas, the
// same float operations as the reference dequantizers).

FERRY_HD void k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The 16 values of a 4-bit code table (IQ4_NL's, MXFP4's) as two words of bytes, so that
// device code looks a code up without a table in memory.
constexpr uint64_t pack_codes(const int8_t* v, int from) {
    uint64_t w = 0;
    for (int k = 7; k >= 0; k--) w = (w << 8) | static_cast<uint8_t>(v[from + k]);
    return w;
}
constexpr uint64_t kIq4Lo = pack_codes(kIQ4NLValues, 0), kIq4Hi = pack_codes(kIQ4NLValues, 8);
constexpr uint64_t kFp4Lo = pack_codes(kMXFP4Values, 0), kFp4Hi = pack_codes(kMXFP4Values, 8);
FERRY_HD float code_value(uint64_t lo, uint64_t hi, int c) {
    const uint64_t w = c < 8 ? lo : hi;
    return static_cast<float>(static_cast<int8_t>((w >> (8 * (c % 8))) & 0xff));
}
// Element j's nibble of a 32-element block laid out as Q4_0 (low nibbles, then high ones).
FERRY_HD int block_nibble(const char* qs, int j) {
    const uint8_t q = static_cast<uint8_t>(qs[j % 16]);
    return j < 16 ? (q & 0x0f) : (q >> 4);
}
// 2^(e - 128) (types.h: e8m0_to_fp32_half).
FERRY_HD float e8m0_half(uint8_t e) {
    return bits_to_float(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}
// Q3_K group g's signed scale (sc - 32): low 4 bits from scales[g] or scales[g - 8] >> 4, high
// 2 bits from scales[8 + g % 4] (sc: the block's 12 scale bytes).
FERRY_HD int q3k_scale(const uint8_t* sc, int g) {
    const int lo = g < 8 ? sc[g] & 0x0f : sc[g - 8] >> 4;
    const int hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}
// IQ4_XS sub-block j's signed scale (ls - 32): low 4 bits in scales_l[j / 2], high 2 bits at
// bit 2j of scales_h (b: the block).
FERRY_HD int iq4xs_scale(const uint8_t* b, int j) {
    const int scales_h = b[2] | (b[3] << 8);
    const int lo = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0f;
    return (lo | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
}
// Bit j of a block's 4 bytes of high bits (Q5_0/Q5_1's qh, little-endian).
FERRY_HD int qh_bit(const char* qh, int j) {
    return (static_cast<uint8_t>(qh[j / 8]) >> (j % 8)) & 1;
}

FERRY_HD float load_elem(Type t, const char* row, int64_t i) {
    switch (t) {
        case Type::F32:
            return reinterpret_cast<const float*>(row)[i];
        case Type::F16:
            return h2f(reinterpret_cast<const uint16_t*>(row)[i]);
        case Type::BF16:
            return bf2f(reinterpret_cast<const uint16_t*>(row)[i]);
        case Type::I32:
            return static_cast<float>(reinterpret_cast<const int32_t*>(row)[i]);
        case Type::Q4_0: {
            const char* b = row + (i / 32) * 18;
            return static_cast<float>(block_nibble(b + 2, i % 32) - 8) * h2f(ld16(b));
        }
        case Type::Q4_1: {
            const char* b = row + (i / 32) * 20;
            return static_cast<float>(block_nibble(b + 4, i % 32)) * h2f(ld16(b)) +
                   h2f(ld16(b + 2));
        }
        case Type::Q8_0: {
            const char* b = row + (i / 32) * 34;
            return static_cast<float>(static_cast<int8_t>(b[2 + i % 32])) * h2f(ld16(b));
        }
        case Type::Q4_K:
        case Type::Q5_K: {
            const bool q5 = t == Type::Q5_K;
            const char* b = row + (i / 256) * (q5 ? 176 : 144);
            const int e = static_cast<int>(i % 256);
            const int j = e / 32, l = e % 32, c = j / 2;
            int sc, mn;
            k_scale_min(reinterpret_cast<const uint8_t*>(b + 4), j, &sc, &mn);
            const uint8_t* qs = reinterpret_cast<const uint8_t*>(b + (q5 ? 48 : 16));
            const uint8_t byte = qs[32 * c + l];
            int q = (j % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
            if (q5) {
                const uint8_t hi = static_cast<uint8_t>(b[16 + l]);
                q |= ((hi >> j) & 1) << 4;
            }
            const float ds = h2f(ld16(b)) * static_cast<float>(sc);
            const float dm = h2f(ld16(b + 2)) * static_cast<float>(mn);
            return ds * static_cast<float>(q) - dm;
        }
        case Type::Q6_K: {
            const uint8_t* b = reinterpret_cast<const uint8_t*>(row + (i / 256) * 210);
            const int e = static_cast<int>(i % 256);
            const int h = e / 128, r = e % 128, part = r / 32, l = r % 32;
            const uint8_t qlb = b[64 * h + l + ((part & 1) ? 32 : 0)];
            const int lo = (part >= 2) ? (qlb >> 4) : (qlb & 0x0f);
            const int hi = (b[128 + 32 * h + l] >> (2 * part)) & 3;
            const int q = (lo | (hi << 4)) - 32;
            const int8_t sc = static_cast<int8_t>(b[192 + e / 16]);
            const float d = h2f(static_cast<uint16_t>(b[208] | (b[209] << 8)));
            return d * static_cast<float>(sc) * static_cast<float>(q);
        }
        // The element-read formats (ops.h elem_type): GET_ROWS and the generic product
        // kernel, with the CPU dequantizers' formulas and order of operations
        // (src/core/quants.cpp).
        case Type::Q5_0: {
            const char* b = row + (i / 32) * 22;
            const int j = static_cast<int>(i % 32);
            const int q = block_nibble(b + 6, j) | (qh_bit(b + 2, j) << 4);
            return static_cast<float>(q - 16) * h2f(ld16(b));
        }
        case Type::Q5_1: {
            const char* b = row + (i / 32) * 24;
            const int j = static_cast<int>(i % 32);
            const int q = block_nibble(b + 8, j) | (qh_bit(b + 4, j) << 4);
            return static_cast<float>(q) * h2f(ld16(b)) + h2f(ld16(b + 2));
        }
        case Type::Q2_K: {
            const uint8_t* b = reinterpret_cast<const uint8_t*>(row + (i / 256) * 84);
            const int e = static_cast<int>(i % 256);
            const int h = e / 128, sh = (e % 128) / 32, l = e % 32, g = e / 16;
            const int q = (b[16 + 32 * h + l] >> (2 * sh)) & 3;
            const float d = h2f(static_cast<uint16_t>(b[80] | (b[81] << 8)));
            const float dmin = h2f(static_cast<uint16_t>(b[82] | (b[83] << 8)));
            const float dl = d * static_cast<float>(b[g] & 0x0f);
            const float ml = dmin * static_cast<float>(b[g] >> 4);
            return dl * static_cast<float>(q) - ml;
        }
        case Type::Q3_K: {
            const uint8_t* b = reinterpret_cast<const uint8_t*>(row + (i / 256) * 110);
            const int e = static_cast<int>(i % 256);
            const int h = e / 128, sh = (e % 128) / 32, l = e % 32, g = e / 16;
            const int low = (b[32 + 32 * h + l] >> (2 * sh)) & 3;
            const int high = (b[l] >> (4 * h + sh)) & 1;
            const int q = (low | (high << 2)) - 4;
            const float d = h2f(static_cast<uint16_t>(b[108] | (b[109] << 8)));
            return d * static_cast<float>(q3k_scale(b + 96, g)) * static_cast<float>(q);
        }
        case Type::IQ4_NL: {
            const char* b = row + (i / 32) * 18;
            return h2f(ld16(b)) * code_value(kIq4Lo, kIq4Hi, block_nibble(b + 2, i % 32));
        }
        case Type::IQ4_XS: {
            const uint8_t* b = reinterpret_cast<const uint8_t*>(row + (i / 256) * 136);
            const int e = static_cast<int>(i % 256);
            const int j = e / 32;
            const float dl = h2f(static_cast<uint16_t>(b[0] | (b[1] << 8))) *
                             static_cast<float>(iq4xs_scale(b, j));
            const char* qs = reinterpret_cast<const char*>(b + 8 + 16 * j);
            return dl * code_value(kIq4Lo, kIq4Hi, block_nibble(qs, e % 32));
        }
        case Type::MXFP4: {
            const char* b = row + (i / 32) * 17;
            return e8m0_half(static_cast<uint8_t>(b[0])) *
                   code_value(kFp4Lo, kFp4Hi, block_nibble(b + 1, i % 32));
        }
        default:
            return 0.0f;
    }
}

__device__ __forceinline__ void store_plain(Type t, char* row, int64_t i, float v) {
    switch (t) {
        case Type::F32:
            reinterpret_cast<float*>(row)[i] = v;
            break;
        case Type::F16:
            reinterpret_cast<uint16_t*>(row)[i] = f2h(v);
            break;
        case Type::BF16:
            reinterpret_cast<uint16_t*>(row)[i] = f2bf(v);
            break;
        case Type::I32:
            reinterpret_cast<int32_t*>(row)[i] = static_cast<int32_t>(v);
            break;
        default:
            break;
    }
}

// Round to nearest even and clamp, as the reference quantizers do (NaN lands on lo).
FERRY_HD int round_clamp(float v, int lo, int hi) {
    if (!(v >= static_cast<float>(lo))) return lo;
    if (v >= static_cast<float>(hi)) return hi;
#ifdef __CUDA_ARCH__
    return __float2int_rn(v);
#else
    return static_cast<int>(std::nearbyint(v));  // (to nearest, ties to even, as on the GPU)
#endif
}

// Quantizes one block of 32 floats into Q4_0 / Q4_1 / Q8_0 (the reference algorithms).
__host__ __device__ inline void quantize_block(Type t, const float* x, char* dst) {
    if (t == Type::Q8_0) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const uint16_t dh = f2h(amax / 127.0f);
        const float d = h2f(dh);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        *reinterpret_cast<uint16_t*>(dst) = dh;
        for (int j = 0; j < 32; j++)
            dst[2 + j] = static_cast<char>(round_clamp(x[j] * id, -127, 127));
    } else if (t == Type::Q4_0) {
        float best = 0.0f;
        for (int j = 0; j < 32; j++) {
            if (fabsf(x[j]) > fabsf(best)) best = x[j];
        }
        const uint16_t dh = f2h(best / -8.0f);
        const float d = h2f(dh);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        *reinterpret_cast<uint16_t*>(dst) = dh;
        for (int j = 0; j < 16; j++) {
            const int lo = round_clamp(x[j] * id, -8, 7) + 8;
            const int hi = round_clamp(x[j + 16] * id, -8, 7) + 8;
            dst[2 + j] = static_cast<char>(lo | (hi << 4));
        }
    } else if (t == Type::Q4_1) {
        float lo = x[0], hi = x[0];
        for (int j = 1; j < 32; j++) {
            lo = fminf(lo, x[j]);
            hi = fmaxf(hi, x[j]);
        }
        const uint16_t dh = f2h((hi - lo) / 15.0f);
        const uint16_t mh = f2h(lo);
        const float d = h2f(dh), m = h2f(mh);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        reinterpret_cast<uint16_t*>(dst)[0] = dh;
        reinterpret_cast<uint16_t*>(dst)[1] = mh;
        for (int j = 0; j < 16; j++) {
            const int q0 = round_clamp((x[j] - m) * id, 0, 15);
            const int q1 = round_clamp((x[j + 16] - m) * id, 0, 15);
            dst[4 + j] = static_cast<char>(q0 | (q1 << 4));
        }
    }
}

}  // namespace ferry::cuda
