// MUL_MAT's int8 matrix-vector kernel (k_mul_mat_vec_q8: decode with block-format weights,
// b quantized to int8 in shared memory and dp4a products; its register, ring and block-lane
// forms, the folded norm and the decode epilogue) and its launchers. mul_mat.cu's dispatch
// calls launch_q8_product (mv-launch.h).
#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backends/cuda/ops/mv-common.cuh"
#include "backends/cuda/ops/mv-launch.h"
#include "backends/cuda/ops/trace.cuh"

namespace ferry::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// Decode with block-format weights: b quantized to int8 and integer dot products (dp4a).
//
// Measured first (bench/results/cuda.md, ncu): the float kernel reaches only 360-830 GB/s
// on Q4_0/Q6_K rows because it spends ~7 instructions per weight (unpack, int-to-float, FMA,
// and 4 bytes of b per weight from L1) — instruction-bound far below the memory's rate. Here
// each block first quantizes its column of b into shared memory (int8, one float scale per 32
// elements: the Q8_0 scheme of the CPU backend with an unrounded scale), then a lane's 8
// weights take 2 dp4a (4 products each) against the matching b words, and one FMA applies the
// weight scale times b's scale: ~1.5 instructions per weight. The quantized b's rounding is
// what kMulMatQ in the op tests bounds (NMSE ~1.6e-5). A lane's 8 weights always lie in one
// 32-element block of b (the layouts of Dec, mv-common.cuh), so one b scale applies to them.

// Bytes of one 256-element chunk of a row.
template <Type T>
struct Chunk;
template <>
struct Chunk<Type::Q4_0> {
    static constexpr int64_t kBytes = 8 * 18;
};
template <>
struct Chunk<Type::Q4_1> {
    static constexpr int64_t kBytes = 8 * 20;
};
template <>
struct Chunk<Type::Q8_0> {
    static constexpr int64_t kBytes = 8 * 34;
};
template <>
struct Chunk<Type::Q4_K> {
    static constexpr int64_t kBytes = 144;
};
template <>
struct Chunk<Type::Q5_K> {
    static constexpr int64_t kBytes = 176;
};
template <>
struct Chunk<Type::Q6_K> {
    static constexpr int64_t kBytes = 210;
};

constexpr int kQ8MinBlocks = 4;
// The int8 decode kernel's ring form (weights streamed into shared memory by bulk copies, see
// k_mul_mat_vec_q8 below): at most this many stage slots, in a block of at most kRingSmem2
// bytes of dynamic shared memory (two blocks per SM) or, when two stages do not fit there,
// kRingSmem1 (one block per SM; the H200 lets a block take 227 KiB). kRingSmem2 was 110 KiB
// (two blocks filled the SM's shared memory); measured on the H200 with the block-lane form
// (bench/results/cuda.md, stop 21, 1B Q4_0 tg128): 1,301 t/s at 64 KiB against 1,260 at
// 110 and 1,243 at 40. FERRY_CUDA_MV_RING_KB=N (N <= kRingSmem2Max / 1024) sets it.
constexpr int kRingMaxStages = 8;
constexpr size_t kRingSmem2 = 64 * 1024;
constexpr size_t kRingSmem2Max = 110 * 1024;
constexpr size_t kRingSmem1 = 220 * 1024;

template <Type T>
__device__ __forceinline__ float q8_dot(const Lane8i& w, const int32_t* xq, const float* xd) {
    // Offsets are never negative: unsigned division is a shift (signed division by a power
    // of two costs a sign correction, ~10 instructions per chunk here).
    const uint32_t o0 = static_cast<uint32_t>(w.o0), o1 = static_cast<uint32_t>(w.o1);
    const int32_t a = xq[o0 / 4], b = xq[o1 / 4];
    const int s = __dp4a(w.v1, b, __dp4a(w.v0, a, 0)) >> IDec<T>::kShift;
    const float dx = xd[o0 / 32];
    float r = w.d * dx * static_cast<float>(s);
    if constexpr (IDec<T>::kMin) {
        const int sx = __dp4a(0x01010101, b, __dp4a(0x01010101, a, 0));
        r = fmaf(w.m * dx, static_cast<float>(sx), r);
    }
    return r;
}

template <Type T>
constexpr bool kHasBlk = T == Type::Q4_0 || T == Type::Q6_K;

