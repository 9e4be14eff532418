// Reference quantizers, dequantizers and dot products for the GGUF block formats.
//
// Dequantizers reproduce the reference float32 results bit for bit: every scale is widened from
// fp16 to float and the products are formed in the reference's order, (d * scale) * q - dmin * m.
// With fp16 scales, 6- or 8-bit sub-scales and at most 6-bit quants every product except Q6_K's
// last one is exact in float, so only the final operation rounds and a fused multiply-add could
// not change a result either.

#include "core/quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace ferry::quants {
namespace {

// ---------------------------------------------------------------------------------------------
// Small helpers

// Rounds to the nearest integer and clamps into [lo, hi]. Safe for NaN and huge values (lrint
// never has undefined behaviour; a NaN lands on one of the bounds).
inline int round_clamp(float v, int lo, int hi) {
    if (!(v >= static_cast<float>(lo))) return lo;  // also catches NaN
    if (v >= static_cast<float>(hi)) return hi;
    return static_cast<int>(std::lrint(v));
}

// The element of x with the largest magnitude, keeping its sign.
inline float signed_absmax(const float* x, int n) {
    float best = 0.0f;
    for (int i = 0; i < n; i++) {
        if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
    }
    return best;
}

inline float absmax(const float* x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) m = std::max(m, std::fabs(x[i]));
    return m;
}

// Stores v as fp16 and returns the value a dequantizer will read back.
inline float store_fp16(fp16_t* dst, float v) {
    *dst = fp32_to_fp16(v);
    return fp16_to_fp32(*dst);
}

// ---------------------------------------------------------------------------------------------
// K-quant scale packing: 8 six-bit scales and 8 six-bit mins in 12 bytes.
//   j < 4 : scale j = bytes[j] & 63,          min j = bytes[j + 4] & 63
//   j >= 4: scale j = (bytes[j + 4] & 15) | (bytes[j - 4] >> 6) << 4
//           min j   = (bytes[j + 4] >> 4) | (bytes[j] >> 6) << 4

void unpack_k_scales(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = q[j] & 63;
            mn[j] = q[j + 4] & 63;
        } else {
            sc[j] = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
            mn[j] = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
        }
    }
}

void pack_k_scales(const uint8_t* sc, const uint8_t* mn, uint8_t* q) {
    std::memset(q, 0, kKScaleSize);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] |= static_cast<uint8_t>(sc[j] & 63);
            q[j + 4] |= static_cast<uint8_t>(mn[j] & 63);
        } else {
            q[j + 4] = static_cast<uint8_t>((sc[j] & 0x0f) | ((mn[j] & 0x0f) << 4));
            q[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
            q[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Unpacking K blocks into plain per-element quants (element order of the GGUF layout).

// Q4_K: each 64-element chunk c uses qs[32c .. 32c+31]: low nibbles are elements 64c + l,
// high nibbles elements 64c + 32 + l.
void unpack_q4_k(const BlockQ4_K& b, uint8_t* q, uint8_t* sc, uint8_t* mn) {
    unpack_k_scales(b.scales, sc, mn);
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            const uint8_t byte = b.qs[32 * c + l];
            q[64 * c + l] = byte & 0x0f;
            q[64 * c + 32 + l] = byte >> 4;
        }
    }
}

// Q5_K: the low 4 bits as in Q4_K; the fifth bit of element 64c + l is bit 2c of qh[l], of
// element 64c + 32 + l bit 2c + 1 of qh[l].
void unpack_q5_k(const BlockQ5_K& b, uint8_t* q, uint8_t* sc, uint8_t* mn) {
    unpack_k_scales(b.scales, sc, mn);
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            const uint8_t byte = b.qs[32 * c + l];
            const uint8_t hi = b.qh[l];
            q[64 * c + l] = static_cast<uint8_t>((byte & 0x0f) | (((hi >> (2 * c)) & 1) << 4));
            q[64 * c + 32 + l] =
                static_cast<uint8_t>((byte >> 4) | (((hi >> (2 * c + 1)) & 1) << 4));
        }
    }
}

