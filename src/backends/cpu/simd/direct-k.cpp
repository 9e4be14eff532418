// Direct MUL_MAT tiles for the K formats (Q4_K, Q5_K, Q6_K weights against Q8_K columns), up
// to 4 weight rows x 4 columns, one 256-element super-block per step.
//
// Q4_K / Q5_K: x = d * sc_j * u - dmin * mn_j per 32-element sub-block j, u in [0, 15] / [0, 31]:
//   dot = dy * (d * sum_j sc_j * sum(u * q) - dmin * sum_j mn_j * sum(q))
// Q6_K: x = d * sc_g * (u - 32) per 16-element group g, u in [0, 63]:
//   dot = dy * d * sum_g sc_g * (sum(u * q) - 32 * sum(q))
// The per-group integer dot products (vpdpbusd, unsigned u times signed q) fit in 16 bits, so
// they are packed to words and weighted by their scales with one vpmaddwd per two vectors; the
// group sums of q come from the Q8_K bsums. Everything stays integer until one conversion per
// super-block. Each output's operations are the same whatever nr and nc are.
#include <cstring>

#include "backends/cpu/simd/simd.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_DIRECT_K_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_DIRECT_K_AVX2 1
#endif

namespace ferry::cpu::simd {

DirectTileFn direct_k_tile(Type t);

#if FERRY_DIRECT_K_AVX512
namespace {

inline float h2f(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// The 8 six-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K/Q5_K super-block.
inline __m128i k_scales_mins(const uint8_t* q) {
    uint32_t a, b, c;
    std::memcpy(&a, q, 4);
    std::memcpy(&b, q + 4, 4);
    std::memcpy(&c, q + 8, 4);
    const uint32_t sc_lo = a & 0x3f3f3f3fu;
    const uint32_t mn_lo = b & 0x3f3f3f3fu;
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    const uint64_t sc = sc_lo | (static_cast<uint64_t>(sc_hi) << 32);
    const uint64_t mn = mn_lo | (static_cast<uint64_t>(mn_hi) << 32);
    return _mm_set_epi64x(static_cast<long long>(mn), static_cast<long long>(sc));
}

// Word-index tables for vpermb (byte indices, high byte of every word masked to zero).
struct ByteTable {
    alignas(64) uint8_t v[64];
};

// After packs_epi32(d_a, d_b) of two dpbusd results whose dword halves hold sub-blocks
// (A0 | A1) and (B0 | B1), 128-bit lane k holds words [A(k) x4, B(k) x4] where A(k) = A0 for
// k < 2 else A1. Scales for (A0, A1, B0, B1) = sub-blocks (s0, s1, s2, s3).
constexpr ByteTable make_q4k_scale_idx(int s0, int s1, int s2, int s3) {
    ByteTable t{};
    for (int i = 0; i < 64; i++) {
        const int lane = i / 16, w = (i % 16) / 2;
        const int a = lane < 2 ? s0 : s1, b = lane < 2 ? s2 : s3;
        t.v[i] = static_cast<uint8_t>((i & 1) ? 0 : (w < 4 ? a : b));
    }
    return t;
}
// Q4_K vectors: lo0 = sub-blocks (0 | 2), hi0 = (1 | 3), lo1 = (4 | 6), hi1 = (5 | 7).
constexpr ByteTable kQ4kIdx0 = make_q4k_scale_idx(0, 2, 1, 3);
constexpr ByteTable kQ4kIdx1 = make_q4k_scale_idx(4, 6, 5, 7);
// Mins as 16 words: word i = min of sub-block i / 2 (pairs with bsums[i]); bytes 8-15 of the
// scales/mins register.
constexpr ByteTable make_min_idx() {
    ByteTable t{};
    for (int i = 0; i < 32; i++) t.v[i] = static_cast<uint8_t>((i & 1) ? 0 : 8 + i / 4);
    return t;
}
constexpr ByteTable kMinIdx = make_min_idx();
constexpr __mmask64 kEvenBytes = 0x5555555555555555ull;

// Q6_K: vectors v0..v3 hold groups (4k .. 4k+3), 4 dwords each. packs(v0, v1) puts in 128-bit
// lane k words [group k x4, group 4 + k x4]; packs(v2, v3) likewise for groups 8 + k, 12 + k.
// Word-index table into the 16 sign-extended scales.
struct WordTable {
    alignas(64) uint16_t v[32];
};
constexpr WordTable make_q6k_idx(int base) {
    WordTable t{};
    for (int i = 0; i < 32; i++) {
        const int lane = i / 8, w = i % 8;
        t.v[i] = static_cast<uint16_t>(base + (w < 4 ? lane : 4 + lane));
    }
    return t;
}
constexpr WordTable kQ6kIdx0 = make_q6k_idx(0);
constexpr WordTable kQ6kIdx1 = make_q6k_idx(8);

// Requests the bytes the next tile will read in the same row position (see direct.cpp).
inline void prefetch_next_tile(const uint8_t* p, size_t dist) {
    _mm_prefetch(reinterpret_cast<const char*>(p + dist), _MM_HINT_T1);
}

// ---------------------------------------------------------------------------------------------
// Q4_K / Q5_K

template <bool Q5>
struct Q45Tile {
    static constexpr size_t kBlock = Q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    static constexpr size_t kQs = Q5 ? 48 : 16;

    template <int NR, int NC>
    struct K {
        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m512 acc[NR][NC];
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_ps();
            const __m512i idx0 = _mm512_load_si512(kQ4kIdx0.v);
            const __m512i idx1 = _mm512_load_si512(kQ4kIdx1.v);
            const __m256i midx = _mm256_load_si256(reinterpret_cast<const __m256i*>(kMinIdx.v));
            const __m512i m4 = _mm512_set1_epi8(0x0f);
            for (int64_t i = 0; i < n / kQK_K; i++) {
                __m512i yv[NC][4];
                __m256i bs[NC];
                float dy[NC];
                for (int c = 0; c < NC; c++) {
                    const auto* yb =
                        reinterpret_cast<const BlockQ8_K*>(y + c * by + i * sizeof(BlockQ8_K));
                    const uint8_t* q = reinterpret_cast<const uint8_t*>(yb->qs);
                    auto pair = [&](int a, int b) {
                        return _mm512_inserti64x4(
                            _mm512_castsi256_si512(
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b)), 1);
                    };
                    yv[c][0] = pair(0, 64);     // sub-blocks 0 | 2
                    yv[c][1] = pair(32, 96);    // 1 | 3
                    yv[c][2] = pair(128, 192);  // 4 | 6
                    yv[c][3] = pair(160, 224);  // 5 | 7
                    bs[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb->bsums));
                    dy[c] = yb->d;
                }
                for (int r = 0; r < NR; r++) {
                    const uint8_t* xb = x + r * bx + i * kBlock;
                    for (size_t o = 0; o < kBlock; o += 64) prefetch_next_tile(xb + o, 2 * NR * bx);
                    const float d = h2f(xb), dmin = h2f(xb + 2);
                    const __m512i sm = _mm512_castsi128_si512(k_scales_mins(xb + 4));
                    const __m512i s0 = _mm512_maskz_permutexvar_epi8(kEvenBytes, idx0, sm);
                    const __m512i s1 = _mm512_maskz_permutexvar_epi8(kEvenBytes, idx1, sm);
                    const __m256i mins = _mm256_maskz_permutexvar_epi8(
                        static_cast<__mmask32>(kEvenBytes), midx, _mm512_castsi512_si256(sm));
                    const __m512i z0 = _mm512_loadu_si512(xb + kQs);
                    const __m512i z1 = _mm512_loadu_si512(xb + kQs + 64);
                    __m512i u[4] = {
                        _mm512_and_si512(z0, m4), _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4),
                        _mm512_and_si512(z1, m4), _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4)};
                    if constexpr (Q5) {
                        // Fifth bit of element 64c + l: bit 2c of qh[l]; of 64c + 32 + l: 2c + 1.
                        const __m512i qh = _mm512_broadcast_i64x4(
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16)));
                        const __m512i h16 = _mm512_set1_epi8(16);
                        for (int v = 0; v < 4; v++) {
                            // vector v: chunks c0 = 2 (v / 2) (low half), c0 + 1 (high half);
                            // bit 2c (+1 for odd v).
                            const int c0 = 2 * (v / 2), odd = v & 1;
                            const __m512i bits = _mm512_inserti64x4(
                                _mm512_set1_epi8(static_cast<char>(1 << (2 * c0 + odd))),
                                _mm256_set1_epi8(static_cast<char>(1 << (2 * c0 + 2 + odd))), 1);
                            const __mmask64 k = _mm512_test_epi8_mask(qh, bits);
                            u[v] = _mm512_mask_add_epi8(u[v], k, u[v], h16);
                        }
                    }
                    for (int c = 0; c < NC; c++) {
                        const __m512i z = _mm512_setzero_si512();
                        const __m512i p0 = _mm512_dpbusd_epi32(z, u[0], yv[c][0]);
                        const __m512i p1 = _mm512_dpbusd_epi32(z, u[1], yv[c][1]);
                        const __m512i p2 = _mm512_dpbusd_epi32(z, u[2], yv[c][2]);
                        const __m512i p3 = _mm512_dpbusd_epi32(z, u[3], yv[c][3]);
                        const __m512i isum =
                            _mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(p0, p1), s0),
                                             _mm512_madd_epi16(_mm512_packs_epi32(p2, p3), s1));
                        const __m256i msum = _mm256_madd_epi16(mins, bs[c]);
                        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                                                    _mm512_set1_ps(d * dy[c]), acc[r][c]);
                        acc[r][c] =
                            _mm512_fmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(msum)),
                                            _mm512_set1_ps(-(dmin * dy[c])), acc[r][c]);
                    }
                }
            }
            for (int c = 0; c < NC; c++)
                for (int r = 0; r < NR; r++) out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]);
        }
    };
};

