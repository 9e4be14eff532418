// Core: tensor validation, graph building and keys, the graph allocator, the scheduler.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu-backend.h"
#include "core/copy.h"
#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "ferry/scheduler.h"
#include "ferry/tensor.h"

using namespace ferry;

TEST(Core, NewTensorRejectsBadShapes) {
    Context ctx;
    const int64_t odd[2] = {33, 2};
    Expected<Tensor*> t = ctx.new_tensor_checked(Type::Q4_0, 2, odd);
    ASSERT_FALSE(t.has_value());
    EXPECT_NE(t.message().find("not a multiple"), std::string::npos) << t.message();
    const int64_t neg[2] = {32, -1};
    EXPECT_FALSE(ctx.new_tensor_checked(Type::F32, 2, neg).has_value());
    const int64_t huge[4] = {int64_t{1} << 40, int64_t{1} << 40, 1, 1};
    Expected<Tensor*> h = ctx.new_tensor_checked(Type::F32, 4, huge);
    ASSERT_FALSE(h.has_value());
    EXPECT_NE(h.message().find("overflow"), std::string::npos) << h.message();
}

TEST(Core, ContiguousStridesAndBytes) {
    Context ctx;
    Tensor* q = ctx.new_tensor(Type::Q8_0, {64, 3, 2});
    EXPECT_EQ(q->nb[0], 34u);
    EXPECT_EQ(q->nb[1], 68u);
    EXPECT_EQ(q->nb[2], 68u * 3);
    EXPECT_EQ(q->nbytes(), 68u * 6);
    EXPECT_TRUE(q->is_contiguous());
    Tensor* f = ctx.new_tensor(Type::F32, {5, 4});
    Tensor* tr = ctx.transpose(f);
    EXPECT_FALSE(tr->is_contiguous());
    EXPECT_EQ(tr->nbytes(), f->nbytes());
}

TEST(Core, ValidateRejectsViewPastItsSource) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {16, 4});
    Tensor v = *ctx.view_2d(a, 16, 2, a->nb[1], 0);
    v.view_offs = a->nb[1] * 3;  // rows 3..4 of 4: past the end
    Status st = validate_node(&v);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("past"), std::string::npos) << st.message();
}

TEST(Core, ValidateRejectsOverflowingStrides) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {16, 4});
    Tensor v = *ctx.view_2d(a, 16, 2, a->nb[1], 0);
    v.nb[1] = SIZE_MAX / 2;
    EXPECT_FALSE(validate_node(&v).is_ok());
}

TEST(Core, ValidateChecksOpRules) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {8, 3});
    Tensor* b = ctx.new_tensor(Type::F32, {8, 3});
    Tensor n = *ctx.add(a, b);
    EXPECT_TRUE(validate_node(&n).is_ok());
    Tensor bad = n;
    Tensor* c = ctx.new_tensor(Type::F32, {3, 3});
    bad.src[1] = c;  // does not broadcast
    EXPECT_FALSE(validate_node(&bad).is_ok());
    bad = n;
    bad.src[1] = nullptr;  // missing source
    EXPECT_FALSE(validate_node(&bad).is_ok());
    bad = n;
    bad.src[2] = a;  // too many sources
    EXPECT_FALSE(validate_node(&bad).is_ok());
    bad = n;
    bad.op = static_cast<Op>(999);
    EXPECT_FALSE(validate_node(&bad).is_ok());
    bad = n;
    bad.type = static_cast<Type>(77);
    EXPECT_FALSE(validate_node(&bad).is_ok());

    Tensor* x = ctx.new_tensor(Type::F32, {32, 4, 3});
    Tensor* pos = ctx.new_tensor(Type::I32, {3});
    Tensor r = *ctx.rope(x, pos, 32, kRopeNormal, 10000.0f, 1.0f);
    EXPECT_TRUE(validate_node(&r).is_ok());
    r.op_params[0] = 33;  // odd rotated dims
    EXPECT_FALSE(validate_node(&r).is_ok());
    r.op_params[0] = 32;
    r.op_params[1] = 5;  // unknown mode
    EXPECT_FALSE(validate_node(&r).is_ok());
}

