// Element types and GGUF block formats.
//
// Type ids, block sizes and byte layouts are exactly those of the GGUF specification, so
// tensors load from GGUF files with no conversion. A quantized row of ne0 elements is
// ne0 / block_size blocks of type_size bytes; ne0 must be a multiple of block_size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ferry/status.h"

namespace ferry {

enum class Type : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,  // internal dot-product partner for the K formats; not a storage type
    IQ4_NL = 20,
    IQ4_XS = 23,
    I32 = 26,
    BF16 = 30,
    MXFP4 = 39,
};

constexpr int kQK4_0 = 32;
constexpr int kQK4_1 = 32;
constexpr int kQK5_0 = 32;
constexpr int kQK5_1 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK4_NL = 32;
constexpr int kQKMXFP4 = 32;
constexpr int kQK_K = 256;
constexpr int kKScaleSize = 12;

using fp16_t = uint16_t;
using bf16_t = uint16_t;

// Block layouts (GGUF). Half-precision fields are raw IEEE binary16 bits.
struct BlockQ4_0 {
    fp16_t d;                // scale
    uint8_t qs[kQK4_0 / 2];  // nibbles: low nibble = element j, high nibble = element j + 16
};
struct BlockQ4_1 {
    fp16_t d;  // scale
    fp16_t m;  // min
    uint8_t qs[kQK4_1 / 2];
};
// Q5_0 / Q5_1: the fifth bit of element j is bit j of qh read as a little-endian uint32.
struct BlockQ5_0 {
    fp16_t d;                // x = d * (q - 16)
    uint8_t qh[4];           // high bits
    uint8_t qs[kQK5_0 / 2];  // low nibble = element j, high nibble = element j + 16
};
struct BlockQ5_1 {
    fp16_t d;  // x = d * q + m
    fp16_t m;
    uint8_t qh[4];
    uint8_t qs[kQK5_1 / 2];
};
struct BlockQ8_0 {
    fp16_t d;
    int8_t qs[kQK8_0];
};
// Q2_K: 16 groups of 16; x = d * (sc & 15) * q - dmin * (sc >> 4), q in [0, 3]. Element
// 128h + 32s + l (l < 32) is bits 2s..2s+1 of qs[32h + l]; its group is (128h + 32s + l) / 16.
struct BlockQ2_K {
    uint8_t scales[kQK_K / 16];  // low nibble scale, high nibble min, per group
    uint8_t qs[kQK_K / 4];       // 2-bit quants
    fp16_t d;
    fp16_t dmin;
};
// Q3_K: 16 groups of 16; x = d * (sc - 32) * (q - 4), q in [0, 7]. Element 128h + 32s + l:
// low bits = bits 2s..2s+1 of qs[32h + l], high bit = bit 4h + s of hmask[l]. The 6-bit scale
// of group g: low 4 bits from scales[g] (g < 8) or scales[g - 8] >> 4, high 2 bits are bits
// 2(g / 4).. of scales[8 + g % 4].
struct BlockQ3_K {
    uint8_t hmask[kQK_K / 8];
    uint8_t qs[kQK_K / 4];
    uint8_t scales[12];
    fp16_t d;
};
struct BlockQ4_K {
    fp16_t d;                     // super-block scale for the 6-bit scales
    fp16_t dmin;                  // super-block scale for the 6-bit mins
    uint8_t scales[kKScaleSize];  // 8 scales and 8 mins, 6 bits each
    uint8_t qs[kQK_K / 2];        // 4-bit quants
};
struct BlockQ5_K {
    fp16_t d;
    fp16_t dmin;
    uint8_t scales[kKScaleSize];
    uint8_t qh[kQK_K / 8];  // high bit of each quant
    uint8_t qs[kQK_K / 2];  // low 4 bits
};
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];      // low 4 bits
    uint8_t qh[kQK_K / 4];      // high 2 bits
    int8_t scales[kQK_K / 16];  // 8-bit scales
    fp16_t d;                   // super-block scale
};
struct BlockQ8_K {
    float d;
    int8_t qs[kQK_K];
    int16_t bsums[kQK_K / 16];  // sums of each group of 16 quants
};
// IQ4_NL: x = d * kIQ4NLValues[nibble]; nibbles as in Q4_0.
struct BlockIQ4_NL {
    fp16_t d;
    uint8_t qs[kQK4_NL / 2];
};
// IQ4_XS: 8 sub-blocks of 32; x = d * (ls - 32) * kIQ4NLValues[nibble], ls 6 bits: low 4 bits
// in scales_l[j / 2] >> 4 (j % 2), high 2 bits at bit 2j of scales_h. Sub-block j's nibbles are
// qs[16j .. 16j + 15], laid out as in Q4_0.
struct BlockIQ4_XS {
    fp16_t d;
    uint16_t scales_h;
    uint8_t scales_l[kQK_K / 64];
    uint8_t qs[kQK_K / 2];
};
// MXFP4 (OCP microscaling, E2M1 elements with a shared E8M0 exponent): x = 2^(e - 128) *
// kMXFP4Values[nibble] (the table holds doubled E2M1 values, hence 2^(e - 128) rather than
// 2^(e - 127)); nibbles as in Q4_0. No field wider than a byte: blocks need no alignment.
struct BlockMXFP4 {
    uint8_t e;
    uint8_t qs[kQKMXFP4 / 2];
};
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kMXFP4Values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 128) as a float (subnormal for e < 2; e = 255 gives 2^127, not NaN, as GGUF files
// expect).
inline float e8m0_to_fp32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// Converts n elements of a row. n must be a multiple of the block size.
using ToFloatFn = void (*)(const void* src, float* dst, int64_t n);
using FromFloatFn = void (*)(const float* src, void* dst, int64_t n);
// Dot product of n elements: x (this type) . y (vec_dot_type), result in *out.
using VecDotFn = void (*)(int64_t n, float* out, const void* x, const void* y);

struct TypeTraits {
    const char* name;    // "f32", "q4_0", ... (lower case, as in GGUF tooling)
    int64_t block_size;  // elements per block (1 for plain types)
    size_t type_size;    // bytes per block
    bool is_quantized;
    bool is_storage;         // may appear in a GGUF file / model tensor
    ToFloatFn to_float;      // reference dequantizer (nullptr for I32)
    FromFloatFn from_float;  // reference quantizer (nullptr for I32)
    Type vec_dot_type;       // type the second operand is converted to for vec_dot
    VecDotFn vec_dot;        // scalar reference dot (nullptr for I32)
};

// Traits for a type id; nullptr for ids ferry does not know.
const TypeTraits* type_traits_or_null(uint32_t id);
// Traits for a known type.
const TypeTraits& type_traits(Type t);
inline const char* type_name(Type t) {
    return type_traits(t).name;
}
// Parses "f32", "Q4_0", "q4_k", ... (case-insensitive).
Expected<Type> type_from_name(const char* name);
// All types that are valid tensor storage types (excludes Q8_K).
const Type* storage_types(int* count);

inline int64_t block_size(Type t) {
    return type_traits(t).block_size;
}
inline size_t type_size(Type t) {
    return type_traits(t).type_size;
}
inline bool is_quantized(Type t) {
    return type_traits(t).is_quantized;
}

// Bytes of a row of ne0 elements; fails when ne0 is not a multiple of the block size or the
// size overflows.
Expected<size_t> row_size_checked(Type t, int64_t ne0);
// Same, for callers that already validated ne0 (asserts on misuse).
size_t row_size(Type t, int64_t ne0);

// IEEE half and bfloat16 conversions (round to nearest even).
float fp16_to_fp32(fp16_t h);
fp16_t fp32_to_fp16(float f);
inline float bf16_to_fp32(bf16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
bf16_t fp32_to_bf16(float f);

// Whole-row conversions that check the block size: dequantize / quantize n elements.
Status to_float_row(Type t, const void* src, float* dst, int64_t n);
Status from_float_row(Type t, const float* src, void* dst, int64_t n);

// The alignment, in bytes, that every element (or block) address of type t must keep, in
// views and in tensors received from outside: kernels load floats, halves and block scales
// directly. The one rule: validation (validate_node) and the remote server both use it.
// 4 for F32 / I32 / Q8_K, 1 for MXFP4 (byte fields only, 17-byte blocks), 2 for the other types
// (fp16 fields).
size_t element_alignment(Type t);

}  // namespace ferry
