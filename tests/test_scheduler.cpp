// The scheduler with devices that behave like accelerators: complete split graphs, the graph
// signature, and reads ordered by the interface (a device whose stream runs on its own thread,
// with memory the CPU backend cannot read).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "ferry/llama.h"
#include "ferry/remote.h"
#include "ferry/scheduler.h"
#include "ferry/server.h"

namespace ferry {
namespace {

// ---------------------------------------------------------------------------------------------
// "FAR": a device whose memory is host memory that it does not call host memory (so the CPU
// backend will not read it and the scheduler must copy across), and whose stream is a worker
// thread: compute(), set_tensor_async() and get_tensor_async() return at once and run later,
// in order. Reading a result any way but through the stream (and synchronize) races with it.

class FarDevice;

class FarBuffer : public Buffer {
  public:
    FarBuffer(BufferType* type, size_t size)
        : type_(type),
          size_(size),
          mem_(static_cast<uint8_t*>(std::aligned_alloc(64, round(size)))) {}
    ~FarBuffer() override { std::free(mem_); }
    BufferType* type() const override { return type_; }
    size_t size() const override { return size_; }
    void* base() const override { return mem_; }
    Status set_tensor(Tensor* t, const void* src, size_t offset, size_t size) override {
        std::memcpy(mem_ + t->offs + offset, src, size);
        return Status::ok();
    }
    Status get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) override {
        std::memcpy(dst, mem_ + t->offs + offset, size);
        return Status::ok();
    }
    Status memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) override {
        std::memset(mem_ + t->offs + offset, value, size);
        return Status::ok();
    }
    Status clear(uint8_t value) override {
        std::memset(mem_, value, size_);
        return Status::ok();
    }

  private:
    static size_t round(size_t n) { return (std::max<size_t>(n, 1) + 63) / 64 * 64; }
    BufferType* type_;
    size_t size_;
    uint8_t* mem_;
};

class FarBufferType : public BufferType {
  public:
    explicit FarBufferType(Device* d) : dev_(d) {}
    const char* name() const override { return "FAR"; }
    Device* device() const override { return dev_; }
    size_t alignment() const override { return 64; }
    bool is_host() const override { return false; }
    Expected<std::unique_ptr<Buffer>> allocate(size_t size) override {
        return std::unique_ptr<Buffer>(new FarBuffer(this, size));
    }

  private:
    Device* dev_;
};

class FarBackend : public Backend {
  public:
    FarBackend(Device* dev, int n_threads, std::chrono::microseconds delay)
        : dev_(dev), delay_(delay) {
        BackendOptions o;
        o.n_threads = n_threads;
        cpu_ = std::move(*cpu_device()->make_backend(o));
        worker_ = std::thread([this] { run(); });
    }
    ~FarBackend() override {
        {
            std::lock_guard<std::mutex> l(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        worker_.join();
    }
    const char* name() const override { return "FAR"; }
    Device* device() const override { return dev_; }
    Status set_tensor_async(Tensor* t, const void* src, size_t offset, size_t size) override {
        std::vector<uint8_t> bytes(static_cast<const uint8_t*>(src),
                                   static_cast<const uint8_t*>(src) + size);
        enqueue([t, offset, b = std::move(bytes)] {
            return t->buffer->set_tensor(t, b.data(), offset, b.size());
        });
        return Status::ok();
    }
    Status get_tensor_async(const Tensor* t, void* dst, size_t offset, size_t size) override {
        enqueue([t, dst, offset, size] { return t->buffer->get_tensor(t, dst, offset, size); });
        return Status::ok();
    }
    Status compute(Graph& g) override {
        enqueue([this, &g] {
            std::this_thread::sleep_for(delay_);  // a slow device: late results are visible
            return cpu_->compute(g);
        });
        return Status::ok();
    }
    Status synchronize() override {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return queue_.empty() && !busy_; });
        Status st = error_;
        error_ = Status::ok();
        return st;
    }
    size_t in_flight() {
        std::lock_guard<std::mutex> l(mu_);
        return queue_.size() + (busy_ ? 1 : 0);
    }

