#include "ferry/types.h"

#include <cctype>
#include <climits>
#include <string>

#include "core/quants.h"

namespace ferry {

float fp16_to_fp32(fp16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: value = man * 2^-24
            float f = static_cast<float>(man) * 5.9604644775390625e-8f;
            std::memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
}

fp16_t fp32_to_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {  // inf or nan
        return static_cast<fp16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    }
    if (absx >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
        return static_cast<fp16_t>(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
        // value in units of 2^-24, rounded to nearest even
        float a;
        std::memcpy(&a, &absx, 4);
        float scaled = a * 16777216.0f;  // exact (power of two)
        uint32_t q = static_cast<uint32_t>(scaled);
        float rem = scaled - static_cast<float>(q);
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return static_cast<fp16_t>(sign | q);
    }
    // normal: rebias exponent, round mantissa to 10 bits (nearest even)
    uint32_t mant = absx & 0x7fffffu;
    uint32_t e = (absx >> 23) - 112u;
    uint32_t h = (e << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // may carry into exponent: fine
    return static_cast<fp16_t>(sign | h);
}

bf16_t fp32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 64u);  // quiet nan
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<bf16_t>(u >> 16);
}

namespace {

void f32_to_float(const void* src, float* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
}
void f32_from_float(const float* src, void* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
}
void f16_to_float(const void* src, float* dst, int64_t n) {
    const fp16_t* s = static_cast<const fp16_t*>(src);
    for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(s[i]);
}
void f16_from_float(const float* src, void* dst, int64_t n) {
    fp16_t* d = static_cast<fp16_t*>(dst);
    for (int64_t i = 0; i < n; i++) d[i] = fp32_to_fp16(src[i]);
}
void bf16_to_float(const void* src, float* dst, int64_t n) {
    const bf16_t* s = static_cast<const bf16_t*>(src);
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(s[i]);
}
void bf16_from_float(const float* src, void* dst, int64_t n) {
    bf16_t* d = static_cast<bf16_t*>(dst);
    for (int64_t i = 0; i < n; i++) d[i] = fp32_to_bf16(src[i]);
}
void vec_dot_f32(int64_t n, float* out, const void* x, const void* y) {
    const float* a = static_cast<const float*>(x);
    const float* b = static_cast<const float*>(y);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += static_cast<double>(a[i]) * b[i];
    *out = static_cast<float>(s);
}
void vec_dot_f16(int64_t n, float* out, const void* x, const void* y) {
    const fp16_t* a = static_cast<const fp16_t*>(x);
    const float* b = static_cast<const float*>(y);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += static_cast<double>(fp16_to_fp32(a[i])) * b[i];
    *out = static_cast<float>(s);
}
void vec_dot_bf16(int64_t n, float* out, const void* x, const void* y) {
    const bf16_t* a = static_cast<const bf16_t*>(x);
    const float* b = static_cast<const float*>(y);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += static_cast<double>(bf16_to_fp32(a[i])) * b[i];
    *out = static_cast<float>(s);
}

using namespace quants;

const TypeTraits kF32 = {"f32",          1,         4,          false, true, f32_to_float,
                         f32_from_float, Type::F32, vec_dot_f32};
const TypeTraits kF16 = {"f16",          1,         2,          false, true, f16_to_float,
                         f16_from_float, Type::F32, vec_dot_f16};
const TypeTraits kBF16 = {"bf16",          1,         2,           false, true, bf16_to_float,
                          bf16_from_float, Type::F32, vec_dot_bf16};
const TypeTraits kI32 = {"i32", 1, 4, false, true, nullptr, nullptr, Type::I32, nullptr};
const TypeTraits kQ4_0 = {
    "q4_0",     kQK4_0,      sizeof(BlockQ4_0), true, true, dequantize_row_q4_0, quantize_row_q4_0,
    Type::Q8_0, vec_dot_q4_0};
const TypeTraits kQ4_1 = {
    "q4_1",     kQK4_1,      sizeof(BlockQ4_1), true, true, dequantize_row_q4_1, quantize_row_q4_1,
    Type::Q8_0, vec_dot_q4_1};
const TypeTraits kQ8_0 = {
    "q8_0",     kQK8_0,      sizeof(BlockQ8_0), true, true, dequantize_row_q8_0, quantize_row_q8_0,
    Type::Q8_0, vec_dot_q8_0};
const TypeTraits kQ4_K = {
    "q4_K",     kQK_K,       sizeof(BlockQ4_K), true, true, dequantize_row_q4_k, quantize_row_q4_k,
    Type::Q8_K, vec_dot_q4_k};
const TypeTraits kQ5_K = {
    "q5_K",     kQK_K,       sizeof(BlockQ5_K), true, true, dequantize_row_q5_k, quantize_row_q5_k,
    Type::Q8_K, vec_dot_q5_k};
const TypeTraits kQ6_K = {
    "q6_K",     kQK_K,       sizeof(BlockQ6_K), true, true, dequantize_row_q6_k, quantize_row_q6_k,
    Type::Q8_K, vec_dot_q6_k};
const TypeTraits kQ8_K = {
    "q8_K",     kQK_K,       sizeof(BlockQ8_K), true, false, dequantize_row_q8_k, quantize_row_q8_k,
    Type::Q8_K, vec_dot_q8_k};

const Type kStorageTypes[] = {Type::F32,  Type::F16,  Type::BF16, Type::I32,  Type::Q4_0,
                              Type::Q4_1, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K};

}  // namespace