// One column of b (N == 1), K a multiple of 256, b 16-byte aligned. Dynamic shared memory:
// K / 4 words of int8 quants, then K / 32 float scales. Blocks loop over groups of
// kQ8Warps / S rows (grid capped so that each block's quantization of b is shared by several
// rows); S warps share a row (split-K: warp part p takes the groups of U chunks p, p + S, ...,
// and the block adds the parts), so that a short matrix or a long row still has enough loads
// in flight. With S > 1 or the epilogue, M % (kQ8Warps / S) == 0 (the launcher checks).
// Ring (`ring`, sm_90; FERRY_CUDA_MV_RING=0 turns it off): the weights reach the warps through
// shared memory instead of registers. The block's row groups are its stages (each the R rows
// of a group, contiguous in memory: one bulk copy per matrix); a ring of P stage slots
// (cp.async.bulk, completion on one mbarrier per slot) is started by lanes 0..P-1 of warp 0
// before griddepcontrol.wait, so the weights stream in while the kernel before finishes and
// while b is quantized, and refilled by thread 0 as slots free up. The warps then read the
// rows from shared memory with the same decoders and add the same chunks in the same order:
// bit for bit the register form. Measured on the H200 (bench/results/cuda.md, stop 20): 1B
// Q4_0 tg128 +1.5-3% (the Q6_K output product 110 against 123-136 us); the products stay
// bound by instruction issue, not by bytes in flight. The same ring in the float kernel
// (F16 weights) was slower (656 against 669-677 t/s) and was removed.
// Block-lane (`blk`, Q4_0 and Q6_K with 4-byte aligned rows): each warp's part of a row is
// taken in spans of 2048 weights, span p, p + S, ... for part p (BDec), in both forms.
template <Type T, bool glu, bool epi, bool wide, bool ring = false, bool blk = false>
__global__ void __launch_bounds__(32 * kQ8Warps, ring ? 2 : kQ8MinBlocks)
    k_mul_mat_vec_q8(MvArgs g, int S, int P, int64_t stage_bytes) {
    static_assert(!blk || kHasBlk<T>, "the block-lane form decodes Q4_0 and Q6_K");
    // Chunks per warp whose loads are issued before the first is used. Wide (the default;
    // FERRY_CUDA_MV_WIDE=0 turns it off): a row of K = 2048 in one round trip instead of two.
    // With S = 1 the chunks are added in the same order either way (bit-identical).
    constexpr int U = wide ? (glu ? 4 : 8) : (glu ? 2 : 4);
    extern __shared__ __align__(16) int32_t q8_smem[];
    __shared__ float red[kQ8Warps], red2[glu ? kQ8Warps : 1], pair[kQ8Warps], nred[32];
    int32_t* xq = q8_smem;
    float* xd = reinterpret_cast<float*>(q8_smem + g.K / 4);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int R = kQ8Warps / S;  // rows per block and iteration
    const int part = warp % S, rl = warp / S;
    const int64_t mat = blockIdx.y;
    const int64_t i2 = mat % g.ne2, i3 = mat / g.ne2;
    const float4* x4 = reinterpret_cast<const float4*>(g.b + i2 * g.b_nb2 + i3 * g.b_nb3);
    const int64_t a_mat = (i2 / g.r2) * g.a_nb2 + (i3 / g.r3) * g.a_nb3;
    const int64_t n_chunks = g.K / 256;
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
    uint64_t tr1 = 0, tr2 = 0, tr_wait = 0;
    uint32_t tr_groups = 0;
#endif
    pdl_trigger();
    // The ring's slots start after b's quants and scales (128-byte aligned); slot s holds the
    // rows of the block's iterations s, s + P, ...; the k-th use of a slot completes its
    // barrier's phase k.
    __shared__ uint64_t ring_bar[ring ? kRingMaxStages : 1];
    [[maybe_unused]] char* ring_base =
        reinterpret_cast<char*>(q8_smem) + ((g.K + g.K / 8 + 127) / 128) * 128;
    [[maybe_unused]] const int64_t ring_rows =
        static_cast<int64_t>(R) * g.a_nb1;  // bytes of one matrix's rows
    // Issues the copies of the block's iteration j (when that row group exists).
    // (slot = j % P, passed in: a 64-bit modulo by a run-time P is a long emulated sequence.)
    [[maybe_unused]] auto issue = [&](int64_t j, int slot) {
        const int64_t mb = (static_cast<int64_t>(blockIdx.x) + j * gridDim.x) * R;
        if (mb >= g.M) return;
        const int64_t rows = min(static_cast<int64_t>(R), g.M - mb);
        const uint32_t bytes = static_cast<uint32_t>(rows * g.a_nb1);
        const char* src = g.a + a_mat + mb * g.a_nb1;
        if constexpr (epi) {
            int64_t ms = 0;
            src = g.seg[seg_of(g, mb, &ms)].a + ms * g.a_nb1;
        }
        char* dst = ring_base + slot * stage_bytes;
        mbar_expect(&ring_bar[slot], glu ? 2 * bytes : bytes);
        bulk_to_smem(dst, src, bytes, &ring_bar[slot]);
        if constexpr (glu) {
            bulk_to_smem(dst + ring_rows, g.a2 + a_mat + mb * g.a_nb1, bytes, &ring_bar[slot]);
        }
    };
    if constexpr (ring) {
        // Lane s of warp 0 starts slot s (one thread's issue is ~100 instructions of address
        // arithmetic: P of them in a row would hold up the block's first barrier).
        if (threadIdx.x < static_cast<unsigned>(P)) {
            mbar_init(&ring_bar[threadIdx.x], 1);
            mbar_init_fence();
            issue(threadIdx.x, static_cast<int>(threadIdx.x));
        }
    } else {
        // Weights never depend on the kernel before: this warp's part of its first row is on
        // its way to L2 while that kernel finishes.
        const int64_t m0 = static_cast<int64_t>(blockIdx.x) * R + rl;
        const int64_t row_bytes = n_chunks * Chunk<T>::kBytes;
        const int64_t part_bytes = (row_bytes + S - 1) / S;
        const int64_t off = part * part_bytes;
        if (m0 < g.M && off < row_bytes) {
            const int64_t n = min(part_bytes, row_bytes - off);
            const char* a0 = g.a + a_mat + m0 * g.a_nb1;
            if constexpr (epi) {
                int64_t ms = 0;
                a0 = g.seg[seg_of(g, m0, &ms)].a + ms * g.a_nb1;
            }
            prefetch_l2(a0 + off, n, lane);
            if constexpr (glu) prefetch_l2(g.a2 + a_mat + m0 * g.a_nb1 + off, n, lane);
        }
    }
    NormW nw;
    const bool nfast = g.nx && g.nfast && norm_fast_ok(g);
    if (nfast) norm_w_load(g, nw);
    pdl_wait();
#ifdef FERRY_CUDA_TRACE
    tr1 = gtime();
#endif
    // 8 consecutive threads quantize one block of 32 (K / 4 is a multiple of the block size,
    // so every warp runs each iteration whole). kPre loads per thread are issued before the
    // first is used: b (32 KiB for K = 8192) arrives in one round trip, not kPre
    // (FERRY_CUDA_MV_WIDE=0: one load at a time, as before).
    const int64_t n4 = g.K / 4;
    if (nfast) {
        // b = the folded RMS_NORM (+ ADD) and MUL, element for element as k_norm computes it.
        norm_prologue_fast(g, nw, nred,
                           [&](int64_t i, float4 v) { q8_quantize4<blk, T>(v, i, lane, xq, xd); });
    } else if (g.nx) {
        norm_prologue(g, nred,
                      [&](int64_t i, float4 v) { q8_quantize4<blk, T>(v, i, lane, xq, xd); });
    } else {
        put_b<wide ? 8 : 1>(x4, n4,
                            [&](int64_t i, float4 v) { q8_quantize4<blk, T>(v, i, lane, xq, xd); });
    }
    __syncthreads();
#ifdef FERRY_CUDA_TRACE
    tr2 = gtime();
#endif
    const int64_t n_groups = n_chunks / U;
    // The block's iteration, its ring slot it % P and the slot's phase (it / P) % 2, the last
    // two kept by counting: a 64-bit division by the run-time P was ~5% of a gate/up launch's
    // instructions (ncu).
    int64_t it = 0;
    [[maybe_unused]] int slot = 0;
    [[maybe_unused]] uint32_t phase = 0;
    for (int64_t mb = static_cast<int64_t>(blockIdx.x) * R; mb < g.M;
         mb += static_cast<int64_t>(gridDim.x) * R, it++) {
        const int64_t m = mb + rl;
        const bool valid = m < g.M;  // always, when S > 1 or epi
        const char* row = g.a + a_mat + (valid ? m : 0) * g.a_nb1;
        int64_t ms = m;
        int sg = 0;
        if constexpr (epi) {
            sg = seg_of(g, m, &ms);
            row = g.seg[sg].a + ms * g.a_nb1;
        }
        const char* row2 = glu ? g.a2 + a_mat + (valid ? m : 0) * g.a_nb1 : nullptr;
        if constexpr (ring) {
#ifdef FERRY_CUDA_TRACE
            const uint64_t c0 = clock64();
            mbar_wait(&ring_bar[slot], phase);
            tr_wait += clock64() - c0;
            tr_groups++;
#else
            mbar_wait(&ring_bar[slot], phase);
#endif
            row = ring_base + slot * stage_bytes + rl * g.a_nb1;
            row2 = row + ring_rows;
        }
        float acc = 0.0f, acc2 = 0.0f;
        if constexpr (blk) {
            // Spans of 2048 weights; the last may be short (lanes past the row have nothing).
            const int64_t n_spans = (g.K + kSpan - 1) / kSpan;
            for (int64_t sp = valid ? part : n_spans; sp < n_spans; sp += S) {
                if (!BDec<T>::active(g.K, sp, lane)) continue;
                BlkX x;
                BDec<T>::load_x(xq, xd, sp, lane, x);
                acc = BDec<T>::dot(row, sp, lane, x, acc);
                if constexpr (glu) acc2 = BDec<T>::dot(row2, sp, lane, x, acc2);
            }
        }
        for (int64_t gi = valid && !blk ? part : n_groups; gi < n_groups; gi += S) {
            const int64_t c = gi * U;
            Lane8i w[U], w2[glu ? U : 1];
#pragma unroll
            for (int u = 0; u < U; u++) {
                IDec<T>::get(row, c + u, lane, w[u]);
                if constexpr (glu) IDec<T>::get(row2, c + u, lane, w2[u]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                acc += q8_dot<T>(w[u], xq, xd);
                if constexpr (glu) acc2 += q8_dot<T>(w2[u], xq, xd);
            }
        }
        for (int64_t c = valid && !blk ? n_groups * U + part : n_chunks; c < n_chunks; c += S) {
            Lane8i w;
            IDec<T>::get(row, c, lane, w);
            acc += q8_dot<T>(w, xq, xd);
            if constexpr (glu) {
                IDec<T>::get(row2, c, lane, w);
                acc2 += q8_dot<T>(w, xq, xd);
            }
        }
        if constexpr (ring) {
            // Every warp is done with the slot: refill it with the block's iteration it + P.
            __syncthreads();
            if (threadIdx.x == 0) issue(it + P, slot);
            if (++slot == P) {
                slot = 0;
                phase ^= 1u;
            }
        }
        acc = warp_sum(acc);
        if constexpr (glu) acc2 = warp_sum(acc2);
        if (S > 1) {
            if (lane == 0) {
                red[warp] = acc;
                if constexpr (glu) red2[warp] = acc2;
            }
            __syncthreads();
            acc = 0.0f;
            acc2 = 0.0f;
            for (int p = 0; p < S; p++) {
                acc += red[rl * S + p];
                if constexpr (glu) acc2 += red2[rl * S + p];
            }
            __syncthreads();  // red is written again by the next row group
        }
        const bool leader = part == 0 && valid;
        if constexpr (epi) {
            mv_epilogue(g, g.seg[sg], ms, rl, leader, lane, acc, pair);
            continue;
        }
        if (leader && lane == 0) {
            float v = acc;
            if constexpr (glu) v = v / (1.0f + expf(-v)) * acc2;
            if (g.res) {
                v += reinterpret_cast<const float*>(g.res + i2 * g.res_nb2 + i3 * g.res_nb3)[m];
            }
            g.out[(i3 * g.ne2 + i2) * g.M + m] = v;
        }
    }
#ifdef FERRY_CUDA_TRACE
    trace_block(g.trace_id, g.M,
                (glu ? 1u : 0u) | (epi ? 2u : 0u) | (g.nx ? 4u : 0u) | (ring ? 8u : 0u) |
                    (static_cast<uint32_t>(T) << 8),
                tr0, tr1, tr2, tr_wait, tr_groups);
#endif
}

#ifdef FERRY_CUDA_TRACE
int trace_next_id() {
    return trace_next_id_tu(".q8");
}
#endif

// On unless FERRY_CUDA_MV_WIDE=0: measured on the H200 (bench/results/cuda.md, 1B Q4_0
// tg128, same run) 935 t/s with it against 896 without (its kernels spill a few bytes of
// registers under the 64-register cap, and gain anyway).
bool q8_wide_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_WIDE");
        return !(v && v[0] == '0');
    }();
    return on;
}

