// Hostile requests against a real `ferry serve`: raw frames over real sockets. Each must get an
// error reply while the server stays up and a concurrent well-behaved client is unaffected.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "ferry/remote.h"
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
        std::vector<std::string> extra = {"--max-memory", std::to_string(64 << 20)};
        std::string listen =
            GetParam() == "unix" ? "unix:" + dir_ + "/h" : std::string("tcp:127.0.0.1:0");
        if (GetParam() == "ivshmem") {
            // One window per client (a window is one client): w0 for the good client, a fresh
            // one for every raw client. Small windows: large frames wrap around the rings.
            listen = "ivshmem:" + dir_ + "/w0,size=1M";
            for (int i = 1; i <= kWindows; i++) {
                extra.push_back("--listen");
                extra.push_back("ivshmem:" + dir_ + "/w" + std::to_string(i) + ",size=1M");
            }
        }
        std::string err;
        ASSERT_TRUE(srv_.start(listen, extra, &err)) << err;
        good_ = std::make_unique<GoodClient>(srv_.addr());
        good_->start();
    }
    void TearDown() override {
        if (good_) good_->stop();
    }

    // Where the next raw client connects.
    std::string next_addr() {
        if (GetParam() != "ivshmem") return srv_.addr();
        EXPECT_LT(next_window_, kWindows) << "more raw clients than windows";
        return "ivshmem:" + dir_ + "/w" + std::to_string(++next_window_);
    }
    RawClient connect_hello() {
        RawClient c;
        EXPECT_TRUE(c.connect(next_addr()));
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

    static constexpr int kWindows = 24;
    std::string dir_;
    ServerProcess srv_;
    std::unique_ptr<GoodClient> good_;
    int n_ = 0;
    int next_window_ = 0;
};

