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
#include "core/env.h"
#include "core/quants.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backends/cpu/simd/x86.h"
#define FERRY_REPACK_AVX2 1
#endif
// AVX-512 builds repack Q4_0 and Q8_0 too: measured on a Zen 4 VM (bench/results/llama-cpu.md,
// stop 20) the repacked AVX2 tiles decode 1.10-1.49x faster than the AVX-512 direct tiles,
// while their prefill is 0.28-0.54x of the AVX-512 packed GEMM, so there prefill products
// unpack the repacked rows for the packed GEMM (packed_over_repacked).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__F16C__)
#define FERRY_REPACK_DIRECT_AVX512 1
#endif

namespace ferry::cpu::simd {
namespace {

constexpr int kR = kRepackRows;
constexpr size_t kQsOff = 2 * kR;  // 16: a block's quants after the 8 rows' scales

// Q4_0 and Q8_0 (layout in simd.h): 32-element blocks of an fp16 scale and 4V quant bytes
// (Q4_0: V = 4, nibble pairs; Q8_0: V = 8, int8). Per block b a group holds the 8 rows' scales,
// then V vectors of 32 bytes, bytes 4v .. 4v+3 of row r's quants at 16 + 32v + 4r.
template <Type T, int V>
struct Blocks32 {
    static constexpr size_t kBlk = 2 + 4 * V;
    static constexpr size_t kGroupBlk = kR * kBlk;  // one block of 8 rows

    static size_t group_bytes(int64_t n) { return kR * row_size(T, n); }

    static void repack(void* x, int64_t n, void* tmp) {
        const size_t rs = row_size(T, n);
        std::memcpy(tmp, x, kR * rs);
        const auto* src = static_cast<const uint8_t*>(tmp);
        auto* dst = static_cast<uint8_t*>(x);
        for (int64_t b = 0; b < n / 32; b++) {
            uint8_t* g = dst + b * kGroupBlk;
            for (int r = 0; r < kR; r++) {
                const uint8_t* blk = src + r * rs + b * kBlk;
                std::memcpy(g + 2 * r, blk, 2);
                for (int v = 0; v < V; v++)
                    std::memcpy(g + kQsOff + 32 * v + 4 * r, blk + 2 + 4 * v, 4);
            }
        }
    }

