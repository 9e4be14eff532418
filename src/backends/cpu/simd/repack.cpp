// Repacked Q4_0 weights (layout in simd.h and docs/cpu-repacked-weights.md): the in-place
// repack and its inverse, the activation columns' conversion, and the 8-row tile that serves
// decode (one column) and prefill (columns four at a time) alike.
//
// Arithmetic, per row r and column c, in both the scalar and the AVX2 kernel:
//     isum_b = sum_k u[k] * q[k] - 8 * sum_k q[k]    (exact int32; u the nibble, q the Q8_0 quant)
//     acc    = fma(float(isum_b), d_x[r] * d_y, acc)  over blocks b in order
// so the two kernels give bit-identical results. In AVX2, vpmaddubsw takes the nibbles (0..15)
// against 4 broadcast quants (|q| <= 127): a pair sum is at most 2 * 15 * 127 = 3810, and the 8
// pair sums of one block added in int16 at most 30480 < 32767, so nothing saturates.
#include <cmath>
#include <cstring>

#include "backends/cpu/simd/simd.h"
#include "core/quants.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_REPACK_AVX2 1
#endif
// The AVX-512 builds' Q4_0 direct tiles (direct.cpp) read a column layout of their own and
// are not measured against this layout: those builds keep the GGUF layout by default.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__F16C__)
#define FERRY_REPACK_DIRECT_AVX512 1
#endif

namespace ferry::cpu::simd {
namespace {

constexpr int kR = kRepackRows;
constexpr size_t kBlk = sizeof(BlockQ4_0);            // 18
constexpr size_t kGroupBlk = kR * sizeof(BlockQ4_0);  // 144: one block of 8 rows
constexpr size_t kQsOff = 2 * kR;                     // 16: the quants after the 8 scales

size_t q4_0_group_bytes(int64_t n) {
    return kR * row_size(Type::Q4_0, n);
}

void q4_0_repack(void* x, int64_t n, void* tmp) {
    const size_t rs = row_size(Type::Q4_0, n);
    std::memcpy(tmp, x, kR * rs);
    const auto* src = static_cast<const uint8_t*>(tmp);
    auto* dst = static_cast<uint8_t*>(x);
    for (int64_t b = 0; b < n / 32; b++) {
        uint8_t* g = dst + b * kGroupBlk;
        for (int r = 0; r < kR; r++) {
            const uint8_t* blk = src + r * rs + b * kBlk;
            std::memcpy(g + 2 * r, blk, 2);
            for (int v = 0; v < 4; v++)
                std::memcpy(g + kQsOff + 32 * v + 4 * r, blk + 2 + 4 * v, 4);
        }
    }
}

void q4_0_unpack_row(const void* gp, int64_t n, int r, void* out) {
    const auto* g = static_cast<const uint8_t*>(gp);
    auto* o = static_cast<uint8_t*>(out);
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t* gb = g + b * kGroupBlk;
        uint8_t* blk = o + b * kBlk;
        std::memcpy(blk, gb + 2 * r, 2);
        for (int v = 0; v < 4; v++) std::memcpy(blk + 2 + 4 * v, gb + kQsOff + 32 * v + 4 * r, 4);
    }
}

// Columns: [float d, int32 -8 * sum q] per block, then the Q8_0 blocks.
size_t col_extras(int64_t n) {
    return static_cast<size_t>(n / 32) * 8;
}
size_t q4_0_b_bytes(int64_t n) {
    return col_extras(n) + row_size(Type::Q8_0, n);
}

void q4_0_quantize_b(const float* x, void* y, int64_t n) {
    auto* base = static_cast<uint8_t*>(y);
    uint8_t* q = base + col_extras(n);
    quantize_row_q8_0(x, q, n);
    for (int64_t b = 0; b < n / 32; b++) {
        const auto* blk = reinterpret_cast<const BlockQ8_0*>(q + b * sizeof(BlockQ8_0));
        fp16_t h;
        std::memcpy(&h, &blk->d, 2);
        const float d = fp16_to_fp32(h);
        int32_t sum = 0;
        for (int l = 0; l < 32; l++) sum += blk->qs[l];
        const int32_t off = -8 * sum;
        std::memcpy(base + 8 * b, &d, 4);
        std::memcpy(base + 8 * b + 4, &off, 4);
    }
}

struct ColBlock {
    float d;
    int32_t off;
    const int8_t* qs;
};

inline ColBlock col_block(const uint8_t* yc, int64_t n, int64_t b) {
    ColBlock cb;
    std::memcpy(&cb.d, yc + 8 * b, 4);
    std::memcpy(&cb.off, yc + 8 * b + 4, 4);
    cb.qs = reinterpret_cast<const BlockQ8_0*>(yc + col_extras(n) + b * sizeof(BlockQ8_0))->qs;
    return cb;
}

void q4_0_tile_scalar(int64_t n, const void* gp, const void* yp, size_t by, int nc, float* out,
                      size_t ldo) {
    const auto* g = static_cast<const uint8_t*>(gp);
    for (int c = 0; c < nc; c++) {
        const uint8_t* yc = static_cast<const uint8_t*>(yp) + c * by;
        for (int r = 0; r < kR; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < n / 32; b++) {
                const uint8_t* gb = g + b * kGroupBlk;
                const ColBlock y = col_block(yc, n, b);
                int32_t isum = y.off;
                for (int v = 0; v < 4; v++) {
                    for (int i = 0; i < 4; i++) {
                        const uint8_t byte = gb[kQsOff + 32 * v + 4 * r + i];
                        isum +=
                            (byte & 0x0f) * y.qs[4 * v + i] + (byte >> 4) * y.qs[16 + 4 * v + i];
                    }
                }
                fp16_t h;
                std::memcpy(&h, gb + 2 * r, 2);
                acc = std::fma(static_cast<float>(isum), fp16_to_fp32(h) * y.d, acc);
            }
            out[c * ldo + r] = acc;
        }
    }
}

