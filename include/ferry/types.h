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
    Q8_0 = 8,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,  // internal dot-product partner for the K formats; not a storage type
    I32 = 26,
    BF16 = 30,
};

constexpr int kQK4_0 = 32;
constexpr int kQK4_1 = 32;
constexpr int kQK8_0 = 32;
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
struct BlockQ8_0 {
    fp16_t d;
    int8_t qs[kQK8_0];
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
static_assert(sizeof(BlockQ4_0) == 18);
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
size_t element_alignment(Type t);

}  // namespace ferry
