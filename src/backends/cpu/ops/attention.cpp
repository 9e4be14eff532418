// FLASH_ATTN_EXT: out = softmax(q k^T * scale + mask) v, one query row and head at a time,
// with an online softmax over the KV positions (no n_q x n_kv score matrix).
//
// Shapes: q [D, n_q, n_head, ne3], k [D, n_kv, n_head_kv, ne3k], v [Dv, n_kv, n_head_kv, ne3k],
// mask [n_kv, >= n_q, m2, m3] (broadcast over dims 2-3 by modulo), out [Dv, n_head, n_q, ne3].
// Grouped-query attention: head h reads KV head h / (n_head / n_head_kv); batch i3 reads KV
// batch i3 / (ne3 / ne3k).
//
// Query rows (one query position of one head) that share a KV head are processed together in
// blocks of up to kLanes, one row per vector lane: KV positions are walked in tiles of kTile; a
// tile whose mask hides it from every row of the block is skipped without reading K or V;
// otherwise its K and V rows are converted to float once for the whole block, and each score
// vector (one position, every row) is a chain of fused multiply-adds over the head dimension
// with q transposed to [D][lanes]. Masked positions get -inf whatever K holds. The online
// softmax (running maximum, one rescale when it grows, weights exp(score - max)) runs on all
// lanes at once; each row then accumulates its weighted V rows (float, Dv lanes), skipping
// zero weights; the softmax denominator is double. A row's arithmetic is the same in every
// lane and depends only on its own data and the fixed tile boundaries, never on the blocking
// or the thread count, so results are bit-identical for any number of threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

constexpr int64_t kTile = 64;
constexpr int64_t kLanes = 16;  // rows per block

// Per-thread scratch (floats): q transposed [D][kLanes], K tile [kTile][D], V tile [kTile][Dv],
// mask and scores [kTile][kLanes], accumulators [kLanes][Dv].
struct Scratch {
    float* qt;
    float* kf;
    float* vf;
    float* sc;
    float* acc;
};
size_t attn_scratch_floats(int64_t d, int64_t dv) {
    const size_t pad = 16;  // each part starts on a 64-byte boundary
    return static_cast<size_t>(d * kLanes + kTile * d + kTile * dv + kTile * kLanes + kLanes * dv) +
           5 * pad;
}
size_t attn_scratch_bytes(int64_t d, int64_t dv) {
    return attn_scratch_floats(d, dv) * sizeof(float) + 64;
}
Scratch carve(void* base, int64_t d, int64_t dv) {
    auto align = [](float* p) {
        const uintptr_t u = reinterpret_cast<uintptr_t>(p);
        return reinterpret_cast<float*>((u + 63) / 64 * 64);
    };
    Scratch s;
    s.qt = align(static_cast<float*>(base));
    s.kf = align(s.qt + d * kLanes);
    s.vf = align(s.kf + kTile * d);
    s.sc = align(s.vf + kTile * dv);
    s.acc = align(s.sc + kTile * kLanes);
    return s;
}

// n rows of type t (row stride nb bytes) to float [n][ne].
void rows_to_f32(Type t, const uint8_t* src, size_t nb, int64_t n, int64_t ne, float* dst) {
    for (int64_t j = 0; j < n; j++) {
        const uint8_t* r = src + static_cast<size_t>(j) * nb;
        kern::row_to_f32(t, r, dst + j * ne, ne);
    }
}

