// The packed MUL_MAT path: weight rows repacked into 16-row groups of interleaved unsigned
// 8-bit quants with float per-block scales (and mins), activation columns into plain int8
// quants with per-block scale and sums. Every weight format reduces to
//     w = s * (u - offset) + m        (per block of 32, or 16 for Q6_K; u unsigned)
// so one int8 GEMM kernel serves all of them:
//     dot = sum_blocks s * dy * (sum u * q - offset * sum q) + m * dy * sum q
// On AVX-512 VNNI, one vpdpbusd multiplies 4 consecutive quants of 16 weight rows (one vector)
// by the same 4 activation quants (broadcast), so the per-block scaling is done once per 16
// rows and column instead of once per dot product; the kernel keeps 2 groups (32 rows) x 4
// columns of accumulators in registers.
#include <algorithm>
#include <cstring>

#include "backends/cpu/simd/simd.h"
#include "core/quants.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include "backends/cpu/simd/x86.h"
#define FERRY_PACKED_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include "backends/cpu/simd/x86.h"
#define FERRY_PACKED_AVX2 1
#endif

namespace ferry::cpu::simd {

const PackedKernels* packed_kernels(Type t, bool portable);

namespace {

constexpr size_t align64(size_t n) {
    return (n + 63) / 64 * 64;
}

struct Cfg {
    int block;       // scale block of the packed layout
    int offset;      // subtracted from the unsigned quants
    bool has_min;    // per-block float min
    bool q8k;        // activation partner Q8_K (else Q8_0)
    int umax = 255;  // largest unsigned quant (the AVX2 GEMM's int16 sums depend on it)
};

// ---------------------------------------------------------------------------------------------
// Layout helpers

template <const Cfg& C>
size_t group_bytes(int64_t n) {
    const size_t nblk = static_cast<size_t>(n / C.block);
    return static_cast<size_t>(n) * kPackRows + nblk * kPackRows * 4 * (C.has_min ? 2 : 1);
}

template <const Cfg& C>
size_t column_bytes(int64_t n) {
    const size_t nblk = static_cast<size_t>(n / C.block);
    return align64(static_cast<size_t>(n)) + align64(nblk * 12);
}

struct GroupView {
    uint8_t* q;  // n * 16 bytes
    float* s;    // nblk * 16
    float* m;    // nblk * 16 (has_min only)
};

template <const Cfg& C>
GroupView group_view(void* g, int64_t n) {
    const int64_t nblk = n / C.block;
    auto* q = static_cast<uint8_t*>(g);
    float* s = reinterpret_cast<float*>(q + n * kPackRows);
    return {q, s, C.has_min ? s + nblk * kPackRows : nullptr};
}

struct ColView {
    const int8_t* q;
    const float* d;      // per block
    const float* dsum;   // d * sum q, per block
    const int32_t* off;  // -offset * sum q, per block
};

template <const Cfg& C>
ColView col_view(const void* col, int64_t n) {
    const int64_t nblk = n / C.block;
    const auto* base = static_cast<const uint8_t*>(col);
    const float* d = reinterpret_cast<const float*>(base + align64(static_cast<size_t>(n)));
    return {reinterpret_cast<const int8_t*>(base), d, d + nblk,
            reinterpret_cast<const int32_t*>(d + 2 * nblk)};
}

// Position of quant k of row r in a group.
inline size_t qpos(int64_t k, int r) {
    return static_cast<size_t>(k / 4) * 64 + static_cast<size_t>(r) * 4 +
           static_cast<size_t>(k & 3);
}

inline float h2f(fp16_t h) {
    return fp16_to_fp32(h);
}

// ---------------------------------------------------------------------------------------------
// Row unpackers: element k's unsigned quant, per-block scale and min of one weight row.

void k_scales(const uint8_t* q, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Elements [e0, e0 + len) of one weight row (len: a multiple of the type's block, at most
// kChunk): unsigned quants into u[0, len), scale and min of row r into the group.
template <Type T>
void unpack_row(const uint8_t* x, int64_t e0, int64_t len, int r, GroupView g, uint8_t* u) {
    if constexpr (T == Type::Q4_0 || T == Type::Q4_1) {
        constexpr bool q41 = T == Type::Q4_1;
        constexpr size_t bsz = q41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
        for (int64_t b = e0 / 32; b < (e0 + len) / 32; b++) {
            const uint8_t* blk = x + b * bsz;
            uint8_t* ub = u + (32 * b - e0);
            fp16_t d;
            std::memcpy(&d, blk, 2);
            g.s[b * kPackRows + r] = h2f(d);
            if constexpr (q41) {
                fp16_t m;
                std::memcpy(&m, blk + 2, 2);
                g.m[b * kPackRows + r] = h2f(m);
            }
            const uint8_t* qs = blk + (q41 ? 4 : 2);
#if FERRY_PACKED_AVX512 || FERRY_PACKED_AVX2
            // (The compiler's own vectorization of the loop below stalls on byte inserts.)
            const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
            const __m128i m4 = _mm_set1_epi8(0x0f);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(ub), _mm_and_si128(q, m4));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(ub + 16),
                             _mm_and_si128(_mm_srli_epi16(q, 4), m4));
#else
            for (int l = 0; l < 16; l++) {
                ub[l] = qs[l] & 0x0f;
                ub[l + 16] = qs[l] >> 4;
            }
#endif
        }
    } else if constexpr (T == Type::Q8_0) {
        for (int64_t b = e0 / 32; b < (e0 + len) / 32; b++) {
            const auto* blk = reinterpret_cast<const BlockQ8_0*>(x + b * sizeof(BlockQ8_0));
            uint8_t* ub = u + (32 * b - e0);
            fp16_t d;
            std::memcpy(&d, &blk->d, 2);
            g.s[b * kPackRows + r] = h2f(d);
#if FERRY_PACKED_AVX512 || FERRY_PACKED_AVX2
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(ub),
                                _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80))));
#else
            for (int l = 0; l < 32; l++) ub[l] = static_cast<uint8_t>(blk->qs[l] ^ 0x80);
#endif
        }
    } else if constexpr (T == Type::Q4_K || T == Type::Q5_K) {
        constexpr bool q5 = T == Type::Q5_K;
        constexpr size_t bsz = q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
        for (int64_t i = e0 / kQK_K; i < (e0 + len) / kQK_K; i++) {
            const uint8_t* blk = x + i * bsz;
            uint8_t* ub = u + (i * kQK_K - e0);
            fp16_t dh, mh;
            std::memcpy(&dh, blk, 2);
            std::memcpy(&mh, blk + 2, 2);
            const float d = h2f(dh), dmin = h2f(mh);
            const uint8_t* scales = blk + 4;
            const uint8_t* qh = blk + 4 + kKScaleSize;  // Q5_K only
            const uint8_t* qs = blk + 4 + kKScaleSize + (q5 ? 32 : 0);
            for (int j = 0; j < 8; j++) {
                int sc, mn;
                k_scales(scales, j, &sc, &mn);
                const int64_t b = i * 8 + j;
                g.s[b * kPackRows + r] = d * static_cast<float>(sc);
                g.m[b * kPackRows + r] = -(dmin * static_cast<float>(mn));
            }
            for (int c = 0; c < 4; c++) {
                for (int l = 0; l < 32; l++) {
                    const uint8_t byte = qs[32 * c + l];
                    int lo = byte & 0x0f, hi = byte >> 4;
                    if constexpr (q5) {
                        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    ub[64 * c + l] = static_cast<uint8_t>(lo);
                    ub[64 * c + 32 + l] = static_cast<uint8_t>(hi);
                }
            }
        }
    } else if constexpr (T == Type::Q6_K) {
        for (int64_t i = e0 / kQK_K; i < (e0 + len) / kQK_K; i++) {
            const auto* blk = reinterpret_cast<const BlockQ6_K*>(x + i * sizeof(BlockQ6_K));
            fp16_t dh;
            std::memcpy(&dh, &blk->d, 2);
            const float d = h2f(dh);
            for (int j = 0; j < 16; j++) {
                g.s[(i * 16 + j) * kPackRows + r] = d * static_cast<float>(blk->scales[j]);
            }
            for (int h = 0; h < 2; h++) {
                const uint8_t* ql = blk->ql + 64 * h;
                const uint8_t* qh = blk->qh + 32 * h;
                uint8_t* ue = u + (i * kQK_K - e0) + 128 * h;
                for (int l = 0; l < 32; l++) {
                    ue[l] = static_cast<uint8_t>((ql[l] & 0x0f) | ((qh[l] & 3) << 4));
                    ue[l + 32] =
                        static_cast<uint8_t>((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4));
                    ue[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                    ue[l + 96] =
                        static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
                }
            }
        }
    }
}

// Interleaves rows u[r * kChunk + k] (r < 16, k < len) into the group's layout from element e0:
// dword j of the 16 rows becomes the 64-byte vector j.
constexpr int64_t kChunk = 256;
void interleave(const uint8_t* u, int64_t len, uint8_t* q) {
#if FERRY_PACKED_AVX512
    const __m512i rows =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(static_cast<int>(kChunk)));
    for (int64_t j = 0; j < len / 4; j++) {
        _mm512_storeu_si512(q + j * 64, _mm512_i32gather_epi32(rows, u + 4 * j, 1));
    }
#elif FERRY_PACKED_AVX2
    // 8 x 8 dword transposes (gathers are slow on AVX2 machines): rows 8h..8h+7, dwords
    // j..j+7 -> vectors j..j+7, half h.
    int64_t j = 0;
    for (; j + 8 <= len / 4; j += 8) {
        for (int h = 0; h < 2; h++) {
            __m256i r[8];
            for (int i = 0; i < 8; i++) {
                r[i] = _mm256_loadu_si256(
                    reinterpret_cast<const __m256i*>(u + (8 * h + i) * kChunk + 4 * j));
            }
            __m256i t[8], v[8];
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                v[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
                v[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
                v[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
                v[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
            }
            // v[0..3]: rows 0-3, dwords (0, 4), (1, 5), (2, 6), (3, 7) by 128-bit lane; v[4..7]
            // the same for rows 4-7.
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + (j + i) * 64 + 32 * h),
                                    _mm256_permute2x128_si256(v[i], v[i + 4], 0x20));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + (j + i + 4) * 64 + 32 * h),
                                    _mm256_permute2x128_si256(v[i], v[i + 4], 0x31));
            }
        }
    }
    for (; j < len / 4; j++) {
        for (int r = 0; r < kPackRows; r++)
            std::memcpy(q + j * 64 + r * 4, u + r * kChunk + 4 * j, 4);
    }