    static void unpack_row(const void* gp, int64_t n, int r, void* out) {
        const auto* g = static_cast<const uint8_t*>(gp);
        auto* o = static_cast<uint8_t*>(out);
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t* gb = g + b * kGroupBlk;
            uint8_t* blk = o + b * kBlk;
            std::memcpy(blk, gb + 2 * r, 2);
            for (int v = 0; v < V; v++)
                std::memcpy(blk + 2 + 4 * v, gb + kQsOff + 32 * v + 4 * r, 4);
        }
    }
};
using Q4_0Groups = Blocks32<Type::Q4_0, 4>;  // 18-byte blocks, 144 bytes per group block
using Q8_0Groups = Blocks32<Type::Q8_0, 8>;  // 34-byte blocks, 272 bytes per group block
static_assert(Q4_0Groups::kBlk == sizeof(BlockQ4_0) && Q8_0Groups::kBlk == sizeof(BlockQ8_0));

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
                const uint8_t* gb = g + b * Q4_0Groups::kGroupBlk;
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

// ---------------------------------------------------------------------------------------------
// Q4_K: per 256-element super-block i of a group, 1152 bytes at i * 1152 (layout in simd.h).

constexpr size_t kKBlk = sizeof(BlockQ4_K);            // 144
constexpr size_t kKGroupBlk = kR * sizeof(BlockQ4_K);  // 1152
constexpr size_t kKLow = 32, kKHigh = 96, kKQs = 128;

size_t q4_k_group_bytes(int64_t n) {
    return kR * row_size(Type::Q4_K, n);
}

// 6-bit scale and min j of a GGUF Q4_K block's 12 scale bytes q.
inline void k_scale_min(const uint8_t* q, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Scale and min j of row r in a repacked super-block.
inline void rk_scale_min(const uint8_t* gb, int j, int r, int* sc, int* mn) {
    const uint8_t lo = gb[kKLow + 8 * j + r];
    const uint8_t hb = gb[kKHigh + 8 * (j & 3) + r];
    const int h = j < 4 ? (hb & 0x0f) : (hb >> 4);
    *sc = (lo & 0x0f) | ((h & 3) << 4);
    *mn = (lo >> 4) | ((h >> 2) << 4);
}

void q4_k_repack(void* x, int64_t n, void* tmp) {
    const size_t rs = row_size(Type::Q4_K, n);
    std::memcpy(tmp, x, kR * rs);
    const auto* src = static_cast<const uint8_t*>(tmp);
    auto* dst = static_cast<uint8_t*>(x);
    for (int64_t i = 0; i < n / kQK_K; i++) {
        uint8_t* g = dst + i * kKGroupBlk;
        std::memset(g + kKHigh, 0, 32);
        for (int r = 0; r < kR; r++) {
            const uint8_t* blk = src + r * rs + i * kKBlk;
            std::memcpy(g + 2 * r, blk, 2);           // d
            std::memcpy(g + 16 + 2 * r, blk + 2, 2);  // dmin
            for (int j = 0; j < 8; j++) {
                int sc, mn;
                k_scale_min(blk + 4, j, &sc, &mn);
                g[kKLow + 8 * j + r] = static_cast<uint8_t>((sc & 0x0f) | ((mn & 0x0f) << 4));
                const int h = (sc >> 4) | ((mn >> 4) << 2);
                g[kKHigh + 8 * (j & 3) + r] |= static_cast<uint8_t>(j < 4 ? h : h << 4);
            }
            const uint8_t* qs = blk + 4 + kKScaleSize;
            for (int ch = 0; ch < 4; ch++) {
                for (int v = 0; v < 8; v++) {
                    std::memcpy(g + kKQs + 256 * ch + 32 * v + 4 * r, qs + 32 * ch + 4 * v, 4);
                }
            }
        }
    }
}

void q4_k_unpack_row(const void* gp, int64_t n, int r, void* out) {
    const auto* g = static_cast<const uint8_t*>(gp);
    auto* o = static_cast<uint8_t*>(out);
    for (int64_t i = 0; i < n / kQK_K; i++) {
        const uint8_t* gb = g + i * kKGroupBlk;
        uint8_t* blk = o + i * kKBlk;
        std::memcpy(blk, gb + 2 * r, 2);
        std::memcpy(blk + 2, gb + 16 + 2 * r, 2);
        int sc[8], mn[8];
        for (int j = 0; j < 8; j++) rk_scale_min(gb, j, r, &sc[j], &mn[j]);
        uint8_t* q = blk + 4;
        for (int j = 0; j < 4; j++) {
            q[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
            q[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
            q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
        }
        uint8_t* qs = blk + 4 + kKScaleSize;
        for (int ch = 0; ch < 4; ch++) {
            for (int v = 0; v < 8; v++) {
                std::memcpy(qs + 32 * ch + 4 * v, gb + kKQs + 256 * ch + 32 * v + 4 * r, 4);
            }
        }
    }
}

// Columns: per super-block the 8 sub-block sums of the quants (int16), then the Q8_K blocks.
size_t k_col_extras(int64_t n) {
    return static_cast<size_t>(n / kQK_K) * 16;
}
size_t q4_k_b_bytes(int64_t n) {
    return k_col_extras(n) + row_size(Type::Q8_K, n);
}

void q4_k_quantize_b(const float* x, void* y, int64_t n) {
    auto* base = static_cast<uint8_t*>(y);
    uint8_t* q = base + k_col_extras(n);
    quantize_row_q8_k(x, q, n);
    for (int64_t i = 0; i < n / kQK_K; i++) {
        const auto* blk = reinterpret_cast<const BlockQ8_K*>(q + i * sizeof(BlockQ8_K));
        for (int j = 0; j < 8; j++) {
            const int16_t s = static_cast<int16_t>(blk->bsums[2 * j] + blk->bsums[2 * j + 1]);
            std::memcpy(base + 16 * i + 2 * j, &s, 2);
        }
    }
}

inline const BlockQ8_K* k_col_block(const uint8_t* yc, int64_t n, int64_t i) {
    return reinterpret_cast<const BlockQ8_K*>(yc + k_col_extras(n) + i * sizeof(BlockQ8_K));
}

void q4_k_tile_scalar(int64_t n, const void* gp, const void* yp, size_t by, int nc, float* out,
                      size_t ldo) {
    const auto* g = static_cast<const uint8_t*>(gp);
    for (int c = 0; c < nc; c++) {
        const uint8_t* yc = static_cast<const uint8_t*>(yp) + c * by;
        for (int r = 0; r < kR; r++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < n / kQK_K; i++) {
                const uint8_t* gb = g + i * kKGroupBlk;
                const BlockQ8_K* y = k_col_block(yc, n, i);
                int32_t isum = 0, msum = 0;
                for (int j = 0; j < 8; j++) {
                    int sc, mn;
                    rk_scale_min(gb, j, r, &sc, &mn);
                    const int ch = j / 2, hi = j % 2;
                    int32_t dot = 0;
                    for (int v = 0; v < 8; v++) {
                        for (int b = 0; b < 4; b++) {
                            const uint8_t byte = gb[kKQs + 256 * ch + 32 * v + 4 * r + b];
                            const int u = hi ? byte >> 4 : byte & 0x0f;
                            dot += u * y->qs[64 * ch + 32 * hi + 4 * v + b];
                        }
                    }
                    isum += sc * dot;
                    int16_t bs;
                    std::memcpy(&bs, yc + 16 * i + 2 * j, 2);
                    msum += mn * bs;
                }
                fp16_t hd, hm;
                std::memcpy(&hd, gb + 2 * r, 2);
                std::memcpy(&hm, gb + 16 + 2 * r, 2);
                acc = std::fma(static_cast<float>(isum), fp16_to_fp32(hd) * y->d, acc);
                acc = std::fma(static_cast<float>(msum), -(fp16_to_fp32(hm) * y->d), acc);
            }
            out[c * ldo + r] = acc;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q6_K: per 256-element super-block i of a group, 1680 bytes at i * 1680 (layout in simd.h).
// Activation columns are plain Q8_K blocks (their bsums are per 16 elements, the scale block).

constexpr size_t k6Blk = sizeof(BlockQ6_K);            // 210
constexpr size_t k6GroupBlk = kR * sizeof(BlockQ6_K);  // 1680
constexpr size_t k6Sc = 16, k6Ql = 144, k6Qh = 1168;

size_t q6_k_group_bytes(int64_t n) {
    return kR * row_size(Type::Q6_K, n);
}

void q6_k_repack(void* x, int64_t n, void* tmp) {
    const size_t rs = row_size(Type::Q6_K, n);
    std::memcpy(tmp, x, kR * rs);
    const auto* src = static_cast<const uint8_t*>(tmp);
    auto* dst = static_cast<uint8_t*>(x);
    for (int64_t i = 0; i < n / kQK_K; i++) {
        uint8_t* g = dst + i * k6GroupBlk;
        for (int r = 0; r < kR; r++) {
            const auto* blk = reinterpret_cast<const BlockQ6_K*>(src + r * rs + i * k6Blk);
            std::memcpy(g + 2 * r, &blk->d, 2);
            for (int j = 0; j < 16; j++) std::memcpy(g + k6Sc + 8 * j + r, &blk->scales[j], 1);
            for (int h = 0; h < 2; h++) {
                for (int w = 0; w < 16; w++) {
                    std::memcpy(g + k6Ql + 512 * h + 32 * w + 4 * r, blk->ql + 64 * h + 4 * w, 4);
                }
                for (int v = 0; v < 8; v++) {
                    std::memcpy(g + k6Qh + 256 * h + 32 * v + 4 * r, blk->qh + 32 * h + 4 * v, 4);
                }
            }
        }
    }
}

void q6_k_unpack_row(const void* gp, int64_t n, int r, void* out) {
    const auto* g = static_cast<const uint8_t*>(gp);
    auto* o = static_cast<uint8_t*>(out);
    for (int64_t i = 0; i < n / kQK_K; i++) {
        const uint8_t* gb = g + i * k6GroupBlk;
        auto* blk = reinterpret_cast<BlockQ6_K*>(o + i * k6Blk);
        std::memcpy(&blk->d, gb + 2 * r, 2);
        for (int j = 0; j < 16; j++) std::memcpy(&blk->scales[j], gb + k6Sc + 8 * j + r, 1);
        for (int h = 0; h < 2; h++) {
            for (int w = 0; w < 16; w++) {
                std::memcpy(blk->ql + 64 * h + 4 * w, gb + k6Ql + 512 * h + 32 * w + 4 * r, 4);
            }
            for (int v = 0; v < 8; v++) {
                std::memcpy(blk->qh + 32 * h + 4 * v, gb + k6Qh + 256 * h + 32 * v + 4 * r, 4);
            }
        }
    }
}

size_t q8_k_bytes(int64_t n) {
    return row_size(Type::Q8_K, n);
}
size_t no_extras(int64_t) {
    return 0;
}

// The 6-bit quant of element e (< 256) of row r in a repacked super-block.
inline int q6_u(const uint8_t* gb, int r, int e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;  // l = 4v + b
    const uint8_t ql = gb[k6Ql + 512 * h + 32 * ((s & 1) * 8 + l / 4) + 4 * r + l % 4];
    const uint8_t qh = gb[k6Qh + 256 * h + 32 * (l / 4) + 4 * r + l % 4];
    const int lo = s < 2 ? (ql & 0x0f) : (ql >> 4);
    return lo | (((qh >> (2 * s)) & 3) << 4);
}

void q6_k_tile_scalar(int64_t n, const void* gp, const void* yp, size_t by, int nc, float* out,
                      size_t ldo) {
    const auto* g = static_cast<const uint8_t*>(gp);
    for (int c = 0; c < nc; c++) {
        const auto* yc = static_cast<const uint8_t*>(yp) + c * by;
        for (int r = 0; r < kR; r++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < n / kQK_K; i++) {
                const uint8_t* gb = g + i * k6GroupBlk;
                const auto* y = reinterpret_cast<const BlockQ8_K*>(yc + i * sizeof(BlockQ8_K));
                int32_t isum = 0, osum = 0;
                for (int j = 0; j < 16; j++) {
                    const int sc = static_cast<int8_t>(gb[k6Sc + 8 * j + r]);
                    int32_t dot = 0;
                    for (int e = 16 * j; e < 16 * j + 16; e++) dot += q6_u(gb, r, e) * y->qs[e];
                    isum += sc * dot;
                    osum += sc * y->bsums[j];
                }
                fp16_t hd;
                std::memcpy(&hd, gb + 2 * r, 2);
                acc = std::fma(static_cast<float>(isum - 32 * osum), fp16_to_fp32(hd) * y->d, acc);
            }
            out[c * ldo + r] = acc;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q8_0: per 32-element block b of a group, 272 bytes at b * 272 (= 8 GGUF blocks of 34): the
// 8 rows' fp16 scales, then 8 vectors of 32 bytes, vector v holding quants 4v .. 4v+3 of row r
// at 16 + 32v + 4r. Columns are plain Q8_0 blocks. Per row and column, in both kernels:
//     isum_b = sum_k w[k] * q[k]   (exact int32)
//     acc    = fma(float(isum_b), d_x[r] * d_y, acc)   over blocks b in order

size_t q8_0_b_bytes(int64_t n) {
    return row_size(Type::Q8_0, n);
}

void q8_0_tile_scalar(int64_t n, const void* gp, const void* yp, size_t by, int nc, float* out,
                      size_t ldo) {
    const auto* g = static_cast<const uint8_t*>(gp);
    for (int c = 0; c < nc; c++) {
        const auto* yb =
            reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(yp) + c * by);
        for (int r = 0; r < kR; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < n / 32; b++) {
                const uint8_t* gb = g + b * Q8_0Groups::kGroupBlk;
                int32_t isum = 0;
                for (int v = 0; v < 8; v++) {
                    for (int i = 0; i < 4; i++) {
                        isum += static_cast<int8_t>(gb[kQsOff + 32 * v + 4 * r + i]) *
                                yb[b].qs[4 * v + i];
                    }
                }
                fp16_t hx, hy;
                std::memcpy(&hx, gb + 2 * r, 2);
                std::memcpy(&hy, &yb[b].d, 2);
                acc = std::fma(static_cast<float>(isum), fp16_to_fp32(hx) * fp16_to_fp32(hy), acc);
            }
            out[c * ldo + r] = acc;
        }
    }
}

#if FERRY_REPACK_AVX2

// A group's weights are one sequential stream, but one that a decode tile consumes slowly
// enough (many operations per byte) for the hardware prefetcher to fall behind: each tile asks
// for the bytes it will read `ahead` bytes later, one request per cache line, into L2.
template <size_t kBytes>
inline void prefetch_ahead(const uint8_t* p, size_t ahead) {
    for (size_t o = 0; o < kBytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + ahead + o), _MM_HINT_T1);
}

inline int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// A repacked tile for nc <= 4 columns: its instantiation for that column count.
using TileN = void (*)(int64_t, const uint8_t*, const uint8_t*, size_t, float*, size_t);
using TileFn = void (*)(int64_t, const void*, const void*, size_t, int, float*, size_t);
template <TileN F1, TileN F2, TileN F3, TileN F4>
void tile_by_columns(int64_t n, const void* g, const void* y, size_t by, int nc, float* out,
                     size_t ldo) {
    static constexpr TileN table[4] = {F1, F2, F3, F4};
    table[nc - 1](n, static_cast<const uint8_t*>(g), static_cast<const uint8_t*>(y), by, out, ldo);
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
        const uint8_t* gb = g + b * Q4_0Groups::kGroupBlk;
        if (b % 4 == 0) prefetch_ahead<4 * Q4_0Groups::kGroupBlk>(gb, 16 * Q4_0Groups::kGroupBlk);
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

constexpr TileFn q4_0_tile_avx2 = tile_by_columns<q4_0_tile_avx2_n<1>, q4_0_tile_avx2_n<2>,
                                                  q4_0_tile_avx2_n<3>, q4_0_tile_avx2_n<4>>;

// Q4_K, NC <= 4 columns (the int16 sums of both halves of a chunk for NC columns stay in
// registers; the int32 totals and float accumulators may live in L1). Per super-block the scales
// and mins are unpacked once into int16 vectors: sc[j] with row r's scale in both words of dword r
// (for vpmaddwd against the chunk's int16 pair sums), mp[k] with (min 2k, min 2k + 1) of row r in
// dword r (against the column's sub-block sums 2k, 2k + 1).
template <int NC>
void q4_k_tile_avx2_n(int64_t n, const uint8_t* g, const uint8_t* y, size_t by, float* out,
                      size_t ldo) {
    const int64_t nsb = n / kQK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const __m128i dup0 = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i dup1 = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    const __m128i pair = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    __m256 acc[NC];
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t* gb = g + i * kKGroupBlk;
        prefetch_ahead<kKGroupBlk>(gb, 2 * kKGroupBlk);
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kKLow));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kKLow + 32));
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kKHigh));
        // Bytes 8j' + r (j' = j % 4, two j' per 128-bit lane): scales / mins of j 0..3, 4..7.
        const __m256i sc03 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
        const __m256i mn03 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
        const __m256i sc47 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(h, m30));
        const __m256i mn47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                             _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
        const __m128i sc_lane[4] = {_mm256_castsi256_si128(sc03), _mm256_extracti128_si256(sc03, 1),
                                    _mm256_castsi256_si128(sc47),
                                    _mm256_extracti128_si256(sc47, 1)};
        const __m128i mn_lane[4] = {_mm256_castsi256_si128(mn03), _mm256_extracti128_si256(mn03, 1),
                                    _mm256_castsi256_si128(mn47),
                                    _mm256_extracti128_si256(mn47, 1)};
        __m256i isum[NC], msum[NC];
        for (int c = 0; c < NC; c++) {
            isum[c] = _mm256_setzero_si256();
            msum[c] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 4; k++) {
            const __m256i mp = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mn_lane[k], pair));
            for (int c = 0; c < NC; c++) {
                const __m256i bs = _mm256_set1_epi32(load_i32(y + c * by + 16 * i + 4 * k));
                msum[c] = _mm256_add_epi32(msum[c], _mm256_madd_epi16(mp, bs));
            }
        }
        for (int ch = 0; ch < 4; ch++) {
            const uint8_t* wq = gb + kKQs + 256 * ch;
            __m256i plo[NC], phi[NC];
            for (int v = 0; v < 8; v++) {
                const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 32 * v));
                const __m256i lo = _mm256_and_si256(w, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                for (int c = 0; c < NC; c++) {
                    const int8_t* q = k_col_block(y + c * by, n, i)->qs + 64 * ch + 4 * v;
                    const __m256i a = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(q)));
                    const __m256i b = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(q + 32)));
                    plo[c] = v == 0 ? a : _mm256_add_epi16(plo[c], a);
                    phi[c] = v == 0 ? b : _mm256_add_epi16(phi[c], b);
                }
            }
            // Sub-blocks 2ch (low nibbles) and 2ch + 1: lane ch / 2 of sc03 / sc47... j = 2ch
            // sits at bytes 8 (j % 2) of lane (j % 4) / 2 of sc03 (j < 4) or sc47.
            const __m128i sl = sc_lane[ch];  // j = 2ch, 2ch + 1: lane ch of (sc03, sc47)
            const __m256i s0 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sl, dup0));
            const __m256i s1 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sl, dup1));
            for (int c = 0; c < NC; c++) {
                isum[c] = _mm256_add_epi32(
                    isum[c],
                    _mm256_add_epi32(_mm256_madd_epi16(plo[c], s0), _mm256_madd_epi16(phi[c], s1)));
            }
        }
        const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb)));
        const __m256 mx =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16)));
        for (int c = 0; c < NC; c++) {
            const __m256 dy = _mm256_set1_ps(k_col_block(y + c * by, n, i)->d);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(dx, dy), acc[c]);
            const __m256 nm = _mm256_xor_ps(_mm256_mul_ps(mx, dy), _mm256_set1_ps(-0.0f));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[c]), nm, acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * ldo, acc[c]);
}