// FERRY_CUDA_MV_SPLIT: 0 no split-K; 1 the row-count rule below (measured on the H200,
// bench/results/cuda.md, 1B Q4_0 tg128: 798 t/s with it against 814 without, when b's
// quantization took one round trip per 1 KiB); unset: the row-length rule (long rows only).
int q8_split_mode() {
    static const int mode = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_SPLIT");
        return v && v[0] == '0' ? 0 : (v && v[0] == '1' ? 1 : 2);
    }();
    return mode;
}

// Warps per row of the int8 kernel. Default (mode 2): two warps per row when a row holds at
// least 4 * U chunks (the down projection's K = 8192: two round trips of U chunks per warp
// instead of four, and twice the blocks); it depends only on K and M, so a product computes
// the same sums alone and in a fused launch (the epilogue launch keeps S = 1). Mode 1: doubled
// while the grid holds fewer than two waves of warps and every warp keeps at least one whole
// group of U chunks. A block's rows come in groups of kQ8Warps / S, which must divide M (and,
// for the rope epilogue, hold row pairs).
int q8_split(int64_t M, int64_t n_chunks, int U, int n_sm, bool epi) {
    const int mode = q8_split_mode();
    if (mode == 0) return 1;
    if (mode == 2) {
        return !epi && n_chunks >= 32 && M % (kQ8Warps / 2) == 0 ? 2 : 1;
    }
    const int64_t target = 2 * static_cast<int64_t>(n_sm) * kQ8MinBlocks * kQ8Warps;
    const int max_s = epi ? kQ8Warps / 2 : kQ8Warps;
    int s = 1;
    while (2 * s <= max_s && M * s < target && n_chunks >= 2 * s * U &&
           M % (kQ8Warps / (2 * s)) == 0) {
        s *= 2;
    }
    return s;
}

