// Kernel-level tests of the CPU backend's ops (everything but MUL_MAT): each op runs in a small
// graph on random data and is compared with a straightforward double-precision computation
// here. Shapes include odd sizes, broadcasting and non-contiguous (permuted/transposed) views.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu-backend.h"
#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "ferry/tensor.h"

namespace ferry {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------
// Element access (plain types), through the tensor's strides

uint8_t* ptr(const Tensor* t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return static_cast<uint8_t*>(t->data) + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] +
           i3 * t->nb[3];
}

double get(const Tensor* t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
    const uint8_t* p = ptr(t, i0, i1, i2, i3);
    switch (t->type) {
        case Type::F32: {
            float v;
            std::memcpy(&v, p, 4);
            return v;
        }
        case Type::F16: {
            fp16_t v;
            std::memcpy(&v, p, 2);
            return fp16_to_fp32(v);
        }
        case Type::BF16: {
            bf16_t v;
            std::memcpy(&v, p, 2);
            return bf16_to_fp32(v);
        }
        case Type::I32: {
            int32_t v;
            std::memcpy(&v, p, 4);
            return v;
        }
        default:
            ADD_FAILURE() << "get() of a quantized type";
            return 0;
    }
}

void set(Tensor* t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v) {
    uint8_t* p = ptr(t, i0, i1, i2, i3);
    switch (t->type) {
        case Type::F32: {
            const float f = static_cast<float>(v);
            std::memcpy(p, &f, 4);
            break;
        }
        case Type::F16: {
            const fp16_t h = fp32_to_fp16(static_cast<float>(v));
            std::memcpy(p, &h, 2);
            break;
        }
        case Type::BF16: {
            const bf16_t h = fp32_to_bf16(static_cast<float>(v));
            std::memcpy(p, &h, 2);
            break;
        }
        case Type::I32: {
            const int32_t i = static_cast<int32_t>(v);
            std::memcpy(p, &i, 4);
            break;
        }
        default:
            ADD_FAILURE() << "set() of a quantized type";
    }
}

template <class Fn>
void for_each(const Tensor* t, Fn fn) {
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) fn(i0, i1, i2, i3);
}

// Dequantized row (i1, i2, i3) of any type.
std::vector<float> row_f32(const Tensor* t, int64_t i1, int64_t i2, int64_t i3) {
    std::vector<float> out(static_cast<size_t>(t->ne[0]));
    if (is_quantized(t->type)) {
        EXPECT_TRUE(to_float_row(t->type, ptr(t, 0, i1, i2, i3), out.data(), t->ne[0]).is_ok());
    } else {
        for (int64_t i = 0; i < t->ne[0]; i++) out[i] = static_cast<float>(get(t, i, i1, i2, i3));
    }
    return out;
}

// Random values in [lo, hi) into every logical element of t (plain or quantized, any view).
void fill(Tensor* t, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    if (is_quantized(t->type)) {
        std::vector<float> r(static_cast<size_t>(t->ne[0]));
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                    for (float& v : r) v = dist(rng);
                    ASSERT_TRUE(
                        from_float_row(t->type, r.data(), ptr(t, 0, i1, i2, i3), t->ne[0]).is_ok());
                }
        return;
    }
    for_each(t, [&](int64_t a, int64_t b, int64_t c, int64_t d) { set(t, a, b, c, d, dist(rng)); });
}

// A contiguous tensor of shape ne stored inside a larger one (a spare outermost slice).
// Strided views (transpose, permutations moving dim 0) of it pass validate_node's view range
// check, which currently counts ne0 * nb0 bytes for dim 0 (more than a strided row spans).
Tensor* roomy(Context& ctx, Type t, std::initializer_list<int64_t> ne) {
    int64_t n[4] = {1, 1, 1, 1};
    int i = 0;
    for (int64_t v : ne) n[i++] = v;
    const int64_t big[4] = {n[0], n[1], n[2], n[3] + 1};
    Tensor* base = ctx.new_tensor(t, 4, big);
    return ctx.view(base, {n[0], n[1], n[2], n[3]}, {base->nb[1], base->nb[2], base->nb[3]}, 0);
}

// A context, its graph and storage for a test.
struct Harness {
    Context ctx;
    Graph g;
    std::unique_ptr<Buffer> buf;

    void build(std::initializer_list<Tensor*> outs) {
        for (Tensor* t : outs) g.build_forward(t);
        Expected<std::unique_ptr<Buffer>> b =
            allocate_context_tensors(ctx, cpu::host_buffer_type());
        ASSERT_TRUE(b.has_value()) << b.message();
        buf = std::move(*b);
    }
    Status run(int n_threads) { return cpu::make_cpu_backend(n_threads)->compute(g); }
};

// |got - want| <= atol + rtol |want|, elementwise, with the first failure reported.
void expect_near(const Tensor* got,
                 const std::function<double(int64_t, int64_t, int64_t, int64_t)>& want, double atol,
                 double rtol, const std::string& what) {
    int64_t bad = 0;
    for_each(got, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
        const double g = get(got, i0, i1, i2, i3);
        const double w = want(i0, i1, i2, i3);
        const bool ok = (std::isinf(w) && g == w) || std::fabs(g - w) <= atol + rtol * std::fabs(w);
        if (!ok && bad++ == 0) {
            ADD_FAILURE() << what << ": at [" << i0 << ", " << i1 << ", " << i2 << ", " << i3
                          << "] got " << g << ", want " << w;
        }
    });
    EXPECT_EQ(bad, 0) << what;
}

