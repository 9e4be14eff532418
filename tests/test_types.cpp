// Element types and GGUF block formats: half/bfloat16 conversions, type traits, row sizes,
// the reference dequantizers (bit-exact, on blocks built byte by byte from the GGUF layout),
// quantizer round-trip quality and the scalar reference dot products.

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/quants.h"
#include "ferry/types.h"

namespace ferry {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

// Independent binary16 decoder (exact, in double).
double half_value(uint16_t h) {
    const int sign = (h >> 15) & 1;
    const int exp = (h >> 10) & 0x1f;
    const int man = h & 0x3ff;
    double v;
    if (exp == 0) {
        v = std::ldexp(static_cast<double>(man), -24);
    } else if (exp == 31) {
        v = man == 0 ? INFINITY : NAN;
    } else {
        v = std::ldexp(static_cast<double>(1024 + man), exp - 25);
    }
    return sign ? -v : v;
}

float bits_to_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint32_t float_to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

void put_u16(std::vector<uint8_t>& b, size_t off, uint16_t v) {
    b[off] = static_cast<uint8_t>(v & 0xff);
    b[off + 1] = static_cast<uint8_t>(v >> 8);
}

void put_f32(std::vector<uint8_t>& b, size_t off, float f) {
    const uint32_t u = float_to_bits(f);
    for (int i = 0; i < 4; i++) b[off + i] = static_cast<uint8_t>(u >> (8 * i));
}

// A random finite, positive-or-negative binary16 with a moderate exponent, as a real scale.
uint16_t random_half_scale(std::mt19937& rng, bool allow_negative) {
    std::uniform_int_distribution<int> man(0, 1023), ex(5, 17), sg(0, 1);
    const int s = allow_negative ? sg(rng) : 0;
    return static_cast<uint16_t>((s << 15) | (ex(rng) << 10) | man(rng));
}

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<uint8_t> b(n);
    for (auto& v : b) v = static_cast<uint8_t>(byte(rng));
    return b;
}

std::vector<float> gaussian(std::mt19937& rng, size_t n, float mean = 0.0f, float stddev = 1.0f) {
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

std::vector<float> dequantize(Type t, const void* src, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    EXPECT_TRUE(to_float_row(t, src, out.data(), n).is_ok());
    return out;
}

std::vector<uint8_t> quantize(Type t, const std::vector<float>& x) {
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(row_size(t, n));
    EXPECT_TRUE(from_float_row(t, x.data(), q.data(), n).is_ok());
    return q;
}

double nmse(const std::vector<float>& ref, const std::vector<float>& got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double d = static_cast<double>(got[i]) - ref[i];
        num += d * d;
        den += static_cast<double>(ref[i]) * ref[i];
    }
    return num / den;
}

const Type kQuantTypes[] = {Type::Q4_0, Type::Q4_1,   Type::Q5_0,   Type::Q5_1, Type::Q8_0,
                            Type::Q2_K, Type::Q3_K,   Type::Q4_K,   Type::Q5_K, Type::Q6_K,
                            Type::Q8_K, Type::IQ4_NL, Type::IQ4_XS, Type::MXFP4};

// The 6-bit scale / min of sub-block j as the GGUF K-quant layout defines it.
void k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 0x3f;
        *mn = s[j + 4] & 0x3f;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// ---------------------------------------------------------------------------------------------
// Half and bfloat16

TEST(Fp16, DecodesEveryHalfExactly) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = fp16_to_fp32(static_cast<uint16_t>(h));
        const double want = half_value(static_cast<uint16_t>(h));
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(f)) << std::hex << h;
            EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
        } else {
            EXPECT_EQ(static_cast<double>(f), want) << std::hex << h;
            EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
        }
    }
}

TEST(Fp16, EveryHalfRoundTrips) {
    for (uint32_t h = 0; h < 65536; h++) {
        const uint16_t hh = static_cast<uint16_t>(h);
        const fp16_t back = fp32_to_fp16(fp16_to_fp32(hh));
        if (std::isnan(half_value(hh))) {
            EXPECT_TRUE(std::isnan(half_value(back))) << std::hex << h;
            EXPECT_EQ(back & 0x8000, hh & 0x8000) << std::hex << h;
        } else {
            EXPECT_EQ(back, hh) << std::hex << h;
        }
    }
}

// Every midpoint between two adjacent finite halves rounds to the even one; a float just above
// or below rounds to the nearer one.
TEST(Fp16, RoundsToNearestEvenAtEveryMidpoint) {
    for (uint32_t h = 0; h < 0x7bff; h++) {
        for (uint32_t sign : {0u, 0x8000u}) {
            const uint16_t lo = static_cast<uint16_t>(h | sign);
            const uint16_t hi = static_cast<uint16_t>((h + 1) | sign);
            // The midpoint has at most 12 significant bits: exact in float.
            const float mid = static_cast<float>((half_value(lo) + half_value(hi)) / 2);
            ASSERT_EQ(static_cast<double>(mid), (half_value(lo) + half_value(hi)) / 2);
            const uint16_t even = (h & 1) ? hi : lo;
            EXPECT_EQ(fp32_to_fp16(mid), even) << std::hex << h;
            const float toward_hi = std::nextafter(mid, sign ? -INFINITY : INFINITY);
            const float toward_lo = std::nextafter(mid, 0.0f);
            EXPECT_EQ(fp32_to_fp16(toward_hi), hi) << std::hex << h;
            EXPECT_EQ(fp32_to_fp16(toward_lo), lo) << std::hex << h;
        }
    }
}

TEST(Fp16, SpecialValues) {
    EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
    EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
    EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
    EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
    EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7bff);
    EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // the tie above the largest half: to infinity
    EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
    EXPECT_EQ(fp32_to_fp16(-1e10f), 0xfc00);
    EXPECT_EQ(fp32_to_fp16(INFINITY), 0x7c00);
    EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xfc00);
    const fp16_t qnan = fp32_to_fp16(NAN);
    EXPECT_EQ(qnan & 0x7c00, 0x7c00);
    EXPECT_NE(qnan & 0x03ff, 0);
    // subnormals
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie: to even (zero)
    EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // tie: to even (2)
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -26)), 0x0000);
    EXPECT_EQ(fp32_to_fp16(-std::ldexp(1.0f, -14)), 0x8400);    // smallest normal
    EXPECT_EQ(fp32_to_fp16(std::ldexp(2047.0f, -25)), 0x0400);  // 0x3ff.8: to even (normal)
    EXPECT_EQ(fp32_to_fp16(1e-30f), 0x0000);
    EXPECT_EQ(fp32_to_fp16(-1e-30f), 0x8000);
    EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
    EXPECT_TRUE(std::isinf(fp16_to_fp32(0xfc00)) && fp16_to_fp32(0xfc00) < 0);
    EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7e00)));
}