TEST(Core, GraphOrderAndSignature) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {8, 2});
    Tensor* b = ctx.new_tensor(Type::F32, {8, 2});
    Tensor* s = ctx.add(a, b);
    Tensor* m = ctx.mul(s, a);
    Graph g;
    g.build_forward(m);
    ASSERT_EQ(g.nodes.size(), 2u);
    EXPECT_EQ(g.nodes[0], s);
    EXPECT_EQ(g.nodes[1], m);
    EXPECT_EQ(g.leafs.size(), 2u);

    Context ctx2;
    Tensor* a2 = ctx2.new_tensor(Type::F32, {8, 2});
    Tensor* b2 = ctx2.new_tensor(Type::F32, {8, 2});
    Graph g2;
    g2.build_forward(ctx2.mul(ctx2.add(a2, b2), a2));
    EXPECT_EQ(graph_signature(g), graph_signature(g2));  // same structure, other tensors

    Context ctx3;
    Tensor* a3 = ctx3.new_tensor(Type::F32, {8, 3});
    Tensor* b3 = ctx3.new_tensor(Type::F32, {8, 3});
    Graph g3;
    g3.build_forward(ctx3.mul(ctx3.add(a3, b3), a3));
    EXPECT_FALSE(graph_signature(g) == graph_signature(g3));  // other shape
}

TEST(Core, AllocatorReusesDeadIntermediates) {
    Context ctx;
    Tensor* x = ctx.new_tensor(Type::F32, {1024});
    Tensor* cur = x;
    for (int i = 0; i < 16; i++) cur = ctx.scale(cur, 1.0f);  // a chain: two live at a time
    cur->flags |= kTensorOutput;
    Graph g;
    g.build_forward(cur);
    GraphAllocator alloc(cpu::host_buffer_type());
    ASSERT_TRUE(alloc.allocate(g).is_ok());
    // leaf + two live intermediates + output: far less than 17 tensors of 4 KiB.
    EXPECT_LE(alloc.planned_size(), 4u * 4096u);
    EXPECT_GE(alloc.planned_size(), 3u * 4096u);
    // No two simultaneously live tensors overlap: node i and i+1 differ.
    for (size_t i = 0; i + 1 < g.nodes.size(); i++)
        EXPECT_NE(g.nodes[i]->data, g.nodes[i + 1]->data);
}

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

}  // namespace

TEST(Core, SchedulerRunsOnCpu) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {33, 5});
    Tensor* b = ctx.new_tensor(Type::F32, {33, 1});
    a->flags |= kTensorInput;
    b->flags |= kTensorInput;
    Tensor* out = ctx.mul(ctx.add(a, b), a);
    out->flags |= kTensorOutput;
    Graph g;
    g.build_forward(out);
    std::unique_ptr<Backend> cpu = cpu::make_cpu_backend(2);
    Scheduler sched({cpu.get()});
    Status ast = sched.alloc(g);
    ASSERT_TRUE(ast.is_ok()) << ast.message();
    std::vector<float> va = random_floats(33 * 5, 1), vb = random_floats(33, 2);
    ASSERT_TRUE(tensor_set(a, va.data(), va.size() * 4).is_ok());
    ASSERT_TRUE(tensor_set(b, vb.data(), vb.size() * 4).is_ok());
    Status st = sched.compute(g);
    ASSERT_TRUE(st.is_ok()) << st.message();
    std::vector<float> r(33 * 5);
    ASSERT_TRUE(tensor_get(out, r.data(), r.size() * 4).is_ok());
    for (int j = 0; j < 5; j++) {
        for (int i = 0; i < 33; i++) {
            const float e = (va[j * 33 + i] + vb[i]) * va[j * 33 + i];
            EXPECT_FLOAT_EQ(r[j * 33 + i], e);
        }
    }
    EXPECT_EQ(sched.n_splits(), 1);
}