std::vector<uint8_t> bytes_of(const Tensor* t) {
    EXPECT_TRUE(t->is_contiguous());
    const uint8_t* p = static_cast<const uint8_t*>(t->data);
    return std::vector<uint8_t>(p, p + t->nbytes());
}

// ---------------------------------------------------------------------------------------------
// CPY / CONT

struct CpyCase {
    Type src, dst;
};

class CpyTypes : public ::testing::TestWithParam<CpyCase> {};

TEST_P(CpyTypes, ContiguousRowsMatchConversion) {
    const CpyCase c = GetParam();
    std::mt19937 rng(1);
    Harness h;
    Tensor* src = h.ctx.new_tensor(c.src, {256, 3, 2, 1});
    Tensor* dst = h.ctx.new_tensor(c.dst, {256, 3, 2, 1});
    Tensor* out = h.ctx.cpy(src, dst);
    h.build({out});
    fill(src, rng);
    for (int nth : {1, 2}) {
        std::memset(dst->data, 0, dst->nbytes());
        ASSERT_TRUE(h.run(nth).is_ok());
        // Expected: dequantize the source row, then convert with the reference from_float.
        for (int64_t i2 = 0; i2 < 2; i2++)
            for (int64_t i1 = 0; i1 < 3; i1++) {
                std::vector<float> r = row_f32(src, i1, i2, 0);
                std::vector<uint8_t> want(row_size(c.dst, 256));
                ASSERT_TRUE(from_float_row(c.dst, r.data(), want.data(), 256).is_ok());
                ASSERT_EQ(std::memcmp(want.data(), ptr(out, 0, i1, i2, 0), want.size()), 0)
                    << type_name(c.src) << " -> " << type_name(c.dst) << " row " << i1 << "," << i2
                    << " threads " << nth;
            }
    }
}

INSTANTIATE_TEST_SUITE_P(
    All, CpyTypes,
    ::testing::Values(CpyCase{Type::F32, Type::F16}, CpyCase{Type::F16, Type::F32},
                      CpyCase{Type::F32, Type::BF16}, CpyCase{Type::BF16, Type::F32},
                      CpyCase{Type::F16, Type::BF16}, CpyCase{Type::BF16, Type::F16},
                      CpyCase{Type::F32, Type::Q8_0}, CpyCase{Type::F32, Type::Q4_0},
                      CpyCase{Type::Q4_0, Type::F32}, CpyCase{Type::Q8_0, Type::F16},
                      CpyCase{Type::F16, Type::Q8_0}, CpyCase{Type::Q4_K, Type::F32},
                      CpyCase{Type::F32, Type::Q6_K}, CpyCase{Type::Q8_0, Type::Q8_0},
                      CpyCase{Type::F32, Type::F32}),
    [](const ::testing::TestParamInfo<CpyCase>& i) {
        return std::string(type_name(i.param.src)) + "_to_" + type_name(i.param.dst);
    });

// Values exactly representable in every plain type, so any conversion order is exact.
void fill_exact(Tensor* t, std::mt19937& rng) {
    std::uniform_int_distribution<int> dist(-128, 127);
    for_each(t, [&](int64_t a, int64_t b, int64_t c, int64_t d) {
        set(t, a, b, c, d, dist(rng) / 16.0);
    });
}

TEST(CpuOps, CpyTransposedSourceToF16) {
    std::mt19937 rng(2);
    Harness h;
    Tensor* a = roomy(h.ctx, Type::F32, {5, 7, 3});
    Tensor* at = h.ctx.transpose(a);  // [7, 5, 3], nb0 = 20 bytes
    Tensor* dst = h.ctx.new_tensor(Type::F16, {7, 5, 3});
    Tensor* out = h.ctx.cpy(at, dst);
    h.build({out});
    fill(a, rng);
    ASSERT_TRUE(h.run(2).is_ok());
    expect_near(
        out,
        [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
            return static_cast<double>(
                fp16_to_fp32(fp32_to_fp16(static_cast<float>(get(a, i1, i0, i2)))));
        },
        0, 0, "cpy transposed");
}

TEST(CpuOps, CpyIntoTransposedDestination) {
    std::mt19937 rng(3);
    Harness h;
    Tensor* src = h.ctx.new_tensor(Type::F16, {6, 9, 2});
    Tensor* d = roomy(h.ctx, Type::BF16, {9, 6, 2});
    Tensor* dt = h.ctx.transpose(d);  // [6, 9, 2] strided
    Tensor* out = h.ctx.cpy(src, dt);
    h.build({out});
    fill_exact(src, rng);
    ASSERT_TRUE(h.run(2).is_ok());
    expect_near(
        d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t) { return get(src, i1, i0, i2); }, 0, 0,
        "cpy into transposed");
}

