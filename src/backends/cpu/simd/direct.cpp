// Direct MUL_MAT tiles: up to 4 weight rows x 4 activation columns per call, reading the weight
// blocks as stored. Used when there are too few columns to pay for repacking the weights
// (decode), so the weights stream from memory exactly once.
//
// AVX-512 integer tiles work on two 32-element blocks per 512-bit vector. The weight quants
// enter vpdpbusd as unsigned bytes (Q4 nibbles as stored; Q8_0 quants with their sign bit
// flipped, i.e. q + 128), the activation quants as signed bytes; the constant offset (8 or
// 128 times the sum of the activation quants) is subtracted in the integer accumulator's
// initial value, computed once per column and shared by all rows of the tile. Each output's
// sequence of operations is the same whatever nr and nc are.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/simd/simd.h"
#include "core/quants.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_DIRECT_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_DIRECT_AVX2 1
#endif

namespace ferry::cpu::simd {
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

#if FERRY_DIRECT_AVX512 || FERRY_DIRECT_AVX2

// Dispatches nr x nc (1..4 each) to a template instance.
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

#endif

#if FERRY_DIRECT_AVX512

// ---------------------------------------------------------------------------------------------
// Float weights (F32, F16, BF16) against F32 columns.

// Weight rows are short streams (a few KiB), too short for the hardware prefetchers to lock
// on to each: while a tile reads a row, it asks for the same bytes of the row a later tile
// will read (`dist` = 2 x rows per tile x row stride ahead), one request per 64 bytes
// consumed. Into L2 (T1): far more misses can be outstanding there than in L1, which is what
// a DRAM stream needs (measured: single-core Q8_0 decode 10 -> 18 GB/s against T0).
inline void prefetch_next_tile(const uint8_t* p, size_t dist) {
    _mm_prefetch(reinterpret_cast<const char*>(p + dist), _MM_HINT_T1);
}

struct LoadF32 {
    using Elem = float;
    static __m512 load(const uint8_t* p, int64_t k) {
        return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + k);
    }
    static __m512 load_tail(const uint8_t* p, int64_t k, __mmask16 m) {
        return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(p) + k);
    }
};
struct LoadF16 {
    using Elem = uint16_t;
    static __m512 load(const uint8_t* p, int64_t k) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * k)));
    }
    static __m512 load_tail(const uint8_t* p, int64_t k, __mmask16 m) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + 2 * k));
    }
};
struct LoadBF16 {
    using Elem = uint16_t;
    static __m512 widen(__m256i h) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static __m512 load(const uint8_t* p, int64_t k) {
        return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * k)));
    }
    static __m512 load_tail(const uint8_t* p, int64_t k, __mmask16 m) {
        return widen(_mm256_maskz_loadu_epi16(m, p + 2 * k));
    }
};

template <class L>
struct FloatTile {
    template <int NR, int NC>
    struct K {
        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m512 acc[NR][NC];
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_ps();
            int64_t k = 0;
            for (; k + 16 <= n; k += 16) {
                __m512 yv[NC];
                for (int c = 0; c < NC; c++) yv[c] = LoadF32::load(y + c * by, k);
                for (int r = 0; r < NR; r++) {
                    if (k % 32 == 0 || sizeof(typename L::Elem) == 4) {
                        prefetch_next_tile(x + r * bx + k * sizeof(typename L::Elem), 2 * NR * bx);
                    }
                    const __m512 xv = L::load(x + r * bx, k);
                    for (int c = 0; c < NC; c++) acc[r][c] = _mm512_fmadd_ps(xv, yv[c], acc[r][c]);
                }
            }
            if (k < n) {
                const __mmask16 m = static_cast<__mmask16>((1u << (n - k)) - 1);
                __m512 yv[NC];
                for (int c = 0; c < NC; c++) yv[c] = LoadF32::load_tail(y + c * by, k, m);
                for (int r = 0; r < NR; r++) {
                    const __m512 xv = L::load_tail(x + r * bx, k, m);
                    for (int c = 0; c < NC; c++) acc[r][c] = _mm512_fmadd_ps(xv, yv[c], acc[r][c]);
                }
            }
            for (int c = 0; c < NC; c++)
                for (int r = 0; r < NR; r++) out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]);
        }
    };
};

template <int NR, int NC>
using F32Tile = FloatTile<LoadF32>::K<NR, NC>;
template <int NR, int NC>
using F16Tile = FloatTile<LoadF16>::K<NR, NC>;
template <int NR, int NC>
using BF16Tile = FloatTile<LoadBF16>::K<NR, NC>;

// ---------------------------------------------------------------------------------------------
// Q4_0 / Q4_1 / Q8_0 weights against Q8_0 columns, two blocks per vector.