constexpr TileFn q4_k_tile_avx2 = tile_by_columns<q4_k_tile_avx2_n<1>, q4_k_tile_avx2_n<2>,
                                                  q4_k_tile_avx2_n<3>, q4_k_tile_avx2_n<4>>;

// One stream S of Q6_K vector v: the 6-bit quants of elements 128h + 32S + 4v..+3 of 8 rows.
template <int S>
inline __m256i q6_stream(const uint8_t* ql, const uint8_t* qh, int v, __m256i m4, __m256i m30) {
    const __m256i l =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * ((S & 1) * 8 + v)));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * v));
    __m256i lo, hi;
    if constexpr (S < 2) {
        lo = _mm256_and_si256(l, m4);
    } else {
        lo = _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
    }
    if constexpr (S == 0) {
        hi = _mm256_slli_epi16(hb, 4);
    } else if constexpr (S == 1) {
        hi = _mm256_slli_epi16(hb, 2);
    } else if constexpr (S == 2) {
        hi = hb;
    } else {
        hi = _mm256_srli_epi16(hb, 2);
    }
    return _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
}

// Stream S of half h into isum: 8 vectors, two at a time (their int16 pair sums add up to at
// most 2 * 2 * 63 * 128 = 32256), each pair's sum meeting its 16-element block's scale.
template <int S, int NC>
inline void q6_half_stream(const uint8_t* gb, int h, const BlockQ8_K* const* yb, __m256i* isum,
                           __m256i m4, __m256i m30, __m128i dup0) {
    const uint8_t* ql = gb + k6Ql + 512 * h;
    const uint8_t* qh = gb + k6Qh + 256 * h;
    for (int vq = 0; vq < 2; vq++) {
        const int j = 8 * h + 2 * S + vq;
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + k6Sc + 8 * j)), dup0));
        for (int vp = 0; vp < 2; vp++) {
            const int v = 4 * vq + 2 * vp;
            const __m256i u0 = q6_stream<S>(ql, qh, v, m4, m30);
            const __m256i u1 = q6_stream<S>(ql, qh, v + 1, m4, m30);
            for (int c = 0; c < NC; c++) {
                const int8_t* q = yb[c]->qs + 128 * h + 32 * S + 4 * v;
                const __m256i p =
                    _mm256_add_epi16(_mm256_maddubs_epi16(u0, _mm256_set1_epi32(load_i32(q))),
                                     _mm256_maddubs_epi16(u1, _mm256_set1_epi32(load_i32(q + 4))));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, sc));
            }
        }
    }
}

