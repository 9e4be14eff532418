// Quantizers for MUL_MAT's activation operand. They must reproduce the reference blocks exactly
// (tests compare them byte for byte), so they follow the reference arithmetic step by step:
//   Q8_0: d = fp16(absmax / 127), q = clamp(rint(x * (1 / d)), -127, 127)
//   Q8_K: d = absmax / 127 (float), q = clamp(rint(x / d), -127, 127), bsums per 16
// NaN inputs are skipped by absmax and quantize to -127, as in the reference.
#include <cstring>

#include "backends/cpu/simd/simd.h"
#include "core/quants.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_QUANT_AVX512 1
#elif defined(__AVX2__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_QUANT_AVX2 1
#endif

namespace ferry::cpu::simd {

#if FERRY_QUANT_AVX512
namespace {

// max(m, |x|) per lane, keeping m where x is NaN (max_ps returns its second operand then).
inline __m512 absmax_step(__m512 m, __m512 x) {
    return _mm512_max_ps(_mm512_abs_ps(x), m);
}

// Rounds v (any float, NaN included) as the reference's round_clamp(v, -127, 127); returns
// int32 lanes.
inline __m512i round_clamp127(__m512 v) {
    v = _mm512_max_ps(v, _mm512_set1_ps(-127.0f));  // NaN -> -127 (second operand)
    v = _mm512_min_ps(v, _mm512_set1_ps(127.0f));
    return _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

}  // namespace
#endif

#if FERRY_QUANT_AVX2
namespace {

// max(m, |x|) per lane, keeping m where x is NaN (max_ps returns its second operand then).
inline __m256 absmax_step(__m256 m, __m256 x) {
    return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), m);
}

inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// As round_clamp(v, -127, 127) of the reference, NaN included; int32 lanes. cvtps rounds to
// nearest even under the default MXCSR, as lrint does.
inline __m256i round_clamp127(__m256 v) {
    v = _mm256_max_ps(v, _mm256_set1_ps(-127.0f));  // NaN -> -127 (second operand)
    v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(v);
}

// Four vectors of 8 int32 in [-127, 127] -> 32 int8 in order.
inline __m256i pack32(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace
#endif

void quantize_row_q8_0(const float* x, void* y, int64_t n) {
#if FERRY_QUANT_AVX512
    BlockQ8_0* b = static_cast<BlockQ8_0*>(y);
    for (int64_t i = 0; i < n / kQK8_0; i++, x += kQK8_0) {
        const __m512 x0 = _mm512_loadu_ps(x);
        const __m512 x1 = _mm512_loadu_ps(x + 16);
        const float amax =
            _mm512_reduce_max_ps(absmax_step(absmax_step(_mm512_setzero_ps(), x0), x1));
        const fp16_t dh = static_cast<fp16_t>(_cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT));
        b[i].d = dh;
        const float d = _cvtsh_ss(dh);
        const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        const __m512i q0 = round_clamp127(_mm512_mul_ps(x0, id));
        const __m512i q1 = round_clamp127(_mm512_mul_ps(x1, id));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16), _mm512_cvtepi32_epi8(q1));
    }
#elif FERRY_QUANT_AVX2
    BlockQ8_0* b = static_cast<BlockQ8_0*>(y);
    for (int64_t i = 0; i < n / kQK8_0; i++, x += kQK8_0) {
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            m = absmax_step(m, v[j]);
        }
        const float amax = hmax(m);
        const fp16_t dh = static_cast<fp16_t>(_cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT));
        b[i].d = dh;
        const float d = _cvtsh_ss(dh);
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = round_clamp127(_mm256_mul_ps(v[j], id));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs), pack32(q[0], q[1], q[2], q[3]));
    }
#else
    quants::quantize_row_q8_0(x, y, n);
#endif
}

void quantize_row_q8_k(const float* x, void* y, int64_t n) {
#if FERRY_QUANT_AVX512
    BlockQ8_K* b = static_cast<BlockQ8_K*>(y);
    for (int64_t i = 0; i < n / kQK_K; i++, x += kQK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < kQK_K; j += 16) m = absmax_step(m, _mm512_loadu_ps(x + j));
        const float d = _mm512_reduce_max_ps(m) / 127.0f;
        b[i].d = d;
        const __m512 vd = _mm512_set1_ps(d);
        for (int j = 0; j < kQK_K; j += 16) {
            // Divide, as the reference does (1 / d overflows for subnormal d).
            const __m512i q = d != 0.0f ? round_clamp127(_mm512_div_ps(_mm512_loadu_ps(x + j), vd))
                                        : _mm512_setzero_si512();
            _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + j), _mm512_cvtepi32_epi8(q));
            b[i].bsums[j / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
        }
    }
#elif FERRY_QUANT_AVX2
    BlockQ8_K* b = static_cast<BlockQ8_K*>(y);
    for (int64_t i = 0; i < n / kQK_K; i++, x += kQK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < kQK_K; j += 8) m = absmax_step(m, _mm256_loadu_ps(x + j));
        const float d = hmax(m) / 127.0f;
        b[i].d = d;
        const __m256 vd = _mm256_set1_ps(d);
        for (int j = 0; j < kQK_K; j += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                // Divide, as the reference does (1 / d overflows for subnormal d).
                q[k] = d != 0.0f ? round_clamp127(_mm256_div_ps(_mm256_loadu_ps(x + j + 8 * k), vd))
                                 : _mm256_setzero_si256();
            }
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs + j),
                                pack32(q[0], q[1], q[2], q[3]));
            // Sums of elements j..j+15 and j+16..j+31.
            const __m256i h =
                _mm256_hadd_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            s = _mm_hadd_epi32(s, s);
            b[i].bsums[j / 16] = static_cast<int16_t>(_mm_cvtsi128_si32(s));
            b[i].bsums[j / 16 + 1] = static_cast<int16_t>(_mm_extract_epi32(s, 1));
        }
    }
#else
    quants::quantize_row_q8_k(x, y, n);
#endif
}

}  // namespace ferry::cpu::simd