// How a ring launch streams its rows: P stage slots of `stage` bytes (one row group of R rows,
// both matrices for GLU) after b_bytes of the kernel's own shared memory, `smem` bytes in
// all, per_sm blocks per SM. P = 0: the register form instead. Bulk copies need 16-byte
// aligned sources and sizes: rows contiguous (a_nb1 == a row's bytes), a multiple of 16 bytes
// long, every matrix (and epilogue segment) 16-byte aligned.
struct RingPlan {
    int P = 0;
    int per_sm = 0;
    int64_t stage = 0;
    size_t smem = 0;
};

RingPlan plan_ring(const MvArgs& g, int R, bool glu, bool segs, size_t b_bytes) {
    RingPlan r;
    if (g.a_nb1 != g.a_row_bytes || !rows_aligned(g, glu, segs, 16)) return r;
    const int64_t stage = static_cast<int64_t>(R) * g.a_nb1 * (glu ? 2 : 1);
    const size_t b = (b_bytes + 127) / 128 * 128;
    static const size_t budget2 = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_RING_KB");
        const long kb = v ? std::strtol(v, nullptr, 10) : 0;
        return kb > 0 && static_cast<size_t>(kb) * 1024 <= kRingSmem2Max
                   ? static_cast<size_t>(kb) * 1024
                   : kRingSmem2;
    }();
    for (int per_sm : {2, 1}) {
        const size_t budget = per_sm == 2 ? budget2 : kRingSmem1;
        if (b >= budget) continue;
        const int64_t p = static_cast<int64_t>(budget - b) / stage;
        if (p < 2) continue;
        r.P = static_cast<int>(std::min<int64_t>(p, kRingMaxStages));
        r.per_sm = per_sm;
        r.stage = stage;
        r.smem = b + static_cast<size_t>(r.P) * static_cast<size_t>(stage);
        return r;
    }
    return r;
}

