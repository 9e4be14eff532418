// MUL_MAT's float matrix-vector kernel (k_mul_mat_vec: decode and small batches, weights
// decoded to floats in registers; its fused forms with the folded norm and the decode
// epilogue) and the generic warp-per-row kernel for any other layout, with their launchers;
// and the prefill's kernels that convert b and dequantize weights for cuBLAS (at the end: why
// here). mul_mat.cu calls them through mv-launch.h.
#include <algorithm>
#include <cstdlib>

#include "backends/cuda/ops/mv-common.cuh"
#include "backends/cuda/ops/mv-launch.h"

namespace ferry::cuda {

namespace {

template <bool aligned>
__device__ __forceinline__ float4 ld_x4(const float* x) {
    if constexpr (aligned) {
        return *reinterpret_cast<const float4*>(x);
    } else {
        return make_float4(x[0], x[1], x[2], x[3]);
    }
}

// Adds one chunk's contribution (8 weights of each of NC columns) to acc.
template <Type T, int NC, bool x_aligned>
__device__ __forceinline__ void mv_chunk(const Lane8& w, const char* bm, int64_t b_nb1, int n_cols,
                                         float* acc) {
#pragma unroll
    for (int n = 0; n < NC; n++) {
        if (NC > 1 && n >= n_cols) continue;  // a kernel for NC columns serves fewer too
        const float* x = reinterpret_cast<const float*>(bm + n * b_nb1);
        const float4 x0 = ld_x4<x_aligned>(x + w.o0);
        const float4 x1 = ld_x4<x_aligned>(x + w.o1);
        const float s = dot8(w.q, x0, x1);
        if constexpr (Dec<T>::kMin) {
            const float sx = (x0.x + x0.y) + (x0.z + x0.w) + (x1.x + x1.y) + (x1.z + x1.w);
            acc[n] = fmaf(w.m, sx, fmaf(w.d, s, acc[n]));
        } else {
            acc[n] = fmaf(w.d, s, acc[n]);
        }
    }
}

// Matrix-vector product: S warps share a row (each takes every S-th 256-element chunk, so a
// short matrix still puts enough loads in flight), kMvWarps / S rows per block. Chunks are
// processed U at a time with every load issued before the first use; a row's sum is the same
// for every U (chunk by chunk in order, each part's sum reduced by warp_sum, the parts added in
// order). GLU: the row of a second matrix (g.a2, the "up" weights) is multiplied too and the
// result is silu(a x) * (a2 x). MINB > 1: the register cap that lets MINB blocks share an SM
// (more warps in flight, fewer chunks in flight per warp); FERRY_CUDA_MV_OCC=0 picks MINB = 1
// for decode, to compare.
//
// fused (one column, one matrix, decode): the int8 kernel's fusions with the same arithmetic
// as the unfused launch, so the two give the same bits: [ADD ->] RMS_NORM -> MUL folded into
// the prologue (g.nx: every block computes b into shared memory, K floats of dynamic shared
// memory, with norm_prologue) and the decode epilogue (g.n_seg > 0: up to kMaxSeg matrices
// of one b as segments, each with its rope and/or KV-cache store, mv_epilogue). Blocks loop
// over row groups (a capped grid shares each block's norm between several groups); every
// segment's rows are a multiple of kMvWarps, so a block's rows lie in one segment and rope
// pairs (2i, 2i + 1) in one block (S <= kMvWarps / 2).
//
// raw (plain weights, one column; FERRY_CUDA_MV_FRAW=0 turns it off): a group's chunks are
// held as their raw bytes (4 registers a chunk for F16/BF16, 8 for F32) and decoded one at a
// time just before use, so that 4-8 chunks per matrix are in flight under the register cap
// instead of 1-2 decoded ones (the same chunks added in the same order: the same sums).
template <Type T>
constexpr bool kPlain = T == Type::F16 || T == Type::BF16 || T == Type::F32;

template <Type T, int NC, bool x_aligned, int S, bool glu, int MINB, bool fused = false,
          bool raw = false>
__global__ void __launch_bounds__(32 * kMvWarps, MINB) k_mul_mat_vec(MvArgs g) {
    constexpr bool kRaw = raw && kPlain<T> && NC == 1;
    constexpr int U = kRaw ? (T == Type::F32 ? (glu ? 2 : 4) : (glu ? 4 : 8))
                           : (MINB > 1 ? (glu ? 1 : 2) : (glu ? 2 : 4));
    constexpr int R = kMvWarps / S;  // rows per block and row group
    static_assert(!fused || NC == 1, "the fused forms take one column");
    __shared__ float sh[kMvWarps][glu ? 2 * NC : NC];
    __shared__ float pair[fused ? kMvWarps : 1], nred[fused ? 32 : 1];
    extern __shared__ float4 mv_smem[];  // fused, g.nx: b, K floats
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int part = warp % S, rl = warp / S;
    const int64_t mat = blockIdx.y;
    const int64_t i2 = mat % g.ne2, i3 = mat / g.ne2;
    const int64_t a_mat = (i2 / g.r2) * g.a_nb2 + (i3 / g.r3) * g.a_nb3;
    const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kMaxCols;
    const int n_cols = static_cast<int>(min(static_cast<int64_t>(NC), g.N - col0));
    const char* bm = g.b + i2 * g.b_nb2 + i3 * g.b_nb3 + col0 * g.b_nb1;
    int64_t b_nb1 = g.b_nb1;
    // Row m's weights (of segment sg, its row ms there, with the epilogue).
    auto row_of = [&](int64_t m, int* sg, int64_t* ms) -> const char* {
        *ms = m;
        *sg = 0;
        if constexpr (fused) {
            if (g.n_seg > 0) {
                *sg = seg_of(g, m, ms);
                return g.seg[*sg].a + *ms * g.a_nb1;
            }
        }
        return g.a + a_mat + m * g.a_nb1;
    };
    const int64_t n_chunks = (g.K + 255) / 256;
    const int64_t n_full = g.K / 256;
    pdl_trigger();
    {
        const int64_t m0 = static_cast<int64_t>(blockIdx.x) * R + rl;
        if (m0 < g.M && part == 0 && blockIdx.z == 0) {
            // Weights never depend on the kernel before: the row's bytes are on their way to
            // L2 while that kernel finishes.
            int sg0;
            int64_t ms0;
            prefetch_l2(row_of(m0, &sg0, &ms0), g.a_row_bytes, lane);
            if constexpr (glu) prefetch_l2(g.a2 + a_mat + m0 * g.a_nb1, g.a_row_bytes, lane);
        }
    }
    // Folded norm (plain weights, g.early): the warp's first group of U chunks is loaded now,
    // so that its loads overlap the kernel before and the norm instead of following them;
    // decoded by the first group's iteration (the same values in the same order).
    constexpr bool kEarly = fused && (T == Type::F16 || T == Type::BF16 || T == Type::F32);
    Raw8 e0[kEarly ? U : 1], e02[kEarly && glu ? U : 1];
    bool early = false;
    if constexpr (kEarly) {
        const int64_t m0 = static_cast<int64_t>(blockIdx.x) * R + rl;
        early = g.nx && g.early && m0 < g.M && part + (U - 1) * S < n_full;
        if (early) {
            int sg0;
            int64_t ms0;
            const char* r0 = row_of(m0, &sg0, &ms0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                e0[u] = load_raw<T>(r0, part + u * S, lane);
                if constexpr (glu)
                    e02[u] = load_raw<T>(g.a2 + a_mat + m0 * g.a_nb1, part + u * S, lane);
            }
        }
    }
    pdl_wait();
    if constexpr (fused) {
        if (g.nx) {
            float4* xs = mv_smem;
            norm_prologue(g, nred, [&](int64_t i, float4 v) { xs[i] = v; });
            __syncthreads();
            bm = reinterpret_cast<const char*>(xs);
            b_nb1 = g.K * 4;
        }
    }
    // Unfused: one row group per block.
    const int64_t group_step = fused ? static_cast<int64_t>(gridDim.x) * R : g.M;
    for (int64_t mb = static_cast<int64_t>(blockIdx.x) * R; mb < g.M; mb += group_step) {
        const int64_t m = mb + rl;
        const bool valid = m < g.M;  // always, with the epilogue
        int sg = 0;
        int64_t ms = 0;
        if constexpr (fused) {
            // The block's next row group: its rows start on their way to L2 now, so that the
            // group's loads do not each wait on DRAM after this one ends.
            const int64_t mn = m + group_step;
            if (g.next && part == 0 && mn < g.M) {
                prefetch_l2(row_of(mn, &sg, &ms), g.a_row_bytes, lane);
                if constexpr (glu) prefetch_l2(g.a2 + a_mat + mn * g.a_nb1, g.a_row_bytes, lane);
            }
        }
        const char* row = row_of(valid ? m : 0, &sg, &ms);
        const char* row2 = glu ? g.a2 + a_mat + (valid ? m : 0) * g.a_nb1 : nullptr;
        float acc[NC], acc2[glu ? NC : 1];
#pragma unroll
        for (int n = 0; n < NC; n++) acc[n] = 0.0f;
#pragma unroll
        for (int n = 0; n < (glu ? NC : 1); n++) acc2[n] = 0.0f;
        int64_t c = part;
        if (valid) {
            if constexpr (kRaw) {
                for (; c + (U - 1) * S < n_full; c += U * S) {
                    Raw8 r[U], r2[glu ? U : 1];
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        if constexpr (kEarly) {
                            if (early) {
                                r[u] = e0[u];
                                if constexpr (glu) r2[u] = e02[u];
                                continue;
                            }
                        }
                        r[u] = load_raw<T>(row, c + u * S, lane);
                        if constexpr (glu) r2[u] = load_raw<T>(row2, c + u * S, lane);
                    }
                    early = false;
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int64_t e = (c + u * S) * 256 + 8 * lane;
                        Lane8 w;
                        Dec<T>::from_raw(r[u], e, w);
                        mv_chunk<T, NC, x_aligned>(w, bm, b_nb1, n_cols, acc);
                        if constexpr (glu) {
                            Dec<T>::from_raw(r2[u], e, w);
                            mv_chunk<T, NC, x_aligned>(w, bm, b_nb1, n_cols, acc2);
                        }
                    }
                }
            }
            if constexpr (!kRaw) {
                for (; c + (U - 1) * S < n_full; c += U * S) {
                    Lane8 w[U], w2[glu ? U : 1];
                    bool decoded = false;
                    if constexpr (kEarly) {
                        if (early) {
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                const int64_t e = (c + u * S) * 256 + 8 * lane;
                                Dec<T>::from_raw(e0[u], e, w[u]);
                                if constexpr (glu) Dec<T>::from_raw(e02[u], e, w2[u]);
                            }
                            early = false;
                            decoded = true;
                        }
                    }
                    if (!decoded) {
#pragma unroll
                        for (int u = 0; u < U; u++) {
                            Dec<T>::get(row, g.K, c + u * S, lane, w[u]);
                            if constexpr (glu) Dec<T>::get(row2, g.K, c + u * S, lane, w2[u]);
                        }
                    }
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        mv_chunk<T, NC, x_aligned>(w[u], bm, b_nb1, n_cols, acc);
                        if constexpr (glu)
                            mv_chunk<T, NC, x_aligned>(w2[u], bm, b_nb1, n_cols, acc2);
                    }
                }
            }
            for (; c < n_chunks; c += S) {
                Lane8 w;
                if (Dec<T>::get(row, g.K, c, lane, w)) {
                    mv_chunk<T, NC, x_aligned>(w, bm, b_nb1, n_cols, acc);
                    if constexpr (glu) {
                        Dec<T>::get(row2, g.K, c, lane, w);
                        mv_chunk<T, NC, x_aligned>(w, bm, b_nb1, n_cols, acc2);
                    }
                }
            }
        }