#else
    for (int64_t j = 0; j < len / 4; j++) {
        for (int r = 0; r < kPackRows; r++)
            std::memcpy(q + j * 64 + r * 4, u + r * kChunk + 4 * j, 4);
    }
#endif
}

template <Type T>
constexpr size_t kChunkBytes = kChunk /
                               (T == Type::Q4_K || T == Type::Q5_K || T == Type::Q6_K ? kQK_K
                                                                                      : 32) *
                               (T == Type::Q4_0   ? sizeof(BlockQ4_0)
                                : T == Type::Q4_1 ? sizeof(BlockQ4_1)
                                : T == Type::Q8_0 ? sizeof(BlockQ8_0)
                                : T == Type::Q4_K ? sizeof(BlockQ4_K)
                                : T == Type::Q5_K ? sizeof(BlockQ5_K)
                                                  : sizeof(BlockQ6_K));

template <Type T, const Cfg& C>
void pack(const void* x, size_t bx, int nr, int64_t n, void* group) {
    const GroupView g = group_view<C>(group, n);
    // Scales and mins of missing rows are zero; their quants are zeroed chunk by chunk.
    std::memset(g.s, 0, group_bytes<C>(n) - static_cast<size_t>(n) * kPackRows);
    alignas(64) uint8_t u[kPackRows * kChunk];
    for (int64_t e0 = 0; e0 < n; e0 += kChunk) {
        const int64_t len = std::min(kChunk, n - e0);
        for (int r = 0; r < kPackRows; r++) {
            if (r < nr) {
                const uint8_t* xr = static_cast<const uint8_t*>(x) + r * bx;
                // 16 short interleaved runs defeat the hardware prefetchers: ask for the
                // chunk after next of this row now.
                const int64_t ahead = e0 + 2 * kChunk;
                if (ahead < n) {
                    const uint8_t* pf = xr + row_size(T, ahead);
                    for (size_t o = 0; o < kChunkBytes<T>; o += 64) {
                        __builtin_prefetch(pf + o, 0, 2);  // into L2, as in direct.cpp
                    }
                }
                unpack_row<T>(xr, e0, len, r, g, u + r * kChunk);
            } else {
                std::memset(u + r * kChunk, 0, static_cast<size_t>(len));
            }
        }
        interleave(u, len, g.q + e0 * kPackRows);
    }
}