// Q6_K, NC <= 4 columns. Per half h and vector v of a group, 4 byte streams s give elements
// 128h + 32s + 4v..+3 of the 8 rows: low (s < 2) or high nibbles of ql vector (s & 1) * 8 + v,
// and bits 2s, 2s + 1 of qh vector v as bits 4, 5.
template <int NC>
void q6_k_tile_avx2_n(int64_t n, const uint8_t* g, const uint8_t* y, size_t by, float* out,
                      size_t ldo) {
    const int64_t nsb = n / kQK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const __m128i dup0 = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i pair = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    __m256 acc[NC];
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t* gb = g + i * k6GroupBlk;
        prefetch_ahead<k6GroupBlk>(gb, 2 * k6GroupBlk);
        const BlockQ8_K* yb[NC];
        for (int c = 0; c < NC; c++) {
            yb[c] = reinterpret_cast<const BlockQ8_K*>(y + c * by + i * sizeof(BlockQ8_K));
        }
        __m256i isum[NC], osum[NC];
        for (int c = 0; c < NC; c++) {
            isum[c] = _mm256_setzero_si256();
            osum[c] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 8; k++) {
            const __m256i sp = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + k6Sc + 16 * k)), pair));
            for (int c = 0; c < NC; c++) {
                const __m256i bs = _mm256_set1_epi32(load_i32(yb[c]->bsums + 2 * k));
                osum[c] = _mm256_add_epi32(osum[c], _mm256_madd_epi16(sp, bs));
            }
        }
        for (int h = 0; h < 2; h++) {
            q6_half_stream<0, NC>(gb, h, yb, isum, m4, m30, dup0);
            q6_half_stream<1, NC>(gb, h, yb, isum, m4, m30, dup0);
            q6_half_stream<2, NC>(gb, h, yb, isum, m4, m30, dup0);
            q6_half_stream<3, NC>(gb, h, yb, isum, m4, m30, dup0);
        }
        const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb)));
        for (int c = 0; c < NC; c++) {
            const __m256i t = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(osum[c], 5));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t),
                                     _mm256_mul_ps(dx, _mm256_set1_ps(yb[c]->d)), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * ldo, acc[c]);
}