#pragma unroll
        for (int n = 0; n < NC; n++) acc[n] = warp_sum(acc[n]);
        if constexpr (glu) {
#pragma unroll
            for (int n = 0; n < NC; n++) acc2[n] = warp_sum(acc2[n]);
        }
        if constexpr (S > 1) {
            if (lane == 0) {
#pragma unroll
                for (int n = 0; n < NC; n++) {
                    sh[warp][n] = acc[n];
                    if constexpr (glu) sh[warp][NC + n] = acc2[n];
                }
            }
            __syncthreads();
#pragma unroll
            for (int n = 0; n < NC; n++) {
                float t = 0.0f, t2 = 0.0f;
#pragma unroll
                for (int p = 0; p < S; p++) {
                    t += sh[rl * S + p][n];
                    if constexpr (glu) t2 += sh[rl * S + p][NC + n];
                }
                acc[n] = t;
                if constexpr (glu) acc2[n] = t2;
            }
            if constexpr (fused) __syncthreads();  // sh is written again by the next group
        }
        const bool leader = part == 0 && valid;
        if constexpr (fused && !glu) {
            if (g.n_seg > 0) {
                mv_epilogue(g, g.seg[sg], ms, rl, leader, lane, acc[0], pair);
                continue;
            }
        }
        if (!leader || lane >= n_cols) continue;
        float v = 0.0f, v2 = 0.0f;