// sc[j][lane] = (mask[j][lane] == -inf) ? -inf : dot(q[lane], k[j]) * scale + mask[j][lane],
// the dot product a chain of fused multiply-adds over i = 0..d-1 in order. Returns the lane
// maxima over the tile in tmax.
void tile_scores(const float* qt, const float* kf, int64_t d, int64_t len, float scale, float* sc,
                 float* tmax) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#if defined(__AVX512F__)
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512 vninf = _mm512_set1_ps(kNegInf);
    __m512 vmax = vninf;
    int64_t j = 0;
    auto finish = [&](__m512 acc, int64_t jj) {
        const __m512 m = _mm512_load_ps(sc + jj * kLanes);
        const __mmask16 hidden = _mm512_cmp_ps_mask(m, vninf, _CMP_EQ_OQ);
        __m512 v = _mm512_fmadd_ps(acc, vscale, m);
        v = _mm512_mask_mov_ps(v, hidden, vninf);
        _mm512_store_ps(sc + jj * kLanes, v);
        vmax = _mm512_maskz_max_ps(0xffff, v, vmax);  // (masked: GCC 12 warning)
    };
    for (; j + 4 <= len; j += 4) {
        const float* k0 = kf + j * d;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < d; i++) {
            const __m512 q = _mm512_load_ps(qt + i * kLanes);
            a0 = _mm512_fmadd_ps(q, _mm512_set1_ps(k0[i]), a0);
            a1 = _mm512_fmadd_ps(q, _mm512_set1_ps(k0[d + i]), a1);
            a2 = _mm512_fmadd_ps(q, _mm512_set1_ps(k0[2 * d + i]), a2);
            a3 = _mm512_fmadd_ps(q, _mm512_set1_ps(k0[3 * d + i]), a3);
        }
        finish(a0, j);
        finish(a1, j + 1);
        finish(a2, j + 2);
        finish(a3, j + 3);
    }
    for (; j < len; j++) {
        const float* k0 = kf + j * d;
        __m512 a0 = _mm512_setzero_ps();
        for (int64_t i = 0; i < d; i++) {
            a0 = _mm512_fmadd_ps(_mm512_load_ps(qt + i * kLanes), _mm512_set1_ps(k0[i]), a0);
        }
        finish(a0, j);
    }
    _mm512_store_ps(tmax, vmax);
#elif defined(__AVX2__) && defined(__FMA__)
    // Each lane group of 16 as two 256-bit halves; per lane the same chain of fused
    // multiply-adds as the other paths.
    static_assert(kLanes == 16);
    const __m256 vscale = _mm256_set1_ps(scale);
    const __m256 vninf = _mm256_set1_ps(kNegInf);
    __m256 vmax[2] = {vninf, vninf};
    int64_t j = 0;
    auto finish = [&](__m256 acc, int64_t jj, int h) {
        float* sp = sc + jj * kLanes + 8 * h;
        const __m256 m = _mm256_load_ps(sp);
        const __m256 hidden = _mm256_cmp_ps(m, vninf, _CMP_EQ_OQ);
        const __m256 v = _mm256_blendv_ps(_mm256_fmadd_ps(acc, vscale, m), vninf, hidden);
        _mm256_store_ps(sp, v);
        vmax[h] = _mm256_max_ps(v, vmax[h]);
    };
    for (; j + 4 <= len; j += 4) {
        const float* k0 = kf + j * d;
        for (int h = 0; h < 2; h++) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t i = 0; i < d; i++) {
                const __m256 q = _mm256_load_ps(qt + i * kLanes + 8 * h);
                a0 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k0 + i), a0);
                a1 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k0 + d + i), a1);
                a2 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k0 + 2 * d + i), a2);
                a3 = _mm256_fmadd_ps(q, _mm256_broadcast_ss(k0 + 3 * d + i), a3);
            }
            finish(a0, j, h);
            finish(a1, j + 1, h);
            finish(a2, j + 2, h);
            finish(a3, j + 3, h);
        }
    }
    for (; j < len; j++) {
        const float* k0 = kf + j * d;
        for (int h = 0; h < 2; h++) {
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t i = 0; i < d; i++) {
                a0 = _mm256_fmadd_ps(_mm256_load_ps(qt + i * kLanes + 8 * h),
                                     _mm256_broadcast_ss(k0 + i), a0);
            }
            finish(a0, j, h);
        }
    }
    _mm256_store_ps(tmax, vmax[0]);
    _mm256_store_ps(tmax + 8, vmax[1]);
#else
    for (int64_t l = 0; l < kLanes; l++) tmax[l] = kNegInf;
    for (int64_t j = 0; j < len; j++) {
        float a[kLanes] = {};
        const float* k0 = kf + j * d;
        for (int64_t i = 0; i < d; i++) {
            for (int64_t l = 0; l < kLanes; l++) a[l] = std::fma(qt[i * kLanes + l], k0[i], a[l]);
        }
        float* s = sc + j * kLanes;
        for (int64_t l = 0; l < kLanes; l++) {
            s[l] = s[l] == kNegInf ? kNegInf : std::fma(a[l], scale, s[l]);
            tmax[l] = s[l] > tmax[l] ? s[l] : tmax[l];
        }
    }
