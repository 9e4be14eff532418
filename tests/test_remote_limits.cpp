// Connection limits of `ferry serve` against a real server process: the I/O timeout (a client
// that stalls half way through a frame, or stops reading its replies, loses its session and
// its buffers; an idle client keeps its session) and the session limits (over all clients, and
// per client).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "ferry/remote.h"
#include "test_remote_util.h"

using namespace ferry;
using ferry::remote::Cmd;
using ferry::test::RawClient;
using ferry::test::ServerProcess;
using Clock = std::chrono::steady_clock;

namespace {

std::string listen_addr(const std::string& transport, const std::string& dir) {
    return transport == "unix" ? "unix:" + dir + "/s" : "tcp:127.0.0.1:0";
}

std::vector<uint8_t> payload(const std::function<void(wire::Writer&)>& fn) {
    wire::Writer w;
    fn(w);
    return w.buf();
}

// Server-wide bytes of live buffers, from SESSION_STATS (field 10 of 11).
uint64_t server_bytes(RawClient& c) {
    RawClient::Reply r = c.request(Cmd::SESSION_STATS, {});
    if (!r.ok || r.is_error() || r.payload.size() != 11 * 8) return UINT64_MAX;
    wire::Reader rd(r.payload.data() + 9 * 8, 8);
    return rd.u64();
}

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

class Limits : public ::testing::TestWithParam<std::string> {
  protected:
    void start(std::vector<std::string> args) {
        dir_ = test::make_temp_dir();
        std::string err;
        ASSERT_TRUE(srv_.start(listen_addr(GetParam(), dir_), std::move(args), &err)) << err;
    }
    void TearDown() override {
        srv_.stop();
        if (GetParam() == "unix") {
            std::remove((dir_ + "/s").c_str());
            rmdir(dir_.c_str());
        }
    }
    RawClient hello() {
        RawClient c;
        EXPECT_TRUE(c.connect(srv_.addr()));
        RawClient::Reply r = c.hello();
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
        return c;
    }

    std::string dir_;
    ServerProcess srv_;
};

TEST_P(Limits, StalledFrameEndsTheSessionIdleOneIsKept) {
    start({"--io-timeout", "1"});
    RawClient idle = hello();

    // Half a frame header, then nothing.
    RawClient a = hello();
    const uint8_t partial[10] = {0x46, 0x52, 0x59, 0x31};
    ASSERT_TRUE(a.send_raw(partial, sizeof(partial)));
    Clock::time_point t0 = Clock::now();
    RawClient::Reply r = a.read_reply();
    ASSERT_TRUE(r.is_error());
    EXPECT_NE(r.message().find("truncated frame header: timed out"), std::string::npos)
        << r.message();
    EXPECT_TRUE(a.closed_by_server());
    EXPECT_LT(seconds_since(t0), 5.0);

    // A whole header announcing 100 payload bytes, then 10 of them.
    RawClient b = hello();
    ASSERT_TRUE(
        b.send_frame(static_cast<uint16_t>(Cmd::PING), std::vector<uint8_t>(10, 0), 0, 100));
    t0 = Clock::now();
    r = b.read_reply();
    ASSERT_TRUE(r.is_error());
    EXPECT_NE(r.message().find("10 of 100 payload bytes, then timed out"), std::string::npos)
        << r.message();
    EXPECT_TRUE(b.closed_by_server());
    EXPECT_LT(seconds_since(t0), 5.0);

    // The idle client waited more than the timeout between frames and is still served.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    r = idle.request(Cmd::PING, {});
    EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
    EXPECT_TRUE(srv_.alive());
}

TEST_P(Limits, ClientThatStopsReadingLosesItsSessionAndBuffers) {
    start({"--io-timeout", "1"});
    RawClient watcher = hello();
    const uint64_t base = server_bytes(watcher);
    ASSERT_NE(base, UINT64_MAX);

    constexpr uint64_t kSize = 32ull << 20;
    RawClient greedy = hello();
    RawClient::Reply r = greedy.request(Cmd::BUFFER_ALLOC, payload([](wire::Writer& w) {
                                            w.u32(0);
                                            w.u8(remote::kBufferDevice);
                                            w.u64(kSize);
                                        }));
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    wire::Reader rd(r.payload.data(), r.payload.size());
    const uint64_t handle = rd.u64();
    EXPECT_EQ(server_bytes(watcher), base + kSize);

    // Ask for the whole buffer and never read the reply: it cannot fit the socket buffers,
    // so the server's send stalls.
    ASSERT_TRUE(
        greedy.send_frame(static_cast<uint16_t>(Cmd::TENSOR_GET), payload([&](wire::Writer& w) {
                              w.u64(handle);
                              w.u64(0);
                              w.u64(kSize);
                          })));
    const Clock::time_point t0 = Clock::now();
    uint64_t now = server_bytes(watcher);
    while (now != base && seconds_since(t0) < 10.0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        now = server_bytes(watcher);
    }
    EXPECT_EQ(now, base) << "the stalled session still holds its buffer";
    const double took = seconds_since(t0);
    EXPECT_GE(took, 0.9) << "freed before the timeout";
    EXPECT_LT(took, 5.0);
    EXPECT_TRUE(srv_.alive());
}

TEST_P(Limits, SessionLimitOverAllClients) {
    start({"--max-sessions", "3"});
    std::vector<std::unique_ptr<RawClient>> open;
    for (int i = 0; i < 3; i++) open.push_back(std::make_unique<RawClient>(hello()));
    {
        RawClient extra;
        ASSERT_TRUE(extra.connect(srv_.addr()));
        RawClient::Reply r = extra.hello();
        ASSERT_TRUE(r.is_error());
        EXPECT_NE(r.message().find("server busy: 3 sessions open (--max-sessions)"),
                  std::string::npos)
            << r.message();
        EXPECT_TRUE(extra.closed_by_server());
    }
    // The client library reports the refusal by name.
    {
        auto reg = remote_open(srv_.addr());
        ASSERT_FALSE(reg);
        EXPECT_NE(reg.message().find("server busy"), std::string::npos) << reg.message();
        EXPECT_NE(reg.message().find(srv_.addr()), std::string::npos) << reg.message();
    }
    // A session that ends makes room for a new one.
    open.pop_back();
    bool admitted = false;
    const Clock::time_point t0 = Clock::now();
    while (!admitted && seconds_since(t0) < 5.0) {
        RawClient c;
        ASSERT_TRUE(c.connect(srv_.addr()));
        RawClient::Reply r = c.hello();
        admitted = r.ok && !r.is_error();
        if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(admitted);
    for (auto& c : open) {
        RawClient::Reply r = c->request(Cmd::PING, {});
        EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
    }
}

TEST_P(Limits, SessionLimitPerClient) {
    start({"--max-sessions-per-client", "2"});
    RawClient a = hello();
    RawClient b = hello();
    RawClient extra;
    ASSERT_TRUE(extra.connect(srv_.addr()));
    RawClient::Reply r = extra.hello();
    ASSERT_TRUE(r.is_error());
    const std::string who = GetParam() == "unix" ? "uid " : "127.0.0.1";
    EXPECT_NE(r.message().find("server busy: " + who), std::string::npos) << r.message();
    EXPECT_NE(r.message().find("has 2 sessions open (--max-sessions-per-client)"),
              std::string::npos)
        << r.message();
    EXPECT_TRUE(extra.closed_by_server());
    r = a.request(Cmd::PING, {});
    EXPECT_TRUE(r.ok && !r.is_error()) << r.message();
}

INSTANTIATE_TEST_SUITE_P(Transports, Limits, ::testing::Values("unix", "tcp"));

}  // namespace