enum class QKind { Q4_0, Q4_1, Q8_0 };

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// Lanes 0-7 = fp16 h0, lanes 8-15 = fp16 h1, as floats.
inline __m512 scale_pair(uint16_t h0, uint16_t h1) {
    const __m256i h =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(h0))),
                                _mm_set1_epi16(static_cast<short>(h1)), 1);
    return _mm512_cvtph_ps(h);
}

// 16 nibble bytes of two blocks -> 64 unsigned bytes in element order: [lo(q0) hi(q0) lo(q1)
// hi(q1)]; q1 == nullptr gives zeros in the upper half.
inline __m512i unpack_nibbles(const uint8_t* q0, const uint8_t* q1) {
    const __m256i a =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q0)));
    __m512i z;
    if (q1) {
        const __m256i b =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q1)));
        z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    } else {
        z = _mm512_zextsi256_si512(a);
    }
    const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi64(z, shifts), _mm512_set1_epi8(0x0f));
}

inline __m512i load_pair32(const uint8_t* p0, const uint8_t* p1) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0));
    if (!p1) return _mm512_zextsi256_si512(a);
    return _mm512_inserti64x4(_mm512_castsi256_si512(a),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1)), 1);
}

// Byte-permutation indices for pairs of consecutive blocks of `BLK` bytes read with one
// (masked) 64-byte load: the fp16 field at offset OFF of both blocks spread over lanes 0-7 and
// 8-15, and the 16 nibble bytes at offset QS of both blocks laid out [q0 q0 q1 q1].
template <size_t BLK, size_t OFF>
struct ScaleIdx {
    alignas(64) uint8_t v[64];
    constexpr ScaleIdx() : v() {
        for (int i = 0; i < 64; i++) {
            v[i] = static_cast<uint8_t>(i < 16 ? OFF + (i & 1) : i < 32 ? BLK + OFF + (i & 1) : 0);
        }
    }
};
template <size_t BLK, size_t QS>
struct NibbleIdx {
    alignas(64) uint8_t v[64];
    constexpr NibbleIdx() : v() {
        for (int i = 0; i < 64; i++)
            v[i] = static_cast<uint8_t>((i < 32 ? QS : BLK + QS) + (i & 15));
    }
};
template <size_t BLK, size_t OFF>
inline constexpr ScaleIdx<BLK, OFF> kScaleIdx{};
template <size_t BLK, size_t QS>
inline constexpr NibbleIdx<BLK, QS> kNibbleIdx{};

// The first NB (< 64) bytes at p in one register; masked so the load never reads past them.
template <size_t NB>
inline __m512i load_bytes(const uint8_t* p) {
    static_assert(NB < 64);
    constexpr __mmask64 m = (__mmask64{1} << NB) - 1;
    return _mm512_maskz_loadu_epi8(m, p);
}

template <size_t BLK, size_t OFF>
inline __m512 pair_scales(__m512i z) {
    const __m512i idx = _mm512_load_si512(kScaleIdx<BLK, OFF>.v);
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(idx, z)));
}

template <size_t BLK, size_t QS>
inline __m512i pair_nibbles(__m512i z) {
    const __m512i idx = _mm512_load_si512(kNibbleIdx<BLK, QS>.v);
    const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi64(_mm512_permutexvar_epi8(idx, z), shifts),
                            _mm512_set1_epi8(0x0f));
}

template <QKind KIND>
struct QTile {
    static constexpr size_t kBlock = KIND == QKind::Q4_0   ? sizeof(BlockQ4_0)
                                     : KIND == QKind::Q4_1 ? sizeof(BlockQ4_1)
                                                           : sizeof(BlockQ8_0);
    static constexpr size_t kQs = KIND == QKind::Q4_1 ? 4 : 2;  // offset of qs in a block