TEST_P(Hostile, EveryBadRequestGetsAnErrorAndNobodyElseNotices) {
    // --- before HELLO: one error, then the connection is closed (no session was made) ---
    auto before_hello = [&](Cmd cmd, const std::vector<uint8_t>& p, const char* want,
                            const char* what) {
        RawClient c;
        ASSERT_TRUE(c.connect(next_addr()));
        expect_error(c, cmd, p, want, what);
        // A socket is closed so that unauthenticated connections hold no slot; a window's
        // session ends the same way (the guest attaches again to retry).
        EXPECT_TRUE(c.closed_by_server()) << what;
    };
    before_hello(Cmd::LIST_DEVICES, {}, "HELLO must be the first", "list before hello");
    before_hello(Cmd::BUFFER_ALLOC, payload([](wire::Writer& w) {
                     w.u32(0);
                     w.u8(0);
                     w.u64(64);
                 }),
                 "HELLO must be the first", "alloc before hello");
    before_hello(Cmd::GRAPH_COMPUTE, graph({}), "HELLO must be the first", "compute before hello");
    before_hello(Cmd::HELLO, payload([](wire::Writer& w) { w.u32(1); }), "malformed HELLO",
                 "truncated hello");
    {
        RawClient c;
        ASSERT_TRUE(c.connect(next_addr()));
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
        ASSERT_TRUE(plain.connect(next_addr()));
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
        // The newer block formats: half a Q3_K super-block is no row; a Q5_0 block (fp16
        // scale) at an odd offset is misaligned, while MXFP4's 17-byte blocks of bytes may sit
        // at any offset and stride.
        Entry q3 = leaf(Type::Q3_K, {256, 2}, h, 0);
        q3.ne[0] = 128;
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({q3}), "invalid", "partial q3_K super-block");
        expect_error(c, Cmd::GRAPH_COMPUTE, graph({leaf(Type::Q5_0, {32, 2}, h, 1)}), "not aligned",
                     "q5_0 at an odd offset");
        auto ok = c.request(Cmd::GRAPH_COMPUTE, graph({leaf(Type::MXFP4, {32, 3}, h, 1)}));
        ASSERT_TRUE(ok.ok);
        EXPECT_FALSE(ok.is_error()) << "mxfp4 at an odd offset: " << ok.message();
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

// Stripe connections (tcp): a STRIPE_JOIN must name a live session and show the key that
// session's HELLO reply carried, join in order, and come before STRIPES; STRIPES must match
// the joined connections; a session's own connection cannot join; unix sockets take none.
// Every refusal is an error reply, and a striped reply carries exactly the bytes asked for,
// stripe 0 behind its header and stripe 1 on the joined connection.
// A session opened with HELLO asking for stripes: its id and the key its reply ended with
// (ok: the reply granted kCapStripes and carried exactly that).
struct StripedHello {
    bool ok = false;
    uint64_t session = 0;
    std::vector<uint8_t> key;
};
StripedHello hello_with_stripes(RawClient& c) {
    StripedHello out;
    auto hello = c.hello("", remote::kProtocolVersion,
                         remote::kCapGraphCache | remote::kCapEvents | remote::kCapStripes);
    if (!hello.ok || hello.is_error()) return out;
    wire::Reader hr(hello.payload.data(), hello.payload.size());
    hr.u32();
    const bool granted = (hr.u64() & remote::kCapStripes) != 0;
    out.session = hr.u64();
    hr.str();
    const uint8_t* kp = hr.bytes(remote::kStripeKeyBytes);
    if (!granted || !kp || !hr.done()) return out;
    out.key.assign(kp, kp + remote::kStripeKeyBytes);
    out.ok = true;
    return out;
}

// A client of the first stripe layout (contiguous stripes, cap bit 3) gets neither that bit
// nor the interleaved one, and no key: it talks to this server without stripes, instead of
// reading chunks into the wrong places.
TEST(HostileTcp, FirstStripeLayoutIsNotGranted) {
    ServerProcess srv;
    std::string err;
    ASSERT_TRUE(srv.start("tcp:127.0.0.1:0", {"--device", "CPU"}, &err)) << err;
    RawClient c;
    ASSERT_TRUE(c.connect(srv.addr()));
    constexpr uint64_t kFirstLayout = 1ull << 3;
    static_assert(remote::kCapStripes != kFirstLayout);
    auto hello = c.hello("", remote::kProtocolVersion, remote::kCapGraphCache | kFirstLayout);
    ASSERT_TRUE(hello.ok && !hello.is_error()) << hello.message();
    wire::Reader hr(hello.payload.data(), hello.payload.size());
    hr.u32();
    const uint64_t caps = hr.u64();
    EXPECT_EQ(caps & (kFirstLayout | remote::kCapStripes), 0u);
    EXPECT_NE(caps & remote::kCapGraphCache, 0u);
    hr.u64();
    hr.str();
    EXPECT_TRUE(hr.done());  // no key
}

TEST(HostileTcp, StripeJoinsNeedTheSessionsKeyAndOrder) {
    ServerProcess srv;
    std::string err;
    ASSERT_TRUE(srv.start("tcp:127.0.0.1:0", {"--device", "CPU"}, &err)) << err;
    RawClient main;
    ASSERT_TRUE(main.connect(srv.addr()));
    const StripedHello mh = hello_with_stripes(main);
    ASSERT_TRUE(mh.ok);
    const uint64_t session = mh.session;
    const std::vector<uint8_t>& key = mh.key;
    auto join = [&](RawClient& c, uint64_t sid, std::vector<uint8_t> k, uint8_t index) {
        EXPECT_TRUE(c.connect(srv.addr()));
        return c.request(Cmd::STRIPE_JOIN, payload([&](wire::Writer& w) {
                             w.u32(remote::kProtocolVersion);
                             w.str("");
                             w.u64(sid);
                             w.bytes(k.data(), k.size());
                             w.u8(index);
                         }));
    };
    std::vector<uint8_t> wrong = key;
    wrong[5] ^= 1;
    const struct {
        uint64_t sid;
        std::vector<uint8_t> key;
        uint8_t index;
        const char* says;
    } bad[] = {{session, wrong, 1, "no session"},
               {session + 1000, key, 1, "no session"},
               {session, key, 2, "stripe 2, expected 1"},
               {session, key, 0, "stripe 0, expected 1"}};
    for (const auto& b : bad) {
        RawClient c;
        auto r = join(c, b.sid, b.key, b.index);
        ASSERT_TRUE(r.is_error()) << b.says;
        EXPECT_NE(r.message().find(b.says), std::string::npos) << r.message();
        EXPECT_TRUE(c.closed_by_server()) << b.says;
    }
    {  // A key that is too short: malformed.
        RawClient c;
        ASSERT_TRUE(c.connect(srv.addr()));
        auto r = c.request(Cmd::STRIPE_JOIN, payload([&](wire::Writer& w) {
                               w.u32(remote::kProtocolVersion);
                               w.str("");
                               w.u64(session);
                               w.bytes(key.data(), 8);
                           }));
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("malformed STRIPE_JOIN"), std::string::npos) << r.message();
    }
    {  // Another session takes at most kMaxStripes - 1 joined connections.
        RawClient other;
        ASSERT_TRUE(other.connect(srv.addr()));
        const StripedHello oh = hello_with_stripes(other);
        ASSERT_TRUE(oh.ok);
        std::vector<RawClient> joined(remote::kMaxStripes);
        for (int i = 1; i <= remote::kMaxStripes; i++) {
            auto r = join(joined[static_cast<size_t>(i - 1)], oh.session, oh.key,
                          static_cast<uint8_t>(i));
            if (i < remote::kMaxStripes) {
                EXPECT_FALSE(r.is_error()) << i << ": " << r.message();
            } else {
                ASSERT_TRUE(r.is_error());
                EXPECT_NE(r.message().find("of at most"), std::string::npos) << r.message();
            }
        }
    }
    // The session's own connection cannot join (nor send STRIPE_JOIN later).
    auto own = main.request(Cmd::STRIPE_JOIN, payload([&](wire::Writer& w) { w.u32(1); }));
    ASSERT_TRUE(own.is_error());
    RawClient lane;
    auto ok = join(lane, session, key, 1);
    ASSERT_TRUE(ok.ok && !ok.is_error()) << ok.message();
    auto stripes = [&](uint8_t n) {
        return main.request(Cmd::STRIPES, payload([&](wire::Writer& w) { w.u8(n); }));
    };
    for (uint8_t n : {3, 1, 9}) {
        auto r = stripes(n);
        ASSERT_TRUE(r.is_error()) << int{n};
        EXPECT_NE(r.message().find("STRIPES"), std::string::npos) << r.message();
    }
    auto on = stripes(2);
    ASSERT_TRUE(on.ok && !on.is_error()) << on.message();
    EXPECT_TRUE(stripes(2).is_error());  // once per session
    {
        RawClient late;
        auto r = join(late, session, key, 2);
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("already in use"), std::string::npos) << r.message();
    }
    // A striped read: a 1 MiB + 12 buffer of known bytes, read from offset 4.
    auto alloc = main.request(Cmd::BUFFER_ALLOC, payload([](wire::Writer& w) {
                                  w.u32(0);
                                  w.u8(remote::kBufferDevice);
                                  w.u64((1u << 20) + 12);
                              }));
    ASSERT_TRUE(alloc.ok && !alloc.is_error()) << alloc.message();
    const uint64_t h = u64_of(alloc.payload);
    std::vector<uint8_t> bytes((1u << 20) + 12);
    for (size_t i = 0; i < bytes.size(); i++) bytes[i] = static_cast<uint8_t>(i * 131 + 7);
    auto set = main.request(Cmd::TENSOR_SET, payload([&](wire::Writer& w) {
                                w.u64(h);
                                w.u64(0);
                                w.u64(bytes.size());
                                w.bytes(bytes.data(), bytes.size());
                            }));
    ASSERT_TRUE(set.ok && !set.is_error()) << set.message();
    const uint64_t len = (1u << 20) + 8;
    auto read_fd = [](int fd, void* p, size_t n) {  // both sockets time out after 10 s
        uint8_t* b = static_cast<uint8_t*>(p);
        while (n > 0) {
            const ssize_t k = ::recv(fd, b, n, 0);
            if (k <= 0) return false;
            b += k;
            n -= static_cast<size_t>(k);
        }
        return true;
    };
    ASSERT_TRUE(
        main.send_frame(static_cast<uint16_t>(Cmd::TENSOR_GET), payload([&](wire::Writer& w) {
                            w.u64(h);
                            w.u64(4);
                            w.u64(len);
                        })));
    uint8_t hdr[remote::kHeaderSize];
    ASSERT_TRUE(read_fd(main.fd(), hdr, sizeof(hdr)));
    const remote::Header rh = remote::read_header(hdr);
    EXPECT_EQ(rh.flags, remote::kFlagReply | remote::kFlagStriped);
    ASSERT_EQ(rh.len, len);
    std::vector<uint8_t> got(len);
    // Interleaved chunks: stripe 0's on the session's connection, stripe 1's on the lane.
    for (int i = 0; i < 2; i++) {
        remote::stripe_parts(len, 2, i, 0, len, [&](uint64_t off, uint64_t size) {
            ASSERT_TRUE(read_fd(i == 0 ? main.fd() : lane.fd(), got.data() + off, size));
        });
    }
    EXPECT_EQ(std::memcmp(got.data(), bytes.data() + 4, len), 0);
    // The session goes on; a smaller read is not striped.
    auto small = main.request(Cmd::TENSOR_GET, payload([&](wire::Writer& w) {
                                  w.u64(h);
                                  w.u64(0);
                                  w.u64(remote::kStripeMin - 1);
                              }));
    ASSERT_TRUE(small.ok && !small.is_error()) << small.message();
    EXPECT_EQ(small.h.flags, remote::kFlagReply);
    EXPECT_EQ(std::memcmp(small.payload.data(), bytes.data(), small.payload.size()), 0);
    // A client that closes a stripe connection loses its session: the stripe the server sends
    // next may still vanish into the socket buffers (the bytes are lost, the client never sees
    // the rest of that reply), the one after fails for certain (the peer reset the connection),
    // and the session ends with its connection closed. The server goes on serving others.
    lane.close();
    for (int i = 0; i < 2; i++) {
        ASSERT_TRUE(
            main.send_frame(static_cast<uint16_t>(Cmd::TENSOR_GET), payload([&](wire::Writer& w) {
                                w.u64(h);
                                w.u64(0);
                                w.u64(len);
                            })));
    }
    size_t drained = 0;
    ssize_t k = 0;
    std::vector<uint8_t> sink(1u << 16);
    while ((k = ::recv(main.fd(), sink.data(), sink.size(), 0)) > 0)
        drained += static_cast<size_t>(k);
    EXPECT_EQ(k, 0) << "the session's connection was not closed (recv: " << std::strerror(errno)
                    << ")";
    uint64_t mine = 0;  // stripe 0's bytes
    remote::stripe_parts(len, 2, 0, 0, len, [&](uint64_t, uint64_t size) { mine += size; });
    EXPECT_LE(drained, 2 * (remote::kHeaderSize + mine));  // never a lane's stripe here
    RawClient after;
    ASSERT_TRUE(after.connect(srv.addr()));
    auto ah = after.hello();
    EXPECT_TRUE(ah.ok && !ah.is_error()) << ah.message();

    // Unix sockets: no stripes offered, and a STRIPE_JOIN as the first frame is refused.
    const std::string dir = ferry::test::make_temp_dir();
    ServerProcess usrv;
    ASSERT_TRUE(usrv.start("unix:" + dir + "/u", {"--device", "CPU"}, &err)) << err;
    RawClient u;
    ASSERT_TRUE(u.connect(usrv.addr()));
    auto uh = u.hello("", remote::kProtocolVersion, remote::kCapGraphCache | remote::kCapStripes);
    ASSERT_TRUE(uh.ok && !uh.is_error());
    wire::Reader ur(uh.payload.data(), uh.payload.size());
    ur.u32();
    EXPECT_FALSE(ur.u64() & remote::kCapStripes);
    RawClient uj;
    ASSERT_TRUE(uj.connect(usrv.addr()));
    auto r = uj.request(Cmd::STRIPE_JOIN, payload([&](wire::Writer& w) { w.u32(1); }));
    ASSERT_TRUE(r.is_error());
    EXPECT_NE(r.message().find("HELLO must be the first request"), std::string::npos)
        << r.message();
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

