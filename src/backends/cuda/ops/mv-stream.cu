// MUL_MAT's streaming matrix-vector forms (decode, one column, F16/BF16/Q4_0/Q6_K weights):
// the register form (k_mv_stream) and the bulk form (k_mv_bulk: pieces in flight in shared
// memory), with their launchers and the host mirror of a progressive product. mul_mat.cu's
// dispatch calls stream_ok and launch_stream (mv-launch.h).
#include <algorithm>
#include <atomic>

#include "backends/cuda/ops/mv-common.cuh"
#include "backends/cuda/ops/mv-launch.h"
#include "backends/cuda/ops/trace.cuh"

namespace ferry::cuda {

namespace {

#ifdef FERRY_CUDA_TRACE
int trace_next_id() {
    return trace_next_id_tu("");
}
#endif

// A warp's run of kMirrorGroup rows from r - r % G, collected a row at a time into its lanes
// (lane i holds row r - r % G + i; v, row r's value, is in every lane; `last`: the warp has no
// further row). *i: row r's index in the run; true once the run is complete (its last row, or
// the warp's), the same in every lane.
__device__ __forceinline__ bool run_stash(int64_t r, float v, bool last, uint32_t& stash, int* i) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    *i = static_cast<int>(r % kMirrorGroup);
    if (lane == *i) stash = __float_as_uint(v);
    return *i == kMirrorGroup - 1 || last;
}

// The host copy of a progressive product (HostMirror). mirror_row: row r (of the warp's run
// of kMirrorGroup rows from r - r % G), its value v in every lane; `last`: the warp has no
// further row. After the run's last row the warp writes its line; after the warp's barrier
// lane 0 fences at gpu scope and counts the warp into the step (a release: the fence is
// cumulative over the lanes' stores the barrier ordered before it); the warp that completes
// the step (every warp with a run in it) fences at system scope, which orders every counted
// warp's line before its flag store for the host (PTX memory model: causality order chains the
// gpu-scope release and acquire through the count's read-modify-writes, then the system-scope
// release). One system fence a step, not one a warp's run: stop 47 (H100, 1B Q4_0 tg128) had
// the run's fence.sc.sys cost 8% of a step with pieces forced on locally, this form 4.8%,
// served over tcp 0.921 -> 0.953 of local.
__device__ __forceinline__ void mirror_row(const MvArgs& g, int64_t r, float v, bool last,
                                           int64_t W, uint32_t& stash) {
    constexpr int G = kMirrorGroup;
    int i;
    if (!run_stash(r, v, last, stash, &i)) return;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int64_t r0 = r - i;
    if (lane <= i) {
        asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(g.mirror.buf + r0 + lane),
                     "r"(stash)
                     : "memory");
    }
    __syncwarp();
    if (lane != 0) return;
    const int64_t runs = (g.M + G - 1) / G;
    const int64_t k = r0 / G / W;
    const uint32_t need = static_cast<uint32_t>(min(W, runs - k * W));
    uint32_t was;
    asm volatile(
        "fence.acq_rel.gpu;\n\t"
        "atom.relaxed.gpu.global.add.u32 %0, [%1], 1;"
        : "=r"(was)
        : "l"(g.mirror.count + k)
        : "memory");
    if (was == need - 1) {
        g.mirror.count[k] = 0u;
        __threadfence_system();  // (acquires the counted warps' lines, releases them)
        asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(g.mirror.flags + k), "r"(1u)
                     : "memory");
    }
}

// The graph's output stored into host memory (MvArgs::host_out): a warp's run of rows written
// as one line once complete (run_stash). No flags: the reader waits for the whole launch.
__device__ __forceinline__ void host_row(float* host, int64_t r, float v, bool last,
                                         uint32_t& stash) {
    int i;
    if (!run_stash(r, v, last, stash, &i)) return;
    const int lane = static_cast<int>(threadIdx.x % 32);
    if (lane <= i) host[r - i + lane] = __uint_as_float(stash);
}

// ---------------------------------------------------------------------------------------------
// Decode, the streaming form (F16, BF16, Q4_0 and Q6_K weights, one column; FERRY_CUDA_MV_STREAM=0
// turns it off, per backend): a grid of at most two blocks per SM whose warps stream their rows
// one piece of 2048 weights after another, D pieces in flight per warp, the first ones issued
// before griddepcontrol.wait (weights never depend on the kernel before). b is put once per
// block into shared memory: as floats for F16/BF16 (stored so that the two float4s a lane
// multiplies with its 8 weights are read by the warp without bank conflicts), quantized to
// int8 in the block-lane form's layout for Q4_0/Q6_K; or computed there, the folded
// [ADD ->] RMS_NORM -> MUL. Measured first (bench/results/cuda.md, stop 25): the float kernel
// read F16 gate/up at 2.4 TB/s and took twice the time of a kernel that only streams the same
// bytes (bench_cuda_floor); its grid runs in waves of short blocks, each a DRAM round trip,
// 1-3 barriers and a reduction, with little in flight between them.
//
// Work items: a row (wo, down, output), a gate/up row pair (glu: silu(a x) * (a2 x)), or rows
// 2i, 2i + 1 of the decode epilogue's segments (rope pairs in one warp; segment ends are
// multiples of kMvWarps). Item i is taken by warp i % W (W warps in the grid). Every row is
// summed the same way, fused or not (each lane adds its pieces in order as the S = 1 forms of
// the other kernels do, then warp_sum), so the fused launches give the bits of the unfused ones.
// Blocks per SM (and the grid). Measured on the H200 (bench/results/cuda.md, stop 26 run D):
// one block per SM, so that a block of the next kernel fits beside it, gave 1B F16 899-908
// t/s against 1,090-1,102 and Q4_0 1,214-1,222 against 1,635-1,659: bytes in flight count
// for more than the overlap.
constexpr int kStreamMinBlocks = 2;
constexpr int64_t kStreamMaxK = 12288;  // F16/BF16: b as floats in at most 48 KiB

