// Helpers shared by the CPU op kernels (not MUL_MAT): per-thread scratch, a vectorizable exp,
// row conversions between F32/F16/BF16, and dot/axpy loops for the attention kernel.
//
// Everything here is branch-free straight-line code over contiguous arrays so that the
// compiler vectorizes it (-O3 -march=native), with explicit AVX-512 / F16C paths where the
// compiler cannot reorder a reduction by itself. Results depend only on the inputs, never on
// the thread that computes them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "backends/cpu/ops/ops.h"
#include "ferry/types.h"

namespace ferry::cpu::kern {

constexpr size_t kCacheLine = 64;

inline size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

// Scratch layout: thread ith owns bytes [ith * per, (ith + 1) * per), per rounded up to a
// cache line so threads never share a line.
inline size_t per_thread_bytes(size_t bytes) {
    return align_up(bytes, kCacheLine);
}
inline size_t scratch_size(size_t bytes_per_thread, int n_threads) {
    return per_thread_bytes(bytes_per_thread) * static_cast<size_t>(n_threads);
}
inline void* thread_scratch(const ComputeParams& p, size_t bytes_per_thread) {
    return static_cast<uint8_t*>(p.wdata) +
           per_thread_bytes(bytes_per_thread) * static_cast<size_t>(p.ith);
}

// Byte address of element (i0, i1, i2, i3) of t.
inline uint8_t* at(const Tensor* t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return static_cast<uint8_t*>(t->data) + static_cast<size_t>(i0) * t->nb[0] +
           static_cast<size_t>(i1) * t->nb[1] + static_cast<size_t>(i2) * t->nb[2] +
           static_cast<size_t>(i3) * t->nb[3];
}
// Address of row (i1, i2, i3).
inline uint8_t* row(const Tensor* t, int64_t i1, int64_t i2, int64_t i3) {
    return static_cast<uint8_t*>(t->data) + static_cast<size_t>(i1) * t->nb[1] +
           static_cast<size_t>(i2) * t->nb[2] + static_cast<size_t>(i3) * t->nb[3];
}

// exp(x) in float, accurate to about 1 ulp, written without branches so loops calling it
// vectorize. Range reduction x = n ln2 + r (Cody-Waite split of ln2), |r| <= ln2 / 2, then a
// degree-7 Taylor polynomial (truncation error < 6e-9 relative). 2^n is applied in two halves
// so that n in [-159, 129] never leaves the normal exponent range: exp(-inf) = 0 exactly,
// exp(x > 88.73) = inf, NaN propagates.
inline float exp_f32(float x) {
    const float xc = x < -110.0f ? -110.0f : (x > 89.0f ? 89.0f : x);
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kLn2Hi = 0.693145751953125f;  // ln2 high bits (exact times small n)
    constexpr float kLn2Lo = 1.42860682030941723e-6f;
    constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float t = xc * kLog2e + kShift;
    const float n = t - kShift;
    const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
    const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t n1 = ni >> 1;
    const int32_t n2 = ni - n1;
    const float s1 = std::bit_cast<float>((n1 + 127) << 23);
    const float s2 = std::bit_cast<float>((n2 + 127) << 23);
    const float y = p * s1 * s2;
    return x != x ? x : y;
}

// 1 / (1 + exp(-x)) without cancellation at either end.
inline float sigmoid_f32(float x) {
    return 1.0f / (1.0f + exp_f32(-x));
}

// fp32_to_bf16 of ferry/types.h (round to nearest even, quiet NaN), inline for vectorization.
inline bf16_t f32_to_bf16(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    const uint32_t nan = (u >> 16) | 64u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<bf16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#if defined(__AVX512F__)
// GCC 12 reports its own _mm512_undefined_ps() inside _mm512_cvtph_ps and the reduction
// intrinsics as maybe-uninitialized; these spellings avoid the placeholder operand.
inline __m512 cvtph_ps(const fp16_t* p) {
    return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// Fixed tree: 16 -> 8 -> 4 -> 2 -> 1 lanes.
inline float hsum512(__m512 v) {
    // (masked forms: GCC 12 warns about the placeholder operand of the unmasked ones)
    const __m512 s8 = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(0xffff, v, v, 0x4e));
    const __m512 s4x = _mm512_add_ps(s8, _mm512_maskz_shuffle_f32x4(0xffff, s8, s8, 0xb1));
    const __m128 s4 = _mm512_maskz_extractf32x4_ps(0xf, s4x, 0);
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// AVX2 machines (Zen 3): 256-bit paths next to the AVX-512 ones.
#define FERRY_KERN_AVX2 1
inline __m256 cvtph8_ps(const fp16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// Fixed tree: 8 -> 4 -> 2 -> 1 lanes.
inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

// Maximum of n floats, NaN ignored; -inf for n == 0 or all NaN.
inline float row_max(const float* x, int64_t n) {
    float m = -__builtin_inff();
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16)
        vm = _mm512_maskz_max_ps(0xffff, _mm512_loadu_ps(x + i), vm);  // NaN: vm
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, vm);
    for (int j = 0; j < 16; j++) m = lanes[j] > m ? lanes[j] : m;
#elif FERRY_KERN_AVX2
    __m256 vm = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(_mm256_loadu_ps(x + i), vm);  // NaN: vm
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vm);
    for (int j = 0; j < 8; j++) m = lanes[j] > m ? lanes[j] : m;
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

// --- row conversions (n elements, contiguous) ---

inline void f16_to_f32_row(const fp16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(dst + i, cvtph_ps(src + i));
    }
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) dst[i] = fp16_to_fp32(src[i]);
}

