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
#else
    quants::quantize_row_q8_k(x, y, n);
#endif
}

}  // namespace ferry::cpu::simd