    template <int NR, int NC>
    struct K {
        // One step over blocks b and b + 1 (two == false: block b only).
        template <bool TWO>
        static inline void step(int64_t b, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                                __m512 (&acc)[NR][NC]) {
            __m512i yv[NC], init[NC];
            __m512 dy[NC], ys[NC] = {};
            for (int c = 0; c < NC; c++) {
                const uint8_t* yc = y + c * by + b * sizeof(BlockQ8_0);
                const uint8_t* yc1 = yc + sizeof(BlockQ8_0);
                yv[c] = load_pair32(yc + 2, TWO ? yc1 + 2 : nullptr);
                if constexpr (TWO) {
                    dy[c] = pair_scales<sizeof(BlockQ8_0), 0>(load_bytes<36>(yc));
                } else {
                    dy[c] = scale_pair(load_u16(yc), 0);
                }
                const __m512i psum =
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), yv[c]);
                if constexpr (KIND == QKind::Q4_0) {
                    init[c] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(psum, 3));
                } else if constexpr (KIND == QKind::Q8_0) {
                    init[c] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(psum, 7));
                } else {
                    init[c] = _mm512_setzero_si512();
                    ys[c] = _mm512_mul_ps(dy[c], _mm512_cvtepi32_ps(psum));
                }
            }
            for (int r = 0; r < NR; r++) {
                const uint8_t* xr = x + r * bx + b * kBlock;
                prefetch_next_tile(xr, 2 * NR * bx);
                if constexpr (2 * kBlock > 64) prefetch_next_tile(xr + 64, 2 * NR * bx);
                const uint8_t* xr1 = xr + kBlock;
                __m512i u;
                __m512 dx, mx = _mm512_setzero_ps();
                if constexpr (TWO && KIND != QKind::Q8_0) {
                    const __m512i z = load_bytes<2 * kBlock>(xr);
                    u = pair_nibbles<kBlock, kQs>(z);
                    dx = pair_scales<kBlock, 0>(z);
                    if constexpr (KIND == QKind::Q4_1) mx = pair_scales<kBlock, 2>(z);
                } else {
                    if constexpr (KIND == QKind::Q8_0) {
                        u = _mm512_xor_si512(load_pair32(xr + 2, TWO ? xr1 + 2 : nullptr),
                                             _mm512_set1_epi8(static_cast<char>(0x80)));
                    } else {
                        u = unpack_nibbles(xr + kQs, TWO ? xr1 + kQs : nullptr);
                    }
                    if constexpr (TWO) {
                        dx = pair_scales<kBlock, 0>(load_bytes<36>(xr));
                    } else {
                        dx = scale_pair(load_u16(xr), 0);
                    }
                    if constexpr (KIND == QKind::Q4_1) mx = scale_pair(load_u16(xr + 2), 0);
                }
                for (int c = 0; c < NC; c++) {
                    const __m512i i = _mm512_dpbusd_epi32(init[c], u, yv[c]);
                    acc[r][c] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dx, dy[c]), acc[r][c]);
                    if constexpr (KIND == QKind::Q4_1) {
                        acc[r][c] = _mm512_fmadd_ps(mx, ys[c], acc[r][c]);
                    }
                }
            }
        }

        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m512 acc[NR][NC];
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_ps();
            const int64_t nb = n / 32;
            int64_t b = 0;
            for (; b + 2 <= nb; b += 2) step<true>(b, x, bx, y, by, acc);
            if (b < nb) step<false>(b, x, bx, y, by, acc);
            for (int c = 0; c < NC; c++)
                for (int r = 0; r < NR; r++) out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]);
        }
    };
};

template <int NR, int NC>
using Q4_0Tile = QTile<QKind::Q4_0>::K<NR, NC>;
template <int NR, int NC>
using Q4_1Tile = QTile<QKind::Q4_1>::K<NR, NC>;
template <int NR, int NC>
using Q8_0Tile = QTile<QKind::Q8_0>::K<NR, NC>;

// ---------------------------------------------------------------------------------------------
// Q4_0 / Q4_1 weights, three blocks per 512-bit load.
//
// Three consecutive blocks (54 or 60 bytes) are loaded as they are stored. Their low and high
// nibbles, taken in place, meet a copy of the activation column that was laid out once (in the
// conversion phase) so that the activation quant of each weight nibble sits at the same byte
// position, with zeros facing the scale bytes. Every 4-byte lane then belongs to one block, and
// the per-lane scales come from one byte permutation of the same load. Per triple of blocks
// the column layout holds 4 vectors: quants facing the low nibbles, quants facing the high
// nibbles, dy per lane, and per lane -8 * dy-less sum (Q4_0, int32) or dy * sum (Q4_1, float).

template <size_t BLK>
struct TriLayout {
    static constexpr size_t kQs = BLK == sizeof(BlockQ4_1) ? 4 : 2;
    // Block of each 4-byte lane (-1: past the third block).
    static constexpr int lane_block(int lane) {
        const int b =
            static_cast<int>((4 * lane + 3 - kQs) / BLK);  // block of the lane's last byte
        return 4 * lane >= static_cast<int>(3 * BLK) ? -1 : b;
    }
    static constexpr size_t kBytes = 256;  // per triple
};

template <size_t BLK, size_t OFF>
struct TriScaleIdx {
    alignas(64) uint8_t v[64];
    constexpr TriScaleIdx() : v() {
        for (int i = 0; i < 32; i++) {
            const int b = TriLayout<BLK>::lane_block(i / 2);
            v[i] = static_cast<uint8_t>((b < 0 ? 0 : b) * BLK + OFF + (i & 1));
        }
    }
};
template <size_t BLK, size_t OFF>
inline constexpr TriScaleIdx<BLK, OFF> kTriScaleIdx{};

