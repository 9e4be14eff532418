// The ivshmem transport between host processes: a real `ferry serve --listen ivshmem:PATH`
// and clients that map the window file (`--remote ivshmem:PATH`), exactly what a QEMU guest
// sees through the ivshmem PCI device (tests/vm/ boots one). Results must be the local bits;
// a hostile window user (bad counters, bytes scribbled anywhere, a request rewritten while the
// host reads it, a client killed mid-generation) costs only its own session.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "ferry/remote.h"
#include "remote-proto/ivshmem-window.h"
#include "shell.h"
#include "test_remote_util.h"

using namespace ferry;
using namespace ferry::remote::ivshmem;
using ferry::remote::Cmd;
using ferry::test::RawClient;
using ferry::test::ServerProcess;

namespace {

const std::string kTiny = std::string(FERRY_FIXTURES_DIR) + "/tiny-llama";
const char* kEncodings[] = {"f32", "f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_1", "q4_0"};

ferry::testing::ShellResult sh(const std::string& cmd) {
    return ferry::testing::run_shell(cmd);
}

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

bool have_fixtures() {
    return std::ifstream(kTiny + "/tiny-llama-q4_0.gguf").good();
}

// A server with `n` windows w1..wn in a fresh folder.
struct Windows {
    std::string dir = ferry::test::make_temp_dir();
    ServerProcess srv;
    std::string addr(int i) const { return "ivshmem:" + dir + "/w" + std::to_string(i); }
    std::string path(int i) const { return dir + "/w" + std::to_string(i); }
    bool start(int n, std::vector<std::string> extra = {}, const std::string& size = "8M") {
        for (int i = 2; i <= n; i++) {
            extra.push_back("--listen");
            extra.push_back(addr(i) + ",size=" + size);
        }
        std::string err;
        const bool ok = srv.start(addr(1) + ",size=" + size, extra, &err);
        EXPECT_TRUE(ok) << err;
        return ok;
    }
};

// A well-behaved client on its own window: set / compute / get, checking every result.
class GoodClient {
  public:
    explicit GoodClient(std::string addr) : addr_(std::move(addr)) {}
    ~GoodClient() { stop(); }
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
        Tensor* a = ctx.new_tensor(Type::F32, {256, 64});
        Tensor* b = ctx.new_tensor(Type::F32, {256, 64});
        Tensor* sum = ctx.add(a, b);
        sum->flags |= kTensorOutput;
        auto buf = allocate_context_tensors(ctx, dev->buffer_type());
        if (!buf) return fail(buf.message());
        Graph g;
        g.build_forward(sum);
        std::mt19937 rng(1);
        std::uniform_real_distribution<float> dist(-1, 1);
        const size_t n = 256 * 64;
        std::vector<float> x(n), y(n), out(n);
        while (!stop_) {
            for (auto& v : x) v = dist(rng);
            for (auto& v : y) v = dist(rng);
            Status st = (*be)->set_tensor_async(a, x.data(), 0, n * 4);
            if (st) st = (*be)->set_tensor_async(b, y.data(), 0, n * 4);
            if (st) st = (*be)->compute(g);
            if (st) st = (*be)->get_tensor_async(sum, out.data(), 0, n * 4);
            if (st) st = (*be)->synchronize();
            if (!st) return fail(st.message());
            for (size_t i = 0; i < n; i++) {
                if (out[i] != x[i] + y[i]) return fail("wrong result");
            }
            iterations_++;
        }
    }

    std::string addr_;
    std::thread thread_;
    std::atomic<bool> stop_{false};
    std::atomic<int> failures_{0}, iterations_{0};
    std::string first_error_;
};

// Bytes of live buffers over the whole server, seen through a session of its own.
uint64_t server_bytes(Registry* watcher) {
    auto s = remote_stats(watcher);
    EXPECT_TRUE(s) << s.message();
    return s ? s->server_bytes : 0;
}