#endif
}

}  // namespace

void op_flash_attn_ext(const ComputeParams& p, Tensor* dst) {
    const Tensor* q = dst->src[0];
    const Tensor* k = dst->src[1];
    const Tensor* v = dst->src[2];
    const Tensor* mask = dst->src[3];
    const float scale = dst->param_f(0);

    const int64_t d = q->ne[0], n_q = q->ne[1], n_head = q->ne[2], ne3 = q->ne[3];
    const int64_t n_kv = k->ne[1], n_head_kv = k->ne[2], ne3k = k->ne[3];
    const int64_t dv = v->ne[0];
    const int64_t group = n_head / n_head_kv;
    const int64_t batch_group = ne3 / ne3k;
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();

    // Rows of one KV head (segment): n_q * group, ordered (iq, head-in-group). Block size: as
    // large as kLanes allows, smaller when that leaves threads idle.
    const int64_t seg_rows = n_q * group;
    const int64_t n_seg = ne3 * n_head_kv;
    const int64_t total = seg_rows * n_seg;
    if (total == 0) return;
    int64_t blk = (total + p.nth - 1) / p.nth;
    blk = std::max<int64_t>(1, std::min<int64_t>(blk, std::min(kLanes, seg_rows)));
    const int64_t blocks_per_seg = (seg_rows + blk - 1) / blk;
    const bool lanes_exp = seg_rows >= kLanes / 2;

    int64_t b0, b1;
    split_rows(n_seg * blocks_per_seg, p.ith, p.nth, &b0, &b1);
    if (b0 >= b1) return;
    const Scratch w = carve(kern::thread_scratch(p, attn_scratch_bytes(d, dv)), d, dv);

    const uint8_t* mrow[kLanes];
    float* out[kLanes];
    alignas(64) float rmax[kLanes];
    alignas(64) float tmax[kLanes];
    alignas(64) float mexp[kLanes];
    double rsum[kLanes];
    float mtile[kTile];

    for (int64_t b = b0; b < b1; b++) {
        const int64_t seg = b / blocks_per_seg;
        const int64_t hk = seg % n_head_kv, i3 = seg / n_head_kv;
        const int64_t i3k = i3 / batch_group;
        const int64_t first = (b % blocks_per_seg) * blk;
        const int64_t nr = std::min(blk, seg_rows - first);
        std::memset(w.qt, 0, static_cast<size_t>(d * kLanes) * sizeof(float));
        for (int64_t r = 0; r < nr; r++) {
            const int64_t sr = first + r;
            const int64_t iq = sr / group, h = hk * group + sr % group;
            const float* qr = reinterpret_cast<const float*>(row(q, iq, h, i3));
            for (int64_t i = 0; i < d; i++) w.qt[i * kLanes + r] = qr[i];
            mrow[r] = mask ? row(mask, iq, h % mask->ne[2], i3 % mask->ne[3]) : nullptr;
            out[r] = reinterpret_cast<float*>(row(dst, h, iq, i3));
            std::memset(w.acc + r * dv, 0, static_cast<size_t>(dv) * sizeof(float));
        }
        for (int64_t r = 0; r < kLanes; r++) {
            rmax[r] = kNegInf;
            rsum[r] = 0.0;
        }
        const uint8_t* kbase = row(k, 0, hk, i3k);
        const uint8_t* vbase = row(v, 0, hk, i3k);

        for (int64_t t0 = 0; t0 < n_kv; t0 += kTile) {
            const int64_t len = std::min(kTile, n_kv - t0);
            // The mask, transposed to [position][lane]; unused lanes hidden.
            for (int64_t i = 0; i < len * kLanes; i++) w.sc[i] = kNegInf;
            bool any = false;
            for (int64_t r = 0; r < nr; r++) {
                const float* mt = mtile;
                if (!mrow[r]) {
                    for (int64_t j = 0; j < len; j++) mtile[j] = 0.0f;
                } else if (mask->type == Type::F16) {
                    kern::f16_to_f32_row(reinterpret_cast<const fp16_t*>(mrow[r]) + t0, mtile, len);
                } else {
                    mt = reinterpret_cast<const float*>(mrow[r]) + t0;
                }
                bool vis = false;
                for (int64_t j = 0; j < len; j++) {
                    w.sc[j * kLanes + r] = mt[j];
                    vis |= mt[j] != kNegInf;
                }
                any |= vis;
            }
            if (!any) continue;  // the mask hides this tile from every row of the block
            rows_to_f32(k->type, kbase + static_cast<size_t>(t0) * k->nb[1], k->nb[1], len, d,
                        w.kf);
            rows_to_f32(v->type, vbase + static_cast<size_t>(t0) * v->nb[1], v->nb[1], len, dv,
                        w.vf);
            tile_scores(w.qt, w.kf, d, len, scale, w.sc, tmax);
            for (int64_t r = 0; r < nr; r++) {
                if (tmax[r] == kNegInf) {
                    mexp[r] = std::numeric_limits<float>::infinity();  // weights exp(-inf) = 0
                    continue;
                }
                if (tmax[r] > rmax[r]) {
                    const float f = kern::exp_f32(rmax[r] - tmax[r]);  // 0 on the first tile
                    float* a = w.acc + r * dv;
                    for (int64_t i = 0; i < dv; i++) a[i] *= f;
                    rsum[r] *= static_cast<double>(f);
                    rmax[r] = tmax[r];
                }
                mexp[r] = rmax[r];
            }
            for (int64_t r = nr; r < kLanes; r++) mexp[r] = std::numeric_limits<float>::infinity();
            // Weights exp(score - max): across the lanes when a segment fills them (prefill),
            // else per row (decode: a few rows). Which one depends only on the shapes, never
            // on the blocking, so every row gets the same bits for any thread count.
            if (lanes_exp) {
                for (int64_t j = 0; j < len; j++) {
                    float* s = w.sc + j * kLanes;
                    for (int64_t l = 0; l < kLanes; l++) s[l] = kern::exp_f32(s[l] - mexp[l]);
                }
            }
            for (int64_t r = 0; r < nr; r++) {
                if (tmax[r] == kNegInf) continue;  // nothing visible in this tile
                float* wr = mtile;
                if (lanes_exp) {
                    for (int64_t j = 0; j < len; j++) wr[j] = w.sc[j * kLanes + r];
                } else {
                    const float m = mexp[r];
                    for (int64_t j = 0; j < len; j++) wr[j] = w.sc[j * kLanes + r] - m;
                    for (int64_t j = 0; j < len; j++) wr[j] = kern::exp_f32(wr[j]);
                }
                // V accumulation over the positions with a nonzero weight, four at a time
                // (bit-identical to one at a time)
                double tsum = 0.0;
                float* a = w.acc + r * dv;
                float wq[4];
                const float* vq[4];
                int nq = 0;
                for (int64_t j = 0; j < len; j++) {
                    if (wr[j] == 0.0f) continue;
                    tsum += static_cast<double>(wr[j]);
                    wq[nq] = wr[j];
                    vq[nq] = w.vf + j * dv;
                    if (++nq == 4) {
                        kern::axpy4_f32(a, wq, vq, dv);
                        nq = 0;
                    }
                }
                for (int i = 0; i < nq; i++) kern::axpy_f32(a, wq[i], vq[i], dv);
                rsum[r] += tsum;
            }
        }

        for (int64_t r = 0; r < nr; r++) {
            if (rsum[r] > 0.0) {
                const float inv = static_cast<float>(1.0 / rsum[r]);
                const float* a = w.acc + r * dv;
                for (int64_t i = 0; i < dv; i++) out[r][i] = a[i] * inv;
            } else {
                std::memset(out[r], 0, static_cast<size_t>(dv) * sizeof(float));
            }
        }
    }
}

size_t flash_attn_work_size(const Tensor* node, int n_threads) {
    return kern::scratch_size(attn_scratch_bytes(node->src[0]->ne[0], node->src[2]->ne[0]),
                              n_threads);
}

}  // namespace ferry::cpu