TEST(CpuOps, CpyBetweenShapesInLogicalOrder) {
    std::mt19937 rng(4);
    Harness h;
    Tensor* a = roomy(h.ctx, Type::F32, {6, 4, 5});
    Tensor* ap = h.ctx.permute(a, 2, 0, 1, 3);  // [4, 5, 6], non-contiguous
    Tensor* dst = h.ctx.new_tensor(Type::F16, {8, 15});
    Tensor* out = h.ctx.cpy(ap, dst);
    h.build({out});
    fill_exact(a, rng);
    ASSERT_TRUE(h.run(2).is_ok());
    // flat index e of dst = flat index of ap in its logical order
    expect_near(
        out,
        [&](int64_t i0, int64_t i1, int64_t, int64_t) {
            int64_t e = i1 * 8 + i0;
            const int64_t j0 = e % 4, j1 = e / 4 % 5, j2 = e / 20;
            return get(ap, j0, j1, j2);
        },
        0, 0, "cpy reshaping");
}

TEST(CpuOps, CpyI32SameType) {
    Harness h;
    Tensor* a = roomy(h.ctx, Type::I32, {3, 4});
    Tensor* dst = h.ctx.new_tensor(Type::I32, {4, 3});
    Tensor* out = h.ctx.cpy(h.ctx.transpose(a), dst);
    h.build({out});
    for_each(
        a, [&](int64_t i0, int64_t i1, int64_t, int64_t) { set(a, i0, i1, 0, 0, i0 * 100 + i1); });
    ASSERT_TRUE(h.run(2).is_ok());
    expect_near(
        out, [&](int64_t i0, int64_t i1, int64_t, int64_t) { return i1 * 100.0 + i0; }, 0, 0,
        "i32");
}

TEST(CpuOps, ContPermuted4d) {
    std::mt19937 rng(5);
    for (Type t : {Type::F32, Type::F16, Type::BF16}) {
        Harness h;
        Tensor* a = roomy(h.ctx, t, {3, 5, 4, 2});
        Tensor* ap = h.ctx.permute(a, 1, 3, 0, 2);  // ne = [4, 3, 2, 5]
        Tensor* out = h.ctx.cont(ap);
        h.build({out});
        fill(a, rng);
        ASSERT_TRUE(h.run(2).is_ok());
        EXPECT_TRUE(out->is_contiguous());
        expect_near(
            out,
            [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) { return get(ap, i0, i1, i2, i3); },
            0, 0, std::string("cont ") + type_name(t));
    }
}

TEST(CpuOps, ContQuantizedRowView) {
    std::mt19937 rng(6);
    Harness h;
    Tensor* a = h.ctx.new_tensor(Type::Q8_0, {96, 7});
    // every other row, 64 of 96 elements (2 blocks), starting at block 1
    Tensor* v = h.ctx.view_2d(a, 64, 3, 2 * a->nb[1], a->nb[0]);
    Tensor* out = h.ctx.cont(v);
    h.build({out});
    fill(a, rng);
    ASSERT_TRUE(h.run(2).is_ok());
    for (int64_t r = 0; r < 3; r++) {
        EXPECT_EQ(std::memcmp(ptr(out, 0, r, 0, 0), ptr(a, 0, 2 * r, 0, 0) + a->nb[0],
                              row_size(Type::Q8_0, 64)),
                  0)
            << "row " << r;
    }
}

// ---------------------------------------------------------------------------------------------
// GET_ROWS / SET_ROWS

TEST(CpuOps, GetRowsAnyTypeBroadcastIndices) {
    std::mt19937 rng(7);
    for (Type t : {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q4_K}) {
        Harness h;
        const int64_t ne0 = t == Type::Q4_K ? 256 : 64;
        Tensor* a = h.ctx.new_tensor(t, {ne0, 9, 2, 3});
        Tensor* idx = h.ctx.new_tensor(Type::I32, {5, 2, 3});
        Tensor* out = h.ctx.get_rows(a, idx);
        h.build({out});
        fill(a, rng);
        std::uniform_int_distribution<int> di(0, 8);
        for_each(idx, [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
            set(idx, i0, i1, i2, 0, di(rng));
        });
        ASSERT_TRUE(h.run(2).is_ok());
        for_each(idx, [&](int64_t i, int64_t j, int64_t k, int64_t) {
            const std::vector<float> want =
                row_f32(a, static_cast<int64_t>(get(idx, i, j, k)), j, k);
            ASSERT_EQ(std::memcmp(want.data(), ptr(out, 0, i, j, k), want.size() * 4), 0)
                << type_name(t) << " row " << i << "," << j << "," << k;
        });
    }
}

TEST(CpuOps, GetRowsIndexOutOfRangeFails) {
    for (int bad : {9, -1, 1234}) {
        Harness h;
        Tensor* a = h.ctx.new_tensor(Type::F32, {8, 9});
        Tensor* idx = h.ctx.new_tensor(Type::I32, {4});
        idx->set_name("ids");
        Tensor* out = h.ctx.get_rows(a, idx);
        out->set_name("emb");
        h.build({out});
        std::memset(a->data, 0, a->nbytes());
        const int32_t ids[4] = {0, 3, bad, 8};
        std::memcpy(idx->data, ids, sizeof(ids));
        for (int nth : {1, 2}) {
            Status st = h.run(nth);
            ASSERT_FALSE(st.is_ok());
            EXPECT_NE(st.message().find("GET_ROWS"), std::string::npos) << st.message();
            EXPECT_NE(st.message().find(std::to_string(bad)), std::string::npos) << st.message();
            EXPECT_NE(st.message().find("emb"), std::string::npos) << st.message();
        }
    }
}