// ---------------------------------------------------------------------------------------------
// Q6_K

template <int NR, int NC>
struct Q6Tile {
    static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by, float* out,
                    size_t ldo) {
        __m512 acc[NR][NC];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_ps();
        const __m512i widx0 = _mm512_load_si512(kQ6kIdx0.v);
        const __m512i widx1 = _mm512_load_si512(kQ6kIdx1.v);
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        const __m512i m30 = _mm512_set1_epi8(0x30);
        // qh shifts: low half of a vector takes bits (2s), high half bits (2s + 2).
        const __m512i sh_lo = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
        const __m512i sh_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
        for (int64_t i = 0; i < n / kQK_K; i++) {
            __m512i yv[NC][4];
            __m256i bs[NC];
            float dy[NC];
            for (int c = 0; c < NC; c++) {
                const auto* yb =
                    reinterpret_cast<const BlockQ8_K*>(y + c * by + i * sizeof(BlockQ8_K));
                for (int v = 0; v < 4; v++) yv[c][v] = _mm512_loadu_si512(yb->qs + 64 * v);
                bs[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb->bsums));
                dy[c] = yb->d;
            }
            for (int r = 0; r < NR; r++) {
                const auto* xb =
                    reinterpret_cast<const BlockQ6_K*>(x + r * bx + i * sizeof(BlockQ6_K));
                for (size_t o = 0; o < sizeof(BlockQ6_K); o += 64) {
                    prefetch_next_tile(reinterpret_cast<const uint8_t*>(xb) + o, 2 * NR * bx);
                }
                const float d = h2f(reinterpret_cast<const uint8_t*>(&xb->d));
                const __m256i sc16 = _mm256_cvtepi8_epi16(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb->scales)));
                const __m512i sc512 = _mm512_castsi256_si512(sc16);
                const __m512i s0 = _mm512_permutexvar_epi16(widx0, sc512);
                const __m512i s1 = _mm512_permutexvar_epi16(widx1, sc512);
                __m512i u[4];
                for (int h = 0; h < 2; h++) {
                    const __m512i ql = _mm512_loadu_si512(xb->ql + 64 * h);
                    const __m512i qh = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qh + 32 * h)));
                    // elements 128h + 0..63: low nibbles, qh bits 0-1 (l < 32) / 2-3 (l >= 32)
                    const __m512i hb0 = _mm512_slli_epi16(_mm512_srlv_epi16(qh, sh_lo), 4);
                    // elements 128h + 64..127: high nibbles, qh bits 4-5 / 6-7
                    const __m512i hb1 = _mm512_slli_epi16(_mm512_srlv_epi16(qh, sh_hi), 4);
                    // (a & 0x0f) | (b & 0x30)
                    u[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, m4), hb0, m30, 0xf8);
                    u[2 * h + 1] = _mm512_ternarylogic_epi32(
                        _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), hb1, m30, 0xf8);
                }
                for (int c = 0; c < NC; c++) {
                    const __m512i z = _mm512_setzero_si512();
                    const __m512i p0 = _mm512_dpbusd_epi32(z, u[0], yv[c][0]);
                    const __m512i p1 = _mm512_dpbusd_epi32(z, u[1], yv[c][1]);
                    const __m512i p2 = _mm512_dpbusd_epi32(z, u[2], yv[c][2]);
                    const __m512i p3 = _mm512_dpbusd_epi32(z, u[3], yv[c][3]);
                    __m512i isum =
                        _mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(p0, p1), s0),
                                         _mm512_madd_epi16(_mm512_packs_epi32(p2, p3), s1));
                    // - 32 * sum_g sc_g * bsum_g
                    const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs[c]), 5);
                    isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(off));
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * dy[c]),
                                                acc[r][c]);
                }
            }
        }
        for (int c = 0; c < NC; c++)
            for (int r = 0; r < NR; r++) out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]);
    }
};

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

