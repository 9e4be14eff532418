// The remote backend end to end: a real `ferry serve` process on a unix socket and on a tcp
// port of 127.0.0.1, clients in this process (and in forked children), real sockets.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "ferry/op-tests.h"
#include "ferry/remote.h"
#include "remote-proto/stripes.h"
#include "remote-proto/transport.h"
#include "shell.h"
#include "test_remote_util.h"

using namespace ferry;
using ferry::test::ServerProcess;

namespace {

struct Servers {
    std::string dir;
    ServerProcess unix_srv, tcp_srv;
};

Servers* g_servers = nullptr;

class RemoteEnv : public ::testing::Environment {
  public:
    void SetUp() override {
        g_servers = new Servers();
        g_servers->dir = ferry::test::make_temp_dir();
        std::string err;
        // The suite checks the served CPU; a build with more local devices (OPENVINO:CPU)
        // would serve those too by default.
        ASSERT_TRUE(
            g_servers->unix_srv.start("unix:" + g_servers->dir + "/s", {"--device", "CPU"}, &err))
            << err;
        ASSERT_TRUE(g_servers->tcp_srv.start("tcp:127.0.0.1:0", {"--device", "CPU"}, &err)) << err;
    }
    void TearDown() override {
        delete g_servers;
        g_servers = nullptr;
    }
};

[[maybe_unused]] auto* const g_env = ::testing::AddGlobalTestEnvironment(new RemoteEnv());

std::string addr_of(const std::string& transport) {
    return transport == "unix" ? g_servers->unix_srv.addr() : g_servers->tcp_srv.addr();
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) {
        x = d(rng);
        if (x == 0.0f) x = 0.25f;
    }
    return v;
}

// A test graph: builds tensors in ctx, names the input data, returns the output.
struct Inputs {
    std::vector<std::pair<Tensor*, std::vector<uint8_t>>> data;
    void f32(Tensor* t, uint32_t seed) {
        auto v = random_floats(static_cast<size_t>(t->nelements()), seed);
        std::vector<uint8_t> b(t->nbytes());
        std::memcpy(b.data(), v.data(), b.size());
        data.push_back({t, b});
    }
    void f16(Tensor* t, uint32_t seed) {
        auto v = random_floats(static_cast<size_t>(t->nelements()), seed);
        std::vector<uint8_t> b(t->nbytes());
        for (size_t i = 0; i < v.size(); i++) {
            const fp16_t h = fp32_to_fp16(v[i]);
            std::memcpy(b.data() + 2 * i, &h, 2);
        }
        data.push_back({t, b});
    }
    void quant(Tensor* t, uint32_t seed) {
        auto v = random_floats(static_cast<size_t>(t->nelements()), seed);
        std::vector<uint8_t> b(t->nbytes());
        EXPECT_TRUE(from_float_row(t->type, v.data(), b.data(), t->nelements()).is_ok());
        data.push_back({t, b});
    }
    void i32(Tensor* t, std::vector<int32_t> v) {
        std::vector<uint8_t> b(v.size() * 4);
        std::memcpy(b.data(), v.data(), b.size());
        data.push_back({t, b});
    }
};
using BuildFn = std::function<Tensor*(Context&, Inputs&)>;

struct GraphCase {
    const char* name;
    BuildFn build;
};

std::vector<GraphCase> graph_cases() {
    return {
        {"norm_chain",
         [](Context& c, Inputs& in) {
             Tensor* x = c.new_tensor(Type::F32, {64, 8});
             Tensor* y = c.new_tensor(Type::F32, {64, 1});
             in.f32(x, 1);
             in.f32(y, 2);
             return c.scale(c.rms_norm(c.mul(c.add(x, y), x), 1e-5f), 0.5f, 0.1f);
         }},
        {"q8_matmul_softmax",
         [](Context& c, Inputs& in) {
             Tensor* w = c.new_tensor(Type::Q8_0, {64, 16});
             Tensor* x = c.new_tensor(Type::F32, {64, 4});
             in.quant(w, 3);
             in.f32(x, 4);
             return c.soft_max(c.mul_mat(w, x), nullptr, 0.125f);
         }},
        {"q4_0_matmul_silu",
         [](Context& c, Inputs& in) {
             Tensor* w = c.new_tensor(Type::Q4_0, {64, 32});
             Tensor* x = c.new_tensor(Type::F32, {64, 3});
             in.quant(w, 5);
             in.f32(x, 6);
             return c.silu(c.mul_mat(w, x));
         }},
        {"get_rows_rope_permute_cpy",
         [](Context& c, Inputs& in) {
             Tensor* emb = c.new_tensor(Type::F32, {32, 10});
             Tensor* idx = c.new_tensor(Type::I32, {5});
             Tensor* pos = c.new_tensor(Type::I32, {5});
             Tensor* dst = c.new_tensor(Type::F16, {5, 32});
             in.f32(emb, 7);
             in.i32(idx, {3, 0, 9, 3, 4});
             in.i32(pos, {0, 1, 2, 3, 4});
             Tensor* r = c.get_rows(emb, idx);       // [32, 5]
             Tensor* r3 = c.reshape(r, {32, 1, 5});  // [32, 1 head, 5 tokens]
             Tensor* ro = c.rope(r3, pos, 32, kRopeNeox, 10000.0f, 1.0f);
             Tensor* t = c.cont(c.transpose(c.reshape(ro, {32, 5})));  // [5, 32]
             return c.cpy(t, dst);
         }},
        {"set_rows_then_get_rows",
         [](Context& c, Inputs& in) {
             Tensor* cache = c.new_tensor(Type::F16, {32, 16});
             Tensor* src = c.new_tensor(Type::F32, {32, 3});
             Tensor* idx = c.new_tensor(Type::I32, {3});
             Tensor* idx2 = c.new_tensor(Type::I32, {4});
             in.f16(cache, 8);
             in.f32(src, 9);
             in.i32(idx, {15, 2, 7});
             in.i32(idx2, {7, 0, 15, 2});
             return c.get_rows(c.set_rows(cache, src, idx), idx2);
         }},
        {"flash_attn_argmax",
         [](Context& c, Inputs& in) {
             Tensor* q = c.new_tensor(Type::F32, {32, 4, 2});
             Tensor* k = c.new_tensor(Type::F16, {32, 8, 1});
             Tensor* v = c.new_tensor(Type::F16, {32, 8, 1});
             Tensor* m = c.new_tensor(Type::F16, {8, 4});
             in.f32(q, 10);
             in.f16(k, 11);
             in.f16(v, 12);
             in.f16(m, 13);
             Tensor* a = c.flash_attn_ext(q, k, v, m, 0.17f);  // [32, 2, 4]
             return c.argmax(c.sum_rows(c.gelu(a)));
         }},
    };
}

// Builds and runs a case on `dev`; returns the output bytes.
struct RunResult {
    Status status;
    std::vector<uint8_t> out;
};

RunResult run_case(const GraphCase& gc, Device* dev, Backend* backend) {
    RunResult rr;
    Context ctx;
    Inputs in;
    Tensor* out = gc.build(ctx, in);
    out->flags |= kTensorOutput;
    Graph g;
    g.build_forward(out);
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(ctx, dev->buffer_type());
    if (!buf) {
        rr.status = buf.status();
        return rr;
    }
    for (auto& [t, bytes] : in.data) {
        rr.status = backend->set_tensor_async(t, bytes.data(), 0, bytes.size());
        if (!rr.status) return rr;
    }
    rr.status = backend->compute(g);
    if (!rr.status) return rr;
    rr.out.resize(out->nbytes());
    rr.status = backend->get_tensor_async(out, rr.out.data(), 0, rr.out.size());
    if (!rr.status) return rr;
    rr.status = backend->synchronize();
    return rr;
}

class Remote : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        auto r = remote_open(addr_of(GetParam()));
        ASSERT_TRUE(r) << r.message();
        reg_ = std::move(*r);
        ASSERT_EQ(reg_->devices().size(), 1u);
        dev_ = reg_->devices()[0];
    }
    std::unique_ptr<Registry> reg_;
    Device* dev_ = nullptr;
};

TEST_P(Remote, DeviceListing) {
    const std::string addr = addr_of(GetParam());
    EXPECT_EQ(std::string(dev_->name()), addr + "/CPU");
    EXPECT_EQ(dev_->type(), DeviceType::REMOTE);
    EXPECT_NE(dev_->description().find("CPU"), std::string::npos);
    const DeviceMemory m = dev_->memory();
    EXPECT_GT(m.total, 0u);
    EXPECT_LE(m.free, m.total);
    EXPECT_TRUE(dev_->supports_buffer_type(dev_->buffer_type()));
    EXPECT_FALSE(dev_->supports_buffer_type(cpu_device()->buffer_type()));

    // The global registration and `ferry devices --remote`.
    ASSERT_TRUE(remote_connect(addr).is_ok());
    ASSERT_TRUE(remote_connect(addr).is_ok());  // twice is a no-op
    ASSERT_NE(find_device(addr + "/CPU"), nullptr);
    int n = 0;
    for (Device* d : all_devices()) n += std::string(d->name()) == addr + "/CPU";
    EXPECT_EQ(n, 1);
    const ferry::testing::ShellResult r =
        ferry::testing::run_shell(std::string(FERRY_BIN) + " devices --remote " + addr);
    const std::string& text = r.out;
    EXPECT_EQ(r.rc, 0);
    EXPECT_NE(text.find(addr + "/CPU"), std::string::npos) << text;
    EXPECT_NE(text.find("REMOTE"), std::string::npos) << text;
}