// One piece (2048 weights of a row) of a lane: its raw words (load) and their products with b
// (dot); kD pieces in flight per warp.
template <Type T>
struct SPiece {  // F16, BF16: chunks 8p .. 8p + 7, the lane's 8 elements of each (16 bytes)
    static constexpr int kD = 2;
    struct Raw {
        uint4 w[8];
    };
    __device__ static void load(const char* row, int64_t p, int lane, int64_t K, Raw& r) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t e = (p * 8 + j) * 256 + 8 * lane;
#ifdef FERRY_CUDA_EVICT_FIRST
            r.w[j] = e < K ? ld_weight16(row + e * 2)
#else
            r.w[j] = e < K ? __ldg(reinterpret_cast<const uint4*>(row + e * 2))
#endif
                           : make_uint4(0u, 0u, 0u, 0u);
        }
    }
    // b's float4 i (elements 4i .. 4i + 3: chunk c, lane l, half h) at c * 64 + h * 32 + l.
    __device__ static void put(void* smem, int64_t i, float4 v, int) {
        const int64_t c = i / 64, rem = i % 64;
        static_cast<float4*>(smem)[c * 64 + (rem % 2) * 32 + rem / 2] = v;
    }
    static size_t smem_bytes(int64_t K) {
        return static_cast<size_t>((K + 255) / 256) * 1024;
    }
    __device__ static float dot(const Raw& r, int64_t p, int lane, int64_t K, const void* smem,
                                float a) {
        const float4* xs = static_cast<const float4*>(smem);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t c = p * 8 + j;
            if (c * 256 + 8 * lane >= K) continue;
            // The float kernel's decoder and mv_chunk's products and order (d = 1).
            Lane8 w;
            Dec<T>::from_raw(Raw8{r.w[j], make_uint4(0u, 0u, 0u, 0u)}, 0, w);
            a = fmaf(1.0f, dot8(w.q, xs[c * 64 + lane], xs[c * 64 + 32 + lane]), a);
        }
        return a;
    }
};

// Q4_0, Q6_K: span p of the block-lane form (BDec), b as its int8 quants (K / 4 words, in
// BDec's swizzled order) then K / 32 float scales.
template <Type T>
struct SBlkPiece {
    // Measured on the H200 (stop 26 run E): 6 and 4 (a few bytes of spills under the
    // 128-register cap) gave 1B Q4_0 1,544-1,551 t/s against 1,665-1,672.
    static constexpr int kD = T == Type::Q4_0 ? 4 : 3;
    using Raw = typename BDec<T>::Raw;
    __device__ static void load(const char* row, int64_t p, int lane, int64_t K, Raw& r) {
        if (BDec<T>::active(K, p, lane)) BDec<T>::load_raw(row, p, lane, r);
    }
    // Called by whole warps (8 consecutive threads quantize a block of 32).
    __device__ static void put(void* smem, int64_t i, float4 v, int64_t K) {
        int32_t* xq = static_cast<int32_t*>(smem);
        q8_quantize4<true, T>(v, i, static_cast<int>(threadIdx.x % 32), xq,
                              reinterpret_cast<float*>(xq + K / 4));
    }
    static size_t smem_bytes(int64_t K) { return static_cast<size_t>(K + K / 8); }
    __device__ static float dot(const Raw& r, int64_t p, int lane, int64_t K, const void* smem,
                                float a) {
        if (!BDec<T>::active(K, p, lane)) return a;
        const int32_t* xq = static_cast<const int32_t*>(smem);
        BlkX x;
        BDec<T>::load_x(xq, reinterpret_cast<const float*>(xq + K / 4), p, lane, x);
        return BDec<T>::dot_raw(r, p, lane, x, a);
    }
};
template <>
struct SPiece<Type::Q4_0> : SBlkPiece<Type::Q4_0> {};
template <>
struct SPiece<Type::Q6_K> : SBlkPiece<Type::Q6_K> {};

