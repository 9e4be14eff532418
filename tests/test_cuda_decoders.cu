// The CUDA kernels' weight decoders, run on the host against the CPU dequantizers
// (src/core/quants.cpp): the matrix-vector kernels' lane decoders (Dec<T>: the float kernel,
// the prefill's conversion to F16 and the streaming form; IDec<T>: the int8 kernel) and the
// element reader (load_elem: GET_ROWS, the generic product kernel). They are FERRY_HD (host and
// device), so CI checks every layout the GPU reads on a machine without one; test_cuda checks
// the kernels built on them on a GPU.
//
// For each type, rows of random blocks (random bytes with finite scales, and the quantizer's
// output for random floats) and, for every chunk c and lane:
// - the 8 weights a lane decodes lie at distinct elements of the row, every element is decoded
//   exactly once over all chunks and lanes, and nothing past the row's end (Dec says false);
// - each weight equals the CPU dequantizer's value: d * q + m computed in double from the
//   decoded parts, within 4 units of float rounding of |d * q| + |m| (the reference rounds a
//   product and a sum, or contracts them), where a wrong bit is off by a whole quantization
//   step d;
// - a lane's 8 weights lie in one 32-element block (the int8 kernel applies one scale of b to
//   them).
// The block-lane decoders (BDec<T>: the int8 kernel's and the streaming form's Q4_0 and Q6_K)
// against one-hot vectors b, below. And the KV cache's block quantizer (quantize_block) writes
// the CPU quantizers' bytes.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/ops/mv-common.cuh"
#include "ferry/types.h"

