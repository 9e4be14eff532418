// FLASH_ATTN_EXT: out = softmax(q k^T * scale + mask) v, one query row and head at a time,
// with an online softmax over the KV positions (no n_q x n_kv score matrix).
//
// Shapes: q [D, n_q, n_head, ne3], k [D, n_kv, n_head_kv, ne3k], v [Dv, n_kv, n_head_kv, ne3k],
// mask [n_kv, >= n_q, m2, m3] (broadcast over dims 2-3 by modulo), out [Dv, n_head, n_q, ne3].
// Grouped-query attention: head h reads KV head h / (n_head / n_head_kv); batch i3 reads KV
// batch i3 / (ne3 / ne3k).
//
// Query rows (one query position of one head) that share a KV head are processed together in
// blocks of up to kMaxRows: KV positions are walked in tiles of kTile, and every row of the
// block consumes a tile while its K/V rows are in L1, so each K/V row is read from memory once
// per block rather than once per head. For each row and tile: scores first (masked positions
// skip the dot product), one rescale of the accumulator if the running maximum grew, the
// weights exp(score - max) in one vectorized pass, then the V accumulation. The accumulator is
// float (Dv lanes); the softmax denominator is double. A row's arithmetic depends only on its
// own data and the fixed tile boundaries, never on the blocking or the thread count, so results
// are bit-identical for any number of threads.
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
constexpr int64_t kMaxRows = 16;

// Per-thread scratch: for each row of a block, Dv accumulators and kTile scores.
size_t attn_scratch_bytes(int64_t dv) {
    return static_cast<size_t>(kMaxRows) * (static_cast<size_t>(dv) + kTile) * sizeof(float);
}

float kv_dot(Type t, const uint8_t* k, const float* q, int64_t d) {
    switch (t) {
        case Type::F16:
            return kern::dot_f16_f32(reinterpret_cast<const fp16_t*>(k), q, d);
        case Type::BF16:
            return kern::dot_bf16_f32(reinterpret_cast<const bf16_t*>(k), q, d);
        default:
            return kern::dot_f32(reinterpret_cast<const float*>(k), q, d);
    }
}

void kv_axpy(Type t, float* acc, float w, const uint8_t* v, int64_t dv) {
    switch (t) {
        case Type::F16:
            kern::axpy_f16(acc, w, reinterpret_cast<const fp16_t*>(v), dv);
            return;
        case Type::BF16:
            kern::axpy_bf16(acc, w, reinterpret_cast<const bf16_t*>(v), dv);
            return;
        default:
            kern::axpy_f32(acc, w, reinterpret_cast<const float*>(v), dv);
            return;
    }
}

