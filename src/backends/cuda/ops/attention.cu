// FLASH_ATTN_EXT: out = softmax(q k^T * scale + mask) v, one pass over the keys with an online
// softmax (running max and sum), never materialising the scores.
//
// One block (4 warps) per (query, head, batch) row and KV split; the warps take every 4th key
// of the split, each lane holding ceil(D/32) elements of q and of the output. Keys whose mask
// is -inf are skipped before their dot product (the causal half of a prefill costs nothing).
// Grouped-query heads read kv head h / (n_head / n_head_kv). When there are too few rows to
// fill the GPU (decode: one query), the KV length is split across blocks and a second kernel
// merges the partial (max, sum, output) triples.
#include <atomic>

#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"
#include "backends/cuda/ops/trace.cuh"
#include "core/env.h"

namespace ferry::cuda {

namespace {

#ifdef FERRY_CUDA_TRACE
int trace_next_id() {
    return trace_next_id_tu(".attn");
}
#endif

constexpr int kWarps = 4;
constexpr int64_t kMaxCounters = 1 << 16;  // rows a split launch may have (OpContext::counters)

struct AttnArgs {
    TV q, k, v, mask, out;
    Type kt, vt;
    bool has_mask, mask_f16;
    bool kv_vec;  // k and v rows 16-byte aligned, whole 16-byte chunks (k_attn_tiled's loads)
    float scale;
    int64_t n_head, n_q, n_kv, D, Dv;
    int64_t rh, r3;  // n_head / n_head_kv, q.ne3 / k.ne3
    int n_split;
    float* partial;     // [n_split][rows][Dv + 2] when n_split > 1
    int32_t* counters;  // [rows], zero between launches: splits of a row done so far
    // k_attn_row: keys and values loaded before griddepcontrol.wait, then the rows the graph
    // wrote (early_k / early_v) again after it (OpContext::attn_early).
    bool early;
    AttnRowsWritten early_k, early_v;
    // Early form: the indices read before the wait too (AttnEarly::idx_ready), and the
    // dependents' launch allowed once the rows' and q's loads after it are issued (late) rather
    // than at the wait.
    bool early_idx, late_trigger;
    // Early form: the mask read first (AttnEarly::mask_ready), and only the rows up to the last
    // key it lets through loaded.
    bool early_mask;
    // Early form: weights asked for in L2 at the start (AttnEarly::next; n == 0: none).
    L2Ask pf;
    int trace_id;  // FERRY_CUDA_TRACE builds: the launch's number
};

__device__ __forceinline__ float kv_at(Type t, const char* row, int64_t i) {
    if (t == Type::F16) return h2f(reinterpret_cast<const uint16_t*>(row)[i]);
    if (t == Type::BF16) return bf2f(reinterpret_cast<const uint16_t*>(row)[i]);
    return reinterpret_cast<const float*>(row)[i];
}

// Row iq of the mask for head h of batch i3 (the mask broadcasts over heads and batches), and
// its value j (F16 or F32): every attention kernel reads the mask through these.
__device__ __forceinline__ const char* mask_row(const AttnArgs& g, int64_t iq, int64_t h,
                                                int64_t i3) {
    return g.mask.p + iq * g.mask.nb[1] + (h % g.mask.ne[2]) * g.mask.nb[2] +
           (i3 % g.mask.ne[3]) * g.mask.nb[3];
}
__device__ __forceinline__ float mask_value(const AttnArgs& g, const char* mrow, int64_t j) {
    return g.mask_f16 ? h2f(reinterpret_cast<const uint16_t*>(mrow)[j])
                      : reinterpret_cast<const float*>(mrow)[j];
}

template <int DT>
__global__ void __launch_bounds__(32 * kWarps) k_attn(AttnArgs g) {
    __shared__ float s_m[kWarps], s_l[kWarps];
    __shared__ float s_acc[kWarps][DT * 32];
    pdl_wait();     // launched with launch_pdl: nothing before this touches memory
    pdl_trigger();  // the output projection that follows may start prefetching its weights
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t r = blockIdx.x;
    const int64_t h = r % g.n_head, iq = (r / g.n_head) % g.n_q, i3 = r / (g.n_head * g.n_q);
    const int64_t hk = h / g.rh, k3 = i3 / g.r3;
    const int split = blockIdx.y;
    const int64_t per = (g.n_kv + g.n_split - 1) / g.n_split;
    const int64_t j0 = split * per, j1 = min(g.n_kv, j0 + per);

    float qv[DT], acc[DT];
    const float* qrow =
        reinterpret_cast<const float*>(g.q.p + iq * g.q.nb[1] + h * g.q.nb[2] + i3 * g.q.nb[3]);
#pragma unroll
    for (int t = 0; t < DT; t++) {
        const int64_t d = lane + 32 * t;
        qv[t] = d < g.D ? qrow[d] : 0.0f;
        acc[t] = 0.0f;
    }
    const char* mrow = g.has_mask ? mask_row(g, iq, h, i3) : nullptr;
    const char* kbase = g.k.p + hk * g.k.nb[2] + k3 * g.k.nb[3];
    const char* vbase = g.v.p + hk * g.v.nb[2] + k3 * g.v.nb[3];
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = j0 + warp; j < j1; j += kWarps) {
        float mk = 0.0f;
        if (g.has_mask) {
            mk = mask_value(g, mrow, j);
            if (mk == -INFINITY) continue;
        }
        const char* krow = kbase + j * g.k.nb[1];
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < DT; t++) {
            const int64_t d = lane + 32 * t;
            if (d < g.D) s = fmaf(qv[t], kv_at(g.kt, krow, d), s);
        }
        s = warp_sum(s) * g.scale + mk;
        if (s == -INFINITY) continue;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // 0 when m was -inf
        const float p = expf(s - m_new);
        l = l * corr + p;
        m = m_new;
        const char* vrow = vbase + j * g.v.nb[1];
#pragma unroll
        for (int t = 0; t < DT; t++) {
            const int64_t d = lane + 32 * t;
            const float vv = d < g.Dv ? kv_at(g.vt, vrow, d) : 0.0f;
            acc[t] = fmaf(p, vv, acc[t] * corr);
        }
    }
    // Merge the warps.
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < DT; t++) s_acc[warp][lane + 32 * t] = acc[t];
    __syncthreads();
    if (warp != 0) return;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; w++) M = fmaxf(M, s_m[w]);
    float L = 0.0f;
    float o[DT];
#pragma unroll
    for (int t = 0; t < DT; t++) o[t] = 0.0f;
    if (M != -INFINITY) {
        for (int w = 0; w < kWarps; w++) {
            const float f = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - M);
            L += s_l[w] * f;
#pragma unroll
            for (int t = 0; t < DT; t++) o[t] += s_acc[w][lane + 32 * t] * f;
        }
    }
    const int64_t rows = gridDim.x;
    if (g.n_split == 1) {
        float* out = reinterpret_cast<float*>(g.out.p) + ((i3 * g.n_q + iq) * g.n_head + h) * g.Dv;
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
        for (int t = 0; t < DT; t++) {
            const int64_t d = lane + 32 * t;
            if (d < g.Dv) out[d] = o[t] * inv;
        }
    } else {
        float* p = g.partial + (static_cast<int64_t>(split) * rows + r) * (g.Dv + 2);
        if (lane == 0) {
            p[0] = M;
            p[1] = L;
        }
#pragma unroll
        for (int t = 0; t < DT; t++) {
            const int64_t d = lane + 32 * t;
            if (d < g.Dv) p[2 + d] = o[t];
        }
        // The last split of this row to finish merges all of them (no second launch).
        __threadfence();
        int done = 0;
        if (lane == 0) done = atomicAdd(&g.counters[r], 1);
        done = __shfl_sync(0xffffffffu, done, 0);
        if (done != g.n_split - 1) return;
        __threadfence();
        float MM = -INFINITY;
        for (int sp = 0; sp < g.n_split; sp++) {
            MM = fmaxf(MM, __ldcg(g.partial + (static_cast<int64_t>(sp) * rows + r) * (g.Dv + 2)));
        }
        float LL = 0.0f;
        float acc_o[DT];
#pragma unroll
        for (int t = 0; t < DT; t++) acc_o[t] = 0.0f;
        if (MM != -INFINITY) {
            for (int sp = 0; sp < g.n_split; sp++) {
                const float* q = g.partial + (static_cast<int64_t>(sp) * rows + r) * (g.Dv + 2);
                const float qm = __ldcg(q);
                if (qm == -INFINITY) continue;
                const float f = expf(qm - MM);
                LL += __ldcg(q + 1) * f;
#pragma unroll
                for (int t = 0; t < DT; t++) {
                    const int64_t d = lane + 32 * t;
                    if (d < g.Dv) acc_o[t] += __ldcg(q + 2 + d) * f;
                }
            }
        }
        float* out = reinterpret_cast<float*>(g.out.p) + ((i3 * g.n_q + iq) * g.n_head + h) * g.Dv;
        const float inv = LL > 0.0f ? 1.0f / LL : 0.0f;
#pragma unroll
        for (int t = 0; t < DT; t++) {
            const int64_t d = lane + 32 * t;
            if (d < g.Dv) out[d] = acc_o[t] * inv;
        }
        if (lane == 0) g.counters[r] = 0;  // ready for the next launch (and graph replay)
    }
}