constexpr TileFn q6_k_tile_avx2 = tile_by_columns<q6_k_tile_avx2_n<1>, q6_k_tile_avx2_n<2>,
                                                  q6_k_tile_avx2_n<3>, q6_k_tile_avx2_n<4>>;

// Q8_0: vpmaddubsw takes |w| against the column's 4 broadcast quants with w's signs (each pair
// at most 2 * 128 * 127 = 32512: no saturation), vpmaddwd one int32 per row, added over the
// block's 8 vectors in int32.
template <int NC>
void q8_0_tile_avx2_n(int64_t n, const uint8_t* g, const uint8_t* y, size_t by, float* out,
                      size_t ldo) {
    const int64_t nb = n / 32;
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 acc[NC];
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* gb = g + b * Q8_0Groups::kGroupBlk;
        if (b % 2 == 0) prefetch_ahead<2 * Q8_0Groups::kGroupBlk>(gb, 8 * Q8_0Groups::kGroupBlk);
        __m256i isum[NC];
        for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
        for (int v = 0; v < 8; v++) {
            const __m256i w =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kQsOff + 32 * v));
            const __m256i aw = _mm256_abs_epi8(w);
            for (int c = 0; c < NC; c++) {
                const uint8_t* yq = y + c * by + b * Q8_0Groups::kBlk + 2;
                const __m256i q = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(yq + 4 * v)), w);
                isum[c] = _mm256_add_epi32(isum[c],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(aw, q), ones16));
            }
        }
        const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb)));
        for (int c = 0; c < NC; c++) {
            fp16_t hy;
            std::memcpy(&hy, y + c * by + b * Q8_0Groups::kBlk, 2);
            const float dy = fp16_to_fp32(hy);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]),
                                     _mm256_mul_ps(dx, _mm256_set1_ps(dy)), acc[c]);
        }
    }
    for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * ldo, acc[c]);
}