// Lays out a column of Q8_0 blocks for the Q4 tiles.
template <size_t BLK>
void tri_arrange(const BlockQ8_0* yb, int64_t nb, uint8_t* out) {
    constexpr size_t kQs = TriLayout<BLK>::kQs;
    for (int64_t t = 0; t * 3 < nb; t++, out += TriLayout<BLK>::kBytes) {
        std::memset(out, 0, TriLayout<BLK>::kBytes);
        float* dyl = reinterpret_cast<float*>(out + 128);
        uint8_t* extra = out + 192;
        int first_lane[3] = {-1, -1, -1};
        for (int lane = 0; lane < 16; lane++) {
            const int b = TriLayout<BLK>::lane_block(lane);
            if (b < 0 || 3 * t + b >= nb) continue;
            dyl[lane] = fp16_to_fp32(yb[3 * t + b].d);
            if (first_lane[b] < 0) first_lane[b] = lane;
        }
        for (int b = 0; b < 3 && 3 * t + b < nb; b++) {
            const BlockQ8_0& y = yb[3 * t + b];
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                out[b * BLK + kQs + j] = static_cast<uint8_t>(y.qs[j]);
                out[64 + b * BLK + kQs + j] = static_cast<uint8_t>(y.qs[16 + j]);
                sum += y.qs[j] + y.qs[16 + j];
            }
            if constexpr (BLK == sizeof(BlockQ4_0)) {
                const int32_t init = -8 * sum;
                std::memcpy(extra + 4 * first_lane[b], &init, 4);
            } else {
                const float ys = fp16_to_fp32(y.d) * static_cast<float>(sum);
                std::memcpy(extra + 4 * first_lane[b], &ys, 4);
            }
        }
    }
}

template <size_t BLK>
size_t tri_bytes(int64_t n) {
    return static_cast<size_t>((n / 32 + 2) / 3) * TriLayout<BLK>::kBytes;
}

template <size_t BLK>
void tri_quantize(const float* x, void* out, int64_t n) {
    BlockQ8_0 tmp[3];
    for (int64_t i = 0; i < n / 32; i += 3) {
        const int64_t nb = std::min<int64_t>(3, n / 32 - i);
        quantize_row_q8_0(x + 32 * i, tmp, 32 * nb);
        tri_arrange<BLK>(tmp, nb, static_cast<uint8_t*>(out) + (i / 3) * TriLayout<BLK>::kBytes);
    }
}

template <size_t BLK>
struct TriTile {
    static constexpr bool kQ41 = BLK == sizeof(BlockQ4_1);

    template <int NR, int NC>
    struct K {
        template <bool FULL>
        static inline void step(int64_t t, int64_t nbk, const uint8_t* x, size_t bx,
                                const uint8_t* y, size_t by, __m512 (&acc)[NR][NC]) {
            const __mmask64 mask =
                FULL ? (__mmask64{1} << (3 * BLK)) - 1 : (__mmask64{1} << (nbk * BLK)) - 1;
            const __m512i idx_d = _mm512_load_si512(kTriScaleIdx<BLK, 0>.v);
            const __m512i m4 = _mm512_set1_epi8(0x0f);
            for (int r = 0; r < NR; r++) {
                prefetch_next_tile(x + r * bx + t * 3 * BLK, 2 * NR * bx);
                const __m512i z = _mm512_maskz_loadu_epi8(mask, x + r * bx + t * 3 * BLK);
                const __m512i lo = _mm512_and_si512(z, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
                const __m512 dx =
                    _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(idx_d, z)));
                __m512 mx = _mm512_setzero_ps();
                if constexpr (kQ41) {
                    const __m512i idx_m = _mm512_load_si512(kTriScaleIdx<BLK, 2>.v);
                    mx = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(idx_m, z)));
                }
                for (int c = 0; c < NC; c++) {
                    const uint8_t* yc = y + c * by + t * TriLayout<BLK>::kBytes;
                    const __m512i init =
                        kQ41 ? _mm512_setzero_si512() : _mm512_loadu_si512(yc + 192);
                    __m512i i = _mm512_dpbusd_epi32(init, lo, _mm512_loadu_si512(yc));
                    i = _mm512_dpbusd_epi32(i, hi, _mm512_loadu_si512(yc + 64));
                    const __m512 dy = _mm512_loadu_ps(reinterpret_cast<const float*>(yc + 128));
                    acc[r][c] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dx, dy), acc[r][c]);
                    if constexpr (kQ41) {
                        acc[r][c] = _mm512_fmadd_ps(
                            mx, _mm512_loadu_ps(reinterpret_cast<const float*>(yc + 192)),
                            acc[r][c]);
                    }
                }
            }
        }

        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m512 acc[NR][NC];
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_ps();
            const int64_t nb = n / 32;
            int64_t t = 0;
            for (; 3 * t + 3 <= nb; t++) step<true>(t, 3, x, bx, y, by, acc);
            if (3 * t < nb) step<false>(t, nb - 3 * t, x, bx, y, by, acc);
            for (int c = 0; c < NC; c++)
                for (int r = 0; r < NR; r++) out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]);
        }
    };
};