// Q6_K: two halves of 128 elements; in half h, for l < 32:
//   element 128h + l      : low nibble of ql[64h + l],      bits 0-1 of qh[32h + l]
//   element 128h + l + 32 : low nibble of ql[64h + l + 32], bits 2-3
//   element 128h + l + 64 : high nibble of ql[64h + l],     bits 4-5
//   element 128h + l + 96 : high nibble of ql[64h + l + 32], bits 6-7
// Quants are stored with a +32 bias; q receives the signed value in [-32, 31]. Scale g applies to
// elements 16g .. 16g + 15.
void unpack_q6_k(const BlockQ6_K& b, int8_t* q) {
    for (int h = 0; h < 2; h++) {
        const uint8_t* ql = b.ql + 64 * h;
        const uint8_t* qh = b.qh + 32 * h;
        int8_t* out = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            out[l] = static_cast<int8_t>(((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32);
            out[l + 32] =
                static_cast<int8_t>(((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
            out[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            out[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

namespace {

// q: unsigned 6-bit values (bias already added), the inverse of unpack_q6_k.
void pack_q6_k(const uint8_t* q, BlockQ6_K& b) {
    for (int h = 0; h < 2; h++) {
        uint8_t* ql = b.ql + 64 * h;
        uint8_t* qh = b.qh + 32 * h;
        const uint8_t* in = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            const uint8_t q0 = in[l], q1 = in[l + 32], q2 = in[l + 64], q3 = in[l + 96];
            ql[l] = static_cast<uint8_t>((q0 & 0x0f) | ((q2 & 0x0f) << 4));
            ql[l + 32] = static_cast<uint8_t>((q1 & 0x0f) | ((q3 & 0x0f) << 4));
            qh[l] = static_cast<uint8_t>((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) |
                                         ((q3 >> 4) << 6));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scale searches.

// Quantizes x (n elements) as x ~= scale * L - mn with L in [0, nmax]; returns the weighted
// squared error. `scale` and `mn` are used exactly as given (the dequantizer's float values).
double quantize_affine(const float* x, const float* w, int n, int nmax, float scale, float mn,
                       uint8_t* L) {
    double err = 0;
    for (int i = 0; i < n; i++) {
        const int l = scale > 0.0f ? round_clamp((x[i] + mn) / scale, 0, nmax) : 0;
        L[i] = static_cast<uint8_t>(l);
        const double diff = static_cast<double>(scale * static_cast<float>(l) - mn) - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

// Weighted least-squares fit of x ~= a * L + b for fixed L, with b <= 0 (the K formats store a
// non-negative min that is subtracted). Returns false when the fit is degenerate.
bool fit_affine(const float* x, const float* w, const uint8_t* L, int n, double* a, double* b) {
    double sw = 0, sl = 0, sll = 0, sx = 0, slx = 0;
    for (int i = 0; i < n; i++) {
        const double wi = w[i], li = L[i], xi = x[i];
        sw += wi;
        sl += wi * li;
        sll += wi * li * li;
        sx += wi * xi;
        slx += wi * li * xi;
    }
    const double det = sw * sll - sl * sl;
    if (det > 0) {
        *a = (sw * slx - sl * sx) / det;
        *b = (sll * sx - sl * slx) / det;
    } else {
        *a = 0;
        *b = 1;  // forces the constrained branch below
    }
    if (*b > 0) {  // the best offset would be positive: pin it to zero
        if (sll <= 0) return false;
        *b = 0;
        *a = slx / sll;
    }
    return *a > 0;
}

double affine_error(const float* x, const float* w, const uint8_t* L, int n, double a, double b) {
    double err = 0;
    for (int i = 0; i < n; i++) {
        const double diff = a * L[i] + b - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

// Finds (scale, mn), both >= 0, minimizing sum w (scale * L - mn - x)^2 with L in [0, nmax]:
// a grid of candidate step sizes around the min/max one, each refitted by least squares, then
// alternating requantize / refit until the error stops improving.
void search_scale_min(const float* x, const float* w, int n, int nmax, float* scale, float* mn) {
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
    }
    if (!(hi > lo)) {  // constant non-positive block (or NaNs): the min alone represents it
        *scale = 0.0f;
        *mn = std::isfinite(lo) ? -lo : 0.0f;
        return;
    }
    uint8_t L[kQK_K];
    uint8_t Lbest[kQK_K];
    const double range = static_cast<double>(hi) - lo;
    double best_a = range / nmax, best_b = lo;
    for (int i = 0; i < n; i++) {
        Lbest[i] =
            static_cast<uint8_t>(round_clamp(static_cast<float>((x[i] - lo) / best_a), 0, nmax));
    }
    double best_err = affine_error(x, w, Lbest, n, best_a, best_b);

    // Candidate steps: range / (nmax + t) for t in [-1, 1.5]. Larger t clips the extremes
    // slightly in exchange for a finer step, which pays off on bell-shaped data.
    for (int k = -10; k <= 15; k++) {
        const double inv = (nmax + 0.1 * k) / range;
        for (int i = 0; i < n; i++) {
            L[i] =
                static_cast<uint8_t>(round_clamp(static_cast<float>((x[i] - lo) * inv), 0, nmax));
        }
        double a, b;
        if (!fit_affine(x, w, L, n, &a, &b)) continue;
        const double err = affine_error(x, w, L, n, a, b);
        if (err < best_err) {
            best_err = err;
            best_a = a;
            best_b = b;
        }
    }
    for (int iter = 0; iter < 8; iter++) {
        for (int i = 0; i < n; i++) {
            L[i] = static_cast<uint8_t>(
                round_clamp(static_cast<float>((x[i] - best_b) / best_a), 0, nmax));
        }
        double a, b;
        if (!fit_affine(x, w, L, n, &a, &b)) break;
        const double err = affine_error(x, w, L, n, a, b);
        if (!(err < best_err * (1 - 1e-9))) break;
        best_err = err;
        best_a = a;
        best_b = b;
    }
    *scale = static_cast<float>(best_a);
    *mn = static_cast<float>(-best_b);
}

// Finds a signed scale minimizing sum w (scale * L - x)^2 with L in [-nneg, nneg - 1]
// (symmetric formats that use the extra negative level).
float search_scale_symmetric(const float* x, const float* w, int n, int nneg) {
    const float vmax = signed_absmax(x, n);
    if (!(std::fabs(vmax) > 1e-30f)) return 0.0f;
    int L[kQK_K];
    double best_num = 0, best_den = 1;  // scale = num / den, error = sum w x^2 - num^2 / den
    bool have = false;
    auto try_inverse = [&](double inv) {
        double num = 0, den = 0;
        for (int i = 0; i < n; i++) {
            L[i] = round_clamp(static_cast<float>(x[i] * inv), -nneg, nneg - 1);
            num += static_cast<double>(w[i]) * x[i] * L[i];
            den += static_cast<double>(w[i]) * L[i] * L[i];
        }
        if (den <= 0) return false;
        if (!have || num * num * best_den > best_num * best_num * den) {
            best_num = num;
            best_den = den;
            have = true;
            return true;
        }
        return false;
    };
    // Map the largest element to around -nneg (the side with the extra level).
    for (int k = -10; k <= 10; k++) try_inverse(-(nneg + 0.1 * k) / vmax);
    if (!have) return 0.0f;
    for (int iter = 0; iter < 8; iter++) {
        const double scale = best_num / best_den;
        if (scale == 0 || !try_inverse(1.0 / scale)) break;
    }
    return static_cast<float>(best_num / best_den);
}

// Weights for the K-format searches: every element counts, larger ones a bit more.
void k_weights(const float* x, int n, float* w) {
    double s2 = 0;
    for (int i = 0; i < n; i++) s2 += static_cast<double>(x[i]) * x[i];
    const float av = static_cast<float>(std::sqrt(s2 / n));
    for (int i = 0; i < n; i++) w[i] = av + std::fabs(x[i]);
}

// Shared Q4_K / Q5_K super-block quantizer: 8 sub-blocks of 32 with 6-bit scales and mins.
// Produces the unpacked quants q[256] (0..nmax) and the packed header fields.
void quantize_k_superblock(const float* x, int nmax, fp16_t* d_out, fp16_t* dmin_out,
                           uint8_t* scales_out, uint8_t* q) {
    float w[kQK_K];
    float sub_scale[8], sub_min[8];
    for (int j = 0; j < 8; j++) {
        k_weights(x + 32 * j, 32, w + 32 * j);
        search_scale_min(x + 32 * j, w + 32 * j, 32, nmax, &sub_scale[j], &sub_min[j]);
    }
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        max_scale = std::max(max_scale, sub_scale[j]);
        max_min = std::max(max_min, sub_min[j]);
    }
    const float d = store_fp16(d_out, max_scale / 63.0f);
    const float dmin = store_fp16(dmin_out, max_min / 63.0f);

    uint8_t sc[8] = {}, mn[8] = {};
    uint8_t L[32];
    std::memset(q, 0, kQK_K);  // stays zero only for non-finite input, where no error compares
    for (int j = 0; j < 8; j++) {
        const float* xj = x + 32 * j;
        const float* wj = w + 32 * j;
        const int ls0 = d > 0 ? round_clamp(sub_scale[j] / d, 0, 63) : 0;
        const int lm0 = dmin > 0 ? round_clamp(sub_min[j] / dmin, 0, 63) : 0;
        // The 6-bit rounding moved the fitted values; the neighbouring codes may fit better.
        double best_err = std::numeric_limits<double>::infinity();
        for (int ls = std::max(ls0 - 1, 0); ls <= std::min(ls0 + 1, 63); ls++) {
            for (int lm = std::max(lm0 - 1, 0); lm <= std::min(lm0 + 1, 63); lm++) {
                const float eff_scale = d * static_cast<float>(ls);
                const float eff_min = dmin * static_cast<float>(lm);
                const double err = quantize_affine(xj, wj, 32, nmax, eff_scale, eff_min, L);
                if (err < best_err) {
                    best_err = err;
                    sc[j] = static_cast<uint8_t>(ls);
                    mn[j] = static_cast<uint8_t>(lm);
                    std::memcpy(q + 32 * j, L, 32);
                }
            }
        }
    }
    pack_k_scales(sc, mn, scales_out);
}

}  // namespace

// =============================================================================================
// Q4_0: x = (q - 8) * d

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
    const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
    for (int64_t i = 0; i < n / kQK4_0; i++, dst += kQK4_0) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQK4_0 / 2; j++) {
            dst[j] = static_cast<float>((b[i].qs[j] & 0x0f) - 8) * d;
            dst[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
    BlockQ4_0* b = static_cast<BlockQ4_0*>(dst);
    for (int64_t i = 0; i < n / kQK4_0; i++, src += kQK4_0) {
        // The largest-magnitude element maps to -8, the level without a positive mirror.
        const float d = store_fp16(&b[i].d, signed_absmax(src, kQK4_0) / -8.0f);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < kQK4_0 / 2; j++) {
            const int lo = round_clamp(src[j] * id, -8, 7) + 8;
            const int hi = round_clamp(src[j + 16] * id, -8, 7) + 8;
            b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
    }
}

void vec_dot_q4_0(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ4_0* bx = static_cast<const BlockQ4_0*>(x);
    const BlockQ8_0* by = static_cast<const BlockQ8_0*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQK4_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < kQK4_0 / 2; j++) {
            isum += ((bx[i].qs[j] & 0x0f) - 8) * by[i].qs[j];
            isum += ((bx[i].qs[j] >> 4) - 8) * by[i].qs[j + 16];
        }
        sum += static_cast<double>(fp16_to_fp32(bx[i].d)) * fp16_to_fp32(by[i].d) * isum;
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q4_1: x = q * d + m

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
    const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
    for (int64_t i = 0; i < n / kQK4_1; i++, dst += kQK4_1) {
        const float d = fp16_to_fp32(b[i].d);
        const float m = fp16_to_fp32(b[i].m);
        for (int j = 0; j < kQK4_1 / 2; j++) {
            dst[j] = static_cast<float>(b[i].qs[j] & 0x0f) * d + m;
            dst[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
        }
    }
}

void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
    BlockQ4_1* b = static_cast<BlockQ4_1*>(dst);
    for (int64_t i = 0; i < n / kQK4_1; i++, src += kQK4_1) {
        float lo = src[0], hi = src[0];
        for (int j = 1; j < kQK4_1; j++) {
            lo = std::min(lo, src[j]);
            hi = std::max(hi, src[j]);
        }
        const float d = store_fp16(&b[i].d, (hi - lo) / 15.0f);
        const float m = store_fp16(&b[i].m, lo);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < kQK4_1 / 2; j++) {
            const int q0 = round_clamp((src[j] - m) * id, 0, 15);
            const int q1 = round_clamp((src[j + 16] - m) * id, 0, 15);
            b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
    }
}

void vec_dot_q4_1(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ4_1* bx = static_cast<const BlockQ4_1*>(x);
    const BlockQ8_0* by = static_cast<const BlockQ8_0*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQK4_1; i++) {
        // sum (q d + m) * (q8 d8) = d d8 sum q q8 + m d8 sum q8
        int32_t isum = 0, ysum = 0;
        for (int j = 0; j < kQK4_1 / 2; j++) {
            isum += (bx[i].qs[j] & 0x0f) * by[i].qs[j] + (bx[i].qs[j] >> 4) * by[i].qs[j + 16];
            ysum += by[i].qs[j] + by[i].qs[j + 16];
        }
        const double dy = fp16_to_fp32(by[i].d);
        sum += dy * (static_cast<double>(fp16_to_fp32(bx[i].d)) * isum +
                     static_cast<double>(fp16_to_fp32(bx[i].m)) * ysum);
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q8_0: x = q * d

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / kQK8_0; i++, dst += kQK8_0) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQK8_0; j++) dst[j] = static_cast<float>(b[i].qs[j]) * d;
    }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
    BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
    for (int64_t i = 0; i < n / kQK8_0; i++, src += kQK8_0) {
        const float d = store_fp16(&b[i].d, absmax(src, kQK8_0) / 127.0f);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < kQK8_0; j++) {
            b[i].qs[j] = static_cast<int8_t>(round_clamp(src[j] * id, -127, 127));
        }
    }
}

void vec_dot_q8_0(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ8_0* bx = static_cast<const BlockQ8_0*>(x);
    const BlockQ8_0* by = static_cast<const BlockQ8_0*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQK8_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < kQK8_0; j++) isum += bx[i].qs[j] * by[i].qs[j];
        sum += static_cast<double>(fp16_to_fp32(bx[i].d)) * fp16_to_fp32(by[i].d) * isum;
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q4_K: x = (d * sc) * q - (dmin * m) per 32-element sub-block

void dequantize_row_q4_k(const void* src, float* dst, int64_t n) {
    const BlockQ4_K* b = static_cast<const BlockQ4_K*>(src);
    uint8_t q[kQK_K], sc[8], mn[8];
    for (int64_t i = 0; i < n / kQK_K; i++, dst += kQK_K) {
        unpack_q4_k(b[i], q, sc, mn);
        const float d = fp16_to_fp32(b[i].d);
        const float dmin = fp16_to_fp32(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            const float ds = d * static_cast<float>(sc[j]);
            const float dm = dmin * static_cast<float>(mn[j]);
            for (int l = 0; l < 32; l++)
                dst[32 * j + l] = ds * static_cast<float>(q[32 * j + l]) - dm;
        }
    }
}

void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
    BlockQ4_K* b = static_cast<BlockQ4_K*>(dst);
    uint8_t q[kQK_K];
    for (int64_t i = 0; i < n / kQK_K; i++, src += kQK_K) {
        quantize_k_superblock(src, 15, &b[i].d, &b[i].dmin, b[i].scales, q);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                b[i].qs[32 * c + l] =
                    static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
            }
        }
    }
}

namespace {
// Shared by the Q4_K and Q5_K dots: q are unsigned quants, sc/mn the 6-bit scales and mins.
double k_affine_block_dot(const uint8_t* q, const uint8_t* sc, const uint8_t* mn, float d,
                          float dmin, const BlockQ8_K& by) {
    int64_t isum = 0, imin = 0;
    for (int j = 0; j < 8; j++) {
        int32_t qq = 0, ys = 0;
        for (int l = 0; l < 32; l++) {
            qq += q[32 * j + l] * by.qs[32 * j + l];
            ys += by.qs[32 * j + l];
        }
        isum += static_cast<int64_t>(sc[j]) * qq;
        imin += static_cast<int64_t>(mn[j]) * ys;
    }
    return static_cast<double>(by.d) * (static_cast<double>(d) * static_cast<double>(isum) -
                                        static_cast<double>(dmin) * static_cast<double>(imin));
}
}  // namespace

void vec_dot_q4_k(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ4_K* bx = static_cast<const BlockQ4_K*>(x);
    const BlockQ8_K* by = static_cast<const BlockQ8_K*>(y);
    uint8_t q[kQK_K], sc[8], mn[8];
    double sum = 0;
    for (int64_t i = 0; i < n / kQK_K; i++) {
        unpack_q4_k(bx[i], q, sc, mn);
        sum +=
            k_affine_block_dot(q, sc, mn, fp16_to_fp32(bx[i].d), fp16_to_fp32(bx[i].dmin), by[i]);
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q5_K: as Q4_K with 5-bit quants

void dequantize_row_q5_k(const void* src, float* dst, int64_t n) {
    const BlockQ5_K* b = static_cast<const BlockQ5_K*>(src);
    uint8_t q[kQK_K], sc[8], mn[8];
    for (int64_t i = 0; i < n / kQK_K; i++, dst += kQK_K) {
        unpack_q5_k(b[i], q, sc, mn);
        const float d = fp16_to_fp32(b[i].d);
        const float dmin = fp16_to_fp32(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            const float ds = d * static_cast<float>(sc[j]);
            const float dm = dmin * static_cast<float>(mn[j]);
            for (int l = 0; l < 32; l++)
                dst[32 * j + l] = ds * static_cast<float>(q[32 * j + l]) - dm;
        }
    }
}

void quantize_row_q5_k(const float* src, void* dst, int64_t n) {
    BlockQ5_K* b = static_cast<BlockQ5_K*>(dst);
    uint8_t q[kQK_K];
    for (int64_t i = 0; i < n / kQK_K; i++, src += kQK_K) {
        quantize_k_superblock(src, 31, &b[i].d, &b[i].dmin, b[i].scales, q);
        std::memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
                b[i].qs[32 * c + l] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
                b[i].qh[l] |=
                    static_cast<uint8_t>(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
            }
        }
    }
}

void vec_dot_q5_k(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ5_K* bx = static_cast<const BlockQ5_K*>(x);
    const BlockQ8_K* by = static_cast<const BlockQ8_K*>(y);
    uint8_t q[kQK_K], sc[8], mn[8];
    double sum = 0;
    for (int64_t i = 0; i < n / kQK_K; i++) {
        unpack_q5_k(bx[i], q, sc, mn);
        sum +=
            k_affine_block_dot(q, sc, mn, fp16_to_fp32(bx[i].d), fp16_to_fp32(bx[i].dmin), by[i]);
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q6_K: x = (d * scale) * (q - 32) per 16-element group

void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
    const BlockQ6_K* b = static_cast<const BlockQ6_K*>(src);
    int8_t q[kQK_K];
    for (int64_t i = 0; i < n / kQK_K; i++, dst += kQK_K) {
        unpack_q6_k(b[i], q);
        const float d = fp16_to_fp32(b[i].d);
        for (int g = 0; g < kQK_K / 16; g++) {
            const float ds = d * static_cast<float>(b[i].scales[g]);
            for (int l = 0; l < 16; l++) dst[16 * g + l] = ds * static_cast<float>(q[16 * g + l]);
        }
    }
}

void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
    BlockQ6_K* b = static_cast<BlockQ6_K*>(dst);
    constexpr int kGroups = kQK_K / 16;
    for (int64_t i = 0; i < n / kQK_K; i++, src += kQK_K) {
        float w[kQK_K];
        float group_scale[kGroups];
        for (int g = 0; g < kGroups; g++) {
            k_weights(src + 16 * g, 16, w + 16 * g);
            group_scale[g] = search_scale_symmetric(src + 16 * g, w + 16 * g, 16, 32);
        }
        // The group scale of largest magnitude maps to -128, as in Q4_0.
        const float smax = signed_absmax(group_scale, kGroups);
        const float d = store_fp16(&b[i].d, smax / -128.0f);
        uint8_t q[kQK_K];
        std::memset(q, 32, sizeof(q));  // zero, kept only for non-finite input
        std::memset(b[i].scales, 0, sizeof(b[i].scales));
        for (int g = 0; g < kGroups; g++) {
            const float* xg = src + 16 * g;
            const float* wg = w + 16 * g;
            const int s0 = d != 0.0f ? round_clamp(group_scale[g] / d, -128, 127) : 0;
            double best_err = std::numeric_limits<double>::infinity();
            for (int s = std::max(s0 - 1, -128); s <= std::min(s0 + 1, 127); s++) {
                const float ds = d * static_cast<float>(s);
                const float ids = ds != 0.0f ? 1.0f / ds : 0.0f;
                uint8_t L[16];
                double err = 0;
                for (int l = 0; l < 16; l++) {
                    const int v = round_clamp(xg[l] * ids, -32, 31);
                    L[l] = static_cast<uint8_t>(v + 32);
                    const double diff = static_cast<double>(ds * static_cast<float>(v)) - xg[l];
                    err += wg[l] * diff * diff;
                }
                if (err < best_err) {
                    best_err = err;
                    b[i].scales[g] = static_cast<int8_t>(s);
                    std::memcpy(q + 16 * g, L, 16);
                }
            }
        }
        pack_q6_k(q, b[i]);
    }
}

void vec_dot_q6_k(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ6_K* bx = static_cast<const BlockQ6_K*>(x);
    const BlockQ8_K* by = static_cast<const BlockQ8_K*>(y);
    int8_t q[kQK_K];
    double sum = 0;
    for (int64_t i = 0; i < n / kQK_K; i++) {
        unpack_q6_k(bx[i], q);
        int64_t isum = 0;
        for (int g = 0; g < kQK_K / 16; g++) {
            int32_t gsum = 0;
            for (int l = 0; l < 16; l++) gsum += q[16 * g + l] * by[i].qs[16 * g + l];
            isum += static_cast<int64_t>(bx[i].scales[g]) * gsum;
        }
        sum += static_cast<double>(fp16_to_fp32(bx[i].d)) * by[i].d * static_cast<double>(isum);
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q8_K: x = q * d (float d), bsums = sums of each 16 quants

void dequantize_row_q8_k(const void* src, float* dst, int64_t n) {
    const BlockQ8_K* b = static_cast<const BlockQ8_K*>(src);
    for (int64_t i = 0; i < n / kQK_K; i++, dst += kQK_K) {
        for (int j = 0; j < kQK_K; j++) dst[j] = b[i].d * static_cast<float>(b[i].qs[j]);
    }
}

void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
    BlockQ8_K* b = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / kQK_K; i++, src += kQK_K) {
        const float amax = absmax(src, kQK_K);
        const float d = amax / 127.0f;
        b[i].d = d;
        // Divide rather than multiply by 1/d: d may be subnormal and 1/d infinite.
        for (int j = 0; j < kQK_K; j++) {
            b[i].qs[j] = static_cast<int8_t>(d != 0.0f ? round_clamp(src[j] / d, -127, 127) : 0);
        }
        for (int g = 0; g < kQK_K / 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += b[i].qs[16 * g + l];
            b[i].bsums[g] = static_cast<int16_t>(s);
        }
    }
}

void vec_dot_q8_k(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ8_K* bx = static_cast<const BlockQ8_K*>(x);
    const BlockQ8_K* by = static_cast<const BlockQ8_K*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQK_K; i++) {
        int32_t isum = 0;
        for (int j = 0; j < kQK_K; j++) isum += bx[i].qs[j] * by[i].qs[j];
        sum += static_cast<double>(bx[i].d) * by[i].d * isum;
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Helpers of the formats added for llama.cpp's preset fallbacks and the non-linear / MX types.

namespace {

inline uint32_t load_u32_le(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
           static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
inline void store_u32_le(uint8_t* p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = static_cast<uint8_t>(v >> (8 * k));
}

// Unsigned 5-bit quant j of a Q5_0 / Q5_1 block.
inline int q5_quant(const uint8_t* qs, uint32_t qh, int j) {
    const int nib = j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
    return nib | static_cast<int>(((qh >> j) & 1u) << 4);
}

// Packs 32 unsigned 5-bit quants.
void pack_q5(const int* q, uint8_t* qs, uint8_t* qh) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    }
    for (int j = 0; j < 32; j++) h |= static_cast<uint32_t>(q[j] >> 4) << j;
    store_u32_le(qh, h);
}

// Q2_K element e's unsigned quant.
void unpack_q2_k(const BlockQ2_K& b, uint8_t* q) {
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) {
            for (int l = 0; l < 32; l++) {
                q[128 * h + 32 * s + l] = static_cast<uint8_t>((b.qs[32 * h + l] >> (2 * s)) & 3);
            }
        }
    }
}

// Q3_K: signed quants (q - 4, in [-4, 3]) and signed group scales (sc - 32, in [-32, 31]).
void unpack_q3_k(const BlockQ3_K& b, int8_t* q, int8_t* sc) {
    for (int g = 0; g < 16; g++) {
        const int lo = g < 8 ? b.scales[g] & 0x0f : b.scales[g - 8] >> 4;
        const int hi = (b.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        sc[g] = static_cast<int8_t>((lo | (hi << 4)) - 32);
    }
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) {
            for (int l = 0; l < 32; l++) {
                const int low = (b.qs[32 * h + l] >> (2 * s)) & 3;
                const int high = (b.hmask[l] >> (4 * h + s)) & 1;
                q[128 * h + 32 * s + l] = static_cast<int8_t>((low | (high << 2)) - 4);
            }
        }
    }
}

// IQ4_XS sub-block j's signed scale (ls - 32).
inline int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
    const int lo = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
    const int hi = (b.scales_h >> (2 * j)) & 3;
    return (lo | (hi << 4)) - 32;
}

// Nibble j of a 32-element block laid out as Q4_0 (low nibbles first, then high nibbles).
inline int nibble(const uint8_t* qs, int j) {
    return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
}
void pack_nibbles(const uint8_t* idx, uint8_t* qs) {
    for (int j = 0; j < 16; j++) qs[j] = static_cast<uint8_t>(idx[j] | (idx[j + 16] << 4));
}

// A 16-entry value table sorted for search: sorted[k] is the value of 4-bit code code[k].
struct Codebook {
    int8_t sorted[16];
    uint8_t code[16];
};

constexpr Codebook make_codebook(const int8_t* values) {
    Codebook cb{};
    uint8_t order[16] = {};
    for (int i = 0; i < 16; i++) order[i] = static_cast<uint8_t>(i);
    for (int i = 1; i < 16; i++) {  // insertion sort, stable
        for (int j = i; j > 0 && values[order[j - 1]] > values[order[j]]; j--) {
            const uint8_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    }
    for (int i = 0; i < 16; i++) {
        cb.sorted[i] = values[order[i]];
        cb.code[i] = order[i];
    }
    return cb;
}

constexpr Codebook kIQ4NLBook = make_codebook(kIQ4NLValues);
constexpr Codebook kMXFP4Book = make_codebook(kMXFP4Values);

// Position in cb.sorted of the value nearest to v (the lower of two equally near). A binary
// search over the midpoints: the quantizers call this for every element and candidate scale.
int nearest_index(const Codebook& cb, float v) {
    int lo = 0, hi = 15;  // answer in [lo, hi]
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        const float boundary =
            0.5f * (static_cast<float>(cb.sorted[mid]) + static_cast<float>(cb.sorted[mid + 1]));
        if (v > boundary) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Codes for x ~= scale * value(code); returns the weighted squared error.
double quantize_table(const float* x, const float* w, int n, const Codebook& cb, float scale,
                      uint8_t* codes) {
    double err = 0;
    const int zero = nearest_index(cb, 0.0f);
    for (int i = 0; i < n; i++) {
        const int k = scale != 0.0f ? nearest_index(cb, x[i] / scale) : zero;
        codes[i] = cb.code[k];
        const double diff = static_cast<double>(scale * static_cast<float>(cb.sorted[k])) - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

// Scale for x ~= scale * value(code) with a non-linear table: candidate scales that put the
// largest element on or near either end of the table, each refitted by least squares for its
// codes, then alternating re-coding / refitting while the error falls.
float search_scale_table(const float* x, const float* w, int n, const Codebook& cb) {
    const float vmax = signed_absmax(x, n);
    if (!(std::fabs(vmax) > 1e-30f) || !std::isfinite(vmax)) return 0.0f;
    double best_num = 0, best_den = 1;
    bool have = false;
    auto try_scale = [&](double scale) {
        if (!(scale != 0) || !std::isfinite(scale)) return false;
        const float inv = static_cast<float>(1.0 / scale);
        double num = 0, den = 0;
        for (int i = 0; i < n; i++) {
            const double v = cb.sorted[nearest_index(cb, x[i] * inv)];
            num += static_cast<double>(w[i]) * x[i] * v;
            den += static_cast<double>(w[i]) * v * v;
        }
        if (den <= 0) return false;
        if (!have || num * num * best_den > best_num * best_num * den) {
            best_num = num;
            best_den = den;
            have = true;
            return true;
        }
        return false;
    };
    // Steps of 3 table units: finer steps cost time (gen-model quantizes whole models with
    // this) and gained < 1% in error on Gaussian data.
    for (int k = -9; k <= 9; k += 3) {
        try_scale(vmax / (cb.sorted[0] + k));   // largest element near the negative end
        try_scale(vmax / (cb.sorted[15] + k));  // or near the positive end
    }
    if (!have) return 0.0f;
    for (int iter = 0; iter < 4; iter++) {
        if (!try_scale(best_num / best_den)) break;
    }
    return static_cast<float>(best_num / best_den);
}

// Affine super-block shared by Q2_K: ngroups groups of glen elements, x ~= (d * sc) * q -
// (dmin * mn) with q in [0, nmax] and sc, mn in [0, smax]. Fills sc, mn, q (unpacked) and
// stores d, dmin.
void quantize_affine_groups(const float* x, int ngroups, int glen, int nmax, int smax,
                            fp16_t* d_out, fp16_t* dmin_out, uint8_t* sc, uint8_t* mn, uint8_t* q) {
    float w[kQK_K];
    float gs[16], gm[16];
    for (int g = 0; g < ngroups; g++) {
        k_weights(x + glen * g, glen, w + glen * g);
        search_scale_min(x + glen * g, w + glen * g, glen, nmax, &gs[g], &gm[g]);
    }
    float max_scale = 0, max_min = 0;
    for (int g = 0; g < ngroups; g++) {
        max_scale = std::max(max_scale, gs[g]);
        max_min = std::max(max_min, gm[g]);
    }
    const float d = store_fp16(d_out, max_scale / static_cast<float>(smax));
    const float dmin = store_fp16(dmin_out, max_min / static_cast<float>(smax));
    uint8_t L[kQK_K];
    std::memset(q, 0, static_cast<size_t>(ngroups * glen));
    for (int g = 0; g < ngroups; g++) {
        const float* xg = x + glen * g;
        const float* wg = w + glen * g;
        sc[g] = 0;
        mn[g] = 0;
        const int ls0 = d > 0 ? round_clamp(gs[g] / d, 0, smax) : 0;
        const int lm0 = dmin > 0 ? round_clamp(gm[g] / dmin, 0, smax) : 0;
        double best_err = std::numeric_limits<double>::infinity();
        for (int ls = std::max(ls0 - 1, 0); ls <= std::min(ls0 + 1, smax); ls++) {
            for (int lm = std::max(lm0 - 1, 0); lm <= std::min(lm0 + 1, smax); lm++) {
                const float eff_scale = d * static_cast<float>(ls);
                const float eff_min = dmin * static_cast<float>(lm);
                const double err = quantize_affine(xg, wg, glen, nmax, eff_scale, eff_min, L);
                if (err < best_err) {
                    best_err = err;
                    sc[g] = static_cast<uint8_t>(ls);
                    mn[g] = static_cast<uint8_t>(lm);
                    std::memcpy(q + glen * g, L, static_cast<size_t>(glen));
                }
            }
        }
    }
}

}  // namespace

// =============================================================================================
// Q5_0: x = d * (q - 16)

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
    const BlockQ5_0* b = static_cast<const BlockQ5_0*>(src);
    for (int64_t i = 0; i < n / kQK5_0; i++, dst += kQK5_0) {
        const float d = fp16_to_fp32(b[i].d);
        const uint32_t qh = load_u32_le(b[i].qh);
        for (int j = 0; j < kQK5_0; j++) {
            dst[j] = static_cast<float>(q5_quant(b[i].qs, qh, j) - 16) * d;
        }
    }
}

void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
    BlockQ5_0* b = static_cast<BlockQ5_0*>(dst);
    for (int64_t i = 0; i < n / kQK5_0; i++, src += kQK5_0) {
        // As Q4_0: the largest-magnitude element maps to -16, the level without a mirror.
        const float d = store_fp16(&b[i].d, signed_absmax(src, kQK5_0) / -16.0f);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[kQK5_0];
        for (int j = 0; j < kQK5_0; j++) q[j] = round_clamp(src[j] * id, -16, 15) + 16;
        pack_q5(q, b[i].qs, b[i].qh);
    }
}

void vec_dot_q5_0(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ5_0* bx = static_cast<const BlockQ5_0*>(x);
    const BlockQ8_0* by = static_cast<const BlockQ8_0*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQK5_0; i++) {
        const uint32_t qh = load_u32_le(bx[i].qh);
        int32_t isum = 0;
        for (int j = 0; j < kQK5_0; j++) isum += (q5_quant(bx[i].qs, qh, j) - 16) * by[i].qs[j];
        sum += static_cast<double>(fp16_to_fp32(bx[i].d)) * fp16_to_fp32(by[i].d) * isum;
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q5_1: x = d * q + m

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
    const BlockQ5_1* b = static_cast<const BlockQ5_1*>(src);
    for (int64_t i = 0; i < n / kQK5_1; i++, dst += kQK5_1) {
        const float d = fp16_to_fp32(b[i].d);
        const float m = fp16_to_fp32(b[i].m);
        const uint32_t qh = load_u32_le(b[i].qh);
        for (int j = 0; j < kQK5_1; j++) {
            dst[j] = static_cast<float>(q5_quant(b[i].qs, qh, j)) * d + m;
        }
    }
}

void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
    BlockQ5_1* b = static_cast<BlockQ5_1*>(dst);
    for (int64_t i = 0; i < n / kQK5_1; i++, src += kQK5_1) {
        float lo = src[0], hi = src[0];
        for (int j = 1; j < kQK5_1; j++) {
            lo = std::min(lo, src[j]);
            hi = std::max(hi, src[j]);
        }
        const float d = store_fp16(&b[i].d, (hi - lo) / 31.0f);
        const float m = store_fp16(&b[i].m, lo);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[kQK5_1];
        for (int j = 0; j < kQK5_1; j++) q[j] = round_clamp((src[j] - m) * id, 0, 31);
        pack_q5(q, b[i].qs, b[i].qh);
    }
}

void vec_dot_q5_1(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ5_1* bx = static_cast<const BlockQ5_1*>(x);
    const BlockQ8_0* by = static_cast<const BlockQ8_0*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQK5_1; i++) {
        const uint32_t qh = load_u32_le(bx[i].qh);
        int32_t isum = 0, ysum = 0;
        for (int j = 0; j < kQK5_1; j++) {
            isum += q5_quant(bx[i].qs, qh, j) * by[i].qs[j];
            ysum += by[i].qs[j];
        }
        const double dy = fp16_to_fp32(by[i].d);
        sum += dy * (static_cast<double>(fp16_to_fp32(bx[i].d)) * isum +
                     static_cast<double>(fp16_to_fp32(bx[i].m)) * ysum);
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q2_K: x = (d * sc) * q - (dmin * mn) per 16-element group

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) {
    const BlockQ2_K* b = static_cast<const BlockQ2_K*>(src);
    uint8_t q[kQK_K];
    for (int64_t i = 0; i < n / kQK_K; i++, dst += kQK_K) {
        unpack_q2_k(b[i], q);
        const float d = fp16_to_fp32(b[i].d);
        const float dmin = fp16_to_fp32(b[i].dmin);
        for (int g = 0; g < 16; g++) {
            const float dl = d * static_cast<float>(b[i].scales[g] & 0x0f);
            const float ml = dmin * static_cast<float>(b[i].scales[g] >> 4);
            for (int l = 0; l < 16; l++)
                dst[16 * g + l] = dl * static_cast<float>(q[16 * g + l]) - ml;
        }
    }
}

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
    BlockQ2_K* b = static_cast<BlockQ2_K*>(dst);
    uint8_t q[kQK_K], sc[16], mn[16];
    for (int64_t i = 0; i < n / kQK_K; i++, src += kQK_K) {
        quantize_affine_groups(src, 16, 16, 3, 15, &b[i].d, &b[i].dmin, sc, mn, q);
        for (int g = 0; g < 16; g++) b[i].scales[g] = static_cast<uint8_t>(sc[g] | (mn[g] << 4));
        std::memset(b[i].qs, 0, sizeof(b[i].qs));
        for (int h = 0; h < 2; h++) {
            for (int s = 0; s < 4; s++) {
                for (int l = 0; l < 32; l++) {
                    b[i].qs[32 * h + l] |= static_cast<uint8_t>(q[128 * h + 32 * s + l] << (2 * s));
                }
            }
        }
    }
}

void vec_dot_q2_k(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ2_K* bx = static_cast<const BlockQ2_K*>(x);
    const BlockQ8_K* by = static_cast<const BlockQ8_K*>(y);
    uint8_t q[kQK_K];
    double sum = 0;
    for (int64_t i = 0; i < n / kQK_K; i++) {
        unpack_q2_k(bx[i], q);
        int64_t isum = 0, imin = 0;
        for (int g = 0; g < 16; g++) {
            int32_t qq = 0, ys = 0;
            for (int l = 0; l < 16; l++) {
                qq += q[16 * g + l] * by[i].qs[16 * g + l];
                ys += by[i].qs[16 * g + l];
            }
            isum += static_cast<int64_t>(bx[i].scales[g] & 0x0f) * qq;
            imin += static_cast<int64_t>(bx[i].scales[g] >> 4) * ys;
        }
        sum += static_cast<double>(by[i].d) *
               (static_cast<double>(fp16_to_fp32(bx[i].d)) * static_cast<double>(isum) -
                static_cast<double>(fp16_to_fp32(bx[i].dmin)) * static_cast<double>(imin));
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// Q3_K: x = (d * sc) * q per 16-element group, sc in [-32, 31], q in [-4, 3]

void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
    const BlockQ3_K* b = static_cast<const BlockQ3_K*>(src);
    int8_t q[kQK_K], sc[16];
    for (int64_t i = 0; i < n / kQK_K; i++, dst += kQK_K) {
        unpack_q3_k(b[i], q, sc);
        const float d = fp16_to_fp32(b[i].d);
        for (int g = 0; g < 16; g++) {
            const float dl = d * static_cast<float>(sc[g]);
            for (int l = 0; l < 16; l++) dst[16 * g + l] = dl * static_cast<float>(q[16 * g + l]);
        }
    }
}

void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
    BlockQ3_K* b = static_cast<BlockQ3_K*>(dst);
    for (int64_t i = 0; i < n / kQK_K; i++, src += kQK_K) {
        float w[kQK_K];
        float gs[16];
        for (int g = 0; g < 16; g++) {
            k_weights(src + 16 * g, 16, w + 16 * g);
            gs[g] = search_scale_symmetric(src + 16 * g, w + 16 * g, 16, 4);
        }
        // The group scale of largest magnitude maps to -32 (as in Q6_K).
        const float d = store_fp16(&b[i].d, signed_absmax(gs, 16) / -32.0f);
        uint8_t u[kQK_K];
        std::memset(u, 4, sizeof(u));  // zero, kept only for non-finite input
        uint8_t sc6[16];
        std::memset(sc6, 32, sizeof(sc6));
        for (int g = 0; g < 16; g++) {
            const float* xg = src + 16 * g;
            const float* wg = w + 16 * g;
            const int s0 = d != 0.0f ? round_clamp(gs[g] / d, -32, 31) : 0;
            double best_err = std::numeric_limits<double>::infinity();
            for (int s = std::max(s0 - 1, -32); s <= std::min(s0 + 1, 31); s++) {
                const float ds = d * static_cast<float>(s);
                uint8_t L[16];
                double err = 0;
                for (int l = 0; l < 16; l++) {
                    const int v = ds != 0.0f ? round_clamp(xg[l] / ds, -4, 3) : 0;
                    L[l] = static_cast<uint8_t>(v + 4);
                    const double diff = static_cast<double>(ds * static_cast<float>(v)) - xg[l];
                    err += wg[l] * diff * diff;
                }
                if (err < best_err) {
                    best_err = err;
                    sc6[g] = static_cast<uint8_t>(s + 32);
                    std::memcpy(u + 16 * g, L, 16);
                }
            }
        }
        std::memset(b[i].scales, 0, sizeof(b[i].scales));
        for (int g = 0; g < 16; g++) {
            if (g < 8) {
                b[i].scales[g] |= static_cast<uint8_t>(sc6[g] & 0x0f);
            } else {
                b[i].scales[g - 8] |= static_cast<uint8_t>((sc6[g] & 0x0f) << 4);
            }
            b[i].scales[8 + g % 4] |= static_cast<uint8_t>((sc6[g] >> 4) << (2 * (g / 4)));
        }
        std::memset(b[i].qs, 0, sizeof(b[i].qs));
        std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
        for (int h = 0; h < 2; h++) {
            for (int s = 0; s < 4; s++) {
                for (int l = 0; l < 32; l++) {
                    const uint8_t v = u[128 * h + 32 * s + l];
                    b[i].qs[32 * h + l] |= static_cast<uint8_t>((v & 3) << (2 * s));
                    b[i].hmask[l] |= static_cast<uint8_t>((v >> 2) << (4 * h + s));
                }
            }
        }
    }
}

void vec_dot_q3_k(int64_t n, float* out, const void* x, const void* y) {
    const BlockQ3_K* bx = static_cast<const BlockQ3_K*>(x);
    const BlockQ8_K* by = static_cast<const BlockQ8_K*>(y);
    int8_t q[kQK_K], sc[16];
    double sum = 0;
    for (int64_t i = 0; i < n / kQK_K; i++) {
        unpack_q3_k(bx[i], q, sc);
        int64_t isum = 0;
        for (int g = 0; g < 16; g++) {
            int32_t qq = 0;
            for (int l = 0; l < 16; l++) qq += q[16 * g + l] * by[i].qs[16 * g + l];
            isum += static_cast<int64_t>(sc[g]) * qq;
        }
        sum += static_cast<double>(fp16_to_fp32(bx[i].d)) * by[i].d * static_cast<double>(isum);
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// IQ4_NL: x = d * kIQ4NLValues[nibble]

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
    const BlockIQ4_NL* b = static_cast<const BlockIQ4_NL*>(src);
    for (int64_t i = 0; i < n / kQK4_NL; i++, dst += kQK4_NL) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQK4_NL; j++) {
            dst[j] = d * static_cast<float>(kIQ4NLValues[nibble(b[i].qs, j)]);
        }
    }
}

void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
    BlockIQ4_NL* b = static_cast<BlockIQ4_NL*>(dst);
    float w[kQK4_NL];
    uint8_t idx[kQK4_NL];
    for (int64_t i = 0; i < n / kQK4_NL; i++, src += kQK4_NL) {
        k_weights(src, kQK4_NL, w);
        const float d = store_fp16(&b[i].d, search_scale_table(src, w, kQK4_NL, kIQ4NLBook));
        quantize_table(src, w, kQK4_NL, kIQ4NLBook, d, idx);
        pack_nibbles(idx, b[i].qs);
    }
}