// A warp's walk through its work items (the streaming and the bulk form): item it's row r
// (two rows an item for glu and pair), piece p of ppr; item i goes to warp i % W, or, in a
// mirrored launch (HostMirror, or the output stored into host memory: MvArgs::host_out), warp
// gw takes runs of kMirrorGroup rows, its k-th run rows (k W + gw) G ..., so that each of its
// line writes holds whole rows in order.
template <bool glu, bool pair>
struct StreamWalk {
    static constexpr int kRows = (glu || pair) ? 2 : 1;  // rows loaded per item
    const MvArgs& g;
    int64_t W, items;
    int ppr;
    float* host;  // where the rows also go (MvArgs::host_out), or nullptr
    bool mirrored;
    __device__ StreamWalk(const MvArgs& ga, int64_t w)
        : g(ga),
          W(w),
          items(pair ? ga.M / 2 : ga.M),
          ppr(static_cast<int>((ga.K + 2047) / 2048)),
          host(!glu && !pair && !ga.mirror.buf && ga.host_out ? *ga.host_out : nullptr),
          mirrored(!glu && !pair && (ga.mirror.buf || host)) {}
    __device__ const char* row(int64_t it, int r) const {
        if constexpr (glu) return (r == 0 ? g.a : g.a2) + it * g.a_nb1;
        if constexpr (pair) {
            int64_t ms;
            const int sg = seg_of(g, 2 * it + r, &ms);
            return g.seg[sg].a + ms * g.a_nb1;
        }
        return g.a + it * g.a_nb1;
    }
    __device__ int64_t first(int64_t gw) const { return mirrored ? gw * kMirrorGroup : gw; }
    __device__ int64_t next_item(int64_t it) const {
        if (!mirrored) return it + W;
        return (it + 1) % kMirrorGroup != 0 ? it + 1 : it + 1 + (W - 1) * kMirrorGroup;
    }
    __device__ void advance(int64_t& it, int& r, int& p) const {
        if (++p == ppr) {
            p = 0;
            if (++r == kRows) {
                r = 0;
                it = next_item(it);
            }
        }
    }
    // Item it is summed (v0, v1: its rows' warp sums, in every lane): its epilogue.
    __device__ void done(int64_t it, float v0, float v1, int lane, uint32_t& stash) const {
        if constexpr (pair) {
            int64_t ms;
            const MvSeg& sg = g.seg[seg_of(g, 2 * it, &ms)];
            const float2 y = sg.rope ? rope_pair(g, ms, v0, v1) : make_float2(v0, v1);
            if (lane < 2) epilogue_store(g, sg, ms + lane, lane == 0 ? y.x : y.y);
        } else {
            float v = v0;
            if constexpr (glu) v = v / (1.0f + expf(-v)) * v1;
            if (g.res) v += reinterpret_cast<const float*>(g.res)[it];
            if (lane == 0) g.out[it] = v;
            if (host) {
                host_row(host, it, v, next_item(it) >= items, stash);
            } else if (mirrored) {
                mirror_row(g, it, v, next_item(it) >= items, W, stash);
            }
        }
    }
};

// b into shared memory by P::put: the folded [ADD ->] RMS_NORM -> MUL (g.nx; blocks of
// kMvWarps warps) or g.b's K floats. (The caller's __syncthreads follows.)
template <typename P, bool norm_ok>
__device__ __forceinline__ void stream_put_b(const MvArgs& g, void* smem, float* nred) {
    auto put = [&](int64_t i, float4 v) { P::put(smem, i, v, g.K); };
    if (norm_ok && g.nx) {
        if constexpr (norm_ok) {
            if (g.nfast && norm_fast_ok(g)) {
                NormW nw;
                norm_w_load(g, nw);
                norm_prologue_fast(g, nw, nred, put);
            } else {
                norm_prologue(g, nred, put);
            }
        }
    } else {
        // Up to 8 float4s a thread in one round trip (32 KiB for K = 8192).
        put_b<8>(reinterpret_cast<const float4*>(g.b), g.K / 4, put);
    }
}