template <int NR, int NC>
using Q4_0TriTile = TriTile<sizeof(BlockQ4_0)>::K<NR, NC>;
template <int NR, int NC>
using Q4_1TriTile = TriTile<sizeof(BlockQ4_1)>::K<NR, NC>;

// vec_dot entry for the tri tiles: arranges a Q8_0 column first.
template <size_t BLK, template <int, int> class Tile>
void tri_vec_dot(int64_t n, float* out, const void* x, const void* y) {
    const int64_t nb = n / 32;
    std::vector<uint8_t> buf(tri_bytes<BLK>(n) + 64);
    uint8_t* col = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
    tri_arrange<BLK>(static_cast<const BlockQ8_0*>(y), nb, col);
    Tile<1, 1>::run(n, static_cast<const uint8_t*>(x), 0, col, 0, out, 1);
}

#endif  // FERRY_DIRECT_AVX512

#if FERRY_DIRECT_AVX2

// ---------------------------------------------------------------------------------------------
// AVX2 (+FMA, F16C) tiles, 256-bit. Same structure as the AVX-512 ones, one 32-element block
// per vector. The integer dots use vpmaddubsw (unsigned x signed bytes -> saturating int16
// pairs) and vpmaddwd: the weight quants enter as unsigned bytes where they are small enough
// that no pair sum can saturate (Q4 nibbles: 2 * 15 * 127), and Q8_0 weights through the
// sign trick (|x| times y with x's sign), which cannot saturate either (2 * 128 * 127).

// See the AVX-512 section: ask for the bytes the next tile reads, into L2.
inline void prefetch_next_tile(const uint8_t* p, size_t dist) {
    _mm_prefetch(reinterpret_cast<const char*>(p + dist), _MM_HINT_T1);
}

// Fixed tree: 8 -> 4 -> 2 -> 1 lanes.
inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

inline float h2f(const uint8_t* p) {
    return _cvtsh_ss(load_u16(p));
}

struct LoadF32 {
    static __m256 load(const uint8_t* p, int64_t k) {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + k);
    }
    static float one(const uint8_t* p, int64_t k) { return reinterpret_cast<const float*>(p)[k]; }
    static constexpr size_t kElem = 4;
};
struct LoadF16 {
    static __m256 load(const uint8_t* p, int64_t k) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * k)));
    }
    static float one(const uint8_t* p, int64_t k) { return h2f(p + 2 * k); }
    static constexpr size_t kElem = 2;
};
struct LoadBF16 {
    static __m256 load(const uint8_t* p, int64_t k) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static float one(const uint8_t* p, int64_t k) {
        const uint32_t u = static_cast<uint32_t>(load_u16(p + 2 * k)) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    static constexpr size_t kElem = 2;
};

template <class L>
struct FloatTile {
    template <int NR, int NC>
    struct K {
        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m256 acc[NR][NC];
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();
            int64_t k = 0;
            for (; k + 8 <= n; k += 8) {
                __m256 yv[NC];
                for (int c = 0; c < NC; c++) yv[c] = LoadF32::load(y + c * by, k);
                for (int r = 0; r < NR; r++) {
                    if (k % (64 / L::kElem) == 0) {
                        prefetch_next_tile(x + r * bx + k * L::kElem, 2 * NR * bx);
                    }
                    const __m256 xv = L::load(x + r * bx, k);
                    for (int c = 0; c < NC; c++) acc[r][c] = _mm256_fmadd_ps(xv, yv[c], acc[r][c]);
                }
            }
            for (int c = 0; c < NC; c++) {
                for (int r = 0; r < NR; r++) {
                    float s = hsum256(acc[r][c]);
                    for (int64_t j = k; j < n; j++)
                        s += L::one(x + r * bx, j) * LoadF32::one(y + c * by, j);
                    out[c * ldo + r] = s;
                }
            }
        }
    };
};

template <int NR, int NC>
using F32Tile = FloatTile<LoadF32>::K<NR, NC>;
template <int NR, int NC>
using F16Tile = FloatTile<LoadF16>::K<NR, NC>;
template <int NR, int NC>
using BF16Tile = FloatTile<LoadBF16>::K<NR, NC>;