// Prefill: a block takes kTQ queries of one head and walks the keys in tiles of kTK, holding
// the tile's keys and values (as floats), its queries and the tile's probabilities in shared
// memory, so each key is read once per kTQ queries instead of once per query. Thread (ty, tx)
// of 16 x 16 owns the scores of queries 4ty..4ty+3 with keys tx + 16j, j < 4, and the outputs
// of the same queries at columns 64g + 4tx .. 64g + 4tx + 3; shared memory is read as float4
// (q and k rows padded to D + 4 floats: conflict-free). The 16 threads of a query row are one
// half-warp, so the online softmax's row max and sum are half-warp shuffles. A key tile whose mask
// is -inf for every query of the block (the causal upper triangle) is skipped before it is loaded.
// Every step is fp32, as in k_attn.
constexpr int kTQ = 64, kTK = 64, kTThreads = 256;
constexpr int64_t kTiledMinQueries = 16;  // fewer queries per head: k_attn (and its KV split)

bool tiled_enabled() {  // FERRY_CUDA_ATTN_TILED=0: every query through k_attn, as before
    static const bool on = !env_off("FERRY_CUDA_ATTN_TILED");
    return on;
}

template <int D>
constexpr size_t tiled_smem() {
    // q [kTQ][D + 4], k [kTK][D + 4], v [kTK][D], p [kTQ][kTK + 4]
    return sizeof(float) * (kTQ * (D + 4) + kTK * (D + 4) + kTK * D + kTQ * (kTK + 4));
}

// Rows j0 .. j0 + kTK - 1 (those < n_kv; zeros past it) of a K or V view, elements 0 .. n - 1,
// into dst[r * ld + e] as floats: 16-byte loads, all issued before the first is stored.
template <int D>
__device__ __forceinline__ void load_tile_vec(Type t, const char* base, int64_t nb1, int64_t j0,
                                              int64_t n_kv, int64_t n, float* dst, int ld,
                                              int tid) {
    const int es = t == Type::F32 ? 4 : 2;
    const int per = 16 / es;  // elements per chunk
    const int cpr = static_cast<int>(n) / per;
    const int total = kTK * cpr;
    constexpr int kMax = kTK * D * 4 / 16 / kTThreads;  // chunks per thread at most (F32)
    uint4 raw[kMax];
#pragma unroll
    for (int i = 0; i < kMax; i++) {
        const int c = tid + i * kTThreads;
        raw[i] = make_uint4(0u, 0u, 0u, 0u);
        if (c < total) {
            const int r = c / cpr;
            if (j0 + r < n_kv) {
                raw[i] = *reinterpret_cast<const uint4*>(base + (j0 + r) * nb1 + (c % cpr) * 16);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < kMax; i++) {
        const int c = tid + i * kTThreads;
        if (c >= total) break;
        float* o = dst + (c / cpr) * ld + (c % cpr) * per;
        const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
        if (es == 4) {
#pragma unroll
            for (int e = 0; e < 4; e++) o[e] = __uint_as_float(w[e]);
        } else if (t == Type::F16) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                o[2 * e] = h2f(static_cast<uint16_t>(w[e] & 0xffffu));
                o[2 * e + 1] = h2f(static_cast<uint16_t>(w[e] >> 16));
            }
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                o[2 * e] = bf2f(static_cast<uint16_t>(w[e] & 0xffffu));
                o[2 * e + 1] = bf2f(static_cast<uint16_t>(w[e] >> 16));
            }
        }
    }
}

template <int D>
__global__ void __launch_bounds__(kTThreads) k_attn_tiled(AttnArgs g) {
    constexpr int LD = D + 4;     // q and k rows: 16-byte aligned, conflict-free float4 reads
    constexpr int PLD = kTK + 4;  // probability rows
    constexpr int G = D / 64;     // 64-column groups of the output a thread takes 4 columns of
    extern __shared__ float4 sm4[];
    float* qs = reinterpret_cast<float*>(sm4);  // [kTQ][LD]
    float* ks = qs + kTQ * LD;                  // [kTK][LD]
    float* vs = ks + kTK * LD;                  // [kTK][D]
    float* ps = vs + kTK * D;                   // [kTQ][PLD]
    pdl_wait();
    pdl_trigger();
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTQ;
    const int64_t h = blockIdx.y, i3 = blockIdx.z;
    const int64_t hk = h / g.rh, k3 = i3 / g.r3;
    const int64_t D_ = g.D, Dv = g.Dv;

    for (int i = tid; i < kTQ * D; i += kTThreads) {
        const int r = i / D, d = i % D;
        const int64_t iq = q0 + r;
        float x = 0.0f;
        if (iq < g.n_q && d < D_) {
            x = reinterpret_cast<const float*>(g.q.p + iq * g.q.nb[1] + h * g.q.nb[2] +
                                               i3 * g.q.nb[3])[d];
        }
        qs[r * LD + d] = x;
        ks[r * LD + d] = 0.0f;  // columns D_ .. D - 1 stay 0 (the vector loads skip them)
    }
    const char* mbase = g.has_mask ? mask_row(g, 0, h, i3) : nullptr;
    const char* kbase = g.k.p + hk * g.k.nb[2] + k3 * g.k.nb[3];
    const char* vbase = g.v.p + hk * g.v.nb[2] + k3 * g.v.nb[3];

    float m[4], l[4], o[4][4 * G];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < 4 * G; c++) o[i][c] = 0.0f;
    }

    for (int64_t j0 = 0; j0 < g.n_kv; j0 += kTK) {
        // This thread's mask entries; skip the tile when no query of the block sees any key.
        float mk[4][4];
        bool any = false;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t iq = q0 + 4 * ty + i;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t jk = j0 + tx + 16 * j;
                float x = -INFINITY;
                if (iq < g.n_q && jk < g.n_kv) {
                    x = 0.0f;
                    if (g.has_mask) {
                        x = mask_value(g, mbase + iq * g.mask.nb[1], jk);
                    }
                }
                mk[i][j] = x;
                any |= x != -INFINITY;
            }
        }
        if (!__syncthreads_or(any)) continue;

        if (g.kv_vec) {
            load_tile_vec<D>(g.kt, kbase, g.k.nb[1], j0, g.n_kv, D_, ks, LD, tid);
            load_tile_vec<D>(g.vt, vbase, g.v.nb[1], j0, g.n_kv, Dv, vs, D, tid);
        } else {
            for (int i = tid; i < kTK * D; i += kTThreads) {
                const int r = i / D, d = i % D;
                const int64_t jk = j0 + r;
                float kx = 0.0f, vx = 0.0f;
                if (jk < g.n_kv) {
                    if (d < D_) kx = kv_at(g.kt, kbase + jk * g.k.nb[1], d);
                    if (d < Dv) vx = kv_at(g.vt, vbase + jk * g.v.nb[1], d);
                }
                ks[r * LD + d] = kx;
                vs[r * D + d] = vx;
            }
        }
        __syncthreads();

        // Scores of queries 4ty + i with keys tx + 16j, four elements of d at a time.
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
#pragma unroll
            for (int j = 0; j < 4; j++) s[i][j] = 0.0f;
        }
