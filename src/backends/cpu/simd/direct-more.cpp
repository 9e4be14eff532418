// Direct MUL_MAT tiles for the types llama.cpp's presets fall back to and the non-linear / MX
// formats: Q5_0, Q5_1, IQ4_NL and MXFP4 weights against Q8_0 columns; Q2_K, Q3_K and IQ4_XS
// weights against Q8_K columns. Up to 4 weight rows x 4 columns per call.
//
// These types have no packed (prefill) path: the direct tiles serve every column count.
//
// AVX2 (with FMA and F16C): each weight block is decoded once per row into 32-byte vectors of
// 8-bit quants in element order, then multiplied with every column's Q8 quants by
// vpmaddubsw (unsigned x signed bytes to 16-bit pair sums) and vpmaddwd (to 32-bit, weighted
// by the group scales where the format has them). Signed weight quants enter vpmaddubsw as
// |x| against sign(x) * y; the Q8 quantizers clamp to [-127, 127], so no operand is -128 and
// no pair sum saturates (at most 2 * 128 * 127 < 32767). Everything per block stays integer until
// one conversion and one FMA per block (Q8_0 partners) or super-block (Q8_K partners). Each
// output's sequence of operations is the same whatever nr and nc are.
#include <cstring>

#include "backends/cpu/simd/simd.h"
#include "core/quants.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_MORE_AVX2 1
#endif

namespace ferry::cpu::simd {

// Kernels for the types of this file; nullptr for any other type.
const MatKernels* more_mat_kernels(Type t, bool portable);

namespace {

// Portable tile: the reference dot for every output.
template <Type T>
void tile_scalar(int64_t n, const void* x, size_t bx, int nr, const void* y, size_t by, int nc,
                 float* out, size_t ldo) {
    const VecDotFn dot = type_traits(T).vec_dot;
    const auto* xb = static_cast<const uint8_t*>(x);
    const auto* yb = static_cast<const uint8_t*>(y);
    for (int c = 0; c < nc; c++) {
        for (int r = 0; r < nr; r++) dot(n, &out[c * ldo + r], xb + r * bx, yb + c * by);
    }
}

#if FERRY_MORE_AVX2

template <template <int, int> class K>
void dispatch(int64_t n, const void* x, size_t bx, int nr, const void* y, size_t by, int nc,
              float* out, size_t ldo) {
    using Fn = void (*)(int64_t, const uint8_t*, size_t, const uint8_t*, size_t, float*, size_t);
    static constexpr Fn table[4][4] = {
        {K<1, 1>::run, K<1, 2>::run, K<1, 3>::run, K<1, 4>::run},
        {K<2, 1>::run, K<2, 2>::run, K<2, 3>::run, K<2, 4>::run},
        {K<3, 1>::run, K<3, 2>::run, K<3, 3>::run, K<3, 4>::run},
        {K<4, 1>::run, K<4, 2>::run, K<4, 3>::run, K<4, 4>::run},
    };
    table[nr - 1][nc - 1](n, static_cast<const uint8_t*>(x), bx, static_cast<const uint8_t*>(y), by,
                          out, ldo);
}

inline float h2f(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

inline __m256i load32(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 16 bytes of Q4_0-layout nibbles -> 32 bytes in element order (low nibbles, then high).
inline __m256i nibbles(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// Byte e of the result is 0xff where bit e of x is set.
inline __m256i bits_to_bytes(uint32_t x) {
    // Byte e takes byte e / 8 of x (the shuffle indexes within each 128-bit lane, and each
    // lane holds x in its first 4 bytes), then tests bit e % 8.
    const __m256i idx =
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), idx);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// 16-bit pair sums of x * y for signed x (|x| <= 128) and y in [-127, 127].
inline __m256i mul_signed(__m256i x, __m256i y) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

inline __m256i ones16() {
    return _mm256_set1_epi16(1);
}

// Software prefetch of the weight rows two tiles ahead (the rows r + 2 * NR), one cache line
// per 64 bytes consumed, into L2: a direct tile streams NR rows at once, more misses than the
// hardware prefetcher keeps in flight (direct.cpp measured the same: single-core Q8_0 decode
// 10 -> 18 GB/s).
inline void prefetch_rows_ahead(const uint8_t* p, size_t dist) {
    _mm_prefetch(reinterpret_cast<const char*>(p + dist), _MM_HINT_T1);
}

inline __m256i table16(const int8_t* v) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)));
}