// Q4_0 / Q4_1 / Q8_0 weights against Q8_0 columns, one block per vector.
enum class QKind { Q4_0, Q4_1, Q8_0 };

template <QKind KIND>
struct QTile {
    static constexpr size_t kBlock = KIND == QKind::Q4_0   ? sizeof(BlockQ4_0)
                                     : KIND == QKind::Q4_1 ? sizeof(BlockQ4_1)
                                                           : sizeof(BlockQ8_0);
    static constexpr size_t kQs = KIND == QKind::Q4_1 ? 4 : 2;  // offset of qs in a block

    template <int NR, int NC>
    struct K {
        static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by,
                        float* out, size_t ldo) {
            __m256 acc[NR][NC];
            float accm[NR][NC] = {};  // Q4_1: sum of m * dy * sum(q)
            for (int r = 0; r < NR; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();
            const __m256i ones16 = _mm256_set1_epi16(1);
            const __m256i m4 = _mm256_set1_epi8(0x0f);
            for (int64_t b = 0; b < n / 32; b++) {
                __m256i yv[NC], yoff[NC];
                float dy[NC], ys[NC];
                for (int c = 0; c < NC; c++) {
                    const uint8_t* yc = y + c * by + b * sizeof(BlockQ8_0);
                    dy[c] = h2f(yc);
                    yv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yc + 2));
                    if constexpr (KIND == QKind::Q4_0) {
                        // 8 * (q0 + q1) per pair: subtracted from the nibble products.
                        yoff[c] = _mm256_maddubs_epi16(_mm256_set1_epi8(8), yv[c]);
                    } else if constexpr (KIND == QKind::Q4_1) {
                        const __m256i s = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(_mm256_set1_epi8(1), yv[c]), ones16);
                        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s),
                                                  _mm256_extracti128_si256(s, 1));
                        t = _mm_hadd_epi32(t, t);
                        t = _mm_hadd_epi32(t, t);
                        ys[c] = dy[c] * static_cast<float>(_mm_cvtsi128_si32(t));
                    }
                }
                for (int r = 0; r < NR; r++) {
                    const uint8_t* xr = x + r * bx + b * kBlock;
                    if (kBlock * b % 64 < kBlock) prefetch_next_tile(xr, 2 * NR * bx);
                    const float dx = h2f(xr);
                    __m256i u;
                    if constexpr (KIND == QKind::Q8_0) {
                        u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + 2));
                    } else {
                        const __m128i q =
                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + kQs));
                        u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
                    }
                    const __m256i au = KIND == QKind::Q8_0 ? _mm256_abs_epi8(u) : u;
                    for (int c = 0; c < NC; c++) {
                        __m256i p;
                        if constexpr (KIND == QKind::Q8_0) {
                            p = _mm256_maddubs_epi16(au, _mm256_sign_epi8(yv[c], u));
                        } else if constexpr (KIND == QKind::Q4_0) {
                            p = _mm256_sub_epi16(_mm256_maddubs_epi16(au, yv[c]), yoff[c]);
                        } else {
                            p = _mm256_maddubs_epi16(au, yv[c]);
                        }
                        const __m256i i = _mm256_madd_epi16(p, ones16);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i),
                                                    _mm256_set1_ps(dx * dy[c]), acc[r][c]);
                        if constexpr (KIND == QKind::Q4_1) accm[r][c] += h2f(xr + 2) * ys[c];
                    }
                }
            }
            for (int c = 0; c < NC; c++)
                for (int r = 0; r < NR; r++) out[c * ldo + r] = hsum256(acc[r][c]) + accm[r][c];
        }
    };
};

// Q4_0 with two blocks per step: the two blocks' int16 pair sums are folded into one vector
// (vphaddw, then vpmaddwd: dwords [b0 b0 b1 b1] per 128 bits) before a single conversion and fma
// against the scales [dx0 dy0, dx0 dy0, dx1 dy1, dx1 dy1] x 2, which come from one vcvtph2ps of the
// two fp16 scales instead of two scalar conversions, multiplies and broadcasts. The nibbles are
// unpacked from one 128-bit broadcast load: a per-qword shift (0 in the low half, 4 in the high
// half) and a mask. The 8 * (sum of y pairs) offset is folded the same way once per column.
// Measured (bench_mul_mat, Zen 3): see bench/results/mul_mat-cpu.md.
template <int NR, int NC>
struct Q4_0Pair {
    static constexpr size_t kB = sizeof(BlockQ4_0);
    static constexpr size_t kY = sizeof(BlockQ8_0);