// A frame larger than the session's memory budget has left (--max-memory 64 MiB here) is read
// and dropped in small pieces, never staged: the server's peak memory does not grow by the
// frame, the client gets an error naming the limit, and its session carries on. Every
// transport runs the same frame loop, so the window drops it as a socket does.
TEST_P(Hostile, AFrameLargerThanTheBudgetIsDroppedNotStaged) {
    RawClient c = connect_hello();
    const long hwm0 = srv_.status_kib("VmHWM");
    ASSERT_GT(hwm0, 0);
    const size_t frame = 96u << 20;
    std::vector<uint8_t> p(frame, 0x5a);
    expect_error(c, Cmd::GRAPH_COMPUTE, p, "exceeds what the session memory limit has left",
                 "a 96 MiB frame");
    const long grew_kib = srv_.status_kib("VmHWM") - hwm0;
    std::printf("[%s] server peak memory +%ld KiB for a %zu MiB frame\n", GetParam().c_str(),
                grew_kib, frame >> 20);
    EXPECT_LT(grew_kib, 16 << 10) << "the frame was staged in server memory";
    auto r = c.request(Cmd::PING, {});
    EXPECT_TRUE(r.ok && !r.is_error()) << "the session carries on: " << r.message();
}

INSTANTIATE_TEST_SUITE_P(Transports, Hostile, ::testing::Values("unix", "tcp", "ivshmem"));

// ---------------------------------------------------------------------------------------------
// Hardening, round two (issue 9): one test per class of finding, each over unix and tcp,
// each ending with the server alive and a concurrent good client served correctly. The
// server's resident memory is measured around each attack (VmHWM growth) and must stay within
// --max-memory plus a fixed allowance.

constexpr uint64_t kBudget = 1u << 20;  // --max-memory of these servers
// Fixed allowance over --max-memory for the server's resident memory under one attacker: its
// frame buffer (up to the budget's room + 1 MiB, kept up to 4 MiB), thread stacks, the good
// client's session and allocator slack.
[[maybe_unused]] constexpr long kAllowanceKiB = 48 * 1024;  // unused under ASan (no RSS check)

// SESSION_STATS fields (0-based).
enum Stat {
    kStatServerSessions = 8,
    kStatCharged = 11,
    kStatBufferCharge = 12,
    kStatScratch = 13,
    kStatCacheBytes = 14,
    kStatCacheEntries = 15,
    kStatMaxMemory = 17,
};

Entry with_strides(Entry e, std::initializer_list<uint64_t> nb) {
    int i = 0;
    for (uint64_t n : nb) e.nb[i++] = n;
    return e;
}

class Hardening : public ::testing::TestWithParam<std::string> {
  protected:
    void start(std::vector<std::string> extra = {}) {
        dir_ = ferry::test::make_temp_dir();
        const std::string listen =
            GetParam() == "unix" ? "unix:" + dir_ + "/h" : std::string("tcp:127.0.0.1:0");
        std::vector<std::string> args = {"--max-memory",
                                         std::to_string(kBudget),
                                         "--max-work",
                                         std::to_string(1ull << 38),
                                         "--io-timeout",
                                         "2",
                                         "--hello-timeout",
                                         "1",
                                         "-t",
                                         "2"};
        for (auto& e : extra) args.push_back(e);
        std::string err;
        ASSERT_TRUE(srv_.start(listen, args, &err)) << err;
        good_ = std::make_unique<GoodClient>(srv_.addr());
        good_->start();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its session is up
        rss0_ = srv_.status_kib("VmRSS");
    }
    void TearDown() override {
        if (!good_) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        good_->stop();
        EXPECT_EQ(good_->failures(), 0) << good_->first_error();
        EXPECT_GT(good_->iterations(), 0);
        EXPECT_TRUE(srv_.alive());
        // A fresh client is served correctly after the attack.
        RawClient c = hello();
        EXPECT_EQ(c.stat(kStatMaxMemory), kBudget);
        const long hwm = srv_.status_kib("VmHWM");
        std::printf(
            "[%s %s] server RSS %ld KiB before the attack, peak %ld KiB (+%ld KiB; "
            "--max-memory %llu KiB); good client ran %d steps\n",
            ::testing::UnitTest::GetInstance()->current_test_info()->name(), GetParam().c_str(),
            rss0_, hwm, hwm - rss0_, static_cast<unsigned long long>(kBudget / 1024),
            good_->iterations());
#if !defined(__SANITIZE_ADDRESS__)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer)
        EXPECT_LE(hwm - rss0_, static_cast<long>(kBudget / 1024) + kAllowanceKiB);
#endif
#else
        EXPECT_LE(hwm - rss0_, static_cast<long>(kBudget / 1024) + kAllowanceKiB);
#endif
#endif
    }
    RawClient hello() {
        RawClient c;
        EXPECT_TRUE(c.connect(srv_.addr()));
        auto r = c.hello();
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        return c;
    }
    uint64_t alloc(RawClient& c, uint64_t size, RawClient::Reply* out = nullptr) {
        auto r = c.request(Cmd::BUFFER_ALLOC, payload([&](wire::Writer& w) {
                               w.u32(0);
                               w.u8(remote::kBufferDevice);
                               w.u64(size);
                           }));
        if (out) *out = r;
        return r.ok && !r.is_error() && r.payload.size() >= 8 ? u64_of(r.payload) : 0;
    }
    void expect_error(RawClient& c, Cmd cmd, const std::vector<uint8_t>& p, const char* want,
                      const char* what) {
        auto r = c.request(cmd, p);
        ASSERT_TRUE(r.ok) << what << ": no reply (server down?)";
        ASSERT_TRUE(r.is_error()) << what << ": accepted";
        EXPECT_NE(r.message().find(want), std::string::npos)
            << what << ": message '" << r.message() << "' lacks '" << want << "'";
    }

    std::string dir_;
    ServerProcess srv_;
    std::unique_ptr<GoodClient> good_;
    long rss0_ = 0;
};