void vec_dot_iq4_nl(int64_t n, float* out, const void* x, const void* y) {
    const BlockIQ4_NL* bx = static_cast<const BlockIQ4_NL*>(x);
    const BlockQ8_0* by = static_cast<const BlockQ8_0*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQK4_NL; i++) {
        int32_t isum = 0;
        for (int j = 0; j < kQK4_NL; j++) isum += kIQ4NLValues[nibble(bx[i].qs, j)] * by[i].qs[j];
        sum += static_cast<double>(fp16_to_fp32(bx[i].d)) * fp16_to_fp32(by[i].d) * isum;
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// IQ4_XS: x = (d * ls) * kIQ4NLValues[nibble] per 32-element sub-block, ls in [-32, 31]

void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
    const BlockIQ4_XS* b = static_cast<const BlockIQ4_XS*>(src);
    for (int64_t i = 0; i < n / kQK_K; i++, dst += kQK_K) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQK_K / 32; j++) {
            const float dl = d * static_cast<float>(iq4_xs_scale(b[i], j));
            for (int l = 0; l < 32; l++) {
                dst[32 * j + l] =
                    dl * static_cast<float>(kIQ4NLValues[nibble(b[i].qs + 16 * j, l)]);
            }
        }
    }
}

void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
    BlockIQ4_XS* b = static_cast<BlockIQ4_XS*>(dst);
    for (int64_t i = 0; i < n / kQK_K; i++, src += kQK_K) {
        float w[kQK_K];
        float ss[8];
        for (int j = 0; j < 8; j++) {
            k_weights(src + 32 * j, 32, w + 32 * j);
            ss[j] = search_scale_table(src + 32 * j, w + 32 * j, 32, kIQ4NLBook);
        }
        // The sub-block scale of largest magnitude maps to -32.
        const float d = store_fp16(&b[i].d, signed_absmax(ss, 8) / -32.0f);
        b[i].scales_h = 0;
        std::memset(b[i].scales_l, 0, sizeof(b[i].scales_l));
        uint8_t idx[32], best_idx[32];
        for (int j = 0; j < 8; j++) {
            const int s0 = d != 0.0f ? round_clamp(ss[j] / d, -32, 31) : 0;
            double best_err = std::numeric_limits<double>::infinity();
            int best_s = 0;
            for (int s = std::max(s0 - 1, -32); s <= std::min(s0 + 1, 31); s++) {
                const double err = quantize_table(src + 32 * j, w + 32 * j, 32, kIQ4NLBook,
                                                  d * static_cast<float>(s), idx);
                if (err < best_err) {
                    best_err = err;
                    best_s = s;
                    std::memcpy(best_idx, idx, 32);
                }
            }
            if (!(best_err < std::numeric_limits<double>::infinity())) {  // non-finite input
                best_s = 0;
                quantize_table(src + 32 * j, w + 32 * j, 32, kIQ4NLBook, 0.0f, best_idx);
            }
            const int u = best_s + 32;
            b[i].scales_l[j / 2] |= static_cast<uint8_t>((u & 0x0f) << (4 * (j % 2)));
            b[i].scales_h = static_cast<uint16_t>(b[i].scales_h | ((u >> 4) << (2 * j)));
            pack_nibbles(best_idx, b[i].qs + 16 * j);
        }
    }
}

