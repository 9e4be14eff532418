// The remote backend under the real commands: `ferry test-ops`, `ferry logits` and `ferry run`
// with --remote against a `ferry serve` child process, compared with local runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "ferry/llama.h"
#include "ferry/remote.h"
#include "shell.h"
#include "test_remote_util.h"

using namespace ferry;
using ferry::test::read_step_traces;
using ferry::test::ServerProcess;
using ferry::test::TraceEvent;
using ferry::test::TraceFile;

namespace {

const std::string kTiny = std::string(FERRY_FIXTURES_DIR) + "/tiny-llama";
const char* kEncodings[] = {"f32", "f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_1", "q4_0"};

using Proc = ferry::testing::ShellResult;

// Runs a shell command, capturing stdout (and stderr when merged by the caller).
Proc sh(const std::string& cmd) {
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

// A connection to addr, the model at path on its first device, a session on it and one on the
// local model: what the decode-step tests compare. Returns an error message, or "".
struct ServedPair {
    std::unique_ptr<Registry> reg;
    std::unique_ptr<LlamaModel> model;
    std::unique_ptr<LlamaSession> local, served;
};
std::string open_pair(const std::string& addr, const std::string& path, LlamaModel& local,
                      const SessionOptions& so, ServedPair* p) {
    Expected<std::unique_ptr<Registry>> reg = remote_open(addr);
    if (!reg) return reg.message();
    ModelOptions mo;
    mo.devices = {(*reg)->devices()[0]};
    Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(path, mo);
    if (!m) return m.message();
    Expected<std::unique_ptr<LlamaSession>> ls = LlamaSession::create(local, so);
    if (!ls) return ls.message();
    Expected<std::unique_ptr<LlamaSession>> rs = LlamaSession::create(**m, so);
    if (!rs) return rs.message();
    p->reg = std::move(*reg);
    p->model = std::move(*m);
    p->local = std::move(*ls);
    p->served = std::move(*rs);
    return "";
}

class RemoteE2E : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = ferry::test::make_temp_dir();
        unix_ = new ServerProcess();
        tcp_ = new ServerProcess();
        std::string err;
        ASSERT_TRUE(unix_->start("unix:" + dir_ + "/e", {}, &err)) << err;
        ASSERT_TRUE(tcp_->start("tcp:127.0.0.1:0", {}, &err)) << err;
    }
    static void TearDownTestSuite() {
        delete unix_;
        delete tcp_;
    }
    static std::string dir_;
    static ServerProcess* unix_;
    static ServerProcess* tcp_;
};
std::string RemoteE2E::dir_;
ServerProcess* RemoteE2E::unix_ = nullptr;
ServerProcess* RemoteE2E::tcp_ = nullptr;

// Every op case through the server gives exactly the local CPU's error against the float64
// reference (same nmse text): the results are the same bits.
TEST_F(RemoteE2E, TestOpsThroughTheServerMatchLocal) {
    for (const std::string& addr : {unix_->addr(), tcp_->addr()}) {
        SCOPED_TRACE(addr);
        // The local CPU and the server's CPU only: other local devices (OPENVINO:CPU) are not
        // what this test compares, and compiling each of their cases costs seconds.
        Proc p = sh(std::string(FERRY_BIN) + " test-ops --remote " + addr + " -d CPU -d " + addr +
                    "/CPU 2>&1");
        EXPECT_EQ(p.rc, 0) << p.out.substr(p.out.size() > 3000 ? p.out.size() - 3000 : 0);
        std::map<std::string, std::string> local, remote;
        std::istringstream in(p.out);
        std::string line;
        while (std::getline(in, line)) {
            std::istringstream ls(line);
            std::string dev, op, name;
            if (!(ls >> dev >> op >> name)) continue;
            const size_t at = line.find("nmse=");
            if (at == std::string::npos) continue;
            const std::string nmse = line.substr(at, line.find(' ', at) - at);
            if (dev == "CPU") local[name] = nmse;
            if (dev == addr + "/CPU") remote[name] = nmse;
        }
        ASSERT_GT(local.size(), 20u);
        EXPECT_EQ(local.size(), remote.size());
        for (const auto& [name, nmse] : local) {
            auto it = remote.find(name);
            ASSERT_NE(it, remote.end()) << name;
            EXPECT_EQ(it->second, nmse) << name;
        }
    }
}