// 1. Element counts that overflow int64: a stride-0 leaf whose shape product wraps to the
// destination's element count must not pass validation (the copy kernel would walk the
// declared rows far past the destination).
TEST_P(Hardening, ShapeProductsThatOverflowAreRefused) {
    start();
    RawClient c = hello();
    const uint64_t dst_h = alloc(c, 4096), src_h = alloc(c, 4096);
    ASSERT_TRUE(dst_h && src_h);
    // 1024 * 3 * 0x2AAAAAAAAAAAAB = 1024 * (2^55 + 1) = 1024 (mod 2^64).
    const Entry dst = leaf(Type::F32, {1024}, dst_h, 0);
    Entry src = with_strides(leaf(Type::F32, {1024}, src_h, 0), {4, 0, 0, 0});
    src.ne[1] = 3;
    src.ne[2] = 0x2AAAAAAAAAAAABll;
    Entry cpy = dst;
    cpy.handle = 0;
    cpy.op = static_cast<uint32_t>(Op::CPY);
    cpy.src[0] = 1;
    cpy.src[1] = 0;
    cpy.view_src = 0;
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({dst, src, cpy}), "overflow", "wrapped CPY");
    // The same through SUPPORTS_OP (no storage) and as a view whose extents exceed its bytes.
    {
        wire::Writer w;
        w.u32(0);
        w.u32(3);
        for (const Entry& e : {dst, src, cpy}) remote::write_entry(w, e);
        expect_error(c, Cmd::SUPPORTS_OP, w.buf(), "overflow", "wrapped CPY query");
    }
    Entry big = with_strides(leaf(Type::F32, {1ll << 62, 4}, src_h, 0), {4, 0, 0, 0});
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({big}), "overflow", "2^64 elements");
    Entry overlap = with_strides(leaf(Type::F32, {1024, 1024}, src_h, 0), {4, 4, 0, 0});
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({overlap}), "extents exceed", "overlapping rows");
    // A broadcast on purpose (stride 0, sensible count) still works.
    Entry bcast = with_strides(leaf(Type::F32, {1024, 4}, src_h, 0), {4, 0, 0, 0});
    auto r = c.request(Cmd::GRAPH_COMPUTE, graph({bcast}));
    EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
}

// 2. Zero-size and tiny buffers: each is charged whole pages (at least one) and counted, so
// a flood of them runs into the session's memory limit instead of the kernel's map count.
TEST_P(Hardening, EveryBufferIsChargedItsPages) {
    start();
    RawClient c = hello();
    ASSERT_NE(alloc(c, 1), 0u);
    EXPECT_EQ(c.stat(kStatBufferCharge), 4096u) << "a 1-byte buffer is charged its page";
    int n = 1;
    RawClient::Reply r;
    while (n < 10000 && alloc(c, 0, &r) != 0) n++;
    ASSERT_TRUE(r.ok) << "server down?";
    ASSERT_TRUE(r.is_error()) << "10000 zero-byte buffers accepted";
    EXPECT_NE(r.message().find("session memory limit"), std::string::npos) << r.message();
    EXPECT_EQ(static_cast<uint64_t>(n), kBudget / 4096) << "buffers that fit";
    EXPECT_LE(c.stat(kStatCharged), kBudget);
    EXPECT_EQ(c.stat(kStatBufferCharge), kBudget);
}

// 3. Unbounded compute: attention over a stride-0 KV of 2^40 positions is refused up front by
// the work budget; one within the budget but long is stopped when its client disconnects.
Entry attention_graph(std::vector<Entry>* es, uint64_t h, int64_t n_kv) {
    const Entry q = leaf(Type::F32, {64, 1, 1, 1}, h, 0);
    const Entry k = with_strides(leaf(Type::F32, {64, n_kv, 1, 1}, h, 256), {4, 0, 256, 256});
    const Entry v = with_strides(leaf(Type::F32, {64, n_kv, 1, 1}, h, 512), {4, 0, 256, 256});
    Entry out = leaf(Type::F32, {64, 1, 1, 1}, h, 1024);
    out.op = static_cast<uint32_t>(Op::FLASH_ATTN_EXT);
    out.src[0] = 0;
    out.src[1] = 1;
    out.src[2] = 2;
    const float scale = 0.125f;
    std::memcpy(&out.op_params[0], &scale, 4);
    *es = {q, k, v, out};
    return out;
}

TEST_P(Hardening, ComputeIsBoundedAndStopsWithItsClient) {
    start();
    RawClient c = hello();
    const uint64_t h = alloc(c, 4096);
    ASSERT_NE(h, 0u);
    std::vector<Entry> es;
    attention_graph(&es, h, 1ll << 40);
    expect_error(c, Cmd::GRAPH_COMPUTE, graph(es), "--max-work", "attention over 2^40");
    // 2^30 positions (about 1.4e11 operations, inside the budget): minutes of work, unless
    // the server notices its client left.
    attention_graph(&es, h, 1ll << 30);
    RawClient watcher = hello();
    const uint64_t sessions = watcher.stat(kStatServerSessions);
    ASSERT_TRUE(c.send_frame(static_cast<uint16_t>(Cmd::GRAPH_COMPUTE), graph(es)));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    pollfd p{c.fd(), POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 0), 0) << "the compute already answered: it was not a long one";
    c.close();
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t now = sessions;
    while (now >= sessions && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        now = watcher.stat(kStatServerSessions);
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(now, sessions) << "the session outlived its client";
    EXPECT_LT(waited, 5.0) << "the compute went on after its client left";
    std::printf("compute stopped %.3f s after its client disconnected\n", waited);
}

// ---------------------------------------------------------------------------------------------
// The ivshmem window's deadlines (issues 9 and 13): a window has no socket to close, so the
// host ends a session by its deadlines and by the guest's epoch and heartbeat. Each test uses
// windows of its own: w1 for the guest under test, w2 for a watcher that reads the server's
// totals through SESSION_STATS.

enum ServerStat { kStatServerSessionsNow = 8, kStatServerBytesNow = 9 };