  private:
    void enqueue(std::function<Status()> f) {
        {
            std::lock_guard<std::mutex> l(mu_);
            queue_.push_back(std::move(f));
        }
        cv_.notify_all();
    }
    void run() {
        std::unique_lock<std::mutex> l(mu_);
        for (;;) {
            cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;
            std::function<Status()> f = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
            l.unlock();
            Status st = f();
            l.lock();
            busy_ = false;
            if (!st && error_.is_ok()) error_ = st;
            cv_.notify_all();
        }
    }
    Device* dev_;
    std::chrono::microseconds delay_;
    std::unique_ptr<Backend> cpu_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<Status()>> queue_;
    bool busy_ = false, stop_ = false;
    Status error_;
    std::thread worker_;
};

class FarDevice : public Device {
  public:
    explicit FarDevice(std::set<Op> refused = {}, std::chrono::microseconds delay = {})
        : type_(this), refused_(std::move(refused)), delay_(delay) {}
    const char* name() const override { return "FAR"; }
    std::string description() const override { return "test device on its own thread"; }
    DeviceType type() const override { return DeviceType::GPU; }
    DeviceMemory memory() const override { return cpu_device()->memory(); }
    DeviceCaps caps() const override {
        DeviceCaps c;
        c.async = true;
        return c;
    }
    BufferType* buffer_type() override { return &type_; }
    bool supports_op(const Tensor* n) override {
        return !refused_.count(n->op) && cpu_device()->supports_op(n);
    }
    bool supports_buffer_type(const BufferType* t) override { return t == &type_; }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& o = {}) override {
        auto* b = new FarBackend(this, o.n_threads > 0 ? o.n_threads : 2, delay_);
        last_ = b;
        return std::unique_ptr<Backend>(b);
    }
    FarBackend* last_backend() const { return last_; }

  private:
    FarBufferType type_;
    std::set<Op> refused_;
    std::chrono::microseconds delay_;
    FarBackend* last_ = nullptr;
};

std::string fixture(const char* enc) {
    return std::string(FERRY_FIXTURES_DIR) + "/tiny-llama/tiny-llama-" + enc + ".gguf";
}

// Logits of every position of `tokens` on a model whose weights live on `dev` (nullptr: CPU).
std::vector<float> run_logits(const std::string& path, const ModelOptions& mo,
                              const std::vector<int32_t>& tokens,
                              std::unique_ptr<LlamaModel>* keep = nullptr) {
    Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(path, mo);
    EXPECT_TRUE(m) << m.message();
    if (!m) return {};
    SessionOptions so;
    so.n_ctx = 64;
    so.n_threads = 2;
    Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
    EXPECT_TRUE(s) << s.message();
    if (!s) return {};
    std::vector<float> out;
    const int32_t n_vocab = (*m)->hparams().n_vocab;
    // A prompt, then single-token steps (the decode path).
    const size_t n_prompt = tokens.size() / 2;
    Status st = (*s)->decode(std::span(tokens.data(), n_prompt), true);
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (!st) return {};
    for (size_t r = 0; r < n_prompt; r++) {
        const float* l = (*s)->logits(static_cast<int32_t>(r));
        out.insert(out.end(), l, l + n_vocab);
    }
    for (size_t i = n_prompt; i < tokens.size(); i++) {
        st = (*s)->decode(std::span(tokens.data() + i, 1), false);
        EXPECT_TRUE(st.is_ok()) << st.message();
        if (!st) return {};
        const float* l = (*s)->logits(0);
        out.insert(out.end(), l, l + n_vocab);
    }
    s->reset();  // the session goes before the model it reads
    if (keep) *keep = std::move(*m);
    return out;
}

std::vector<float> run_logits(const std::string& path, Device* dev,
                              const std::vector<int32_t>& tokens, Device** used = nullptr) {
    ModelOptions mo;
    if (dev) mo.devices.push_back(dev);
    std::unique_ptr<LlamaModel> m;
    std::vector<float> out = run_logits(path, mo, tokens, &m);
    if (used && m) *used = m->device();
    return out;
}

