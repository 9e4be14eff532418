// Hostile requests against a real `ferry serve`: raw frames over real sockets. Each must get an
// error reply while the server stays up and a concurrent well-behaved client is unaffected.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "ferry/remote.h"
#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "test_remote_util.h"

using namespace ferry;
using ferry::remote::Cmd;
using ferry::remote::Entry;
using ferry::test::RawClient;
using ferry::test::ServerProcess;

namespace {

std::vector<uint8_t> payload(std::function<void(wire::Writer&)> fn) {
    wire::Writer w;
    fn(w);
    return w.buf();
}

Entry leaf(Type type, std::initializer_list<int64_t> ne, uint64_t handle, uint64_t offs) {
    Entry e;
    e.type = static_cast<uint32_t>(type);
    Tensor t;
    t.type = type;
    int i = 0;
    for (int64_t n : ne) t.ne[i++] = n;
    set_contiguous_strides(&t);
    for (int d = 0; d < kMaxDims; d++) {
        e.ne[d] = t.ne[d];
        e.nb[d] = t.nb[d];
    }
    e.handle = handle;
    e.offs = offs;
    return e;
}

std::vector<uint8_t> graph(const std::vector<Entry>& es, uint32_t dev = 0, int64_t n = -1) {
    wire::Writer w;
    w.u32(dev);
    w.u8(remote::kGraphFull);
    w.u32(n < 0 ? static_cast<uint32_t>(es.size()) : static_cast<uint32_t>(n));
    for (const Entry& e : es) remote::write_entry(w, e);
    return w.buf();
}

uint64_t u64_of(const std::vector<uint8_t>& p, size_t at = 0) {
    wire::Reader r(p.data() + at, p.size() - at);
    return r.u64();
}

// A well-behaved client running set / compute / get in a loop, checking every result.
class GoodClient {
  public:
    explicit GoodClient(std::string addr) : addr_(std::move(addr)) {}
    void start() {
        thread_ = std::thread([this] { loop(); });
    }
    void stop() {
        stop_ = true;
        if (thread_.joinable()) thread_.join();
    }
    int failures() const { return failures_.load(); }
    int iterations() const { return iterations_.load(); }
    std::string first_error() const { return first_error_; }
    uint64_t handle() const { return handle_.load(); }

  private:
    void fail(const std::string& why) {
        if (failures_++ == 0) first_error_ = why;
    }
    void loop() {
        auto reg = remote_open(addr_);
        if (!reg) return fail(reg.message());
        Device* dev = (*reg)->devices()[0];
        auto be = dev->make_backend();
        if (!be) return fail(be.message());
        Context ctx;
        Tensor* a = ctx.new_tensor(Type::F32, {256, 4});
        Tensor* b = ctx.new_tensor(Type::F32, {256, 4});
        Tensor* sum = ctx.add(a, b);
        sum->flags |= kTensorOutput;
        const bool can_add = cpu_device()->supports_op(sum);
        auto buf = allocate_context_tensors(ctx, dev->buffer_type());
        if (!buf) return fail(buf.message());
        Graph g;
        g.build_forward(sum);
        std::mt19937 rng(1);
        std::uniform_real_distribution<float> dist(-1, 1);
        std::vector<float> x(1024), y(1024), out(1024);
        while (!stop_) {
            for (auto& v : x) v = dist(rng);
            for (auto& v : y) v = dist(rng);
            Status st = (*be)->set_tensor_async(a, x.data(), 0, 4096);
            if (st) st = (*be)->set_tensor_async(b, y.data(), 0, 4096);
            if (st && can_add) st = (*be)->compute(g);
            if (st) st = (*be)->get_tensor_async(can_add ? sum : b, out.data(), 0, 4096);
            if (st) st = (*be)->synchronize();
            if (!st) return fail(st.message());
            for (int i = 0; i < 1024; i++) {
                const float want = can_add ? x[i] + y[i] : y[i];
                if (out[i] != want) return fail("wrong result");
            }
            iterations_++;
        }
    }