#pragma unroll
        for (int n = 0; n < NC; n++) {
            if (n == lane) {
                v = acc[n];
                if constexpr (glu) v2 = acc2[n];
            }
        }
        const int64_t col = col0 + lane;
        if constexpr (glu) v = v / (1.0f + expf(-v)) * v2;
        if (g.res) {
            v += reinterpret_cast<const float*>(g.res + col * g.res_nb1 + i2 * g.res_nb2 +
                                                i3 * g.res_nb3)[m];
        }
        g.out[((i3 * g.ne2 + i2) * g.N + col) * g.M + m] = v;
    }
}

// Any layout: warp per (row, matrix), lanes over elements, columns one after another.
__global__ void k_mul_mat_generic(MvArgs g, Type t) {
    const int lane = threadIdx.x % 32;
    const int64_t m = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
    const int64_t mat = blockIdx.y;
    const int64_t i2 = mat % g.ne2, i3 = mat / g.ne2;
    if (m >= g.M) return;
    const char* row = g.a + m * g.a_nb1 + (i2 / g.r2) * g.a_nb2 + (i3 / g.r3) * g.a_nb3;
    for (int64_t n = blockIdx.z; n < g.N; n += gridDim.z) {
        const float* x =
            reinterpret_cast<const float*>(g.b + n * g.b_nb1 + i2 * g.b_nb2 + i3 * g.b_nb3);
        float s = 0.0f;
        for (int64_t k = lane; k < g.K; k += 32) s = fmaf(load_elem(t, row, k), x[k], s);
        s = warp_sum(s);
        if (lane == 0) {
            if (g.res) {
                s += reinterpret_cast<const float*>(g.res + n * g.res_nb1 + i2 * g.res_nb2 +
                                                    i3 * g.res_nb3)[m];
            }
            g.out[((i3 * g.ne2 + i2) * g.N + n) * g.M + m] = s;
        }
    }
}