// ---------------------------------------------------------------------------------------------
// 32-element blocks against Q8_0 columns. A decoder gives a block's quants (signed, or
// unsigned for a format with a min), its scale and, for Q5_1, its min.

struct DecQ5_0 {
    static constexpr size_t kBytes = sizeof(BlockQ5_0);
    static constexpr bool kMin = false;
    // Quants as stored, u = q + 16 in [0, 31]: the tile multiplies them unsigned and takes
    // 16 * (y0 + y1) off each pair sum (exact in 16 bits: 2 * 31 * 127 < 32767).
    static constexpr int kOffset = 16;
    static __m256i quants(const uint8_t* b) {
        uint32_t qh;
        std::memcpy(&qh, b + 2, 4);
        const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(nibbles(b + 6), hi);
    }
    static float scale(const uint8_t* b) { return h2f(b); }
    static float min(const uint8_t*) { return 0.0f; }
};
struct DecQ5_1 {
    static constexpr size_t kBytes = sizeof(BlockQ5_1);
    static constexpr int kOffset = 0;   // quants signed (or unsigned with a min)
    static constexpr bool kMin = true;  // quants unsigned, x = d * q + m
    static __m256i quants(const uint8_t* b) {
        uint32_t qh;
        std::memcpy(&qh, b + 4, 4);
        const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(nibbles(b + 8), hi);
    }
    static float scale(const uint8_t* b) { return h2f(b); }
    static float min(const uint8_t* b) { return h2f(b + 2); }
};
struct DecIQ4_NL {
    static constexpr size_t kBytes = sizeof(BlockIQ4_NL);
    static constexpr int kOffset = 0;  // quants signed (or unsigned with a min)
    static constexpr bool kMin = false;
    static __m256i quants(const uint8_t* b) {
        return _mm256_shuffle_epi8(table16(kIQ4NLValues), nibbles(b + 2));
    }
    static float scale(const uint8_t* b) { return h2f(b); }
    static float min(const uint8_t*) { return 0.0f; }
};
struct DecMXFP4 {
    static constexpr size_t kBytes = sizeof(BlockMXFP4);
    static constexpr int kOffset = 0;  // quants signed (or unsigned with a min)
    static constexpr bool kMin = false;
    static __m256i quants(const uint8_t* b) {
        return _mm256_shuffle_epi8(table16(kMXFP4Values), nibbles(b + 1));
    }
    static float scale(const uint8_t* b) { return e8m0_to_fp32_half(b[0]); }
    static float min(const uint8_t*) { return 0.0f; }
};

template <class D>
struct Tile32 {
    template <int NR, int NC>
    struct K {
        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m256 acc[NR][NC];
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();
            const int64_t nb = n / 32;
            for (int64_t i = 0; i < nb; i++) {
                __m256i yq[NC];
                __m256 ysum[NC];
                float dy[NC];
                __m256i yoff[NC];
                for (int c = 0; c < NC; c++) {
                    const uint8_t* yb = y + c * by + static_cast<size_t>(i) * sizeof(BlockQ8_0);
                    dy[c] = h2f(yb);
                    yq[c] = load32(yb + 2);
                    if constexpr (D::kOffset != 0) {
                        yoff[c] = _mm256_maddubs_epi16(_mm256_set1_epi8(D::kOffset), yq[c]);
                    }
                    if constexpr (D::kMin) {
                        ysum[c] = _mm256_cvtepi32_ps(_mm256_madd_epi16(
                            _mm256_maddubs_epi16(_mm256_set1_epi8(1), yq[c]), ones16()));
                    }
                }
                for (int r = 0; r < NR; r++) {
                    const uint8_t* xb = x + r * bx + static_cast<size_t>(i) * D::kBytes;
                    if (D::kBytes * static_cast<size_t>(i) % 64 < D::kBytes) {
                        prefetch_rows_ahead(xb, 2 * NR * bx);
                    }
                    const __m256i xq = D::quants(xb);
                    const float dx = D::scale(xb);
                    for (int c = 0; c < NC; c++) {
                        __m256i p16;
                        if constexpr (D::kOffset != 0) {
                            p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(xq, yq[c]), yoff[c]);
                        } else if constexpr (D::kMin) {
                            p16 = _mm256_maddubs_epi16(xq, yq[c]);
                        } else {
                            p16 = mul_signed(xq, yq[c]);
                        }
                        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones16()));
                        acc[r][c] = _mm256_fmadd_ps(p, _mm256_set1_ps(dx * dy[c]), acc[r][c]);
                        if constexpr (D::kMin) {
                            acc[r][c] = _mm256_fmadd_ps(ysum[c], _mm256_set1_ps(D::min(xb) * dy[c]),
                                                        acc[r][c]);
                        }
                    }
                }
            }
            for (int c = 0; c < NC; c++)
                for (int r = 0; r < NR; r++) out[c * ldo + r] = hsum(acc[r][c]);
        }
    };
};