constexpr TileFn q8_0_tile_avx2 = tile_by_columns<q8_0_tile_avx2_n<1>, q8_0_tile_avx2_n<2>,
                                                  q8_0_tile_avx2_n<3>, q8_0_tile_avx2_n<4>>;

#endif  // FERRY_REPACK_AVX2

RepackedKernels make_q4_0(bool portable) {
    // The tail rows' direct tile must read plain Q8_0 blocks: the fast one where the fast
    // Q4_0 kernels quantize b to Q8_0 (AVX2, scalar builds), else the portable one.
    const MatKernels& fast = mat_kernels(Type::Q4_0, false);
    const MatKernels& port = mat_kernels(Type::Q4_0, true);
    const bool fast_reads_q8_0 = fast.quantize_b == port.quantize_b;
    RepackedKernels k{};
    k.type = Type::Q4_0;
    k.group_bytes = Q4_0Groups::group_bytes;
    k.repack = Q4_0Groups::repack;
    k.unpack_row = Q4_0Groups::unpack_row;
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

// FERRY_CPU_REPACK_Q8_0=0: Q8_0 keeps the GGUF layout (and its direct tiles) while the other
// types repack.
bool repack_q8_0() {
    static const bool on = !env_off("FERRY_CPU_REPACK_Q8_0");
    return on;
}

RepackedKernels make_q8_0(bool portable) {
    // The tail rows' direct tile reads plain Q8_0 blocks (as make_q4_0 checks).
    const MatKernels& fast = mat_kernels(Type::Q8_0, false);
    const MatKernels& port = mat_kernels(Type::Q8_0, true);
    const bool fast_reads_q8_0 = fast.quantize_b == port.quantize_b;
    RepackedKernels k{};
    k.type = Type::Q8_0;
    k.group_bytes = Q8_0Groups::group_bytes;
    k.repack = Q8_0Groups::repack;
    k.unpack_row = Q8_0Groups::unpack_row;
    k.quantize_b = quantize_row_q8_0;
    k.b_bytes = q8_0_b_bytes;
    k.direct_b_offset = no_extras;
    k.tile = q8_0_tile_scalar;
    k.direct = (!portable && fast_reads_q8_0) ? fast.direct : port.direct;
#if FERRY_REPACK_AVX2
    if (!portable) k.tile = q8_0_tile_avx2;
#endif
    return k;
}

RepackedKernels make_q4_k(bool portable) {
    // The fast and portable Q4_K direct tiles both read Q8_K blocks.
    RepackedKernels k{};
    k.type = Type::Q4_K;
    k.group_bytes = q4_k_group_bytes;
    k.repack = q4_k_repack;
    k.unpack_row = q4_k_unpack_row;
    k.quantize_b = q4_k_quantize_b;
    k.b_bytes = q4_k_b_bytes;
    k.direct_b_offset = k_col_extras;
    k.tile = q4_k_tile_scalar;
    k.direct = mat_kernels(Type::Q4_K, portable).direct;
#if FERRY_REPACK_AVX2
    if (!portable) k.tile = q4_k_tile_avx2;
#endif
    return k;
}

RepackedKernels make_q6_k(bool portable) {
    RepackedKernels k{};
    k.type = Type::Q6_K;
    k.group_bytes = q6_k_group_bytes;
    k.repack = q6_k_repack;
    k.unpack_row = q6_k_unpack_row;
    k.quantize_b = quantize_row_q8_k;
    k.b_bytes = q8_k_bytes;
    k.direct_b_offset = no_extras;
    k.tile = q6_k_tile_scalar;
    k.direct = mat_kernels(Type::Q6_K, portable).direct;
#if FERRY_REPACK_AVX2
    if (!portable) k.tile = q6_k_tile_avx2;
#endif
    return k;
}

}  // namespace