TEST(Ivshmem, LogitsBitIdenticalForAllEncodingsTwoWindowsAtOnce) {
    if (!have_fixtures()) GTEST_SKIP() << "no tiny-llama fixtures";
    Windows w;
    ASSERT_TRUE(w.start(2));
    for (const char* enc : kEncodings) {
        SCOPED_TRACE(enc);
        const std::string model = kTiny + "/tiny-llama-" + enc + ".gguf";
        const std::string base = w.dir + "/logits-" + enc;
        auto cmd = [&](const std::string& extra, const std::string& out) {
            return std::string(FERRY_BIN) + " logits -m " + model +
                   " --tokens 1,45,99,300,7,12,512,3 --out " + out + " " + extra + " 2>&1";
        };
        auto l = sh(cmd("", base + ".local"));
        ASSERT_EQ(l.rc, 0) << l.out;
        // Two processes, each on its own window, at the same time.
        ferry::testing::ShellResult r1, r2;
        std::thread t1([&] { r1 = sh(cmd("--remote " + w.addr(1), base + ".w1")); });
        std::thread t2([&] { r2 = sh(cmd("--remote " + w.addr(2), base + ".w2")); });
        t1.join();
        t2.join();
        ASSERT_EQ(r1.rc, 0) << r1.out;
        ASSERT_EQ(r2.rc, 0) << r2.out;
        const std::string a = slurp(base + ".local");
        ASSERT_EQ(a.size(), 8u * 1024u * 4u);
        EXPECT_TRUE(a == slurp(base + ".w1"));
        EXPECT_TRUE(a == slurp(base + ".w2"));
    }
    EXPECT_TRUE(w.srv.alive());
}

TEST(Ivshmem, RunStreamsTheSameTextAsLocalAndNamesTheDevice) {
    if (!have_fixtures()) GTEST_SKIP() << "no tiny-llama fixtures";
    Windows w;
    ASSERT_TRUE(w.start(1, {}, "1M"));  // a small window: weights wrap the ring many times
    const std::string cmd = std::string(FERRY_BIN) + " run -m " + kTiny +
                            "/tiny-llama-q8_0.gguf -p 'The license' -n 48 --temp 0";
    auto l = sh(cmd + " 2>/dev/null");
    ASSERT_EQ(l.rc, 0);
    ASSERT_FALSE(l.out.empty());
    auto r = sh(cmd + " --remote " + w.addr(1) + " 2>" + w.dir + "/run.err");
    EXPECT_EQ(r.rc, 0) << slurp(w.dir + "/run.err");
    EXPECT_EQ(r.out, l.out);
    EXPECT_NE(slurp(w.dir + "/run.err").find("on " + w.addr(1) + "/CPU"), std::string::npos)
        << slurp(w.dir + "/run.err");
}

TEST(Ivshmem, BadAddressesGetClearErrors) {
    Windows w;
    ASSERT_TRUE(w.start(1));
    const std::string ferry = FERRY_BIN;
    struct Case {
        std::string cmd, want;
    } cases[] = {
        {ferry + " devices --remote ivshmem:" + w.dir + "/missing", "No such file"},
        {ferry + " devices --remote ivshmem:00:1f.7", "not an ivshmem device"},
        {ferry + " serve --listen ivshmem:" + w.dir + "/x,size=12", "bad size"},
        {ferry + " serve --listen ivshmem:" + w.dir + "/x,color=red", "unknown option"},
        {ferry + " serve --listen ivshmem:", "empty window path"},
    };
    for (const Case& c : cases) {
        auto r = sh(c.cmd + " 2>&1");
        EXPECT_NE(r.rc, 0) << c.cmd;
        EXPECT_NE(r.out.find(c.want), std::string::npos) << c.cmd << ": " << r.out;
    }
    // A file that no server set up.
    {
        std::ofstream(w.dir + "/plain", std::ios::binary) << std::string(1 << 20, '\0');
        auto r = sh(ferry + " devices --remote ivshmem:" + w.dir + "/plain 2>&1");
        EXPECT_NE(r.rc, 0);
        EXPECT_NE(r.out.find("not set up by a ferry server"), std::string::npos) << r.out;
    }
}