// Instantiated variants (compile time matters: CI builds every one): split-K (S > 1) and the
// GLU pair for single-column products (decode), S = 1 for 2..8 columns; x rows 16-byte
// aligned (the launcher sends other layouts to the generic kernel).
bool occupancy_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_OCC");
        return !(v && v[0] == '0');
    }();
    return on;
}

template <Type T, int NC, int S, bool glu>
void launch_vec_s(const MvArgs& g, dim3 grid, cudaStream_t st, bool raw) {
    grid.x = n_blocks(g.M, kMvWarps / S);
    if constexpr (kPlain<T> && NC == 1) {
        if (occupancy_mode() && raw) {
            launch_pdl(k_mul_mat_vec<T, 1, true, S, glu, 3, false, true>, grid, dim3(32 * kMvWarps),
                       0, st, g);
            return;
        }
    }
    // Measured on the H200 (bench/results/cuda.md, 1B Q4_0 tg128, same machine): the cap for
    // every split gave 504 t/s, for splits <= 2 only 473, none 428.
    if (NC == 1 && occupancy_mode()) {
        launch_pdl(k_mul_mat_vec<T, NC, true, S, glu, 3>, grid, dim3(32 * kMvWarps), 0, st, g);
    } else {
        launch_pdl(k_mul_mat_vec<T, NC, true, S, glu, 1>, grid, dim3(32 * kMvWarps), 0, st, g);
    }
}

