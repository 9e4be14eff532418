// The float64 reference on tiny hand-computed cases, so the oracle itself is trustworthy.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/reference.h"
#include "ferry/graph.h"
#include "ferry/tensor.h"

namespace ferry {
namespace {

constexpr double kPi = 3.14159265358979323846;

void set_f32(RefEval& r, Tensor* t, std::vector<float> v) {
    ASSERT_EQ(v.size() * 4, t->nbytes());
    ASSERT_TRUE(r.set_leaf(t, v.data(), v.size() * 4).is_ok());
}
void set_i32(RefEval& r, Tensor* t, std::vector<int32_t> v) {
    ASSERT_EQ(v.size() * 4, t->nbytes());
    ASSERT_TRUE(r.set_leaf(t, v.data(), v.size() * 4).is_ok());
}

std::vector<double> run(RefEval& r, Tensor* out, const Tensor* read = nullptr) {
    Graph g;
    g.build_forward(out);
    Status st = r.run(g);
    EXPECT_TRUE(st.is_ok()) << st.message();
    Expected<std::vector<double>> v = r.values(read ? read : out);
    EXPECT_TRUE(v.has_value()) << v.message();
    return v ? *v : std::vector<double>{};
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want,
                 double tol = 1e-12) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(Reference, MulMat) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {2, 2});  // columns of the result: (1,2) and (3,4)
    Tensor* b = ctx.new_tensor(Type::F32, {2, 1});
    set_f32(r, a, {1, 2, 3, 4});
    set_f32(r, b, {5, 6});
    expect_near(run(r, ctx.mul_mat(a, b)), {17, 39});
}

TEST(Reference, MulMatBroadcastsByGroups) {
    // b matrix k uses a matrix k / (b.ne2 / a.ne2): GQA grouping, not repetition.
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {1, 1, 2});
    Tensor* b = ctx.new_tensor(Type::F32, {1, 1, 4});
    set_f32(r, a, {1, 10});
    set_f32(r, b, {1, 2, 3, 4});
    expect_near(run(r, ctx.mul_mat(a, b)), {1, 2, 30, 40});
}

TEST(Reference, SoftMaxWithScaleAndMask) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {2, 2});
    Tensor* m = ctx.new_tensor(Type::F32, {2, 2});
    const float ln3 = static_cast<float>(std::log(3.0));
    set_f32(r, a, {0, ln3, 5, 1});
    set_f32(r, m, {0, 0, 0, -INFINITY});
    // Row 0: softmax(0, ln3) = (1/4, 3/4) (up to ln3's float rounding); row 1: (1, 0).
    const std::vector<double> v = run(r, ctx.soft_max(a, m, 1.0f));
    const double e = std::exp(static_cast<double>(ln3));
    expect_near(v, {1 / (1 + e), e / (1 + e), 1, 0});
    EXPECT_NEAR(v[0], 0.25, 1e-7);
}

TEST(Reference, RopeModes) {
    // theta_0 = pos * freq_scale = pi/2 rotates pair 0 by a quarter turn; pair 1 has
    // theta_1 = theta_0 * base^(-2/4) = theta_0 / 100.
    for (int mode : {kRopeNormal, kRopeNeox}) {
        Context ctx;
        RefEval r;
        Tensor* a = ctx.new_tensor(Type::F32, {4, 1, 1});
        Tensor* pos = ctx.new_tensor(Type::I32, {1});
        set_f32(r, a, {1, 0, 0, 0});
        set_i32(r, pos, {2});
        const float fs = static_cast<float>(kPi / 4);
        const std::vector<double> v = run(r, ctx.rope(a, pos, 4, mode, 10000.0f, fs));
        const double th = 2.0 * static_cast<double>(fs);
        if (mode == kRopeNormal) {
            expect_near(v, {std::cos(th), std::sin(th), 0, 0});  // pairs (0,1), (2,3)
        } else {
            expect_near(v, {std::cos(th), 0, std::sin(th), 0});  // pairs (0,2), (1,3)
        }
        EXPECT_NEAR(std::fabs(v[mode == kRopeNormal ? 1 : 2]), 1.0, 1e-7);
    }
}