#pragma unroll 4
        for (int d = 0; d < D; d += 4) {
            float4 qv[4], kv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                qv[i] = *reinterpret_cast<const float4*>(qs + (4 * ty + i) * LD + d);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                kv[j] = *reinterpret_cast<const float4*>(ks + (tx + 16 * j) * LD + d);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
                    s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
                    s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
                    s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
                }
            }
        }
        // Online softmax per query row (16 threads of a half-warp hold a row's 64 scores).
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float tmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s[i][j] = mk[i][j] == -INFINITY ? -INFINITY : s[i][j] * g.scale + mk[i][j];
                tmax = fmaxf(tmax, s[i][j]);
            }
#pragma unroll
            for (int off = 8; off > 0; off /= 2) {
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            }
            const float m_new = fmaxf(m[i], tmax);
            float corr = 1.0f, sum = 0.0f;
            if (m_new != -INFINITY) {
                corr = expf(m[i] - m_new);  // 0 when m was -inf
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float p = s[i][j] == -INFINITY ? 0.0f : expf(s[i][j] - m_new);
                    s[i][j] = p;
                    sum += p;
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] = 0.0f;
            }
#pragma unroll
            for (int off = 8; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            l[i] = l[i] * corr + sum;
            m[i] = m_new;
#pragma unroll
            for (int c = 0; c < 4 * G; c++) o[i][c] *= corr;
#pragma unroll
            for (int j = 0; j < 4; j++) ps[(4 * ty + i) * PLD + tx + 16 * j] = s[i][j];
        }
        __syncthreads();
        // Outputs of queries 4ty + i at columns 64gi + 4tx .. + 3, four keys at a time.
#pragma unroll 2
        for (int j = 0; j < kTK; j += 4) {
            float4 pv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                pv[i] = *reinterpret_cast<const float4*>(ps + (4 * ty + i) * PLD + j);
            }
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
#pragma unroll
                for (int gi = 0; gi < G; gi++) {
                    const float4 v4 =
                        *reinterpret_cast<const float4*>(vs + (j + jj) * D + 64 * gi + 4 * tx);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float p = jj == 0   ? pv[i].x
                                        : jj == 1 ? pv[i].y
                                        : jj == 2 ? pv[i].z
                                                  : pv[i].w;
                        o[i][4 * gi] = fmaf(p, v4.x, o[i][4 * gi]);
                        o[i][4 * gi + 1] = fmaf(p, v4.y, o[i][4 * gi + 1]);
                        o[i][4 * gi + 2] = fmaf(p, v4.z, o[i][4 * gi + 2]);
                        o[i][4 * gi + 3] = fmaf(p, v4.w, o[i][4 * gi + 3]);
                    }
                }
            }
        }
        __syncthreads();  // the next tile overwrites ks, vs and ps
    }

#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t iq = q0 + 4 * ty + i;
        if (iq >= g.n_q) continue;
        float* out = reinterpret_cast<float*>(g.out.p) + ((i3 * g.n_q + iq) * g.n_head + h) * Dv;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t d = 64 * gi + 4 * tx + e;
                if (d < Dv) out[d] = o[i][4 * gi + e] * inv;
            }
        }
    }
}

// Prefill with an F16 cache on tensor cores (mma.sync m16n8k16, f16 inputs, f32 accumulators):
// a block of 4 warps takes 64 queries of one head, each warp 16 of them, and walks the keys
// in tiles of 64 (K as [key][d], V transposed to [d][key], both f16 in shared memory). q is
// rounded to f16 for q.k and the probabilities to f16 for p.v (the test bound's f16 note);
// scores, the online softmax and the outputs stay f32. Fragment layouts (PTX ISA, mma
// m16n8k16 .f16): with gid = lane / 4 and tig = lane % 4, A register r holds row gid + 8 (r & 1)
// at columns 2 tig + 8 (r >> 1) + {0, 1}; B register r holds column gid at rows 2 tig + 8 r +
// {0, 1}; C holds rows gid (c0, c1) and gid + 8 (c2, c3) at columns 2 tig + {0, 1}. A score
// tile's C registers are, as they stand, the A registers of the p.v product.
constexpr int kMQ = 64, kMK = 64, kMWarps = 4;

template <int D>
constexpr size_t mma_smem() {
    return sizeof(uint16_t) * (kMK * (D + 8) + D * (kMK + 8));  // K [kMK][D + 8], Vt [D][kMK + 8]
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    return static_cast<uint32_t>(f2h(lo)) | (static_cast<uint32_t>(f2h(hi)) << 16);
}