template <Type T, bool glu, bool epi, bool blk>
void launch_q8_form(const OpContext& ctx, const MvArgs& g0, unsigned mats) {
    MvArgs g = g0;
    g.nfast = ctx.mv_nfast;
    const int n_sm = ctx.n_sm;
    cudaStream_t st = ctx.stream;
#ifdef FERRY_CUDA_TRACE
    g.trace_id = trace_next_id();
#endif
    const size_t smem = static_cast<size_t>(g.K) + static_cast<size_t>(g.K) / 8;
    const bool wide = q8_wide_mode();
    const int U = wide ? (glu ? 4 : 8) : (glu ? 2 : 4);
    const int S = q8_split(g.M, g.K / 256, U, n_sm, epi);
    const int R = kQ8Warps / S;
    const RingPlan rp = wide && ctx.mv_ring ? plan_ring(g, R, glu, epi, smem) : RingPlan{};
    if (rp.P > 0) {
        const unsigned cap = static_cast<unsigned>(n_sm * rp.per_sm);
        const unsigned blocks = std::min(n_blocks(g.M, R), std::max(1u, cap / mats));
        auto k = k_mul_mat_vec_q8<T, glu, epi, true, true, blk>;
        static std::atomic<uint64_t> smem_set{0};
        allow_dyn_smem({k}, kRingSmem1, smem_set);
        launch_pdl(k, dim3(blocks, mats, 1), dim3(32 * kQ8Warps), rp.smem, st, g, S, rp.P,
                   rp.stage);
        return;
    }
    const unsigned cap = static_cast<unsigned>(n_sm) * kQ8MinBlocks;
    const unsigned blocks = std::min(n_blocks(g.M, R), std::max(1u, cap / mats));
    if (wide) {
        launch_pdl(k_mul_mat_vec_q8<T, glu, epi, true, false, blk>, dim3(blocks, mats, 1),
                   dim3(32 * kQ8Warps), smem, st, g, S, 0, int64_t{0});
    } else {
        launch_pdl(k_mul_mat_vec_q8<T, glu, epi, false, false, blk>, dim3(blocks, mats, 1),
                   dim3(32 * kQ8Warps), smem, st, g, S, 0, int64_t{0});
    }
}