TEST(CpuOps, SetRowsConvertsIntoDestination) {
    std::mt19937 rng(8);
    for (Type t : {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q4_0}) {
        Harness h;
        Tensor* dst = h.ctx.new_tensor(t, {64, 11, 2});
        Tensor* src = h.ctx.new_tensor(Type::F32, {64, 4, 2});
        Tensor* idx = h.ctx.new_tensor(Type::I32, {4, 2});
        Tensor* out = h.ctx.set_rows(dst, src, idx);
        h.build({out});
        fill(src, rng);
        std::memset(dst->data, 0x11, dst->nbytes());
        const int32_t ids[8] = {10, 0, 5, 3, 1, 1, 7, 2};  // matrix 1 repeats row 1: last wins
        std::memcpy(idx->data, ids, sizeof(ids));
        for (int nth : {1, 2, 3}) {
            ASSERT_TRUE(h.run(nth).is_ok());
            const size_t rs = row_size(t, 64);
            for (int64_t m = 0; m < 2; m++) {
                std::vector<bool> written(11, false);
                for (int64_t i = 3; i >= 0; i--) {
                    const int r = ids[m * 4 + i];
                    if (written[r]) continue;  // a later source row owns it
                    written[r] = true;
                    std::vector<uint8_t> want(rs);
                    ASSERT_TRUE(from_float_row(t,
                                               reinterpret_cast<const float*>(ptr(src, 0, i, m, 0)),
                                               want.data(), 64)
                                    .is_ok());
                    EXPECT_EQ(std::memcmp(want.data(), ptr(dst, 0, r, m, 0), rs), 0)
                        << type_name(t) << " dst row " << r << " matrix " << m;
                }
                for (int r = 0; r < 11; r++) {
                    if (written[r]) continue;
                    const uint8_t* p = ptr(dst, 0, r, m, 0);
                    for (size_t b = 0; b < rs; b++) ASSERT_EQ(p[b], 0x11) << "untouched row " << r;
                }
            }
        }
    }
}