template <int D>
__global__ void __launch_bounds__(32 * kMWarps, D <= 64 ? 3 : 2) k_attn_mma(AttnArgs g) {
    constexpr int LK = D + 8, LV = kMK + 8;  // row strides (halves): conflict-free fragments
    constexpr int NT = D / 8;                // output column tiles
    extern __shared__ uint4 mma_sm[];
    uint16_t* ks = reinterpret_cast<uint16_t*>(mma_sm);  // [kMK][LK]
    uint16_t* vt = ks + kMK * LK;                        // [D][LV]
    pdl_wait();
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int gid = lane / 4, tig = lane % 4;
    const int64_t h = blockIdx.y, i3 = blockIdx.z;
    const int64_t hk = h / g.rh, k3 = i3 / g.r3;
    const int64_t qb = static_cast<int64_t>(blockIdx.x) * kMQ;  // the block's first query
    const int64_t qw = qb + 16 * warp;                          // the warp's first query
    const int64_t r0 = qw + gid, r1 = r0 + 8;                   // this thread's two rows

    // q as A fragments, rounded to f16 (rows past n_q are 0).
    uint32_t qa[D / 16][4];
    {
        const float* q0 = r0 < g.n_q ? reinterpret_cast<const float*>(
                                           g.q.p + r0 * g.q.nb[1] + h * g.q.nb[2] + i3 * g.q.nb[3])
                                     : nullptr;
        const float* q1 = r1 < g.n_q ? reinterpret_cast<const float*>(
                                           g.q.p + r1 * g.q.nb[1] + h * g.q.nb[2] + i3 * g.q.nb[3])
                                     : nullptr;
#pragma unroll
        for (int s = 0; s < D / 16; s++) {
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float* qr = (r & 1) ? q1 : q0;
                const int d = 16 * s + 8 * (r >> 1) + 2 * tig;
                qa[s][r] = qr ? pack_h2(qr[d], qr[d + 1]) : 0u;
            }
        }
    }
    const char* mbase = g.has_mask ? mask_row(g, 0, h, i3) : nullptr;
    const char* kbase = g.k.p + hk * g.k.nb[2] + k3 * g.k.nb[3];
    const char* vbase = g.v.p + hk * g.v.nb[2] + k3 * g.v.nb[3];

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
    }
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int64_t j0 = 0; j0 < g.n_kv; j0 += kMK) {
        // This thread's mask entries (score tile t: keys j0 + 8t + 2 tig + {0, 1}; read again
        // from L1 after the product, to keep registers): skip the tile when no query of the
        // block sees any of its keys.
        auto mask_at = [&](int t, int e) {
            const int64_t iq = (e < 2) ? r0 : r1;
            const int64_t jk = j0 + 8 * t + 2 * tig + (e & 1);
            float x = -INFINITY;
            if (iq < g.n_q && jk < g.n_kv) {
                x = 0.0f;
                if (g.has_mask) {
                    x = mask_value(g, mbase + iq * g.mask.nb[1], jk);
                }
            }
            return x;
        };
        bool any = false;
#pragma unroll
        for (int t = 0; t < kMK / 8; t++) {
#pragma unroll
            for (int e = 0; e < 4; e++) any |= mask_at(t, e) != -INFINITY;
        }
        if (!__syncthreads_or(any)) continue;

        // K rows as they are, V transposed; rows past n_kv are 0. D = 128: K, then V (fewer
        // registers held).
        {
            constexpr int CPR = D / 8;  // 16-byte chunks per row
            constexpr int PER = kMK * CPR / (32 * kMWarps);
            auto load = [&](const char* base, int64_t nb1, uint4(&r)[PER]) {
#pragma unroll
                for (int i = 0; i < PER; i++) {
                    const int c = tid + i * 32 * kMWarps;
                    const int64_t jk = j0 + c / CPR;
                    r[i] = jk < g.n_kv
                               ? *reinterpret_cast<const uint4*>(base + jk * nb1 + (c % CPR) * 16)
                               : make_uint4(0u, 0u, 0u, 0u);
                }
            };
            auto store_k = [&](const uint4(&r)[PER]) {
#pragma unroll
                for (int i = 0; i < PER; i++) {
                    const int c = tid + i * 32 * kMWarps;
                    *reinterpret_cast<uint4*>(ks + (c / CPR) * LK + (c % CPR) * 8) = r[i];
                }
            };
            auto store_v = [&](const uint4(&r)[PER]) {
#pragma unroll
                for (int i = 0; i < PER; i++) {
                    const int c = tid + i * 32 * kMWarps;
                    const int key = c / CPR, d0 = (c % CPR) * 8;
                    const uint32_t w[4] = {r[i].x, r[i].y, r[i].z, r[i].w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        vt[(d0 + 2 * e) * LV + key] = static_cast<uint16_t>(w[e] & 0xffffu);
                        vt[(d0 + 2 * e + 1) * LV + key] = static_cast<uint16_t>(w[e] >> 16);
                    }
                }
            };
            uint4 kr[PER];
            load(kbase, g.k.nb[1], kr);
            if constexpr (D <= 64) {
                uint4 vr[PER];
                load(vbase, g.v.nb[1], vr);
                store_k(kr);
                store_v(vr);
            } else {
                store_k(kr);
                load(vbase, g.v.nb[1], kr);
                store_v(kr);
            }
        }
        __syncthreads();

        // Scores: 8 tiles of 8 keys, D / 16 steps each.
        float sc[kMK / 8][4];
#pragma unroll
        for (int t = 0; t < kMK / 8; t++) {
            sc[t][0] = sc[t][1] = sc[t][2] = sc[t][3] = 0.0f;
            const uint16_t* kr = ks + (8 * t + gid) * LK + 2 * tig;
#pragma unroll
            for (int s = 0; s < D / 16; s++) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + 16 * s);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 16 * s + 8);
                mma_f16(sc[t], qa[s], b0, b1);
            }
        }
        // Online softmax; rows r0 (c0, c1) and r1 (c2, c3), each spread over the 4 lanes of
        // a quad.
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int t = 0; t < kMK / 8; t++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float mk = mask_at(t, e);
                sc[t][e] = mk == -INFINITY ? -INFINITY : sc[t][e] * g.scale + mk;
            }
            mx0 = fmaxf(mx0, fmaxf(sc[t][0], sc[t][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[t][2], sc[t][3]));
        }
#pragma unroll
        for (int off = 1; off < 4; off *= 2) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float c0 = n0 == -INFINITY ? 1.0f : expf(m0 - n0);
        const float c1 = n1 == -INFINITY ? 1.0f : expf(m1 - n1);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int t = 0; t < kMK / 8; t++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float nm = e < 2 ? n0 : n1;
                const float p = sc[t][e] == -INFINITY ? 0.0f : expf(sc[t][e] - nm);
                sc[t][e] = p;
                if (e < 2) {
                    s0 += p;
                } else {
                    s1 += p;
                }
            }
        }
#pragma unroll
        for (int off = 1; off < 4; off *= 2) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, off);
            s1 += __shfl_xor_sync(0xffffffffu, s1, off);
        }
        l0 = l0 * c0 + s0;
        l1 = l1 * c1 + s1;
        m0 = n0;
        m1 = n1;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }
        // o += p v: 4 steps of 16 keys; p's A registers come from score tiles 2u and 2u + 1.
#pragma unroll
        for (int u = 0; u < kMK / 16; u++) {
            const uint32_t pa[4] = {pack_h2(sc[2 * u][0], sc[2 * u][1]),
                                    pack_h2(sc[2 * u][2], sc[2 * u][3]),
                                    pack_h2(sc[2 * u + 1][0], sc[2 * u + 1][1]),
                                    pack_h2(sc[2 * u + 1][2], sc[2 * u + 1][3])};
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const uint16_t* vr = vt + (8 * n + gid) * LV + 16 * u + 2 * tig;
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(vr);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(vr + 8);
                mma_f16(o[n], pa, b0, b1);
            }
        }
        __syncthreads();  // the next tile overwrites ks and vt
    }

    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t iq = half ? r1 : r0;
        if (iq >= g.n_q) continue;
        float* out = reinterpret_cast<float*>(g.out.p) + ((i3 * g.n_q + iq) * g.n_head + h) * g.Dv;
        const float inv = half ? i1 : i0;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int d = 8 * n + 2 * tig;
            out[d] = o[n][2 * half] * inv;
            out[d + 1] = o[n][2 * half + 1] * inv;
        }
    }
}

bool mma_enabled() {  // FERRY_CUDA_ATTN_MMA=0: F16 caches through k_attn_tiled (fp32) too
    static const bool on = !env_off("FERRY_CUDA_ATTN_MMA");
    return on;
}

template <int D>
Status launch_mma(OpContext& ctx, const AttnArgs& g, int64_t ne3) {
    constexpr size_t smem = mma_smem<D>();
    static_assert(smem <= 48 * 1024, "k_attn_mma fits the default shared memory");
    const dim3 grid(n_blocks(g.n_q, kMQ), static_cast<unsigned>(g.n_head),
                    static_cast<unsigned>(ne3));
    launch_pdl(k_attn_mma<D>, grid, dim3(32 * kMWarps), smem, ctx.stream, g);
    return launch_status("FLASH_ATTN_EXT (mma)");
}

// Decode (one query per head) over a short cache: one block per KV head takes all G query
// heads that share it, so each key and value row is read once, in three phases of one round
// trip to memory each: the scores (thread j takes key j for every head, q in shared memory),
// the softmax of each head (warp g for head g), and p v (F16/BF16 rows: thread (slice, c) takes
// 8 columns 8c.. of every slices-th value row; the slices of a warp added by shuffles, the
// warps in shared memory). k_attn with its KV split instead walks the keys one dependent load
// at a time per warp and merges the splits through global memory.
constexpr int kDThreads = 256;
constexpr int kDWarps = kDThreads / 32;
// Measured on the H200 (bench/results/cuda.md, stop 19): 1B Q4_0 tg128 (n_kv <= 128) 914-935
// t/s with this kernel against 967-971 with k_attn's split (8 blocks, three dependent phases,
// against 256 short blocks), tg1024 (n_kv up to 1024) 760 against 697. Between the two the
// crossover was not measured; 256 keys is the guess.
constexpr int64_t kDecodeMinKv = 256;
constexpr int64_t kDecodeMaxKv = 1024;
constexpr int kDecodeMaxG = 8;

size_t decode_smem(int64_t G, int64_t D, int64_t Dv, int64_t n_kv) {
    return sizeof(float) * static_cast<size_t>(G * D + G * n_kv + kDWarps * G * Dv + G);
}