template <Type T, bool glu>
void launch_vec(const MvArgs& g, dim3 grid, int split, cudaStream_t st, bool raw) {
    grid.z = static_cast<unsigned>((g.N + kMaxCols - 1) / kMaxCols);
    if (g.N == 1) {
        switch (split) {
            case 1:
                return launch_vec_s<T, 1, 1, glu>(g, grid, st, raw);
            case 2:
                return launch_vec_s<T, 1, 2, glu>(g, grid, st, raw);
            default:
                return launch_vec_s<T, 1, 4, glu>(g, grid, st, raw);
        }
    }
    if constexpr (!glu) {
        switch (g.N) {
            case 2:
                return launch_vec_s<T, 2, 1, false>(g, grid, st, raw);
            case 3:
            case 4:
                return launch_vec_s<T, 4, 1, false>(g, grid, st, raw);
            default:
                return launch_vec_s<T, 8, 1, false>(g, grid, st, raw);
        }
    }
}

}  // namespace

// Warps per row: enough rows x warps to give every SM ~32 warps, at most one per chunk, and
// at most kMvWarps / 2, so that a block holds row pairs (the fused epilogue's rope; the
// unfused product must add the same parts: a k or v projection of 512 rows took 8 before).
int choose_split(int64_t M, int64_t K, int n_sm) {
    const int64_t target = 32 * static_cast<int64_t>(n_sm);
    const int64_t chunks = (K + 255) / 256;
    int s = 1;
    while (2 * s <= kMvWarps / 2 && M * s < target && 2 * s <= chunks) s *= 2;
    return s;
}

namespace {

// The fused float kernel, raw or decoded form, for split S = 1, 2 or 4.
template <Type T, bool glu, bool raw>
void launch_vec_fused_form(const MvArgs& g, int split, dim3 grid, size_t smem, cudaStream_t st) {
    const dim3 block(32 * kMvWarps);
    switch (split) {
        case 1:
            launch_pdl(k_mul_mat_vec<T, 1, true, 1, glu, 3, true, raw>, grid, block, smem, st, g);
            break;
        case 2:
            launch_pdl(k_mul_mat_vec<T, 1, true, 2, glu, 3, true, raw>, grid, block, smem, st, g);
            break;
        default:
            launch_pdl(k_mul_mat_vec<T, 1, true, 4, glu, 3, true, raw>, grid, block, smem, st, g);
            break;
    }
}

template <Type T, bool glu>
void launch_vec_fused(const OpContext& ctx, const MvArgs& ga, int split) {
    MvArgs g = ga;
    g.next = ctx.mv_next;
    const size_t smem = g.nx ? static_cast<size_t>(g.K) * sizeof(float) : 0;
    const int R = kMvWarps / split;
    // A few blocks per SM loop over the row groups (each computes the folded norm once).
    // FERRY_CUDA_MV_FCAP=0: a block per row group, as the unfused launch (not yet measured;
    // ncu on the H200 read the capped q/k/v epilogue launch at 13.4 us for 12.6 MB: each
    // block takes ~4 row groups one after another, a DRAM round trip and 1-3 barriers each).
    static const bool cap = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_FCAP");
        return !(v && v[0] == '0');
    }();
    const unsigned blocks =
        cap ? std::min(n_blocks(g.M, R), static_cast<unsigned>(ctx.n_sm) * 3) : n_blocks(g.M, R);
    const dim3 grid(blocks, 1, 1);
    if (ctx.mv_raw) {
        launch_vec_fused_form<T, glu, true>(g, split, grid, smem, ctx.stream);
    } else {
        launch_vec_fused_form<T, glu, false>(g, split, grid, smem, ctx.stream);
    }
}