void vec_dot_iq4_xs(int64_t n, float* out, const void* x, const void* y) {
    const BlockIQ4_XS* bx = static_cast<const BlockIQ4_XS*>(x);
    const BlockQ8_K* by = static_cast<const BlockQ8_K*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQK_K; i++) {
        int64_t isum = 0;
        for (int j = 0; j < kQK_K / 32; j++) {
            int32_t qq = 0;
            for (int l = 0; l < 32; l++) {
                qq += kIQ4NLValues[nibble(bx[i].qs + 16 * j, l)] * by[i].qs[32 * j + l];
            }
            isum += static_cast<int64_t>(iq4_xs_scale(bx[i], j)) * qq;
        }
        sum += static_cast<double>(fp16_to_fp32(bx[i].d)) * by[i].d * static_cast<double>(isum);
    }
    *out = static_cast<float>(sum);
}

// =============================================================================================
// MXFP4: x = 2^(e - 128) * kMXFP4Values[nibble]

void dequantize_row_mxfp4(const void* src, float* dst, int64_t n) {
    const BlockMXFP4* b = static_cast<const BlockMXFP4*>(src);
    for (int64_t i = 0; i < n / kQKMXFP4; i++, dst += kQKMXFP4) {
        const float d = e8m0_to_fp32_half(b[i].e);
        for (int j = 0; j < kQKMXFP4; j++) {
            dst[j] = d * static_cast<float>(kMXFP4Values[nibble(b[i].qs, j)]);
        }
    }
}