__device__ __forceinline__ void unpack8(Type t, uint4 r, float (&x)[8]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const uint16_t lo = static_cast<uint16_t>(w[e] & 0xffffu);
        const uint16_t hi = static_cast<uint16_t>(w[e] >> 16);
        x[2 * e] = t == Type::F16 ? h2f(lo) : bf2f(lo);
        x[2 * e + 1] = t == Type::F16 ? h2f(hi) : bf2f(hi);
    }
}

// g.kv_vec and 2-byte K/V with D, Dv in {8, 16, 32, 64, 128} take the vector paths (the
// launcher's vec2 flag); anything else reads element by element.
__global__ void __launch_bounds__(kDThreads) k_attn_decode(AttnArgs g, bool vec2) {
    extern __shared__ float dsm[];
    const int G = static_cast<int>(g.rh);
    const int64_t D = g.D, Dv = g.Dv, n_kv = g.n_kv;
    float* qs = dsm;                         // [G][D]
    float* sc = qs + G * D;                  // [G][n_kv]: scores, then probabilities
    float* part = sc + G * n_kv;             // [kDWarps][G][Dv]
    float* inv_l = part + kDWarps * G * Dv;  // [G]
    pdl_wait();
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int64_t hk = blockIdx.x, i3 = blockIdx.y;
    const int64_t k3 = i3 / g.r3;
    for (int64_t i = tid; i < G * D; i += kDThreads) {
        const int64_t gi = i / D, d = i % D, h = hk * G + gi;
        qs[i] = reinterpret_cast<const float*>(g.q.p + h * g.q.nb[2] + i3 * g.q.nb[3])[d];
    }
    __syncthreads();
    const char* kbase = g.k.p + hk * g.k.nb[2] + k3 * g.k.nb[3];
    const char* vbase = g.v.p + hk * g.v.nb[2] + k3 * g.v.nb[3];

    // Scores.
    for (int64_t j = tid; j < n_kv; j += kDThreads) {
        float acc[kDecodeMaxG];
#pragma unroll
        for (int gi = 0; gi < kDecodeMaxG; gi++) acc[gi] = 0.0f;
        const char* krow = kbase + j * g.k.nb[1];
        if (vec2) {
            constexpr int kMaxChunks = 16;  // D <= 128 halves
            const int chunks = static_cast<int>(D / 8);
            uint4 raw[kMaxChunks];
#pragma unroll
            for (int c = 0; c < kMaxChunks; c++) {
                if (c < chunks) raw[c] = reinterpret_cast<const uint4*>(krow)[c];
            }
#pragma unroll
            for (int c = 0; c < kMaxChunks; c++) {
                if (c >= chunks) break;
                float x[8];
                unpack8(g.kt, raw[c], x);
#pragma unroll
                for (int gi = 0; gi < kDecodeMaxG; gi++) {
                    if (gi >= G) break;
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        acc[gi] = fmaf(qs[gi * D + 8 * c + e], x[e], acc[gi]);
                    }
                }
            }
        } else {
            for (int64_t d = 0; d < D; d++) {
                const float x = kv_at(g.kt, krow, d);
#pragma unroll
                for (int gi = 0; gi < kDecodeMaxG; gi++) {
                    if (gi >= G) break;
                    acc[gi] = fmaf(qs[gi * D + d], x, acc[gi]);
                }
            }
        }
#pragma unroll
        for (int gi = 0; gi < kDecodeMaxG; gi++) {
            if (gi >= G) break;
            float mk = 0.0f;
            if (g.has_mask) {
                mk = mask_value(g, mask_row(g, 0, hk * G + gi, i3), j);
            }
            sc[gi * n_kv + j] = mk == -INFINITY ? -INFINITY : acc[gi] * g.scale + mk;
        }
    }
    __syncthreads();

    // Softmax of each head.
    if (warp < G) {
        float* row = sc + warp * n_kv;
        float mx = -INFINITY;
        for (int64_t j = lane; j < n_kv; j += 32) mx = fmaxf(mx, row[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int64_t j = lane; j < n_kv; j += 32) {
            const float p = mx == -INFINITY || row[j] == -INFINITY ? 0.0f : expf(row[j] - mx);
            row[j] = p;
            sum += p;
        }
        sum = warp_sum(sum);
        if (lane == 0) inv_l[warp] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
    __syncthreads();

    // p v: each warp's partial sums into part[warp].
    if (vec2) {
        const int cpr = static_cast<int>(Dv / 8);  // divides 32
        const int c = tid % cpr, slice = tid / cpr, slices = kDThreads / cpr;
        float acc[kDecodeMaxG][8];
#pragma unroll
        for (int gi = 0; gi < kDecodeMaxG; gi++) {
#pragma unroll
            for (int e = 0; e < 8; e++) acc[gi][e] = 0.0f;
        }
#pragma unroll 4
        for (int64_t j = slice; j < n_kv; j += slices) {
            float x[8];
            unpack8(g.vt, reinterpret_cast<const uint4*>(vbase + j * g.v.nb[1])[c], x);
#pragma unroll
            for (int gi = 0; gi < kDecodeMaxG; gi++) {
                if (gi >= G) break;
                const float p = sc[gi * n_kv + j];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[gi][e] = fmaf(p, x[e], acc[gi][e]);
            }
        }
#pragma unroll
        for (int gi = 0; gi < kDecodeMaxG; gi++) {
            if (gi >= G) break;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                for (int off = cpr; off < 32; off *= 2) {
                    acc[gi][e] += __shfl_xor_sync(0xffffffffu, acc[gi][e], off);
                }
                if (lane < cpr) part[(warp * G + gi) * Dv + 8 * c + e] = acc[gi][e];
            }
        }
    } else {
        // Threads over columns, warps' worth of rows each (every warp writes its part).
        for (int64_t i = lane; i < G * Dv; i += 32) {
            const int64_t gi = i / Dv, d = i % Dv;
            float a = 0.0f;
            for (int64_t j = warp; j < n_kv; j += kDWarps) {
                a = fmaf(sc[gi * n_kv + j], kv_at(g.vt, vbase + j * g.v.nb[1], d), a);
            }
            part[(warp * G + gi) * Dv + d] = a;
        }
    }
    __syncthreads();
    for (int64_t i = tid; i < G * Dv; i += kDThreads) {
        const int64_t gi = i / Dv, d = i % Dv;
        float v = 0.0f;
        for (int w = 0; w < kDWarps; w++) v += part[(w * G + gi) * Dv + d];
        const int64_t h = hk * G + gi;
        reinterpret_cast<float*>(g.out.p)[(i3 * g.n_head + h) * Dv + d] = v * inv_l[gi];
    }
}

// Decode over a short cache (the first steps after a prompt; the whole of a tg128 run): one
// block per query head, one memory round trip. Measured first (ncu, stop 21, 1B Q4_0 at ~40
// keys): k_attn with its KV split (128 blocks) ran 8.5 us, each SM active 3.6 us of it on
// average, issuing once every 11 cycles: each warp walks its keys one dependent chain at a time
// (mask, key row, a 5-step shuffle sum, value row), and the splits merge through global memory.
// Here every load is issued at once: the value rows go to shared memory by cp.async, thread j loads
// key row j into registers, q and the mask value too; then the scores (thread j: q . k_j), one
// block max and sum, and p v from shared memory (thread (slice, c) takes 8 columns of every
// slices-th row, slices added by shuffles and across warps in shared memory). F16/BF16 K and V, D =
// Dv = 64 (<= 256 keys) or 128 (<= 128 keys): at most 32 KiB of values in shared memory. Measured
// on the H200 (bench/results/cuda.md, stop 21): 4.4 us per call in ncu against k_attn's 10.1 (its
// 32 blocks keep an SM ~2.9 us each); 1B Q4_0 tg128 1,260 t/s against 1,079 with
// FERRY_CUDA_ATTN_ROW=0, 1B F16 715 against 679.
constexpr int kRThreads = 256;
constexpr int kRWarps = kRThreads / 32;
constexpr int64_t kRMaxElems = 256 * 64;  // n_kv * D at most