// kW warps a block: kMvWarps (two blocks per SM), or 2 * kMvWarps (one block per SM, the same
// warps, so b is loaded and quantized once per SM instead of twice) for Q4_0/Q6_K launches
// without a folded norm (wo, down; the folded norm's bit-exact prologue is built for 256
// threads). Measured on the H200 (bench/results/cuda.md, stop 27 run G, three rounds side by
// side): 1B Q4_0 tg128 1,745-1,760 t/s against 1,633-1,640 (run B's timeline had Q4_0 down's
// prologue, every block loading and quantizing the whole 32 KiB of b, at 3.65 us against 2.14
// of rows); 1B F16, whose b is only copied, 1,078-1,108 against 1,102-1,109, so F16/BF16 keep
// two blocks. FERRY_CUDA_MV_STREAM_WIDE=0 turns it off, =2 takes F16/BF16 too.
template <Type T, bool glu, bool pair, int kW = kMvWarps>
__global__ void __launch_bounds__(32 * kW, kW == kMvWarps ? kStreamMinBlocks : 1)
    k_mv_stream(MvArgs g) {
    using P = SPiece<T>;
    constexpr int D = P::kD;
    constexpr int kRows = StreamWalk<glu, pair>::kRows;
    extern __shared__ __align__(16) float4 sm_b[];
    __shared__ float nred[32];
    void* smem = sm_b;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const StreamWalk<glu, pair> w(g, static_cast<int64_t>(gridDim.x) * kW);
    const int64_t gw = static_cast<int64_t>(blockIdx.x) * kW + warp;
    const int64_t items = w.items;
    const int64_t K = g.K;
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
    uint64_t tr1 = 0, tr2 = 0;
#endif
    pdl_trigger();
    typename P::Raw buf[D];
    // Load cursor: item lit, row lr, piece lp.
    const int64_t first = w.first(gw);
    int64_t lit = first;
    int lr = 0, lp = 0;
#pragma unroll
    for (int s = 0; s < D; s++) {
        if (lit < items) P::load(w.row(lit, lr), lp, lane, K, buf[s]);
        w.advance(lit, lr, lp);
    }
    pdl_wait();
    uint32_t stash = 0;
#ifdef FERRY_CUDA_TRACE
    tr1 = gtime();
#endif
    // (wide blocks are launched without a folded norm)
    stream_put_b<P, kW == kMvWarps>(g, smem, nred);
    __syncthreads();
#ifdef FERRY_CUDA_TRACE
    tr2 = gtime();
#endif
    int64_t cit = first;
    int cr = 0, cp = 0;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
    while (cit < items) {
#pragma unroll
        for (int s = 0; s < D; s++) {
            if (cit >= items) break;
            if constexpr (kRows == 2) {
                if (cr == 0) {
                    acc[0] = P::dot(buf[s], cp, lane, K, smem, acc[0]);
                } else {
                    acc[1] = P::dot(buf[s], cp, lane, K, smem, acc[1]);
                }
            } else {
                acc[0] = P::dot(buf[s], cp, lane, K, smem, acc[0]);
            }
            // The slot's next piece goes out before this item's epilogue.
            if (lit < items) P::load(w.row(lit, lr), lp, lane, K, buf[s]);
            w.advance(lit, lr, lp);
            const int64_t it = cit;
            const bool last = cp + 1 == w.ppr && cr + 1 == kRows;
            w.advance(cit, cr, cp);
            if (!last) continue;
            const float v0 = warp_sum(acc[0]);
            const float v1 = kRows == 2 ? warp_sum(acc[kRows - 1]) : 0.0f;
#pragma unroll
            for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
            w.done(it, v0, v1, lane, stash);
        }
    }
#ifdef FERRY_CUDA_TRACE
    trace_block(g.trace_id, g.M,
                (glu ? 1u : 0u) | (pair ? 2u : 0u) | (g.nx ? 4u : 0u) | 16u |
                    (static_cast<uint32_t>(T) << 8),
                tr0, tr1, tr2, 0, 0);
#endif
}

// The bulk form of the streaming kernel (FERRY_CUDA_MV_BULK=S for F16/BF16 weights, S = 3 in
// two blocks per SM by default, 2 where b's K floats leave no room for 3; FERRY_CUDA_MV_BULK_Q=S
// for Q4_0/Q6_K, off by default: see OpContext::mv_bulk for the measurements): the pieces in flight
// sit in shared memory instead of registers. Each warp owns S slots of one piece (F16/BF16: 2048
// weights, 4 KiB; Q4_0/Q6_K: one span of 2048, 1,152 / 1,680 bytes) with an mbarrier each; its lane
// 0 fills a slot with one bulk copy (cp.async.bulk, completion counted in bytes) and refills it
// once the warp has read it, so the warps need no buffer registers and no block-wide
// synchronization. The plan behind it (bench/results/cuda.md, stops 22, 26, 27, 29): a block
// holds its bytes in flight with few registers, so that with PDL the next kernels' blocks fit
// on the SM beside it and start their own copies while this one drains and while the
// attention runs (the register form fills the register file with two blocks, and one block
// per SM halved its bytes in flight). b: as in the register form (the folded norm's result,
// or Q4_0/Q6_K's int8 quants, in shared memory), except F16/BF16 without a folded norm, whose
// b is read from global memory through L1 (down's 32 KiB stay out of the block's shared
// memory). Same pieces, same decoders, same order of additions: the register form's bits.
constexpr int kBulkMaxSlots = 16;
constexpr int kBulkMinBlocks = 2;  // (a register cap of 128: two such blocks share an SM)