template <int NR, int NC>
using Q5_0Tile = Tile32<DecQ5_0>::K<NR, NC>;
template <int NR, int NC>
using Q5_1Tile = Tile32<DecQ5_1>::K<NR, NC>;
template <int NR, int NC>
using IQ4_NLTile = Tile32<DecIQ4_NL>::K<NR, NC>;
template <int NR, int NC>
using MXFP4Tile = Tile32<DecMXFP4>::K<NR, NC>;

// ---------------------------------------------------------------------------------------------
// 256-element super-blocks against Q8_K columns. A decoder fills, per row and super-block,
// 8 vectors of quants (vector k = elements 32k .. 32k + 31) and the matching 16-bit scale
// vectors (lanes 0-7 weight the first 16 elements' pair sums, lanes 8-15 the last 16's), and
// says how the Q8_K group sums (bsums) enter:
//   Q2_K: isum = sum_k madd(maddubs(u, y), sc)        min term dmin * sum_g mn_g * bsum_g
//   Q3_K: isum = sum_k madd(maddubs(u, y), sc) - 4 * sum_g sc_g * bsum_g   (u = q + 4)
//   IQ4_XS: isum = sum_k madd(|v| x sign(v) y, ls_k)

constexpr size_t kQ8KQs = 4;                     // offset of the quants in BlockQ8_K
constexpr size_t kQ8KBsums = 4 + kQK_K;          // offset of the group sums
constexpr size_t kQ8KBytes = sizeof(BlockQ8_K);  // 292

struct RowK {
    __m256i q[8];
    __m256i sc[8];
    __m256i bs_weights;  // 16 x int16 weights of the bsums (Q2_K: mins; Q3_K: 4 * scales)
    float d, dmin;
};

inline __m256i pair_scales(int a, int b) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(b)),
                            _mm_set1_epi16(static_cast<short>(a)));
}

struct DecQ2_K {
    static constexpr size_t kBytes = sizeof(BlockQ2_K);
    static constexpr bool kSigned = false;
    static constexpr bool kBsums = true;
    static constexpr bool kMin = true;
    static void decode(const uint8_t* b, RowK& r) {
        const uint8_t* scales = b;
        const uint8_t* qs = b + 16;
        const __m256i m3 = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; h++) {
            const __m256i v = load32(qs + 32 * h);
            for (int s = 0; s < 4; s++) {
                r.q[4 * h + s] = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m3);
            }
        }
        for (int k = 0; k < 8; k++) {
            r.sc[k] = pair_scales(scales[2 * k] & 0x0f, scales[2 * k + 1] & 0x0f);
        }
        const __m128i sv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
        r.bs_weights =
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sv, 4), _mm_set1_epi8(0x0f)));
        r.d = h2f(b + 80);
        r.dmin = h2f(b + 82);
    }
};