TEST(Bf16, RoundTripsAndRoundsToNearestEven) {
    for (uint32_t h = 0; h < 65536; h++) {
        const bf16_t b = static_cast<bf16_t>(h);
        const float f = bf16_to_fp32(b);
        EXPECT_EQ(float_to_bits(f), h << 16);
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(f)))) << std::hex << h;
            continue;
        }
        EXPECT_EQ(fp32_to_bf16(f), b) << std::hex << h;
        if ((h & 0x7fff) >= 0x7f80) continue;  // infinities: no next value
        // Halfway to the next magnitude: to even; one float ulp either side: to the nearer.
        const uint32_t mid = (h << 16) | 0x8000u;
        const bf16_t even = (h & 1) ? static_cast<bf16_t>(h + 1) : b;
        EXPECT_EQ(fp32_to_bf16(bits_to_float(mid)), even) << std::hex << h;
        EXPECT_EQ(fp32_to_bf16(bits_to_float(mid - 1)), b) << std::hex << h;
        EXPECT_EQ(fp32_to_bf16(bits_to_float(mid + 1)), static_cast<bf16_t>(h + 1))
            << std::hex << h;
    }
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
    EXPECT_EQ(fp32_to_bf16(INFINITY), 0x7f80);
    EXPECT_EQ(fp32_to_bf16(3.4e38f), 0x7f80);  // rounds past the largest bf16
}

// ---------------------------------------------------------------------------------------------
// Traits, names, row sizes

TEST(TypeTraits, SizesMatchTheSpec) {
    struct Spec {
        Type t;
        const char* name;
        int64_t block;
        size_t bytes;
        double bits_per_weight;
        bool storage;
        Type dot_type;
    };
    const Spec specs[] = {
        {Type::F32, "f32", 1, 4, 32.0, true, Type::F32},
        {Type::F16, "f16", 1, 2, 16.0, true, Type::F32},
        {Type::BF16, "bf16", 1, 2, 16.0, true, Type::F32},
        {Type::I32, "i32", 1, 4, 32.0, true, Type::I32},
        {Type::Q4_0, "q4_0", 32, 18, 4.5, true, Type::Q8_0},
        {Type::Q4_1, "q4_1", 32, 20, 5.0, true, Type::Q8_0},
        {Type::Q8_0, "q8_0", 32, 34, 8.5, true, Type::Q8_0},
        {Type::Q4_K, "q4_k", 256, 144, 4.5, true, Type::Q8_K},
        {Type::Q5_K, "q5_k", 256, 176, 5.5, true, Type::Q8_K},
        {Type::Q6_K, "q6_k", 256, 210, 6.5625, true, Type::Q8_K},
        {Type::Q8_K, "q8_k", 256, 292, 9.125, false, Type::Q8_K},
        {Type::Q5_0, "q5_0", 32, 22, 5.5, true, Type::Q8_0},
        {Type::Q5_1, "q5_1", 32, 24, 6.0, true, Type::Q8_0},
        {Type::Q2_K, "q2_k", 256, 84, 2.625, true, Type::Q8_K},
        {Type::Q3_K, "q3_k", 256, 110, 3.4375, true, Type::Q8_K},
        {Type::IQ4_NL, "iq4_nl", 32, 18, 4.5, true, Type::Q8_0},
        {Type::IQ4_XS, "iq4_xs", 256, 136, 4.25, true, Type::Q8_K},
        {Type::MXFP4, "mxfp4", 32, 17, 4.25, true, Type::Q8_0},
    };
    for (const Spec& s : specs) {
        const TypeTraits& tr = type_traits(s.t);
        SCOPED_TRACE(s.name);
        EXPECT_EQ(type_traits_or_null(static_cast<uint32_t>(s.t)), &tr);
        EXPECT_EQ(tr.block_size, s.block);
        EXPECT_EQ(tr.type_size, s.bytes);
        EXPECT_NEAR(8.0 * static_cast<double>(tr.type_size) / static_cast<double>(tr.block_size),
                    s.bits_per_weight, 1e-9);
        EXPECT_EQ(tr.is_storage, s.storage);
        EXPECT_EQ(tr.is_quantized, s.block > 1);
        EXPECT_EQ(tr.vec_dot_type, s.dot_type);
        std::string lower = tr.name;
        for (char& c : lower) c = static_cast<char>(std::tolower(c));
        EXPECT_EQ(lower, s.name);
        if (s.t != Type::I32) {
            EXPECT_NE(tr.to_float, nullptr);
            EXPECT_NE(tr.from_float, nullptr);
            EXPECT_NE(tr.vec_dot, nullptr);
        }
    }
    // GGUF type ids
    EXPECT_EQ(static_cast<uint32_t>(Type::Q4_0), 2u);
    EXPECT_EQ(static_cast<uint32_t>(Type::Q8_0), 8u);
    EXPECT_EQ(static_cast<uint32_t>(Type::Q4_K), 12u);
    EXPECT_EQ(static_cast<uint32_t>(Type::Q6_K), 14u);
    EXPECT_EQ(static_cast<uint32_t>(Type::BF16), 30u);
    EXPECT_EQ(static_cast<uint32_t>(Type::Q5_0), 6u);
    EXPECT_EQ(static_cast<uint32_t>(Type::Q5_1), 7u);
    EXPECT_EQ(static_cast<uint32_t>(Type::Q2_K), 10u);
    EXPECT_EQ(static_cast<uint32_t>(Type::Q3_K), 11u);
    EXPECT_EQ(static_cast<uint32_t>(Type::IQ4_NL), 20u);
    EXPECT_EQ(static_cast<uint32_t>(Type::IQ4_XS), 23u);
    EXPECT_EQ(static_cast<uint32_t>(Type::MXFP4), 39u);
    EXPECT_EQ(type_traits_or_null(4), nullptr);   // Q4_2: removed from GGUF
    EXPECT_EQ(type_traits_or_null(9), nullptr);   // Q8_1: not supported
    EXPECT_EQ(type_traits_or_null(16), nullptr);  // IQ2_XXS: not supported
    EXPECT_EQ(type_traits_or_null(1000), nullptr);
}