// tiny-llama's vocabulary has 1024 tokens.
const std::vector<int32_t> kTokens = {1, 450, 496, 173, 170, 432, 172, 975, 278, 366, 112, 889};

// The test devices here run the CPU kernels on weights in the GGUF layout, so their logits
// are the CPU's bit for bit only while the CPU keeps that layout too (its prepare_weights
// repacks some types, which changes the float summation order): FERRY_CPU_REPACK=0 for the
// scope of a test.
struct NoCpuRepack {
    NoCpuRepack() { ::setenv("FERRY_CPU_REPACK", "0", 1); }
    ~NoCpuRepack() { ::unsetenv("FERRY_CPU_REPACK"); }
};

TEST(Scheduler, AsyncDeviceGivesTheCpuLogitsBecauseReadsAreOrdered) {
    NoCpuRepack gguf_layout;
    const std::vector<float> cpu = run_logits(fixture("q8_0"), nullptr, kTokens);
    ASSERT_FALSE(cpu.empty());
    // 2 ms per compute: a read that did not wait for the device would see stale logits.
    FarDevice far({}, std::chrono::microseconds(2000));
    Device* used = nullptr;
    const std::vector<float> got = run_logits(fixture("q8_0"), &far, kTokens, &used);
    EXPECT_EQ(used, &far);
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], cpu[i]) << i;
}

TEST(Scheduler, AsyncDeviceSplitWithTheCpuCopiesBothWaysAndGivesTheCpuLogits) {
    NoCpuRepack gguf_layout;
    const std::vector<float> cpu = run_logits(fixture("q4_0"), nullptr, kTokens);
    ASSERT_FALSE(cpu.empty());
    // The device refuses SWIGLU and RMS_NORM: every layer goes FAR -> CPU -> FAR, and the
    // CPU cannot read FAR memory (nor FAR the CPU's), so each hand-over is a copy.
    FarDevice far({Op::SWIGLU, Op::RMS_NORM}, std::chrono::microseconds(300));
    const std::vector<float> got = run_logits(fixture("q4_0"), &far, kTokens);
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], cpu[i]) << i;
}

TEST(Scheduler, LayersPlacedOnTwoDevicesAndTheCpuGiveTheCpuLogits) {
    NoCpuRepack gguf_layout;
    const std::vector<float> cpu = run_logits(fixture("q8_0"), nullptr, kTokens);
    ASSERT_FALSE(cpu.empty());
    FarDevice a, b;
    ModelOptions mo;
    mo.devices = {&a, &b};
    {
        Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(fixture("q8_0"), ModelOptions{});
        ASSERT_TRUE(m);
        mo.n_gpu_layers = (*m)->hparams().n_layer - 1;  // layer 0 stays on the CPU
    }
    mo.tensor_split = {1.0f, 2.0f};
    std::unique_ptr<LlamaModel> m;
    const std::vector<float> got = run_logits(fixture("q8_0"), mo, kTokens, &m);
    ASSERT_TRUE(m);
    const int32_t n_layer = m->hparams().n_layer;
    ASSERT_GE(n_layer, 3);
    EXPECT_EQ(m->layer_device(0), cpu_device());
    EXPECT_EQ(m->layer_device(1), &a);
    EXPECT_EQ(m->layer_device(n_layer - 1), &b);
    EXPECT_EQ(m->device(), &b);
    int on_a = 0, on_b = 0;
    for (int32_t il = 1; il < n_layer; il++) (m->layer_device(il) == &a ? on_a : on_b)++;
    EXPECT_LT(on_a, on_b);  // a third and two thirds
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], cpu[i]) << i;

    // Bad splits are named.
    mo.tensor_split = {1.0f};
    Expected<std::unique_ptr<LlamaModel>> bad = LlamaModel::load(fixture("q8_0"), mo);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.status().code(), ErrorCode::InvalidArgument);
    EXPECT_NE(bad.message().find("1 shares for 2 devices"), std::string::npos) << bad.message();
}

