// The server's deferred wait for a compute (Session::sync_pending), driven in-process through
// the frame loop every transport runs, on a fake device with an asynchronous stream (as a
// GPU's): its buffers are not host-addressable, a compute only runs when the stream is
// synchronized, and a synchronous Buffer::get_tensor does not wait for the stream. A read
// that bypassed the wait would return stale bytes; a read queued behind the compute returns
// the compute's. The CPU device cannot show either (its compute is synchronous).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "remote-proto/protocol.h"
#include "server/frame-loop.h"
#include "server/session.h"

using namespace ferry;
using ferry::remote::Cmd;
using ferry::remote::Entry;

namespace {

class FakeDevice;

class FakeBuffer : public Buffer {
  public:
    FakeBuffer(BufferType* type, size_t size, bool host) : type_(type), bytes_(size), host_(host) {}
    BufferType* type() const override { return type_; }
    size_t size() const override { return bytes_.size(); }
    void* base() const override { return host_ ? const_cast<uint8_t*>(bytes_.data()) : nullptr; }
    Status set_tensor(Tensor* t, const void* src, size_t offset, size_t size) override {
        std::memcpy(bytes_.data() + t->offs + offset, src, size);
        return Status::ok();
    }
    // Does not wait for the stream (as a copy on another stream would not).
    Status get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) override {
        std::memcpy(dst, bytes_.data() + t->offs + offset, size);
        return Status::ok();
    }
    Status memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) override {
        std::memset(bytes_.data() + t->offs + offset, value, size);
        return Status::ok();
    }
    Status clear(uint8_t value) override {
        std::memset(bytes_.data(), value, bytes_.size());
        return Status::ok();
    }
    uint8_t* bytes() { return bytes_.data(); }

  private:
    BufferType* type_;
    std::vector<uint8_t> bytes_;
    bool host_;
};

class FakeType : public BufferType {
  public:
    FakeType(Device* dev, bool host) : dev_(dev), host_(host) {}
    const char* name() const override { return host_ ? "FAKE_HOST" : "FAKE"; }
    Device* device() const override { return dev_; }
    size_t alignment() const override { return 64; }
    bool is_host() const override { return host_; }
    Expected<std::unique_ptr<Buffer>> allocate(size_t size) override {
        return std::unique_ptr<Buffer>(new FakeBuffer(this, size, host_));
    }

  private:
    Device* dev_;
    bool host_;
};

// What the stream did, for the test to count.
struct StreamLog {
    int computes = 0, syncs = 0, async_reads = 0;
    int ahead_queued = 0, ahead_started = 0, ahead_settled = 0;
    int ahead_queued_behind = 0;  // of ahead_queued: with work still on the stream (unwaited)
    int fail_next_sync = 0;       // > 0: the next synchronize fails
    uint8_t generation = 0;       // written into every node's bytes by a compute
};