    std::string addr_;
    std::thread thread_;
    std::atomic<bool> stop_{false};
    std::atomic<int> failures_{0}, iterations_{0};
    std::atomic<uint64_t> handle_{0};
    std::string first_error_;
};

class Hostile : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        dir_ = ferry::test::make_temp_dir();
        const std::string listen =
            GetParam() == "unix" ? "unix:" + dir_ + "/h" : std::string("tcp:127.0.0.1:0");
        std::string err;
        ASSERT_TRUE(srv_.start(listen, {"--max-memory", std::to_string(64 << 20)}, &err)) << err;
        good_ = std::make_unique<GoodClient>(srv_.addr());
        good_->start();
    }
    void TearDown() override {
        if (good_) good_->stop();
    }

    RawClient connect_hello() {
        RawClient c;
        EXPECT_TRUE(c.connect(srv_.addr()));
        auto r = c.hello();
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        return c;
    }
    // One hostile request: it must be answered with an error that mentions `want`.
    void expect_error(RawClient& c, Cmd cmd, const std::vector<uint8_t>& p, const char* want,
                      const char* what) {
        auto r = c.request(cmd, p);
        n_++;
        ASSERT_TRUE(r.ok) << what << ": no reply (server down?)";
        ASSERT_TRUE(r.is_error()) << what << ": accepted";
        EXPECT_EQ(r.h.cmd, static_cast<uint16_t>(cmd)) << what;
        EXPECT_NE(r.message().find(want), std::string::npos)
            << what << ": message '" << r.message() << "' lacks '" << want << "'";
    }
    uint64_t alloc(RawClient& c, uint64_t size) {
        auto r = c.request(Cmd::BUFFER_ALLOC, payload([&](wire::Writer& w) {
                               w.u32(0);
                               w.u8(0);
                               w.u64(size);
                           }));
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        return r.ok && r.payload.size() >= 8 ? u64_of(r.payload) : 0;
    }

    std::string dir_;
    ServerProcess srv_;
    std::unique_ptr<GoodClient> good_;
    int n_ = 0;
};