class IvshmemDeadlines : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = ferry::test::make_temp_dir();
        std::string err;
        ASSERT_TRUE(
            srv_.start(addr(1) + ",size=1M",
                       {"--listen", addr(2) + ",size=1M", "--hello-timeout", "1", "--io-timeout",
                        "2", "--max-work", std::to_string(1ull << 38), "-t", "2"},
                       &err))
            << err;
        ASSERT_TRUE(watcher_.connect(addr(2)));
        ASSERT_TRUE(watcher_.hello().ok);
        base_bytes_ = watcher_.stat(kStatServerBytesNow);
        base_sessions_ = watcher_.stat(kStatServerSessionsNow);
    }
    std::string addr(int i) const { return "ivshmem:" + dir_ + "/w" + std::to_string(i); }
    // Seconds until the server is back to the watcher's baseline (sessions and bytes), at
    // most `limit` s; the time waited is returned either way.
    double until_baseline(double limit) {
        const auto t0 = std::chrono::steady_clock::now();
        for (;;) {
            const double t =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if ((watcher_.stat(kStatServerSessionsNow) == base_sessions_ &&
                 watcher_.stat(kStatServerBytesNow) == base_bytes_) ||
                t > limit) {
                return t;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    bool at_baseline() {
        return watcher_.stat(kStatServerSessionsNow) == base_sessions_ &&
               watcher_.stat(kStatServerBytesNow) == base_bytes_;
    }
    uint64_t alloc(RawClient& c, uint64_t size) {
        auto r = c.request(Cmd::BUFFER_ALLOC, payload([&](wire::Writer& w) {
                               w.u32(0);
                               w.u8(remote::kBufferDevice);
                               w.u64(size);
                           }));
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        return r.ok && !r.is_error() && r.payload.size() >= 8 ? u64_of(r.payload) : 0;
    }
    // The window serves a fresh guest correctly afterwards.
    void expect_window_serves_again() {
        RawClient c;
        ASSERT_TRUE(c.connect(addr(1)));
        auto r = c.hello();
        ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
        r = c.request(Cmd::PING, {});
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        EXPECT_TRUE(srv_.alive());
    }

    std::string dir_;
    ServerProcess srv_;
    RawClient watcher_;
    uint64_t base_bytes_ = 0, base_sessions_ = 0;
};

// A guest that attaches and never says HELLO loses the session at the hello deadline (1 s),
// before it holds anything; its window serves the next guest.
TEST_F(IvshmemDeadlines, SilentGuestIsDroppedAtTheHelloDeadline) {
    RawClient c;
    ASSERT_TRUE(c.connect(addr(1)));
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(c.closed_by_server()) << "a guest without HELLO kept its session";
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("silent guest dropped after %.2f s (--hello-timeout 1)\n", t);
    EXPECT_GT(t, 0.5);
    EXPECT_LT(t, 3.0);
    // A HELLO trickled a byte at a time past the deadline is refused the same way.
    RawClient slow;
    ASSERT_TRUE(slow.connect(addr(1)));
    wire::Writer w;
    w.u32(remote::kProtocolVersion);
    w.u64(0);
    w.str("");
    remote::Header h;
    h.cmd = static_cast<uint16_t>(Cmd::HELLO);
    h.id = 1;
    h.len = w.size();
    std::vector<uint8_t> frame(remote::kHeaderSize);
    remote::write_header(frame.data(), h);
    frame.insert(frame.end(), w.buf().begin(), w.buf().end());
    size_t sent = 0;
    const auto t1 = std::chrono::steady_clock::now();
    while (sent < frame.size() && slow.ring()->check_alive()) {
        ASSERT_TRUE(slow.send_raw(&frame[sent++], 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    EXPECT_LT(sent, frame.size()) << "a HELLO trickled over " << frame.size() * 0.2
                                  << " s was accepted";
    auto r = slow.read_reply();
    ASSERT_TRUE(r.is_error()) << "no error for the late HELLO";
    EXPECT_NE(r.message().find("no HELLO within"), std::string::npos) << r.message();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 3.0);
    EXPECT_TRUE(at_baseline());
    expect_window_serves_again();
}

// Once a frame has begun, all of it must arrive within the I/O deadline (2 s): a byte every
// 300 ms (which a per-gap timeout would allow for 20 s) ends the session at the deadline, and
// the buffer the guest allocated is freed with it.
TEST_F(IvshmemDeadlines, TrickledFrameEndsAtTheFrameDeadlineAndFreesItsMemory) {
    RawClient c;
    ASSERT_TRUE(c.connect(addr(1)));
    ASSERT_TRUE(c.hello().ok);
    ASSERT_NE(alloc(c, 256u << 10), 0u);
    EXPECT_GE(watcher_.stat(kStatServerBytesNow), base_bytes_ + (256u << 10));
    remote::Header h;
    h.cmd = static_cast<uint16_t>(Cmd::PING);
    h.id = 99;
    h.len = 64;
    uint8_t frame[remote::kHeaderSize + 64] = {};
    remote::write_header(frame, h);
    const auto t0 = std::chrono::steady_clock::now();
    size_t sent = 0;
    while (sent < sizeof(frame) && c.ring()->check_alive()) {
        ASSERT_TRUE(c.send_raw(&frame[sent++], 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    auto r = c.read_reply();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r.is_error()) << "no error for the stalled frame";
    EXPECT_NE(r.message().find("timed out"), std::string::npos) << r.message();
    EXPECT_LT(sent, sizeof(frame)) << "the trickled frame was taken in full";
    std::printf("trickled frame ended after %.2f s, %zu of %zu bytes (--io-timeout 2)\n", t, sent,
                sizeof(frame));
    EXPECT_LT(t, 4.0);
    EXPECT_TRUE(c.closed_by_server());
    EXPECT_LT(until_baseline(2.0), 2.0) << "the session's buffer outlived it";
    expect_window_serves_again();
}

// A long compute (attention over 2^30 stride-0 positions: minutes of work, inside the work
// budget) stops once its guest is gone: when it detaches, and when it is killed (a VM that
// died: no detach, its heartbeat stops) within the I/O timeout.
TEST_F(IvshmemDeadlines, ComputeStopsWhenItsGuestIsGone) {
    for (const bool kill_it : {false, true}) {
        SCOPED_TRACE(kill_it ? "killed guest" : "detached guest");
        int ready[2];
        ASSERT_EQ(pipe(ready), 0);
        const pid_t child = fork();
        if (child == 0) {
            // The guest: a process of its own, so that killing it stops its heartbeat.
            close(ready[0]);
            RawClient c;
            if (!c.connect(addr(1)) || !c.hello().ok) _exit(1);
            auto a = c.request(Cmd::BUFFER_ALLOC, payload([](wire::Writer& w) {
                                   w.u32(0);
                                   w.u8(remote::kBufferDevice);
                                   w.u64(4096);
                               }));
            if (!a.ok || a.is_error()) _exit(2);
            std::vector<Entry> es;
            attention_graph(&es, u64_of(a.payload), 1ll << 30);
            if (!c.send_frame(static_cast<uint16_t>(Cmd::GRAPH_COMPUTE), graph(es))) _exit(3);
            std::this_thread::sleep_for(std::chrono::milliseconds(700));
            const char answered = c.ring()->readable() ? 'A' : 'R';
            (void)!write(ready[1], &answered, 1);
            if (!kill_it) {
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                c.shutdown_write();
            }
            pause();
            _exit(0);
        }
        close(ready[1]);
        char answered = 0;
        ASSERT_EQ(read(ready[0], &answered, 1), 1) << "the guest failed before its compute";
        close(ready[0]);
        EXPECT_EQ(answered, 'R') << "the compute already answered: it was not a long one";
        EXPECT_EQ(watcher_.stat(kStatServerSessionsNow), base_sessions_ + 1);
        if (kill_it) kill(child, SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const double t = until_baseline(30.0);
        std::printf("%s: its compute stopped and its session was freed after %.2f s\n",
                    kill_it ? "guest killed" : "guest detached", t);
        EXPECT_TRUE(at_baseline()) << "the session outlived its guest";
        // Detached: the next poll (10 ms) stops it; killed: the heartbeat's 2 s timeout.
        EXPECT_LT(t, kill_it ? 4.0 : 1.5);
        kill(child, SIGKILL);
        waitpid(child, nullptr, 0);
        expect_window_serves_again();
    }
}

// 4. Kernel scratch: a product whose second operand declares many stride-0 columns would size
// the CPU scratch from the declared shape (hundreds of MB against a 1 MiB budget); the scratch
// is limited to what the budget has left and charged.
TEST_P(Hardening, KernelScratchIsLimitedAndCharged) {
    start();
    RawClient c = hello();
    const uint64_t w_h = alloc(c, 8192), b_h = alloc(c, 16384), o_h = alloc(c, 256 << 10);
    ASSERT_TRUE(w_h && b_h && o_h);
    Entry a = leaf(Type::Q8_0, {4096, 1}, w_h, 0);
    Entry b = with_strides(leaf(Type::F32, {4096, 1 << 16}, b_h, 0), {4, 0, 0, 0});
    Entry out = leaf(Type::F32, {1, 1 << 16}, o_h, 0);
    out.op = static_cast<uint32_t>(Op::MUL_MAT);
    out.src[0] = 0;
    out.src[1] = 1;
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({a, b, out}), "scratch", "mul_mat scratch");
    // TOP_K's candidates live in the scratch too: k = 32Ki of a 32Ki row asks 512 KiB a thread.
    const uint64_t row_h = alloc(c, 128 << 10), top_h = alloc(c, 256 << 10);
    ASSERT_TRUE(row_h && top_h);
    Entry row = leaf(Type::F32, {1 << 15, 1}, row_h, 0);
    Entry top = leaf(Type::F32, {2 << 15, 1}, top_h, 0);
    top.op = static_cast<uint32_t>(Op::TOP_K);
    top.op_params[0] = 1 << 15;
    top.src[0] = 0;
    expect_error(c, Cmd::GRAPH_COMPUTE, graph({row, top}), "scratch", "top_k scratch");
    // Attention rows are bounded by real bytes; a small one runs, and its scratch is charged.
    std::vector<Entry> es;
    attention_graph(&es, w_h, 64);
    auto r = c.request(Cmd::GRAPH_COMPUTE, graph(es));
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    const uint64_t scratch = c.stat(kStatScratch);
    EXPECT_GT(scratch, 0u);
    EXPECT_LE(c.stat(kStatCharged), kBudget);
    EXPECT_EQ(c.stat(kStatCharged), c.stat(kStatBufferCharge) + scratch + c.stat(kStatCacheBytes));
}

// 5. The graph cache: cached tables are charged (bytes and deserialized tensors); older ones
// make room, a table the budget cannot hold is refused, and a frame larger than the budget
// has left is dropped unread-into-memory.
TEST_P(Hardening, CachedGraphsAreCharged) {
    start();
    RawClient c = hello();
    const uint64_t h = alloc(c, 4096);
    ASSERT_NE(h, 0u);
    for (int g = 0; g < 16; g++) {
        std::vector<Entry> es(1000, leaf(Type::F32, {16}, h, static_cast<uint64_t>(g) * 64));
        auto r = c.request(Cmd::GRAPH_COMPUTE, graph(es));
        ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
        ASSERT_LE(c.stat(kStatCharged), kBudget) << "graph " << g;
    }
    EXPECT_LT(c.stat(kStatCacheEntries), 16u) << "older graphs made room";
    EXPECT_GT(c.stat(kStatCacheBytes), 0u);
    std::vector<Entry> es(3000, leaf(Type::F32, {16}, h, 0));
    expect_error(c, Cmd::GRAPH_COMPUTE, graph(es), "session memory limit", "3000 entries");
    es.assign(20000, leaf(Type::F32, {16}, h, 0));
    expect_error(c, Cmd::GRAPH_COMPUTE, graph(es), "exceeds what the session memory limit",
                 "a 3 MB frame");
    auto r = c.request(Cmd::PING, {});
    EXPECT_TRUE(r.ok && !r.is_error()) << "the session carries on";
}

// 6. Connections: HELLO within a deadline before a slot is taken; silent connections do not
// lock out a client with the token; a per-frame deadline; small frames before HELLO.
TEST_P(Hardening, ConnectionsMustAuthenticateQuicklyAndFramesHaveDeadlines) {
    start({"--max-sessions", "4"});
    // Forty connections that never send anything.
    std::vector<std::unique_ptr<RawClient>> silent;
    for (int i = 0; i < 40; i++) {
        silent.push_back(std::make_unique<RawClient>());
        ASSERT_TRUE(silent.back()->connect(srv_.addr()));
    }
    // The client that speaks is served at once (the good client holds one of the 4 slots).
    for (int i = 0; i < 3; i++) {
        RawClient c;
        ASSERT_TRUE(c.connect(srv_.addr()));
        auto r = c.hello();
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
    }
    // Silent connections are closed within the HELLO deadline (1 s).
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& s : silent) EXPECT_TRUE(s->closed_by_server());
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4.0);
    // A huge frame before HELLO is refused without being read.
    {
        RawClient c;
        ASSERT_TRUE(c.connect(srv_.addr()));
        ASSERT_TRUE(c.send_frame(static_cast<uint16_t>(Cmd::HELLO), {}, 0, 256ull << 20));
        auto r = c.read_reply();
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("at most 4096 bytes"), std::string::npos) << r.message();
        EXPECT_TRUE(c.closed_by_server());
    }
    // A frame trickled a byte at a time: the deadline covers the whole frame (io-timeout 2 s),
    // not each gap.
    {
        RawClient c = hello();
        remote::Header hd;
        hd.cmd = static_cast<uint16_t>(Cmd::PING);
        hd.len = 100;
        uint8_t hdr[remote::kHeaderSize];
        remote::write_header(hdr, hd);
        ASSERT_TRUE(c.send_raw(hdr, sizeof(hdr)));
        const auto t1 = std::chrono::steady_clock::now();
        bool closed = false;
        for (int i = 0; i < 100 && !closed; i++) {
            const uint8_t byte = 0;
            closed = !c.send_raw(&byte, 1);
            if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(250));
            pollfd p{c.fd(), POLLIN, 0};
            if (poll(&p, 1, 0) > 0) break;  // the server answered (timed out) and closed
        }
        auto r = c.read_reply();
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("timed out"), std::string::npos) << r.message();
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
        EXPECT_LT(took, 4.0) << "a trickle kept the frame open";
    }
}

// Per-client limits cannot be sidestepped by another loopback source address (tcp).
TEST(HostileTcp, AllOfLoopbackIsOneClient) {
    ServerProcess srv;
    std::string err;
    ASSERT_TRUE(srv.start("tcp:127.0.0.1:0", {"--max-sessions-per-client", "2"}, &err)) << err;
    const std::string addr = srv.addr();
    const uint16_t port = static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
    auto from = [&](const char* src) {
        RawClient c;
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        inet_pton(AF_INET, src, &a.sin_addr);
        EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << src;
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(port);
        inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
        EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
        c.adopt(remote::Socket(fd));
        return c;
    };
    RawClient a = from("127.0.0.2"), b = from("127.0.0.3");
    EXPECT_FALSE(a.hello().is_error());
    EXPECT_FALSE(b.hello().is_error());
    RawClient c = from("127.0.0.4");
    auto r = c.hello();
    ASSERT_TRUE(r.is_error());
    EXPECT_NE(r.message().find("server busy: loopback has 2 sessions"), std::string::npos)
        << r.message();
    EXPECT_TRUE(srv.alive());
}

// Protocol version 2: ALLOC_SIZE and INIT_TENSOR are validated like any table entry, and a
// version 1 client still gets the 11-field SESSION_STATS it expects.
TEST_P(Hardening, AllocSizeAndInitTensorAreValidated) {
    start();
    RawClient c = hello();
    const uint64_t h = alloc(c, 4096);
    ASSERT_NE(h, 0u);
    auto alloc_size = [&](const Entry& e) {
        return c.request(Cmd::ALLOC_SIZE, payload([&](wire::Writer& w) {
                             w.u32(0);
                             w.u8(remote::kBufferDevice);
                             remote::write_entry(w, e);
                         }));
    };
    auto r = alloc_size(leaf(Type::Q8_0, {64, 2}, 0, 0));
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    EXPECT_EQ(u64_of(r.payload), 2u * 2 * 34);
    Entry wrapped = with_strides(leaf(Type::F32, {1024}, 0, 0), {4, 0, 0, 0});
    wrapped.ne[1] = 3;
    wrapped.ne[2] = 0x2AAAAAAAAAAAABll;
    r = alloc_size(wrapped);
    ASSERT_TRUE(r.is_error());
    EXPECT_NE(r.message().find("overflow"), std::string::npos) << r.message();
    auto init = [&](uint64_t handle, const Entry& e) {
        return c.request(Cmd::INIT_TENSOR, payload([&](wire::Writer& w) {
                             w.u64(handle);
                             remote::write_entry(w, e);
                         }));
    };
    r = init(h, leaf(Type::F32, {1024}, h, 0));
    EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
    r = init(h, leaf(Type::F32, {1024}, h, 4));
    ASSERT_TRUE(r.is_error());
    EXPECT_NE(r.message().find("reaches past its buffer"), std::string::npos) << r.message();
    r = init(h + 1000, leaf(Type::F32, {16}, h + 1000, 0));
    ASSERT_TRUE(r.is_error());
    EXPECT_NE(r.message().find("unknown buffer handle"), std::string::npos) << r.message();
    RawClient v1;
    ASSERT_TRUE(v1.connect(srv_.addr()));
    r = v1.hello("", 1);
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    EXPECT_EQ(u64_of(r.payload) & 0xffffffffu, 1u) << "answered as version 1";
    r = v1.request(Cmd::SESSION_STATS, {});
    ASSERT_TRUE(r.ok && !r.is_error());
    EXPECT_EQ(r.payload.size(), 11u * 8);
}

// Protocol version 3: PREPARE_WEIGHTS checks its entries as graph leaves with storage, and a
// version 2 client never gets it (nor the device caps bit that asks for it).
TEST_P(Hardening, PrepareWeightsIsValidatedAndVersionGated) {
    start();
    RawClient c = hello();
    const uint64_t h = alloc(c, 4096);
    ASSERT_NE(h, 0u);
    auto prepare = [&](uint32_t dev, uint32_t count, const std::vector<Entry>& es) {
        return c.request(Cmd::PREPARE_WEIGHTS, payload([&](wire::Writer& w) {
                             w.u32(dev);
                             w.u32(count);
                             for (const Entry& e : es) remote::write_entry(w, e);
                         }));
    };
    const Entry good = leaf(Type::F32, {1024}, h, 0);
    auto r = prepare(0, 1, {good});
    EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
    auto refused = [&](const RawClient::Reply& rr, const char* what) {
        ASSERT_TRUE(rr.is_error()) << what;
        EXPECT_NE(rr.message().find(what), std::string::npos) << rr.message();
    };
    refused(prepare(0, 1, {leaf(Type::F32, {1024}, h, 4)}), "reaches past its buffer");
    refused(prepare(0, 1, {leaf(Type::F32, {16}, h + 1000, 0)}), "unknown buffer handle");
    refused(prepare(0, 0, {}), "0 weights (1..65536)");
    refused(prepare(0, 70000, {good}), "70000 weights (1..65536)");
    refused(prepare(0, 2, {good}), "weight table size does not match its count");
    refused(prepare(9, 1, {good}), "device index 9 out of range");
    Entry node = good;
    node.op = static_cast<uint32_t>(Op::CONT);
    node.src[0] = 0;
    refused(prepare(0, 2, {good, node}), "a weight must be a leaf");
    Entry wrapped = with_strides(leaf(Type::F32, {1024}, h, 0), {4, 0, 0, 0});
    wrapped.ne[1] = 3;
    wrapped.ne[2] = 0x2AAAAAAAAAAAABll;
    refused(prepare(0, 1, {wrapped}), "overflow");
    // The session goes on: a good request after the bad ones.
    r = prepare(0, 1, {good});
    EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
    RawClient v2;
    ASSERT_TRUE(v2.connect(srv_.addr()));
    r = v2.hello("", 2);
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    r = v2.request(Cmd::PREPARE_WEIGHTS, payload([&](wire::Writer& w) {
                       w.u32(0);
                       w.u32(1);
                       remote::write_entry(w, leaf(Type::F32, {16}, 0, 0));
                   }));
    refused(r, "unknown command 23");
    EXPECT_TRUE(srv_.alive());
}

// Protocol version 4: a GRAPH_COMPUTE carrying the step's input writes (kGraphInputs). Every
// input is checked before any is applied; a version 3 client cannot use the section.
TEST_P(Hardening, ComputeInputsAreCheckedBeforeAnyIsAppliedAndVersionGated) {
    start();
    RawClient c = hello();
    const uint64_t h = alloc(c, 4096);
    ASSERT_NE(h, 0u);
    struct In {
        uint64_t handle, off, size;
        std::vector<uint8_t> data;
    };
    auto floats = [](float first) {
        std::vector<uint8_t> d(64);
        for (int i = 0; i < 16; i++) {
            const float v = first + static_cast<float>(i);
            std::memcpy(d.data() + 4 * i, &v, 4);
        }
        return d;
    };
    // The graph: y (offset 1024) = CONT(x (offset 0)), 16 floats.
    Entry x = leaf(Type::F32, {16}, h, 0);
    Entry y = leaf(Type::F32, {16}, h, 1024);
    y.op = static_cast<uint32_t>(Op::CONT);
    y.src[0] = 0;
    auto compute = [&](RawClient& cl, const std::vector<In>& ins, int64_t count = -1,
                       int64_t table_count = 2) {
        return cl.request(
            Cmd::GRAPH_COMPUTE, payload([&](wire::Writer& w) {
                w.u32(0);
                w.u8(remote::kGraphFull | remote::kGraphInputs);
                w.u32(count < 0 ? static_cast<uint32_t>(ins.size()) : static_cast<uint32_t>(count));
                for (const In& in : ins) {
                    w.u64(in.handle);
                    w.u64(in.off);
                    w.u64(in.size);
                    w.bytes(in.data.data(), in.data.size());
                }
                w.u32(static_cast<uint32_t>(table_count));
                remote::write_entry(w, x);
                remote::write_entry(w, y);
            }));
    };
    auto read = [&](uint64_t off) {
        auto r = c.request(Cmd::TENSOR_GET, payload([&](wire::Writer& w) {
                               w.u64(h);
                               w.u64(off);
                               w.u64(64);
                           }));
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        return r.payload;
    };
    auto refused = [&](const RawClient::Reply& rr, const char* what) {
        ASSERT_TRUE(rr.is_error()) << what;
        EXPECT_NE(rr.message().find(what), std::string::npos) << rr.message();
    };
    // Good: the input is written, then the graph copies it.
    auto r = compute(c, {{h, 0, 64, floats(1)}});
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    EXPECT_EQ(read(1024), floats(1));
    // A bad input after a good one: nothing is written, nothing computed.
    refused(compute(c, {{h, 0, 64, floats(100)}, {h, 4090, 16, std::vector<uint8_t>(16)}}),
            "input 1: range [4090, +16) is outside the buffer of 4096 bytes");
    EXPECT_EQ(read(0), floats(1));
    refused(compute(c, {{h, 0, 64, floats(100)}, {h + 1000, 0, 64, floats(2)}}),
            "input 1: unknown buffer handle");
    refused(compute(c, {{h, UINT64_MAX - 8, 16, std::vector<uint8_t>(16)}}),
            "is outside the buffer");
    refused(c.request(Cmd::GRAPH_COMPUTE, payload([&](wire::Writer& w) {
                          w.u32(0);
                          w.u8(remote::kGraphFull | remote::kGraphInputs);
                          w.u32(1);
                          w.u64(h);
                          w.u64(0);
                          w.u64(64);
                          w.bytes(floats(100).data(), 10);  // and nothing after
                      })),
            "input 0: truncated");
    refused(compute(c, {{h, 0, UINT64_MAX, {}}}), "input 0: truncated");
    refused(compute(c, {}), "0 inputs (1..256)");
    refused(compute(c, {{h, 0, 64, floats(100)}}, 300), "300 inputs (1..256)");
    EXPECT_EQ(read(0), floats(1));
    EXPECT_EQ(read(1024), floats(1));
    // Inputs are applied before the table is read, as TENSOR_SETs sent just before it would
    // be: a bad table leaves them written and computes nothing.
    refused(compute(c, {{h, 0, 64, floats(7)}}, -1, 3), "table size does not match its count");
    EXPECT_EQ(read(0), floats(7));
    EXPECT_EQ(read(1024), floats(1));
    // The session goes on.
    r = compute(c, {{h, 0, 64, floats(9)}});
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    EXPECT_EQ(read(1024), floats(9));
    // Version 3 has no inputs section.
    RawClient v3;
    ASSERT_TRUE(v3.connect(srv_.addr()));
    r = v3.hello("", 3);
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    const uint64_t h3 = alloc(v3, 4096);
    ASSERT_NE(h3, 0u);
    x.handle = y.handle = h3;
    refused(compute(v3, {{h3, 0, 64, floats(1)}}), "unknown graph mode 128");
    EXPECT_TRUE(srv_.alive());
}

INSTANTIATE_TEST_SUITE_P(Transports, Hardening, ::testing::Values("unix", "tcp"));

}  // namespace