TEST(CpuOps, SetRowsIndexOutOfRangeFails) {
    Harness h;
    Tensor* dst = h.ctx.new_tensor(Type::F16, {16, 6});
    dst->set_name("kv");
    Tensor* src = h.ctx.new_tensor(Type::F32, {16, 3});
    Tensor* idx = h.ctx.new_tensor(Type::I32, {3});
    Tensor* out = h.ctx.set_rows(dst, src, idx);
    h.build({out});
    std::mt19937 rng(9);
    fill(src, rng);
    std::memset(dst->data, 0, dst->nbytes());
    const int32_t ids[3] = {2, 777, 4};
    std::memcpy(idx->data, ids, sizeof(ids));
    for (int nth : {1, 2}) {
        Status st = h.run(nth);
        ASSERT_FALSE(st.is_ok());
        EXPECT_NE(st.message().find("SET_ROWS"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("777"), std::string::npos) << st.message();
    }
}

// ---------------------------------------------------------------------------------------------
// ADD / MUL

TEST(CpuOps, BinaryBroadcast) {
    std::mt19937 rng(10);
    const int64_t a_ne[4] = {12, 5, 3, 2};
    const int64_t b_shapes[][4] = {{12, 5, 3, 2}, {12, 1, 1, 1}, {1, 5, 1, 2},
                                   {4, 5, 3, 1},  {1, 1, 1, 1},  {6, 1, 3, 2}};
    for (bool add : {true, false}) {
        for (const auto& bs : b_shapes) {
            Harness h;
            Tensor* a = h.ctx.new_tensor(Type::F32, 4, a_ne);
            Tensor* b = h.ctx.new_tensor(Type::F32, 4, bs);
            Tensor* out = add ? h.ctx.add(a, b) : h.ctx.mul(a, b);
            h.build({out});
            fill(a, rng);
            fill(b, rng);
            ASSERT_TRUE(h.run(2).is_ok());
            expect_near(
                out,
                [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
                    const float x = static_cast<float>(get(a, i0, i1, i2, i3));
                    const float y =
                        static_cast<float>(get(b, i0 % bs[0], i1 % bs[1], i2 % bs[2], i3 % bs[3]));
                    return static_cast<double>(add ? x + y : x * y);
                },
                0, 0, add ? "add" : "mul");
        }
    }
}

TEST(CpuOps, BinaryNonContiguousOperands) {
    std::mt19937 rng(11);
    Harness h;
    Tensor* a0 = h.ctx.new_tensor(Type::F32, {7, 4, 3});
    Tensor* a = h.ctx.permute(a0, 0, 2, 1, 3);  // [7, 3, 4]
    Tensor* b0 = h.ctx.new_tensor(Type::F32, {7, 3, 2});
    Tensor* b = h.ctx.view_2d(b0, 7, 3, b0->nb[1], b0->nb[2]);  // second matrix
    Tensor* out = h.ctx.mul(a, b);
    h.build({out});
    fill(a0, rng);
    fill(b0, rng);
    ASSERT_TRUE(h.run(2).is_ok());
    expect_near(
        out,
        [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
            return static_cast<double>(static_cast<float>(get(a, i0, i1, i2)) *
                                       static_cast<float>(get(b0, i0, i1, 1)));
        },
        0, 0, "mul views");
}

// ---------------------------------------------------------------------------------------------
// Elementwise

double gelu_ref(double x) {
    return 0.5 * x *
           (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
double silu_ref(double x) {
    return x / (1.0 + std::exp(-x));
}

TEST(CpuOps, Unary) {
    std::mt19937 rng(12);
    Harness h;
    Tensor* a0 = h.ctx.new_tensor(Type::F32, {37, 6, 3});
    Tensor* a = h.ctx.permute(a0, 0, 2, 1, 3);  // rows strided
    Tensor* b = h.ctx.new_tensor(Type::F32, {37, 3, 6});
    Tensor* sc = h.ctx.scale(a, 0.37f, -1.25f);
    Tensor* sc0 = h.ctx.scale(a, -2.5f);
    Tensor* si = h.ctx.silu(a);
    Tensor* ge = h.ctx.gelu(a);
    Tensor* sw = h.ctx.swiglu(a, b);
    Tensor* gg = h.ctx.geglu(a, b);
    h.build({sc, sc0, si, ge, sw, gg});
    fill(a0, rng, -12.0f, 12.0f);
    fill(b, rng);
    // a few extreme values
    set(a0, 0, 0, 0, 0, -90.0);
    set(a0, 1, 0, 0, 0, 95.0);
    set(a0, 2, 0, 0, 0, 0.0);
    set(a0, 3, 0, 0, 0, -1e-6);
    ASSERT_TRUE(h.run(2).is_ok());
    auto x = [&](int64_t i0, int64_t i1, int64_t i2) { return get(a, i0, i1, i2); };
    expect_near(
        sc,
        [&](int64_t i0, int64_t i1, int64_t i2, int64_t) { return x(i0, i1, i2) * 0.37 - 1.25; },
        1e-6, 1e-6, "scale");
    expect_near(
        sc0,
        [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
            return static_cast<double>(static_cast<float>(x(i0, i1, i2) * -2.5));
        },
        0, 0, "scale without bias");
    expect_near(
        si, [&](int64_t i0, int64_t i1, int64_t i2, int64_t) { return silu_ref(x(i0, i1, i2)); },
        1e-7, 3e-6, "silu");
    expect_near(
        ge, [&](int64_t i0, int64_t i1, int64_t i2, int64_t) { return gelu_ref(x(i0, i1, i2)); },
        1e-7, 3e-6, "gelu");
    expect_near(
        sw,
        [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
            return silu_ref(x(i0, i1, i2)) * get(b, i0, i1, i2);
        },
        1e-7, 3e-6, "swiglu");
    expect_near(
        gg,
        [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
            return gelu_ref(x(i0, i1, i2)) * get(b, i0, i1, i2);
        },
        1e-7, 3e-6, "geglu");
}

// ---------------------------------------------------------------------------------------------
// Norms

TEST(CpuOps, RmsNormAndNorm) {
    std::mt19937 rng(13);
    for (int64_t ne0 : {1, 7, 37, 4099}) {
        Harness h;
        Tensor* a0 = h.ctx.new_tensor(Type::F32, {ne0, 3, 4});
        Tensor* a = h.ctx.permute(a0, 0, 2, 1, 3);  // [ne0, 4, 3] strided rows
        const float eps = 1e-5f;
        Tensor* rn = h.ctx.rms_norm(a, eps);
        Tensor* n = h.ctx.norm(a, eps);
        h.build({rn, n});
        fill(a0, rng, -3.0f, 5.0f);
        ASSERT_TRUE(h.run(2).is_ok());
        for (int64_t i2 = 0; i2 < 3; i2++)
            for (int64_t i1 = 0; i1 < 4; i1++) {
                double ss = 0, s = 0;
                for (int64_t i = 0; i < ne0; i++) {
                    const double v = get(a, i, i1, i2);
                    ss += v * v;
                    s += v;
                }
                const double mean = s / ne0;
                double var = 0;
                for (int64_t i = 0; i < ne0; i++) {
                    const double d = get(a, i, i1, i2) - mean;
                    var += d * d;
                }
                var /= ne0;
                const double rs = 1.0 / std::sqrt(ss / ne0 + eps);
                const double ns = 1.0 / std::sqrt(var + eps);
                for (int64_t i = 0; i < ne0; i++) {
                    const double x = get(a, i, i1, i2);
                    ASSERT_NEAR(get(rn, i, i1, i2), x * rs, 2e-6 * std::fabs(x * rs) + 1e-7)
                        << "rms_norm ne0 " << ne0;
                    ASSERT_NEAR(get(n, i, i1, i2), (x - mean) * ns,
                                2e-6 * std::fabs((x - mean) * ns) + 1e-6)
                        << "norm ne0 " << ne0;
                }
            }
    }
}

// ---------------------------------------------------------------------------------------------
// SOFT_MAX

void softmax_ref(const std::vector<double>& z, std::vector<double>* y) {
    double mx = -kInf;
    for (double v : z) mx = std::max(mx, v);
    y->assign(z.size(), 0.0);
    if (mx == -kInf) return;
    double s = 0;
    for (size_t i = 0; i < z.size(); i++) s += std::exp(z[i] - mx);
    for (size_t i = 0; i < z.size(); i++) (*y)[i] = std::exp(z[i] - mx) / s;
}

TEST(CpuOps, SoftMaxWithMasks) {
    std::mt19937 rng(14);
    for (int mask_kind : {0, 1, 2}) {  // none, F32, F16
        Harness h;
        const int64_t ne0 = 67, ne1 = 5, ne2 = 3, ne3 = 2;
        Tensor* a = h.ctx.new_tensor(Type::F32, {ne0, ne1, ne2, ne3});
        Tensor* mask = nullptr;
        if (mask_kind) {
            mask = h.ctx.new_tensor(mask_kind == 1 ? Type::F32 : Type::F16, {ne0, ne1 + 2, 1, 2});
        }
        Tensor* out = h.ctx.soft_max(a, mask, 0.7f);
        h.build({out});
        fill(a, rng, -8.0f, 8.0f);
        if (mask) {
            fill(mask, rng, -2.0f, 2.0f);
            // causal-like -inf entries, and row 1 of matrix 0 fully masked
            for_each(mask, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
                if (i0 > 40 + i1 || (i1 == 1 && i3 == 0)) set(mask, i0, i1, i2, i3, -kInf);
            });
        }
        for (int nth : {1, 2}) {
            ASSERT_TRUE(h.run(nth).is_ok());
            for (int64_t i3 = 0; i3 < ne3; i3++)
                for (int64_t i2 = 0; i2 < ne2; i2++)
                    for (int64_t i1 = 0; i1 < ne1; i1++) {
                        std::vector<double> z(ne0), y;
                        for (int64_t i = 0; i < ne0; i++) {
                            z[i] =
                                static_cast<double>(static_cast<float>(get(a, i, i1, i2, i3)) *
                                                    0.7f) +
                                (mask ? get(mask, i, i1, i2 % mask->ne[2], i3 % mask->ne[3]) : 0.0);
                        }
                        softmax_ref(z, &y);
                        double sum = 0;
                        for (int64_t i = 0; i < ne0; i++) {
                            const double g = get(out, i, i1, i2, i3);
                            ASSERT_NEAR(g, y[i], 3e-6 * y[i] + 1e-9)
                                << "mask " << mask_kind << " row " << i1 << "," << i2 << "," << i3
                                << " i " << i;
                            if (std::isinf(z[i])) {
                                ASSERT_EQ(g, 0.0);
                            }
                            sum += g;
                        }
                        const bool all_masked = mask && i1 == 1 && i3 == 0;
                        EXPECT_NEAR(sum, all_masked ? 0.0 : 1.0, 1e-5);
                    }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ROPE

TEST(CpuOps, Rope) {
    std::mt19937 rng(15);
    struct C {
        int64_t ne0;
        int n_dims, mode;
        float base, scale;
    };
    for (const C& c : {C{64, 64, kRopeNormal, 10000.0f, 1.0f}, C{64, 64, kRopeNeox, 10000.0f, 1.0f},
                       C{40, 24, kRopeNormal, 500000.0f, 0.25f}, C{40, 24, kRopeNeox, 1e6f, 0.5f},
                       C{6, 2, kRopeNeox, 10000.0f, 1.0f}}) {
        Harness h;
        const int64_t n_head = 5, n_tok = 4;
        Tensor* a0 = h.ctx.new_tensor(Type::F32, {c.ne0, n_tok, n_head});
        Tensor* a = h.ctx.permute(a0, 0, 2, 1, 3);  // [ne0, n_head, n_tok] strided
        Tensor* pos = h.ctx.new_tensor(Type::I32, {n_tok});
        Tensor* out = h.ctx.rope(a, pos, c.n_dims, c.mode, c.base, c.scale);
        h.build({out});
        fill(a0, rng);
        const int32_t ps[n_tok] = {0, 1, 517, 4095};
        std::memcpy(pos->data, ps, sizeof(ps));
        ASSERT_TRUE(h.run(2).is_ok());
        const int64_t half = c.n_dims / 2;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t hd = 0; hd < n_head; hd++) {
                for (int64_t i = 0; i < half; i++) {
                    const double theta = ps[t] * static_cast<double>(c.scale) *
                                         std::pow(static_cast<double>(c.base), -2.0 * i / c.n_dims);
                    const int64_t j0 = c.mode == kRopeNeox ? i : 2 * i;
                    const int64_t j1 = c.mode == kRopeNeox ? i + half : 2 * i + 1;
                    const double x0 = get(a, j0, hd, t), x1 = get(a, j1, hd, t);
                    ASSERT_NEAR(get(out, j0, hd, t), x0 * std::cos(theta) - x1 * std::sin(theta),
                                1e-6)
                        << "mode " << c.mode << " pos " << ps[t] << " i " << i;
                    ASSERT_NEAR(get(out, j1, hd, t), x0 * std::sin(theta) + x1 * std::cos(theta),
                                1e-6)
                        << "mode " << c.mode << " pos " << ps[t] << " i " << i;
                }
                for (int64_t i = c.n_dims; i < c.ne0; i++) {
                    ASSERT_EQ(get(out, i, hd, t), get(a, i, hd, t)) << "pass-through dim " << i;
                }
            }
    }
}

// ---------------------------------------------------------------------------------------------
// FLASH_ATTN_EXT

struct AttnCase {
    Type kv;
    int64_t d, dv, n_q, n_kv, n_head, n_head_kv, ne3, ne3k;
    int mask;  // 0 none, 1 F32, 2 F16
};

class FlashAttn : public ::testing::TestWithParam<AttnCase> {};

TEST_P(FlashAttn, MatchesDoubleReference) {
    const AttnCase c = GetParam();
    std::mt19937 rng(16);
    Harness h;
    // q built as [D, n_head, n_q] and permuted, as a model does
    Tensor* q0 = h.ctx.new_tensor(Type::F32, {c.d, c.n_head, c.n_q, c.ne3});
    Tensor* q = h.ctx.permute(q0, 0, 2, 1, 3);  // [D, n_q, n_head, ne3]
    Tensor* k = h.ctx.new_tensor(c.kv, {c.d, c.n_kv, c.n_head_kv, c.ne3k});
    Tensor* v = h.ctx.new_tensor(c.kv, {c.dv, c.n_kv, c.n_head_kv, c.ne3k});
    Tensor* mask = nullptr;
    if (c.mask)
        mask = h.ctx.new_tensor(c.mask == 1 ? Type::F32 : Type::F16, {c.n_kv, c.n_q + 3, 1, 1});
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    Tensor* out = h.ctx.flash_attn_ext(q, k, v, mask, scale);
    h.build({out});
    fill(q0, rng, -2.0f, 2.0f);
    fill(k, rng, -2.0f, 2.0f);
    fill(v, rng);
    if (mask) {
        fill(mask, rng, -1.0f, 1.0f);
        // causal: query i sees kv positions <= n_kv - n_q + i
        for_each(mask, [&](int64_t j, int64_t i, int64_t, int64_t) {
            if (j > c.n_kv - c.n_q + i) set(mask, j, i, 0, 0, -kInf);
        });
    }
    ASSERT_EQ(out->ne[0], c.dv);
    ASSERT_EQ(out->ne[1], c.n_head);
    ASSERT_EQ(out->ne[2], c.n_q);
    for (int nth : {1, 2}) {
        ASSERT_TRUE(h.run(nth).is_ok());
        const int64_t group = c.n_head / c.n_head_kv, bgroup = c.ne3 / c.ne3k;
        for (int64_t i3 = 0; i3 < c.ne3; i3++)
            for (int64_t iq = 0; iq < c.n_q; iq++)
                for (int64_t hh = 0; hh < c.n_head; hh++) {
                    const int64_t hk = hh / group, i3k = i3 / bgroup;
                    std::vector<double> z(c.n_kv), p;
                    for (int64_t j = 0; j < c.n_kv; j++) {
                        double dot = 0;
                        for (int64_t e = 0; e < c.d; e++)
                            dot += get(q, e, iq, hh, i3) * get(k, e, j, hk, i3k);
                        z[j] = dot * scale + (mask ? get(mask, j, iq, 0, 0) : 0.0);
                    }
                    softmax_ref(z, &p);
                    for (int64_t e = 0; e < c.dv; e++) {
                        double want = 0;
                        for (int64_t j = 0; j < c.n_kv; j++) want += p[j] * get(v, e, j, hk, i3k);
                        ASSERT_NEAR(get(out, e, hh, iq, i3), want, 2e-5 + 1e-5 * std::fabs(want))
                            << "q " << iq << " head " << hh << " b " << i3 << " e " << e;
                    }
                }
    }
}

INSTANTIATE_TEST_SUITE_P(All, FlashAttn,
                         ::testing::Values(AttnCase{Type::F32, 64, 64, 3, 150, 4, 2, 1, 1, 2},
                                           AttnCase{Type::F16, 128, 128, 1, 200, 8, 2, 1, 1, 2},
                                           AttnCase{Type::F16, 64, 48, 7, 70, 4, 4, 1, 1, 1},
                                           AttnCase{Type::BF16, 40, 40, 5, 33, 6, 3, 2, 1, 1},
                                           AttnCase{Type::F16, 24, 24, 4, 129, 2, 1, 2, 2, 0},
                                           AttnCase{Type::F32, 17, 9, 2, 5, 3, 1, 1, 1, 2}),
                         [](const ::testing::TestParamInfo<AttnCase>& i) {
                             return std::string(type_name(i.param.kv)) + "_d" +
                                    std::to_string(i.param.d) + "_kv" +
                                    std::to_string(i.param.n_kv) + "_mask" +
                                    std::to_string(i.param.mask) + "_" + std::to_string(i.index);
                         });

TEST(CpuOps, FlashAttnFullyMaskedRowIsZero) {
    Harness h;
    Tensor* q = h.ctx.new_tensor(Type::F32, {16, 2, 1});
    Tensor* k = h.ctx.new_tensor(Type::F16, {16, 8, 1});
    Tensor* v = h.ctx.new_tensor(Type::F16, {16, 8, 1});
    Tensor* mask = h.ctx.new_tensor(Type::F16, {8, 2});
    Tensor* out = h.ctx.flash_attn_ext(q, k, v, mask, 0.25f);
    h.build({out});
    std::mt19937 rng(17);
    fill(q, rng);
    fill(k, rng);
    fill(v, rng);
    for_each(mask, [&](int64_t j, int64_t i, int64_t, int64_t) {
        set(mask, j, i, 0, 0, i == 0 ? -kInf : 0.0);
    });
    ASSERT_TRUE(h.run(2).is_ok());
    for (int64_t e = 0; e < 16; e++) EXPECT_EQ(get(out, e, 0, 0, 0), 0.0);
    for (int64_t e = 0; e < 16; e++) EXPECT_TRUE(std::isfinite(get(out, e, 0, 1, 0)));
}

// ---------------------------------------------------------------------------------------------
// ARGMAX / SUM_ROWS

TEST(CpuOps, ArgmaxFirstIndexAndSumRows) {
    std::mt19937 rng(18);
    Harness h;
    Tensor* a = h.ctx.new_tensor(Type::F32, {103, 4, 3});
    Tensor* am = h.ctx.argmax(a);
    Tensor* sr = h.ctx.sum_rows(a);
    h.build({am, sr});
    fill(a, rng);
    // ties: the first occurrence wins
    set(a, 20, 0, 0, 0, 5.0);
    set(a, 90, 0, 0, 0, 5.0);
    set(a, 100, 1, 0, 0, 7.0);
    set(a, 17, 2, 1, 0, -kInf);
    ASSERT_TRUE(h.run(2).is_ok());
    for (int64_t i2 = 0; i2 < 3; i2++)
        for (int64_t i1 = 0; i1 < 4; i1++) {
            int64_t best = 0;
            double s = 0;
            for (int64_t i = 0; i < 103; i++) {
                if (get(a, i, i1, i2) > get(a, best, i1, i2)) best = i;
                s += get(a, i, i1, i2);
            }
            EXPECT_EQ(get(am, i1, i2), static_cast<double>(best));
            if (std::isinf(s)) {
                EXPECT_EQ(get(sr, 0, i1, i2), s);
            } else {
                EXPECT_NEAR(get(sr, 0, i1, i2), s, 1e-6 * std::fabs(s) + 1e-6);
            }
        }
    EXPECT_EQ(get(am, 0, 0), 20.0);
    EXPECT_EQ(get(am, 1, 0), 100.0);
}

// ---------------------------------------------------------------------------------------------
// Determinism: 1, 2 and 3 threads give bit-identical results

TEST(CpuOps, BitIdenticalAcrossThreadCounts) {
    std::mt19937 rng(19);
    Harness h;
    const int64_t d = 64, n_head = 4, n_head_kv = 2, n_tok = 5, n_kv = 96;
    Tensor* x = h.ctx.new_tensor(Type::F32, {d * n_head, n_tok});
    Tensor* w = h.ctx.new_tensor(Type::F32, {d * n_head});
    Tensor* pos = h.ctx.new_tensor(Type::I32, {n_tok});
    Tensor* cache = h.ctx.new_tensor(Type::F16, {d, n_kv, n_head_kv});
    Tensor* vcache = h.ctx.new_tensor(Type::F16, {d, n_kv, n_head_kv});
    Tensor* kidx = h.ctx.new_tensor(Type::I32, {n_tok, n_head_kv});
    Tensor* mask = h.ctx.new_tensor(Type::F16, {n_kv, n_tok});
    Tensor* scores = h.ctx.new_tensor(Type::F32, {n_kv, n_tok, n_head});

    Tensor* xn = h.ctx.mul(h.ctx.rms_norm(x, 1e-6f), w);
    Tensor* q =
        h.ctx.rope(h.ctx.reshape(xn, {d, n_head, n_tok}), pos, d, kRopeNeox, 10000.0f, 1.0f);
    Tensor* kv_new =
        h.ctx.view(xn, {d, n_tok, n_head_kv}, {xn->nb[1], static_cast<size_t>(d) * 4}, 0);
    Tensor* kset = h.ctx.set_rows(cache, h.ctx.cont(kv_new), kidx);
    Tensor* att = h.ctx.flash_attn_ext(h.ctx.permute(q, 0, 2, 1, 3), kset, vcache, mask, 0.125f);
    Tensor* sm = h.ctx.soft_max(scores, mask, 0.3f);
    Tensor* act = h.ctx.swiglu(h.ctx.norm(xn, 1e-5f), h.ctx.gelu(xn));
    Tensor* half = h.ctx.cpy(act, h.ctx.new_tensor(Type::BF16, {d * n_head, n_tok}));
    Tensor* rs = h.ctx.sum_rows(h.ctx.silu(sm));
    for (Tensor* t : {att, sm, act, rs}) t->flags |= kTensorOutput;
    h.build({att, sm, half, rs});
    fill(x, rng, -3.0f, 3.0f);
    fill(w, rng);
    fill(vcache, rng);
    fill(scores, rng, -5.0f, 5.0f);
    fill(mask, rng);
    const int32_t ps[n_tok] = {60, 61, 62, 63, 64};
    std::memcpy(pos->data, ps, sizeof(ps));
    for_each(kidx, [&](int64_t i, int64_t j, int64_t, int64_t) { set(kidx, i, j, 0, 0, 60 + i); });
    for_each(mask, [&](int64_t j, int64_t i, int64_t, int64_t) {
        if (j > 60 + i) set(mask, j, i, 0, 0, -kInf);
    });
    std::vector<uint8_t> cache0 = bytes_of(cache);

    std::vector<std::vector<uint8_t>> first;
    for (int nth : {1, 2, 3}) {
        std::memcpy(cache->data, cache0.data(), cache0.size());
        ASSERT_TRUE(h.run(nth).is_ok());
        std::vector<std::vector<uint8_t>> got;
        for (Tensor* t : {att, sm, act, rs, cache}) got.push_back(bytes_of(t));
        got.push_back(bytes_of(half->view_src));
        if (first.empty()) {
            first = got;
        } else {
            for (size_t i = 0; i < got.size(); i++) {
                EXPECT_TRUE(got[i] == first[i])
                    << "output " << i << " differs with " << nth << " threads";
            }
        }
    }
}

}  // namespace
}  // namespace ferry