TEST_P(Remote, SetGetRoundTrips) {
    auto buf = dev_->buffer_type()->allocate(1 << 20);
    ASSERT_TRUE(buf) << buf.message();
    Buffer* b = buf->get();
    EXPECT_EQ(b->size(), 1u << 20);
    // Unix: the buffer is shared memory mapped in this process; tcp: not addressable.
    if (GetParam() == "unix") {
        EXPECT_NE(b->base(), nullptr);
    } else {
        EXPECT_EQ(b->base(), nullptr);
    }
    Tensor t;
    t.type = Type::F32;
    t.ne[0] = 1000;
    set_contiguous_strides(&t);
    t.buffer = b;
    t.offs = 4096;
    auto data = random_bytes(4000, 42);
    ASSERT_TRUE(tensor_set(&t, data.data(), data.size()).is_ok());
    std::vector<uint8_t> back(4000);
    ASSERT_TRUE(tensor_get(&t, back.data(), back.size()).is_ok());
    EXPECT_EQ(back, data);
    // Partial ranges.
    std::vector<uint8_t> part(100);
    ASSERT_TRUE(b->get_tensor(&t, part.data(), 1000, 100).is_ok());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), data.begin() + 1000));
    ASSERT_TRUE(b->memset_tensor(&t, 0xAB, 10, 20).is_ok());
    ASSERT_TRUE(tensor_get(&t, back.data(), back.size()).is_ok());
    for (size_t i = 0; i < 4000; i++) {
        ASSERT_EQ(back[i], (i >= 10 && i < 30) ? 0xAB : data[i]) << i;
    }
    // Out-of-range ranges are refused on the client, naming the server, the tensor and sizes.
    std::strcpy(t.name, "t");
    Status st = b->set_tensor(&t, data.data(), (1 << 20) - 4096, 8);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("remote server " + addr_of(GetParam())), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("tensor 't': range [1044480, +8) past its buffer of 1048576"),
              std::string::npos)
        << st.message();
    // Copy between two buffers of the server.
    auto buf2 = dev_->buffer_type()->allocate(8192);
    ASSERT_TRUE(buf2);
    Tensor t2 = t;
    t2.buffer = buf2->get();
    t2.offs = 0;
    ASSERT_TRUE(buf2->get()->copy_tensor(&t, &t2));
    std::vector<uint8_t> copied(4000);
    ASSERT_TRUE(tensor_get(&t2, copied.data(), copied.size()).is_ok());
    EXPECT_EQ(copied, back);
    ASSERT_TRUE(buf2->get()->clear(7).is_ok());
    ASSERT_TRUE(tensor_get(&t2, copied.data(), copied.size()).is_ok());
    EXPECT_EQ(copied, std::vector<uint8_t>(4000, 7));
    // Async forms through a backend, then one synchronize.
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    auto d2 = random_bytes(4000, 43);
    std::vector<uint8_t> got(4000);
    ASSERT_TRUE((*be)->set_tensor_async(&t, d2.data(), 0, d2.size()).is_ok());
    ASSERT_TRUE((*be)->get_tensor_async(&t, got.data(), 0, got.size()).is_ok());
    ASSERT_TRUE((*be)->synchronize().is_ok());
    EXPECT_EQ(got, d2);
}

TEST_P(Remote, WeightsStayInServerMemory) {
    // Weights are allocated as server-private memory even where buffers are shared memory
    // (unix): written once through TENSOR_SET, read by the device only.
    auto buf = dev_->buffer_type()->allocate_for(3u << 20, BufferUsage::Weights);
    ASSERT_TRUE(buf) << buf.message();
    EXPECT_EQ((*buf)->base(), nullptr);
    EXPECT_EQ((*buf)->usage(), BufferUsage::Weights);
    Tensor t;
    t.type = Type::F32;
    t.ne[0] = (3 << 20) / 4;
    set_contiguous_strides(&t);
    t.buffer = buf->get();
    const auto data = random_bytes(3u << 20, 77);
    ASSERT_TRUE(tensor_set(&t, data.data(), data.size()).is_ok());
    std::vector<uint8_t> back(data.size());
    ASSERT_TRUE(tensor_get(&t, back.data(), back.size()).is_ok());
    EXPECT_TRUE(back == data);
    // Other buffers keep the transport's placement.
    auto any = dev_->buffer_type()->allocate(1u << 20);
    ASSERT_TRUE(any);
    EXPECT_EQ((*any)->base() != nullptr, GetParam() == "unix");
}

// Large reads of memory the client does not map (a GPU's, or server-private weights) come back
// through one shared staging buffer of the device where the transport has shared memory
// (unix): the server copies into it, the client out of it. Reads in flight at once must each
// get their own part of it, and it grows for a larger read.
TEST_P(Remote, LargeReadsOfUnmappedMemoryComeThroughSharedStaging) {
    const size_t n = 8u << 20;
    auto buf = dev_->buffer_type()->allocate_for(n, BufferUsage::Weights);
    ASSERT_TRUE(buf) << buf.message();
    ASSERT_EQ((*buf)->base(), nullptr);
    Tensor t;
    t.type = Type::I32;
    t.ne[0] = static_cast<int64_t>(n / 4);
    set_contiguous_strides(&t);
    t.buffer = buf->get();
    const auto data = random_bytes(n, 91);
    ASSERT_TRUE(tensor_set(&t, data.data(), n).is_ok());
    auto before = remote_stats(reg_.get());
    ASSERT_TRUE(before) << before.message();
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    // Six 700 KB reads posted at once (more than the first staging buffer of 1 MiB holds),
    // then a 3 MiB one (it grows), two small ones (plain replies), all before one wait.
    struct Read {
        size_t off, size;
        std::vector<uint8_t> got;
    };
    std::vector<Read> reads;
    for (size_t i = 0; i < 6; i++) reads.push_back({i * 700000 + 13, 700000, {}});
    reads.push_back({5u << 20, 3u << 20, {}});
    reads.push_back({100, 1000, {}});
    reads.push_back({n - 65536, 65536, {}});
    for (Read& r : reads) {
        r.got.assign(r.size, 0);
        ASSERT_TRUE((*be)->get_tensor_async(&t, r.got.data(), r.off, r.size).is_ok());
    }
    ASSERT_TRUE((*be)->synchronize().is_ok());
    for (const Read& r : reads) {
        EXPECT_TRUE(std::equal(r.got.begin(), r.got.end(), data.begin() + r.off))
            << "read of " << r.size << " bytes at " << r.off;
    }
    // Again, now that the staging buffer is large: same bytes.
    std::vector<uint8_t> all(n);
    ASSERT_TRUE(tensor_get(&t, all.data(), n).is_ok());
    EXPECT_TRUE(all == data);
    auto after = remote_stats(reg_.get());
    ASSERT_TRUE(after) << after.message();
    EXPECT_EQ(after->errors, before->errors);
    // One staging buffer on unix (the first, outgrown, was freed); none on tcp.
    EXPECT_EQ(after->session_buffers, before->session_buffers + (GetParam() == "unix" ? 1 : 0));

    // A decode step's shape: a posted write (still unanswered when the read is queued), a
    // read of 600 KB, one wait. Each step is one round trip, and on unix the read's bytes
    // cross in shared memory, not in replies.
    auto small = dev_->buffer_type()->allocate_for(4096, BufferUsage::Weights);  // unmapped
    ASSERT_TRUE(small);
    Tensor s = t;
    s.ne[0] = 16;
    set_contiguous_strides(&s);
    s.buffer = small->get();
    const int kSteps = 10;
    auto s0 = remote_stats(reg_.get());
    ASSERT_TRUE(s0) << s0.message();
    std::vector<uint8_t> got(600000);
    for (int i = 0; i < kSteps; i++) {
        const int32_t v[16] = {i};
        ASSERT_TRUE((*be)->set_tensor_async(&s, v, 0, sizeof(v)).is_ok());
        ASSERT_TRUE((*be)->get_tensor_async(&t, got.data(), 4096 * i, got.size()).is_ok());
        ASSERT_TRUE((*be)->synchronize().is_ok());
        ASSERT_TRUE(std::equal(got.begin(), got.end(), data.begin() + 4096 * i)) << i;
    }
    auto s1 = remote_stats(reg_.get());
    ASSERT_TRUE(s1) << s1.message();
    // The stats request between s0 and the loop is one more wait.
    EXPECT_EQ(s1->client_waits - s0->client_waits, static_cast<uint64_t>(kSteps) + 1);
    const uint64_t in = s1->client_bytes_in - s0->client_bytes_in;
    if (GetParam() == "unix") {
        EXPECT_LT(in, 1024u * kSteps);
    } else {
        EXPECT_GT(in, got.size() * kSteps);
    }
}