TEST(TypeTraits, TablePointsAtTheReferenceFunctions) {
    EXPECT_EQ(type_traits(Type::Q4_0).to_float, &quants::dequantize_row_q4_0);
    EXPECT_EQ(type_traits(Type::Q4_1).from_float, &quants::quantize_row_q4_1);
    EXPECT_EQ(type_traits(Type::Q8_0).vec_dot, &quants::vec_dot_q8_0);
    EXPECT_EQ(type_traits(Type::Q4_K).to_float, &quants::dequantize_row_q4_k);
    EXPECT_EQ(type_traits(Type::Q5_K).from_float, &quants::quantize_row_q5_k);
    EXPECT_EQ(type_traits(Type::Q6_K).vec_dot, &quants::vec_dot_q6_k);
    EXPECT_EQ(type_traits(Type::Q8_K).to_float, &quants::dequantize_row_q8_k);
    EXPECT_EQ(type_traits(Type::Q5_0).to_float, &quants::dequantize_row_q5_0);
    EXPECT_EQ(type_traits(Type::Q5_1).from_float, &quants::quantize_row_q5_1);
    EXPECT_EQ(type_traits(Type::Q2_K).vec_dot, &quants::vec_dot_q2_k);
    EXPECT_EQ(type_traits(Type::Q3_K).to_float, &quants::dequantize_row_q3_k);
    EXPECT_EQ(type_traits(Type::IQ4_NL).from_float, &quants::quantize_row_iq4_nl);
    EXPECT_EQ(type_traits(Type::IQ4_XS).vec_dot, &quants::vec_dot_iq4_xs);
    EXPECT_EQ(type_traits(Type::MXFP4).to_float, &quants::dequantize_row_mxfp4);
}

TEST(TypeTraits, Alignment) {
    EXPECT_EQ(element_alignment(Type::F32), 4u);
    EXPECT_EQ(element_alignment(Type::I32), 4u);
    EXPECT_EQ(element_alignment(Type::Q8_K), 4u);
    EXPECT_EQ(element_alignment(Type::F16), 2u);
    EXPECT_EQ(element_alignment(Type::Q3_K), 2u);   // 110-byte blocks with an fp16 field
    EXPECT_EQ(element_alignment(Type::MXFP4), 1u);  // 17-byte blocks of bytes
}

TEST(TypeTraits, TypeFromName) {
    struct Case {
        const char* name;
        Type t;
    };
    const Case cases[] = {{"f32", Type::F32},    {"F16", Type::F16},       {"bf16", Type::BF16},
                          {"BF16", Type::BF16},  {"i32", Type::I32},       {"q4_0", Type::Q4_0},
                          {"Q4_1", Type::Q4_1},  {"q8_0", Type::Q8_0},     {"q4_K", Type::Q4_K},
                          {"Q4_K", Type::Q4_K},  {"q5_k", Type::Q5_K},     {"Q6_K", Type::Q6_K},
                          {"q5_0", Type::Q5_0},  {"Q5_1", Type::Q5_1},     {"q2_k", Type::Q2_K},
                          {"Q3_K", Type::Q3_K},  {"iq4_nl", Type::IQ4_NL}, {"IQ4_XS", Type::IQ4_XS},
                          {"mxfp4", Type::MXFP4}};
    for (const Case& c : cases) {
        Expected<Type> t = type_from_name(c.name);
        ASSERT_TRUE(t.has_value()) << c.name << ": " << t.message();
        EXPECT_EQ(*t, c.t) << c.name;
    }
    for (const char* bad : {"", "f64", "q8_1", "q4", "q8_k", "q4_0 ", "Q4_K_M", "iq2_xxs"}) {
        Expected<Type> t = type_from_name(bad);
        EXPECT_FALSE(t.has_value()) << "'" << bad << "'";
        EXPECT_FALSE(t.message().empty());
    }
    int count = 0;
    const Type* ts = storage_types(&count);
    EXPECT_EQ(count, 17);
    for (int i = 0; i < count; i++) {
        Expected<Type> t = type_from_name(type_name(ts[i]));
        ASSERT_TRUE(t.has_value()) << type_name(ts[i]);
        EXPECT_EQ(*t, ts[i]);
        EXPECT_NE(ts[i], Type::Q8_K);
    }
}