void quantize_row_mxfp4(const float* src, void* dst, int64_t n) {
    BlockMXFP4* b = static_cast<BlockMXFP4*>(dst);
    float ones[kQKMXFP4];
    std::fill(ones, ones + kQKMXFP4, 1.0f);
    uint8_t idx[kQKMXFP4], best_idx[kQKMXFP4];
    for (int64_t i = 0; i < n / kQKMXFP4; i++, src += kQKMXFP4) {
        const float amax = absmax(src, kQKMXFP4);
        // The exponent that puts amax between 4 and 8 doubled-E2M1 units (the top values are
        // 8 and 12) and the next one up, whichever fits the block better.
        int e0 = 0;
        if (amax > 0.0f) {
            e0 =
                std::isfinite(amax) ? static_cast<int>(std::floor(std::log2(amax))) - 2 + 127 : 254;
            e0 = std::clamp(e0, 0, 254);
        }
        double best_err = std::numeric_limits<double>::infinity();
        int best_e = e0;
        std::memset(best_idx, 0, sizeof(best_idx));
        for (int e = e0; e <= std::min(e0 + 1, 254); e++) {
            const double err = quantize_table(src, ones, kQKMXFP4, kMXFP4Book,
                                              e8m0_to_fp32_half(static_cast<uint8_t>(e)), idx);
            if (err < best_err) {
                best_err = err;
                best_e = e;
                std::memcpy(best_idx, idx, sizeof(idx));
            }
        }
        b[i].e = static_cast<uint8_t>(best_e);
        pack_nibbles(best_idx, b[i].qs);
    }
}

void vec_dot_mxfp4(int64_t n, float* out, const void* x, const void* y) {
    const BlockMXFP4* bx = static_cast<const BlockMXFP4*>(x);
    const BlockQ8_0* by = static_cast<const BlockQ8_0*>(y);
    double sum = 0;
    for (int64_t i = 0; i < n / kQKMXFP4; i++) {
        int32_t isum = 0;
        for (int j = 0; j < kQKMXFP4; j++) isum += kMXFP4Values[nibble(bx[i].qs, j)] * by[i].qs[j];
        sum += static_cast<double>(e8m0_to_fp32_half(bx[i].e)) * fp16_to_fp32(by[i].d) * isum;
    }
    *out = static_cast<float>(sum);
}

}  // namespace ferry::quants