const TypeTraits* type_traits_or_null(uint32_t id) {
    switch (static_cast<Type>(id)) {
        case Type::F32:
            return &kF32;
        case Type::F16:
            return &kF16;
        case Type::BF16:
            return &kBF16;
        case Type::I32:
            return &kI32;
        case Type::Q4_0:
            return &kQ4_0;
        case Type::Q4_1:
            return &kQ4_1;
        case Type::Q8_0:
            return &kQ8_0;
        case Type::Q4_K:
            return &kQ4_K;
        case Type::Q5_K:
            return &kQ5_K;
        case Type::Q6_K:
            return &kQ6_K;
        case Type::Q8_K:
            return &kQ8_K;
    }
    return nullptr;
}

const TypeTraits& type_traits(Type t) {
    const TypeTraits* tr = type_traits_or_null(static_cast<uint32_t>(t));
    FERRY_ASSERT(tr != nullptr);
    return *tr;
}

const Type* storage_types(int* count) {
    *count = static_cast<int>(sizeof(kStorageTypes) / sizeof(kStorageTypes[0]));
    return kStorageTypes;
}

Expected<Type> type_from_name(const char* name) {
    std::string n;
    for (const char* p = name; *p; p++) n += static_cast<char>(std::tolower(*p));
    int count = 0;
    const Type* ts = storage_types(&count);
    for (int i = 0; i < count; i++) {
        std::string tn;
        for (const char* p = type_name(ts[i]); *p; p++) tn += static_cast<char>(std::tolower(*p));
        if (tn == n) return ts[i];
    }
    return Status::errorf(
        "unknown type '%s' (expected one of f32, f16, bf16, i32, q4_0, q4_1, "
        "q8_0, q4_k, q5_k, q6_k)",
        name);
}

Expected<size_t> row_size_checked(Type t, int64_t ne0) {
    const TypeTraits& tr = type_traits(t);
    if (ne0 < 0) return Status::errorf("negative row length %lld", static_cast<long long>(ne0));
    if (ne0 % tr.block_size != 0) {
        return Status::errorf("row length %lld is not a multiple of the %s block size %lld",
                              static_cast<long long>(ne0), tr.name,
                              static_cast<long long>(tr.block_size));
    }
    const uint64_t blocks = static_cast<uint64_t>(ne0 / tr.block_size);
    if (blocks > SIZE_MAX / tr.type_size) {
        return Status::errorf("row of %lld %s elements is too large", static_cast<long long>(ne0),
                              tr.name);
    }
    return static_cast<size_t>(blocks * tr.type_size);
}

size_t row_size(Type t, int64_t ne0) {
    const TypeTraits& tr = type_traits(t);
    FERRY_ASSERT(ne0 >= 0 && ne0 % tr.block_size == 0);
    return static_cast<size_t>(ne0 / tr.block_size) * tr.type_size;
}

Status to_float_row(Type t, const void* src, float* dst, int64_t n) {
    const TypeTraits& tr = type_traits(t);
    if (!tr.to_float) return Status::errorf("type %s has no float conversion", tr.name);
    if (n % tr.block_size != 0) {
        return Status::errorf("row length %lld is not a multiple of the %s block size %lld",
                              static_cast<long long>(n), tr.name,
                              static_cast<long long>(tr.block_size));
    }
    tr.to_float(src, dst, n);
    return Status::ok();
}

Status from_float_row(Type t, const float* src, void* dst, int64_t n) {
    const TypeTraits& tr = type_traits(t);
    if (!tr.from_float) return Status::errorf("type %s has no float conversion", tr.name);
    if (n % tr.block_size != 0) {
        return Status::errorf("row length %lld is not a multiple of the %s block size %lld",
                              static_cast<long long>(n), tr.name,
                              static_cast<long long>(tr.block_size));
    }
    tr.from_float(src, dst, n);
    return Status::ok();
}

// Block formats hold fp16 fields (2 bytes); Q8_K a float.
size_t element_alignment(Type t) {
    switch (t) {
        case Type::F32:
        case Type::I32:
        case Type::Q8_K:
            return 4;
        default:
            return 2;
    }
}

}  // namespace ferry