    // fp16 scales at p and p + stride -> [s0 s0 s1 s1 s0 s0 s1 s1].
    static __m256 scales(const uint8_t* p, size_t stride, __m128i dup) {
        __m128i h = _mm_cvtsi32_si128(load_u16(p));
        h = _mm_insert_epi16(h, load_u16(p + stride), 1);
        return _mm256_cvtph_ps(_mm_shuffle_epi8(h, dup));
    }

    static void run(int64_t n, const uint8_t* x, size_t bx, const uint8_t* y, size_t by, float* out,
                    size_t ldo) {
        const int64_t nb = n / 32;
        const int64_t np = nb / 2;
        if (np * 2 != nb) {
            // Odd block count: the one-block tile (same results up to summation order).
            QTile<QKind::Q4_0>::K<NR, NC>::run(n, x, bx, y, by, out, ldo);
            return;
        }
        __m256 acc[NR][NC];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps();
        const __m256i ones16 = _mm256_set1_epi16(1);
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        const __m256i eight = _mm256_set1_epi8(8);
        const __m256i shift = _mm256_setr_epi64x(0, 0, 4, 4);
        const __m128i dup = _mm_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3);
        for (int64_t b = 0; b < nb; b += 2) {
            __m256i y0[NC], y1[NC], yoff[NC];
            __m256 dy[NC];
            for (int c = 0; c < NC; c++) {
                const uint8_t* yc = y + c * by + b * kY;
                y0[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yc + 2));
                y1[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yc + kY + 2));
                yoff[c] = _mm256_hadd_epi16(_mm256_maddubs_epi16(eight, y0[c]),
                                            _mm256_maddubs_epi16(eight, y1[c]));
                dy[c] = scales(yc, kY, dup);
            }
            for (int r = 0; r < NR; r++) {
                const uint8_t* xr = x + r * bx + b * kB;
                if (kB * b % 64 < 2 * kB) prefetch_next_tile(xr, 2 * NR * bx);
                const __m256i q0 = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + 2)));
                const __m256i q1 = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + kB + 2)));
                const __m256i u0 = _mm256_and_si256(_mm256_srlv_epi64(q0, shift), m4);
                const __m256i u1 = _mm256_and_si256(_mm256_srlv_epi64(q1, shift), m4);
                const __m256 dx = scales(xr, kB, dup);
                for (int c = 0; c < NC; c++) {
                    // Words: sums of 4 products (|.| <= 4 * 15 * 127 before the offset).
                    const __m256i w =
                        _mm256_sub_epi16(_mm256_hadd_epi16(_mm256_maddubs_epi16(u0, y0[c]),
                                                           _mm256_maddubs_epi16(u1, y1[c])),
                                         yoff[c]);
                    const __m256i i = _mm256_madd_epi16(w, ones16);
                    acc[r][c] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dx, dy[c]), acc[r][c]);
                }
            }
        }
        for (int c = 0; c < NC; c++)
            for (int r = 0; r < NR; r++) out[c * ldo + r] = hsum256(acc[r][c]);
    }
};

template <int NR, int NC>
using Q4_0Tile = Q4_0Pair<NR, NC>;
template <int NR, int NC>
using Q4_1Tile = QTile<QKind::Q4_1>::K<NR, NC>;
template <int NR, int NC>
using Q8_0Tile = QTile<QKind::Q8_0>::K<NR, NC>;

#endif  // FERRY_DIRECT_AVX2

}  // namespace

// Columns from which repacking the weights pays off against the direct tiles (crossovers
// measured with bench_mul_mat at 2048 x 2048, single thread: Q4 ~8-10, Q8_0 ~12, K ~16-20).
constexpr int64_t kQ4MinCols = 8;
constexpr int64_t kQ8_0MinCols = 12;
constexpr int64_t kKMinCols = 16;

// Defined in packed.cpp and direct-k.cpp.
const PackedKernels* packed_kernels(Type t, bool portable);
DirectTileFn direct_k_tile(Type t);