class FakeBackend : public Backend {
  public:
    FakeBackend(Device* dev, StreamLog* log) : dev_(dev), log_(log) {}
    const char* name() const override { return "FAKE"; }
    Device* device() const override { return dev_; }
    // Queued: every node's bytes become the next generation when the stream runs.
    Status compute(Graph& g) override {
        release();
        return queue_compute(g);
    }
    Status queue_compute(Graph& g) {
        log_->computes++;
        std::vector<std::pair<uint8_t*, size_t>> outs;
        for (Tensor* n : g.nodes) {
            outs.push_back({static_cast<FakeBuffer*>(n->buffer)->bytes() + n->offs, n->nbytes()});
        }
        queue_.push_back([this, outs] {
            log_->generation++;
            for (auto [p, n] : outs) std::memset(p, log_->generation, n);
        });
        return Status::ok();
    }
    // A graph queued ahead: its compute joins the stream once run_ahead writes its inputs
    // (or settle_ahead releases it); until then the stream runs what was queued before it.
    Expected<bool> compute_ahead(Graph& g) override {
        if (ahead_) return false;
        release();
        ahead_ = &g;
        log_->ahead_queued++;
        log_->ahead_queued_behind += !queue_.empty();
        return true;
    }
    Expected<bool> run_ahead(std::span<const TensorWrite> inputs) override {
        if (!ahead_) {
            FERRY_TRY(set_tensors_async(inputs));
            return false;
        }
        Graph* g = ahead_;
        ahead_ = nullptr;
        FERRY_TRY(Backend::set_tensors_async(inputs));
        log_->ahead_started++;
        FERRY_TRY(queue_compute(*g));
        return true;
    }
    Status settle_ahead() override {
        if (ahead_) log_->ahead_settled++;
        release();
        return synchronize();
    }
    Status set_tensor_async(Tensor* t, const void* src, size_t offset, size_t size) override {
        release();
        return Backend::set_tensor_async(t, src, offset, size);
    }
    Status get_tensor_async(const Tensor* t, void* dst, size_t offset, size_t size) override {
        release();
        log_->async_reads++;
        const uint8_t* src = static_cast<FakeBuffer*>(t->buffer)->bytes() + t->offs + offset;
        queue_.push_back([=] { std::memcpy(dst, src, size); });
        return Status::ok();
    }
    Status synchronize() override {  // not for a graph queued ahead
        log_->syncs++;
        while (!queue_.empty()) {
            queue_.front()();
            queue_.pop_front();
        }
        if (log_->fail_next_sync > 0) {
            log_->fail_next_sync--;
            return Status::error("the fake stream failed");
        }
        return Status::ok();
    }

  private:
    // A graph still queued ahead runs with the inputs it last had (what any other call does).
    void release() {
        if (!ahead_) return;
        Graph* g = ahead_;
        ahead_ = nullptr;
        (void)queue_compute(*g);
    }
    Device* dev_;
    StreamLog* log_;
    std::deque<std::function<void()>> queue_;
    Graph* ahead_ = nullptr;
};

class FakeDevice : public Device {
  public:
    explicit FakeDevice(StreamLog* log) : log_(log) {}
    const char* name() const override { return "FAKE0"; }
    std::string description() const override { return "fake asynchronous device"; }
    DeviceType type() const override { return DeviceType::GPU; }
    DeviceMemory memory() const override { return {1u << 30, 1u << 30}; }
    DeviceCaps caps() const override {
        DeviceCaps c;
        c.async = true;
        return c;
    }
    BufferType* buffer_type() override { return &type_; }
    BufferType* host_buffer_type() override { return &host_; }
    bool supports_op(const Tensor*) override { return true; }
    bool supports_buffer_type(const BufferType* t) override { return t == &type_ || t == &host_; }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions&) override {
        return std::unique_ptr<Backend>(new FakeBackend(this, log_));
    }

  private:
    StreamLog* log_;
    FakeType type_{this, false}, host_{this, true};
};

// The frame loop's transport: requests from a byte string, replies recorded.
struct Frames {
    std::vector<uint8_t> in;
    size_t at = 0;
    std::vector<std::pair<remote::Header, std::vector<uint8_t>>> out;

    void add(Cmd cmd, const std::vector<uint8_t>& payload) {
        remote::Header h;
        h.cmd = static_cast<uint16_t>(cmd);
        h.id = ++id;
        h.len = payload.size();
        uint8_t hdr[remote::kHeaderSize];
        remote::write_header(hdr, h);
        in.insert(in.end(), hdr, hdr + sizeof(hdr));
        in.insert(in.end(), payload.begin(), payload.end());
    }
    Status read(void* dst, size_t n, bool, size_t* got = nullptr) {
        const size_t take = std::min(n, in.size() - at);
        std::memcpy(dst, in.data() + at, take);
        at += take;
        if (got) *got = take;
        return take == n ? Status::ok() : Status::error("end of input");
    }
    bool more_input() const { return at < in.size(); }
    bool ended_between_frames() const { return true; }
    void end_frame() {}
    Status reply(const remote::Header& req, const server::Reply& r, bool = false) {
        const uint8_t* body = r.data ? r.data : r.payload.data();
        const size_t len = r.data ? r.data_len : r.payload.size();
        remote::Header h = req;
        h.flags = static_cast<uint16_t>(remote::kFlagReply | (r.error ? remote::kFlagError : 0));
        out.push_back({h, std::vector<uint8_t>(body, body + len)});
        return Status::ok();
    }
    uint64_t id = 0;
};