struct DecQ3_K {
    static constexpr size_t kBytes = sizeof(BlockQ3_K);
    static constexpr bool kSigned = false;
    static constexpr bool kBsums = true;
    static constexpr bool kMin = false;
    static void decode(const uint8_t* b, RowK& r) {
        const uint8_t* hmask = b;
        const uint8_t* qs = b + 32;
        const uint8_t* scales = b + 96;
        const __m256i m3 = _mm256_set1_epi8(3);
        const __m256i hm = load32(hmask);
        for (int h = 0; h < 2; h++) {
            const __m256i v = load32(qs + 32 * h);
            for (int s = 0; s < 4; s++) {
                const int k = 4 * h + s;
                const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << k));
                const __m256i high = _mm256_and_si256(
                    _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), _mm256_set1_epi8(4));
                r.q[k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m3), high);
            }
        }
        // The 16 six-bit scales, in SIMD: group g's low nibble is byte g's (g < 8) or byte
        // g-8's high nibble; its two high bits are bits 2*(g/4) of byte 8 + g%4, i.e. of the
        // 32-bit word of bytes 8-11 shifted right by 2*(g/4), byte g%4.
        uint64_t lo8;
        uint32_t hi4;
        std::memcpy(&lo8, scales, 8);
        std::memcpy(&hi4, scales + 8, 4);
        const __m128i m4 = _mm_set1_epi8(0x0f);
        const __m128i l = _mm_cvtsi64_si128(static_cast<long long>(lo8));
        const __m128i lo =
            _mm_unpacklo_epi64(_mm_and_si128(l, m4), _mm_and_si128(_mm_srli_epi16(l, 4), m4));
        const __m128i hi = _mm_and_si128(
            _mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(hi4)), _mm_setr_epi32(0, 2, 4, 6)),
            _mm_set1_epi8(3));
        const __m128i sc8 =
            _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);  // group g in lane g
        // r.sc[k]: lanes 0-7 group 2k, lanes 8-15 group 2k+1. Each dword of a (b) holds one
        // group twice: a = groups 0-3 | 8-11, b = groups 4-7 | 12-15.
        const __m256i a = _mm256_unpacklo_epi16(sc16, sc16);
        const __m256i bq = _mm256_unpackhi_epi16(sc16, sc16);
        const __m256i i01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
        const __m256i i23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
        const __m256i i45 = _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5);
        const __m256i i67 = _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7);
        r.sc[0] = _mm256_permutevar8x32_epi32(a, i01);
        r.sc[1] = _mm256_permutevar8x32_epi32(a, i23);
        r.sc[2] = _mm256_permutevar8x32_epi32(bq, i01);
        r.sc[3] = _mm256_permutevar8x32_epi32(bq, i23);
        r.sc[4] = _mm256_permutevar8x32_epi32(a, i45);
        r.sc[5] = _mm256_permutevar8x32_epi32(a, i67);
        r.sc[6] = _mm256_permutevar8x32_epi32(bq, i45);
        r.sc[7] = _mm256_permutevar8x32_epi32(bq, i67);
        r.bs_weights = _mm256_slli_epi16(sc16, 2);
        r.d = h2f(b + 108);
        r.dmin = 0.0f;
    }
};

struct DecIQ4_XS {
    static constexpr size_t kBytes = sizeof(BlockIQ4_XS);
    static constexpr bool kSigned = true;
    static constexpr bool kBsums = false;
    static constexpr bool kMin = false;
    static void decode(const uint8_t* b, RowK& r) {
        uint16_t sh;
        std::memcpy(&sh, b + 2, 2);
        const uint8_t* sl = b + 4;
        const uint8_t* qs = b + 8;
        const __m256i table = table16(kIQ4NLValues);
        for (int j = 0; j < 8; j++) {
            r.q[j] = _mm256_shuffle_epi8(table, nibbles(qs + 16 * j));
            const int ls =
                (((sl[j / 2] >> (4 * (j % 2))) & 0x0f) | (((sh >> (2 * j)) & 3) << 4)) - 32;
            r.sc[j] = _mm256_set1_epi16(static_cast<short>(ls));
        }
        r.bs_weights = _mm256_setzero_si256();
        r.d = h2f(b);
        r.dmin = 0.0f;
    }
};

template <class D>
struct TileK {
    template <int NR, int NC>
    struct K {
        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m256 acc[NR][NC];
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();
            const int64_t nb = n / kQK_K;
            RowK row;
            for (int64_t i = 0; i < nb; i++) {
                for (int r = 0; r < NR; r++) {
                    const uint8_t* xb = x + r * bx + static_cast<size_t>(i) * D::kBytes;
                    prefetch_rows_ahead(xb, 2 * NR * bx);
                    prefetch_rows_ahead(xb + D::kBytes - 1, 2 * NR * bx);
                    D::decode(xb, row);
                    for (int c = 0; c < NC; c++) {
                        const uint8_t* yb = y + c * by + static_cast<size_t>(i) * kQ8KBytes;
                        float dy;
                        std::memcpy(&dy, yb, 4);
                        __m256i isum = _mm256_setzero_si256();
                        for (int k = 0; k < 8; k++) {
                            const __m256i yq = load32(yb + kQ8KQs + 32 * k);
                            const __m256i p16 = D::kSigned ? mul_signed(row.q[k], yq)
                                                           : _mm256_maddubs_epi16(row.q[k], yq);
                            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, row.sc[k]));
                        }
                        __m256i bterm = _mm256_setzero_si256();
                        if constexpr (D::kBsums) {
                            bterm = _mm256_madd_epi16(row.bs_weights, load32(yb + kQ8KBsums));
                        }
                        if constexpr (D::kBsums && !D::kMin) isum = _mm256_sub_epi32(isum, bterm);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                                                    _mm256_set1_ps(row.d * dy), acc[r][c]);
                        if constexpr (D::kMin) {
                            acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(bterm),
                                                         _mm256_set1_ps(row.dmin * dy), acc[r][c]);
                        }
                    }
                }
            }
            for (int c = 0; c < NC; c++)
                for (int r = 0; r < NR; r++) out[c * ldo + r] = hsum(acc[r][c]);
        }
    };
};