TEST(TypeTraits, RowSizeChecked) {
    EXPECT_EQ(row_size_checked(Type::F32, 7).value(), 28u);
    EXPECT_EQ(row_size_checked(Type::F16, 3).value(), 6u);
    EXPECT_EQ(row_size_checked(Type::Q4_0, 64).value(), 36u);
    EXPECT_EQ(row_size_checked(Type::Q4_1, 32).value(), 20u);
    EXPECT_EQ(row_size_checked(Type::Q8_0, 4096).value(), 4352u);
    EXPECT_EQ(row_size_checked(Type::Q4_K, 512).value(), 288u);
    EXPECT_EQ(row_size_checked(Type::Q5_K, 256).value(), 176u);
    EXPECT_EQ(row_size_checked(Type::Q6_K, 4096).value(), 3360u);
    EXPECT_EQ(row_size_checked(Type::Q4_0, 0).value(), 0u);
    EXPECT_EQ(row_size(Type::Q6_K, 512), 420u);
    EXPECT_EQ(row_size_checked(Type::Q5_0, 64).value(), 44u);
    EXPECT_EQ(row_size_checked(Type::Q5_1, 96).value(), 72u);
    EXPECT_EQ(row_size_checked(Type::Q2_K, 512).value(), 168u);
    EXPECT_EQ(row_size_checked(Type::Q3_K, 256).value(), 110u);
    EXPECT_EQ(row_size_checked(Type::IQ4_NL, 64).value(), 36u);
    EXPECT_EQ(row_size_checked(Type::IQ4_XS, 768).value(), 408u);
    EXPECT_EQ(row_size_checked(Type::MXFP4, 96).value(), 51u);
    EXPECT_FALSE(row_size_checked(Type::Q5_0, 48).has_value());
    EXPECT_FALSE(row_size_checked(Type::Q3_K, 896).has_value());  // a Qwen2.5-0.5B row
    EXPECT_FALSE(row_size_checked(Type::IQ4_XS, 128).has_value());
    EXPECT_FALSE(row_size_checked(Type::MXFP4, 31).has_value());

    Expected<size_t> r = row_size_checked(Type::Q4_0, 33);
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.message().find("33"), std::string::npos) << r.message();
    EXPECT_FALSE(row_size_checked(Type::Q8_0, 16).has_value());
    EXPECT_FALSE(row_size_checked(Type::Q4_K, 255).has_value());
    EXPECT_FALSE(row_size_checked(Type::Q5_K, 32).has_value());
    EXPECT_FALSE(row_size_checked(Type::Q6_K, 384).has_value());
    EXPECT_FALSE(row_size_checked(Type::F32, -1).has_value());
    EXPECT_FALSE(row_size_checked(Type::F32, INT64_MAX).has_value());  // overflows size_t

    std::vector<float> buf(512);
    std::vector<uint8_t> q(1024);
    EXPECT_FALSE(to_float_row(Type::Q4_K, q.data(), buf.data(), 100).is_ok());
    EXPECT_FALSE(from_float_row(Type::Q8_0, buf.data(), q.data(), 33).is_ok());
    EXPECT_FALSE(to_float_row(Type::I32, q.data(), buf.data(), 4).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Dequantization of hand-built blocks (bytes laid out from the GGUF specification)

TEST(Dequantize, Q4_0KnownBlock) {
    std::vector<uint8_t> b(18);
    put_u16(b, 0, 0x3800);  // d = 0.5
    for (int j = 0; j < 16; j++) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    const std::vector<float> y = dequantize(Type::Q4_0, b.data(), 32);
    for (int j = 0; j < 16; j++) {
        EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;
        EXPECT_EQ(y[j + 16], (7 - j) * 0.5f) << j;
    }
    EXPECT_EQ(y[0], -4.0f);
    EXPECT_EQ(y[31], -4.0f);
    EXPECT_EQ(y[16], 3.5f);
}

TEST(Dequantize, Q4_1KnownBlock) {
    std::vector<uint8_t> b(20);
    put_u16(b, 0, 0x3400);  // d = 0.25
    put_u16(b, 2, 0xbc00);  // m = -1
    for (int j = 0; j < 16; j++) b[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    const std::vector<float> y = dequantize(Type::Q4_1, b.data(), 32);
    for (int j = 0; j < 16; j++) {
        EXPECT_EQ(y[j], j * 0.25f - 1.0f) << j;
        EXPECT_EQ(y[j + 16], (15 - j) * 0.25f - 1.0f) << j;
    }
    EXPECT_EQ(y[15], 2.75f);
}

TEST(Dequantize, Q8_0KnownBlock) {
    std::vector<uint8_t> b(34 * 2);
    put_u16(b, 0, 0x3000);   // d = 0.125
    put_u16(b, 34, 0xc000);  // d = -2
    for (int j = 0; j < 32; j++) {
        b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(8 * j - 128));
        b[36 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
    }
    const std::vector<float> y = dequantize(Type::Q8_0, b.data(), 64);
    for (int j = 0; j < 32; j++) {
        EXPECT_EQ(y[j], static_cast<float>(j - 16)) << j;
        EXPECT_EQ(y[32 + j], -2.0f * static_cast<float>(j - 16)) << j;
    }
}

// Q4_K / Q5_K header used by the known-value tests: d = 0.5, dmin = 0.25,
// scales {1, 2, 3, 4, 33, 40, 50, 63}, mins {0, 1, 2, 3, 17, 20, 60, 63}, packed by hand.
void put_k_header(std::vector<uint8_t>& b) {
    put_u16(b, 0, 0x3800);
    put_u16(b, 2, 0x3400);
    const uint8_t scales[12] = {0x81, 0x82, 0xc3, 0xc4, 0x40, 0x41,
                                0xc2, 0xc3, 0x11, 0x48, 0xc2, 0xff};
    std::memcpy(b.data() + 4, scales, 12);
}

TEST(Dequantize, Q4_KKnownBlock) {
    std::vector<uint8_t> b(144);
    put_k_header(b);
    for (int i = 0; i < 128; i++) b[16 + i] = 0xa3;  // low nibble 3, high nibble 10
    // Sub-blocks 0,2,4,6 take the low nibbles (3), 1,3,5,7 the high ones (10):
    // d * sc * q - dmin * m
    const float want[8] = {1.5f, 9.75f, 4.0f, 19.25f, 45.25f, 195.0f, 60.0f, 299.25f};
    const std::vector<float> y = dequantize(Type::Q4_K, b.data(), 256);
    for (int i = 0; i < 256; i++) EXPECT_EQ(y[i], want[i / 32]) << i;
}

TEST(Dequantize, Q5_KKnownBlock) {
    std::vector<uint8_t> b(176);
    put_k_header(b);
    // qh[l] (l even) = 0b10100101: fifth bit set for chunk 0 low, chunk 1 low, chunk 2 high,
    // chunk 3 high, i.e. sub-blocks 0, 2, 5, 7.
    for (int l = 0; l < 32; l++) b[16 + l] = (l % 2 == 0) ? 0xa5 : 0x00;
    for (int i = 0; i < 128; i++) b[48 + i] = 0xa3;
    const float want_odd[8] = {1.5f, 9.75f, 4.0f, 19.25f, 45.25f, 195.0f, 60.0f, 299.25f};
    const float want_even[8] = {9.5f, 9.75f, 28.0f, 19.25f, 45.25f, 515.0f, 60.0f, 803.25f};
    const std::vector<float> y = dequantize(Type::Q5_K, b.data(), 256);
    for (int i = 0; i < 256; i++) {
        const int l = i % 32;
        EXPECT_EQ(y[i], (l % 2 == 0 ? want_even : want_odd)[i / 32]) << i;
    }
}

TEST(Dequantize, Q6_KKnownBlock) {
    std::vector<uint8_t> b(210);
    for (int i = 0; i < 128; i++) b[i] = 0x5a;       // ql: low nibble 10, high nibble 5
    for (int i = 0; i < 64; i++) b[128 + i] = 0xe4;  // qh: 2-bit fields 0, 1, 2, 3
    for (int g = 0; g < 16; g++) b[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(g - 8));
    put_u16(b, 208, 0x3800);  // d = 0.5
    // Within each 128-element half, the four 32-element quarters read
    // (10 | 0 << 4) - 32 = -22, (10 | 1 << 4) - 32 = -6, (5 | 2 << 4) - 32 = 5, (5 | 3 << 4) - 32
    // = 21.
    const int quarter_q[4] = {-22, -6, 5, 21};
    const std::vector<float> y = dequantize(Type::Q6_K, b.data(), 256);
    for (int i = 0; i < 256; i++) {
        const float want = 0.5f * static_cast<float>(i / 16 - 8) * quarter_q[(i % 128) / 32];
        EXPECT_EQ(y[i], want) << i;
    }
    EXPECT_EQ(y[0], 88.0f);
    EXPECT_EQ(y[40], 18.0f);
    EXPECT_EQ(y[200], 10.0f);
    EXPECT_EQ(y[255], 73.5f);
}

TEST(Dequantize, Q8_KKnownBlock) {
    std::vector<uint8_t> b(292);
    put_f32(b, 0, 0.5f);
    for (int j = 0; j < 256; j++) b[4 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 128));
    const std::vector<float> y = dequantize(Type::Q8_K, b.data(), 256);
    for (int j = 0; j < 256; j++) EXPECT_EQ(y[j], 0.5f * static_cast<float>(j - 128)) << j;
}

// Random blocks against the layout written out element by element, in the reference's float
// arithmetic (scale products formed in float first).
TEST(Dequantize, RandomBlocksMatchTheLayout) {
    std::mt19937 rng(1234);
    constexpr int kBlocks = 64;

    // Q4_0
    {
        std::vector<uint8_t> b = random_bytes(rng, 18 * kBlocks);
        for (int k = 0; k < kBlocks; k++) put_u16(b, 18 * k, random_half_scale(rng, true));
        const std::vector<float> y = dequantize(Type::Q4_0, b.data(), 32 * kBlocks);
        for (int i = 0; i < 32 * kBlocks; i++) {
            const uint8_t* blk = b.data() + 18 * (i / 32);
            const int e = i % 32;
            const int q = e < 16 ? (blk[2 + e] & 15) : (blk[2 + e - 16] >> 4);
            const float d = static_cast<float>(half_value(blk[0] | (blk[1] << 8)));
            ASSERT_EQ(y[i], static_cast<float>(q - 8) * d) << "q4_0 " << i;
        }
    }
    // Q4_1
    {
        std::vector<uint8_t> b = random_bytes(rng, 20 * kBlocks);
        for (int k = 0; k < kBlocks; k++) {
            put_u16(b, 20 * k, random_half_scale(rng, false));
            put_u16(b, 20 * k + 2, random_half_scale(rng, true));
        }
        const std::vector<float> y = dequantize(Type::Q4_1, b.data(), 32 * kBlocks);
        for (int i = 0; i < 32 * kBlocks; i++) {
            const uint8_t* blk = b.data() + 20 * (i / 32);
            const int e = i % 32;
            const int q = e < 16 ? (blk[4 + e] & 15) : (blk[4 + e - 16] >> 4);
            const float d = static_cast<float>(half_value(blk[0] | (blk[1] << 8)));
            const float m = static_cast<float>(half_value(blk[2] | (blk[3] << 8)));
            const float prod = static_cast<float>(q) * d;
            ASSERT_EQ(y[i], prod + m) << "q4_1 " << i;
        }
    }
    // Q8_0
    {
        std::vector<uint8_t> b = random_bytes(rng, 34 * kBlocks);
        for (int k = 0; k < kBlocks; k++) put_u16(b, 34 * k, random_half_scale(rng, true));
        const std::vector<float> y = dequantize(Type::Q8_0, b.data(), 32 * kBlocks);
        for (int i = 0; i < 32 * kBlocks; i++) {
            const uint8_t* blk = b.data() + 34 * (i / 32);
            const float d = static_cast<float>(half_value(blk[0] | (blk[1] << 8)));
            ASSERT_EQ(y[i], static_cast<float>(static_cast<int8_t>(blk[2 + i % 32])) * d)
                << "q8_0 " << i;
        }
    }
    // Q4_K and Q5_K
    for (const bool five : {false, true}) {
        const size_t bs = five ? 176 : 144;
        const size_t qs_off = five ? 48 : 16;
        std::vector<uint8_t> b = random_bytes(rng, bs * kBlocks);
        for (int k = 0; k < kBlocks; k++) {
            put_u16(b, bs * k, random_half_scale(rng, false));
            put_u16(b, bs * k + 2, random_half_scale(rng, false));
        }
        const Type t = five ? Type::Q5_K : Type::Q4_K;
        const std::vector<float> y = dequantize(t, b.data(), 256 * kBlocks);
        for (int i = 0; i < 256 * kBlocks; i++) {
            const uint8_t* blk = b.data() + bs * (i / 256);
            const int e = i % 256;
            const int chunk = e / 64, l = e % 32;
            const bool high = (e % 64) >= 32;
            int q =
                high ? (blk[qs_off + 32 * chunk + l] >> 4) : (blk[qs_off + 32 * chunk + l] & 15);
            if (five) q |= ((blk[16 + l] >> (2 * chunk + (high ? 1 : 0))) & 1) << 4;
            int sc, mn;
            k_scale_min(blk + 4, e / 32, &sc, &mn);
            const float d = static_cast<float>(half_value(blk[0] | (blk[1] << 8)));
            const float dmin = static_cast<float>(half_value(blk[2] | (blk[3] << 8)));
            const float ds = d * static_cast<float>(sc);
            const float dm = dmin * static_cast<float>(mn);
            const float prod = ds * static_cast<float>(q);
            ASSERT_EQ(y[i], prod - dm) << (five ? "q5_k " : "q4_k ") << i;
        }
    }
    // Q6_K
    {
        std::vector<uint8_t> b = random_bytes(rng, 210 * kBlocks);
        for (int k = 0; k < kBlocks; k++) put_u16(b, 210 * k + 208, random_half_scale(rng, true));
        const std::vector<float> y = dequantize(Type::Q6_K, b.data(), 256 * kBlocks);
        for (int i = 0; i < 256 * kBlocks; i++) {
            const uint8_t* blk = b.data() + 210 * (i / 256);
            const int e = i % 256;
            const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
            const uint8_t* ql = blk + 64 * half;
            const uint8_t* qh = blk + 128 + 32 * half;
            const int lowbits = (quarter & 1) ? ql[l + 32] : ql[l];
            const int low4 = quarter < 2 ? (lowbits & 15) : (lowbits >> 4);
            const int high2 = (qh[l] >> (2 * quarter)) & 3;
            const int q = (low4 | (high2 << 4)) - 32;
            const int sc = static_cast<int8_t>(blk[192 + e / 16]);
            const float d = static_cast<float>(half_value(blk[208] | (blk[209] << 8)));
            ASSERT_EQ(y[i], d * static_cast<float>(sc) * static_cast<float>(q)) << "q6_k " << i;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Quantizer quality

struct QualityCase {
    Type t;
    double gaussian_max;  // NMSE bound on zero-mean Gaussian rows
    double shifted_max;   // NMSE bound on N(1, 1) rows (a non-zero mean exercises the mins)
};

TEST(Quantize, RoundTripNmse) {
    // Measured (seed 42): q8_0 2.9e-5 / 2.4e-5, q4_0 7.4e-3 / 6.1e-3, q4_1 6.1e-3 / 3.1e-3,
    // q4_K 5.0e-3 / 2.5e-3, q5_K 1.2e-3 / 5.9e-4, q6_K 3.0e-4 / 2.6e-4, q8_K 4.8e-5 / 3.8e-5,
    // q5_0 1.8e-3 / 1.5e-3, q5_1 1.4e-3 / 7.1e-4, q2_K 7.3e-2 / 3.6e-2, q3_K 2.1e-2 / 1.6e-2,
    // iq4_nl 5.5e-3 / 4.8e-3, iq4_xs 5.6e-3 / 4.9e-3, mxfp4 1.2e-2 / 1.2e-2.
    // These sit close to the floor of each format on Gaussian data (step^2 / 12 for the block's
    // range); the bounds leave ~25% headroom, so a quantizer that skips its search or misplaces
    // a level fails them.
    const QualityCase cases[] = {
        {Type::Q8_0, 3.6e-5, 3.0e-5},   {Type::Q4_0, 9.0e-3, 7.5e-3},
        {Type::Q4_1, 7.5e-3, 3.8e-3},   {Type::Q4_K, 6.0e-3, 3.0e-3},
        {Type::Q5_K, 1.5e-3, 7.5e-4},   {Type::Q6_K, 3.7e-4, 3.2e-4},
        {Type::Q8_K, 6.0e-5, 4.8e-5},   {Type::Q5_0, 2.3e-3, 1.9e-3},
        {Type::Q5_1, 1.8e-3, 9.0e-4},   {Type::Q2_K, 9.0e-2, 4.5e-2},
        {Type::Q3_K, 2.6e-2, 2.1e-2},   {Type::IQ4_NL, 6.9e-3, 6.0e-3},
        {Type::IQ4_XS, 7.0e-3, 6.2e-3}, {Type::MXFP4, 1.55e-2, 1.5e-2},
    };
    std::mt19937 rng(42);
    const std::vector<float> g = gaussian(rng, 64 * 1024);
    const std::vector<float> s = gaussian(rng, 64 * 1024, 1.0f, 1.0f);
    for (const QualityCase& c : cases) {
        const double eg = nmse(g, dequantize(c.t, quantize(c.t, g).data(), g.size()));
        const double es = nmse(s, dequantize(c.t, quantize(c.t, s).data(), s.size()));
        std::printf("  %-5s nmse gaussian %.3e  shifted %.3e\n", type_name(c.t), eg, es);
        EXPECT_LT(eg, c.gaussian_max) << type_name(c.t);
        EXPECT_LT(es, c.shifted_max) << type_name(c.t);
        EXPECT_GT(eg, 0.0) << type_name(c.t);  // a lossless "quantizer" is not quantizing
    }
}

// More bits must never be worse: the ordering a broken quantizer is likely to break.
TEST(Quantize, MoreBitsAreBetter) {
    std::mt19937 rng(7);
    const std::vector<float> g = gaussian(rng, 32 * 1024, 0.0f, 0.02f);
    auto err = [&](Type t) { return nmse(g, dequantize(t, quantize(t, g).data(), g.size())); };
    EXPECT_LT(err(Type::Q8_0), err(Type::Q6_K));
    EXPECT_LT(err(Type::Q6_K), err(Type::Q5_K));
    EXPECT_LT(err(Type::Q5_K), err(Type::Q4_K));
    EXPECT_LT(err(Type::Q4_K), err(Type::Q4_0));
    // Same bits per 32 elements, but the K formats search their scale and min: Q4_K must beat
    // the plain min/max Q4_1 despite its 6-bit scales.
    EXPECT_LT(err(Type::Q4_K), 0.9 * err(Type::Q4_1));
    EXPECT_LT(err(Type::Q4_K), err(Type::Q3_K));
    EXPECT_LT(err(Type::Q3_K), err(Type::Q2_K));
    EXPECT_LT(err(Type::Q5_0), err(Type::Q4_0));
    EXPECT_LT(err(Type::Q5_1), err(Type::Q4_1));
    // The non-linear table beats Q4_0's uniform levels at the same 4.5 bits per weight.
    EXPECT_LT(err(Type::IQ4_NL), 0.9 * err(Type::Q4_0));
    EXPECT_LT(err(Type::IQ4_XS), 0.9 * err(Type::Q4_0));
}

TEST(Quantize, EdgeRows) {
    for (Type t : kQuantTypes) {
        SCOPED_TRACE(type_name(t));
        const int64_t n = 512;
        // all zeros: exactly zero back
        {
            const std::vector<float> x(n, 0.0f);
            const std::vector<float> y = dequantize(t, quantize(t, x).data(), n);
            for (int64_t i = 0; i < n; i++) ASSERT_EQ(y[i], 0.0f) << i;
        }
        // a constant row, positive and negative, and a few exact small integers
        for (float c : {3.0f, -0.75f}) {
            const std::vector<float> x(n, c);
            const std::vector<float> y = dequantize(t, quantize(t, x).data(), n);
            for (int64_t i = 0; i < n; i++) ASSERT_NEAR(y[i], c, std::fabs(c) * 2e-2) << i;
        }
        // tiny values (the scales underflow fp16): finite output, no NaN
        {
            std::mt19937 rng(5);
            const std::vector<float> x = gaussian(rng, n, 0.0f, 1e-30f);
            const std::vector<float> y = dequantize(t, quantize(t, x).data(), n);
            for (int64_t i = 0; i < n; i++) {
                ASSERT_TRUE(std::isfinite(y[i])) << i;
                ASSERT_LE(std::fabs(y[i]), 1e-6f) << i;
            }
        }
        // one large outlier per block: it must survive, the rest stays finite
        {
            std::mt19937 rng(6);
            std::vector<float> x = gaussian(rng, n);
            const int64_t bs = block_size(t);
            for (int64_t i = 0; i < n; i += bs) x[i + bs / 3] = 1000.0f;
            const std::vector<float> y = dequantize(t, quantize(t, x).data(), n);
            for (int64_t i = 0; i < n; i++) ASSERT_TRUE(std::isfinite(y[i])) << i;
            for (int64_t i = 0; i < n; i += bs) EXPECT_NEAR(y[i + bs / 3], 1000.0f, 40.0f) << i;
        }
    }
}

TEST(Quantize, Q8_KBlockSumsAndRange) {
    std::mt19937 rng(11);
    const std::vector<float> x = gaussian(rng, 1024, 0.3f, 2.0f);
    std::vector<BlockQ8_K> b(4);
    quants::quantize_row_q8_k(x.data(), b.data(), 1024);
    for (int k = 0; k < 4; k++) {
        float amax = 0;
        for (int j = 0; j < 256; j++) amax = std::max(amax, std::fabs(x[256 * k + j]));
        EXPECT_NEAR(b[k].d * 127.0f, amax, amax * 1e-6f);
        int hit = 0;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) {
                const int q = b[k].qs[16 * g + l];
                EXPECT_LE(std::abs(q), 127);
                if (std::abs(q) == 127) hit++;
                s += q;
            }
            EXPECT_EQ(b[k].bsums[g], s) << k << " " << g;
        }
        EXPECT_GE(hit, 1);
    }
}

// Quantizing already-quantized values lands (nearly) on the same grid; packing that dropped or
// misplaced bits would not. The searches need not find the identical grid, hence the margin.
TEST(Quantize, RequantizingIsStable) {
    std::mt19937 rng(3);
    const std::vector<float> x = gaussian(rng, 8 * 1024);
    for (Type t : kQuantTypes) {
        const std::vector<float> y1 = dequantize(t, quantize(t, x).data(), x.size());
        const std::vector<float> y2 = dequantize(t, quantize(t, y1).data(), y1.size());
        EXPECT_LT(nmse(y1, y2), 0.05 * nmse(x, y1)) << type_name(t);
    }
}

// ---------------------------------------------------------------------------------------------
// Dot products

TEST(VecDot, MatchesDequantizedDoubleDot) {
    std::mt19937 rng(99);
    for (Type t : kQuantTypes) {
        SCOPED_TRACE(type_name(t));
        const TypeTraits& tr = type_traits(t);
        for (int64_t n : {256, 1024, 4096}) {
            for (int rep = 0; rep < 4; rep++) {
                const std::vector<float> xf = gaussian(rng, n, rep == 1 ? 0.5f : 0.0f, 1.0f);
                const std::vector<float> yf = gaussian(rng, n, rep == 2 ? -0.5f : 0.0f, 3.0f);
                const std::vector<uint8_t> xq = quantize(t, xf);
                const std::vector<uint8_t> yq = quantize(tr.vec_dot_type, yf);
                const std::vector<float> xd = dequantize(t, xq.data(), n);
                const std::vector<float> yd = dequantize(tr.vec_dot_type, yq.data(), n);
                double want = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    want += static_cast<double>(xd[i]) * yd[i];
                    mag += std::fabs(static_cast<double>(xd[i]) * yd[i]);
                }
                float got = NAN;
                tr.vec_dot(n, &got, xq.data(), yq.data());
                EXPECT_NEAR(got, want, 1e-6 * mag + 1e-6 * std::fabs(want)) << "n=" << n;
                // and the quantized dot is close to the float dot
                double exact = 0;
                for (int64_t i = 0; i < n; i++) exact += static_cast<double>(xf[i]) * yf[i];
                EXPECT_NEAR(got, exact, 0.1 * mag) << "n=" << n;
            }
        }
    }
}

TEST(VecDot, KnownBlocks) {
    // q8_0 . q8_0 with hand-built blocks: d 0.5 and 0.25, q = 1..32 and all 2.
    std::vector<uint8_t> x(34), y(34);
    put_u16(x, 0, 0x3800);
    put_u16(y, 0, 0x3400);
    for (int j = 0; j < 32; j++) {
        x[2 + j] = static_cast<uint8_t>(j + 1);
        y[2 + j] = 2;
    }
    float out = 0;
    quants::vec_dot_q8_0(32, &out, x.data(), y.data());
    EXPECT_EQ(out, 0.5f * 0.25f * 2.0f * 528.0f);

    // q4_1 . q8_0: (q d + m) . (2 * 0.25) with q = 1, d = 0.5, m = -1: every term -0.25
    std::vector<uint8_t> a(20);
    put_u16(a, 0, 0x3800);
    put_u16(a, 2, 0xbc00);
    for (int j = 0; j < 16; j++) a[4 + j] = 0x11;
    quants::vec_dot_q4_1(32, &out, a.data(), y.data());
    EXPECT_EQ(out, -8.0f);
}

// ---------------------------------------------------------------------------------------------
// Against an independent implementation: the PyPI gguf package's gguf.quants (numpy), through
// the committed outputs of tests/data/make-quant-refs.py.

std::vector<uint8_t> read_file_bytes(const std::string& path) {
    std::vector<uint8_t> out;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return out;
    uint8_t buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) out.insert(out.end(), buf, buf + got);
    std::fclose(f);
    return out;
}