std::vector<uint8_t> payload(const std::function<void(wire::Writer&)>& fn) {
    wire::Writer w;
    fn(w);
    return w.buf();
}

std::string message(const std::vector<uint8_t>& p) {
    wire::Reader r(p.data(), p.size());
    return r.str(1u << 16);
}

// A compute with input writes whose result is read, as a decode step sends them (version 4:
// the writes in the GRAPH_COMPUTE frame): x (offset 0, 16 bytes) gets `v` in every byte.
std::vector<uint8_t> step_with_inputs(uint64_t dev_h, const std::vector<uint8_t>& compute,
                                      uint8_t v) {
    return payload([&](wire::Writer& w) {
        w.u32(0);
        w.u8(static_cast<uint8_t>(remote::kGraphFull | remote::kGraphInputs));
        w.u32(1);
        w.u64(dev_h);
        w.u64(0);
        w.u64(16);
        for (int i = 0; i < 16; i++) w.u8(v);
        w.bytes(compute.data() + 5, compute.size() - 5);  // the table after dev and mode
    });
}

class Deferred : public ::testing::Test {
  protected:
    void SetUp() override {
        opts_.devices = {&dev_};
        session_ = std::make_unique<server::Session>(opts_, &counters_, false);
        server::Reply r;
        const std::vector<uint8_t> hello = payload([](wire::Writer& w) {
            w.u32(remote::kProtocolVersion);
            w.u64(remote::kCapGraphCache);
            w.str("");
        });
        session_->handle(static_cast<uint16_t>(Cmd::HELLO), hello.data(), hello.size(), &r);
        ASSERT_FALSE(r.error) << message(r.payload);
        dev_h_ = alloc(remote::kBufferDevice);
        host_h_ = alloc(remote::kBufferHost);
        // y (offset 256) = x (offset 0) + x, 64 floats, in device memory.
        Entry x, y;
        x.type = y.type = static_cast<uint32_t>(Type::F32);
        x.ne[0] = y.ne[0] = 64;
        x.nb[0] = y.nb[0] = 4;
        for (int d = 1; d < kMaxDims; d++) {
            x.ne[d] = y.ne[d] = 1;
            x.nb[d] = y.nb[d] = 256;
        }
        x.handle = y.handle = dev_h_;
        y.offs = 256;
        y.op = static_cast<uint32_t>(Op::ADD);
        y.src[0] = y.src[1] = 0;
        compute_ = payload([&](wire::Writer& w) {
            w.u32(0);
            w.u8(remote::kGraphFull);
            w.u32(2);
            remote::write_entry(w, x);
            remote::write_entry(w, y);
        });
    }
    uint64_t alloc(uint8_t kind) {
        server::Reply r;
        const std::vector<uint8_t> p = payload([&](wire::Writer& w) {
            w.u32(0);
            w.u8(kind);
            w.u64(4096);
        });
        session_->handle(static_cast<uint16_t>(Cmd::BUFFER_ALLOC), p.data(), p.size(), &r);
        EXPECT_FALSE(r.error) << message(r.payload);
        wire::Reader rd(r.payload.data(), r.payload.size());
        return rd.u64();
    }
    std::vector<uint8_t> copy_to_host() const {
        return payload([&](wire::Writer& w) {
            w.u64(dev_h_);
            w.u64(256);
            w.u64(host_h_);
            w.u64(0);
            w.u64(256);
        });
    }
    std::vector<uint8_t> get_result() const {
        return payload([&](wire::Writer& w) {
            w.u64(dev_h_);
            w.u64(256);
            w.u64(256);
        });
    }
    // A decode step through the frame loop: a compute with input writes (every input byte
    // `value`) and the read of its result into host memory, in one batch; returns the replies.
    Frames decode_step(uint8_t value) {
        Frames f;
        f.add(Cmd::GRAPH_COMPUTE, step_with_inputs(dev_h_, compute_, value));
        f.add(Cmd::TENSOR_COPY, copy_to_host());
        return run(std::move(f));
    }
    // Runs the frames through the frame loop; returns the replies.
    Frames run(Frames f) {
        std::string why;
        server::serve_frames(f, *session_, opts_, 4u << 20, &why);
        return f;
    }
    // The host buffer's first 256 bytes (where TENSOR_COPY puts the result).
    std::vector<uint8_t> host_bytes() {
        server::Reply r;
        const std::vector<uint8_t> p = payload([&](wire::Writer& w) {
            w.u64(host_h_);
            w.u64(0);
            w.u64(256);
        });
        session_->handle(static_cast<uint16_t>(Cmd::TENSOR_GET), p.data(), p.size(), &r);
        return std::vector<uint8_t>(r.data, r.data + r.data_len);
    }