// A table that is not cached is validated against the closest cached one of its size (docs:
// "Validation"): only entries whose bytes changed, and those reading them, are checked again.
// After a valid table, a hostile change to one entry, or one that breaks an unchanged entry
// reading it, is refused exactly as in a new table (full and delta frames), and a valid
// change (storage moved under an unchanged view) is computed where the new table says.
TEST_P(Hardening, TablesCheckedAgainstACachedOneRefuseEveryHostileChange) {
    start();
    RawClient c = hello();
    const uint64_t h = alloc(c, 4096);
    const uint64_t h2 = alloc(c, 4096);
    ASSERT_NE(h, 0u);
    ASSERT_NE(h2, 0u);
    // s = x + y; w = CONT(v), v = rows 1-2 of z (a view).
    const Entry x = leaf(Type::F32, {16, 4}, h, 0);
    const Entry y = leaf(Type::F32, {16, 4}, h, 256);
    Entry s = leaf(Type::F32, {16, 4}, h, 512);
    s.op = static_cast<uint32_t>(Op::ADD);
    s.src[0] = 0;
    s.src[1] = 1;
    const Entry z = leaf(Type::F32, {16, 4}, h, 2048);
    Entry v = leaf(Type::F32, {16, 2}, 0, 0);
    v.op = static_cast<uint32_t>(Op::VIEW);
    v.src[0] = 3;
    v.view_src = 3;
    v.view_offs = 64;
    Entry w = leaf(Type::F32, {16, 2}, h, 1024);
    w.op = static_cast<uint32_t>(Op::CONT);
    w.src[0] = 4;
    const std::vector<Entry> good = {x, y, s, z, v, w};
    auto floats = [](float first, int n) {
        std::vector<uint8_t> d(static_cast<size_t>(n) * 4);
        for (int i = 0; i < n; i++) {
            const float f = first + static_cast<float>(i);
            std::memcpy(d.data() + 4 * i, &f, 4);
        }
        return d;
    };
    auto set = [&](uint64_t handle, uint64_t off, const std::vector<uint8_t>& d) {
        auto r = c.request(Cmd::TENSOR_SET, payload([&](wire::Writer& wr) {
                               wr.u64(handle);
                               wr.u64(off);
                               wr.u64(d.size());
                               wr.bytes(d.data(), d.size());
                           }));
        ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    };
    auto get = [&](uint64_t off, uint64_t size) {
        auto r = c.request(Cmd::TENSOR_GET, payload([&](wire::Writer& wr) {
                               wr.u64(h);
                               wr.u64(off);
                               wr.u64(size);
                           }));
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        std::vector<float> f(r.payload.size() / 4);
        std::memcpy(f.data(), r.payload.data(), f.size() * 4);
        return f;
    };
    set(h, 0, floats(0, 64));         // x
    set(h, 256, floats(1000, 64));    // y
    set(h, 2048, floats(500, 64));    // z
    set(h2, 0, floats(-300, 64));     // x', for the table that moves x
    set(h2, 1024, floats(-900, 64));  // z', for the table that moves z
    auto check = [&](float x0, float z0) {
        const std::vector<float> sum = get(512, 256), rows = get(1024, 128);
        ASSERT_EQ(sum.size(), 64u);
        ASSERT_EQ(rows.size(), 32u);
        for (int i = 0; i < 64; i++) EXPECT_EQ(sum[i], x0 + 1000.0f + 2.0f * static_cast<float>(i));
        for (int i = 0; i < 32; i++) EXPECT_EQ(rows[i], z0 + 16.0f + static_cast<float>(i));
    };
    auto r = c.request(Cmd::GRAPH_COMPUTE, graph(good));
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    check(0, 500);
    // Valid changes: x and z (under the unchanged view and its unchanged consumer) move to
    // the other buffer; the results follow them.
    std::vector<Entry> moved = good;
    moved[0].handle = h2;
    moved[3].handle = h2;
    moved[3].offs = 1024;
    r = c.request(Cmd::GRAPH_COMPUTE, graph(moved));
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    check(-300, -900);
    // Hostile changes, each to the valid table (now cached twice).
    struct Case {
        const char* what;
        std::function<void(std::vector<Entry>&)> change;
        const char* want;
    };
    const Case cases[] = {
        {"a source's shape under an unchanged ADD", [](auto& t) { t[1].ne[1] = 3; }, "entry 2"},
        {"a view source shrinking under an unchanged view", [](auto& t) { t[3].ne[1] = 2; },
         "entry 4"},
        {"a view source's type under an unchanged view",
         [](auto& t) {
             t[3].type = static_cast<uint32_t>(Type::F16);
             t[3].nb[0] = 2;
             t[3].nb[1] = 32;
             t[3].nb[2] = t[3].nb[3] = 128;
         },
         "entry 4"},
        {"a forward source", [](auto& t) { t[2].src[1] = 4; }, "sources must be earlier"},
        {"an unknown handle", [](auto& t) { t[2].handle = t[2].handle + 1000; },
         "unknown buffer handle"},
        {"a leaf past its buffer", [](auto& t) { t[0].offs = 4000; }, "reaches past its buffer"},
        {"a misaligned result", [](auto& t) { t[5].offs = 1026; }, "not aligned"},
        {"an unknown op", [](auto& t) { t[2].op = 4000; }, "unknown op"},
        {"a view past its source", [](auto& t) { t[4].view_offs = 192; }, "entry 4"},
        {"an unknown flag", [](auto& t) { t[5].flags = 64; }, "unknown flags"},
    };
    for (const Case& k : cases) {
        std::vector<Entry> bad = good;
        k.change(bad);
        expect_error(c, Cmd::GRAPH_COMPUTE, graph(bad), k.want, k.what);
        // The same change as a delta against the cached valid table.
        wire::Writer table;
        for (const Entry& e : good) remote::write_entry(table, e);
        const uint64_t base = wire::hash64(table.data(), table.size());
        expect_error(c, Cmd::GRAPH_COMPUTE, payload([&](wire::Writer& wr) {
                         wr.u32(0);
                         wr.u8(remote::kGraphDelta);
                         wr.u64(base);
                         wr.u32(static_cast<uint32_t>(good.size()));
                         uint32_t n = 0;
                         for (size_t i = 0; i < good.size(); i++) {
                             wire::Writer a, b;
                             remote::write_entry(a, good[i]);
                             remote::write_entry(b, bad[i]);
                             n += a.buf() != b.buf();
                         }
                         wr.u32(n);
                         for (size_t i = 0; i < good.size(); i++) {
                             wire::Writer a, b;
                             remote::write_entry(a, good[i]);
                             remote::write_entry(b, bad[i]);
                             if (a.buf() == b.buf()) continue;
                             wr.u32(static_cast<uint32_t>(i));
                             remote::write_entry(wr, bad[i]);
                         }
                     }),
                     k.want, k.what);
    }
    // Nothing hostile was cached: the valid tables still compute correctly.
    set(h, 0, floats(10, 64));
    r = c.request(Cmd::GRAPH_COMPUTE, graph(good));
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    check(10, 500);
}