// Counters the guest owns are checked; counters the host owns are never read back.
TEST(Ivshmem, RingCounterViolationsEndOnlyThatSession) {
    Windows w;
    ASSERT_TRUE(w.start(2, {}, "1M"));
    GoodClient good(w.addr(2));
    good.start();
    auto win = Window::open(w.path(1));
    ASSERT_TRUE(win) << win.message();
    const uint64_t cap = win->word(kReqCapWord).load();
    struct Case {
        const char* what;
        uint64_t word;
        uint64_t value;
        bool ends;  // the session must end
        const char* want;
    } cases[] = {
        {"request head beyond the ring", kReqHead, 0, true, "request ring head"},
        {"request head far beyond", kReqHead, ~uint64_t{0}, true, "request ring head"},
        {"reply tail beyond what was written", kRepTail, 1u << 30, true, "reply ring tail"},
        {"host's own request tail scribbled", kReqTail, 12345, false, ""},
        {"host's own reply head scribbled", kRepHead, 0, false, ""},
        {"geometry scribbled", kReqCapWord, 1, false, ""},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        RawClient rc;
        ASSERT_TRUE(rc.connect(w.addr(1)));
        auto h = rc.hello();
        ASSERT_TRUE(h.ok && !h.is_error()) << h.message();
        const uint64_t v = c.word == kReqHead && c.value == 0 ? cap + 4096 : c.value;
        win->word(c.word).store(v);
        if (c.word == kRepTail) {
            // The host checks the reply tail when it writes: ask for a reply.
            uint8_t hdr[remote::kHeaderSize];
            remote::Header ph;
            ph.cmd = static_cast<uint16_t>(Cmd::PING);
            ph.id = 99;
            remote::write_header(hdr, ph);
            // Write the frame by hand at the current request head.
            const uint64_t head = win->word(kReqHead).load();
            ring_write(win->base() + kHeaderBytes, cap, head, hdr, sizeof(hdr));
            win->word(kReqHead).store(head + sizeof(hdr));
        }
        if (c.ends) {
            EXPECT_TRUE(rc.closed_by_server());
            auto st = rc.ring()->check_alive();
            EXPECT_NE(st.message().find("ended the session"), std::string::npos) << st.message();
        }
        // Host-owned words: the host never reads them back, so only this client's view of
        // the rings broke; the fresh client below shows the window is whole.
    }
    // The window still serves a fresh client, whole.
    RawClient fresh;
    ASSERT_TRUE(fresh.connect(w.addr(1)));
    auto h = fresh.hello();
    ASSERT_TRUE(h.ok && !h.is_error()) << h.message();
    auto p = fresh.request(Cmd::PING, {});
    EXPECT_TRUE(p.ok && !p.is_error());
    good.stop();
    EXPECT_EQ(good.failures(), 0) << good.first_error();
    EXPECT_GT(good.iterations(), 0);
    EXPECT_TRUE(w.srv.alive());
}