TEST_P(Remote, ReadsIntoTheDevicesHostMemoryAreCopiedThereByTheServer) {
    // A remote device's host_buffer_type() is the server's shared memory on unix (none on
    // tcp); a read whose destination lies in it is a copy on the server, with no payload in
    // the reply and no copy out of a staging buffer.
    BufferType* ht = dev_->host_buffer_type();
    if (GetParam() != "unix") {
        EXPECT_EQ(ht, nullptr);
        EXPECT_FALSE(dev_->caps().host_buffer);
        return;
    }
    ASSERT_NE(ht, nullptr);
    EXPECT_TRUE(ht->is_host());
    EXPECT_TRUE(dev_->caps().host_buffer);
    const size_t n = 4u << 20;
    auto src = dev_->buffer_type()->allocate_for(n, BufferUsage::Weights);
    ASSERT_TRUE(src) << src.message();
    ASSERT_EQ((*src)->base(), nullptr);
    Tensor t;
    t.type = Type::I32;
    t.ne[0] = static_cast<int64_t>(n / 4);
    set_contiguous_strides(&t);
    t.buffer = src->get();
    const auto data = random_bytes(n, 92);
    ASSERT_TRUE(tensor_set(&t, data.data(), n).is_ok());
    auto host = ht->allocate(1u << 20);
    ASSERT_TRUE(host) << host.message();
    uint8_t* base = static_cast<uint8_t*>((*host)->base());
    ASSERT_NE(base, nullptr);
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    auto s0 = remote_stats(reg_.get());
    ASSERT_TRUE(s0) << s0.message();
    const int kSteps = 10;
    for (int i = 0; i < kSteps; i++) {
        // A large read at an odd offset of the host buffer and a small one after it.
        const size_t off = 65536 * static_cast<size_t>(i) + 12;
        ASSERT_TRUE((*be)->get_tensor_async(&t, base + 100, off, 600000).is_ok());
        ASSERT_TRUE((*be)->get_tensor_async(&t, base + 700000, off + 3, 1000).is_ok());
        ASSERT_TRUE((*be)->synchronize().is_ok());
        ASSERT_TRUE(std::equal(base + 100, base + 100 + 600000, data.begin() + off)) << i;
        ASSERT_TRUE(std::equal(base + 700000, base + 701000, data.begin() + off + 3)) << i;
    }
    auto s1 = remote_stats(reg_.get());
    ASSERT_TRUE(s1) << s1.message();
    EXPECT_EQ(s1->errors, s0->errors);
    EXPECT_EQ(s1->client_waits - s0->client_waits, static_cast<uint64_t>(kSteps) + 1);
    EXPECT_LT(s1->client_bytes_in - s0->client_bytes_in, 1024u * kSteps);
    // No staging buffer was needed: the session holds the two buffers made here.
    EXPECT_EQ(s1->session_buffers, s0->session_buffers);
    // A destination outside it takes the other paths, and lands right too.
    std::vector<uint8_t> plain(70000);
    ASSERT_TRUE((*be)->get_tensor_async(&t, plain.data(), 0, plain.size()).is_ok());
    ASSERT_TRUE((*be)->synchronize().is_ok());
    EXPECT_TRUE(std::equal(plain.begin(), plain.end(), data.begin()));
}

TEST_P(Remote, LongPipelineOfSmallRequests) {
    // 6000 posted writes and reads of 1 KiB with no wait in between: the client holds small
    // requests and flushes them in batches, the server batches its replies, and neither side
    // may deadlock when both directions' socket buffers fill (the reads' replies alone are
    // 6 MiB on tcp). Every read must see the write posted just before it.
    constexpr size_t kChunk = 1024, kSlots = 2048, kOps = 6000;
    auto buf = dev_->buffer_type()->allocate(kChunk * kSlots);
    ASSERT_TRUE(buf) << buf.message();
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    std::vector<Tensor> slots(kSlots);
    for (size_t i = 0; i < kSlots; i++) {
        slots[i].type = Type::I32;
        slots[i].ne[0] = kChunk / 4;
        set_contiguous_strides(&slots[i]);
        slots[i].buffer = buf->get();
        slots[i].offs = i * kChunk;
    }
    std::vector<std::vector<uint8_t>> wrote(kOps), read(kOps, std::vector<uint8_t>(kChunk));
    for (size_t k = 0; k < kOps; k++) {
        wrote[k] = random_bytes(kChunk, static_cast<uint32_t>(1000 + k));
        Tensor* t = &slots[(k * 7) % kSlots];
        ASSERT_TRUE((*be)->set_tensor_async(t, wrote[k].data(), 0, kChunk).is_ok()) << k;
        ASSERT_TRUE((*be)->get_tensor_async(t, read[k].data(), 0, kChunk).is_ok()) << k;
    }
    ASSERT_TRUE((*be)->synchronize().is_ok());
    for (size_t k = 0; k < kOps; k++) ASSERT_EQ(read[k], wrote[k]) << "operation " << k;
}

TEST_P(Remote, LargeTransferIsChunked) {
    // 70 MiB crosses the 64 MiB chunk size of inline transfers.
    const size_t n = 70u << 20;
    auto buf = dev_->buffer_type()->allocate(n);
    ASSERT_TRUE(buf) << buf.message();
    Tensor t;
    t.type = Type::F32;
    t.ne[0] = static_cast<int64_t>(n / 4);
    set_contiguous_strides(&t);
    t.buffer = buf->get();
    auto data = random_bytes(n, 5);
    ASSERT_TRUE(tensor_set(&t, data.data(), n).is_ok());
    std::vector<uint8_t> back(n);
    ASSERT_TRUE(tensor_get(&t, back.data(), n).is_ok());
    EXPECT_TRUE(back == data);
}

TEST_P(Remote, GraphsBitIdenticalToLocalCpu) {
    auto local = cpu_device()->make_backend();
    ASSERT_TRUE(local);
    auto remote_be = dev_->make_backend();
    ASSERT_TRUE(remote_be);
    for (const GraphCase& gc : graph_cases()) {
        SCOPED_TRACE(gc.name);
        RunResult a = run_case(gc, cpu_device(), local->get());
        ASSERT_TRUE(a.status.is_ok()) << a.status.message();
        RunResult b = run_case(gc, dev_, remote_be->get());
        ASSERT_TRUE(b.status.is_ok()) << b.status.message();
        ASSERT_EQ(a.out.size(), b.out.size());
        EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size()), 0);
    }
}

TEST_P(Remote, EveryOpTestCaseMatchesTheLocalCpuBitForBit) {
    // The whole `ferry test-ops` suite through the server, in this one session: every case
    // passes against the float64 reference on the remote device, and (the server runs the
    // same CPU kernels) reads back exactly the bytes the local CPU computes.
    auto local = cpu_device()->make_backend();
    ASSERT_TRUE(local);
    auto remote_be = dev_->make_backend();
    ASSERT_TRUE(remote_be);
    const std::vector<ferry::testing::OpTestCase> cases = ferry::testing::make_op_tests();
    ASSERT_GT(cases.size(), 100u);
    for (const ferry::testing::OpTestCase& c : cases) {
        const ferry::testing::OpTestResult want = ferry::testing::run_op_test(c, local->get());
        const ferry::testing::OpTestResult got = ferry::testing::run_op_test(c, remote_be->get());
        EXPECT_TRUE(want.passed) << c.name << " on the local CPU: " << want.message;
        EXPECT_TRUE(got.passed) << c.name << " through " << addr_of(GetParam()) << ": "
                                << got.message;
        EXPECT_FALSE(got.output.empty()) << c.name;
        EXPECT_TRUE(got.output == want.output)
            << c.name << ": the server's bytes differ from the local CPU's (nmse " << got.nmse
            << " vs " << want.nmse << ")";
    }
}