template <int NR, int NC>
using Q4KTile = Q45Tile<false>::K<NR, NC>;
template <int NR, int NC>
using Q5KTile = Q45Tile<true>::K<NR, NC>;

}  // namespace

DirectTileFn direct_k_tile(Type t) {
    switch (t) {
        case Type::Q4_K:
            return dispatch<Q4KTile>;
        case Type::Q5_K:
            return dispatch<Q5KTile>;
        case Type::Q6_K:
            return dispatch<Q6Tile>;
        default:
            return nullptr;
    }
}

#elif FERRY_DIRECT_K_AVX2
// AVX2 tiles: one 32-element vector per step, vpmaddubsw (unsigned weight quants u <= 63 times
// signed activation quants: a pair sum is at most 2 * 63 * 127, no saturation) then vpmaddwd
// with the sub-block / group scales as words, all integer until one conversion per
// super-block, as in the AVX-512 tiles.
namespace {

inline float h2f(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// The 8 six-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K/Q5_K super-block.
inline __m128i k_scales_mins(const uint8_t* q) {
    uint32_t a, b, c;
    std::memcpy(&a, q, 4);
    std::memcpy(&b, q + 4, 4);
    std::memcpy(&c, q + 8, 4);
    const uint32_t sc_lo = a & 0x3f3f3f3fu;
    const uint32_t mn_lo = b & 0x3f3f3f3fu;
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    const uint64_t sc = sc_lo | (static_cast<uint64_t>(sc_hi) << 32);
    const uint64_t mn = mn_lo | (static_cast<uint64_t>(mn_hi) << 32);
    return _mm_set_epi64x(static_cast<long long>(mn), static_cast<long long>(sc));
}

inline void prefetch_next_tile(const uint8_t* p, size_t dist) {
    _mm_prefetch(reinterpret_cast<const char*>(p + dist), _MM_HINT_T1);
}

inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// From 16 words w (dword k = words 2k, 2k + 1): word 2k in every position (odd = false) or
// word 2k + 1 (odd = true).
inline __m256i bcast_word(__m256i w, int k, bool odd) {
    const __m256i p = _mm256_permutevar8x32_epi32(w, _mm256_set1_epi32(k));
    return _mm256_shuffle_epi8(p, odd ? _mm256_set1_epi16(0x0302) : _mm256_set1_epi16(0x0100));
}

// ---------------------------------------------------------------------------------------------
// Q4_K / Q5_K: chunk ch (64 elements) = 32 bytes of qs; low nibbles are sub-block 2ch, high
// nibbles sub-block 2ch + 1 (Q5_K: fifth bit j of qh[l] for sub-block j).

template <bool Q5>
struct Q45Tile {
    static constexpr size_t kBlock = Q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    static constexpr size_t kQs = Q5 ? 48 : 16;

    template <int NR, int NC>
    struct K {
        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m256 acc[NR][NC];
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();
            const __m256i m4 = _mm256_set1_epi8(0x0f);
            const __m256i b4 = _mm256_set1_epi8(0x10);
            for (int64_t i = 0; i < n / kQK_K; i++) {
                const BlockQ8_K* yb[NC];
                __m128i ysum[NC];  // q sums of the 8 sub-blocks (words)
                for (int c = 0; c < NC; c++) {
                    yb[c] = reinterpret_cast<const BlockQ8_K*>(y + c * by + i * sizeof(BlockQ8_K));
                    const __m128i b0 =
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(yb[c]->bsums));
                    const __m128i b1 =
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(yb[c]->bsums + 8));
                    ysum[c] = _mm_hadd_epi16(b0, b1);
                }
                for (int r = 0; r < NR; r++) {
                    const uint8_t* xb = x + r * bx + i * kBlock;
                    for (size_t o = 0; o < kBlock; o += 64) prefetch_next_tile(xb + o, 2 * NR * bx);
                    const float d = h2f(xb), dmin = h2f(xb + 2);
                    const __m256i sm16 = _mm256_cvtepu8_epi16(k_scales_mins(xb + 4));
                    const __m128i mins = _mm256_extracti128_si256(sm16, 1);
                    __m256i qh = _mm256_setzero_si256();
                    if constexpr (Q5)
                        qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
                    __m256i isum[NC];
                    for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
                    for (int ch = 0; ch < 4; ch++) {
                        const __m256i z = _mm256_loadu_si256(
                            reinterpret_cast<const __m256i*>(xb + kQs + 32 * ch));
                        __m256i lo = _mm256_and_si256(z, m4);
                        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
                        if constexpr (Q5) {
                            // Bit j of each qh byte moved to bit 4 (shifts stay within bytes
                            // for the bits that survive the mask).
                            const int j = 2 * ch;
                            const __m256i h0 = j <= 4 ? _mm256_slli_epi16(qh, 4 - j)
                                                      : _mm256_srli_epi16(qh, j - 4);
                            const __m256i h1 = j + 1 <= 4 ? _mm256_slli_epi16(qh, 3 - j)
                                                          : _mm256_srli_epi16(qh, j - 3);
                            lo = _mm256_or_si256(lo, _mm256_and_si256(h0, b4));
                            hi = _mm256_or_si256(hi, _mm256_and_si256(h1, b4));
                        }
                        const __m256i s_lo = bcast_word(sm16, ch, false);
                        const __m256i s_hi = bcast_word(sm16, ch, true);
                        for (int c = 0; c < NC; c++) {
                            const int8_t* q = yb[c]->qs + 64 * ch;
                            const __m256i p0 = _mm256_maddubs_epi16(
                                lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
                            const __m256i p1 = _mm256_maddubs_epi16(
                                hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32)));
                            isum[c] = _mm256_add_epi32(
                                isum[c], _mm256_add_epi32(_mm256_madd_epi16(p0, s_lo),
                                                          _mm256_madd_epi16(p1, s_hi)));
                        }
                    }
                    for (int c = 0; c < NC; c++) {
                        const __m128i msum = _mm_madd_epi16(mins, ysum[c]);
                        const float dy = yb[c]->d;
                        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]),
                                                    _mm256_set1_ps(d * dy), acc[r][c]);
                        acc[r][c] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_zextsi128_si256(msum)),
                                            _mm256_set1_ps(-(dmin * dy)), acc[r][c]);
                    }
                }
            }
            for (int c = 0; c < NC; c++)
                for (int r = 0; r < NR; r++) out[c * ldo + r] = hsum256(acc[r][c]);
        }
    };
};