namespace {

size_t q8_0_bytes(int64_t n) {
    return row_size(Type::Q8_0, n);
}
size_t q8_k_bytes(int64_t n) {
    return row_size(Type::Q8_K, n);
}
size_t f32_bytes(int64_t n) {
    return static_cast<size_t>(n) * sizeof(float);
}

MatKernels make(Type t, bool portable) {
    const PackedKernels* pk = packed_kernels(t, portable);
    auto q8_0 = [&](DirectTileFn fast, DirectTileFn port) {
        return MatKernels{Type::Q8_0, quantize_row_q8_0,
                          q8_0_bytes, portable ? port : fast,
                          pk,         t == Type::Q8_0 ? kQ8_0MinCols : kQ4MinCols};
    };
    auto q8_k = [&](DirectTileFn port) {
        DirectTileFn fast = direct_k_tile(t);
        const bool use_fast = fast && !portable;
        return MatKernels{Type::Q8_K, quantize_row_q8_k, q8_k_bytes, use_fast ? fast : port,
                          // Without a vector direct tile the packed path wins from 1 column.
                          pk, use_fast ? kKMinCols : 1};
    };
    auto f32 = [&](DirectTileFn fast, DirectTileFn port) {
        return MatKernels{Type::F32, nullptr, f32_bytes, portable ? port : fast, nullptr, 0};
    };
#if FERRY_DIRECT_AVX512
    if (!portable && (t == Type::Q4_0 || t == Type::Q4_1)) {
        if (t == Type::Q4_0) {
            return {Type::Q8_0,
                    tri_quantize<sizeof(BlockQ4_0)>,
                    tri_bytes<sizeof(BlockQ4_0)>,
                    dispatch<Q4_0TriTile>,
                    pk,
                    kQ4MinCols};
        }
        return {Type::Q8_0,
                tri_quantize<sizeof(BlockQ4_1)>,
                tri_bytes<sizeof(BlockQ4_1)>,
                dispatch<Q4_1TriTile>,
                pk,
                kQ4MinCols};
    }
#define FERRY_FAST(T, tile) dispatch<tile>
#elif FERRY_DIRECT_AVX2
#define FERRY_FAST(T, tile) dispatch<tile>
#else
#define FERRY_FAST(T, tile) tile_scalar<Type::T>
#endif
    switch (t) {
        case Type::F32:
            return f32(FERRY_FAST(F32, F32Tile), tile_scalar<Type::F32>);
        case Type::F16:
            return f32(FERRY_FAST(F16, F16Tile), tile_scalar<Type::F16>);
        case Type::BF16:
            return f32(FERRY_FAST(BF16, BF16Tile), tile_scalar<Type::BF16>);
        case Type::Q4_0:
            return q8_0(FERRY_FAST(Q4_0, Q4_0Tile), tile_scalar<Type::Q4_0>);
        case Type::Q4_1:
            return q8_0(FERRY_FAST(Q4_1, Q4_1Tile), tile_scalar<Type::Q4_1>);
        case Type::Q8_0:
            return q8_0(FERRY_FAST(Q8_0, Q8_0Tile), tile_scalar<Type::Q8_0>);
        case Type::Q4_K:
            return q8_k(tile_scalar<Type::Q4_K>);
        case Type::Q5_K:
            return q8_k(tile_scalar<Type::Q5_K>);
        case Type::Q6_K:
            return q8_k(tile_scalar<Type::Q6_K>);
        default:
            break;
    }
#undef FERRY_FAST
    FERRY_ASSERT(false && "mat_kernels: unsupported weight type");
    return {};
}

}  // namespace

// The types of direct-more.cpp (Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4).
const MatKernels* more_mat_kernels(Type t, bool portable);

const MatKernels& mat_kernels(Type t, bool portable) {
    if (const MatKernels* more = more_mat_kernels(t, portable)) return *more;
    static const struct Tables {
        MatKernels fast[9], port[9];
        Tables() {
            const Type ts[9] = {Type::F32,  Type::F16,  Type::BF16, Type::Q4_0, Type::Q4_1,
                                Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K};
            for (int i = 0; i < 9; i++) {
                fast[i] = make(ts[i], false);
                port[i] = make(ts[i], true);
            }
        }
    } tables;
    int i = 0;
    switch (t) {
        case Type::F32:
            i = 0;
            break;
        case Type::F16:
            i = 1;
            break;
        case Type::BF16:
            i = 2;
            break;
        case Type::Q4_0:
            i = 3;
            break;
        case Type::Q4_1:
            i = 4;
            break;
        case Type::Q8_0:
            i = 5;
            break;
        case Type::Q4_K:
            i = 6;
            break;
        case Type::Q5_K:
            i = 7;
            break;
        case Type::Q6_K:
            i = 8;
            break;
        default:
            FERRY_ASSERT(false && "mat_kernels: unsupported weight type");
    }
    return portable ? tables.port[i] : tables.fast[i];
}

void vec_dot(Type t, int64_t n, float* out, const void* x, const void* y) {
#if FERRY_DIRECT_AVX512
    // The Q4 tiles read a column layout of their own; arrange the Q8_0 blocks first.
    if (t == Type::Q4_0) return tri_vec_dot<sizeof(BlockQ4_0), Q4_0TriTile>(n, out, x, y);
    if (t == Type::Q4_1) return tri_vec_dot<sizeof(BlockQ4_1), Q4_1TriTile>(n, out, x, y);
#endif
    mat_kernels(t).direct(n, x, 0, 1, y, 0, 1, out, 1);
}

}  // namespace ferry::cpu::simd