TEST(Core, ThreadPoolBarrierAndDeterminism) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {257, 31});
    Tensor* out = ctx.sum_rows(ctx.scale(a, 0.5f, 1.0f));
    Graph g;
    g.build_forward(out);
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(ctx, cpu::host_buffer_type());
    ASSERT_TRUE(buf.has_value());
    std::vector<float> va = random_floats(257 * 31, 3);
    ASSERT_TRUE(tensor_set(a, va.data(), va.size() * 4).is_ok());
    std::vector<float> r1(31), r2(31);
    std::unique_ptr<Backend> one = cpu::make_cpu_backend(1);
    std::unique_ptr<Backend> two = cpu::make_cpu_backend(2);
    Status cst = one->compute(g);
    ASSERT_TRUE(cst.is_ok()) << cst.message();
    ASSERT_TRUE(tensor_get(out, r1.data(), 31 * 4).is_ok());
    ASSERT_TRUE(two->compute(g).is_ok());
    ASSERT_TRUE(tensor_get(out, r2.data(), 31 * 4).is_ok());
    EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), 31 * 4));
}

TEST(Core, ValidateRejectsMisalignedViews) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {16, 4});
    Tensor v = *ctx.view_1d(a, 8, 4);
    EXPECT_TRUE(validate_node(&v).is_ok());
    v.view_offs = 6;  // floats at an address that is not a multiple of 4
    Status st = validate_node(&v);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("offset 6"), std::string::npos) << st.message();
    Tensor w = *ctx.view_2d(a, 4, 2, 20, 0);
    EXPECT_TRUE(validate_node(&w).is_ok());
    w.nb[1] = 18;
    EXPECT_FALSE(validate_node(&w).is_ok());
}

namespace {

// A device of another kind, only so that its events can be handed to a CPU backend.
class OtherDevice : public Device {
  public:
    const char* name() const override { return "OTHER"; }
    std::string description() const override { return "test device"; }
    DeviceType type() const override { return DeviceType::ACCEL; }
    DeviceMemory memory() const override { return {}; }
    DeviceCaps caps() const override { return {}; }
    BufferType* buffer_type() override { return cpu::host_buffer_type(); }
    bool supports_op(const Tensor*) override { return false; }
    bool supports_buffer_type(const BufferType*) override { return false; }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& = {}) override {
        return Status::error("no backends");
    }
};

class OtherEvent : public Event {
  public:
    explicit OtherEvent(Device* d) : d_(d) {}
    Device* device() const override { return d_; }
    Status synchronize() override { return Status::ok(); }

  private:
    Device* d_;
};

}  // namespace

TEST(Core, CpuEventsAreImmediateAndOnlyTakeCpuEvents) {
    Device* cpu = cpu_device();
    ASSERT_TRUE(cpu->caps().events);
    Expected<std::unique_ptr<Event>> ev = cpu->make_event();
    ASSERT_TRUE(ev.has_value()) << ev.message();
    EXPECT_EQ((*ev)->device(), cpu);

    // Stream 1 computes a + b and records; stream 2 waits and computes (a + b) * b.
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {37, 3});
    Tensor* b = ctx.new_tensor(Type::F32, {37, 3});
    Tensor* sum = ctx.add(a, b);
    Tensor* prod = ctx.mul(sum, b);
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(ctx, cpu::host_buffer_type());
    ASSERT_TRUE(buf.has_value()) << buf.message();
    const std::vector<float> va = random_floats(37 * 3, 21), vb = random_floats(37 * 3, 22);
    ASSERT_TRUE(tensor_set(a, va.data(), va.size() * 4).is_ok());
    ASSERT_TRUE(tensor_set(b, vb.data(), vb.size() * 4).is_ok());
    std::unique_ptr<Backend> s1 = cpu::make_cpu_backend(2);
    std::unique_ptr<Backend> s2 = cpu::make_cpu_backend(1);
    Graph g1;
    g1.build_forward(sum);
    ASSERT_TRUE(s1->compute(g1).is_ok());
    Status st = s1->record_event(ev->get());
    ASSERT_TRUE(st.is_ok()) << st.message();
    ASSERT_TRUE((*ev)->synchronize().is_ok());
    std::vector<float> got(37 * 3);
    ASSERT_TRUE(tensor_get(sum, got.data(), got.size() * 4).is_ok());
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], va[i] + vb[i]) << i;
    st = s2->wait_event(ev->get());
    ASSERT_TRUE(st.is_ok()) << st.message();
    Graph g2;
    g2.nodes = {prod};
    ASSERT_TRUE(s2->compute(g2).is_ok());
    ASSERT_TRUE(tensor_get(prod, got.data(), got.size() * 4).is_ok());
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], (va[i] + vb[i]) * vb[i]) << i;

    // An event of another device is refused by both calls, naming both devices.
    OtherDevice other;
    OtherEvent foreign(&other);
    for (Status bad : {s1->record_event(&foreign), s1->wait_event(&foreign)}) {
        ASSERT_FALSE(bad.is_ok());
        EXPECT_NE(bad.message().find("OTHER"), std::string::npos) << bad.message();
        EXPECT_NE(bad.message().find("CPU"), std::string::npos) << bad.message();
    }
    EXPECT_FALSE(s1->record_event(nullptr).is_ok());
}