TEST_F(RemoteE2E, LogitsBitIdenticalForAllEncodingsOverBothTransports) {
    ASSERT_TRUE(have_fixtures()) << "missing " << kTiny << "/tiny-llama-q4_0.gguf";
    for (const char* enc : kEncodings) {
        SCOPED_TRACE(enc);
        const std::string model = kTiny + "/tiny-llama-" + enc + ".gguf";
        const std::string base = dir_ + "/logits-" + enc;
        auto run = [&](const std::string& extra, const std::string& out) {
            return sh(std::string(FERRY_BIN) + " logits -m " + model +
                      " --tokens 1,45,99,300,7,12,512,3 --out " + out + " " + extra + " 2>&1");
        };
        Proc l = run("", base + ".local");
        ASSERT_EQ(l.rc, 0) << l.out;
        Proc u = run("--remote " + unix_->addr(), base + ".unix");
        ASSERT_EQ(u.rc, 0) << u.out;
        Proc t = run("--remote " + tcp_->addr(), base + ".tcp");
        ASSERT_EQ(t.rc, 0) << t.out;
        const std::string a = slurp(base + ".local");
        ASSERT_EQ(a.size(), 8u * 1024u * 4u);
        EXPECT_TRUE(a == slurp(base + ".unix"));
        EXPECT_TRUE(a == slurp(base + ".tcp"));
    }
}

// Files of the newer types, made by gen-model: Q4_K_M / Q5_K_M on rows of 320 / 864 elements
// (their Q5_0, Q5_1 and Q8_0 fallbacks), MXFP4 (17-byte blocks, odd row strides) and Q3_K.
TEST_F(RemoteE2E, LogitsBitIdenticalForGeneratedNewTypes) {
    const std::pair<const char*, const char*> files[] = {
        {"tiny-320", "q4_k_m"}, {"tiny-320", "q5_k_m"}, {"tiny-320", "mxfp4"}, {"tiny", "q3_k"}};
    for (const auto& [preset, type] : files) {
        SCOPED_TRACE(type);
        const std::string model = dir_ + "/gen-" + type + ".gguf";
        Proc g = sh(std::string(FERRY_BIN) + " gen-model --preset " + preset + " --type " + type +
                    " -o " + model + " 2>&1");
        ASSERT_EQ(g.rc, 0) << g.out;
        const std::string base = dir_ + "/logits-gen-" + type;
        auto run = [&](const std::string& extra, const std::string& out) {
            return sh(std::string(FERRY_BIN) + " logits -m " + model +
                      " --tokens 1,45,99,300,7,12,512,3 -o " + out + " " + extra + " 2>&1");
        };
        Proc l = run("", base + ".local");
        ASSERT_EQ(l.rc, 0) << l.out;
        Proc u = run("--remote " + unix_->addr(), base + ".unix");
        ASSERT_EQ(u.rc, 0) << u.out;
        Proc t = run("--remote " + tcp_->addr(), base + ".tcp");
        ASSERT_EQ(t.rc, 0) << t.out;
        const std::string a = slurp(base + ".local");
        ASSERT_EQ(a.size(), 8u * 1024u * 4u);
        EXPECT_TRUE(a == slurp(base + ".unix"));
        EXPECT_TRUE(a == slurp(base + ".tcp"));
    }
}

TEST_F(RemoteE2E, LayersSplitBetweenTheLocalCpuAndTwoServersGiveTheLocalLogits) {
    // llama.cpp's -ngl and --tensor-split: the first layer on the local CPU, the others split
    // between a unix and a tcp server; activations cross both connections every step.
    ASSERT_TRUE(have_fixtures());
    const std::string model = kTiny + "/tiny-llama-q8_0.gguf";
    auto run = [&](const std::string& extra, const std::string& out) {
        return sh(std::string(FERRY_BIN) + " logits -m " + model +
                  " --tokens 1,45,99,300,7,12,512,3 -o " + out + " " + extra + " 2>&1");
    };
    Proc l = run("", dir_ + "/split.local");
    ASSERT_EQ(l.rc, 0) << l.out;
    Proc d = run("--remote " + unix_->addr() + " --remote " + tcp_->addr() + " -d " +
                     unix_->addr() + "/CPU," + tcp_->addr() + "/CPU -ngl 3 -ts 1,2",
                 dir_ + "/split.remote");
    ASSERT_EQ(d.rc, 0) << d.out;
    EXPECT_TRUE(slurp(dir_ + "/split.local") == slurp(dir_ + "/split.remote"));
    Proc bad = run("--remote " + unix_->addr() + " -ts 1,2", dir_ + "/split.bad");
    EXPECT_NE(bad.rc, 0);
    EXPECT_NE(bad.out.find("2 shares for 1 devices"), std::string::npos) << bad.out;
}