// The fused float kernel with the unfused launch's split for this product (M rows).
template <bool glu>
Status dispatch_vec_fused(OpContext& ctx, const MvArgs& g, Type t, int64_t M) {
    const int split = choose_split(M, g.K, ctx.n_sm);
    switch (t) {
        case Type::F32:
            launch_vec_fused<Type::F32, glu>(ctx, g, split);
            break;
        case Type::F16:
            launch_vec_fused<Type::F16, glu>(ctx, g, split);
            break;
        case Type::BF16:
            launch_vec_fused<Type::BF16, glu>(ctx, g, split);
            break;
        default:
            return Status::errorf("CUDA: fused MUL_MAT weight type %s", type_name(t));
    }
    return launch_status(glu ? "MUL_MAT+MUL_MAT+SWIGLU (vec, fused)" : "MUL_MAT (vec, fused)");
}

template <bool glu>
Status dispatch_vec(OpContext& ctx, const MvArgs& g, Type t, dim3 grid, int split) {
    switch (t) {
        case Type::F32:
            launch_vec<Type::F32, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::F16:
            launch_vec<Type::F16, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::BF16:
            launch_vec<Type::BF16, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q4_0:
            launch_vec<Type::Q4_0, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q4_1:
            launch_vec<Type::Q4_1, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q8_0:
            launch_vec<Type::Q8_0, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q4_K:
            launch_vec<Type::Q4_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q5_K:
            launch_vec<Type::Q5_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q6_K:
            launch_vec<Type::Q6_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q5_0:
            launch_vec<Type::Q5_0, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q5_1:
            launch_vec<Type::Q5_1, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q2_K:
            launch_vec<Type::Q2_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q3_K:
            launch_vec<Type::Q3_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::IQ4_NL:
            launch_vec<Type::IQ4_NL, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::IQ4_XS:
            launch_vec<Type::IQ4_XS, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::MXFP4:
            launch_vec<Type::MXFP4, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        default:
            return Status::errorf("CUDA: MUL_MAT weight type %s", type_name(t));
    }
    return launch_status(glu ? "MUL_MAT+MUL_MAT+SWIGLU" : "MUL_MAT (vec)");
}

}  // namespace

Status launch_vec_generic(OpContext& ctx, const MvArgs& g, Type t, dim3 grid) {
    k_mul_mat_generic<<<dim3(grid.x, grid.y, static_cast<unsigned>(g.N < 32 ? g.N : 32)),
                        32 * kRowsPerBlock, 0, ctx.stream>>>(g, t);
    return launch_status("MUL_MAT (generic)");
}

Status launch_vec_product(OpContext& ctx, const MvArgs& g, Type t, dim3 grid, int split, bool glu) {
    return glu ? dispatch_vec<true>(ctx, g, t, grid, split)
               : dispatch_vec<false>(ctx, g, t, grid, split);
}

Status launch_vec_fused_product(OpContext& ctx, const MvArgs& g, Type t, int64_t M, bool glu) {
    return glu ? dispatch_vec_fused<true>(ctx, g, t, M) : dispatch_vec_fused<false>(ctx, g, t, M);
}

// ---------------------------------------------------------------------------------------------
// Prefill through cuBLAS (launch_gemm, mul_mat.cu): b converted to F16/BF16, block-format
// weights dequantized to F16. These kernels sit here rather than in mul_mat.cu because ptxas
// (sm_90) gives every kernel of a module in which some kernel declares dynamic shared memory
// (extern __shared__, as the float kernel does) a 1 KiB shared-memory section: beside the float
// kernel they keep what they had when all of MUL_MAT was one file (SHARED:1024 in cuobjdump
// -res-usage); in a module of their own they would have none.

namespace {

// Converts rows of F32 (any row strides) into a contiguous [K, N] matrix of F16 or BF16.
__global__ void k_to_half(const char* b, int64_t nb1, int64_t K, int64_t N, uint16_t* out,
                          bool bf16) {
    const int64_t n = K * N;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t k = i % K, c = i / K;
        const float v = reinterpret_cast<const float*>(b + c * nb1)[k];
        out[i] = bf16 ? f2bf(v) : f2h(v);
    }
}