TEST(Core, CopyBytesCopiesEveryByteAtEveryRelativeAlignment) {
    // copy_bytes takes its own path for large copies whose destination is 1..63 bytes past
    // the source modulo 4 KiB (slow for glibc's memcpy on AMD Zen 3); every path must copy
    // exactly n bytes and touch nothing around them.
    std::mt19937 rng(7);
    std::vector<uint8_t> src(3 << 20);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> dst(3 << 20);
    for (size_t gap : {0u, 1u, 16u, 48u, 63u, 64u, 100u, 4095u}) {
        for (size_t n : {size_t{0}, size_t{100}, size_t{65535}, size_t{65536}, size_t{65536 + 37},
                         size_t{128256 * 4}}) {
            std::fill(dst.begin(), dst.end(), uint8_t{0xEE});
            const uint8_t* s = src.data() + 4096 - (reinterpret_cast<uintptr_t>(src.data()) & 4095);
            uint8_t* d = dst.data() + 8192 - (reinterpret_cast<uintptr_t>(dst.data()) & 4095) + gap;
            copy_bytes(d, s, n);
            ASSERT_EQ(std::memcmp(d, s, n), 0) << "gap " << gap << ", " << n << " bytes";
            ASSERT_EQ(d[-1], 0xEE) << "gap " << gap << ", " << n << " bytes";
            ASSERT_EQ(d[n], 0xEE) << "gap " << gap << ", " << n << " bytes";
        }
    }
}

// A buffer's reads and writes stay inside it: a range past its end (by its size, or by an
// offset that overflows), or a tensor placed in another buffer, is an error that names the
// tensor, the range and the buffer's size, and touches nothing.
TEST(Core, BufferRangesPastTheEndOrOfAnotherBufferAreErrors) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {64});
    Tensor* other = ctx.new_tensor(Type::F32, {64});
    std::strcpy(a->name, "a");
    std::strcpy(other->name, "other");
    Expected<std::unique_ptr<Buffer>> ab = cpu::host_buffer_type()->allocate(256);
    Expected<std::unique_ptr<Buffer>> ob = cpu::host_buffer_type()->allocate(256);
    ASSERT_TRUE(ab && ob);
    a->buffer = ab->get();
    a->data = (*ab)->base();
    other->buffer = ob->get();
    other->data = (*ob)->base();
    ASSERT_TRUE((*ab)->clear(0).is_ok());
    std::vector<uint8_t> bytes(16, 7);
    Buffer* b = ab->get();
    const Status past = b->set_tensor(a, bytes.data(), 248, 16);
    ASSERT_FALSE(past.is_ok());
    EXPECT_NE(past.message().find("tensor 'a': range [248, +16) past its buffer of 256 bytes"),
              std::string::npos)
        << past.message();
    EXPECT_FALSE(b->get_tensor(a, bytes.data(), 250, 8).is_ok());
    EXPECT_FALSE(b->memset_tensor(a, 1, SIZE_MAX - 4, 8).is_ok());  // offset + size overflows
    const Status foreign = b->set_tensor(other, bytes.data(), 0, 16);
    ASSERT_FALSE(foreign.is_ok());
    EXPECT_NE(foreign.message().find("tensor 'other' is not in this buffer"), std::string::npos)
        << foreign.message();
    const uint8_t* base = static_cast<const uint8_t*>(b->base());
    for (size_t i = 0; i < 256; i++) ASSERT_EQ(base[i], 0) << i;
    // The last bytes themselves are in range.
    EXPECT_TRUE(b->set_tensor(a, bytes.data(), 240, 16).is_ok());
}