// Round to nearest even, as fp32_to_fp16 (NaN payloads may differ).
inline void f32_to_f16_row(const float* src, fp16_t* dst, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        const __m256i h =
            _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
    }
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
#endif
    for (; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
}

inline void bf16_to_f32_row(const bf16_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        dst[i] = std::bit_cast<float>(static_cast<uint32_t>(src[i]) << 16);
    }
}

inline void f32_to_bf16_row(const float* src, bf16_t* dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

// One contiguous row of n elements of any type with a float conversion into F32, and back;
// F16/BF16 take the vectorized paths above, block formats their traits' conversions.
inline void row_to_f32(Type t, const void* src, float* dst, int64_t n) {
    switch (t) {
        case Type::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            return;
        case Type::F16:
            f16_to_f32_row(static_cast<const fp16_t*>(src), dst, n);
            return;
        case Type::BF16:
            bf16_to_f32_row(static_cast<const bf16_t*>(src), dst, n);
            return;
        default:
            type_traits(t).to_float(src, dst, n);
            return;
    }
}

inline void row_from_f32(Type t, const float* src, void* dst, int64_t n) {
    switch (t) {
        case Type::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            return;
        case Type::F16:
            f32_to_f16_row(src, static_cast<fp16_t*>(dst), n);
            return;
        case Type::BF16:
            f32_to_bf16_row(src, static_cast<bf16_t*>(dst), n);
            return;
        default:
            type_traits(t).from_float(src, dst, n);
            return;
    }
}

// --- attention helpers: dot products and acc += w * v for F32/F16/BF16 rows ---
// Fixed accumulation order (lane-wise partial sums, then a fixed tree), so results are
// reproducible for a given build.

inline float dot_f32(const float* x, const float* y, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), a1);
    }
    for (; i + 16 <= n; i += 16) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), a0);
    }
    s = hsum512(_mm512_add_ps(a0, a1));
#elif FERRY_KERN_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    }
    s = hsum256(_mm256_add_ps(a0, a1));
#else
    float acc[8] = {};
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) acc[j] += x[i + j] * y[i + j];
    }
    for (int j = 0; j < 8; j++) s += acc[j];
#endif
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}

inline float dot_f16_f32(const fp16_t* x, const float* y, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        const __m512 x0 = cvtph_ps(x + i);
        const __m512 x1 = cvtph_ps(x + i + 16);
        a0 = _mm512_fmadd_ps(x0, _mm512_loadu_ps(y + i), a0);
        a1 = _mm512_fmadd_ps(x1, _mm512_loadu_ps(y + i + 16), a1);
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 x0 = cvtph_ps(x + i);
        a0 = _mm512_fmadd_ps(x0, _mm512_loadu_ps(y + i), a0);
    }
    s = hsum512(_mm512_add_ps(a0, a1));
#elif FERRY_KERN_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(cvtph8_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(cvtph8_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(cvtph8_ps(x + i), _mm256_loadu_ps(y + i), a0);
    s = hsum256(_mm256_add_ps(a0, a1));
#else
    float acc[8] = {};
    float tmp[8];
    for (; i + 8 <= n; i += 8) {
        f16_to_f32_row(x + i, tmp, 8);
        for (int j = 0; j < 8; j++) acc[j] += tmp[j] * y[i + j];
    }
    for (int j = 0; j < 8; j++) s += acc[j];
#endif
    for (; i < n; i++) s += fp16_to_fp32(x[i]) * y[i];
    return s;
}

inline float dot_bf16_f32(const bf16_t* x, const float* y, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
    float acc[16] = {};
    for (; i + 16 <= n; i += 16) {
        for (int j = 0; j < 16; j++) {
            acc[j] += std::bit_cast<float>(static_cast<uint32_t>(x[i + j]) << 16) * y[i + j];
        }
    }
    for (int j = 0; j < 16; j++) s += acc[j];
    for (; i < n; i++) s += bf16_to_fp32(x[i]) * y[i];
    return s;
}