template <Type T>
struct BulkSlot {  // F16, BF16
    static constexpr int64_t kBytes = 4096;
    static constexpr bool kBGlobal = true;  // b may stay in global memory (bulk_x_global)
    __host__ __device__ static int64_t row_bytes(int64_t K) { return K * 2; }
    // b's elements c * 256 + 8 lane .. + 7: float4s 2 lane, 2 lane + 1 of chunk c in global
    // memory, lane and 32 + lane in SPiece::put's shared layout.
    __device__ static float dot(const char* slot, int64_t p, int lane, int64_t K, const void* xb,
                                bool x_global, float a) {
        const float4* xs = static_cast<const float4*>(xb);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t c = p * 8 + j;
            if (c * 256 + 8 * lane >= K) continue;
            const uint4 raw = *reinterpret_cast<const uint4*>(slot + j * 512 + 16 * lane);
            Lane8 w;
            Dec<T>::from_raw(Raw8{raw, make_uint4(0u, 0u, 0u, 0u)}, 0, w);
            const float4 x0 = x_global ? xs[c * 64 + 2 * lane] : xs[c * 64 + lane];
            const float4 x1 = x_global ? xs[c * 64 + 2 * lane + 1] : xs[c * 64 + 32 + lane];
            a = fmaf(1.0f, dot8(w.q, x0, x1), a);
        }
        return a;
    }
};
template <Type T>
struct BulkBlkSlot {  // Q4_0, Q6_K: a span, read as the register form reads it from memory
    static constexpr int64_t kBytes = BDec<T>::kSpanBytes;
    static constexpr bool kBGlobal = false;
    __host__ __device__ static int64_t row_bytes(int64_t K) {
        return T == Type::Q4_0 ? K / 32 * 18 : K / 256 * 210;
    }
    __device__ static float dot(const char* slot, int64_t p, int lane, int64_t K, const void* xb,
                                bool, float a) {
        if (!BDec<T>::active(K, p, lane)) return a;
        typename BDec<T>::Raw r;
        BDec<T>::load_span(slot, lane, r);
        return SPiece<T>::dot(r, p, lane, K, xb, a);
    }
};
template <>
struct BulkSlot<Type::Q4_0> : BulkBlkSlot<Type::Q4_0> {};
template <>
struct BulkSlot<Type::Q6_K> : BulkBlkSlot<Type::Q6_K> {};

// Dynamic shared memory of a bulk launch: the warps' slots, b (when it is in shared memory),
// the slots' barriers.
template <Type T>
size_t bulk_b_offset(int S) {
    return static_cast<size_t>(kMvWarps) * S * BulkSlot<T>::kBytes;
}
template <Type T>
size_t bulk_bar_offset(int S, int64_t K, bool x_global) {
    const size_t b = x_global ? 0 : SPiece<T>::smem_bytes(K);
    return (bulk_b_offset<T>(S) + b + 15) / 16 * 16;
}
template <Type T>
size_t bulk_smem_bytes(int S, int64_t K, bool x_global) {
    return bulk_bar_offset<T>(S, K, x_global) + static_cast<size_t>(kMvWarps) * S * 8;
}

// F16/BF16 b read from global memory (x_global) instead of shared: only without a folded norm
// (whose b the block computes), and by default only for K <= kBulkXGlobalK: a block's shared
// memory then leaves the SM ~28 KiB of L1 (two bulk blocks take the largest carveout), which
// holds wo's 8 KiB of b but not down's 32 KiB, which every row reads whole
// (FERRY_CUDA_MV_BULK_XGLOBAL=1: any K, to measure).
constexpr int64_t kBulkXGlobalK = 4096;
template <Type T>
bool bulk_x_global(const OpContext& ctx, const MvArgs& g) {
    return BulkSlot<T>::kBGlobal && g.nx == nullptr &&
           (g.K <= kBulkXGlobalK || ctx.mv_bulk_xglobal);
}

// The bulk form's steps (k_mv_bulk below). One warp's slots: S slots of B::kBytes with an
// mbarrier each, and the parity each completes next (bit s).
struct BulkWarp {
    char* slots;
    uint64_t* bars;
    int S;
    uint32_t phase;
    int64_t row_bytes;  // of the product at hand (BulkSlot<T>::row_bytes)
};

// Lane 0 starts the copy of (item it, row r, piece p) of walk w into slot s.
template <Type T, bool glu, bool pair>
__device__ __forceinline__ void bulk_issue(const StreamWalk<glu, pair>& w, const BulkWarp& bw,
                                           int s, int64_t it, int r, int p) {
    using B = BulkSlot<T>;
    const int64_t o = static_cast<int64_t>(p) * B::kBytes;
    const uint32_t bytes = static_cast<uint32_t>(min(B::kBytes, bw.row_bytes - o));
    mbar_expect(&bw.bars[s], bytes);
    bulk_to_smem(bw.slots + static_cast<size_t>(s) * B::kBytes, w.row(it, r) + o, bytes,
                 &bw.bars[s]);
}

// The load cursor of a warp's items (item lit, row lr, piece lp): bulk_slots issues the
// pieces at the cursor into slots s0 .. s1 - 1 (fresh ones: never read) and leaves the cursor
// past them; the warp's first S pieces, from item `first`, go into slots 0 .. S - 1.
struct BulkCursor {
    int64_t lit;
    int lr, lp;
};
template <Type T, bool glu, bool pair>
__device__ __forceinline__ BulkCursor bulk_slots(const StreamWalk<glu, pair>& w, const BulkWarp& bw,
                                                 BulkCursor c, int s0, int s1, int lane) {
    for (int s = s0; s < s1; s++) {
        if (c.lit < w.items && lane == 0) bulk_issue<T>(w, bw, s, c.lit, c.lr, c.lp);
        w.advance(c.lit, c.lr, c.lp);
    }
    return c;
}