// A small graph on FAR + CPU: x -> rms_norm (CPU) -> mul_mat with W (FAR) -> add (FAR).
struct SplitCase {
    Context ctx;
    Tensor *x, *w, *y, *out;
    Graph g;
    std::unique_ptr<Buffer> wbuf;
    explicit SplitCase(FarDevice& far, Type wtype, int64_t n_tokens, bool dynamic) {
        x = ctx.new_tensor(Type::F32, {64, n_tokens});
        x->flags |= kTensorInput;
        if (dynamic) ctx.mark_dynamic(x, 1, kDimTokens);
        y = ctx.new_tensor(Type::F32, {32, n_tokens});
        y->flags |= kTensorInput;
        if (dynamic) ctx.mark_dynamic(y, 1, kDimTokens);
        Context wctx;
        w = ctx.new_tensor(wtype, {64, 32});
        w->flags |= kTensorParam;
        Tensor* h = ctx.rms_norm(x, 1e-5f);   // [64, n_tokens]
        out = ctx.add(ctx.mul_mat(w, h), y);  // [32, n_tokens]
        out->flags |= kTensorOutput;
        g.build_forward(out);
        // Only the weight gets memory here (on FAR); inputs are placed by the scheduler.
        Context& c = ctx;
        size_t wsize = w->nbytes();
        Expected<std::unique_ptr<Buffer>> b = far.buffer_type()->allocate(wsize);
        EXPECT_TRUE(b);
        wbuf = std::move(*b);
        EXPECT_TRUE(place_tensor(w, wbuf.get(), 0).is_ok());
        (void)c;
    }
};