std::vector<float> read_f32_file(const std::string& path) {
    const std::vector<uint8_t> b = read_file_bytes(path);
    std::vector<float> out(b.size() / 4);
    for (size_t i = 0; i < out.size(); i++) {
        const uint32_t u =
            static_cast<uint32_t>(b[4 * i]) | static_cast<uint32_t>(b[4 * i + 1]) << 8 |
            static_cast<uint32_t>(b[4 * i + 2]) << 16 | static_cast<uint32_t>(b[4 * i + 3]) << 24;
        out[i] = bits_to_float(u);
    }
    return out;
}

struct RefCase {
    Type t;
    const char* file;
};
const RefCase kGgufRefs[] = {
    {Type::Q5_0, "q5_0"},     {Type::Q5_1, "q5_1"},     {Type::Q2_K, "q2_k"},  {Type::Q3_K, "q3_k"},
    {Type::IQ4_NL, "iq4_nl"}, {Type::IQ4_XS, "iq4_xs"}, {Type::MXFP4, "mxfp4"}};

std::string ref_path(const char* file, const char* ext) {
    return std::string(FERRY_TEST_DATA_DIR) + "/quants/" + file + ext;
}

// gguf.quants computes every value in float32 with the same operations and order as the format
// defines (scale * sub-scale, times the quant, minus the min), and each product before the
// last operation is exact in float32 (11-bit fp16 scale times at most 8-bit integers), so the
// results must agree bit for bit: no tolerance. Infinity (MXFP4 with e = 255 and a large
// quant) compares equal; no reference value is NaN.
TEST(GgufQuants, DequantizeMatchesBitForBit) {
    for (const RefCase& c : kGgufRefs) {
        SCOPED_TRACE(c.file);
        const std::vector<uint8_t> blocks = read_file_bytes(ref_path(c.file, ".blocks"));
        const std::vector<float> want = read_f32_file(ref_path(c.file, ".expected.f32"));
        ASSERT_FALSE(blocks.empty()) << "missing " << ref_path(c.file, ".blocks");
        ASSERT_EQ(blocks.size() % type_size(c.t), 0u);
        const int64_t n = static_cast<int64_t>(blocks.size() / type_size(c.t)) * block_size(c.t);
        ASSERT_EQ(want.size(), static_cast<size_t>(n));
        const std::vector<float> got = dequantize(c.t, blocks.data(), n);
        int64_t bad = 0, nonzero = 0;
        for (int64_t i = 0; i < n; i++) {
            ASSERT_FALSE(std::isnan(want[i])) << i;
            if (want[i] != 0.0f) nonzero++;
            if (float_to_bits(got[i]) != float_to_bits(want[i])) {
                if (bad++ < 5) {
                    ADD_FAILURE() << "element " << i << " (block " << i / block_size(c.t)
                                  << "): ferry " << got[i] << " gguf " << want[i];
                }
            }
        }
        EXPECT_EQ(bad, 0);
        EXPECT_GT(nonzero, n / 2);  // the data exercise the format, not only zeros
    }
}