TEST_P(Hostile, EveryBadRequestGetsAnErrorAndNobodyElseNotices) {
    // --- before HELLO ---
    {
        RawClient c;
        ASSERT_TRUE(c.connect(srv_.addr()));
        expect_error(c, Cmd::LIST_DEVICES, {}, "HELLO must be the first", "list before hello");
        expect_error(c, Cmd::BUFFER_ALLOC, payload([](wire::Writer& w) {
                         w.u32(0);
                         w.u8(0);
                         w.u64(64);
                     }),
                     "HELLO must be the first", "alloc before hello");
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({}), "HELLO must be the first",
                     "compute before hello");
        expect_error(c, Cmd::HELLO, payload([](wire::Writer& w) { w.u32(1); }), "malformed HELLO",
                     "truncated hello");
    }
    {
        RawClient c;
        ASSERT_TRUE(c.connect(srv_.addr()));
        auto r = c.hello("", 99);
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("protocol version 99"), std::string::npos) << r.message();
        EXPECT_TRUE(c.closed_by_server());
    }
    RawClient c = connect_hello();
    expect_error(c, Cmd::HELLO, payload([](wire::Writer& w) {
                     w.u32(remote::kProtocolVersion);
                     w.u64(0);
                     w.str("");
                 }),
                 "HELLO sent twice", "second hello");

    // --- unknown commands, bad payloads ---
    {
        c.send_frame(0, {});
        auto r = c.read_reply();
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("unknown command"), std::string::npos);
        c.send_frame(999, {1, 2, 3});
        r = c.read_reply();
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("unknown command 999"), std::string::npos);
        c.send_frame(static_cast<uint16_t>(Cmd::PING), {}, remote::kFlagReply);
        r = c.read_reply();
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("flags"), std::string::npos);
    }
    expect_error(c, Cmd::LIST_DEVICES, {1}, "unexpected payload", "list with payload");
    expect_error(c, Cmd::PING, {1, 2}, "unexpected payload", "ping with payload");
    expect_error(c, Cmd::SESSION_STATS, {0}, "unexpected payload", "stats with payload");
    expect_error(c, Cmd::DEVICE_MEMORY, payload([](wire::Writer& w) { w.u32(99); }),
                 "device index 99 out of range", "memory of device 99");
    expect_error(c, Cmd::DEVICE_MEMORY, {1, 0}, "malformed", "memory truncated");
    expect_error(c, Cmd::SYNCHRONIZE, payload([](wire::Writer& w) { w.u32(5); }), "out of range",
                 "synchronize device 5");

    // --- allocation ---
    auto alloc_req = [](uint32_t dev, uint8_t kind, uint64_t size) {
        return payload([=](wire::Writer& w) {
            w.u32(dev);
            w.u8(kind);
            w.u64(size);
        });
    };
    expect_error(c, Cmd::BUFFER_ALLOC, alloc_req(7, 0, 64), "out of range", "alloc device 7");
    expect_error(c, Cmd::BUFFER_ALLOC, alloc_req(0, 9, 64), "unknown buffer kind", "alloc kind 9");
    expect_error(c, Cmd::BUFFER_ALLOC, alloc_req(0, 0, 1ull << 63), "memory limit", "alloc 2^63");
    expect_error(c, Cmd::BUFFER_ALLOC, alloc_req(0, 0, UINT64_MAX), "", "alloc 2^64-1");
    expect_error(c, Cmd::BUFFER_ALLOC, alloc_req(0, 0, 100ull << 20), "memory limit",
                 "alloc past --max-memory");
    expect_error(c, Cmd::BUFFER_ALLOC, {0, 0, 0, 0, 0}, "malformed", "alloc truncated");

    // --- handles: unknown, stale, foreign ---
    const uint64_t h = alloc(c, 4096);
    ASSERT_NE(h, 0u);
    const uint64_t dead = alloc(c, 64);
    auto free_req = [](uint64_t handle) {
        return payload([=](wire::Writer& w) { w.u64(handle); });
    };
    {
        auto r = c.request(Cmd::BUFFER_FREE, free_req(dead));
        ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    }
    // A handle of another live session (a second raw client).
    RawClient other = connect_hello();
    const uint64_t foreign = alloc(other, 4096);
    ASSERT_NE(foreign, 0u);
    expect_error(c, Cmd::BUFFER_FREE, free_req(12345), "unknown buffer handle", "free made-up");
    expect_error(c, Cmd::BUFFER_FREE, free_req(dead), "unknown buffer handle", "double free");
    expect_error(c, Cmd::BUFFER_FREE, free_req(foreign), "unknown buffer handle", "free foreign");
    expect_error(c, Cmd::BUFFER_CLEAR, payload([&](wire::Writer& w) {
                     w.u64(foreign);
                     w.u8(0);
                 }),
                 "unknown buffer handle", "clear foreign");
    auto set_req = [](uint64_t handle, uint64_t off, uint64_t size, size_t actual) {
        return payload([=](wire::Writer& w) {
            w.u64(handle);
            w.u64(off);
            w.u64(size);
            std::vector<uint8_t> d(actual, 0x5A);
            w.bytes(d.data(), d.size());
        });
    };
    auto get_req = [](uint64_t handle, uint64_t off, uint64_t size) {
        return payload([=](wire::Writer& w) {
            w.u64(handle);
            w.u64(off);
            w.u64(size);
        });
    };
    expect_error(c, Cmd::TENSOR_SET, set_req(foreign, 0, 16, 16), "unknown buffer handle",
                 "set foreign");
    expect_error(c, Cmd::TENSOR_GET, get_req(dead, 0, 16), "unknown buffer handle", "get stale");
    expect_error(c, Cmd::TENSOR_GET, get_req(foreign, 0, 16), "unknown buffer handle",
                 "get foreign");

    // --- ranges ---
    expect_error(c, Cmd::TENSOR_SET, set_req(h, 4090, 16, 16), "outside the buffer",
                 "set past end");
    expect_error(c, Cmd::TENSOR_SET, set_req(h, UINT64_MAX - 4, 8, 8), "outside the buffer",
                 "set offset overflow");
    expect_error(c, Cmd::TENSOR_SET, set_req(h, 0, 64, 16), "fewer than", "set short payload");
    expect_error(c, Cmd::TENSOR_SET, set_req(h, 0, 16, 64), "malformed", "set trailing bytes");
    expect_error(c, Cmd::TENSOR_SET, set_req(h, 0, UINT64_MAX, 0), "fewer than", "set size 2^64-1");
    expect_error(c, Cmd::TENSOR_SET, set_req(h, 0, 1u << 20, 1u << 20), "outside the buffer",
                 "bulk set larger than its buffer");
    expect_error(c, Cmd::TENSOR_SET, set_req(foreign, 0, 1u << 20, 1u << 20),
                 "unknown buffer handle", "bulk set into a foreign buffer");
    expect_error(c, Cmd::TENSOR_GET, get_req(h, 0, 4097), "outside the buffer", "get past end");
    expect_error(c, Cmd::TENSOR_GET, get_req(h, 8, UINT64_MAX - 4), "outside the buffer",
                 "get size overflow");
    expect_error(c, Cmd::TENSOR_MEMSET, payload([&](wire::Writer& w) {
                     w.u64(h);
                     w.u64(4000);
                     w.u64(200);
                     w.u8(1);
                 }),
                 "outside the buffer", "memset past end");
    expect_error(c, Cmd::TENSOR_COPY, payload([&](wire::Writer& w) {
                     w.u64(h);
                     w.u64(4000);
                     w.u64(h);
                     w.u64(0);
                     w.u64(200);
                 }),
                 "out of range", "copy source past end");
    expect_error(c, Cmd::TENSOR_COPY, payload([&](wire::Writer& w) {
                     w.u64(h);
                     w.u64(0);
                     w.u64(foreign);
                     w.u64(0);
                     w.u64(16);
                 }),
                 "unknown buffer handle", "copy into foreign");

    // --- events: bad devices, malformed payloads, unknown / stale / foreign handles ---
    auto ev_req = [](uint64_t handle) { return payload([=](wire::Writer& w) { w.u64(handle); }); };
    auto record_req = [](uint64_t handle, uint32_t dev) {
        return payload([=](wire::Writer& w) {
            w.u64(handle);
            w.u32(dev);
        });
    };
    auto wait_req = [](uint32_t dev, uint64_t handle) {
        return payload([=](wire::Writer& w) {
            w.u32(dev);
            w.u64(handle);
        });
    };
    auto new_event = [&](RawClient& cl) -> uint64_t {
        auto r = cl.request(Cmd::EVENT_NEW, payload([](wire::Writer& w) { w.u32(0); }));
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        EXPECT_EQ(r.payload.size(), 8u);
        return r.ok && !r.is_error() && r.payload.size() == 8 ? u64_of(r.payload) : 0;
    };
    auto expect_ok = [](RawClient& cl, Cmd cmd, const std::vector<uint8_t>& p, const char* what) {
        auto r = cl.request(cmd, p);
        EXPECT_TRUE(r.ok && !r.is_error()) << what << ": " << r.message();
    };
    const uint64_t ev = new_event(c);
    ASSERT_NE(ev, 0u);
    // The well-formed requests are accepted.
    expect_ok(c, Cmd::EVENT_RECORD, record_req(ev, 0), "record");
    expect_ok(c, Cmd::EVENT_WAIT, wait_req(0, ev), "wait");
    expect_ok(c, Cmd::EVENT_SYNCHRONIZE, ev_req(ev), "event synchronize");
    const uint64_t dead_ev = new_event(c);
    ASSERT_NE(dead_ev, 0u);
    expect_ok(c, Cmd::EVENT_FREE, ev_req(dead_ev), "event free");
    const uint64_t foreign_ev = new_event(other);
    ASSERT_NE(foreign_ev, 0u);
    expect_ok(other, Cmd::EVENT_RECORD, record_req(foreign_ev, 0), "foreign record");
    expect_error(c, Cmd::EVENT_NEW, payload([](wire::Writer& w) { w.u32(99); }),
                 "device index 99 out of range", "event on device 99");
    expect_error(c, Cmd::EVENT_NEW, {}, "malformed", "event new empty");
    expect_error(c, Cmd::EVENT_NEW, {0, 0}, "malformed", "event new truncated");
    expect_error(c, Cmd::EVENT_NEW, {0, 0, 0, 0, 0}, "malformed", "event new extra bytes");
    expect_error(c, Cmd::EVENT_RECORD, record_req(ev, 7), "device index 7 out of range",
                 "record on device 7");
    expect_error(c, Cmd::EVENT_WAIT, wait_req(7, ev), "device index 7 out of range",
                 "wait on device 7");
    expect_error(c, Cmd::EVENT_RECORD, ev_req(ev), "malformed", "record without device");
    expect_error(c, Cmd::EVENT_WAIT, {0, 0, 0, 0, 1}, "malformed", "wait truncated");
    {
        std::vector<uint8_t> extra = wait_req(0, ev);
        extra.push_back(0);
        expect_error(c, Cmd::EVENT_WAIT, extra, "malformed", "wait extra byte");
        extra = record_req(ev, 0);
        extra.push_back(0);
        expect_error(c, Cmd::EVENT_RECORD, extra, "malformed", "record extra byte");
    }
    expect_error(c, Cmd::EVENT_SYNCHRONIZE, {1, 2, 3}, "malformed", "event synchronize truncated");
    expect_error(c, Cmd::EVENT_SYNCHRONIZE, payload([&](wire::Writer& w) {
                     w.u64(ev);
                     w.u8(0);
                 }),
                 "malformed", "event synchronize extra byte");
    expect_error(c, Cmd::EVENT_FREE, {}, "malformed", "event free empty");
    expect_error(c, Cmd::EVENT_FREE, payload([&](wire::Writer& w) {
                     w.u64(ev);
                     w.u32(0);
                 }),
                 "malformed", "event free extra bytes");
    const std::pair<uint64_t, const char*> bad_events[] = {
        {12345, "made-up"},
        {(ev & ~0xFFFFFFFFull) | 0xFFFFFFu, "made-up with this session's prefix"},
        {dead_ev, "stale"},
        {foreign_ev, "foreign"},
        {h, "buffer handle"},
    };
    for (const auto& [bad, kind] : bad_events) {
        const std::string k = kind;
        expect_error(c, Cmd::EVENT_RECORD, record_req(bad, 0), "unknown event handle",
                     ("record " + k).c_str());
        expect_error(c, Cmd::EVENT_WAIT, wait_req(0, bad), "unknown event handle",
                     ("wait " + k).c_str());
        expect_error(c, Cmd::EVENT_SYNCHRONIZE, ev_req(bad), "unknown event handle",
                     ("synchronize " + k).c_str());
        expect_error(c, Cmd::EVENT_FREE, ev_req(bad), "unknown event handle",
                     ("free " + k).c_str());
    }
    // And an event handle is no buffer handle.
    expect_error(c, Cmd::BUFFER_FREE, free_req(ev), "unknown buffer handle", "event as buffer");
    expect_error(c, Cmd::TENSOR_GET, get_req(ev, 0, 8), "unknown buffer handle",
                 "event as buffer (get)");
    {
        // At most 4096 live events per session; its session ends (and frees them) on close.
        RawClient lim = connect_hello();
        std::vector<uint64_t> evs;
        for (int i = 0; i < 4096; i++) {
            const uint64_t e = new_event(lim);
            ASSERT_NE(e, 0u) << "event " << i;
            evs.push_back(e);
        }
        expect_error(lim, Cmd::EVENT_NEW, payload([](wire::Writer& w) { w.u32(0); }),
                     "too many live events", "event 4097");
        expect_ok(lim, Cmd::EVENT_FREE, ev_req(evs.back()), "free one of 4096");
        ASSERT_NE(new_event(lim), 0u);  // room for one again
        expect_error(lim, Cmd::EVENT_NEW, payload([](wire::Writer& w) { w.u32(0); }),
                     "too many live events", "event 4097 again");
    }
    {
        // A client that did not offer events in HELLO cannot use them.
        RawClient plain;
        ASSERT_TRUE(plain.connect(srv_.addr()));
        auto r = plain.hello("", remote::kProtocolVersion, remote::kCapGraphCache);
        ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
        expect_error(plain, Cmd::EVENT_NEW, payload([](wire::Writer& w) { w.u32(0); }),
                     "events not negotiated", "event without the capability");
    }

    // --- graphs ---
    const Entry a = leaf(Type::F32, {16, 4}, h, 0);    // 256 bytes at 0
    const Entry b = leaf(Type::F32, {16, 4}, h, 256);  // 256 bytes at 256
    Entry add = leaf(Type::F32, {16, 4}, h, 512);
    add.op = static_cast<uint32_t>(Op::ADD);
    add.src[0] = 0;
    add.src[1] = 1;
    {
        // The valid graph is accepted (and cached: the base for the delta cases below).
        auto r = c.request(Cmd::GRAPH_COMPUTE, graph({a, b, add}));
        ASSERT_TRUE(r.ok);
        if (r.is_error()) {
            EXPECT_NE(r.message().find("no kernel"), std::string::npos) << r.message();
        }
    }
    expect_error(c, Cmd::GRAPH_COMPUTE, payload([](wire::Writer& w) {
                     w.u32(0);
                     w.u8(7);
                 }),
                 "unknown graph mode", "graph mode 7");
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({a}, 0, 3), "does not match its count",
                 "count larger than table");
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b}, 0, 1), "does not match its count",
                 "count smaller than table");
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({a}, 0, 1u << 31), "limit", "count 2^31");
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({a}, 9), "out of range", "graph device 9");
    {
        Entry e = a;
        e.type = 77;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "unknown type id 77", "type 77");
        e.type = static_cast<uint32_t>(Type::Q8_K);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "unknown type id", "type q8_K");
    }
    {
        Entry e = add;
        e.op = 200;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, e}), "unknown op id 200", "op 200");
    }
    {
        Entry e = add;
        e.src[1] = 2;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, e}), "forward reference", "self cycle");
        Entry first = add;
        first.src[0] = 1;
        first.src[1] = 2;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({first, a, b}), "forward reference",
                     "forward reference");
        e = add;
        e.src[0] = -5;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, e}), "forward reference",
                     "negative source");
        // Two nodes referring to each other.
        Entry n1 = add, n2 = add;
        n1.src[1] = 3;
        n2.src[1] = 2;
        n2.offs = 768;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, n1, n2}), "forward reference",
                     "two-node cycle");
    }
    {
        Entry e = add;
        e.src[1] = -1;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, e}), "missing source", "ADD one source");
        Entry s = leaf(Type::F32, {16, 4}, h, 512);
        s.op = static_cast<uint32_t>(Op::SCALE);
        s.src[0] = 0;
        s.src[1] = 1;
        float one = 1.0f;
        std::memcpy(&s.op_params[0], &one, 4);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, s}), "too many sources",
                     "SCALE two sources");
    }
    {
        Entry e = leaf(Type::F32, {16, 4}, h, 4000);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "reaches past its buffer",
                     "leaf past buffer end");
        e = leaf(Type::F32, {16, 4}, h, UINT64_MAX - 8);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "reaches past", "leaf offset overflow");
        e = leaf(Type::F32, {16, 4}, dead, 0);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "unknown buffer handle", "stale handle");
        e = leaf(Type::F32, {16, 4}, foreign, 0);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "unknown buffer handle", "foreign handle");
        e = leaf(Type::F32, {16, 4}, 0, 0);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "unknown buffer handle", "no buffer");
        e = leaf(Type::F32, {16, 4}, h, 2);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "not aligned", "misaligned offset");
        e = leaf(Type::F32, {16, 4}, h, 0);
        e.nb[1] = 66;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({e}), "not aligned", "misaligned stride");
    }
    {
        Entry v = leaf(Type::F32, {16}, 0, 0);
        v.op = static_cast<uint32_t>(Op::VIEW);
        v.src[0] = 0;
        v.view_src = 0;
        v.view_offs = 250;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, v}), "reaches past", "view past source");
        v.view_offs = UINT64_MAX - 10;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, v}), "reaches past", "view offset overflow");
        Entry big = leaf(Type::F32, {1}, 0, 0);
        big.op = static_cast<uint32_t>(Op::VIEW);
        big.src[0] = 0;
        big.view_src = 0;
        big.ne[0] = 4;
        big.ne[1] = int64_t{1} << 62;
        big.nb[1] = 1ull << 62;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, big}), "overflow", "view size overflow");
        Entry nv = a;
        nv.view_offs = 8;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({nv}), "view offset without",
                     "view offset on a non-view");
        Entry vv = v;
        vv.view_offs = 0;
        Entry vov = v;
        vov.src[0] = 1;
        vov.view_src = 1;
        vov.view_offs = 0;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, vv, vov}), "view_src is not the storage",
                     "view of a view");
    }
    {
        Entry neg = a;
        neg.ne[1] = -4;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({neg}), "invalid", "negative size");
        Entry e = add;
        e.nb[1] = 128;  // rows overlap: not contiguous
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, e}), "contiguous", "strided result");
        e = add;
        e.ne[0] = 8;
        e.nb[1] = 32;
        e.nb[2] = e.nb[3] = 128;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, e}), "shape", "wrong result shape");
        e = add;
        e.flags = 0x100;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, e}), "unknown flags", "flags");
        Entry q = leaf(Type::Q4_0, {32, 2}, h, 0);
        q.ne[0] = 33;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({q}), "invalid", "partial quant block");
    }
    {
        Entry p = leaf(Type::F32, {16, 4}, 0, 0);
        p.op = static_cast<uint32_t>(Op::PERMUTE);
        p.src[0] = 0;
        p.view_src = 0;
        p.op_params[0] = 0;
        p.op_params[1] = 0;
        p.op_params[2] = 2;
        p.op_params[3] = 3;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, p}), "not a permutation", "bad permute");
        Entry pos = leaf(Type::I32, {4}, h, 1024);
        Entry x3 = leaf(Type::F32, {16, 1, 4}, h, 0);
        Entry r = leaf(Type::F32, {16, 1, 4}, h, 2048);
        r.op = static_cast<uint32_t>(Op::ROPE);
        r.src[0] = 0;
        r.src[1] = 1;
        r.op_params[0] = 16;
        r.op_params[1] = 5;  // unknown mode
        float base = 10000.0f, scale = 1.0f;
        std::memcpy(&r.op_params[2], &base, 4);
        std::memcpy(&r.op_params[3], &scale, 4);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({x3, pos, r}), "mode 5", "rope mode 5");
        Entry sm = add;
        sm.op = static_cast<uint32_t>(Op::SOFT_MAX);
        sm.src[1] = -1;
        const float inf = std::numeric_limits<float>::infinity();
        std::memcpy(&sm.op_params[0], &inf, 4);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, sm}), "finite", "softmax inf scale");
    }
    {
        // Data-dependent indices: checked by the kernels, reported as an error reply.
        Entry src = leaf(Type::F32, {16, 8}, h, 0);     // 512 bytes
        Entry idx = leaf(Type::I32, {2}, h, 1024);      // 8 bytes
        Entry out = leaf(Type::F32, {16, 2}, h, 2048);  // 128 bytes
        out.op = static_cast<uint32_t>(Op::GET_ROWS);
        out.src[0] = 0;
        out.src[1] = 1;
        auto rr = c.request(Cmd::TENSOR_SET, payload([&](wire::Writer& w) {
                                w.u64(h);
                                w.u64(1024);
                                w.u64(8);
                                w.i32(1);
                                w.i32(1000);  // out of range
                            }));
        ASSERT_TRUE(rr.ok && !rr.is_error());
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({src, idx, out}), "", "GET_ROWS index 1000");
        Entry dst = leaf(Type::F32, {16, 8}, h, 0);
        Entry rows = leaf(Type::F32, {16, 2}, h, 2048);
        Entry sr = leaf(Type::F32, {16, 8}, 0, 0);
        sr.op = static_cast<uint32_t>(Op::SET_ROWS);
        sr.src[0] = 0;
        sr.src[1] = 1;
        sr.src[2] = 2;
        sr.view_src = 0;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({dst, rows, idx, sr}), "", "SET_ROWS index 1000");
        rr = c.request(Cmd::TENSOR_SET, payload([&](wire::Writer& w) {
                           w.u64(h);
                           w.u64(1024);
                           w.u64(8);
                           w.i32(-3);
                           w.i32(0);
                       }));
        ASSERT_TRUE(rr.ok && !rr.is_error());
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({src, idx, out}), "", "GET_ROWS index -3");
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({dst, rows, idx, sr}), "", "SET_ROWS index -3");
    }
    {
        // Deltas: an unknown base, and changes outside a cached base.
        auto delta = [](uint64_t base, uint32_t n, uint32_t changed, uint32_t idx,
                        bool with_entry = true) {
            return payload([=](wire::Writer& w) {
                w.u32(0);
                w.u8(remote::kGraphDelta);
                w.u64(base);
                w.u32(n);
                w.u32(changed);
                if (changed && with_entry) {
                    w.u32(idx);
                    Entry e;
                    remote::write_entry(w, e);
                }
            });
        };
        expect_error(c, Cmd::GRAPH_COMPUTE, delta(0x1234, 1, 0, 0), "not cached",
                     "delta unknown base");
        wire::Writer full;
        remote::write_entry(full, a);
        const uint64_t base = wire::hash64(full.data(), full.size());
        auto r = c.request(Cmd::GRAPH_COMPUTE, graph({a}));  // cached, no nodes
        ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
        ASSERT_EQ(u64_of(r.payload), base);
        expect_error(c, Cmd::GRAPH_COMPUTE, delta(base, 1, 1, 5), "changed entry index",
                     "delta index out of range");
        expect_error(c, Cmd::GRAPH_COMPUTE, delta(base, 2, 0, 0), "does not match",
                     "delta count mismatch");
        expect_error(c, Cmd::GRAPH_COMPUTE, delta(base, 1, 2, 0), "2 changed entries of 1",
                     "delta more changes than entries");
        expect_error(c, Cmd::GRAPH_COMPUTE, delta(base, 1, 1, 0, false), "truncated",
                     "delta truncated change list");
    }
    {
        // supports_op tables.
        auto sup = [](uint32_t n, const std::vector<Entry>& es) {
            return payload([&](wire::Writer& w) {
                w.u32(0);
                w.u32(n);
                for (const Entry& e : es) remote::write_entry(w, e);
            });
        };
        expect_error(c, Cmd::SUPPORTS_OP, sup(0, {}), "entries", "supports_op empty");
        expect_error(c, Cmd::SUPPORTS_OP, sup(100, {a}), "entries", "supports_op 100 entries");
        Entry e = add;
        e.op = 4000;
        expect_error(c, Cmd::SUPPORTS_OP, sup(3, {a, b, e}), "unknown op", "supports_op op");
        expect_error(c, Cmd::SUPPORTS_OP, sup(2, {a}), "does not match", "supports_op truncated");
    }

    // --- framing: truncated and oversized frames (each closes that connection) ---
    {
        RawClient t = connect_hello();
        const uint8_t partial[10] = {0x46, 0x52, 0x59, 0x31};
        ASSERT_TRUE(t.send_raw(partial, sizeof(partial)));
        t.shutdown_write();
        auto r = t.read_reply();
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("truncated frame header"), std::string::npos) << r.message();
    }
    {
        RawClient t = connect_hello();
        ASSERT_TRUE(t.send_frame(static_cast<uint16_t>(Cmd::TENSOR_SET), {1, 2, 3, 4}, 0, 100));
        t.shutdown_write();
        auto r = t.read_reply();
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("truncated frame"), std::string::npos) << r.message();
    }
    {
        // A bulk set (received in place) whose data stops short.
        RawClient t = connect_hello();
        const uint64_t big = alloc(t, 2u << 20);
        std::vector<uint8_t> p = set_req(big, 0, 2u << 20, 1u << 20);
        ASSERT_TRUE(t.send_frame(static_cast<uint16_t>(Cmd::TENSOR_SET), p, 0, 24 + (2u << 20)));
        t.shutdown_write();
        auto r = t.read_reply();
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("truncated frame"), std::string::npos) << r.message();
    }
    {
        RawClient t = connect_hello();
        ASSERT_TRUE(t.send_frame(static_cast<uint16_t>(Cmd::TENSOR_SET), {}, 0, 1ull << 40));
        auto r = t.read_reply();
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("exceeds the limit"), std::string::npos) << r.message();
        EXPECT_TRUE(t.closed_by_server());
    }
    {
        RawClient t = connect_hello();
        uint8_t junk[remote::kHeaderSize] = {'G', 'E', 'T', ' ', '/'};
        ASSERT_TRUE(t.send_raw(junk, sizeof(junk)));
        auto r = t.read_reply();
        n_++;
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("bad frame magic"), std::string::npos) << r.message();
        EXPECT_TRUE(t.closed_by_server());
    }

    // The hostile connection is still served, and so is everyone else.
    {
        auto r = c.request(Cmd::PING, {});
        ASSERT_TRUE(r.ok && !r.is_error());
        auto g = c.request(Cmd::TENSOR_GET, get_req(h, 0, 16));
        ASSERT_TRUE(g.ok && !g.is_error());
        auto o = other.request(Cmd::TENSOR_GET, get_req(foreign, 0, 16));
        ASSERT_TRUE(o.ok && !o.is_error());
        // Events of both sessions survived every hostile event request.
        expect_ok(c, Cmd::EVENT_SYNCHRONIZE, ev_req(ev), "own event after the hostile ones");
        expect_ok(other, Cmd::EVENT_WAIT, wait_req(0, foreign_ev), "other's event");
        expect_ok(other, Cmd::EVENT_FREE, ev_req(foreign_ev), "other frees its event");
    }
    EXPECT_GE(n_, 50) << "hostile requests sent";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    good_->stop();
    EXPECT_EQ(good_->failures(), 0) << good_->first_error();
    EXPECT_GT(good_->iterations(), 0);
    EXPECT_TRUE(srv_.alive());
    std::printf("%d hostile requests answered with errors over %s; good client ran %d steps\n", n_,
                GetParam().c_str(), good_->iterations());
}