#if FERRY_REPACK_AVX2

inline int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

template <int NC>
void q4_0_tile_avx2_n(int64_t n, const uint8_t* g, const uint8_t* y, size_t by, float* out,
                      size_t ldo) {
    const int64_t nb = n / 32;
    const size_t qoff = col_extras(n) + 2;  // the first quant of a column's Q8_0 blocks
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 acc[NC];
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* gb = g + b * kGroupBlk;
        __m256i p[NC];
        for (int v = 0; v < 4; v++) {
            const __m256i w =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kQsOff + 32 * v));
            const __m256i lo = _mm256_and_si256(w, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
            for (int c = 0; c < NC; c++) {
                const uint8_t* yq = y + c * by + qoff + b * sizeof(BlockQ8_0);
                const __m256i s = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(yq + 4 * v))),
                    _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(yq + 16 + 4 * v))));
                p[c] = v == 0 ? s : _mm256_add_epi16(p[c], s);
            }
        }
        const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb)));
        for (int c = 0; c < NC; c++) {
            const uint8_t* ye = y + c * by + 8 * b;
            const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(p[c], ones16),
                                                  _mm256_set1_epi32(load_i32(ye + 4)));
            float dy;
            std::memcpy(&dy, ye, 4);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                                     _mm256_mul_ps(dx, _mm256_set1_ps(dy)), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * ldo, acc[c]);
}

void q4_0_tile_avx2(int64_t n, const void* g, const void* y, size_t by, int nc, float* out,
                    size_t ldo) {
    using Fn = void (*)(int64_t, const uint8_t*, const uint8_t*, size_t, float*, size_t);
    static constexpr Fn table[4] = {q4_0_tile_avx2_n<1>, q4_0_tile_avx2_n<2>, q4_0_tile_avx2_n<3>,
                                    q4_0_tile_avx2_n<4>};
    table[nc - 1](n, static_cast<const uint8_t*>(g), static_cast<const uint8_t*>(y), by, out, ldo);
}

#endif  // FERRY_REPACK_AVX2

RepackedKernels make_q4_0(bool portable) {
    // The tail rows' direct tile must read plain Q8_0 blocks: the fast one where the fast
    // Q4_0 kernels quantize b to Q8_0 (AVX2, scalar builds), else the portable one.
    const MatKernels& fast = mat_kernels(Type::Q4_0, false);
    const MatKernels& port = mat_kernels(Type::Q4_0, true);
    const bool fast_reads_q8_0 = fast.quantize_b == port.quantize_b;
    RepackedKernels k{};
    k.type = Type::Q4_0;
    k.group_bytes = q4_0_group_bytes;
    k.repack = q4_0_repack;
    k.unpack_row = q4_0_unpack_row;
    k.quantize_b = q4_0_quantize_b;
    k.b_bytes = q4_0_b_bytes;
    k.direct_b_offset = col_extras;
    k.tile = q4_0_tile_scalar;
    k.direct = (!portable && fast_reads_q8_0) ? fast.direct : port.direct;
#if FERRY_REPACK_AVX2
    if (!portable) k.tile = q4_0_tile_avx2;
#endif
    return k;
}

}  // namespace

const RepackedKernels* repacked_kernels(Type t, bool portable) {
    if (t != Type::Q4_0) return nullptr;
    static const RepackedKernels fast = make_q4_0(false);
    static const RepackedKernels port = make_q4_0(true);
    return portable ? &port : &fast;
}

bool repack_by_default(Type t) {
#if FERRY_REPACK_AVX2 && !FERRY_REPACK_DIRECT_AVX512
    return repacked_kernels(t) != nullptr;
#else
    (void)t;
    return false;
#endif
}

}  // namespace ferry::cpu::simd