// Where gguf.quants can quantize (Q5_0, Q5_1, MXFP4), ferry's quantizer must fit the same
// inputs at least as well. Q5_0 / Q5_1 use the same min/max rules as gguf.quants, so the errors
// agree up to rounding ties (x * (1 / d) from the stored fp16 d rather than the unrounded one);
// MXFP4 tries two exponents where gguf.quants takes floor(log2(amax)) - 2 and clips the values
// above 1.5 * 2^floor(log2(amax)), so ferry's error is lower (measured: ratio 0.905).
TEST(GgufQuants, QuantizerErrorAtMostGguf) {
    struct Case {
        Type t;
        const char* file;
        double max_ratio;  // ferry NMSE / gguf NMSE
    };
    const Case cases[] = {
        {Type::Q5_0, "q5_0", 1.02}, {Type::Q5_1, "q5_1", 1.02}, {Type::MXFP4, "mxfp4", 0.95}};
    for (const Case& c : cases) {
        SCOPED_TRACE(c.file);
        const std::vector<float> x = read_f32_file(ref_path(c.file, ".input.f32"));
        const std::vector<float> ref = read_f32_file(ref_path(c.file, ".expected.f32"));
        ASSERT_FALSE(x.empty());
        ASSERT_GE(ref.size(), x.size());
        const std::vector<float> gguf_y(ref.begin(),
                                        ref.begin() + static_cast<ptrdiff_t>(x.size()));
        const std::vector<float> ours = dequantize(c.t, quantize(c.t, x).data(), x.size());
        // Per-block NMSE averaged over blocks: the inputs' blocks span four decades of
        // magnitude, and a plain NMSE would see only the largest blocks.
        const size_t bs = static_cast<size_t>(block_size(c.t));
        double e_gguf = 0, e_ours = 0;
        int blocks = 0;
        for (size_t b = 0; b < x.size(); b += bs) {
            double den = 0, ng = 0, no = 0;
            for (size_t i = b; i < b + bs; i++) {
                den += static_cast<double>(x[i]) * x[i];
                ng += (static_cast<double>(gguf_y[i]) - x[i]) *
                      (static_cast<double>(gguf_y[i]) - x[i]);
                no += (static_cast<double>(ours[i]) - x[i]) * (static_cast<double>(ours[i]) - x[i]);
            }
            if (den == 0) {
                EXPECT_EQ(no, 0.0) << "block " << b / bs;
                continue;
            }
            e_gguf += ng / den;
            e_ours += no / den;
            blocks++;
        }
        e_gguf /= blocks;
        e_ours /= blocks;
        std::printf("  %-6s mean block nmse: ferry %.4e  gguf.quants %.4e  (ratio %.3f)\n", c.file,
                    e_ours, e_gguf, e_ours / e_gguf);
        EXPECT_GT(e_gguf, 0.0);
        EXPECT_LE(e_ours, c.max_ratio * e_gguf);
    }
}

}  // namespace
}  // namespace ferry