void kv_axpy4(Type t, float* acc, const float* w, const uint8_t* const* v, int64_t dv) {
    switch (t) {
        case Type::F16:
            kern::axpy4_f16(acc, w, reinterpret_cast<const fp16_t* const*>(v), dv);
            return;
        case Type::F32:
            kern::axpy4_f32(acc, w, reinterpret_cast<const float* const*>(v), dv);
            return;
        default:
            for (int i = 0; i < 4; i++) kv_axpy(t, acc, w[i], v[i], dv);
            return;
    }
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
    // large as kMaxRows allows, smaller when that leaves threads idle.
    const int64_t seg_rows = n_q * group;
    const int64_t n_seg = ne3 * n_head_kv;
    const int64_t total = seg_rows * n_seg;
    if (total == 0) return;
    int64_t blk = (total + p.nth - 1) / p.nth;
    blk = std::max<int64_t>(1, std::min<int64_t>(blk, std::min(kMaxRows, seg_rows)));
    const int64_t blocks_per_seg = (seg_rows + blk - 1) / blk;

    int64_t b0, b1;
    split_rows(n_seg * blocks_per_seg, p.ith, p.nth, &b0, &b1);
    if (b0 >= b1) return;
    float* scratch = static_cast<float*>(kern::thread_scratch(p, attn_scratch_bytes(dv)));

    const float* qrow[kMaxRows];
    const uint8_t* mrow[kMaxRows];
    float* acc[kMaxRows];
    float* sc[kMaxRows];
    float rmax[kMaxRows];
    double rsum[kMaxRows];
    float* out[kMaxRows];
    for (int64_t r = 0; r < kMaxRows; r++) {
        acc[r] = scratch + r * (dv + kTile);
        sc[r] = acc[r] + dv;
    }

    for (int64_t b = b0; b < b1; b++) {
        const int64_t seg = b / blocks_per_seg;
        const int64_t hk = seg % n_head_kv, i3 = seg / n_head_kv;
        const int64_t i3k = i3 / batch_group;
        const int64_t first = (b % blocks_per_seg) * blk;
        const int64_t nr = std::min(blk, seg_rows - first);
        for (int64_t r = 0; r < nr; r++) {
            const int64_t sr = first + r;
            const int64_t iq = sr / group, h = hk * group + sr % group;
            qrow[r] = reinterpret_cast<const float*>(row(q, iq, h, i3));
            mrow[r] = mask ? row(mask, iq, h % mask->ne[2], i3 % mask->ne[3]) : nullptr;
            out[r] = reinterpret_cast<float*>(row(dst, h, iq, i3));
            std::memset(acc[r], 0, static_cast<size_t>(dv) * sizeof(float));
            rmax[r] = kNegInf;
            rsum[r] = 0.0;
        }
        const uint8_t* kbase = row(k, 0, hk, i3k);
        const uint8_t* vbase = row(v, 0, hk, i3k);

        for (int64_t t0 = 0; t0 < n_kv; t0 += kTile) {
            const int64_t len = std::min(kTile, n_kv - t0);
            for (int64_t r = 0; r < nr; r++) {
                float* s = sc[r];
                // s = mask (or 0), then the scores of the unmasked positions
                if (!mrow[r]) {
                    for (int64_t j = 0; j < len; j++) s[j] = 0.0f;
                } else if (mask->type == Type::F16) {
                    kern::f16_to_f32_row(reinterpret_cast<const fp16_t*>(mrow[r]) + t0, s, len);
                } else {
                    std::memcpy(s, reinterpret_cast<const float*>(mrow[r]) + t0,
                                static_cast<size_t>(len) * sizeof(float));
                }
                float tile_max = kNegInf;
                for (int64_t j = 0; j < len; j++) {
                    if (s[j] == kNegInf) continue;
                    const uint8_t* kr = kbase + static_cast<size_t>(t0 + j) * k->nb[1];
                    s[j] = kv_dot(k->type, kr, qrow[r], d) * scale + s[j];
                    tile_max = s[j] > tile_max ? s[j] : tile_max;
                }
                if (tile_max == kNegInf) continue;  // nothing visible in this tile
                if (tile_max > rmax[r]) {
                    const float f = kern::exp_f32(rmax[r] - tile_max);  // 0 on the first tile
                    for (int64_t i = 0; i < dv; i++) acc[r][i] *= f;
                    rsum[r] *= static_cast<double>(f);
                    rmax[r] = tile_max;
                }
                const float m = rmax[r];
                for (int64_t j = 0; j < len; j++) s[j] = kern::exp_f32(s[j] - m);  // -inf -> 0
                // V accumulation over the positions with a nonzero weight, four at a time where
                // the type has a fused form (bit-identical to one at a time)
                double tsum = 0.0;
                float wq[4];
                const uint8_t* vq[4];
                int nq = 0;
                for (int64_t j = 0; j < len; j++) {
                    if (s[j] == 0.0f) continue;
                    tsum += static_cast<double>(s[j]);
                    wq[nq] = s[j];
                    vq[nq] = vbase + static_cast<size_t>(t0 + j) * v->nb[1];
                    if (++nq == 4) {
                        kv_axpy4(v->type, acc[r], wq, vq, dv);
                        nq = 0;
                    }
                }
                for (int i = 0; i < nq; i++) kv_axpy(v->type, acc[r], wq[i], vq[i], dv);
                rsum[r] += tsum;
            }
        }

        for (int64_t r = 0; r < nr; r++) {
            if (rsum[r] > 0.0) {
                const float inv = static_cast<float>(1.0 / rsum[r]);
                for (int64_t i = 0; i < dv; i++) out[r][i] = acc[r][i] * inv;
            } else {
                std::memset(out[r], 0, static_cast<size_t>(dv) * sizeof(float));
            }
        }
    }
}

size_t flash_attn_work_size(const Tensor* node, int n_threads) {
    return kern::scratch_size(attn_scratch_bytes(node->src[2]->ne[0]), n_threads);
}

}  // namespace ferry::cpu