TEST(Scheduler, EachSplitIsACompleteGraphAndTheCallersGraphIsUntouched) {
    FarDevice far({Op::RMS_NORM});
    std::unique_ptr<Backend> fb = std::move(*far.make_backend());
    std::unique_ptr<Backend> cb = std::move(*cpu_device()->make_backend());
    SplitCase c(far, Type::Q8_0, 5, false);
    std::vector<Tensor*> srcs_before;
    for (Tensor* n : c.g.nodes) srcs_before.insert(srcs_before.end(), n->src, n->src + kMaxSrc);

    Scheduler sched({fb.get(), cb.get()});
    ASSERT_TRUE(sched.alloc(c.g).is_ok());
    ASSERT_EQ(sched.n_splits(), 2);
    EXPECT_EQ(sched.split_backend(0), cb.get());
    EXPECT_EQ(sched.split_backend(1), fb.get());
    const Graph& s1 = sched.split_graph(1);
    // FAR's split: mul_mat and add; its leaves: the weight, the input y, and the norm's result
    // copied in from the CPU; its output: the caller's output.
    ASSERT_EQ(s1.nodes.size(), 2u);
    EXPECT_EQ(s1.nodes[0]->op, Op::MUL_MAT);
    EXPECT_EQ(s1.nodes[1]->op, Op::ADD);
    EXPECT_NE(s1.nodes[0], c.g.nodes[1]);  // the split's own node, wired to the split
    EXPECT_EQ(s1.copied_in.size(), 1u);
    EXPECT_TRUE(s1.is_output(s1.nodes[1]));
    for (const Tensor* n : s1.nodes) {
        for (const Tensor* s : n->src) {
            if (!s) continue;
            const bool inside = std::find(s1.nodes.begin(), s1.nodes.end(), s) != s1.nodes.end() ||
                                std::find(s1.leafs.begin(), s1.leafs.end(), s) != s1.leafs.end();
            EXPECT_TRUE(inside) << "source " << s->name << " is outside the split's graph";
        }
    }
    const Graph& s0 = sched.split_graph(0);
    ASSERT_EQ(s0.nodes.size(), 1u);
    EXPECT_TRUE(s0.is_output(s0.nodes[0]));  // FAR reads it

    // Values: the same as the CPU alone.
    std::vector<float> xs(64 * 5), ys(32 * 5), wf(64 * 32);
    for (size_t i = 0; i < xs.size(); i++) xs[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < ys.size(); i++) ys[i] = std::cos(0.11f * static_cast<float>(i));
    for (size_t i = 0; i < wf.size(); i++) wf[i] = std::sin(0.05f * static_cast<float>(i) + 1.0f);
    std::vector<uint8_t> wq(c.w->nbytes());
    type_traits(Type::Q8_0).from_float(wf.data(), wq.data(), static_cast<int64_t>(wf.size()));
    ASSERT_TRUE(c.wbuf->set_tensor(c.w, wq.data(), 0, wq.size()).is_ok());
    ASSERT_TRUE(sched.set_tensor(c.x, xs.data(), xs.size() * 4).is_ok());
    ASSERT_TRUE(sched.set_tensor(c.y, ys.data(), ys.size() * 4).is_ok());
    ASSERT_TRUE(sched.compute(c.g).is_ok());
    std::vector<float> got(32 * 5);
    ASSERT_TRUE(sched.get_tensor(c.out, got.data(), got.size() * 4).is_ok());

    // The caller's nodes still point at the caller's tensors.
    std::vector<Tensor*> srcs_after;
    for (Tensor* n : c.g.nodes) srcs_after.insert(srcs_after.end(), n->src, n->src + kMaxSrc);
    EXPECT_EQ(srcs_before, srcs_after);

    // Reference: the same graph on the CPU alone (weights in host memory).
    Context rc;
    Tensor* rx = rc.new_tensor(Type::F32, {64, 5});
    Tensor* ry = rc.new_tensor(Type::F32, {32, 5});
    Tensor* rw = rc.new_tensor(Type::Q8_0, {64, 32});
    Tensor* rout = rc.add(rc.mul_mat(rw, rc.rms_norm(rx, 1e-5f)), ry);
    auto rbuf = allocate_context_tensors(rc, cpu_device()->buffer_type());
    ASSERT_TRUE(rbuf);
    ASSERT_TRUE(tensor_set(rx, xs.data(), xs.size() * 4).is_ok());
    ASSERT_TRUE(tensor_set(ry, ys.data(), ys.size() * 4).is_ok());
    ASSERT_TRUE(tensor_set(rw, wq.data(), wq.size()).is_ok());
    Graph rg;
    rg.build_forward(rout);
    ASSERT_TRUE(cb->compute(rg).is_ok());
    std::vector<float> want(32 * 5);
    ASSERT_TRUE(tensor_get(rout, want.data(), want.size() * 4).is_ok());
    for (size_t i = 0; i < want.size(); i++) ASSERT_EQ(got[i], want[i]) << i;
}

TEST(Scheduler, SplitsThatDifferOnlyInAWeightTypeHaveDifferentSignatures) {
    FarDevice far({Op::RMS_NORM});
    std::unique_ptr<Backend> fb = std::move(*far.make_backend());
    std::unique_ptr<Backend> cb = std::move(*cpu_device()->make_backend());
    SplitCase a(far, Type::Q4_0, 4, false), b(far, Type::Q8_0, 4, false);
    Scheduler sa({fb.get(), cb.get()}), sb({fb.get(), cb.get()});
    ASSERT_TRUE(sa.alloc(a.g).is_ok());
    ASSERT_TRUE(sb.alloc(b.g).is_ok());
    // The FAR splits: the same nodes, one weight Q4_0, the other Q8_0.
    const GraphSignature ka = graph_signature(sa.split_graph(1));
    const GraphSignature kb = graph_signature(sb.split_graph(1));
    EXPECT_FALSE(ka == kb);
    EXPECT_FALSE(ka.hash == kb.hash);
    // The CPU splits (norm of the same input) are the same structure.
    EXPECT_TRUE(graph_signature(sa.split_graph(0)) == graph_signature(sb.split_graph(0)));
}