TEST(Reference, RopeFrequencyFactorsDivideAngles) {
    // Pair 1's angle 3 * 100^(-2/4) = 0.3 is divided by its factor 4; pair 0 keeps factor 1.
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {4, 1, 1});
    Tensor* pos = ctx.new_tensor(Type::I32, {1});
    Tensor* ff = ctx.new_tensor(Type::F32, {2});
    set_f32(r, a, {1, 0, 1, 0});
    set_i32(r, pos, {3});
    set_f32(r, ff, {1, 4});
    const std::vector<double> v = run(r, ctx.rope(a, pos, 4, kRopeNormal, 100.0f, 1.0f, ff));
    const double th = 0.3 / 4.0;
    expect_near(v, {std::cos(3.0), std::sin(3.0), std::cos(th), std::sin(th)});
}

TEST(Reference, RopeSecondPairFrequency) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {4, 1, 1});
    Tensor* pos = ctx.new_tensor(Type::I32, {1});
    set_f32(r, a, {0, 0, 1, 0});
    set_i32(r, pos, {3});
    const std::vector<double> v = run(r, ctx.rope(a, pos, 4, kRopeNormal, 100.0f, 1.0f));
    const double th = 3.0 / 10.0;  // 3 * 100^(-2/4)
    expect_near(v, {0, 0, std::cos(th), std::sin(th)});
}

TEST(Reference, GetRowsAndOutOfRange) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {2, 3});
    Tensor* idx = ctx.new_tensor(Type::I32, {2});
    set_f32(r, a, {1, 2, 3, 4, 5, 6});
    set_i32(r, idx, {2, 0});
    expect_near(run(r, ctx.get_rows(a, idx)), {5, 6, 1, 2});

    RefEval bad;
    set_f32(bad, a, {1, 2, 3, 4, 5, 6});
    set_i32(bad, idx, {3, 0});
    Graph g;
    g.build_forward(ctx.get_rows(a, idx));
    Status st = bad.run(g);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("out of range"), std::string::npos) << st.message();
}

TEST(Reference, SetRowsRoundsThroughF16AndChecksRange) {
    Context ctx;
    RefEval r;
    Tensor* dst = ctx.new_tensor(Type::F16, {1, 3});
    Tensor* src = ctx.new_tensor(Type::F32, {1, 1});
    Tensor* idx = ctx.new_tensor(Type::I32, {1});
    const std::vector<uint16_t> zeros = {fp32_to_fp16(1.0f), fp32_to_fp16(2.0f),
                                         fp32_to_fp16(3.0f)};
    ASSERT_TRUE(r.set_leaf(dst, zeros.data(), 6).is_ok());
    set_f32(r, src, {0.1f});
    set_i32(r, idx, {1});
    Tensor* out = ctx.set_rows(dst, src, idx);
    // 0.1 is not representable in f16: the nearest half is 0.0999755859375.
    expect_near(run(r, out, dst), {1, 0.0999755859375, 3}, 0);

    RefEval bad;
    ASSERT_TRUE(bad.set_leaf(dst, zeros.data(), 6).is_ok());
    set_f32(bad, src, {0.1f});
    set_i32(bad, idx, {3});
    Graph g;
    g.build_forward(out);
    EXPECT_FALSE(bad.run(g).is_ok());
}

TEST(Reference, TransposeViewMapsThroughStrides) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {3, 2});
    set_f32(r, a, {0, 1, 2, 3, 4, 5});
    Tensor* t = ctx.transpose(a);  // [2, 3]: t(i0, i1) = a(i1, i0)
    expect_near(run(r, ctx.cont(t)), {0, 3, 1, 4, 2, 5});
    Expected<std::vector<double>> direct = r.values(t);
    ASSERT_TRUE(direct.has_value());
    expect_near(*direct, {0, 3, 1, 4, 2, 5});
}

TEST(Reference, CpyIntoViewWritesOnlyTheWindow) {
    Context ctx;
    RefEval r;
    Tensor* dst = ctx.new_tensor(Type::F32, {4});
    Tensor* src = ctx.new_tensor(Type::F32, {2});
    set_f32(r, dst, {1, 1, 1, 1});
    set_f32(r, src, {7, 8});
    Tensor* out = ctx.cpy(src, ctx.view_1d(dst, 2, sizeof(float)));
    expect_near(run(r, out, dst), {1, 7, 8, 1});
}