size_t row_smem(int64_t D, int64_t n_kv) {
    return static_cast<size_t>(n_kv * D) * 2 + sizeof(float) * static_cast<size_t>(D + kRThreads);
}

//
// Longer caches (chunks > 1, FERRY_CUDA_ATTN_CHUNKS=0 turns it off): block (h, i3, c) takes keys
// [c * chunk, (c + 1) * chunk) the same way and writes its unnormalised (max, sum, p v) to
// g.partial; the last chunk of a head to finish (a counter per head, as k_attn's split) merges
// them. So a cache of n keys is n / chunk times the short case's blocks, each one round trip,
// instead of k_attn_decode's one block per KV head walking all n keys (8 blocks for a 1B model:
// 38 us a layer at ~512 keys, stop 23).
//
// Early form (g.early, captured graphs whose only writes into the cache before this launch
// are the listed SET_ROWS): the key and value rows are loaded before griddepcontrol.wait,
// while the products before it run (the cache's other rows were written by earlier graphs,
// which have completed), and after it only the rows this graph wrote are loaded again, from
// L2 (ld.cg / cp.async.cg: never an L1 line of the early load). Measured on the H200
// (bench/results/cuda.md, stop 29 run A, side by side): tg128 1B F16 1,119-1,125 t/s against
// 1,083-1,101, Q4_0 1,769-1,800 against 1,724-1,746; tg512 F16 1,057 against 990, Q4_0 1,677
// against 1,558; a layer's attention (q/k/v's end to its own) 3.76 us against 4.75 (Q4_0).
template <int D>
__global__ void __launch_bounds__(kRThreads) k_attn_row(AttnArgs g, int chunk) {
    extern __shared__ __align__(16) char rsm[];
    uint16_t* vs = reinterpret_cast<uint16_t*>(rsm);            // [chunk][D]
    float* qs = reinterpret_cast<float*>(rsm + chunk * D * 2);  // [D]
    float* ps = qs + D;                                         // [kRThreads]
    __shared__ float red[kRWarps], part[kRWarps][D];
    __shared__ int last;
    __shared__ int wk[kAttnEarlyMaxRows], wv[kAttnEarlyMaxRows];  // keys of this chunk rewritten
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
    uint64_t tr1 = 0, tr2 = 0;
#endif
    // Before the first read of anything an earlier kernel wrote: at once, or (early form)
    // once the cache's rows are asked for.
    auto wait_prior = [&] {
        pdl_wait();
        if (!g.early || !g.late_trigger) pdl_trigger();
#ifdef FERRY_CUDA_TRACE
        tr1 = gtime();
#endif
    };
    // The next weights (g.pf), asked for by lane 0 of every warp before anything else.
    if (g.pf.n > 0 && threadIdx.x % 32 == 0) {
        const int64_t blk =
            (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        l2_ask(g.pf, blk * kRWarps + threadIdx.x / 32,
               static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z * kRWarps);
    }
    if (!g.early) wait_prior();
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int64_t h = blockIdx.x, i3 = blockIdx.y;
    const int64_t hk = h / g.rh, k3 = i3 / g.r3;
    const int64_t j0 = static_cast<int64_t>(blockIdx.z) * chunk;
    const int n_kv = static_cast<int>(min(static_cast<int64_t>(chunk), g.n_kv - j0));
    constexpr int kC = D / 8;  // 16-byte chunks per row
    // The mask's value of key tid; with the mask read first (g.early_mask), n_vis: one past the
    // last key of the chunk it lets through, the rows past it neither loaded nor summed. A
    // session's attended length is padded (256 keys on a GPU): stop 55 (H100, 1B Q4_0,
    // tg128) this kernel took 8.63 us a call at 256 keys against 7.68 at 144, loading rows
    // past the position.
    float mk = 0.0f;
    int n_vis = n_kv;
    if (g.early_mask) {
        __shared__ int s_last[kRWarps];
        mk = tid < n_kv ? mask_value(g, mask_row(g, 0, h, i3), j0 + tid) : -INFINITY;
        const int last = __reduce_max_sync(0xffffffffu, mk != -INFINITY ? tid : -1);
        if (lane == 0) s_last[warp] = last;
        __syncthreads();
        int m = -1;
#pragma unroll
        for (int w = 0; w < kRWarps; w++) m = max(m, s_last[w]);
        n_vis = m + 1;
    }
    const char* kbase = g.k.p + hk * g.k.nb[2] + k3 * g.k.nb[3] + j0 * g.k.nb[1];
    const char* vbase = g.v.p + hk * g.v.nb[2] + k3 * g.v.nb[3] + j0 * g.v.nb[1];
    // Every load at once: values into shared memory, key row tid, q, the mask value.
    for (int c = tid; c < n_vis * kC; c += kRThreads) {
        const int j = c / kC, e = c % kC;
        cp_async16(vs + j * D + 8 * e, vbase + j * g.v.nb[1] + 16 * e);
    }
    uint4 kr[kC];
    const bool has_key = tid < n_vis;
    if (has_key) {
        const uint4* krow = reinterpret_cast<const uint4*>(kbase + tid * g.k.nb[1]);
#pragma unroll
        for (int e = 0; e < kC; e++) kr[e] = krow[e];
    }
    // q's element tid and the mask's value of key tid, loaded after the wait (with the rows'
    // loads of the early form).
    float qv = 0.0f;
    auto late_loads = [&] {
        if (tid < D) {
            qv = reinterpret_cast<const float*>(g.q.p + h * g.q.nb[2] + i3 * g.q.nb[3])[tid];
        }
        if (g.has_mask && has_key && !g.early_mask) {
            mk = mask_value(g, mask_row(g, 0, h, i3), j0 + tid);
        }
    };
    if (g.early) {
        // This chunk's keys that the step wrote (-1: another chunk's, or out of range: the
        // SET_ROWS reported it and wrote nothing), and their rows again. Measured on the H200
        // (bench/results/cuda.md, stop 29 run B): reading the indices before the wait as well
        // (checked after it), for one round trip after the wait instead of two, gained nothing;
        // stop 42 (H100): with wo's copies issued during the attention, its loads after the
        // wait queue behind them on the SM, so the indices come before it when they are the
        // graph's inputs (g.early_idx) and the loads after it are issued before wo may launch.
        auto key_of = [&](const AttnRowsWritten& w, int i) {
            const int64_t j = static_cast<int64_t>(__ldcg(w.idx + i)) - w.j0 - j0;
            return j >= 0 && j < n_vis ? static_cast<int>(j) : -1;
        };
        auto keys = [&] {
            if (tid < g.early_k.n) wk[tid] = key_of(g.early_k, tid);
            if (tid < g.early_v.n) wv[tid] = key_of(g.early_v, tid);
        };
        if (g.early_idx) keys();
        wait_prior();
        if (!g.early_idx) keys();
        __syncthreads();
        for (int i = 0; i < g.early_k.n; i++) {
            if (wk[i] != tid) continue;
            const uint4* krow = reinterpret_cast<const uint4*>(kbase + tid * g.k.nb[1]);
#pragma unroll
            for (int e = 0; e < kC; e++) kr[e] = __ldcg(krow + e);
        }
        late_loads();
        // A value row's 16-byte pieces go again through the threads that copied them first,
        // once their first copies have landed (two copies into one place are not ordered).
        cp_async_wait_all();
        for (int i = 0; i < g.early_v.n; i++) {
            if (wv[i] < 0) continue;
            const int first = wv[i] * kC;
            const int e = ((tid - first) % kRThreads + kRThreads) % kRThreads;
            if (e < kC) cp_async16(vs + wv[i] * D + 8 * e, vbase + wv[i] * g.v.nb[1] + 16 * e);
        }
        if (g.late_trigger) pdl_trigger();
    } else {
        late_loads();
    }
    if (tid < D) qs[tid] = qv;
    __syncthreads();  // q
    float s = -INFINITY;
    if (has_key && mk != -INFINITY) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < kC; e++) {
            float x[8];
            unpack8(g.kt, kr[e], x);
            const float4 q0 = reinterpret_cast<const float4*>(qs)[2 * e];
            const float4 q1 = reinterpret_cast<const float4*>(qs)[2 * e + 1];
            acc = fmaf(q0.x, x[0], acc);
            acc = fmaf(q0.y, x[1], acc);
            acc = fmaf(q0.z, x[2], acc);
            acc = fmaf(q0.w, x[3], acc);
            acc = fmaf(q1.x, x[4], acc);
            acc = fmaf(q1.y, x[5], acc);
            acc = fmaf(q1.z, x[6], acc);
            acc = fmaf(q1.w, x[7], acc);
        }
        s = acc * g.scale + mk;
    }
    // Softmax over the block: max, then the sum of exp.
    float m = warp_max(s);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = lane < kRWarps ? red[lane] : -INFINITY;
    m = warp_max(m);
    const float p = s == -INFINITY ? 0.0f : expf(s - m);
    ps[tid] = p;
    float l = warp_sum(p);
    __syncthreads();  // red read; ps written
    if (lane == 0) red[warp] = l;
    cp_async_wait_all();
    __syncthreads();  // red, and every thread's value rows