// Sums the warp's items of walk w from `first` (bulk_slots has issued their first S pieces;
// b at xb, in global memory when x_global) and runs their epilogues, each slot refilled once
// the warp has read it. Every copy issued is waited for: the slots are idle at the end.
template <Type T, bool glu, bool pair>
__device__ __forceinline__ void bulk_rows(const StreamWalk<glu, pair>& w, BulkWarp& bw,
                                          BulkCursor c, int64_t first, int64_t K, const void* xb,
                                          bool x_global, int lane) {
    using B = BulkSlot<T>;
    constexpr int kRows = StreamWalk<glu, pair>::kRows;
    const int64_t items = w.items;
    uint32_t stash = 0;
    int64_t cit = first;
    int cr = 0, cp = 0, s = 0;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
    while (cit < items) {
        mbar_wait(&bw.bars[s], (bw.phase >> s) & 1u);
        bw.phase ^= 1u << s;
        const char* slot = bw.slots + static_cast<size_t>(s) * B::kBytes;
        if constexpr (kRows == 2) {
            if (cr == 0) {
                acc[0] = B::dot(slot, cp, lane, K, xb, x_global, acc[0]);
            } else {
                acc[1] = B::dot(slot, cp, lane, K, xb, x_global, acc[1]);
            }
        } else {
            acc[0] = B::dot(slot, cp, lane, K, xb, x_global, acc[0]);
        }
        // Every lane has read the slot: its next piece goes out before this item's epilogue.
        __syncwarp();
        if (c.lit < items && lane == 0) {
            fence_proxy_async();
            bulk_issue<T>(w, bw, s, c.lit, c.lr, c.lp);
        }
        w.advance(c.lit, c.lr, c.lp);
        if (++s == bw.S) s = 0;
        const int64_t it = cit;
        const bool last = cp + 1 == w.ppr && cr + 1 == kRows;
        w.advance(cit, cr, cp);
        if (!last) continue;
        const float v0 = warp_sum(acc[0]);
        const float v1 = kRows == 2 ? warp_sum(acc[kRows - 1]) : 0.0f;
#pragma unroll
        for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
        w.done(it, v0, v1, lane, stash);
    }
}

// k_mv_bulk's offsets (b_off, bar_off: bulk_b_offset, bulk_bar_offset) and x_global
// (bulk_x_global) come from the launch. Of each warp's first S pieces, `pre` are issued before
// griddepcontrol.wait and the rest once the block's loads of b (after the wait) are issued,
// so that those queue behind fewer copies (pre = S: all before; x_global: b is read as the
// rows are summed, pre = S); the folded norm's weights are loaded before the wait.
template <Type T, bool glu, bool pair>
__global__ void __launch_bounds__(32 * kMvWarps, kBulkMinBlocks)
    k_mv_bulk(MvArgs g, int S, int pre, uint32_t b_off, uint32_t bar_off, bool x_global) {
    using P = SPiece<T>;
    using B = BulkSlot<T>;
    extern __shared__ __align__(16) char bulk_sm[];
    __shared__ float nred[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const StreamWalk<glu, pair> w(g, static_cast<int64_t>(gridDim.x) * kMvWarps);
    const int64_t K = g.K;
    BulkWarp bw{bulk_sm + static_cast<size_t>(warp) * S * B::kBytes,
                reinterpret_cast<uint64_t*>(bulk_sm + bar_off) + warp * S, S, 0u, B::row_bytes(K)};
    void* smem_b = bulk_sm + b_off;
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
#endif
    pdl_trigger();
    if (lane == 0) {
        for (int s = 0; s < S; s++) mbar_init(&bw.bars[s], 1);
        mbar_init_fence();
    }
    __syncwarp();
    const int64_t first = w.first(static_cast<int64_t>(blockIdx.x) * kMvWarps + warp);
    BulkCursor c = bulk_slots<T>(w, bw, BulkCursor{first, 0, 0}, 0, pre, lane);
    const bool fast = g.nx && g.nfast && norm_fast_ok(g);
    NormW nw;
    if (fast) norm_w_load(g, nw);  // (a model weight: no kernel writes it)
    pdl_wait();
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr1 = gtime();
#endif
    if (!x_global) {
        // stream_put_b's dispatch, kept apart: one helper for both (the norm's weights loaded
        // by the caller, this hook passed in) rescheduled all 24 kernels and ran 1B F16 tg128
        // 1.0-1.5% slower on an H100 (bench/results/cuda.md, stop 44 call I).
        auto put = [&](int64_t i, float4 v) { P::put(smem_b, i, v, K); };
        auto rest = [&] { c = bulk_slots<T>(w, bw, c, pre, S, lane); };
        if (fast) {
            norm_prologue_fast(g, nw, nred, put, rest);
        } else if (g.nx) {
            rest();
            norm_prologue(g, nred, put);
        } else {
            // Up to 8 float4s a thread in one round trip (32 KiB for K = 8192).
            put_b<8>(reinterpret_cast<const float4*>(g.b), K / 4, put, rest);
        }
        __syncthreads();
    }
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr2 = gtime();
#endif
    bulk_rows<T>(w, bw, c, first, K, x_global ? static_cast<const void*>(g.b) : smem_b, x_global,
                 lane);
#ifdef FERRY_CUDA_TRACE
    trace_block(g.trace_id, g.M,
                (glu ? 1u : 0u) | (pair ? 2u : 0u) | (g.nx ? 4u : 0u) | 16u | 128u |
                    (static_cast<uint32_t>(T) << 8),
                tr0, tr1, tr2, 0, 0);
#endif
}

// A plain streaming launch of `warps` warps (one column of one matrix: stream_ok) takes the
// backend's host mirror (OpContext::mirror, set only for a progressive product's launch) when
// the rows fit and come in at most kMirrorSteps steps, and says so (OpContext::mirror_taken,
// mirror_step_rows); else the word of the graph's output in host memory (OpContext::host_out,
// set only for the launch of the graph's last product), and says so (host_out_taken).
void keep_mirror(const OpContext& ctx, MvArgs& g, int64_t warps) {
    if (ctx.host_out && !ctx.mirror.buf) {
        g.host_out = ctx.host_out;
        ctx.host_out_taken = true;
    }
    const int64_t step = warps * kMirrorGroup;
    if (!ctx.mirror.buf ||
        (g.M + kMirrorGroup - 1) / kMirrorGroup * kMirrorGroup > ctx.mirror.stride ||
        (g.M + step - 1) / step > kMirrorSteps) {
        return;
    }
    g.mirror = ctx.mirror;
    ctx.mirror_taken = true;
    ctx.mirror_step_rows = step;
}

}  // namespace