    StreamLog log_;
    FakeDevice dev_{&log_};
    server::ServerOptions opts_;
    server::ServerCounters counters_;
    std::unique_ptr<server::Session> session_;
    uint64_t dev_h_ = 0, host_h_ = 0;
    std::vector<uint8_t> compute_;
};

TEST_F(Deferred, AComputeAndTheReadBehindItWaitOnceAndReadTheResult) {
    // unix with a GPU: the compute and a TENSOR_COPY of its result into shared memory.
    Frames f;
    f.add(Cmd::GRAPH_COMPUTE, compute_);
    f.add(Cmd::TENSOR_COPY, copy_to_host());
    f = run(std::move(f));
    ASSERT_EQ(f.out.size(), 2u);
    EXPECT_EQ(f.out[0].first.cmd, static_cast<uint16_t>(Cmd::GRAPH_COMPUTE));
    EXPECT_EQ(f.out[0].first.flags, remote::kFlagReply) << message(f.out[0].second);
    EXPECT_EQ(f.out[1].first.cmd, static_cast<uint16_t>(Cmd::TENSOR_COPY));
    EXPECT_EQ(f.out[1].first.flags, remote::kFlagReply) << message(f.out[1].second);
    EXPECT_EQ(log_.computes, 1);
    EXPECT_EQ(log_.syncs, 1);
    EXPECT_EQ(log_.async_reads, 1);
    EXPECT_EQ(host_bytes(), std::vector<uint8_t>(256, 1));
    // tcp: the compute and a TENSOR_GET of device memory.
    Frames g;
    g.add(Cmd::GRAPH_COMPUTE, compute_);
    g.add(Cmd::TENSOR_GET, get_result());
    g = run(std::move(g));
    ASSERT_EQ(g.out.size(), 2u);
    EXPECT_EQ(g.out[0].first.flags, remote::kFlagReply);
    EXPECT_EQ(g.out[1].second, std::vector<uint8_t>(256, 2));
    EXPECT_EQ(log_.syncs, 2);
    EXPECT_EQ(log_.async_reads, 2);
}