// ---------------------------------------------------------------------------------------------
// Column conversion: quantize with the direct path's quantizer, then split into plain quants
// and per-block scale and sums.

template <const Cfg& C>
void convert_column(const float* b, int64_t n, void* col) {
    auto* base = static_cast<uint8_t*>(col);
    int8_t* q = reinterpret_cast<int8_t*>(base);
    const int64_t nblk = n / C.block;
    float* d = reinterpret_cast<float*>(base + align64(static_cast<size_t>(n)));
    float* dsum = d + nblk;
    int32_t* off = reinterpret_cast<int32_t*>(d + 2 * nblk);
    auto put = [&](int64_t blk, float dv, int sum) {
        d[blk] = dv;
        dsum[blk] = dv * static_cast<float>(sum);
        off[blk] = -C.offset * sum;
    };
    if constexpr (C.q8k) {
        BlockQ8_K tmp;
        const int per = kQK_K / C.block;  // scale blocks per super-block
        const int groups = C.block / 16;  // bsums per scale block
        for (int64_t i = 0; i < n / kQK_K; i++) {
            quantize_row_q8_k(b + i * kQK_K, &tmp, kQK_K);
            std::memcpy(q + i * kQK_K, tmp.qs, kQK_K);
            for (int j = 0; j < per; j++) {
                int sum = 0;
                for (int g = 0; g < groups; g++) sum += tmp.bsums[j * groups + g];
                put(i * per + j, tmp.d, sum);
            }
        }
    } else {
        BlockQ8_0 tmp;
        for (int64_t i = 0; i < n / kQK8_0; i++) {
            quantize_row_q8_0(b + i * kQK8_0, &tmp, kQK8_0);
            std::memcpy(q + i * kQK8_0, tmp.qs, kQK8_0);
            int sum = 0;
            for (int l = 0; l < kQK8_0; l++) sum += tmp.qs[l];
            put(i, fp16_to_fp32(tmp.d), sum);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GEMM kernels

// Portable: same arithmetic as the vector kernel (exact integer block sums, float scaling).
template <const Cfg& C>
void gemm_scalar(int64_t n, const void* g0, const void* g1, int nr, const void* col, size_t bcol,
                 int nc, float* out, size_t ldo) {
    const int64_t nblk = n / C.block;
    for (int c = 0; c < nc; c++) {
        const ColView y = col_view<C>(static_cast<const uint8_t*>(col) + c * bcol, n);
        for (int r = 0; r < nr; r++) {
            const void* gp = r < kPackRows ? g0 : g1;
            const int rr = r % kPackRows;
            const GroupView g = group_view<C>(const_cast<void*>(gp), n);
            float acc = 0.0f;
            for (int64_t b = 0; b < nblk; b++) {
                int32_t isum = y.off[b];
                for (int l = 0; l < C.block; l++) {
                    const int64_t k = b * C.block + l;
                    isum += g.q[qpos(k, rr)] * y.q[k];
                }
                acc += static_cast<float>(isum) * (g.s[b * kPackRows + rr] * y.d[b]);
                if (C.has_min) acc += g.m[b * kPackRows + rr] * y.dsum[b];
            }
            out[c * ldo + r] = acc;
        }
    }
}

#if FERRY_PACKED_AVX512

template <const Cfg& C, int G, int NC>
void gemm_avx512_n(int64_t n, const void* g0, const void* g1, int nr, const uint8_t* col,
                   size_t bcol, float* out, size_t ldo) {
    const int64_t nblk = n / C.block;
    const GroupView gv[2] = {group_view<C>(const_cast<void*>(g0), n),
                             group_view<C>(const_cast<void*>(G > 1 ? g1 : g0), n)};
    ColView y[NC];
    for (int c = 0; c < NC; c++) y[c] = col_view<C>(col + c * bcol, n);
    __m512 acc[G][NC];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < NC; c++) acc[g][c] = _mm512_setzero_ps();
    constexpr int kSteps = 0 + C.block / 4;
    for (int64_t b = 0; b < nblk; b++) {
        __m512i ia[G][NC];
        for (int c = 0; c < NC; c++) {
            const __m512i init = C.offset ? _mm512_set1_epi32(y[c].off[b]) : _mm512_setzero_si512();
            for (int g = 0; g < G; g++) ia[g][c] = init;
        }
        const size_t qoff = static_cast<size_t>(b) * C.block * kPackRows;
        const int64_t koff = b * C.block;
        for (int j = 0; j < kSteps; j++) {
            __m512i w[G];
            for (int g = 0; g < G; g++) w[g] = _mm512_loadu_si512(gv[g].q + qoff + j * 64);
            for (int c = 0; c < NC; c++) {
                int32_t v;
                std::memcpy(&v, y[c].q + koff + 4 * j, 4);
                const __m512i yb = _mm512_set1_epi32(v);
                for (int g = 0; g < G; g++) ia[g][c] = _mm512_dpbusd_epi32(ia[g][c], w[g], yb);
            }
        }
        __m512 sv[G], mv[G];
        for (int g = 0; g < G; g++) {
            sv[g] = _mm512_loadu_ps(gv[g].s + b * kPackRows);
            mv[g] = C.has_min ? _mm512_loadu_ps(gv[g].m + b * kPackRows) : _mm512_setzero_ps();
        }
        for (int c = 0; c < NC; c++) {
            const __m512 dy = _mm512_set1_ps(y[c].d[b]);
            for (int g = 0; g < G; g++) {
                acc[g][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[g][c]), _mm512_mul_ps(sv[g], dy),
                                            acc[g][c]);
            }
            if (C.has_min) {
                const __m512 ds = _mm512_set1_ps(y[c].dsum[b]);
                for (int g = 0; g < G; g++) acc[g][c] = _mm512_fmadd_ps(mv[g], ds, acc[g][c]);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        const int rows = std::min(kPackRows, nr - g * kPackRows);
        if (rows <= 0) continue;
        const __mmask16 m = static_cast<__mmask16>((1u << rows) - 1);
        for (int c = 0; c < NC; c++) {
            _mm512_mask_storeu_ps(out + c * ldo + g * kPackRows, m, acc[g][c]);
        }
    }
}

template <const Cfg& C>
void gemm_avx512(int64_t n, const void* g0, const void* g1, int nr, const void* col, size_t bcol,
                 int nc, float* out, size_t ldo) {
    using Fn =
        void (*)(int64_t, const void*, const void*, int, const uint8_t*, size_t, float*, size_t);
    static constexpr Fn table[2][4] = {
        {gemm_avx512_n<C, 1, 1>, gemm_avx512_n<C, 1, 2>, gemm_avx512_n<C, 1, 3>,
         gemm_avx512_n<C, 1, 4>},
        {gemm_avx512_n<C, 2, 1>, gemm_avx512_n<C, 2, 2>, gemm_avx512_n<C, 2, 3>,
         gemm_avx512_n<C, 2, 4>},
    };
    const int G = (g1 && nr > kPackRows) ? 2 : 1;
    table[G - 1][nc - 1](n, g0, g1, nr, static_cast<const uint8_t*>(col), bcol, out, ldo);
}

#endif  // FERRY_PACKED_AVX512

#if FERRY_PACKED_AVX2

// One group (16 rows: two 256-bit halves of each 64-byte vector) x NC columns, two columns at
// a time so that the integer accumulators, weights and broadcast activations stay in the 16
// registers. vpmaddubsw multiplies the unsigned weight quants by 4 broadcast activation
// quants; while u <= umax, the int16 pair sums of kRun steps cannot saturate (kRun * 2 * umax
// * 127 <= 32767) and are added before one vpmaddwd. Q8_0 (u = q + 128) would saturate even
// alone, so its quants are taken back to signed and multiplied with the sign trick (|q| times
// y with q's sign, at most 2 * 128 * 127); its offset term is then 0.
template <const Cfg& C, int NC>
void gemm_avx2_group(int64_t n, const GroupView& g, int rows, const ColView* y, float* out,
                     size_t ldo) {
    constexpr bool kSigned = C.offset == 128;
    constexpr int kSteps = C.block / 4;
    constexpr int kRun = kSigned ? 1 : C.umax <= 15 ? 8 : C.umax <= 31 ? 4 : 2;
    static_assert(kSigned || C.umax <= 63);
    static_assert(kSteps % kRun == 0);
    const int64_t nblk = n / C.block;
    const __m256i ones16 = _mm256_set1_epi16(1);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    __m256 acc[2][NC];
    for (int h = 0; h < 2; h++)
        for (int c = 0; c < NC; c++) acc[h][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        const uint8_t* wq = g.q + static_cast<size_t>(b) * C.block * kPackRows;
        const int64_t koff = b * C.block;
        __m256i ia[2][NC];
        for (int c0 = 0; c0 < NC; c0 += 2) {
            constexpr int kPair = NC >= 2 ? 2 : 1;
            const int np = std::min(kPair, NC - c0);
            __m256i ip[2][kPair];
            for (int c = 0; c < kPair; c++) {
                const __m256i init = (C.offset && !kSigned && c < np)
                                         ? _mm256_set1_epi32(y[c0 + c].off[b])
                                         : _mm256_setzero_si256();
                ip[0][c] = init;
                ip[1][c] = init;
            }
            for (int j = 0; j < kSteps; j += kRun) {
                __m256i p[2][kPair];
                for (int s = 0; s < kRun; s++) {
                    __m256i w[2];
                    for (int h = 0; h < 2; h++) {
                        w[h] = _mm256_loadu_si256(
                            reinterpret_cast<const __m256i*>(wq + (j + s) * 64 + 32 * h));
                    }
                    for (int c = 0; c < kPair; c++) {
                        if (c >= np) break;
                        int32_t v;
                        std::memcpy(&v, y[c0 + c].q + koff + 4 * (j + s), 4);
                        const __m256i yb = _mm256_set1_epi32(v);
                        for (int h = 0; h < 2; h++) {
                            __m256i m;
                            if constexpr (kSigned) {
                                const __m256i ws = _mm256_xor_si256(w[h], flip);
                                m = _mm256_maddubs_epi16(_mm256_abs_epi8(ws),
                                                         _mm256_sign_epi8(yb, ws));
                            } else {
                                m = _mm256_maddubs_epi16(w[h], yb);
                            }
                            p[h][c] = s == 0 ? m : _mm256_add_epi16(p[h][c], m);
                        }
                    }
                }
                for (int c = 0; c < kPair; c++) {
                    if (c >= np) break;
                    for (int h = 0; h < 2; h++) {
                        ip[h][c] = _mm256_add_epi32(ip[h][c], _mm256_madd_epi16(p[h][c], ones16));
                    }
                }
            }
            for (int c = 0; c < np; c++) {
                ia[0][c0 + c] = ip[0][c];
                ia[1][c0 + c] = ip[1][c];
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 sv = _mm256_loadu_ps(g.s + b * kPackRows + 8 * h);
            for (int c = 0; c < NC; c++) {
                acc[h][c] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[h][c]),
                                    _mm256_mul_ps(sv, _mm256_set1_ps(y[c].d[b])), acc[h][c]);
            }
            if constexpr (C.has_min) {
                const __m256 mv = _mm256_loadu_ps(g.m + b * kPackRows + 8 * h);
                for (int c = 0; c < NC; c++)
                    acc[h][c] = _mm256_fmadd_ps(mv, _mm256_set1_ps(y[c].dsum[b]), acc[h][c]);
            }
        }
    }
    for (int c = 0; c < NC; c++) {
        for (int h = 0; h < 2; h++) {
            const int nh = std::min(8, rows - 8 * h);
            if (nh <= 0) continue;
            if (nh == 8) {
                _mm256_storeu_ps(out + c * ldo + 8 * h, acc[h][c]);
            } else {
                alignas(32) float tmp[8];
                _mm256_store_ps(tmp, acc[h][c]);
                std::memcpy(out + c * ldo + 8 * h, tmp, static_cast<size_t>(nh) * sizeof(float));
            }
        }
    }
}

template <const Cfg& C>
void gemm_avx2(int64_t n, const void* g0, const void* g1, int nr, const void* col, size_t bcol,
               int nc, float* out, size_t ldo) {
    using Fn = void (*)(int64_t, const GroupView&, int, const ColView*, float*, size_t);
    static constexpr Fn table[4] = {gemm_avx2_group<C, 1>, gemm_avx2_group<C, 2>,
                                    gemm_avx2_group<C, 3>, gemm_avx2_group<C, 4>};
    ColView y[4];
    for (int c = 0; c < nc; c++) y[c] = col_view<C>(static_cast<const uint8_t*>(col) + c * bcol, n);
    table[nc - 1](n, group_view<C>(const_cast<void*>(g0), n), std::min(nr, kPackRows), y, out, ldo);
    if (g1 && nr > kPackRows) {
        table[nc - 1](n, group_view<C>(const_cast<void*>(g1), n), nr - kPackRows, y,
                      out + kPackRows, ldo);
    }
}

// A layout whose u may exceed 63 without being Q8_0's q + 128 has no AVX2 kernel.
template <const Cfg& C>
constexpr auto gemm_avx2_or_scalar() {
    if constexpr (C.offset == 128 || C.umax <= 63) {
        return gemm_avx2<C>;
    } else {
        return gemm_scalar<C>;
    }
}

#endif  // FERRY_PACKED_AVX2

constexpr Cfg kCfgQ4_0 = {32, 8, false, false, 15};
constexpr Cfg kCfgQ4_1 = {32, 0, true, false, 15};
constexpr Cfg kCfgQ8_0 = {32, 128, false, false, 255};
constexpr Cfg kCfgQ4_K = {32, 0, true, true, 15};
constexpr Cfg kCfgQ5_K = {32, 0, true, true, 31};
constexpr Cfg kCfgQ6_K = {16, 32, false, true, 63};

template <Type T, const Cfg& C, bool PORTABLE>
constexpr PackedKernels make_packed() {
#if FERRY_PACKED_AVX512
    constexpr auto gemm = PORTABLE ? gemm_scalar<C> : gemm_avx512<C>;
#elif FERRY_PACKED_AVX2
    constexpr auto gemm = PORTABLE ? gemm_scalar<C> : gemm_avx2_or_scalar<C>();
#else
    constexpr auto gemm = gemm_scalar<C>;
#endif
    return {C.block, group_bytes<C>, pack<T, C>, column_bytes<C>, convert_column<C>, gemm};
}

#define FERRY_PACKED(T)                                                        \
    constexpr PackedKernels kFast##T = make_packed<Type::T, kCfg##T, false>(); \
    constexpr PackedKernels kPort##T = make_packed<Type::T, kCfg##T, true>();
FERRY_PACKED(Q4_0)
FERRY_PACKED(Q4_1)
FERRY_PACKED(Q8_0)
FERRY_PACKED(Q4_K)
FERRY_PACKED(Q5_K)
FERRY_PACKED(Q6_K)
#undef FERRY_PACKED

}  // namespace

const PackedKernels* packed_kernels(Type t, bool portable) {
    switch (t) {
        case Type::Q4_0:
            return portable ? &kPortQ4_0 : &kFastQ4_0;
        case Type::Q4_1:
            return portable ? &kPortQ4_1 : &kFastQ4_1;
        case Type::Q8_0:
            return portable ? &kPortQ8_0 : &kFastQ8_0;
        case Type::Q4_K:
            return portable ? &kPortQ4_K : &kFastQ4_K;
        case Type::Q5_K:
            return portable ? &kPortQ5_K : &kFastQ5_K;
        case Type::Q6_K:
            return portable ? &kPortQ6_K : &kFastQ6_K;
        default:
            return nullptr;
    }
}

}  // namespace ferry::cpu::simd