#ifdef FERRY_CUDA_TRACE
    tr2 = gtime();
#endif
    l = lane < kRWarps ? red[lane] : 0.0f;
    l = warp_sum(l);
    // p v: thread (slice, c) sums columns 8c..8c+7 over rows slice, slice + slices, ...
    const int c = tid % kC, slice = tid / kC;
    constexpr int kSlices = kRThreads / kC;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
    for (int j = slice; j < n_vis; j += kSlices) {
        float x[8];
        unpack8(g.vt, *reinterpret_cast<const uint4*>(vs + j * D + 8 * c), x);
        const float pj = ps[j];
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = fmaf(pj, x[e], acc[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) {
        for (int off = kC; off < 32; off *= 2) {
            acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], off);
        }
    }
    if (lane < kC) {
#pragma unroll
        for (int e = 0; e < 8; e++) part[warp][8 * lane + e] = acc[e];
    }
    __syncthreads();
    float o = 0.0f;
    if (tid < D) {
#pragma unroll
        for (int w = 0; w < kRWarps; w++) o += part[w][tid];
    }
    float* const out = reinterpret_cast<float*>(g.out.p) + (i3 * g.n_head + h) * D;
    if (gridDim.z == 1) {
        if (tid < D) out[tid] = o * (l > 0.0f ? 1.0f / l : 0.0f);
#ifdef FERRY_CUDA_TRACE
        trace_block(g.trace_id, g.n_kv, 32u | (g.early ? 64u : 0u), tr0, tr1, tr2, 0, 0);
#endif
        return;
    }
    // This chunk's (max, sum, unnormalised p v); the last chunk of the head merges them all.
    const int64_t r = i3 * g.n_head + h, rows = g.n_head * gridDim.y;
    float* const mine = g.partial + (static_cast<int64_t>(blockIdx.z) * rows + r) * (D + 2);
    if (tid < D) mine[2 + tid] = o;
    if (tid == 0) {
        mine[0] = m;
        mine[1] = l;
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&g.counters[r], 1) == static_cast<int>(gridDim.z) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid < D) {
        float M = -INFINITY;
        for (unsigned c = 0; c < gridDim.z; c++) {
            M = fmaxf(M, __ldcg(g.partial + (static_cast<int64_t>(c) * rows + r) * (D + 2)));
        }
        float L = 0.0f, acc_o = 0.0f;
        if (M != -INFINITY) {
            for (unsigned c = 0; c < gridDim.z; c++) {
                const float* q = g.partial + (static_cast<int64_t>(c) * rows + r) * (D + 2);
                const float qm = __ldcg(q);
                if (qm == -INFINITY) continue;
                const float f = expf(qm - M);
                L += __ldcg(q + 1) * f;
                acc_o += __ldcg(q + 2 + tid) * f;
            }
        }
        out[tid] = acc_o * (L > 0.0f ? 1.0f / L : 0.0f);
    }
    if (tid == 0) g.counters[r] = 0;  // ready for the next launch (and graph replay)
}

bool row_enabled() {  // FERRY_CUDA_ATTN_ROW=0: short caches through k_attn and its KV split
    static const bool on = !env_off("FERRY_CUDA_ATTN_ROW");
    return on;
}

// The keys one k_attn_row block takes for head size D, and how many blocks (chunks) a head of
// this decode node needs on that path: 0 when its shapes and types do not fit k_attn_row (the
// 16-byte alignment of the rows is checked at launch), or when a cache over one chunk would need
// more chunks than the launch allows (or ctx.attn_chunks is off).
int64_t row_chunk(int64_t D) {
    return kRMaxElems / D;
}
int64_t row_chunks(const OpContext& ctx, const Tensor* node) {
    const Tensor* q = node->src[0];
    const Tensor* k = node->src[1];
    const Tensor* v = node->src[2];
    const int64_t D = q->ne[0], n_kv = k->ne[1];
    const bool fits = q->ne[1] == 1 && n_kv >= 1 && D == v->ne[0] && (D == 64 || D == 128) &&
                      k->ne[0] == D && k->type != Type::F32 && v->type != Type::F32 &&
                      k->ne[2] > 0 && q->ne[2] % k->ne[2] == 0 && q->ne[2] <= 65535 &&
                      q->ne[3] <= 65535 && row_enabled();
    if (!fits) return 0;
    const int64_t chunks = (n_kv + row_chunk(D) - 1) / row_chunk(D);
    if (chunks == 1) return 1;
    if (!ctx.attn_chunks || chunks > 65535 || q->ne[2] * q->ne[3] > kMaxCounters) return 0;
    return chunks;
}

bool decode_enabled() {  // FERRY_CUDA_ATTN_DECODE=0: decode through k_attn and its KV split
    static const bool on = !env_off("FERRY_CUDA_ATTN_DECODE");
    return on;
}

// k_attn_tiled may load rows of t in 16-byte chunks: F32/F16/BF16, the first n elements whole
// chunks, every row (any head, any batch) starting 16-byte aligned.
bool vec_rows(const Tensor* t, int64_t n) {
    if (t->type != Type::F32 && t->type != Type::F16 && t->type != Type::BF16) return false;
    const int64_t es = static_cast<int64_t>(type_size(t->type));
    if (t->nb[0] != static_cast<size_t>(es) || (n * es) % 16 != 0) return false;
    if (reinterpret_cast<uintptr_t>(device_ptr(t)) % 16 != 0) return false;
    for (int d = 1; d < 4; d++) {
        if (t->ne[d] > 1 && t->nb[d] % 16 != 0) return false;
    }
    return true;
}

bool vec_off() {  // FERRY_CUDA_ATTN_VEC=0: the tiled kernel loads element by element
    static const bool off = env_off("FERRY_CUDA_ATTN_VEC");
    return off;
}

template <int D>
Status launch_tiled(OpContext& ctx, const AttnArgs& g, int64_t ne3) {
    constexpr size_t smem = tiled_smem<D>();
    static const cudaError_t attr = cudaFuncSetAttribute(
        k_attn_tiled<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (attr != cudaSuccess) {
        return Status::errorf("CUDA: FLASH_ATTN_EXT: %zu bytes of shared memory: %s", smem,
                              cudaGetErrorString(attr));
    }
    const dim3 grid(n_blocks(g.n_q, kTQ), static_cast<unsigned>(g.n_head),
                    static_cast<unsigned>(ne3));
    launch_pdl(k_attn_tiled<D>, grid, dim3(kTThreads), smem, ctx.stream, g);
    return launch_status("FLASH_ATTN_EXT (tiled)");
}

int choose_split(const Tensor* node, int n_sm) {
    const Tensor* q = node->src[0];
    const Tensor* k = node->src[1];
    const int64_t rows = q->ne[1] * q->ne[2] * q->ne[3];
    const int64_t n_kv = k->ne[1];
    const int64_t want = 2 * static_cast<int64_t>(n_sm);
    if (rows >= want || n_kv < 16) return 1;
    int64_t s = (want + rows - 1) / rows;
    // At least 8 keys per split: a split's 4 warps then walk 2+ keys each, and the serial
    // chain of dependent loads per warp stays short (decode is latency-bound, not bandwidth).
    s = std::min<int64_t>(s, n_kv / 8);
    s = std::min<int64_t>(s, 32);
    if (rows > kMaxCounters) return 1;
    return static_cast<int>(std::max<int64_t>(s, 1));
}

std::atomic<uint64_t> g_early_launches{0}, g_early_idx_launches{0}, g_l2_ask_launches{0},
    g_early_mask_launches{0};

}  // namespace