TEST_F(Deferred, AnythingElseWaitsFirstAndAComputeAloneIsWaitedForAtOnce) {
    Frames f;
    f.add(Cmd::GRAPH_COMPUTE, compute_);
    f.add(Cmd::PING, {});
    f.add(Cmd::GRAPH_COMPUTE, compute_);
    f.add(Cmd::GRAPH_COMPUTE, compute_);
    f.add(Cmd::TENSOR_GET, get_result());
    f.add(Cmd::GRAPH_COMPUTE, compute_);  // the last: nothing follows it
    f = run(std::move(f));
    ASSERT_EQ(f.out.size(), 6u);
    const Cmd want[] = {Cmd::GRAPH_COMPUTE, Cmd::PING,       Cmd::GRAPH_COMPUTE,
                        Cmd::GRAPH_COMPUTE, Cmd::TENSOR_GET, Cmd::GRAPH_COMPUTE};
    for (size_t i = 0; i < 6; i++) {
        EXPECT_EQ(f.out[i].first.cmd, static_cast<uint16_t>(want[i])) << i;
        EXPECT_EQ(f.out[i].first.id, i + 1) << i;
        EXPECT_EQ(f.out[i].first.flags, remote::kFlagReply) << i << message(f.out[i].second);
    }
    // The read saw the compute right before it (the third), not a stale generation.
    EXPECT_EQ(f.out[4].second, std::vector<uint8_t>(256, 3));
    EXPECT_EQ(log_.computes, 4);
    EXPECT_EQ(log_.syncs, 4);
    EXPECT_EQ(log_.async_reads, 1);
    EXPECT_EQ(log_.generation, 4);  // the last compute ran before its reply
}

TEST_F(Deferred, AFailedWaitIsTheComputesErrorAndTheReadsToo) {
    log_.fail_next_sync = 1;
    Frames f;
    f.add(Cmd::GRAPH_COMPUTE, compute_);
    f.add(Cmd::TENSOR_COPY, copy_to_host());
    f.add(Cmd::GRAPH_COMPUTE, compute_);
    f.add(Cmd::TENSOR_COPY, copy_to_host());
    f = run(std::move(f));
    ASSERT_EQ(f.out.size(), 4u);
    EXPECT_TRUE(f.out[0].first.flags & remote::kFlagError);
    EXPECT_EQ(message(f.out[0].second), "GRAPH_COMPUTE: the fake stream failed");
    EXPECT_TRUE(f.out[1].first.flags & remote::kFlagError);
    EXPECT_NE(message(f.out[1].second).find("the fake stream failed"), std::string::npos);
    // The session goes on.
    EXPECT_EQ(f.out[2].first.flags, remote::kFlagReply);
    EXPECT_EQ(f.out[3].first.flags, remote::kFlagReply);
    EXPECT_EQ(host_bytes(), std::vector<uint8_t>(256, 2));
}

TEST_F(Deferred, AComputeFollowedByAPartFrameIsAnsweredBeforeTheSessionEnds) {
    Frames f;
    f.add(Cmd::GRAPH_COMPUTE, compute_);
    f.in.push_back(0x46);  // one byte of a next frame, then the client is gone
    f = run(std::move(f));
    ASSERT_GE(f.out.size(), 1u);
    EXPECT_EQ(f.out[0].first.cmd, static_cast<uint16_t>(Cmd::GRAPH_COMPUTE));
    EXPECT_EQ(f.out[0].first.flags, remote::kFlagReply);
    EXPECT_EQ(log_.syncs, 1);
    EXPECT_EQ(log_.generation, 1);
}