TEST(Reference, CpyToQ8_0StoresQuantizedValues) {
    Context ctx;
    RefEval r;
    Tensor* src = ctx.new_tensor(Type::F32, {32});
    Tensor* dst = ctx.new_tensor(Type::Q8_0, {32});
    std::vector<float> v(32);
    for (int i = 0; i < 32; i++) v[i] = 0.013f * static_cast<float>(i * i % 17) - 0.1f;
    set_f32(r, src, v);
    BlockQ8_0 zero{};
    ASSERT_TRUE(r.set_leaf(dst, &zero, sizeof(zero)).is_ok());
    const std::vector<double> got = run(r, ctx.cpy(src, dst));
    BlockQ8_0 q;
    ASSERT_TRUE(from_float_row(Type::Q8_0, v.data(), &q, 32).is_ok());
    std::vector<float> back(32);
    ASSERT_TRUE(to_float_row(Type::Q8_0, &q, back.data(), 32).is_ok());
    for (int i = 0; i < 32; i++) {
        EXPECT_EQ(got[i], back[i]);
        EXPECT_NEAR(got[i], v[i], 0.2 / 127);  // within half a step of amax/127
    }
}

TEST(Reference, DecodesQ8_0Leaf) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::Q8_0, {32, 1});
    BlockQ8_0 blk;
    blk.d = 0x3800;  // 0.5
    for (int i = 0; i < 32; i++) blk.qs[i] = static_cast<int8_t>(i - 16);
    ASSERT_TRUE(r.set_leaf(a, &blk, sizeof(blk)).is_ok());
    Tensor* idx = ctx.new_tensor(Type::I32, {1});
    set_i32(r, idx, {0});
    const std::vector<double> v = run(r, ctx.get_rows(a, idx));
    for (int i = 0; i < 32; i++) EXPECT_EQ(v[i], 0.5 * (i - 16));
}

TEST(Reference, FlashAttnGqaAndMask) {
    Context ctx;
    RefEval r;
    Tensor* q = ctx.new_tensor(Type::F32, {1, 1, 2});  // 2 query heads
    Tensor* k = ctx.new_tensor(Type::F32, {1, 3, 1});  // 1 kv head, 3 positions
    Tensor* v = ctx.new_tensor(Type::F32, {1, 3, 1});
    Tensor* m = ctx.new_tensor(Type::F32, {3, 1});
    const float ln3 = static_cast<float>(std::log(3.0));
    set_f32(r, q, {1, 2});
    set_f32(r, k, {0, ln3, 100});
    set_f32(r, v, {4, 8, 1000});
    set_f32(r, m, {0, 0, -INFINITY});
    // Head 0: scores (0, ln3) -> p = (1/4, 3/4) -> 1 + 6 = 7.
    // Head 1: scores (0, 2 ln3) -> p = (1/10, 9/10) -> 0.4 + 7.2 = 7.6.
    const std::vector<double> got = run(r, ctx.flash_attn_ext(q, k, v, m, 1.0f));
    ASSERT_EQ(got.size(), 2u);  // [Dv=1, n_head=2, n_q=1]
    EXPECT_NEAR(got[0], 7.0, 1e-6);
    EXPECT_NEAR(got[1], 7.6, 1e-6);
}

TEST(Reference, ElementwiseFormulas) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {2, 2});
    Tensor* b = ctx.new_tensor(Type::F32, {2, 1});
    set_f32(r, a, {1, 2, 3, 4});
    set_f32(r, b, {10, 20});
    expect_near(run(r, ctx.add(a, b)), {11, 22, 13, 24});
    EXPECT_NEAR(ref_silu(1.0), 0.7310585786300049, 1e-15);
    EXPECT_NEAR(ref_gelu(1.0), 0.8411919906082768, 1e-15);  // tanh approximation
    EXPECT_NEAR(ref_gelu(-3.0), -0.0036373920817729943, 1e-15);
}

TEST(Reference, Norms) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {2, 1});
    set_f32(r, a, {3, 4});
    const double rms = std::sqrt(12.5);
    expect_near(run(r, ctx.rms_norm(a, 0.0f)), {3 / rms, 4 / rms});
    RefEval r2;
    set_f32(r2, a, {3, 4});
    expect_near(run(r2, ctx.norm(a, 0.0f)), {-1, 1});
}

TEST(Reference, ArgmaxFirstMaxAndSumRows) {
    Context ctx;
    RefEval r;
    Tensor* a = ctx.new_tensor(Type::F32, {3, 2});
    set_f32(r, a, {1, 3, 3, -1, -5, -0.5f});
    expect_near(run(r, ctx.argmax(a)), {1, 2});
    RefEval r2;
    set_f32(r2, a, {1, 3, 3, -1, -5, -0.5f});
    expect_near(run(r2, ctx.sum_rows(a)), {7, -6.5});
}

}  // namespace
}  // namespace ferry
