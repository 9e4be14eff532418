// The persistent decode step's device primitives (persist.cu), shared with the prototype it
// came from (bench/bench_cuda_persist.cu): mbarriers, bulk copies into shared memory with an L2
// policy, activations as tagged 64-bit words (a value's float bits low, the tag of the phase
// and launch that stored it high, stored and read whole), and a warp's dot product of its
// 1024 F16 or BF16 weights of a 16 KiB tile. Plain CUDA (C++17), sm_90.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace ferry::cuda::psync {

using Word = unsigned long long;

// A tile: one ring stage, 8192 F16 or BF16 weights (tile_dot: 8 warps of 1024 each).
constexpr int kTileBytes = 16384;

// A step's phases: each layer's q/k/v, attention, wo, gate/up and down, then the output.
enum Kind : int { kQkvK, kAttnK, kWoK, kGuK, kDownK, kOutK };

// A block's shared memory, in order: a ring of Stages tiles, ScratchFloats floats of scratch,
// Consumers reduction words, every consumer warp's sum of each of the block's tiles of the
// largest phase (max_tiles of them), then the full and empty barriers (8-byte aligned: every
// part before them is a multiple of 8 bytes). The kernel places its parts and the host sizes
// the launch by this one layout.
template <int Stages, int ScratchFloats, int Consumers>
struct RingLayout {
    static_assert(ScratchFloats % 2 == 0 && Consumers % 2 == 0,
                  "the barriers must stay 8-byte aligned");
    int max_tiles;
    __host__ __device__ size_t scratch() const { return static_cast<size_t>(Stages) * kTileBytes; }
    __host__ __device__ size_t red() const { return scratch() + sizeof(float) * ScratchFloats; }
    __host__ __device__ size_t part() const { return red() + sizeof(float) * Consumers; }
    __host__ __device__ size_t barriers() const {
        return part() + sizeof(float) * static_cast<size_t>(max_tiles) * Consumers;
    }
    __host__ __device__ size_t bytes() const { return barriers() + sizeof(uint64_t) * 2 * Stages; }
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ bool mbar_try(uint64_t* b, unsigned parity) {
    uint32_t ok;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
    return ok != 0;
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ uint64_t evict_first() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* b,
                                          uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
        "[%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(b)), "l"(policy)
        : "memory");
}
__device__ __forceinline__ Word ld_word(const Word* p) {
    Word v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ void ld_words2(const Word* p, Word& a, Word& b) {
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p));
}
__device__ __forceinline__ void st_word(Word* p, float v, unsigned tag) {
    const Word w = static_cast<Word>(tag) << 32 | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned tag_word(Word w) {
    return static_cast<unsigned>(w >> 32);
}
__device__ __forceinline__ float val_word(Word w) {
    return __uint_as_float(static_cast<unsigned>(w));
}
// A barrier of a block's Consumers consumer warps alone (named barrier 1: the producer warp
// never joins it).
template <int Consumers>
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(32 * Consumers) : "memory");
}
// A reduction (op: a sum or a max) over the consumers' threads (red: Consumers floats), the
// same in every thread.
template <int Consumers, class Op>
__device__ float consumers_reduce(float v, float* red, float init, Op op) {
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red[warp] = v;
    consumers_sync<Consumers>();
    float s = init;
    for (int w = 0; w < Consumers; w++) s = op(s, red[w]);
    consumers_sync<Consumers>();  // red read by all before its next use
    return s;
}
template <int Consumers>
__device__ float consumers_sum(float v, float* red) {
    return consumers_reduce<Consumers>(v, red, 0.0f, [](float x, float y) { return x + y; });
}
template <int Consumers>
__device__ float consumers_max(float v, float* red) {
    return consumers_reduce<Consumers>(v, red, -INFINITY,
                                       [](float x, float y) { return fmaxf(x, y); });
}

// Tile `tile` of a phase's weights into the stage at dst, completing on the barrier `full`
// (which expects its bytes): from up to three row-major matrices one after another (seg[i]
// tiles each), or, paired (gate/up), half a tile from each of w[0] and w[1] (gate rows, then
// the same rows of up).
// (T: the weights' element type, or bytes; only their addresses are read.)
template <typename T>
__device__ __forceinline__ void copy_tile(unsigned char* dst, const T* const (&w)[3],
                                          const int64_t (&seg)[3], bool paired, int64_t tile,
                                          uint64_t* full, uint64_t policy) {
    mbar_expect(full, kTileBytes);
    if (paired) {
        constexpr int kHalf = kTileBytes / 2;
        bulk_copy(dst, reinterpret_cast<const unsigned char*>(w[0]) + tile * kHalf, kHalf, full,
                  policy);
        bulk_copy(dst + kHalf, reinterpret_cast<const unsigned char*>(w[1]) + tile * kHalf, kHalf,
                  full, policy);
        return;
    }
    // (selects, not an index: the phase stays in registers)
    int64_t t = tile;
    const T* m = w[0];
    if (t >= seg[0]) {
        t -= seg[0];
        m = w[1];
        if (t >= seg[1]) {
            t -= seg[1];
            m = w[2];
        }
    }
    bulk_copy(dst, reinterpret_cast<const unsigned char*>(m) + t * kTileBytes, kTileBytes, full,
              policy);
}

// A warp's dot product of its 1024 weights of a tile with v: 4 chains. Bf16: the weights are
// BF16 (a float's high half: exact as a float by a shift), else F16.
template <bool Bf16 = false>
__device__ __forceinline__ float tile_dot(const unsigned char* stage, int e0, int lane,
                                          const float (&v)[32]) {
    const uint4* src = reinterpret_cast<const uint4*>(stage + e0 * 2);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 w = src[j * 32 + lane];
        if constexpr (Bf16) {
            const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int c = 0; c < 4; c++) {
                acc[j] = fmaf(__uint_as_float(u[c] << 16), v[8 * j + 2 * c], acc[j]);
                acc[j] = fmaf(__uint_as_float(u[c] & 0xffff0000u), v[8 * j + 2 * c + 1], acc[j]);
            }
        } else {
            const __half2* h2 = reinterpret_cast<const __half2*>(&w);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float2 f = __half22float2(h2[c]);
                acc[j] = fmaf(f.x, v[8 * j + 2 * c], acc[j]);
                acc[j] = fmaf(f.y, v[8 * j + 2 * c + 1], acc[j]);
            }
        }
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace ferry::cuda::psync