// acc[i] += w * v[i]
inline void axpy_f32(float* acc, float w, const float* v, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 vw = _mm512_set1_ps(w);
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(acc + i,
                         _mm512_fmadd_ps(vw, _mm512_loadu_ps(v + i), _mm512_loadu_ps(acc + i)));
    }
#elif FERRY_KERN_AVX2
    const __m256 vw = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(acc + i,
                         _mm256_fmadd_ps(vw, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
    }
#endif
    for (; i < n; i++) acc[i] += w * v[i];
}

inline void axpy_f16(float* acc, float w, const fp16_t* v, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 vw = _mm512_set1_ps(w);
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(vw, cvtph_ps(v + i), _mm512_loadu_ps(acc + i)));
    }
#elif FERRY_KERN_AVX2
    const __m256 vw = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, cvtph8_ps(v + i), _mm256_loadu_ps(acc + i)));
    }
#endif
    for (; i < n; i++) acc[i] += w * fp16_to_fp32(v[i]);
}

// Four consecutive axpy_* calls fused: acc is loaded and stored once per 16 lanes. Each lane
// sees the same chain of fused multiply-adds as four separate calls, so the result is
// bit-identical to calling axpy_* four times.
inline void axpy4_f16(float* acc, const float* w, const fp16_t* const* v, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 w0 = _mm512_set1_ps(w[0]), w1 = _mm512_set1_ps(w[1]);
    const __m512 w2 = _mm512_set1_ps(w[2]), w3 = _mm512_set1_ps(w[3]);
    for (; i + 16 <= n; i += 16) {
        __m512 a = _mm512_loadu_ps(acc + i);
        a = _mm512_fmadd_ps(w0, cvtph_ps(v[0] + i), a);
        a = _mm512_fmadd_ps(w1, cvtph_ps(v[1] + i), a);
        a = _mm512_fmadd_ps(w2, cvtph_ps(v[2] + i), a);
        a = _mm512_fmadd_ps(w3, cvtph_ps(v[3] + i), a);
        _mm512_storeu_ps(acc + i, a);
    }
#elif FERRY_KERN_AVX2
    const __m256 w0 = _mm256_set1_ps(w[0]), w1 = _mm256_set1_ps(w[1]);
    const __m256 w2 = _mm256_set1_ps(w[2]), w3 = _mm256_set1_ps(w[3]);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i);
        a = _mm256_fmadd_ps(w0, cvtph8_ps(v[0] + i), a);
        a = _mm256_fmadd_ps(w1, cvtph8_ps(v[1] + i), a);
        a = _mm256_fmadd_ps(w2, cvtph8_ps(v[2] + i), a);
        a = _mm256_fmadd_ps(w3, cvtph8_ps(v[3] + i), a);
        _mm256_storeu_ps(acc + i, a);
    }
#endif
    for (int r = 0; r < 4; r++) {
        for (int64_t j = i; j < n; j++) acc[j] += w[r] * fp16_to_fp32(v[r][j]);
    }
}

inline void axpy4_f32(float* acc, const float* w, const float* const* v, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 w0 = _mm512_set1_ps(w[0]), w1 = _mm512_set1_ps(w[1]);
    const __m512 w2 = _mm512_set1_ps(w[2]), w3 = _mm512_set1_ps(w[3]);
    for (; i + 16 <= n; i += 16) {
        __m512 a = _mm512_loadu_ps(acc + i);
        a = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v[0] + i), a);
        a = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v[1] + i), a);
        a = _mm512_fmadd_ps(w2, _mm512_loadu_ps(v[2] + i), a);
        a = _mm512_fmadd_ps(w3, _mm512_loadu_ps(v[3] + i), a);
        _mm512_storeu_ps(acc + i, a);
    }
#elif FERRY_KERN_AVX2
    const __m256 w0 = _mm256_set1_ps(w[0]), w1 = _mm256_set1_ps(w[1]);
    const __m256 w2 = _mm256_set1_ps(w[2]), w3 = _mm256_set1_ps(w[3]);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i);
        a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v[0] + i), a);
        a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v[1] + i), a);
        a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(v[2] + i), a);
        a = _mm256_fmadd_ps(w3, _mm256_loadu_ps(v[3] + i), a);
        _mm256_storeu_ps(acc + i, a);
    }
#endif
    for (int r = 0; r < 4; r++) {
        for (int64_t j = i; j < n; j++) acc[j] += w[r] * v[r][j];
    }
}

inline void axpy_bf16(float* acc, float w, const bf16_t* v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        acc[i] += w * std::bit_cast<float>(static_cast<uint32_t>(v[i]) << 16);
    }
}

}  // namespace ferry::cpu::kern