namespace ferry::cuda {
namespace {

// Where a block of each type keeps an fp16 scale: random bytes there are made finite scales.
std::vector<int> fp16_fields(Type t) {
    switch (t) {
        case Type::Q4_0:
        case Type::Q5_0:
        case Type::Q8_0:
        case Type::IQ4_NL:
        case Type::IQ4_XS:
            return {0};
        case Type::Q4_1:
        case Type::Q5_1:
        case Type::Q4_K:
        case Type::Q5_K:
            return {0, 2};
        case Type::Q2_K:
            return {80, 82};
        case Type::Q3_K:
            return {108};
        case Type::Q6_K:
            return {208};
        default:
            return {};
    }
}

struct Row {
    std::vector<char> bytes;
    std::vector<float> ref;  // the CPU dequantizer's values
};

// K elements of type t: random bytes with finite scales (random == true), or the quantizer's
// blocks for random floats with an offset (so that the formats with a min use it).
Row make_row(Type t, int64_t K, bool random, uint32_t seed) {
    const TypeTraits& tr = type_traits(t);
    std::mt19937 rng(seed);
    Row r;
    r.bytes.resize(row_size(t, K));
    if (random) {
        std::uniform_int_distribution<int> byte(0, 255);
        for (char& b : r.bytes) b = static_cast<char>(byte(rng));
        const size_t bs = tr.type_size;
        std::uniform_real_distribution<float> mag(0.001f, 1.0f);
        for (size_t off = 0; off < r.bytes.size(); off += bs) {
            for (int f : fp16_fields(t)) {
                const float v = mag(rng) * ((f == 0 && byte(rng) < 64) ? -1.0f : 1.0f);
                const fp16_t h = fp32_to_fp16(v);
                std::memcpy(r.bytes.data() + off + f, &h, sizeof h);
            }
            if (t == Type::MXFP4) r.bytes[off] = static_cast<char>(110 + byte(rng) % 30);
        }
    } else {
        std::normal_distribution<float> x(0.7f, 1.5f);
        std::vector<float> src(static_cast<size_t>(K));
        for (float& v : src) v = x(rng);
        tr.from_float(src.data(), r.bytes.data(), K);
    }
    r.ref.resize(static_cast<size_t>(K));
    tr.to_float(r.bytes.data(), r.ref.data(), K);
    return r;
}

constexpr double kRound = 4.0 * 5.9604644775390625e-08;  // 4 units of float rounding (2^-24)

struct Where {
    Type t;
    bool random;
    int64_t c;
    int lane, k;
    std::string str() const {
        return std::string(type_name(t)) + (random ? " random bytes" : " quantized") + ", chunk " +
               std::to_string(c) + ", lane " + std::to_string(lane) + ", weight " +
               std::to_string(k);
    }
};

// Checks one decoded weight at element e: value d * q + m (in double) against the reference,
// and counts the element. Returns the magnitude bound |d q| + |m| for load_elem's check.
double check_weight(const Row& r, int64_t K, int64_t e, double d, double q, double m,
                    const Where& at, std::vector<int>& seen) {
    EXPECT_GE(e, 0) << at.str();
    EXPECT_LT(e, K) << at.str();
    if (e < 0 || e >= K) return 0.0;
    seen[static_cast<size_t>(e)]++;
    const double bound = std::fabs(d * q) + std::fabs(m);
    const double ref = r.ref[static_cast<size_t>(e)];
    EXPECT_LE(std::fabs(d * q + m - ref), kRound * bound)
        << at.str() << ", element " << e << ": d " << d << " q " << q << " m " << m
        << " decodes to " << d * q + m << ", the CPU dequantizer gives " << ref;
    return bound;
}

void expect_each_once(const std::vector<int>& seen, const std::string& what) {
    int64_t missing = 0, repeated = 0;
    for (int n : seen) {
        missing += n == 0;
        repeated += n > 1;
    }
    EXPECT_EQ(missing, 0) << what << ": elements no lane decoded";
    EXPECT_EQ(repeated, 0) << what << ": elements decoded more than once";
}

void expect_one_b_block(int32_t o0, int32_t o1, const Where& at) {
    EXPECT_EQ(o0 / 32, (o0 + 3) / 32) << at.str();
    EXPECT_EQ(o0 / 32, o1 / 32) << at.str();
    EXPECT_EQ(o1 / 32, (o1 + 3) / 32) << at.str();
}

// Dec<T> (float): every chunk of the row and one past it. Returns each element's bound.
template <Type T>
std::vector<double> check_dec(const Row& r, int64_t K, bool random) {
    std::vector<int> seen(static_cast<size_t>(K), 0);
    std::vector<double> bound(static_cast<size_t>(K), 0.0);
    const int64_t chunks = (K + 255) / 256;
    for (int64_t c = 0; c <= chunks; c++) {
        for (int lane = 0; lane < 32; lane++) {
            Lane8 w;
            if (!Dec<T>::get(r.bytes.data(), K, c, lane, w)) continue;
            EXPECT_LT(c, chunks) << type_name(T) << ": chunk " << c << " is past the row";
            expect_one_b_block(w.o0, w.o1, {T, random, c, lane, 0});
            for (int k = 0; k < 8; k++) {
                const int64_t e = (k < 4 ? w.o0 : w.o1) + k % 4;
                const double m = Dec<T>::kMin ? w.m : 0.0;
                const double b =
                    check_weight(r, K, e, w.d, w.q[k], m, {T, random, c, lane, k}, seen);
                if (e >= 0 && e < K) bound[static_cast<size_t>(e)] = b;
            }
        }
    }
    expect_each_once(seen, std::string(type_name(T)) + " Dec");
    return bound;
}

// IDec<T> (int8 words): chunks whose blocks lie in the row (the int8 kernel checks that).
template <Type T>
void check_idec(const Row& r, int64_t K, bool random) {
    std::vector<int> seen(static_cast<size_t>(K), 0);
    const int64_t chunks = (K + 255) / 256;
    const bool k_format = T == Type::Q4_K || T == Type::Q5_K || T == Type::Q6_K;
    for (int64_t c = 0; c < chunks; c++) {
        for (int lane = 0; lane < 32; lane++) {
            if (!k_format && (c * 8 + lane / 4) * 32 >= K) continue;
            Lane8i w;
            IDec<T>::get(r.bytes.data(), c, lane, w);
            expect_one_b_block(w.o0, w.o1, {T, random, c, lane, 0});
            for (int k = 0; k < 8; k++) {
                const uint32_t v = static_cast<uint32_t>(k < 4 ? w.v0 : w.v1);
                const int byte = static_cast<int8_t>((v >> (8 * (k % 4))) & 0xff);
                // Every byte is a multiple of 2^kShift: the kernel shifts the dot product.
                EXPECT_EQ(byte % (1 << IDec<T>::kShift), 0) << Where{T, random, c, lane, k}.str();
                const double q = static_cast<double>(byte) / (1 << IDec<T>::kShift);
                const int64_t e = (k < 4 ? w.o0 : w.o1) + k % 4;
                const double m = IDec<T>::kMin ? w.m : 0.0;
                check_weight(r, K, e, w.d, q, m, {T, random, c, lane, k}, seen);
            }
        }
    }
    expect_each_once(seen, std::string(type_name(T)) + " IDec");
}

// load_elem: every element, within the bound of Dec's decode of the same element.
void check_load_elem(Type t, const Row& r, int64_t K, const std::vector<double>& bound) {
    for (int64_t e = 0; e < K; e++) {
        const double v = load_elem(t, r.bytes.data(), e);
        const double ref = r.ref[static_cast<size_t>(e)];
        EXPECT_LE(std::fabs(v - ref), kRound * bound[static_cast<size_t>(e)])
            << type_name(t) << ": load_elem of element " << e << " gives " << v
            << ", the CPU dequantizer " << ref;
    }
}

// Rows of 2 full chunks and part of a third for the 32-element formats (19 blocks), 3
// super-blocks for the K formats.
int64_t row_len(Type t) {
    return block_size(t) == 32 ? 32 * 19 : 256 * 3;
}

template <Type T>
void check_type(bool with_idec) {
    const int64_t K = row_len(T);
    for (bool random : {true, false}) {
        for (uint32_t seed = 1; seed <= 3; seed++) {
            const Row r = make_row(T, K, random, seed * 7919u + static_cast<uint32_t>(T));
            const std::vector<double> bound = check_dec<T>(r, K, random);
            if constexpr (located_min(T) || T == Type::Q4_0 || T == Type::Q8_0 || T == Type::Q6_K) {
                if (with_idec) check_idec<T>(r, K, random);
            }
            check_load_elem(T, r, K, bound);
            if (testing::Test::HasFailure()) return;  // one row's report is enough
        }
    }
}

TEST(CudaDecoders, Q4_0) {
    check_type<Type::Q4_0>(true);
}
TEST(CudaDecoders, Q4_1) {
    check_type<Type::Q4_1>(true);
}
TEST(CudaDecoders, Q8_0) {
    check_type<Type::Q8_0>(true);
}
TEST(CudaDecoders, Q4_K) {
    check_type<Type::Q4_K>(true);
}
TEST(CudaDecoders, Q5_K) {
    check_type<Type::Q5_K>(true);
}
TEST(CudaDecoders, Q6_K) {
    check_type<Type::Q6_K>(true);
}
TEST(CudaDecoders, Q5_0) {
    check_type<Type::Q5_0>(false);
}
TEST(CudaDecoders, Q5_1) {
    check_type<Type::Q5_1>(false);
}
TEST(CudaDecoders, Q2_K) {
    check_type<Type::Q2_K>(false);
}
TEST(CudaDecoders, Q3_K) {
    check_type<Type::Q3_K>(false);
}
TEST(CudaDecoders, IQ4_NL) {
    check_type<Type::IQ4_NL>(false);
}
TEST(CudaDecoders, IQ4_XS) {
    check_type<Type::IQ4_XS>(false);
}
TEST(CudaDecoders, MXFP4) {
    check_type<Type::MXFP4>(false);
}

// The block-lane decoders (BDec<T>, Q4_0 and Q6_K): lane l of a warp takes 64 weights of each
// span of 2048 against b's int8 quants, stored in BDec<T>'s swizzled order as q8_quantize4
// writes them (float4 number i at word swz(i)), and one float scale per 32 elements. With b
// one-hot (element j's quant v, every scale 1), the sum over every span and active lane of
// dot() is v times weight j and nothing else: exactly the CPU dequantizer's value times v (v
// = 1 or -64: the kernel's products are exact integers times an exact scale, rounded once, as
// the CPU's). A lane that reads another element, a second lane on the same element or none
// shows as a wrong sum. The row ends at a page the process may not read: a read past the row
// stops the test.
template <Type T>
void check_bdec(int64_t K, bool random, uint32_t seed) {
    const Row r = make_row(T, K, random, seed);
    const size_t nb = r.bytes.size(), page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    ASSERT_EQ(nb % 4, 0u) << "rows must be 4-byte aligned";
    const size_t len = (nb + page - 1) / page * page + page;
    void* map = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map, MAP_FAILED);
    char* const guard = static_cast<char*>(map) + len - page;
    ASSERT_EQ(mprotect(guard, page, PROT_NONE), 0);
    char* const row = guard - nb;
    std::memcpy(row, r.bytes.data(), nb);
    std::vector<int32_t> xq(static_cast<size_t>(K / 4), 0);
    const std::vector<float> xd(static_cast<size_t>(K / 32), 1.0f);
    const int64_t spans = (K + kSpan - 1) / kSpan;
    int64_t wrong = 0;
    for (const int v : {1, -64}) {
        for (int64_t j = 0; j < K; j++) {
            int32_t& word = xq[BDec<T>::swz(static_cast<uint32_t>(j / 4))];
            word = static_cast<int32_t>((static_cast<uint32_t>(v) & 0xffu) << (8 * (j % 4)));
            float sum = 0.0f;
            for (int64_t sp = 0; sp < spans; sp++) {
                for (int lane = 0; lane < 32; lane++) {
                    if (!BDec<T>::active(K, sp, lane)) continue;
                    BlkX x;
                    BDec<T>::load_x(xq.data(), xd.data(), sp, lane, x);
                    sum += BDec<T>::dot(row, sp, lane, x, 0.0f);
                }
            }
            word = 0;
            const float want = r.ref[static_cast<size_t>(j)] * static_cast<float>(v);
            if (sum != want && ++wrong <= 5) {
                ADD_FAILURE() << type_name(T) << (random ? " random bytes" : " quantized") << ", K "
                              << K << ", element " << j << ", b " << v << ": the lanes sum to "
                              << sum << ", the CPU dequantizer's weight times b is " << want;
            }
        }
    }
    EXPECT_EQ(wrong, 0) << type_name(T) << ", K " << K << ": elements with a wrong sum";
    munmap(map, len);
}

// Whole spans and a last part-span (Q4_0: 2,304 = 72 blocks, four lanes in the second span;
// Q6_K: 2,560 = 10 super-blocks, eight lanes).
TEST(CudaDecoders, BlockLaneQ4_0) {
    for (const int64_t K : {2048, 2304, 4096}) {
        for (const bool random : {true, false}) check_bdec<Type::Q4_0>(K, random, 31u + K);
    }
}
TEST(CudaDecoders, BlockLaneQ6_K) {
    for (const int64_t K : {2048, 2560, 4096}) {
        for (const bool random : {true, false}) check_bdec<Type::Q6_K>(K, random, 37u + K);
    }
}

// The KV cache's block quantizer (quantize_block: SET_ROWS and CPY into Q8_0/Q4_0/Q4_1
// caches) writes the CPU quantizers' bytes, bit for bit: random blocks, blocks of zeros, blocks
// whose values sit on the rounding ties of their own scale, and blocks spanning magnitudes.
TEST(CudaDecoders, KvBlockQuantizerWritesTheCpuBytes) {
    std::mt19937 rng(11);
    std::normal_distribution<float> x(0.3f, 2.0f);
    std::uniform_int_distribution<int> level(-16, 16);
    for (Type t : {Type::Q8_0, Type::Q4_0, Type::Q4_1}) {
        const size_t bs = type_size(t);
        for (int blk = 0; blk < 400; blk++) {
            float v[32];
            for (float& f : v) f = x(rng);
            if (blk == 0) std::fill(v, v + 32, 0.0f);
            if (blk % 4 == 1) {  // multiples of half a step: ties once divided by the scale
                for (float& f : v) f = 0.5f * static_cast<float>(level(rng)) * 0.0625f;
            }
            if (blk % 4 == 2) {
                for (int j = 0; j < 32; j++) v[j] *= std::ldexp(1.0f, j % 24 - 12);
            }
            std::vector<char> gpu(bs), cpu(bs);
            quantize_block(t, v, gpu.data());
            type_traits(t).from_float(v, cpu.data(), 32);
            EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), bs), 0)
                << type_name(t) << " block " << blk << ": the device quantizer's bytes differ";
        }
    }
}

// The plain types through load_elem: the same values bit for bit.
TEST(CudaDecoders, PlainTypesReadExactly) {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> byte(0, 255);
    for (Type t : {Type::F32, Type::F16, Type::BF16}) {
        const int64_t K = 300;
        std::vector<char> bytes(row_size(t, K));
        for (char& b : bytes) b = static_cast<char>(byte(rng));
        std::vector<float> ref(K);
        type_traits(t).to_float(bytes.data(), ref.data(), K);
        for (int64_t e = 0; e < K; e++) {
            const float v = load_elem(t, bytes.data(), e);
            if (std::isnan(ref[e])) {
                EXPECT_TRUE(std::isnan(v)) << type_name(t) << " element " << e;
            } else {
                EXPECT_EQ(std::memcmp(&v, &ref[e], sizeof v), 0)
                    << type_name(t) << " element " << e << ": " << v << " against " << ref[e];
            }
        }
    }
}

}  // namespace
}  // namespace ferry::cuda