template <Type T, bool glu, bool epi>
void launch_q8(const OpContext& ctx, const MvArgs& g, unsigned mats) {
    if constexpr (kHasBlk<T>) {
        // The block-lane form reads whole words of the rows.
        if (ctx.mv_blk && rows_aligned(g, glu, epi, 4)) {
            launch_q8_form<T, glu, epi, true>(ctx, g, mats);
            return;
        }
    }
    launch_q8_form<T, glu, epi, false>(ctx, g, mats);
}

template <bool glu, bool epi = false>
Status dispatch_q8(OpContext& ctx, const MvArgs& g, Type t) {
    const unsigned mats = static_cast<unsigned>(g.ne2 * g.ne3);
    switch (t) {
        case Type::Q4_0:
            launch_q8<Type::Q4_0, glu, epi>(ctx, g, mats);
            break;
        case Type::Q4_1:
            launch_q8<Type::Q4_1, glu, epi>(ctx, g, mats);
            break;
        case Type::Q8_0:
            launch_q8<Type::Q8_0, glu, epi>(ctx, g, mats);
            break;
        case Type::Q4_K:
            launch_q8<Type::Q4_K, glu, epi>(ctx, g, mats);
            break;
        case Type::Q5_K:
            launch_q8<Type::Q5_K, glu, epi>(ctx, g, mats);
            break;
        case Type::Q6_K:
            launch_q8<Type::Q6_K, glu, epi>(ctx, g, mats);
            break;
        default:
            return Status::errorf("CUDA: MUL_MAT weight type %s", type_name(t));
    }
    return launch_status(glu   ? "MUL_MAT+MUL_MAT+SWIGLU (q8)"
                         : epi ? "MUL_MAT+ROPE/SET_ROWS (q8)"
                               : "MUL_MAT (vec q8)");
}

}  // namespace

Status launch_q8_product(OpContext& ctx, const MvArgs& g, Type t, bool glu, bool epi) {
    if (glu) return dispatch_q8<true>(ctx, g, t);
    return epi ? dispatch_q8<false, true>(ctx, g, t) : dispatch_q8<false>(ctx, g, t);
}

}  // namespace ferry::cuda