TEST(Scheduler, DynamicTokenCountSharesOneSignature) {
    FarDevice far;
    SplitCase one(far, Type::Q8_0, 1, true), seven(far, Type::Q8_0, 7, true);
    SplitCase fixed1(far, Type::Q8_0, 1, false), fixed7(far, Type::Q8_0, 7, false);
    // Marked dynamic: the same compilation serves 1 and 7 tokens...
    EXPECT_TRUE(graph_signature(one.g) == graph_signature(seven.g));
    // ...but not when every size is asked for, nor when nothing was marked.
    EXPECT_FALSE(graph_signature(one.g, SignatureMode::Exact) ==
                 graph_signature(seven.g, SignatureMode::Exact));
    EXPECT_FALSE(graph_signature(fixed1.g) == graph_signature(fixed7.g));
    // The mark flowed through norm, mul_mat and add to the output's token dimension.
    EXPECT_EQ(one.out->dim_sym[1], kDimTokens);
    EXPECT_EQ(one.out->dim_sym[0], kDimFixed);
    // Another weight shape is another signature, dynamic or not.
    Context ctx;
    Tensor* x = ctx.new_tensor(Type::F32, {64, 3});
    ctx.mark_dynamic(x, 1, kDimTokens);
    Tensor* w = ctx.new_tensor(Type::Q8_0, {64, 48});
    Tensor* y = ctx.new_tensor(Type::F32, {48, 3});
    ctx.mark_dynamic(y, 1, kDimTokens);
    Graph g;
    g.build_forward(ctx.add(ctx.mul_mat(w, ctx.rms_norm(x, 1e-5f)), y));
    EXPECT_FALSE(graph_signature(g) == graph_signature(one.g));
}

TEST(Scheduler, DecodeStepsOfTheLlamaGraphShareOneSignature) {
    // Reshapes, permutes, views of the KV cache, attention: the symbols survive them all, so
    // successive decode graphs (different KV lengths) have one signature.
    Context ctx;
    const int64_t hd = 16, n_head = 4;
    std::vector<GraphSignature> sigs;
    for (int64_t n_kv : {32, 64}) {
        Tensor* q = ctx.new_tensor(Type::F32, {hd * n_head, 1});
        ctx.mark_dynamic(q, 1, kDimTokens);
        Tensor* cache = ctx.new_tensor(Type::F16, {hd * 2, 256});
        Tensor* k = ctx.view_3d(cache, hd, n_kv, 2, cache->nb[1], hd * 2, 0);
        ctx.mark_dynamic(k, 1, kDimKv);
        Tensor* mask = ctx.new_tensor(Type::F16, {n_kv, 1});
        ctx.mark_dynamic(mask, 0, kDimKv);
        ctx.mark_dynamic(mask, 1, kDimTokens);
        Tensor* qp = ctx.permute(ctx.reshape(q, {hd, n_head, 1}), 0, 2, 1, 3);
        Tensor* att = ctx.flash_attn_ext(qp, k, k, mask, 0.25f);
        Tensor* out = ctx.reshape(att, {hd * n_head, 1});
        EXPECT_EQ(out->dim_sym[1], kDimTokens);
        Graph g;
        g.build_forward(out);
        sigs.push_back(graph_signature(g));
    }
    EXPECT_TRUE(sigs[0] == sigs[1]);
}

// ---------------------------------------------------------------------------------------------
// prepare_weights: a FAR device that "repacks" every weight once (its extra holds a checksum of
// the weight's bytes) and whose computes check every leaf that carries an extra against its
// bytes. Locally, and through `ferry serve` (PREPARE_WEIGHTS), every prepared weight must reach
// the computes with its own extra, and the logits stay the CPU's.