TEST_P(Remote, GraphCacheAndDelta) {
    // A decode-like step repeated: same graph -> cache hit; a view that moves -> delta.
    Context ctx;
    Tensor* x = ctx.new_tensor(Type::F32, {64, 16});
    Tensor* y = ctx.new_tensor(Type::F32, {64, 1});
    auto buf = allocate_context_tensors(ctx, dev_->buffer_type());
    ASSERT_TRUE(buf);
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    auto xs = random_floats(64 * 16, 1);
    auto ys = random_floats(64, 2);
    ASSERT_TRUE(tensor_set(x, xs.data(), xs.size() * 4).is_ok());
    ASSERT_TRUE(tensor_set(y, ys.data(), ys.size() * 4).is_ok());
    auto s0 = remote_stats(reg_.get());
    ASSERT_TRUE(s0);
    for (int step = 0; step < 6; step++) {
        const int row = step / 2;  // the view moves every second step
        Context gctx;
        Tensor* v = gctx.view_1d(x, 64, static_cast<size_t>(row) * 64 * 4);
        Tensor* out = gctx.add(v, y);
        out->flags |= kTensorOutput;
        Graph g;
        g.build_forward(out);
        GraphAllocator alloc(dev_->buffer_type());
        ASSERT_TRUE(alloc.allocate(g).is_ok());
        ASSERT_TRUE((*be)->compute(g).is_ok());
        std::vector<float> got(64);
        ASSERT_TRUE((*be)->get_tensor_async(out, got.data(), 0, 256).is_ok());
        ASSERT_TRUE((*be)->synchronize().is_ok());
        for (int i = 0; i < 64; i++) ASSERT_EQ(got[i], xs[row * 64 + i] + ys[i]);
    }
    auto s1 = remote_stats(reg_.get());
    ASSERT_TRUE(s1);
    // Each step allocates a fresh intermediate buffer (a free clears the caches), so what is
    // counted here is that every graph went through the cache path without errors.
    EXPECT_EQ(s1->errors, s0->errors);
    EXPECT_GE(s1->graph_cache_misses + s1->graph_cache_hits,
              s0->graph_cache_misses + s0->graph_cache_hits + 6);

    // With one persistent allocator, identical steps hit the cache and a moved view is a delta.
    GraphAllocator alloc(dev_->buffer_type());
    auto s2 = remote_stats(reg_.get());
    ASSERT_TRUE(s2);
    std::vector<std::unique_ptr<Context>> keep;
    for (int step = 0; step < 6; step++) {
        const int row = step / 3;
        keep.push_back(std::make_unique<Context>());
        Context& gctx = *keep.back();
        Tensor* v = gctx.view_1d(x, 64, static_cast<size_t>(row) * 64 * 4);
        Tensor* out = gctx.add(v, y);
        out->flags |= kTensorOutput;
        Graph g;
        g.build_forward(out);
        ASSERT_TRUE(alloc.allocate(g).is_ok());
        ASSERT_TRUE((*be)->compute(g).is_ok());
        std::vector<float> got(64);
        ASSERT_TRUE((*be)->get_tensor_async(out, got.data(), 0, 256).is_ok());
        ASSERT_TRUE((*be)->synchronize().is_ok());
        for (int i = 0; i < 64; i++) ASSERT_EQ(got[i], xs[row * 64 + i] + ys[i]);
    }
    auto s3 = remote_stats(reg_.get());
    ASSERT_TRUE(s3);
    EXPECT_EQ(s3->errors, s2->errors);
    EXPECT_GE(s3->graph_cache_hits - s2->graph_cache_hits, 4u);  // steps 1, 2, 4, 5
    EXPECT_GE(s3->graph_delta_hits - s2->graph_delta_hits, 1u);  // step 3
}

TEST_P(Remote, SupportsOpAnsweredByServer) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {16, 4});
    Tensor* b = ctx.new_tensor(Type::F32, {16, 4});
    Tensor* s = ctx.add(a, b);
    EXPECT_EQ(dev_->supports_op(s), cpu_device()->supports_op(s));
    auto st0 = remote_stats(reg_.get());
    ASSERT_TRUE(st0);
    // Same signature (other sizes): answered from the client cache, no request.
    Tensor* a2 = ctx.new_tensor(Type::F32, {32, 8});
    Tensor* b2 = ctx.new_tensor(Type::F32, {32, 8});
    EXPECT_EQ(dev_->supports_op(ctx.add(a2, b2)), cpu_device()->supports_op(s));
    auto st1 = remote_stats(reg_.get());
    ASSERT_TRUE(st1);
    EXPECT_EQ(st1->requests, st0->requests + 1);  // only the stats request itself
    Tensor* v = ctx.view_2d(a, 8, 4, a->nb[1], 0);
    EXPECT_TRUE(dev_->supports_op(v));
}

TEST_P(Remote, SplitGraphUsesEarlierResultsWithoutRecomputing) {
    // A scheduler split hands the backend a graph of some nodes only; their sources computed
    // by an earlier split must be read from memory, not computed again.
    Context ctx;
    Tensor* x = ctx.new_tensor(Type::F32, {32, 2});
    Tensor* y = ctx.new_tensor(Type::F32, {32, 2});
    Tensor* a = ctx.add(x, y);
    Tensor* b = ctx.mul(a, y);
    auto buf = allocate_context_tensors(ctx, dev_->buffer_type());
    ASSERT_TRUE(buf);
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    auto xs = random_floats(64, 3), ys = random_floats(64, 4), as = random_floats(64, 5);
    ASSERT_TRUE(tensor_set(x, xs.data(), 256).is_ok());
    ASSERT_TRUE(tensor_set(y, ys.data(), 256).is_ok());
    Graph first;
    first.nodes = {a};
    ASSERT_TRUE((*be)->compute(first).is_ok());
    ASSERT_TRUE((*be)->synchronize().is_ok());
    ASSERT_TRUE(tensor_set(a, as.data(), 256).is_ok());  // overwrite the first split's result
    Graph second;
    second.nodes = {b};
    ASSERT_TRUE((*be)->compute(second).is_ok());
    std::vector<float> got(64);
    ASSERT_TRUE((*be)->get_tensor_async(b, got.data(), 0, 256).is_ok());
    ASSERT_TRUE((*be)->synchronize().is_ok());
    for (int i = 0; i < 64; i++) ASSERT_EQ(got[i], as[i] * ys[i]) << i;
}

TEST_P(Remote, AsyncErrorSurfacesAtTheNextWait) {
    // A pipelined compute that fails on the server (an out-of-range GET_ROWS index, caught by
    // the kernel) returns at once; the error comes back from synchronize(), naming the
    // server, and the connection carries on.
    Context ctx;
    Tensor* src = ctx.new_tensor(Type::F32, {8, 4});
    Tensor* idx = ctx.new_tensor(Type::I32, {2});
    Tensor* rows = ctx.get_rows(src, idx);
    auto buf = allocate_context_tensors(ctx, dev_->buffer_type());
    ASSERT_TRUE(buf);
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    auto data = random_floats(32, 9);
    ASSERT_TRUE(tensor_set(src, data.data(), 128).is_ok());
    Graph g;
    g.build_forward(rows);
    const int32_t bad[2] = {1, 99};
    ASSERT_TRUE(tensor_set(idx, bad, 8).is_ok());
    ASSERT_TRUE((*be)->compute(g).is_ok());
    Status err = (*be)->synchronize();
    ASSERT_FALSE(err.is_ok());
    EXPECT_NE(err.message().find(addr_of(GetParam())), std::string::npos) << err.message();
    const int32_t good[2] = {3, 0};
    ASSERT_TRUE(tensor_set(idx, good, 8).is_ok());
    ASSERT_TRUE((*be)->compute(g).is_ok());
    std::vector<float> got(16);
    ASSERT_TRUE((*be)->get_tensor_async(rows, got.data(), 0, 64).is_ok());
    ASSERT_TRUE((*be)->synchronize().is_ok());
    for (int i = 0; i < 8; i++) {
        EXPECT_EQ(got[i], data[24 + i]);
        EXPECT_EQ(got[8 + i], data[i]);
    }
}