// Decode one token at a time through the server: past 32, 64 and 96 positions the session
// rebuilds its graph (longer KV views and mask; most intermediate offsets move), and the
// server validates each new table against the one it has cached. Every step's logits are the
// local ones, bit for bit, over both transports.
TEST_F(RemoteE2E, DecodeStepsAcrossGraphRebuildsGiveTheLocalLogits) {
    ASSERT_TRUE(have_fixtures());
    const std::string path = kTiny + "/tiny-llama-q8_0.gguf";
    Expected<std::unique_ptr<LlamaModel>> local = LlamaModel::load(path, {});
    ASSERT_TRUE(local) << local.message();
    SessionOptions so;
    so.n_ctx = 128;
    so.n_threads = 2;
    for (const std::string& addr : {unix_->addr(), tcp_->addr()}) {
        SCOPED_TRACE(addr);
        ServedPair p;
        const std::string err = open_pair(addr, path, **local, so, &p);
        ASSERT_EQ(err, "");
        const size_t n_vocab = static_cast<size_t>((*local)->hparams().n_vocab);
        std::vector<int32_t> tokens = {1, 45, 99};
        for (int step = 0; step < 110; step++) {
            ASSERT_TRUE(p.local->decode(tokens, false).is_ok());
            ASSERT_TRUE(p.served->decode(tokens, false).is_ok());
            const float* a = p.local->logits(0);
            const float* b = p.served->logits(0);
            ASSERT_EQ(std::memcmp(a, b, n_vocab * sizeof(float)), 0) << "step " << step;
            // The next token: the local argmax, shifted so that the text does not settle
            // into a loop.
            const int32_t best = static_cast<int32_t>(std::max_element(a, a + n_vocab) - a);
            tokens = {static_cast<int32_t>((best + step) % static_cast<int32_t>(n_vocab))};
        }
        EXPECT_EQ(p.served->n_past(), 112);
        Expected<RemoteStats> st = remote_stats(p.reg.get());
        ASSERT_TRUE(st) << st.message();
        EXPECT_EQ(st->errors, 0u);
    }
}

// A served session that reads back only the sampler's candidates (set_top_k: TOP_K runs on the
// server's device) gets exactly the local row's best logits and ids, and over tcp its replies
// shrink from a whole row of logits a step to 8 bytes a candidate.
TEST_F(RemoteE2E, CandidatesComputedOnTheServerAreTheLocalRowsBest) {
    ASSERT_TRUE(have_fixtures());
    const std::string path = kTiny + "/tiny-llama-q8_0.gguf";
    Expected<std::unique_ptr<LlamaModel>> local = LlamaModel::load(path, {});
    ASSERT_TRUE(local) << local.message();
    SessionOptions so;
    so.n_ctx = 128;
    so.n_threads = 2;
    const int32_t n_vocab = (*local)->hparams().n_vocab;
    const int32_t k = 40;
    for (const std::string& addr : {unix_->addr(), tcp_->addr()}) {
        SCOPED_TRACE(addr);
        uint64_t bytes_in[2] = {};
        for (int with_top : {0, 1}) {
            ServedPair p;
            const std::string err = open_pair(addr, path, **local, so, &p);
            ASSERT_EQ(err, "");
            p.served->set_top_k(with_top ? k : 0);
            std::vector<int32_t> tokens = {1, 45, 99};
            ASSERT_TRUE(p.local->decode(tokens, false).is_ok());
            ASSERT_TRUE(p.served->decode(tokens, false).is_ok());
            Expected<RemoteStats> before = remote_stats(p.reg.get());
            ASSERT_TRUE(before) << before.message();
            for (int step = 0; step < 40; step++) {
                const float* a = p.local->logits(0);
                std::vector<std::pair<float, int32_t>> row;
                for (int32_t i = 0; i < n_vocab; i++) row.emplace_back(a[i], i);
                std::stable_sort(row.begin(), row.end(),
                                 [](const auto& x, const auto& y) { return x.first > y.first; });
                if (with_top) {
                    ASSERT_EQ(p.served->n_top(), k);
                    for (int32_t j = 0; j < k; j++) {
                        ASSERT_EQ(p.served->top_logits()[j], row[size_t(j)].first) << step;
                        ASSERT_EQ(p.served->top_ids()[j], row[size_t(j)].second) << step;
                    }
                } else {
                    ASSERT_EQ(std::memcmp(a, p.served->logits(0), size_t(n_vocab) * sizeof(float)),
                              0);
                }
                tokens = {(row[0].second + step) % n_vocab};
                ASSERT_TRUE(p.local->decode(tokens, false).is_ok());
                ASSERT_TRUE(p.served->decode(tokens, false).is_ok());
            }
            Expected<RemoteStats> after = remote_stats(p.reg.get());
            ASSERT_TRUE(after) << after.message();
            EXPECT_EQ(after->errors, 0u);
            bytes_in[with_top] = after->client_bytes_in - before->client_bytes_in;
        }
        // Over unix the server writes the logits into shared memory: no reply carries them.
        if (addr == unix_->addr()) continue;
        // 40 steps: a row is 4 KiB here (128256 tokens: 501 KiB); 40 candidates are 320 bytes.
        const uint64_t row_bytes = 40ull * uint64_t(n_vocab) * sizeof(float);
        EXPECT_GE(bytes_in[0], row_bytes);
        EXPECT_LE(bytes_in[1] + row_bytes * 9 / 10, bytes_in[0])
            << "whole rows " << bytes_in[0] << " B, candidates " << bytes_in[1] << " B";
    }
}