// Once a step's result has been read and no request follows, the server queues the step's
// graph ahead (Session::replied); the next GRAPH_COMPUTE of that graph with its inputs starts
// it, and anything else releases it first with the inputs it last had. Every read still sees
// its own step.
TEST_F(Deferred, AStepQueuedAheadStartsWithTheNextInputsOrIsReleased) {
    for (int s = 1; s <= 3; s++) {
        Frames f = decode_step(static_cast<uint8_t>(s));
        ASSERT_EQ(f.out.size(), 2u);
        EXPECT_EQ(f.out[0].first.flags, remote::kFlagReply) << message(f.out[0].second);
        EXPECT_EQ(f.out[1].first.flags, remote::kFlagReply) << message(f.out[1].second);
        EXPECT_EQ(log_.ahead_queued, s) << "step " << s;
        // Queued behind the step and its read, before the server waited for them (a read
        // into host memory, as a local session orders it).
        EXPECT_EQ(log_.ahead_queued_behind, s) << "step " << s;
        EXPECT_EQ(log_.ahead_started, s - 1) << "step " << s;
        EXPECT_EQ(log_.ahead_settled, 0) << "step " << s;
        EXPECT_EQ(log_.computes, s);
        EXPECT_EQ(log_.generation, s);
    }
    // Another request (a PING) releases the queued step: it runs again with step 3's inputs.
    Frames f;
    f.add(Cmd::PING, {});
    f = run(std::move(f));
    ASSERT_EQ(f.out.size(), 1u);
    EXPECT_EQ(log_.ahead_settled, 1);
    EXPECT_EQ(log_.computes, 4);
    EXPECT_EQ(log_.generation, 4);
    EXPECT_EQ(host_bytes(), std::vector<uint8_t>(256, 3));  // the last read's bytes stay
    // With a request already waiting behind the read, nothing is queued; the read sees its
    // step.
    Frames h;
    h.add(Cmd::GRAPH_COMPUTE, step_with_inputs(dev_h_, compute_, 9));
    h.add(Cmd::TENSOR_COPY, copy_to_host());
    h.add(Cmd::PING, {});
    h = run(std::move(h));
    ASSERT_EQ(h.out.size(), 3u);
    EXPECT_EQ(log_.ahead_queued, 3);
    EXPECT_EQ(log_.computes, 5);
    EXPECT_EQ(host_bytes(), std::vector<uint8_t>(256, 5));
}

TEST_F(Deferred, FerryServeAheadEarlyOffQueuesAfterTheReply) {
    setenv("FERRY_SERVE_AHEAD_EARLY", "0", 1);
    SetUp();  // a session made with it
    unsetenv("FERRY_SERVE_AHEAD_EARLY");
    for (int s = 1; s <= 3; s++) {
        Frames f = decode_step(static_cast<uint8_t>(s));
        ASSERT_EQ(f.out.size(), 2u);
        EXPECT_EQ(log_.ahead_queued, s) << "step " << s;
        EXPECT_EQ(log_.ahead_queued_behind, 0) << "step " << s;
        EXPECT_EQ(log_.ahead_started, s - 1) << "step " << s;
        EXPECT_EQ(log_.computes, s);
    }
    EXPECT_EQ(host_bytes(), std::vector<uint8_t>(256, 3));  // (this read releases step 4)
}

// The step fails at its wait: the step queued before that wait is released (run again with
// its last inputs, as any release does) and nothing stays queued; the error is the read's.
TEST_F(Deferred, AStepQueuedBeforeAFailedWaitIsReleased) {
    Frames f = decode_step(1);
    ASSERT_EQ(f.out.size(), 2u);
    ASSERT_EQ(log_.ahead_queued, 1);
    log_.fail_next_sync = 1;
    Frames g = decode_step(2);
    ASSERT_EQ(g.out.size(), 2u);
    EXPECT_NE(g.out[1].first.flags & remote::kFlagError, 0u) << "the read reports the failure";
    EXPECT_EQ(log_.ahead_queued, 2);
    EXPECT_EQ(log_.ahead_settled, 1);
    // Nothing is left queued: a PING releases nothing more.
    Frames h;
    h.add(Cmd::PING, {});
    h = run(std::move(h));
    EXPECT_EQ(log_.ahead_settled, 1);
}

TEST_F(Deferred, FerryServeAheadOffNeverQueues) {
    setenv("FERRY_SERVE_AHEAD", "0", 1);
    SetUp();  // a session made with it
    unsetenv("FERRY_SERVE_AHEAD");
    for (int s = 1; s <= 2; s++) {
        Frames f = decode_step(static_cast<uint8_t>(s));
        ASSERT_EQ(f.out.size(), 2u);
    }
    EXPECT_EQ(log_.ahead_queued, 0);
    EXPECT_EQ(log_.computes, 2);
    EXPECT_EQ(host_bytes(), std::vector<uint8_t>(256, 2));
}

}  // namespace