// ---------------------------------------------------------------------------------------------
// Q6_K: vector v (elements 32v..32v+31) holds groups 2v, 2v + 1.

template <int NR, int NC>
struct Q6Tile {
    static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by, float* out,
                    size_t ldo) {
        __m256 acc[NR][NC];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        const __m256i m30 = _mm256_set1_epi8(0x30);
        // Vector v needs group 2v's scale (a word) in every word of lane 0 and group 2v + 1's in
        // lane 1. With groups 0-7 (v < 4) or 8-15 in both lanes, one in-lane byte shuffle per
        // vector picks them: word 2 (v % 4) in lane 0, word 2 (v % 4) + 1 in lane 1 (instead of
        // a cross-lane permute and a shuffle per vector).
        __m256i pick[4];
        for (int k = 0; k < 4; k++) {
            const char a = static_cast<char>(4 * k), b = static_cast<char>(4 * k + 1);
            const char c = static_cast<char>(4 * k + 2), d = static_cast<char>(4 * k + 3);
            pick[k] = _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, c, d, c, d,
                                       c, d, c, d, c, d, c, d, c, d, c, d);
        }
        for (int64_t i = 0; i < n / kQK_K; i++) {
            const BlockQ8_K* yb[NC];
            for (int c = 0; c < NC; c++) {
                yb[c] = reinterpret_cast<const BlockQ8_K*>(y + c * by + i * sizeof(BlockQ8_K));
            }
            for (int r = 0; r < NR; r++) {
                const auto* xb =
                    reinterpret_cast<const BlockQ6_K*>(x + r * bx + i * sizeof(BlockQ6_K));
                for (size_t o = 0; o < sizeof(BlockQ6_K); o += 64) {
                    prefetch_next_tile(reinterpret_cast<const uint8_t*>(xb) + o, 2 * NR * bx);
                }
                const float d = h2f(reinterpret_cast<const uint8_t*>(&xb->d));
                const __m256i sc16 = _mm256_cvtepi8_epi16(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb->scales)));
                const __m256i sc_half[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                                            _mm256_permute2x128_si256(sc16, sc16, 0x11)};
                __m256i isum[NC];
                for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
                for (int h = 0; h < 2; h++) {
                    const __m256i qa =
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->ql + 64 * h));
                    const __m256i qb =
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->ql + 64 * h + 32));
                    const __m256i qh =
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qh + 32 * h));
                    const __m256i u[4] = {
                        _mm256_or_si256(_mm256_and_si256(qa, m4),
                                        _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                        _mm256_or_si256(_mm256_and_si256(qb, m4),
                                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4),
                                        _mm256_and_si256(qh, m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
                    };
                    for (int k = 0; k < 4; k++) {
                        const int v = 4 * h + k;
                        const __m256i sv = _mm256_shuffle_epi8(sc_half[h], pick[k]);
                        for (int c = 0; c < NC; c++) {
                            const __m256i q = _mm256_loadu_si256(
                                reinterpret_cast<const __m256i*>(yb[c]->qs + 32 * v));
                            isum[c] = _mm256_add_epi32(
                                isum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], q), sv));
                        }
                    }
                }
                for (int c = 0; c < NC; c++) {
                    // - 32 * sum_g sc_g * bsum_g
                    const __m256i bs =
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb[c]->bsums));
                    const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[c], off)),
                                                _mm256_set1_ps(d * yb[c]->d), acc[r][c]);
                }
            }
        }
        for (int c = 0; c < NC; c++)
            for (int r = 0; r < NR; r++) out[c * ldo + r] = hsum256(acc[r][c]);
    }
};

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

template <int NR, int NC>
using Q4KTile = Q45Tile<false>::K<NR, NC>;
template <int NR, int NC>
using Q5KTile = Q45Tile<true>::K<NR, NC>;

}  // namespace

DirectTileFn direct_k_tile(Type t) {
    switch (t) {
        case Type::Q4_K:
            return dispatch<Q4KTile>;
        case Type::Q5_K:
            return dispatch<Q5KTile>;
        case Type::Q6_K:
            return dispatch<Q6Tile>;
        default:
            return nullptr;
    }
}

#else

DirectTileFn direct_k_tile(Type) {
    return nullptr;
}

#endif

}  // namespace ferry::cpu::simd