TEST_F(RemoteE2E, RunStreamsTheSameTextAsLocal) {
    ASSERT_TRUE(have_fixtures()) << "missing " << kTiny << "/tiny-llama-q4_0.gguf";
    const std::string cmd = std::string(FERRY_BIN) + " run -m " + kTiny +
                            "/tiny-llama-q8_0.gguf -p 'The license' -n 48 --temp 0 2>/dev/null";
    Proc l = sh(cmd);
    ASSERT_EQ(l.rc, 0);
    ASSERT_FALSE(l.out.empty());
    for (const std::string& addr : {unix_->addr(), tcp_->addr()}) {
        Proc r = sh(cmd + " --remote " + addr);
        EXPECT_EQ(r.rc, 0);
        EXPECT_EQ(r.out, l.out) << addr;
    }
}

TEST_F(RemoteE2E, FourLogitsClientsAtOnceThenServerMemoryBackToBaseline) {
    ASSERT_TRUE(have_fixtures()) << "missing " << kTiny << "/tiny-llama-q4_0.gguf";
    auto watcher = remote_open(unix_->addr());
    ASSERT_TRUE(watcher) << watcher.message();
    auto base = remote_stats(watcher->get());
    ASSERT_TRUE(base);
    const std::string model = kTiny + "/tiny-llama-q4_k_m.gguf";
    const std::string local = dir_ + "/four.local";
    Proc l = sh(std::string(FERRY_BIN) + " logits -m " + model +
                " --tokens 1,2,3,4,5,6,7,8,9,10 --out " + local + " 2>&1");
    ASSERT_EQ(l.rc, 0) << l.out;
    for (const std::string& addr : {unix_->addr(), tcp_->addr()}) {
        SCOPED_TRACE(addr);
        std::vector<std::thread> ts;
        std::vector<Proc> res(4);
        for (int i = 0; i < 4; i++) {
            ts.emplace_back([&, i] {
                res[static_cast<size_t>(i)] =
                    sh(std::string(FERRY_BIN) + " logits -m " + model +
                       " --tokens 1,2,3,4,5,6,7,8,9,10 --out " + dir_ + "/four." +
                       std::to_string(i) + " --remote " + addr + " 2>&1");
            });
        }
        for (auto& t : ts) t.join();
        for (int i = 0; i < 4; i++) {
            EXPECT_EQ(res[static_cast<size_t>(i)].rc, 0) << res[static_cast<size_t>(i)].out;
            EXPECT_TRUE(slurp(local) == slurp(dir_ + "/four." + std::to_string(i)));
        }
    }
    uint64_t bytes = UINT64_MAX;
    for (int i = 0; i < 100 && bytes != base->server_bytes; i++) {
        auto s = remote_stats(watcher->get());
        ASSERT_TRUE(s);
        bytes = s->server_bytes;
        if (bytes != base->server_bytes) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(bytes, base->server_bytes);
}

// SIGKILL of the server mid-generation: the client exits non-zero within 5 s, naming it.
TEST(RemoteFaults, ServerKilledMidGeneration) {
    ASSERT_TRUE(have_fixtures()) << "missing " << kTiny << "/tiny-llama-q4_0.gguf";
    for (const std::string transport : {"unix", "tcp"}) {
        SCOPED_TRACE(transport);
        const std::string dir = ferry::test::make_temp_dir();
        ServerProcess srv;
        std::string err;
        ASSERT_TRUE(
            srv.start(transport == "unix" ? "unix:" + dir + "/k" : "tcp:127.0.0.1:0", {}, &err))
            << err;
        // The client: ferry run generating for long, stdout to a pipe we watch.
        int out[2];
        ASSERT_EQ(pipe(out), 0);
        const std::string errfile = dir + "/client.err";
        const pid_t child = fork();
        if (child == 0) {
            dup2(out[1], 1);
            close(out[0]);
            const int ef = open(errfile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(ef, 2);
            const std::string model = kTiny + "/tiny-llama-f32.gguf";
            execl(FERRY_BIN, FERRY_BIN, "run", "-m", model.c_str(), "-p", "The", "-n", "100000",
                  "-c", "4096", "--temp", "1.0", "--seed", "7", "--remote", srv.addr().c_str(),
                  static_cast<char*>(nullptr));
            _exit(127);
        }
        close(out[1]);
        // Wait for generated text, then kill the server.
        std::string got;
        char buf[256];
        while (got.size() < 64) {
            const ssize_t n = read(out[0], buf, sizeof(buf));
            if (n <= 0) break;
            got.append(buf, static_cast<size_t>(n));
        }
        ASSERT_GE(got.size(), 64u) << "client ended before the kill";
        srv.kill9();
        const auto t0 = std::chrono::steady_clock::now();
        // Drain stdout so the client never blocks on it.
        std::thread drain([fd = out[0]] {
            char b[4096];
            while (read(fd, b, sizeof(b)) > 0) {
            }
            close(fd);
        });
        int status = 0;
        pid_t w = 0;
        while ((w = waitpid(child, &status, WNOHANG)) == 0 &&
               std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (w == 0) {
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
        }
        drain.join();
        EXPECT_LT(secs, 5.0);
        ASSERT_TRUE(WIFEXITED(status));
        EXPECT_NE(WEXITSTATUS(status), 0);
        const std::string msg = slurp(errfile);
        EXPECT_NE(msg.find(srv.addr()), std::string::npos) << msg;
    }
}

// FERRY_STEP_TRACE: a client and its server each write their frames' events on one clock,
// and they line up: as many computes on both sides, and each compute's header reaches the
// server after a send of the client and before the client has its reply
// (bench/tools/step-trace.py reads the same files).
TEST(RemoteStepTrace, ClientAndServerEventsLineUpOnOneClock) {
    ASSERT_TRUE(have_fixtures()) << "missing " << kTiny << "/tiny-llama-q4_0.gguf";
    const std::string dir = ferry::test::make_temp_dir();
    ServerProcess srv;
    std::string err;
    ::setenv("FERRY_STEP_TRACE", dir.c_str(), 1);  // inherited by the server
    const bool up = srv.start("tcp:127.0.0.1:0", {"--device", "CPU"}, &err);
    ::unsetenv("FERRY_STEP_TRACE");
    ASSERT_TRUE(up) << err;
    Proc p = sh("FERRY_STEP_TRACE=" + dir + " " + std::string(FERRY_BIN) + " bench -m " + kTiny +
                "/tiny-llama-q8_0.gguf -p 0 -n 16 -r 1 --remote " + srv.addr() + " 2>&1");
    ASSERT_EQ(p.rc, 0) << p.out;
    // The server writes its connection's file (whole, by a rename) once the session ends.
    std::map<std::string, std::vector<TraceEvent>> files;  // "client" / "server" -> events
    for (int i = 0; i < 500 && !files.count("server"); i++) {
        if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        files.clear();
        for (TraceFile& f : read_step_traces(dir)) {
            std::vector<TraceEvent>& to = files[f.role];
            to.insert(to.end(), f.events.begin(), f.events.end());
        }
    }
    ASSERT_EQ(files.size(), 2u) << "expected one client and one server file in " << dir;
    const std::vector<TraceEvent>& c = files["client"];
    const std::vector<TraceEvent>& s = files["server"];
    constexpr unsigned kCompute = 12;  // GRAPH_COMPUTE
    std::vector<int64_t> sends, replies, arrivals;
    for (const TraceEvent& e : c) {
        if (e.kind == 'S') sends.push_back(e.t);
        if (e.kind == 'E' && e.cmd == kCompute) replies.push_back(e.t);
    }
    for (const TraceEvent& e : s) {
        if (e.kind == 'H' && e.cmd == kCompute) arrivals.push_back(e.t);
    }
    ASSERT_GE(replies.size(), 16u);
    ASSERT_EQ(arrivals.size(), replies.size());
    for (size_t i = 0; i < arrivals.size(); i++) {
        EXPECT_TRUE(!sends.empty() && sends.front() <= arrivals[i]) << "compute " << i;
        EXPECT_LT(arrivals[i], replies[i]) << "compute " << i;
    }
}

}  // namespace