TEST(HostileTcp, WrongTokenIsRejected) {
    ServerProcess srv;
    std::string err;
    ASSERT_TRUE(srv.start("tcp:127.0.0.1:0", {"--token", "right"}, &err)) << err;
    for (const char* tok : {"", "wrong", "righ", "right-and-more"}) {
        RawClient c;
        ASSERT_TRUE(c.connect(srv.addr()));
        auto r = c.hello(tok);
        ASSERT_TRUE(r.is_error()) << tok;
        EXPECT_NE(r.message().find("authentication failed"), std::string::npos);
        EXPECT_TRUE(c.closed_by_server());
    }
    RawClient ok;
    ASSERT_TRUE(ok.connect(srv.addr()));
    auto r = ok.hello("right");
    EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
}

TEST(HostileEvents, EventOfAnotherDeviceIsRefused) {
    // The CPU served twice: devices 0 and 1, each with its own backend in a session.
    const std::string dir = ferry::test::make_temp_dir();
    ServerProcess srv;
    std::string err;
    ASSERT_TRUE(srv.start("unix:" + dir + "/e", {"--device", "CPU", "--device", "CPU"}, &err))
        << err;
    RawClient c;
    ASSERT_TRUE(c.connect(srv.addr()));
    ASSERT_FALSE(c.hello().is_error());
    auto r = c.request(Cmd::EVENT_NEW, payload([](wire::Writer& w) { w.u32(0); }));
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    const uint64_t ev = u64_of(r.payload);
    for (Cmd cmd : {Cmd::EVENT_RECORD, Cmd::EVENT_WAIT}) {
        auto bad = c.request(cmd, payload([&](wire::Writer& w) {
                                 if (cmd == Cmd::EVENT_WAIT) w.u32(1);
                                 w.u64(ev);
                                 if (cmd == Cmd::EVENT_RECORD) w.u32(1);
                             }));
        ASSERT_TRUE(bad.is_error()) << remote::cmd_name(static_cast<uint16_t>(cmd));
        EXPECT_NE(bad.message().find("belongs to device 0 (CPU), not to device 1 (CPU)"),
                  std::string::npos)
            << bad.message();
    }
    // Through the client: recording on another device's backend is refused before anything
    // is sent; waiting on it is a host wait.
    auto reg = remote_open(srv.addr());
    ASSERT_TRUE(reg) << reg.message();
    ASSERT_EQ((*reg)->devices().size(), 2u);
    Device* d0 = (*reg)->devices()[0];
    Device* d1 = (*reg)->devices()[1];
    auto e0 = d0->make_event();
    ASSERT_TRUE(e0) << e0.message();
    auto b1 = d1->make_backend();
    ASSERT_TRUE(b1);
    Status st = (*b1)->record_event(e0->get());
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find(d0->name()), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(d1->name()), std::string::npos) << st.message();
    st = (*b1)->wait_event(e0->get());
    EXPECT_TRUE(st.is_ok()) << st.message();
    auto s = remote_stats(reg->get());
    ASSERT_TRUE(s) << s.message();
    EXPECT_EQ(s->errors, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, Hostile, ::testing::Values("unix", "tcp"));

}  // namespace
