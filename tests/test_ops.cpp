// The op test suite on the CPU backend: one GoogleTest per case of make_op_tests().
#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <set>

#include "ferry/backend.h"
#include "ferry/op-tests.h"

namespace ferry::testing {

// GoogleTest prints parameters of failing tests with this.
void PrintTo(const OpTestCase& c, std::ostream* os) {
    *os << c.name << " (" << op_name(c.op) << " " << c.types << " " << c.shapes << ")";
}

namespace {

Backend* cpu_backend() {
    static std::unique_ptr<Backend> be = [] {
        Expected<std::unique_ptr<Backend>> b = cpu_device()->make_backend();
        return b ? std::move(*b) : nullptr;
    }();
    return be.get();
}

class OpTest : public ::testing::TestWithParam<OpTestCase> {};

TEST_P(OpTest, MatchesReference) {
    Backend* be = cpu_backend();
    ASSERT_NE(be, nullptr);
    const OpTestCase& c = GetParam();
    const OpTestResult r = run_op_test(c, be);
    EXPECT_TRUE(r.passed) << op_name(c.op) << " " << c.types << " " << c.shapes << ": " << r.message
                          << " [bound " << r.bound << ": " << c.bound_note << "]";
    if (r.passed) {
        EXPECT_LE(r.nmse, r.bound);
    }
}

INSTANTIATE_TEST_SUITE_P(Cpu, OpTest, ::testing::ValuesIn(make_op_tests()),
                         [](const ::testing::TestParamInfo<OpTestCase>& info) {
                             return info.param.name;
                         });

TEST(OpTests, NamesAreUniqueAndEveryOpIsCovered) {
    const std::vector<OpTestCase> cases = make_op_tests();
    std::set<std::string> names;
    std::set<Op> ops;
    for (const OpTestCase& c : cases) {
        EXPECT_TRUE(names.insert(c.name).second) << "duplicate case " << c.name;
        ops.insert(c.op);
    }
    for (uint32_t i = 1; i < static_cast<uint32_t>(Op::COUNT); i++) {
        EXPECT_TRUE(ops.count(static_cast<Op>(i))) << "no case for " << op_name(static_cast<Op>(i));
    }
}

TEST(OpTests, FilterSelectsByOpName) {
    const std::vector<OpTestCase> cases = make_op_tests("rope,soft_max");
    ASSERT_FALSE(cases.empty());
    for (const OpTestCase& c : cases) {
        EXPECT_TRUE(c.op == Op::ROPE || c.op == Op::SOFT_MAX) << c.name;
    }
    const std::vector<OpTestCase> q = make_op_tests("MUL_MAT_q4_K");
    ASSERT_FALSE(q.empty());
    for (const OpTestCase& c : q) EXPECT_EQ(c.op, Op::MUL_MAT);
}

TEST(OpTests, InputsAreDeterministicAndNonZero) {
    Context ctx;
    Tensor* t = ctx.new_tensor(Type::Q4_K, {256, 3});
    const std::vector<uint8_t> a = make_input_bytes(t, Fill::uniform(-1, 1), 42);
    const std::vector<uint8_t> b = make_input_bytes(t, Fill::uniform(-1, 1), 42);
    const std::vector<uint8_t> c = make_input_bytes(t, Fill::uniform(-1, 1), 43);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    EXPECT_EQ(a.size(), t->nbytes());
    Tensor* idx = ctx.new_tensor(Type::I32, {5, 4});
    const std::vector<uint8_t> p = make_input_bytes(idx, Fill::row_perm(9), 7);
    const int32_t* v = reinterpret_cast<const int32_t*>(p.data());
    for (int r = 0; r < 4; r++) {
        std::set<int32_t> seen;
        for (int i = 0; i < 5; i++) {
            EXPECT_GE(v[r * 5 + i], 0);
            EXPECT_LT(v[r * 5 + i], 9);
            EXPECT_TRUE(seen.insert(v[r * 5 + i]).second);
        }
    }
}

// A backend that runs the CPU backend and then corrupts one element of the last node: the
// harness must notice.
class CorruptingBackend : public Backend {
  public:
    explicit CorruptingBackend(Backend* inner) : inner_(inner) {}
    const char* name() const override { return "corrupting"; }
    Device* device() const override { return inner_->device(); }
    Status compute(Graph& g) override {
        FERRY_TRY(inner_->compute(g));
        Tensor* last = g.nodes.back();
        if (last->type != Type::F32 || !last->is_contiguous()) return Status::ok();
        std::vector<float> v(static_cast<size_t>(last->nelements()));
        FERRY_TRY(tensor_get(last, v.data(), last->nbytes()));
        v[v.size() / 2] = -3.0f * v[v.size() / 2] - 1.0f;  // a wrong value, not a rounding
        return tensor_set(last, v.data(), last->nbytes());
    }

  private:
    Backend* inner_;
};

TEST(OpTests, HarnessDetectsAWrongElement) {
    CorruptingBackend bad(cpu_backend());
    const std::vector<OpTestCase> cases =
        make_op_tests("MUL_MAT_q4_0_bcast,SOFT_MAX_no_mask,ROPE_neox,ADD");
    ASSERT_GE(cases.size(), 4u);
    for (const OpTestCase& c : cases) {
        const OpTestResult r = run_op_test(c, &bad);
        EXPECT_FALSE(r.passed) << c.name << " passed with a corrupted element (nmse " << r.nmse
                               << ")";
        EXPECT_TRUE(r.supported) << c.name;  // the CPU runs every op
        EXPECT_NE(r.message.find("element"), std::string::npos) << c.name << ": " << r.message;
    }
}

}  // namespace
}  // namespace ferry::testing