TEST_P(Remote, ComputeAheadSendsTheHeldStepBeforeItsCompare) {
    // A decode step as Scheduler::get_tensor_then drives it: the compute and the read of its
    // result are held to go out in one send; compute_ahead then compares the graph with the
    // one computed last (every tensor's image: microseconds for a 1B model) while the server
    // computes, so the step must be on its way before that compare, not at the wait after it.
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {256});
    Tensor* b = ctx.new_tensor(Type::F32, {256});
    Tensor* out = ctx.add(a, b);
    out->flags |= kTensorOutput;
    Graph g;
    g.build_forward(out);
    auto buf = allocate_context_tensors(ctx, dev_->buffer_type(), BufferUsage::Weights);
    ASSERT_TRUE(buf) << buf.message();
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    std::vector<float> got(256);
    for (int step = 0; step < 3; step++) {
        auto xa = random_floats(256, 80 + step), xb = random_floats(256, 90 + step);
        ASSERT_TRUE((*be)->set_tensor_async(a, xa.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->set_tensor_async(b, xb.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->compute(g).is_ok());
        ASSERT_TRUE((*be)->get_tensor_async(out, got.data(), 0, 1024).is_ok());
        // (client_sends is read before the stats request's own send.)
        auto s0 = remote_stats(reg_.get());
        ASSERT_TRUE(s0);
        ASSERT_TRUE((*be)->synchronize().is_ok());
        if (step > 0) {
            auto xa2 = random_floats(256, 180 + step), xb2 = random_floats(256, 190 + step);
            ASSERT_TRUE((*be)->set_tensor_async(a, xa2.data(), 0, 1024).is_ok());
            ASSERT_TRUE((*be)->set_tensor_async(b, xb2.data(), 0, 1024).is_ok());
            ASSERT_TRUE((*be)->compute(g).is_ok());
            ASSERT_TRUE((*be)->get_tensor_async(out, got.data(), 0, 1024).is_ok());
            Expected<bool> q = (*be)->compute_ahead(g);
            ASSERT_TRUE(q) << q.message();
            EXPECT_TRUE(*q) << "the graph is the one computed last";
            auto s1 = remote_stats(reg_.get());
            ASSERT_TRUE(s1);
            // s0's request, then this step's compute and read, sent by compute_ahead.
            EXPECT_EQ(s1->client_sends - s0->client_sends, 2u) << "step " << step;
            EXPECT_EQ(s1->client_waits - s0->client_waits, 1u) << "step " << step;
            ASSERT_TRUE((*be)->settle_ahead().is_ok());
            for (int i = 0; i < 256; i++) ASSERT_EQ(got[i], xa2[i] + xb2[i]) << step << " " << i;
        }
    }
}

TEST_P(Remote, SmallInputWritesTravelInTheComputeFrame) {
    // Inputs in memory the client does not map (server-private here, a GPU's on a CUDA
    // server): a step's small writes travel inside its GRAPH_COMPUTE frame, so the server
    // handles two requests per step (the compute and the read of the result) instead of one
    // more per input, and each step computes with the inputs written just before it.
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::F32, {256});
    Tensor* b = ctx.new_tensor(Type::F32, {256});
    Tensor* c = ctx.new_tensor(Type::F32, {256});
    Tensor* sum = ctx.add(a, b);
    Tensor* out = ctx.add(sum, c);
    out->flags |= kTensorOutput;
    Graph g;
    g.build_forward(out);
    auto buf = allocate_context_tensors(ctx, dev_->buffer_type(), BufferUsage::Weights);
    ASSERT_TRUE(buf) << buf.message();
    ASSERT_EQ((*buf)->base(), nullptr) << "the inputs must be in memory the client cannot map";
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    auto s0 = remote_stats(reg_.get());
    ASSERT_TRUE(s0);
    constexpr int kSteps = 5;
    for (int step = 0; step < kSteps; step++) {
        auto xa = random_floats(256, 40 + step), xb = random_floats(256, 50 + step),
             xc = random_floats(256, 60 + step);
        ASSERT_TRUE((*be)->set_tensor_async(a, xa.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->set_tensor_async(b, xb.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->set_tensor_async(c, xc.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->compute(g).is_ok());
        std::vector<float> got(256);
        ASSERT_TRUE((*be)->get_tensor_async(out, got.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->synchronize().is_ok());
        for (int i = 0; i < 256; i++) {
            const float ab = xa[i] + xb[i];
            ASSERT_EQ(got[i], ab + xc[i]) << step << " " << i;
        }
    }
    auto s1 = remote_stats(reg_.get());
    ASSERT_TRUE(s1);
    EXPECT_EQ(s1->errors, s0->errors);
    // Per step: GRAPH_COMPUTE and the read; plus the stats request itself.
    EXPECT_EQ(s1->requests - s0->requests, 2u * kSteps + 1);
    // And one send per step: the compute is held until the read joins it (and the stats
    // request before s1 was taken is one more).
    EXPECT_EQ(s1->client_sends - s0->client_sends, 1u * kSteps + 1);
    EXPECT_EQ(s1->client_waits - s0->client_waits, 1u * kSteps + 1);

    // A held input followed by a request that is not a compute goes out first, in order: the
    // read sees the bytes just written.
    auto xa = random_floats(256, 70);
    ASSERT_TRUE((*be)->set_tensor_async(a, xa.data(), 0, 1024).is_ok());
    std::vector<float> back(256);
    ASSERT_TRUE((*be)->get_tensor_async(a, back.data(), 0, 1024).is_ok());
    ASSERT_TRUE((*be)->synchronize().is_ok());
    EXPECT_EQ(back, xa);
    // And one that is only waited for reaches the server too.
    auto xb = random_floats(256, 71);
    ASSERT_TRUE((*be)->set_tensor_async(b, xb.data(), 0, 1024).is_ok());
    ASSERT_TRUE((*be)->synchronize().is_ok());
    ASSERT_TRUE((*buf)->get_tensor(b, back.data(), 0, 1024).is_ok());
    EXPECT_EQ(back, xb);
}

TEST_P(Remote, AHeldComputeRunsOnTheInputsWrittenBeforeIt) {
    // The client holds a compute until its next request or wait. A write after it, of an
    // input the compute reads, must not reach the compute: in shared memory (unix) the write
    // waits for the compute first; as a request (tcp) it goes after the compute's frame.
    Context ctx;
    Tensor* x = ctx.new_tensor(Type::F32, {256});
    Tensor* y = ctx.add(x, x);
    y->flags |= kTensorOutput;
    Graph g;
    g.build_forward(y);
    auto buf = allocate_context_tensors(ctx, dev_->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    for (int step = 0; step < 3; step++) {
        std::vector<float> first(256, 1.0f + static_cast<float>(step)), second(256, 100.0f);
        ASSERT_TRUE((*be)->set_tensor_async(x, first.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->compute(g).is_ok());
        ASSERT_TRUE((*be)->set_tensor_async(x, second.data(), 0, 1024).is_ok());
        std::vector<float> got(256), back(256);
        ASSERT_TRUE((*be)->get_tensor_async(y, got.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->get_tensor_async(x, back.data(), 0, 1024).is_ok());
        ASSERT_TRUE((*be)->synchronize().is_ok());
        for (int i = 0; i < 256; i++) {
            ASSERT_EQ(got[i], 2 * first[i]) << step << " " << i;
            ASSERT_EQ(back[i], 100.0f) << step << " " << i;
        }
    }
}

TEST_P(Remote, EventsOrderWorkAcrossBackendsOfTheDevice) {
    // The server's CPU device has (trivial) events, so the remote device reports them.
    ASSERT_TRUE(dev_->caps().events);
    Context ctx;
    Tensor* x = ctx.new_tensor(Type::F32, {64, 4});
    Tensor* y = ctx.new_tensor(Type::F32, {64, 4});
    Tensor* sum = ctx.add(x, y);
    Tensor* prod = ctx.mul(sum, y);
    auto buf = allocate_context_tensors(ctx, dev_->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    auto be1 = dev_->make_backend();
    auto be2 = dev_->make_backend();
    ASSERT_TRUE(be1 && be2);
    auto s0 = remote_stats(reg_.get());
    ASSERT_TRUE(s0);
    auto ev = dev_->make_event();
    ASSERT_TRUE(ev) << ev.message();
    EXPECT_EQ((*ev)->device(), dev_);

    Graph first;
    first.build_forward(sum);
    Graph second;
    second.nodes = {prod};  // reads sum, computed by the first backend
    auto xs = random_floats(256, 31), ys = random_floats(256, 32);
    // Backend 1 computes and records; the client waits for the event, then reads.
    ASSERT_TRUE((*be1)->set_tensor_async(x, xs.data(), 0, 1024).is_ok());
    ASSERT_TRUE((*be1)->set_tensor_async(y, ys.data(), 0, 1024).is_ok());
    ASSERT_TRUE((*be1)->compute(first).is_ok());
    Status st = (*be1)->record_event(ev->get());
    ASSERT_TRUE(st.is_ok()) << st.message();
    st = (*ev)->synchronize();
    ASSERT_TRUE(st.is_ok()) << st.message();
    std::vector<float> got(256);
    ASSERT_TRUE(tensor_get(sum, got.data(), 1024).is_ok());
    for (int i = 0; i < 256; i++) ASSERT_EQ(got[i], xs[i] + ys[i]) << i;
    // Backend 2 waits on the event (on the server) and computes from the first result.
    st = (*be2)->wait_event(ev->get());
    ASSERT_TRUE(st.is_ok()) << st.message();
    ASSERT_TRUE((*be2)->compute(second).is_ok());
    ASSERT_TRUE((*be2)->get_tensor_async(prod, got.data(), 0, 1024).is_ok());
    ASSERT_TRUE((*be2)->synchronize().is_ok());
    for (int i = 0; i < 256; i++) ASSERT_EQ(got[i], (xs[i] + ys[i]) * ys[i]) << i;

    // Fully pipelined: new inputs, compute, record, wait, dependent compute, read; one wait.
    xs = random_floats(256, 33);
    ASSERT_TRUE((*be1)->set_tensor_async(x, xs.data(), 0, 1024).is_ok());
    ASSERT_TRUE((*be1)->compute(first).is_ok());
    ASSERT_TRUE((*be1)->record_event(ev->get()).is_ok());
    ASSERT_TRUE((*be2)->wait_event(ev->get()).is_ok());
    ASSERT_TRUE((*be2)->compute(second).is_ok());
    ASSERT_TRUE((*be2)->get_tensor_async(prod, got.data(), 0, 1024).is_ok());
    ASSERT_TRUE((*be2)->synchronize().is_ok());
    for (int i = 0; i < 256; i++) ASSERT_EQ(got[i], (xs[i] + ys[i]) * ys[i]) << i;
    ASSERT_TRUE((*ev)->synchronize().is_ok());

    // Every event request was accepted by the server.
    auto s1 = remote_stats(reg_.get());
    ASSERT_TRUE(s1);
    EXPECT_EQ(s1->errors, s0->errors);
}

TEST_P(Remote, ForeignEventsAreRefusedOrWaitedOnTheHost) {
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    // A local CPU event cannot be recorded on a remote stream.
    auto local = cpu_device()->make_event();
    ASSERT_TRUE(local) << local.message();
    Status st = (*be)->record_event(local->get());
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find(dev_->name()), std::string::npos) << st.message();
    EXPECT_FALSE((*be)->record_event(nullptr).is_ok());
    // Waiting on it is a host wait (a CPU event has always passed).
    st = (*be)->wait_event(local->get());
    EXPECT_TRUE(st.is_ok()) << st.message();
    // An event of the same server's device through another session: not this device.
    auto reg2 = remote_open(addr_of(GetParam()));
    ASSERT_TRUE(reg2) << reg2.message();
    auto ev2 = (*reg2)->devices()[0]->make_event();
    ASSERT_TRUE(ev2) << ev2.message();
    EXPECT_FALSE((*be)->record_event(ev2->get()).is_ok());
    st = (*be)->wait_event(ev2->get());  // host wait through the other session
    EXPECT_TRUE(st.is_ok()) << st.message();
    // Nothing of that reached the server as an error.
    ASSERT_TRUE((*be)->synchronize().is_ok());
}

TEST_P(Remote, EventsAreFreedOnTheServer) {
    // The server keeps at most 4096 live events per session: 5000 made and dropped in turn
    // only work if the client's EVENT_FREE reaches the server.
    auto s0 = remote_stats(reg_.get());
    ASSERT_TRUE(s0);
    for (int i = 0; i < 5000; i++) {
        auto ev = dev_->make_event();
        ASSERT_TRUE(ev) << i << ": " << ev.message();
    }
    // Several alive at once, each usable.
    std::vector<std::unique_ptr<Event>> live;
    auto be = dev_->make_backend();
    ASSERT_TRUE(be);
    for (int i = 0; i < 16; i++) {
        auto ev = dev_->make_event();
        ASSERT_TRUE(ev) << ev.message();
        ASSERT_TRUE((*be)->record_event(ev->get()).is_ok());
        live.push_back(std::move(*ev));
    }
    for (auto& ev : live) ASSERT_TRUE(ev->synchronize().is_ok());
    live.clear();
    auto s1 = remote_stats(reg_.get());
    ASSERT_TRUE(s1);
    EXPECT_EQ(s1->errors, s0->errors);
}

INSTANTIATE_TEST_SUITE_P(Transports, Remote, ::testing::Values("unix", "tcp"));

// Four clients at once get bit-identical results; afterwards the server's memory is back.
TEST(RemoteSocket, ASpinningReceiveGetsDataThatComesDuringOrAfterItsSpin) {
    // A client's receive polls for kClientSpinNs before it blocks (on hosts with cores to
    // spare): data that arrives while it spins, after it has gone to sleep, or an orderly
    // close, all come through as with a plain blocking receive.
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    remote::Socket a(fds[0]), b(fds[1]);
    a.set_spin_ns(5'000'000);  // 5 ms
    for (int delay_ms : {0, 1, 30}) {
        std::thread writer([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
            const uint32_t v = 0xC0FFEE00u + static_cast<uint32_t>(delay_ms);
            ASSERT_TRUE(b.send_all(&v, sizeof(v), nullptr, 0).is_ok());
        });
        uint32_t got = 0;
        Status st = a.recv_exact(&got, sizeof(got), nullptr);
        writer.join();
        ASSERT_TRUE(st.is_ok()) << st.message();
        EXPECT_EQ(got, 0xC0FFEE00u + static_cast<uint32_t>(delay_ms));
    }
    b.close();
    uint32_t none = 0;
    bool eof = false;
    EXPECT_FALSE(a.recv_exact(&none, sizeof(none), nullptr, &eof).is_ok());
    EXPECT_TRUE(eof);
}

TEST(RemoteSocket, ASpinningSendThroughAFullBufferDeliversEverything) {
    // A spinning socket retries a full send buffer without sleeping for its spin, then waits
    // as before (poll under a frame timeout, a blocking send without): 8 MiB (many buffers'
    // worth) arrive whole and in order whether the reader drains at once, after 1 ms (within
    // the spin) or after 30 ms (past it), with and without a frame timeout.
    for (int frame_ms : {0, 2000}) {
        int fds[2];
        ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
        remote::Socket a(fds[0]), b(fds[1]);
        a.set_spin_ns(5'000'000);  // 5 ms
        a.set_frame_timeout(frame_ms);
        std::vector<uint32_t> data(2u << 20);
        for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<uint32_t>(i * 2654435761u);
        for (int delay_ms : {0, 1, 30}) {
            SCOPED_TRACE(std::to_string(frame_ms) + " ms frames, reader after " +
                         std::to_string(delay_ms) + " ms");
            std::vector<uint32_t> got(data.size());
            Status rst = Status::ok();
            std::thread reader([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
                rst = b.recv_exact(got.data(), got.size() * 4, nullptr);
            });
            const Status st = a.send_all(data.data(), data.size() * 4, nullptr, 0);
            reader.join();
            ASSERT_TRUE(st.is_ok()) << st.message();
            ASSERT_TRUE(rst.is_ok()) << rst.message();
            EXPECT_EQ(std::memcmp(got.data(), data.data(), data.size() * 4), 0);
        }
    }
}

TEST(RemoteSocket, ScatteredReadsTakeTheBufferThenReceiveInPlace) {
    // BufferedReader::read_parts (a striped reply's chunks on the client's own connection):
    // a read that buffered part of what follows hands that part over first, and the rest
    // arrives straight into the pieces, whole and in order, whether it is there at once or
    // trickles in (many receives) and with empty pieces among them; Socket::recv_exact_parts
    // (the lanes' chunks) the same; a peer that closes midway is an error, not a hang.
    const std::vector<uint8_t> data = random_bytes(300000, 91);
    for (const int trickle : {0, 1}) {
        SCOPED_TRACE(trickle ? "in 4 KiB sends, 1 ms apart" : "all at once");
        int fds[2];
        ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
        remote::Socket a(fds[0]), b(fds[1]);
        std::thread writer([&] {
            const size_t step = trickle ? 4096 : data.size();
            for (size_t at = 0; at < data.size(); at += step) {
                const size_t n = std::min(step, data.size() - at);
                ASSERT_TRUE(b.send_all(data.data() + at, n, nullptr, 0).is_ok());
                if (trickle) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        });
        remote::BufferedReader in(a);
        uint8_t head[100];
        ASSERT_TRUE(in.read(head, sizeof(head), false, nullptr, nullptr).is_ok());
        // Pieces out of order in the destination, one empty, sizes around the buffer's.
        std::vector<uint8_t> got(data.size() - sizeof(head) - 50000);
        const size_t cut[] = {70000, 70000, 0, 30000, got.size() - 170000};
        const size_t where[] = {100000, 0, 5, 70000, 170000};
        iovec parts[5];
        for (int i = 0; i < 5; i++) parts[i] = iovec{got.data() + where[i], cut[i]};
        ASSERT_TRUE(in.read_parts(parts, 5).is_ok());
        EXPECT_EQ(std::memcmp(head, data.data(), sizeof(head)), 0);
        size_t at = sizeof(head);
        for (int i = 0; i < 5; i++) {
            EXPECT_EQ(std::memcmp(got.data() + where[i], data.data() + at, cut[i]), 0) << i;
            at += cut[i];
        }
        // The last 50,000 bytes in two pieces through the socket itself.
        std::vector<uint8_t> tail(50000);
        const iovec two[2] = {{tail.data() + 20000, 30000}, {tail.data(), 20000}};
        ASSERT_FALSE(in.buffered());
        ASSERT_TRUE(a.recv_exact_parts(two, 2).is_ok());
        writer.join();
        EXPECT_EQ(std::memcmp(tail.data() + 20000, data.data() + at, 30000), 0);
        EXPECT_EQ(std::memcmp(tail.data(), data.data() + at + 30000, 20000), 0);
        // A peer that closes before the pieces are full.
        ASSERT_TRUE(b.send_all(data.data(), 10, nullptr, 0).is_ok());
        b.close();
        const iovec more[1] = {{tail.data(), 20}};
        EXPECT_FALSE(in.read_parts(more, 1).is_ok());
    }
}

// Striped replies over tcp: with FERRY_REMOTE_STRIPES=N the client joins N - 1 more
// connections to its session, and every read of kStripeMin bytes or more comes back split
// over all of them (the server's lanes and the client's moving them at once). Reads of every
// size around the stripe boundaries arrive whole, in order, and through the stripes; smaller
// reads and unix sockets stay on one connection; N = 1 asks for none.
TEST(RemoteStripes, LargeReadsOverTcpComeBackWholeOverEveryStripe) {
    const std::vector<uint8_t> data = random_bytes((3u << 20) + 12344, 77);
    for (int n : {1, 2, 4, 8}) {
        SCOPED_TRACE(std::to_string(n) + " stripes");
        setenv("FERRY_REMOTE_STRIPES", std::to_string(n).c_str(), 1);
        auto reg = remote_open(addr_of("tcp"));
        unsetenv("FERRY_REMOTE_STRIPES");
        ASSERT_TRUE(reg) << reg.message();
        Device* dev = (*reg)->devices()[0];
        Context ctx;
        Tensor* t = ctx.new_tensor(Type::F32, {static_cast<int64_t>(data.size() / 4)});
        auto buf = allocate_context_tensors(ctx, dev->buffer_type());
        ASSERT_TRUE(buf) << buf.message();
        ASSERT_TRUE(tensor_set(t, data.data(), data.size()));
        const uint64_t k = remote::kStripeMin;
        // (offset, size): the whole tensor, the threshold, one byte under it (one connection),
        // odd sizes and offsets, sizes whose stripes are not whole pages.
        const std::pair<size_t, size_t> reads[] = {
            {0, data.size()}, {0, k},         {1, k - 1},          {7, k + 1},
            {4095, 1u << 20}, {3, 3 * k + 5}, {100, 8 * 4096 + 3}, {0, data.size() - 1}};
        uint64_t striped = 0;
        for (const auto& [off, size] : reads) {
            std::vector<uint8_t> got(size, 0xEE);
            ASSERT_TRUE(t->buffer->get_tensor(t, got.data(), off, size).is_ok());
            EXPECT_EQ(std::memcmp(got.data(), data.data() + off, size), 0)
                << "offset " << off << " size " << size;
            striped += size >= k && n > 1;
        }
        auto st = remote_stats(reg->get());
        ASSERT_TRUE(st) << st.message();
        EXPECT_EQ(st->client_stripes, static_cast<uint32_t>(n));
        EXPECT_EQ(st->client_striped_replies, striped);
        EXPECT_EQ(st->errors, 0u);
    }
    // Unix sockets never stripe (their reads of shared memory do not cross the socket).
    setenv("FERRY_REMOTE_STRIPES", "4", 1);
    auto ureg = remote_open(addr_of("unix"));
    unsetenv("FERRY_REMOTE_STRIPES");
    ASSERT_TRUE(ureg) << ureg.message();
    auto us = remote_stats(ureg->get());
    ASSERT_TRUE(us);
    EXPECT_EQ(us->client_stripes, 1u);
}

// The striped layout (remote::stripe_parts): chunks of whole pages, at least 32 KiB, chunk j on
// stripe j % n; every byte of a payload on exactly one stripe, each stripe's parts in order and
// at most kStripeChunksEach + 1 of them; the parts of a range are the parts of the whole cut to
// it (what a progressive send relies on), and stripe_next finds a stripe's next byte.
TEST(RemoteStripes, InterleavedChunksCoverEveryByteOnce) {
    for (uint64_t len : {uint64_t{256} << 10, uint64_t{513024}, (uint64_t{1} << 20) + 4321,
                         (uint64_t{64} << 20) + 7}) {
        for (int n = 1; n <= remote::kMaxStripes; n++) {
            SCOPED_TRACE(std::to_string(len) + " bytes over " + std::to_string(n));
            const uint64_t c = remote::stripe_chunk(len, n);
            EXPECT_EQ(c % 4096, 0u);
            EXPECT_GE(c, remote::kStripeChunkMin);
            std::vector<uint8_t> seen(len, 0);
            for (int i = 0; i < n; i++) {
                uint64_t at = 0, parts = 0;
                remote::stripe_parts(len, n, i, 0, len, [&](uint64_t off, uint64_t size) {
                    EXPECT_GE(off, at);
                    EXPECT_GT(size, 0u);
                    if (n > 1) {
                        EXPECT_EQ((off / c) % static_cast<uint64_t>(n), static_cast<uint64_t>(i));
                        EXPECT_EQ(off / c, (off + size - 1) / c);  // within one chunk
                    }
                    for (uint64_t b = off; b < off + size; b++) seen[b]++;
                    at = off + size;
                    parts++;
                });
                EXPECT_LE(parts, remote::kStripeChunksEach + 1);
                // Cut at two odd places: the same bytes.
                const uint64_t a = len / 3 + 17, b = len - len / 5 - 5;
                uint64_t whole = 0, cut = 0;
                remote::stripe_parts(len, n, i, 0, len, [&](uint64_t, uint64_t s) { whole += s; });
                for (const std::pair<uint64_t, uint64_t>& r :
                     {std::pair{uint64_t{0}, a}, {a, b}, {b, len}}) {
                    const uint64_t f = r.first, t = r.second;  // (clang: no captured bindings)
                    remote::stripe_parts(len, n, i, f, t, [&](uint64_t off, uint64_t s) {
                        EXPECT_GE(off, f);
                        EXPECT_LE(off + s, t);
                        cut += s;
                    });
                }
                EXPECT_EQ(cut, whole);
                // The next byte of stripe i from a: a itself when stripe i carries it.
                const uint64_t nx = remote::stripe_next(len, n, i, a);
                EXPECT_GE(nx, a);
                if (nx < len && n > 1) {
                    EXPECT_EQ((nx / c) % static_cast<uint64_t>(n), static_cast<uint64_t>(i));
                    EXPECT_TRUE(nx == a || nx % c == 0);
                }
                EXPECT_EQ(remote::stripe_next(len, n, i, len), len);
            }
            EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<std::ptrdiff_t>(len));
        }
    }
}

// A progressive striped send (the server's reply to a read whose bytes a GPU still produces:
// StripeLanes::start with `ready` < len, then advance) of `data` over `lanes` lanes (socket
// pairs) and the caller's own connection, `piece` bytes at a time: each lane sends only bytes
// in place. The sender's buffer holds 0xEE past what it has said is ready and gets the real
// bytes just before each advance, so a lane that ran ahead would deliver 0xEE; the receiving
// lanes and the caller's own connection must get every byte. The lanes end (and join their
// threads) before this returns.
void progressive_transfer(const std::vector<uint8_t>& data, int lanes, uint64_t piece) {
    const uint64_t len = data.size();
    remote::StripeLanes send(remote::StripeLanes::Dir::Send, 1000000, 20000000, 0);
    remote::StripeLanes recv(remote::StripeLanes::Dir::Receive, 1000000, 20000000, 0);
    int own[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, own), 0);
    remote::Socket own_send(own[0]), own_recv(own[1]);
    for (int i = 0; i < lanes; i++) {
        int sv[2];
        ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        ASSERT_TRUE(send.add(remote::Socket(sv[0])));
        ASSERT_TRUE(recv.add(remote::Socket(sv[1])));
    }
    const int n = lanes + 1;
    std::vector<uint8_t> out(len, 0xEE), got(len, 0x11);
    Status rst;
    std::thread reader([&] {
        recv.start(got.data(), len);
        remote::stripe_parts(len, n, 0, 0, len, [&](uint64_t off, uint64_t size) {
            if (rst) rst = own_recv.recv_exact(got.data() + off, size, nullptr);
        });
        const Status f = recv.finish();
        if (rst) rst = f;
    });
    uint64_t ready = 0;
    send.start(out.data(), len, ready);
    Status st;
    while (ready < len && st) {
        const uint64_t next = std::min<uint64_t>(len, ready + piece);
        std::memcpy(out.data() + ready, data.data() + ready, next - ready);
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        const uint64_t prev = ready;
        ready = next;
        send.advance(ready);
        st = remote::send_stripe(own_send, out.data(), len, n, 0, prev, ready);
    }
    const Status f = send.finish();
    reader.join();
    ASSERT_TRUE(st) << st.message();
    ASSERT_TRUE(f) << f.message();
    ASSERT_TRUE(rst) << rst.message();
    EXPECT_EQ(std::memcmp(got.data(), data.data(), len), 0);
}

// progressive_transfer over 1, 2 and 4 lanes, in pieces that do not fall on chunk bounds.
TEST(RemoteStripes, ProgressiveSendsOnlyWhatIsReady) {
    const std::vector<uint8_t> data = random_bytes((1u << 20) + 4321, 91);
    const uint64_t len = data.size();
    for (int lanes : {1, 2, 4}) {
        SCOPED_TRACE(std::to_string(lanes) + " lanes");
        const int n = lanes + 1;
        // The chunks are interleaved: stripe 0 has parts all over the payload.
        int parts0 = 0;
        remote::stripe_parts(len, n, 0, 0, len, [&](uint64_t, uint64_t) { parts0++; });
        const uint64_t chunks =
            (len + remote::stripe_chunk(len, n) - 1) / remote::stripe_chunk(len, n);
        EXPECT_EQ(static_cast<uint64_t>(parts0), (chunks + n - 1) / n);
        EXPECT_GE(parts0, 2);
        progressive_transfer(data, lanes, 100003);
        if (HasFatalFailure()) return;
    }
}

// FERRY_STEP_TRACE: each stripe lane writes its own file when the lanes end (lane-send-PID-N,
// lane-receive-PID-N), so that a step's trace shows when the lanes' parts of a striped reply
// went out and came in (bench/tools/step-trace.py). A progressive transfer in three pieces
// over two lanes: one file per lane; each sending lane's sends begin ('w') and return ('s') in
// turn, in time order, at least one send a lane; each receiving lane records its whole stripe
// once ('r').
TEST(RemoteStripes, LanesTraceTheirSendsAndReceives) {
    const std::string dir = ferry::test::make_temp_dir();
    ::setenv("FERRY_STEP_TRACE", dir.c_str(), 1);  // read by each lane's trace as add() makes it
    struct Unset {
        ~Unset() { ::unsetenv("FERRY_STEP_TRACE"); }
    } unset;
    const std::vector<uint8_t> data = random_bytes((1u << 20) + 17, 5);
    constexpr int kLanes = 2;
    progressive_transfer(data, kLanes, data.size() / 3 + 1);  // the lanes write their files
    ASSERT_FALSE(HasFatalFailure());
    int sending = 0, receiving = 0;
    for (const ferry::test::TraceFile& f : ferry::test::read_step_traces(dir)) {
        if (f.role == "lane-receive") {
            receiving++;
            ASSERT_EQ(f.events.size(), 1u) << f.name;
            EXPECT_EQ(f.events[0].kind, 'r') << f.name;
            continue;
        }
        ASSERT_EQ(f.role, "lane-send") << f.name;
        sending++;
        ASSERT_GE(f.events.size(), 2u) << f.name;
        ASSERT_EQ(f.events.size() % 2, 0u) << f.name;
        for (size_t i = 0; i < f.events.size(); i++) {
            EXPECT_EQ(f.events[i].kind, i % 2 == 0 ? 'w' : 's') << f.name << " event " << i;
            if (i > 0) {
                EXPECT_LE(f.events[i - 1].t, f.events[i].t) << f.name << " event " << i;
            }
        }
    }
    EXPECT_EQ(sending, kLanes);
    EXPECT_EQ(receiving, kLanes);
}

TEST(RemoteServer, FourConcurrentClientsThenMemoryReturnsToBaseline) {
    for (const std::string transport : {"unix", "tcp"}) {
        SCOPED_TRACE(transport);
        const std::string addr = addr_of(transport);
        auto watcher = remote_open(addr);
        ASSERT_TRUE(watcher) << watcher.message();
        auto base = remote_stats(watcher->get());
        ASSERT_TRUE(base);
        auto local = cpu_device()->make_backend();
        ASSERT_TRUE(local);
        const auto cases = graph_cases();
        std::vector<std::vector<uint8_t>> expect(cases.size());
        for (size_t i = 0; i < cases.size(); i++) {
            RunResult r = run_case(cases[i], cpu_device(), local->get());
            ASSERT_TRUE(r.status.is_ok()) << r.status.message();
            expect[i] = r.out;
        }
        std::atomic<int> failures{0}, runs{0};
        std::atomic<uint64_t> peak{0};
        std::vector<std::thread> threads;
        for (int c = 0; c < 4; c++) {
            threads.emplace_back([&, c]() {
                auto reg = remote_open(addr);
                if (!reg) {
                    failures++;
                    return;
                }
                Device* dev = (*reg)->devices()[0];
                auto be = dev->make_backend();
                auto keep = dev->buffer_type()->allocate(static_cast<size_t>(c + 1) << 20);
                if (!be || !keep) {
                    failures++;
                    return;
                }
                for (int rep = 0; rep < 5; rep++) {
                    for (size_t i = 0; i < cases.size(); i++) {
                        RunResult r = run_case(cases[i], dev, be->get());
                        if (!r.status || r.out != expect[i]) failures++;
                        runs++;
                    }
                }
                auto s = remote_stats(reg->get());
                if (s) peak = std::max<uint64_t>(peak.load(), s->server_bytes);
            });
        }
        for (auto& t : threads) t.join();
        EXPECT_EQ(failures.load(), 0);
        EXPECT_GE(peak.load(), base->server_bytes + (1u << 20));
        // Every client is gone: the server frees their sessions.
        uint64_t bytes = UINT64_MAX, sessions = 0;
        for (int i = 0; i < 100; i++) {
            auto s = remote_stats(watcher->get());
            ASSERT_TRUE(s);
            bytes = s->server_bytes;
            sessions = s->server_sessions;
            if (bytes == base->server_bytes && sessions == base->server_sessions) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        EXPECT_EQ(bytes, base->server_bytes);
        EXPECT_EQ(sessions, base->server_sessions);
    }
}

TEST(RemoteServer, SigkilledClientHasItsBuffersFreed) {
    const std::string addr = g_servers->unix_srv.addr();
    auto watcher = remote_open(addr);
    ASSERT_TRUE(watcher);
    auto base = remote_stats(watcher->get());
    ASSERT_TRUE(base);
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    if (child == 0) {
        auto reg = remote_open(addr);
        if (!reg) _exit(2);
        Device* dev = (*reg)->devices()[0];
        std::vector<std::unique_ptr<Buffer>> keep;
        for (int i = 0; i < 3; i++) {
            auto b = dev->buffer_type()->allocate(8u << 20);
            if (!b) _exit(3);
            keep.push_back(std::move(*b));
        }
        char c = 1;
        if (write(ready[1], &c, 1) != 1) _exit(4);
        for (;;) pause();
    }
    close(ready[1]);
    char c = 0;
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    close(ready[0]);
    auto during = remote_stats(watcher->get());
    ASSERT_TRUE(during);
    EXPECT_EQ(during->server_bytes, base->server_bytes + 3 * (8u << 20));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    uint64_t bytes = UINT64_MAX;
    for (int i = 0; i < 100 && bytes != base->server_bytes; i++) {
        auto s = remote_stats(watcher->get());
        ASSERT_TRUE(s);
        bytes = s->server_bytes;
        if (bytes != base->server_bytes) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(bytes, base->server_bytes);
}

TEST(RemoteServer, SigkilledServerFailsClientCallsNamingTheServerAndRestartServes) {
    for (const std::string transport : {"unix", "tcp"}) {
        SCOPED_TRACE(transport);
        const std::string dir = ferry::test::make_temp_dir();
        const std::string listen = transport == "unix" ? "unix:" + dir + "/k" : "tcp:127.0.0.1:0";
        std::string addr;
        {
            ServerProcess srv;
            std::string err;
            ASSERT_TRUE(srv.start(listen, {}, &err)) << err;
            addr = srv.addr();
            auto reg = remote_open(addr);
            ASSERT_TRUE(reg);
            Device* dev = (*reg)->devices()[0];
            auto b = dev->buffer_type()->allocate(4096);
            ASSERT_TRUE(b);
            Tensor t;
            t.ne[0] = 16;
            set_contiguous_strides(&t);
            t.buffer = b->get();
            std::vector<float> v(16, 1.0f);
            ASSERT_TRUE(tensor_set(&t, v.data(), 64).is_ok());
            auto be = dev->make_backend();
            ASSERT_TRUE(be);
            srv.kill9();
            const auto t0 = std::chrono::steady_clock::now();
            // A call that needs the server: mapped buffers read locally, so use a request.
            Status st = remote_ping(reg->get());
            if (st.is_ok()) st = (*be)->synchronize();
            const double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            ASSERT_FALSE(st.is_ok());
            EXPECT_LT(secs, 5.0);
            EXPECT_NE(st.message().find(addr), std::string::npos) << st.message();
            // Every later call fails fast too, and freeing buffers does not hang.
            EXPECT_FALSE(dev->buffer_type()->allocate(64).has_value());
            EXPECT_FALSE(remote_stats(reg->get()).has_value());
        }
        // A restarted server serves new clients.
        ServerProcess again;
        std::string err;
        ASSERT_TRUE(again.start(transport == "unix" ? listen : "tcp:127.0.0.1:0", {}, &err)) << err;
        auto reg2 = remote_open(again.addr());
        ASSERT_TRUE(reg2) << reg2.message();
        EXPECT_TRUE(remote_ping(reg2->get()).is_ok());
    }
}

TEST(RemoteServer, TokenAndListenRules) {
    ServerProcess srv;
    std::string err;
    ASSERT_TRUE(srv.start("tcp:127.0.0.1:0", {"--token", "s3cret"}, &err)) << err;
    auto bad = remote_open(srv.addr(), "wrong");
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.message().find("authentication failed"), std::string::npos) << bad.message();
    EXPECT_NE(bad.message().find(srv.addr()), std::string::npos) << bad.message();
    auto good = remote_open(srv.addr(), "s3cret");
    ASSERT_TRUE(good) << good.message();
    EXPECT_TRUE(remote_ping(good->get()).is_ok());
    // A non-loopback address without a token is refused at startup.
    const ferry::testing::ShellResult r = ferry::testing::run_shell(
        std::string("env -u FERRY_TOKEN ") + FERRY_BIN + " serve --listen tcp:0.0.0.0:0 2>&1");
    const std::string& text = r.out;
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(text.find("requires --token"), std::string::npos) << text;
}

TEST(RemoteServer, SessionMemoryLimit) {
    ServerProcess srv;
    std::string err;
    const std::string dir = ferry::test::make_temp_dir();
    ASSERT_TRUE(srv.start("unix:" + dir + "/m", {"--max-memory", "1048576"}, &err)) << err;
    auto reg = remote_open(srv.addr());
    ASSERT_TRUE(reg);
    Device* dev = (*reg)->devices()[0];
    auto a = dev->buffer_type()->allocate(768 << 10);
    ASSERT_TRUE(a) << a.message();
    auto b = dev->buffer_type()->allocate(512 << 10);
    ASSERT_FALSE(b);
    EXPECT_NE(b.message().find("memory limit"), std::string::npos) << b.message();
    a->reset();
    auto c = dev->buffer_type()->allocate(1 << 20);
    EXPECT_TRUE(c) << c.message();
}

}  // namespace