uint64_t checksum(const Tensor* t) {
    const auto* p = static_cast<const uint8_t*>(t->data);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < t->nbytes(); i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

struct Prepared {
    uint64_t sum = 0;
};

struct PrepStats {
    std::mutex mu;
    size_t calls = 0, prepared = 0, mismatches = 0;
    std::set<const void*> seen;  // extras that reached a compute
};

class PrepBackend : public FarBackend {
  public:
    PrepBackend(Device* dev, int n_threads, PrepStats* stats)
        : FarBackend(dev, n_threads, {}), stats_(stats) {}
    Status compute(Graph& g) override {
        std::lock_guard<std::mutex> l(stats_->mu);
        for (const Tensor* leaf : g.leafs) {
            if (!leaf->extra) continue;
            stats_->seen.insert(leaf->extra);
            if (static_cast<const Prepared*>(leaf->extra)->sum != checksum(leaf)) {
                stats_->mismatches++;
            }
        }
        return FarBackend::compute(g);
    }

  private:
    PrepStats* stats_;
};

class PrepDevice : public FarDevice {
  public:
    DeviceCaps caps() const override {
        DeviceCaps c = FarDevice::caps();
        c.prepare_weights = true;
        return c;
    }
    Status prepare_weights(std::span<Tensor* const> weights) override {
        std::lock_guard<std::mutex> l(stats.mu);
        stats.calls++;
        for (Tensor* t : weights) {
            if (!supports_buffer_type(t->buffer->type())) {
                return Status::errorf("%s is not in this device's memory", t->name);
            }
            Prepared& p = store_.emplace_back();
            p.sum = checksum(t);
            t->extra = &p;
            stats.prepared++;
        }
        return Status::ok();
    }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& o = {}) override {
        return std::unique_ptr<Backend>(
            new PrepBackend(this, o.n_threads > 0 ? o.n_threads : 2, &stats));
    }
    PrepStats stats;

  private:
    std::deque<Prepared> store_;  // outlives every model of the test
};

TEST(Scheduler, PreparedWeightsReachTheDevicesComputesLocallyAndThroughFerryServe) {
    NoCpuRepack gguf_layout;
    const std::vector<float> cpu = run_logits(fixture("q4_0"), nullptr, kTokens);
    ASSERT_FALSE(cpu.empty());

    PrepDevice local;
    const std::vector<float> got = run_logits(fixture("q4_0"), &local, kTokens);
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], cpu[i]) << i;
    EXPECT_EQ(local.stats.calls, 1u);
    ASSERT_GT(local.stats.prepared, 10u);  // tiny-llama: 4 layers of 9 weights and 3 more
    EXPECT_EQ(local.stats.seen.size(), local.stats.prepared);
    EXPECT_EQ(local.stats.mismatches, 0u);

    // The same device served by an in-process `ferry serve` on a unix socket.
    PrepDevice served;
    char dir[] = "/tmp/ferry-prep-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir));
    ServeOptions so;
    so.listen = {std::string("unix:") + dir + "/s"};
    so.devices = {&served};
    Expected<std::unique_ptr<RemoteServer>> srv = RemoteServer::start(so);
    ASSERT_TRUE(srv) << srv.message();
    std::thread serving([&] { (void)(*srv)->run(); });
    {
        Expected<std::unique_ptr<Registry>> reg = remote_open((*srv)->addresses()[0]);
        ASSERT_TRUE(reg) << reg.message();
        ASSERT_EQ((*reg)->devices().size(), 1u);
        Device* remote = (*reg)->devices()[0];
        const std::vector<float> far = run_logits(fixture("q4_0"), remote, kTokens);
        ASSERT_EQ(far.size(), cpu.size());
        for (size_t i = 0; i < far.size(); i++) ASSERT_EQ(far[i], cpu[i]) << i;
    }
    (*srv)->stop();
    serving.join();
    EXPECT_EQ(served.stats.calls, 1u);  // one PREPARE_WEIGHTS: a model's weights fit one request
    EXPECT_EQ(served.stats.prepared, local.stats.prepared);
    EXPECT_EQ(served.stats.seen.size(), served.stats.prepared);
    EXPECT_EQ(served.stats.mismatches, 0u);
    std::string rm = std::string("rm -rf ") + dir;
    EXPECT_EQ(std::system(rm.c_str()), 0);
}

}  // namespace
}  // namespace ferry