uint64_t early_attention_launches() {
    return g_early_launches.load(std::memory_order_relaxed);
}
uint64_t early_index_launches() {
    return g_early_idx_launches.load(std::memory_order_relaxed);
}
uint64_t early_mask_launches() {
    return g_early_mask_launches.load(std::memory_order_relaxed);
}
uint64_t l2_ask_launches() {
    return g_l2_ask_launches.load(std::memory_order_relaxed);
}

size_t attn_scratch_size(const OpContext& ctx, const Tensor* node) {
    const Tensor* q = node->src[0];
    const int64_t rows = q->ne[1] * q->ne[2] * q->ne[3];
    const size_t per =
        static_cast<size_t>(rows) * static_cast<size_t>(node->src[2]->ne[0] + 2) * sizeof(float);
    // k_attn's split, or k_attn_row's chunks (either may run: the rows' alignment decides).
    const int s = choose_split(node, ctx.n_sm);
    const int64_t c = row_chunks(ctx, node);
    return std::max(s > 1 ? static_cast<size_t>(s) * per : 0,
                    c > 1 ? static_cast<size_t>(c) * per : 0);
}

Status op_flash_attn_ext(OpContext& ctx, const Tensor* dst) {
    const Tensor* q = dst->src[0];
    const Tensor* k = dst->src[1];
    const Tensor* v = dst->src[2];
    const Tensor* mask = dst->src[3];
    AttnArgs g;
    g.q = tv(q);
    g.k = tv(k);
    g.v = tv(v);
    g.out = tv(dst);
    g.mask = mask ? tv(mask) : g.q;
    g.kt = k->type;
    g.vt = v->type;
    g.has_mask = mask != nullptr;
    g.mask_f16 = mask && mask->type == Type::F16;
    g.scale = dst->param_f(0);
    g.n_head = q->ne[2];
    g.n_q = q->ne[1];
    g.n_kv = k->ne[1];
    g.D = q->ne[0];
    g.Dv = v->ne[0];
    g.rh = q->ne[2] / k->ne[2];
    g.r3 = q->ne[3] / k->ne[3];
    g.n_split = choose_split(dst, ctx.n_sm);
    g.partial = reinterpret_cast<float*>(ctx.scratch.ptr);
    g.counters = ctx.counters;
    const int64_t rows = q->ne[1] * q->ne[2] * q->ne[3];
    if (rows == 0) return Status::ok();
#ifdef FERRY_CUDA_TRACE
    g.trace_id = trace_next_id();
#endif
    g.early = g.early_idx = g.late_trigger = g.early_mask = false;
    const int64_t dmax = std::max(g.D, g.Dv);
    g.kv_vec = vec_rows(k, g.D) && vec_rows(v, g.Dv) && !vec_off();
    if (g.n_q >= kTiledMinQueries && q->ne[2] <= 65535 && q->ne[3] <= 65535 && tiled_enabled()) {
        // F16 keys and values of one head size (64 or 128), 16-byte rows: tensor cores.
        if (g.kt == Type::F16 && g.vt == Type::F16 && g.kv_vec && g.D == g.Dv && mma_enabled()) {
            if (g.D == 64) return launch_mma<64>(ctx, g, q->ne[3]);
            if (g.D == 128) return launch_mma<128>(ctx, g, q->ne[3]);
        }
        if (dmax <= 64) return launch_tiled<64>(ctx, g, q->ne[3]);
        if (dmax <= 128) return launch_tiled<128>(ctx, g, q->ne[3]);
    }
    if (const int64_t chunks = row_chunks(ctx, dst); chunks > 0 && g.kv_vec) {
        const int chunk = static_cast<int>(std::min(g.n_kv, row_chunk(g.D)));
        const size_t smem = row_smem(g.D, chunk);
        if (const AttnEarly* e = ctx.attn_early;
            e && e->k.n <= kAttnEarlyMaxRows && e->v.n <= kAttnEarlyMaxRows) {
            g.early = true;
            g.early_k = e->k;
            g.early_v = e->v;
            g.early_idx = e->idx_ready && ctx.attn_early_idx;
            g.late_trigger = ctx.attn_late_trigger;
            g.early_mask = e->mask_ready && g.has_mask && ctx.attn_early_mask;
            g.pf = e->next;
            g_early_launches.fetch_add(1, std::memory_order_relaxed);
            if (g.early_idx) g_early_idx_launches.fetch_add(1, std::memory_order_relaxed);
            if (g.early_mask) g_early_mask_launches.fetch_add(1, std::memory_order_relaxed);
            if (g.pf.n > 0) g_l2_ask_launches.fetch_add(1, std::memory_order_relaxed);
        }
        const dim3 grid(static_cast<unsigned>(q->ne[2]), static_cast<unsigned>(q->ne[3]),
                        static_cast<unsigned>(chunks));
        if (g.D == 64) {
            launch_pdl(k_attn_row<64>, grid, dim3(kRThreads), smem, ctx.stream, g, chunk);
        } else {
            launch_pdl(k_attn_row<128>, grid, dim3(kRThreads), smem, ctx.stream, g, chunk);
        }
        return launch_status("FLASH_ATTN_EXT (row)");
    }
    if (g.n_q == 1 && g.n_kv >= kDecodeMinKv && g.n_kv <= kDecodeMaxKv && g.rh <= kDecodeMaxG &&
        g.n_head == g.rh * k->ne[2] && dmax <= 128 && k->ne[2] <= 65535 && q->ne[3] <= 65535 &&
        decode_enabled()) {
        const size_t smem = decode_smem(g.rh, g.D, g.Dv, g.n_kv);
        if (smem <= 48 * 1024) {
            auto pow2_upto128 = [](int64_t n) { return n >= 8 && n <= 128 && (n & (n - 1)) == 0; };
            const bool vec2 = g.kv_vec && g.kt != Type::F32 && g.vt != Type::F32 &&
                              pow2_upto128(g.D) && pow2_upto128(g.Dv);
            launch_pdl(k_attn_decode,
                       dim3(static_cast<unsigned>(k->ne[2]), static_cast<unsigned>(q->ne[3])),
                       dim3(kDThreads), smem, ctx.stream, g, vec2);
            return launch_status("FLASH_ATTN_EXT (decode)");
        }
    }
    const dim3 grid(n_blocks(rows, 1), static_cast<unsigned>(g.n_split));
    if (dmax <= 32) {
        launch_pdl(k_attn<1>, grid, dim3(32 * kWarps), 0, ctx.stream, g);
    } else if (dmax <= 64) {
        launch_pdl(k_attn<2>, grid, dim3(32 * kWarps), 0, ctx.stream, g);
    } else if (dmax <= 128) {
        launch_pdl(k_attn<4>, grid, dim3(32 * kWarps), 0, ctx.stream, g);
    } else if (dmax <= 256) {
        launch_pdl(k_attn<8>, grid, dim3(32 * kWarps), 0, ctx.stream, g);
    } else {
        return Status::errorf("CUDA: FLASH_ATTN_EXT head size %lld over 256",
                              static_cast<long long>(dmax));
    }
    return launch_status("FLASH_ATTN_EXT");
}

}  // namespace ferry::cuda