// k_to_half for rows of whole float4s (K % 4 == 0, b and nb1 16-byte aligned): one 16-byte
// load and one 8-byte store per 4 elements.
__global__ void k_to_half4(const char* b, int64_t nb1, int64_t K, int64_t N, uint16_t* out,
                           bool bf16) {
    const int64_t k4 = K / 4, n = k4 * N;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t c = i / k4, k = i % k4;
        const float4 v = reinterpret_cast<const float4*>(b + c * nb1)[k];
        const uint32_t lo = bf16 ? f2bf(v.x) | (static_cast<uint32_t>(f2bf(v.y)) << 16)
                                 : f2h(v.x) | (static_cast<uint32_t>(f2h(v.y)) << 16);
        const uint32_t hi = bf16 ? f2bf(v.z) | (static_cast<uint32_t>(f2bf(v.w)) << 16)
                                 : f2h(v.z) | (static_cast<uint32_t>(f2h(v.w)) << 16);
        reinterpret_cast<uint2*>(out)[i] = make_uint2(lo, hi);
    }
}

// Dequantizes rows of a block format (rows at stride nb1) into a contiguous F16 [K, M].
template <Type T>
__global__ void k_dequant_f16(const char* a, int64_t nb1, int64_t K, int64_t M, uint16_t* out) {
    const int64_t n_chunks = (K + 255) / 256;
    const int64_t n = M * n_chunks;
    const int lane = threadIdx.x % 32;
    for (int64_t wi = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; wi < n;
         wi += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
        const int64_t m = wi / n_chunks, c = wi % n_chunks;
        Lane8 w;
        if (!Dec<T>::get(a + m * nb1, K, c, lane, w)) continue;
        // Each lane's two runs of 4 weights as two 8-byte stores (K % 4 == 0: aligned).
        uint16_t* o = out + m * K;
        uint32_t h[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            h[k] = static_cast<uint32_t>(f2h(fmaf(w.d, w.q[2 * k], w.m))) |
                   (static_cast<uint32_t>(f2h(fmaf(w.d, w.q[2 * k + 1], w.m))) << 16);
        }
        *reinterpret_cast<uint2*>(o + w.o0) = make_uint2(h[0], h[1]);
        *reinterpret_cast<uint2*>(o + w.o1) = make_uint2(h[2], h[3]);
    }
}

}  // namespace

// a's rows as F16 (row stride K) for cuBLAS: every quantized type the float kernel decodes.
Status dequant_f16(Type t, unsigned blocks, cudaStream_t st, const char* am, int64_t nb1, int64_t K,
                   int64_t M, uint16_t* ah) {
    switch (t) {
#define FERRY_DEQ(T)                                                       \
    case Type::T:                                                          \
        k_dequant_f16<Type::T><<<blocks, 256, 0, st>>>(am, nb1, K, M, ah); \
        return Status::ok();
        FERRY_DEQ(Q4_0)
        FERRY_DEQ(Q4_1)
        FERRY_DEQ(Q8_0)
        FERRY_DEQ(Q4_K)
        FERRY_DEQ(Q5_K)
        FERRY_DEQ(Q6_K)
        FERRY_DEQ(Q5_0)
        FERRY_DEQ(Q5_1)
        FERRY_DEQ(Q2_K)
        FERRY_DEQ(Q3_K)
        FERRY_DEQ(IQ4_NL)
        FERRY_DEQ(IQ4_XS)
        FERRY_DEQ(MXFP4)
#undef FERRY_DEQ
        default:
            return Status::errorf("CUDA: MUL_MAT weight type %s", type_name(t));
    }
}

// b's N columns (rows at stride bnb1) as a contiguous [K, N] matrix of F16 or BF16 (bh).
void launch_to_half(const char* bm, int64_t bnb1, int64_t K, int64_t N, uint16_t* bh, bool bf16,
                    cudaStream_t st) {
    if (K % 4 == 0 && bnb1 % 16 == 0 && reinterpret_cast<uintptr_t>(bm) % 16 == 0) {
        k_to_half4<<<std::min(n_blocks(K / 4 * N, 256), 8192u), 256, 0, st>>>(bm, bnb1, K, N, bh,
                                                                              bf16);
    } else {
        k_to_half<<<std::min(n_blocks(K * N, 256), 8192u), 256, 0, st>>>(bm, bnb1, K, N, bh, bf16);
    }
}

}  // namespace ferry::cuda