// The streaming form takes this product: F16/BF16 (K % 8 == 0, 16-byte rows, b in 48 KiB) or
// Q4_0/Q6_K (K % 256 == 0, 4-byte rows) weights, one column of one matrix, a2's and every
// segment's rows aligned alike, b 16-byte aligned.
bool stream_ok(const MvArgs& g, Type t, bool glu) {
    if (g.N != 1 || g.ne2 != 1 || g.ne3 != 1 || !aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3}) ||
        (g.n_seg > 0 && g.M % 2 != 0)) {
        return false;
    }
    if (t == Type::F16 || t == Type::BF16) {
        return g.K % 8 == 0 && g.K <= kStreamMaxK && rows_aligned(g, glu, g.n_seg > 0, 16);
    }
    if (t == Type::Q4_0 || t == Type::Q6_K) {
        return g.K % 256 == 0 && g.K <= kQ8MaxK && rows_aligned(g, glu, g.n_seg > 0, 4);
    }
    return false;
}

namespace {

// b's 48 KiB for K = kStreamMaxK F16/BF16 weights and the kernel's static shared memory are
// over the 48 KiB a launch gets without asking: each kernel of the streaming form may take
// this much dynamic shared memory (set once per device and weight type).
constexpr size_t kStreamSmem = kStreamMaxK * 4 + 1024;

template <Type T>
void allow_stream_smem() {
    static std::atomic<uint64_t> done{0};
    allow_dyn_smem<void (*)(MvArgs)>(
        {k_mv_stream<T, true, false>, k_mv_stream<T, false, true>, k_mv_stream<T, false, false>,
         k_mv_stream<T, false, false, 2 * kMvWarps>},
        kStreamSmem, done);
}

// The bulk form's launch (S slots a warp, at most ctx.mv_bulk_blocks blocks per SM); false
// when it does not take the product (then the register form): its shared memory would not fit
// a block, or its copies would not be 16-byte aligned (every row and piece must be).
template <Type T>
bool launch_bulk_t(const OpContext& ctx, MvArgs& g, bool glu, int S) {
    constexpr size_t kMaxSmem = 227 * 1024 - 256;  // (the H200's block limit; nred beside)
    using B = BulkSlot<T>;
    S = std::min(S, kBulkMaxSlots);
    const bool pair = g.n_seg > 0, x_global = bulk_x_global<T>(ctx, g);
    // Fewer slots where a block would take more than half the SM's shared memory (each block
    // also takes 1 KiB of the SM's 228; FERRY_CUDA_MV_BULK_FIT=0 keeps S): two blocks per SM
    // then both fit, and one block leaves room for the next kernel's block beside it. With
    // S = 3, F16 down (b's 32 KiB) takes 2; gate/up, q/k/v (b's 8 KiB) and wo keep 3.
    constexpr size_t kHalfSm = 113 * 1024 - 256;
    while (ctx.mv_bulk_fit && S > 1 && bulk_smem_bytes<T>(S, g.K, x_global) > kHalfSm) {
        S--;
    }
    const int pre = x_global || ctx.mv_bulk_pre <= 0 ? S : std::min(S, ctx.mv_bulk_pre);
    const size_t smem = bulk_smem_bytes<T>(S, g.K, x_global);
    if (smem > kMaxSmem || B::row_bytes(g.K) % 16 != 0 || !rows_aligned(g, glu, pair, 16)) {
        return false;
    }
    // The SM's largest shared-memory carveout (228 KiB, ~28 KiB of L1) whenever a bulk block
    // runs: with a smaller one picked for a single block (e.g. 132 KiB), the next kernel's
    // block could not join it until the SM drained and was configured anew.
    static std::atomic<uint64_t> done{0};
    allow_dyn_smem<void (*)(MvArgs, int, int, uint32_t, uint32_t, bool)>(
        {k_mv_bulk<T, true, false>, k_mv_bulk<T, false, true>, k_mv_bulk<T, false, false>},
        kMaxSmem, done, /*max_carveout=*/true);
    const int64_t items = pair ? g.M / 2 : g.M;
    const unsigned blocks =
        std::min(n_blocks(items, kMvWarps),
                 static_cast<unsigned>(ctx.n_sm * std::max(1, ctx.mv_bulk_blocks)));
    const dim3 grid(blocks), block(32 * kMvWarps);
    const auto b_off = static_cast<uint32_t>(bulk_b_offset<T>(S));
    const auto bar_off = static_cast<uint32_t>(bulk_bar_offset<T>(S, g.K, x_global));
    if (glu) {
        launch_pdl(k_mv_bulk<T, true, false>, grid, block, smem, ctx.stream, g, S, pre, b_off,
                   bar_off, x_global);
    } else if (pair) {
        launch_pdl(k_mv_bulk<T, false, true>, grid, block, smem, ctx.stream, g, S, pre, b_off,
                   bar_off, x_global);
    } else {
        keep_mirror(ctx, g, static_cast<int64_t>(blocks) * kMvWarps);
        launch_pdl(k_mv_bulk<T, false, false>, grid, block, smem, ctx.stream, g, S, pre, b_off,
                   bar_off, x_global);
    }
    return true;
}

template <Type T>
void launch_stream_t(const OpContext& ctx, MvArgs g, bool glu) {
    const int bulk = T == Type::F16 || T == Type::BF16 ? ctx.mv_bulk : ctx.mv_bulk_q;
    if (bulk > 0 && launch_bulk_t<T>(ctx, g, glu, bulk)) return;
    allow_stream_smem<T>();
    const bool pair = g.n_seg > 0;
    const int64_t items = pair ? g.M / 2 : g.M;
    const size_t smem = SPiece<T>::smem_bytes(g.K);
    const bool block_format = T == Type::Q4_0 || T == Type::Q6_K;
    if (ctx.mv_stream_wide > (block_format ? 0 : 1) && !glu && !pair && !g.nx) {
        constexpr int kW = 2 * kMvWarps;
        const unsigned blocks = std::min(n_blocks(items, kW), static_cast<unsigned>(ctx.n_sm));
        keep_mirror(ctx, g, static_cast<int64_t>(blocks) * kW);
        launch_pdl(k_mv_stream<T, false, false, kW>, dim3(blocks), dim3(32 * kW), smem, ctx.stream,
                   g);
        return;
    }
    const unsigned blocks =
        std::min(n_blocks(items, kMvWarps), static_cast<unsigned>(ctx.n_sm * kStreamMinBlocks));
    const dim3 grid(blocks), block(32 * kMvWarps);
    if (glu) {
        launch_pdl(k_mv_stream<T, true, false>, grid, block, smem, ctx.stream, g);
    } else if (pair) {
        launch_pdl(k_mv_stream<T, false, true>, grid, block, smem, ctx.stream, g);
    } else {
        keep_mirror(ctx, g, static_cast<int64_t>(blocks) * kMvWarps);
        launch_pdl(k_mv_stream<T, false, false>, grid, block, smem, ctx.stream, g);
    }
}

}  // namespace

Status launch_stream(const OpContext& ctx, const MvArgs& g0, Type t, bool glu) {
    MvArgs g = g0;
    g.err = ctx.err;
    g.nfast = ctx.mv_nfast;
#ifdef FERRY_CUDA_TRACE
    g.trace_id = trace_next_id();
#endif
    switch (t) {
        case Type::F16:
            launch_stream_t<Type::F16>(ctx, g, glu);
            break;
        case Type::BF16:
            launch_stream_t<Type::BF16>(ctx, g, glu);
            break;
        case Type::Q4_0:
            launch_stream_t<Type::Q4_0>(ctx, g, glu);
            break;
        case Type::Q6_K:
            launch_stream_t<Type::Q6_K>(ctx, g, glu);
            break;
        default:
            return Status::errorf("CUDA: streaming MUL_MAT weight type %s", type_name(t));
    }
    return launch_status(glu ? "MUL_MAT+MUL_MAT+SWIGLU (stream)" : "MUL_MAT (stream)");
}

}  // namespace ferry::cuda