const RepackedKernels* repacked_kernels(Type t, bool portable) {
    if (t == Type::Q6_K) {
        static const RepackedKernels fast = make_q6_k(false);
        static const RepackedKernels port = make_q6_k(true);
        return portable ? &port : &fast;
    }
    if (t == Type::Q4_0) {
        static const RepackedKernels fast = make_q4_0(false);
        static const RepackedKernels port = make_q4_0(true);
        return portable ? &port : &fast;
    }
    if (t == Type::Q8_0 && repack_q8_0()) {
        static const RepackedKernels fast = make_q8_0(false);
        static const RepackedKernels port = make_q8_0(true);
        return portable ? &port : &fast;
    }
    if (t == Type::Q4_K) {
        static const RepackedKernels fast = make_q4_k(false);
        static const RepackedKernels port = make_q4_k(true);
        return portable ? &port : &fast;
    }
    return nullptr;
}

bool repack_by_default(Type t) {
#if FERRY_REPACK_DIRECT_AVX512
    // Q4_0 and Q8_0 only: Q4_K_M files (Q4_K, Q6_K) decoded at 0.99-1.38x but prefilled at
    // 0.88-0.96x repacked (the rows' unpacking costs more there).
    return (t == Type::Q4_0 || t == Type::Q8_0) && repacked_kernels(t) != nullptr;
#elif FERRY_REPACK_AVX2
    return repacked_kernels(t) != nullptr;
#else
    (void)t;
    return false;
#endif
}

bool packed_over_repacked() {
#if FERRY_REPACK_DIRECT_AVX512
    return true;
#else
    return false;
#endif
}

}  // namespace ferry::cpu::simd