// A guest that scribbles random bytes over its window (first its request ring while a client
// works through it, then the whole window) for FERRY_SCRIBBLE_SECONDS per phase (default 2;
// bench/results/ivshmem.md records a 60 s run) gets errors; guests on other windows are served
// correctly all the while (exact sums, bit-identical logits).
TEST(Ivshmem, ScribblerGetsErrorsWhileTheOtherWindowIsUnaffected) {
    const int secs = std::getenv("FERRY_SCRIBBLE_SECONDS")
                         ? std::max(1, std::atoi(std::getenv("FERRY_SCRIBBLE_SECONDS")))
                         : 2;
    Windows w;
    ASSERT_TRUE(w.start(4, {"--io-timeout", "2"}, "1M"));
    auto watcher = remote_open(w.addr(3));
    ASSERT_TRUE(watcher) << watcher.message();
    const uint64_t base = server_bytes(watcher->get());
    GoodClient good(w.addr(2));
    good.start();
    // A second guest doing real inference on window 4 all the while: `ferry logits` of the
    // tiny model, again and again, each run bit-identical to the local logits.
    std::atomic<bool> logits_stop{false};
    std::atomic<int> logits_runs{0}, logits_bad{0};
    std::string logits_error;
    std::thread logits;
    const std::string model = kTiny + "/tiny-llama-q8_0.gguf";
    auto cmd = [model](const std::string& extra, const std::string& out) {
        return std::string(FERRY_BIN) + " logits -m " + model +
               " --tokens 1,45,99,300,7,12,512,3 --out " + out + " " + extra + " 2>&1";
    };
    if (have_fixtures()) {
        auto l = sh(cmd("", w.dir + "/local.logits"));
        ASSERT_EQ(l.rc, 0) << l.out;
        const std::string want = slurp(w.dir + "/local.logits");
        ASSERT_EQ(want.size(), 8u * 1024u * 4u);
        logits = std::thread([&, want, cmd] {
            do {
                std::remove((w.dir + "/w4.logits").c_str());
                auto r = sh(cmd("--remote " + w.addr(4), w.dir + "/w4.logits"));
                if (r.rc != 0 || slurp(w.dir + "/w4.logits") != want) {
                    if (logits_bad++ == 0) logits_error = r.out;
                }
                logits_runs++;
            } while (!logits_stop.load());
        });
    }
    auto win = Window::open(w.path(1));
    ASSERT_TRUE(win) << win.message();
    uint8_t* const bytes = win->base();
    const uint64_t size = win->size();
    const uint64_t req_cap = win->word(kReqCapWord).load();
    std::atomic<int> phase{0};  // 1: scribble the request ring, 2: the whole window, 3: stop
    std::atomic<uint64_t> scribbles{0};
    std::thread scribbler([&] {
        std::mt19937_64 rng(42);
        while (phase.load() < 3) {
            if (phase.load() == 0) {
                std::this_thread::yield();
                continue;
            }
            const bool whole = phase.load() == 2;
            const uint64_t lo = whole ? 0 : kHeaderBytes;
            const uint64_t span = whole ? size : req_cap;
            for (int i = 0; i < 64; i++) {
                const uint64_t at = lo + rng() % (span - 8);
                const uint64_t v = rng();
                std::memcpy(bytes + at, &v, (v & 1) ? 8 : 1);
            }
            scribbles++;
        }
    });
    // The victim: a client on window 1 doing real work through the same rings.
    int errors = 0, oks = 0;
    auto victim = [&](int phase_no) {
        phase.store(phase_no);
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(secs);
        while (std::chrono::steady_clock::now() < end) {
            auto reg = remote_open(w.addr(1));
            if (!reg) {
                errors++;
                continue;
            }
            Device* dev = (*reg)->devices().empty() ? nullptr : (*reg)->devices()[0];
            if (!dev) {
                errors++;
                continue;
            }
            auto be = dev->make_backend();
            if (!be) {
                errors++;
                continue;
            }
            Context ctx;
            Tensor* a = ctx.new_tensor(Type::F32, {1024, 16});
            Tensor* s = ctx.scale(a, 2.0f);
            s->flags |= kTensorOutput;
            auto buf = allocate_context_tensors(ctx, dev->buffer_type());
            if (!buf) {
                errors++;
                continue;
            }
            Graph g;
            g.build_forward(s);
            std::vector<float> x(1024 * 16, 1.5f), out(1024 * 16);
            for (int i = 0; i < 20; i++) {
                Status st = (*be)->set_tensor_async(a, x.data(), 0, x.size() * 4);
                if (st) st = (*be)->compute(g);
                if (st) st = (*be)->get_tensor_async(s, out.data(), 0, out.size() * 4);
                if (st) st = (*be)->synchronize();
                if (!st) {
                    errors++;
                    break;
                }
                oks++;
            }
        }
    };
    const auto t_begin = std::chrono::steady_clock::now();
    victim(1);
    const int errors_rewrite = errors;
    victim(2);
    phase.store(3);
    scribbler.join();
    logits_stop.store(true);
    if (logits.joinable()) logits.join();
    std::printf(
        "scribbler: %.1f s, %llu rounds; victim: %d ok steps, %d errors (%d while its requests "
        "were rewritten); other windows: %d good steps, %d `ferry logits` runs (%d not "
        "bit-identical)\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_begin).count(),
        static_cast<unsigned long long>(scribbles.load()), oks, errors, errors_rewrite,
        good.iterations(), logits_runs.load(), logits_bad.load());
    if (have_fixtures()) {
        EXPECT_GT(logits_runs.load(), 0);
        EXPECT_EQ(logits_bad.load(), 0) << logits_error;
    }
    EXPECT_GT(errors, 0) << "scribbling went unnoticed";
    EXPECT_GT(errors_rewrite, 0) << "rewritten requests went unnoticed";
    EXPECT_TRUE(w.srv.alive());
    // The scribbled window serves a fresh client again.
    {
        auto reg = remote_open(w.addr(1));
        ASSERT_TRUE(reg) << reg.message();
        EXPECT_TRUE(remote_ping(reg->get()));
    }
    good.stop();
    EXPECT_EQ(good.failures(), 0) << good.first_error();
    EXPECT_GT(good.iterations(), 0);
    // Every session of the scribbled window is gone, with its memory (within the timeout).
    uint64_t now = UINT64_MAX;
    for (int i = 0; i < 100 && now != base; i++) {
        now = server_bytes(watcher->get());
        if (now != base) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(now, base);
}

// SIGKILL of a client mid-generation: no socket closes, but its heartbeat stops; the host
// frees the session within the I/O timeout. A new client on the window gets a clean session.
TEST(Ivshmem, KilledClientFreesItsSessionWithinTheTimeout) {
    if (!have_fixtures()) GTEST_SKIP() << "no tiny-llama fixtures";
    Windows w;
    ASSERT_TRUE(w.start(2, {"--io-timeout", "2"}));
    auto watcher = remote_open(w.addr(2));
    ASSERT_TRUE(watcher) << watcher.message();
    const uint64_t base = server_bytes(watcher->get());
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    const pid_t child = fork();
    if (child == 0) {
        dup2(out[1], 1);
        close(out[0]);
        const int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        const std::string model = kTiny + "/tiny-llama-f32.gguf";
        const std::string addr = w.addr(1);
        execl(FERRY_BIN, FERRY_BIN, "run", "-m", model.c_str(), "-p", "The", "-n", "100000", "-c",
              "4096", "--temp", "1.0", "--seed", "7", "--remote", addr.c_str(),
              static_cast<char*>(nullptr));
        _exit(127);
    }
    close(out[1]);
    std::string got;
    char buf[256];
    while (got.size() < 64) {
        const ssize_t n = read(out[0], buf, sizeof(buf));
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
    }
    ASSERT_GE(got.size(), 64u) << "client ended before the kill";
    const uint64_t during = server_bytes(watcher->get());
    EXPECT_GT(during, base) << "the client's model is not on the server?";
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    close(out[0]);
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t now = during;
    while (now != base && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        now = server_bytes(watcher->get());
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("killed client's %llu bytes freed after %.2f s (timeout 2 s)\n",
                static_cast<unsigned long long>(during - base), secs);
    EXPECT_EQ(now, base);
    EXPECT_LT(secs, 4.0);
    auto reg = remote_open(w.addr(1));
    ASSERT_TRUE(reg) << reg.message();
    EXPECT_TRUE(remote_ping(reg->get()));
}

// A rebooted guest (a new epoch on a window whose old session never said goodbye) starts
// clean: the old session ends with its memory, the old client learns it lost the window.
TEST(Ivshmem, NewEpochReplacesAStaleSession) {
    Windows w;
    ASSERT_TRUE(w.start(2));
    auto watcher = remote_open(w.addr(2));
    ASSERT_TRUE(watcher) << watcher.message();
    const uint64_t base = server_bytes(watcher->get());
    RawClient old;
    ASSERT_TRUE(old.connect(w.addr(1)));
    ASSERT_TRUE(old.hello().ok);
    wire::Writer a;
    a.u32(0);
    a.u8(0);
    a.u64(1u << 20);
    auto r = old.request(Cmd::BUFFER_ALLOC, a.buf());
    ASSERT_TRUE(r.ok && !r.is_error()) << r.message();
    EXPECT_EQ(server_bytes(watcher->get()), base + (1u << 20));
    RawClient rebooted;
    ASSERT_TRUE(rebooted.connect(w.addr(1)));  // no detach by `old`: as after a guest reset
    ASSERT_TRUE(rebooted.hello().ok);
    EXPECT_TRUE(rebooted.request(Cmd::PING, {}).ok);
    EXPECT_EQ(server_bytes(watcher->get()), base);
    auto st = old.ring()->check_alive();
    EXPECT_FALSE(st);
    EXPECT_NE(st.message().find("another client took the window over"), std::string::npos)
        << st.message();
}

}  // namespace
