// SIMD kernels behind the CPU MUL_MAT: quantizers for the activation operand (b), dot products
// of weight rows with activation columns (the "direct" path, used for decode-sized batches) and
// an int8 GEMM over weight rows repacked into an interleaved layout (the "packed" path, used for
// prefill-sized batches).
//
// Every kernel has an AVX-512 path (VNNI for the integer dots) when compiled for it and a
// portable scalar path built on the reference code in core/quants. Each output's value depends
// only on its inputs and the path (direct or packed), never on which outputs are computed
// together, so tiling and threading never change results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/types.h"

namespace ferry::cpu::simd {

// Quantizes n floats (a multiple of 32 / 256) into Q8_0 / Q8_K blocks. Produces exactly the
// blocks of quants::quantize_row_q8_0 / quantize_row_q8_k.
void quantize_row_q8_0(const float* x, void* y, int64_t n);
void quantize_row_q8_k(const float* x, void* y, int64_t n);

// Dot of one weight row x (type t) with one column y (the type's vec_dot partner: F32 for the
// float types, Q8_0 or Q8_K blocks otherwise), n elements. Agrees with the reference vec_dot up
// to float rounding (the reference accumulates in double).
void vec_dot(Type t, int64_t n, float* out, const void* x, const void* y);

// --- Direct path ------------------------------------------------------------------------------
constexpr int kDirectRows = 4;  // most weight rows one direct tile computes
constexpr int kDirectCols = 4;  // most columns one direct tile computes

// out[c * ldo + r] = dot(x + r * bx, y + c * by) for r < nr <= kDirectRows, c < nc <=
// kDirectCols. bx, by in bytes; ldo in floats. The columns y are b rows as MatKernels::
// quantize_b made them: Q8_0 / Q8_K blocks, or (AVX-512 Q4_0 / Q4_1 tiles) a layout of the
// Q8_0 quants that faces the weight nibbles in place; F32 rows for the float types.
using DirectTileFn = void (*)(int64_t n, const void* x, size_t bx, int nr, const void* y, size_t by,
                              int nc, float* out, size_t ldo);

// --- Packed path ------------------------------------------------------------------------------
// A packed group holds kPackRows weight rows: 8-bit unsigned quants interleaved by 4 (bytes
// 4j..4j+3 of rows 0..15 form one 64-byte vector), then per block a float scale per row and,
// for types with a min, a float min per row. The activation columns are converted to a plain
// layout: n int8 quants, then per block the column's scale d, d * sum(q) and -offset * sum(q).
constexpr int kPackRows = 16;

struct PackedKernels {
    int block;  // elements per scale block of the packed layout (32, or 16 for Q6_K)
    // Bytes of one packed group of kPackRows rows of n elements.
    size_t (*group_bytes)(int64_t n);
    // Packs rows x + r * bx, r < nr <= kPackRows (missing rows are zero).
    void (*pack)(const void* x, size_t bx, int nr, int64_t n, void* group);
    // Bytes of one converted column of n elements (a multiple of 64).
    size_t (*column_bytes)(int64_t n);
    // Converts one F32 column of n elements.
    void (*convert_column)(const float* b, int64_t n, void* col);
    // out[c * ldo + r] for r < 2 * kPackRows of groups g0 and g1 (g1 may be nullptr: rows
    // 0..15 only), rows >= nr not stored; columns c < nc <= 4 at col + c * bcol.
    void (*gemm)(int64_t n, const void* g0, const void* g1, int nr, const void* col, size_t bcol,
                 int nc, float* out, size_t ldo);
};

struct MatKernels {
    Type vec_dot_type;       // the reference partner type of b
    FromFloatFn quantize_b;  // converts a b row for `direct`; nullptr: b is read in place (F32)
    size_t (*b_bytes)(int64_t n);  // bytes of one converted b row of n elements (read with
                                   // unaligned loads: any row stride works)
    DirectTileFn direct;           // never nullptr
    const PackedKernels* packed;   // nullptr when the type has no packed path
    // The packed path is used for matrices with at least this many columns (b.ne1).
    int64_t packed_min_cols;
};

// --- Repacked path (weights rewritten once by CpuDevice::prepare_weights) ---------------------
// Q4_0, Q4_K, Q6_K and Q8_0 weights in groups of kRepackRows consecutive rows, rewritten in place
// into the same bytes (docs/cpu-repacked-weights.md): per 32-element block b of the group, at b *
// 144:
//     bytes 0..15    the 8 rows' fp16 scales d (row r at 2r)
//     bytes 16..143  4 vectors of 32 bytes: vector v holds bytes 4v..4v+3 of each row's qs
//                    (row r at 16 + 32v + 4r), i.e. its elements 4v..4v+3 in the low nibbles
//                    and 16+4v..16+4v+3 in the high ones
// Q4_K weights, per 256-element super-block i of a group, at i * 1152:
//     bytes 0..15    the 8 rows' fp16 d; 16..31 their fp16 dmin
//     bytes 32..95   low 4 bits of scale (low nibble) and min (high nibble) of sub-block j of
//                    row r at 32 + 8j + r
//     bytes 96..127  their high 2 bits, (scale >> 4) | (min >> 4) << 2, at 96 + 8 (j % 4) + r,
//                    low nibble for j < 4, high nibble for j >= 4
//     bytes 128..    4 chunks of 256 bytes: chunk ch holds 8 vectors, vector v (at 128 + 256 ch
//                    + 32v) bytes 4v..4v+3 of each row's qs chunk ch (row r at 4r): elements
//                    64ch + 4v.. in the low nibbles, 64ch + 32 + 4v.. in the high ones
// Q6_K weights, per 256-element super-block i of a group, at i * 1680:
//     bytes 0..15     the 8 rows' fp16 d
//     bytes 16..143   int8 scale of 16-element block j of row r at 16 + 8j + r
//     bytes 144..1167 ql: half h (elements 128h..) at 144 + 512h, 16 vectors: vector w holds
//                     bytes 4w..4w+3 of each row's ql[64h..64h+63] (row r at 4r)
//     bytes 1168..    qh: half h at 1168 + 256h, 8 vectors: vector v bytes 4v..4v+3 of each
//                     row's qh[32h..32h+31]
//                     (bit fields and nibbles mean what they mean in GGUF's Q6_K)
// Q8_0 weights, per 32-element block b of a group, at b * 272:
//     bytes 0..15    the 8 rows' fp16 d
//     bytes 16..271  8 vectors of 32 bytes: vector v holds quants 4v..4v+3 of each row (row r at
//                    16 + 32v + 4r); FERRY_CPU_REPACK_Q8_0=0 keeps Q8_0 in the GGUF layout
// Rows past the last full group keep the GGUF layout. One vector of 8 rows x 4 quants meets 4
// broadcast activation quants, so a dot ends in one lane per row: no horizontal sums, and the
// weights of a group are one sequential stream.
constexpr int kRepackRows = 8;

struct RepackedKernels {
    Type type;
    // Bytes of one group of kRepackRows rows of n elements (= kRepackRows GGUF rows).
    size_t (*group_bytes)(int64_t n);
    // Rewrites the kRepackRows GGUF rows at x (consecutive) into a group; tmp: group_bytes.
    void (*repack)(void* x, int64_t n, void* tmp);
    // Writes row r < kRepackRows of group g in the GGUF layout (row_size(type, n) bytes).
    void (*unpack_row)(const void* g, int64_t n, int r, void* out);
    // Activation columns: quantize_b converts one F32 column of n elements into b_bytes(n)
    // bytes: per-block terms (Q4_0: a float scale and the int32 -8 * sum q per block; Q4_K:
    // the 8 sub-block sums of q per super-block, int16), then the column's Q8_0 / Q8_K blocks
    // from byte direct_b_offset(n) (what `direct` reads for the rows in GGUF layout).
    FromFloatFn quantize_b;
    size_t (*b_bytes)(int64_t n);
    size_t (*direct_b_offset)(int64_t n);
    // out[c * ldo + r] for the kRepackRows rows of group g, columns c < nc <= 4 at y + c * by.
    void (*tile)(int64_t n, const void* g, const void* y, size_t by, int nc, float* out,
                 size_t ldo);
    // The direct tile for rows in GGUF layout against the Q8_0 part of the same columns.
    DirectTileFn direct;
};

// Kernels for repacked weights of type t, nullptr when t has no repacked layout. portable:
// the scalar kernels (the oracle; their results are bit-identical to the vector ones).
const RepackedKernels* repacked_kernels(Type t, bool portable = false);
// Whether this build repacks weights of type t at load: where a vector kernel for the layout
// exists (AVX2 builds, and AVX-512 builds, whose prefill then unpacks rows for their packed
// GEMM: packed_over_repacked).
bool repack_by_default(Type t);
// Whether prefill products of repacked weights unpack their rows for the packed GEMM instead of
// running the repacked tiles (AVX-512 builds, whose packed GEMM is the faster prefill).
bool packed_over_repacked();

// Kernels for weight type t (a storage type other than I32). portable = true selects the
// scalar kernels even where SIMD ones exist (tests compare the two).
const MatKernels& mat_kernels(Type t, bool portable = false);

}  // namespace ferry::cpu::simd