template <int NR, int NC>
using Q2_KTile = TileK<DecQ2_K>::K<NR, NC>;
template <int NR, int NC>
using Q3_KTile = TileK<DecQ3_K>::K<NR, NC>;
template <int NR, int NC>
using IQ4_XSTile = TileK<DecIQ4_XS>::K<NR, NC>;

#define FERRY_MORE_FAST(T, tile) dispatch<tile>
#else
#define FERRY_MORE_FAST(T, tile) tile_scalar<Type::T>
#endif

size_t q8_0_bytes(int64_t n) {
    return row_size(Type::Q8_0, n);
}
size_t q8_k_bytes(int64_t n) {
    return row_size(Type::Q8_K, n);
}

MatKernels make(Type t, bool portable) {
    auto q8_0 = [&](DirectTileFn fast, DirectTileFn port) {
        return MatKernels{
            Type::Q8_0, quantize_row_q8_0, q8_0_bytes, portable ? port : fast, nullptr, 0};
    };
    auto q8_k = [&](DirectTileFn fast, DirectTileFn port) {
        return MatKernels{
            Type::Q8_K, quantize_row_q8_k, q8_k_bytes, portable ? port : fast, nullptr, 0};
    };
    switch (t) {
        case Type::Q5_0:
            return q8_0(FERRY_MORE_FAST(Q5_0, Q5_0Tile), tile_scalar<Type::Q5_0>);
        case Type::Q5_1:
            return q8_0(FERRY_MORE_FAST(Q5_1, Q5_1Tile), tile_scalar<Type::Q5_1>);
        case Type::IQ4_NL:
            return q8_0(FERRY_MORE_FAST(IQ4_NL, IQ4_NLTile), tile_scalar<Type::IQ4_NL>);
        case Type::MXFP4:
            return q8_0(FERRY_MORE_FAST(MXFP4, MXFP4Tile), tile_scalar<Type::MXFP4>);
        case Type::Q2_K:
            return q8_k(FERRY_MORE_FAST(Q2_K, Q2_KTile), tile_scalar<Type::Q2_K>);
        case Type::Q3_K:
            return q8_k(FERRY_MORE_FAST(Q3_K, Q3_KTile), tile_scalar<Type::Q3_K>);
        case Type::IQ4_XS:
            return q8_k(FERRY_MORE_FAST(IQ4_XS, IQ4_XSTile), tile_scalar<Type::IQ4_XS>);
        default:
            break;
    }
#undef FERRY_MORE_FAST
    FERRY_ASSERT(false && "more_mat_kernels: unsupported weight type");
    return {};
}

constexpr Type kMoreTypes[] = {Type::Q5_0, Type::Q5_1, Type::IQ4_NL, Type::MXFP4,
                               Type::Q2_K, Type::Q3_K, Type::IQ4_XS};
constexpr int kNumMore = static_cast<int>(sizeof(kMoreTypes) / sizeof(kMoreTypes[0]));

}  // namespace

const MatKernels* more_mat_kernels(Type t, bool portable) {
    static const struct Tables {
        MatKernels fast[kNumMore], port[kNumMore];
        Tables() {
            for (int i = 0; i < kNumMore; i++) {
                fast[i] = make(kMoreTypes[i], false);
                port[i] = make(kMoreTypes[i], true);
            }
        }
    } tables;
    for (int i = 0; i < kNumMore; i++) {
        if (kMoreTypes[i] == t) return portable ? &tables.port[i] : &tables.fast[i];
    }
    return nullptr;
}

}  // namespace ferry::cpu::simd
