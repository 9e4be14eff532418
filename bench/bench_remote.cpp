// bench_remote: round-trip latency, set/get bandwidth and a pipelined decode-like step through
// the remote backend, per transport, against a `ferry serve` this program starts.
//
//   bench_remote [--ferry PATH] [--mib N] [--pings N] [--steps N] [-t THREADS]
//   bench_remote --ab-steps N [--logits N] [--server-ab] [-t THREADS]
//       a decode-like step, batching off against on (--logits: N floats read back too, as a
//       decode step's logits: 128256 for Llama 3); --server-ab adds the default client on a
//       second server of each transport with the server's per-step changes off
//       (FERRY_SERVE_DEFER_SYNC=0 FERRY_SERVE_REVALIDATE_ALL=1)
//
// -t sets the CPU threads of the local backend and of the servers' sessions (default: all
// cores).
//
// Prints a markdown report (bench/results/remote*.md record its output).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/backends.h"
#include "ferry/graph.h"
#include "ferry/remote.h"

using namespace ferry;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
    return v[i];
}

struct Child {
    pid_t pid = -1;
    std::string addr;
};

Child spawn_server(const std::string& ferry, const std::string& listen, int threads) {
    int fds[2];
    Child c;
    if (pipe(fds) != 0) return c;
    c.pid = fork();
    if (c.pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        const std::string t = std::to_string(threads > 0 ? threads : 0);
        if (threads > 0) {
            execl(ferry.c_str(), ferry.c_str(), "serve", "--listen", listen.c_str(), "-t",
                  t.c_str(), static_cast<char*>(nullptr));
        } else {
            execl(ferry.c_str(), ferry.c_str(), "serve", "--listen", listen.c_str(),
                  static_cast<char*>(nullptr));
        }
        _exit(127);
    }
    close(fds[1]);
    std::string line;
    char ch;
    while (read(fds[0], &ch, 1) == 1 && ch != '\n') line += ch;
    close(fds[0]);
    const std::string key = "listening on ";
    const size_t at = line.find(key);
    if (at != std::string::npos) c.addr = line.substr(at + key.size());
    return c;
}

// Set inputs + compute + read outputs of a small graph (one decode-like step).
struct Step {
    Context ctx;
    Tensor* a = nullptr;
    Tensor* b = nullptr;
    Tensor* out = nullptr;
    Graph g;
    std::unique_ptr<Buffer> buf;
};

Status make_step(Step& s, Device* dev) {
    s.a = s.ctx.new_tensor(Type::F32, {1024});
    s.b = s.ctx.new_tensor(Type::F32, {1024});
    s.out = s.ctx.add(s.a, s.b);
    s.out->flags |= kTensorOutput;
    s.g.build_forward(s.out);
    Expected<std::unique_ptr<Buffer>> b = allocate_context_tensors(s.ctx, dev->buffer_type());
    if (!b) return b.status();
    s.buf = std::move(*b);
    return Status::ok();
}

Expected<double> step_median_us(Device* dev, Backend* be, int steps) {
    Step s;
    FERRY_TRY(make_step(s, dev));
    std::vector<float> x(1024, 1.5f), y(1024, 2.0f), out(1024);
    std::vector<double> t;
    for (int i = 0; i < steps; i++) {
        x[0] = static_cast<float>(i);
        const auto t0 = Clock::now();
        FERRY_TRY(be->set_tensor_async(s.a, x.data(), 0, 4096));
        FERRY_TRY(be->set_tensor_async(s.b, y.data(), 0, 4096));
        FERRY_TRY(be->compute(s.g));
        FERRY_TRY(be->get_tensor_async(s.out, out.data(), 0, 4096));
        FERRY_TRY(be->synchronize());
        t.push_back(us_since(t0));
        if (out[0] != static_cast<float>(i) + 2.0f) return Status::error("wrong step result");
    }
    return percentile(t, 0.5);
}

// A decode-like step in memory the client does not map (server-private buffers: what a GPU's
// memory is to a unix client): five small input writes (as a llama step's tokens, positions,
// mask, output ids and output mask), a small compute, the read of its result.
struct DecodeStep {
    Context ctx;
    Tensor* in[5] = {};
    Tensor* out = nullptr;
    Graph g;
    std::unique_ptr<Buffer> buf;
    std::unique_ptr<Backend> be;
    std::vector<std::vector<uint8_t>> data;
    std::vector<float> got;
    Tensor* logits = nullptr;  // --logits N: N floats read back each step besides the result
    std::vector<float> logits_got;
};

Status make_decode_step(DecodeStep& s, Device* dev, int64_t logits) {
    s.in[0] = s.ctx.new_tensor(Type::I32, {1});
    s.in[1] = s.ctx.new_tensor(Type::I32, {1});
    s.in[2] = s.ctx.new_tensor(Type::F32, {1024});
    s.in[3] = s.ctx.new_tensor(Type::I32, {1});
    s.in[4] = s.ctx.new_tensor(Type::F32, {1024});
    s.out = s.ctx.add(s.in[2], s.in[4]);
    s.out->flags |= kTensorOutput;
    s.g.build_forward(s.out);
    if (logits > 0) {
        s.logits = s.ctx.new_tensor(Type::F32, {logits});
        s.logits_got.resize(static_cast<size_t>(logits));
    }
    Expected<std::unique_ptr<Buffer>> b =
        allocate_context_tensors(s.ctx, dev->buffer_type(), BufferUsage::Weights);
    if (!b) return b.status();
    s.buf = std::move(*b);
    Expected<std::unique_ptr<Backend>> be = dev->make_backend();
    if (!be) return be.status();
    s.be = std::move(*be);
    for (Tensor* t : s.in) s.data.emplace_back(t->nbytes(), uint8_t{0x3c});
    s.got.resize(1024);
    return Status::ok();
}

Expected<double> decode_step_us(DecodeStep& s, int i) {
    const float v = static_cast<float>(i);
    std::memcpy(s.data[2].data(), &v, sizeof(v));
    const auto t0 = Clock::now();
    for (int k = 0; k < 5; k++) {
        FERRY_TRY(s.be->set_tensor_async(s.in[k], s.data[k].data(), 0, s.data[k].size()));
    }
    FERRY_TRY(s.be->compute(s.g));
    FERRY_TRY(s.be->get_tensor_async(s.out, s.got.data(), 0, 4096));
    if (s.logits) {
        FERRY_TRY(s.be->get_tensor_async(s.logits, s.logits_got.data(), 0, s.logits->nbytes()));
    }
    FERRY_TRY(s.be->synchronize());
    const double us = us_since(t0);
    float want;
    std::memcpy(&want, s.data[2].data(), 4);
    float other;
    std::memcpy(&other, s.data[4].data(), 4);
    want += other;
    if (s.got[0] != want) return Status::error("wrong decode step result");
    return us;
}

// --ab-steps N: per transport, the decode-like step through three connections of this
// process, in turn step by step, N steps each, so that the medians compare them in the same
// seconds (the load of a shared machine comes in bursts): the step batching off
// (FERRY_REMOTE_FOLD=0 FERRY_REMOTE_HOLD_COMPUTE=0: every input its own TENSOR_SET frame and the
// compute sent apart from the read, as protocol 3 clients sent a step), the inputs folded into the
// compute's frame only, and both (the default).
int run_ab(const std::vector<const Child*>& servers, const std::vector<const Child*>& old_servers,
           int steps, int64_t logits) {
    const bool server_ab = !old_servers.empty();
    std::printf(
        "| transport | step median, batching off (us) | inputs folded (us) | folded + compute "
        "held (us) | folded / off | both / off |%s\n",
        server_ab ? " both, server changes off (us) | server on / off |" : "");
    std::printf("|---|---|---|---|---|---|%s\n", server_ab ? "---|---|" : "");
    const int kVariants = server_ab ? 4 : 3;
    for (size_t si = 0; si < servers.size(); si++) {
        const Child* c = servers[si];
        std::unique_ptr<Registry> regs[4];
        DecodeStep st[4];
        for (int v = 0; v < kVariants; v++) {
            setenv("FERRY_REMOTE_FOLD", v == 0 ? "0" : "1", 1);
            setenv("FERRY_REMOTE_HOLD_COMPUTE", v >= 2 ? "1" : "0", 1);
            Expected<std::unique_ptr<Registry>> reg =
                remote_open(v == 3 ? old_servers[si]->addr : c->addr);
            if (!reg) {
                std::fprintf(stderr, "%s\n", reg.message().c_str());
                return 1;
            }
            regs[v] = std::move(*reg);
            if (Status s = make_decode_step(st[v], regs[v]->devices()[0], logits); !s) {
                std::fprintf(stderr, "%s\n", s.message().c_str());
                return 1;
            }
        }
        unsetenv("FERRY_REMOTE_FOLD");
        unsetenv("FERRY_REMOTE_HOLD_COMPUTE");
        std::vector<double> t[4];
        // Each round takes the variants in a new random order: in a fixed order, with an even
        // number of variants, every other step ran fast and the others slow on the 2-core VM
        // (where the next wake-up lands), which split the variants into two groups.
        std::mt19937 rng(12345);
        int order[4] = {0, 1, 2, 3};
        for (int i = 0; i < kVariants * steps; i++) {
            if (i % kVariants == 0) std::shuffle(order, order + kVariants, rng);
            const int v = order[i % kVariants];
            Expected<double> us = decode_step_us(st[v], i);
            if (!us) {
                std::fprintf(stderr, "%s\n", us.message().c_str());
                return 1;
            }
            if (i >= 25 * kVariants) t[v].push_back(*us);  // the first 25 of each: warm-up
        }
        const double m0 = percentile(t[0], 0.5), m1 = percentile(t[1], 0.5),
                     m2 = percentile(t[2], 0.5);
        std::printf("| %s | %.1f | %.1f | %.1f | %.3f | %.3f |",
                    c->addr.rfind("unix:", 0) == 0 ? "unix" : "tcp loopback", m0, m1, m2, m1 / m0,
                    m2 / m0);
        if (server_ab) {
            const double m3 = percentile(t[3], 0.5);
            std::printf(" %.1f | %.3f |", m3, m2 / m3);
        }
        std::printf("\n");
    }
    return 0;
}

int run(int argc, char** argv) {
    std::string ferry;
    size_t mib = 64;
    int pings = 2000, steps = 500, threads = 0, ab_steps = 0;
    bool server_ab = false;
    int64_t logits = 0;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--ferry" && i + 1 < argc) {
            ferry = argv[++i];
        } else if (a == "--mib" && i + 1 < argc) {
            mib = static_cast<size_t>(std::atoi(argv[++i]));
        } else if (a == "--pings" && i + 1 < argc) {
            pings = std::atoi(argv[++i]);
        } else if (a == "--steps" && i + 1 < argc) {
            steps = std::atoi(argv[++i]);
        } else if (a == "-t" && i + 1 < argc) {
            threads = std::atoi(argv[++i]);
        } else if (a == "--ab-steps" && i + 1 < argc) {
            ab_steps = std::atoi(argv[++i]);
        } else if (a == "--server-ab") {
            server_ab = true;
        } else if (a == "--logits" && i + 1 < argc) {
            logits = std::atoll(argv[++i]);
        } else {
            std::fprintf(stderr,
                         "usage: bench_remote [--ferry PATH] [--mib N] [--pings N] "
                         "[--steps N] [-t THREADS] [--ab-steps N [--logits N] [--server-ab]]\n");
            return 2;
        }
    }
    if (ferry.empty()) {
        char self[4096];
        const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n <= 0) return 2;
        self[n] = 0;
        ferry = std::string(self);
        ferry = ferry.substr(0, ferry.rfind('/')) + "/ferry";
    }
    char dir[] = "/tmp/ferry-bench-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    Child us = spawn_server(ferry, std::string("unix:") + dir + "/s", threads);
    Child tc = spawn_server(ferry, "tcp:127.0.0.1:0", threads);
    // An ivshmem window, used from this host process as a guest would (the same rings).
    Child iv =
        spawn_server(ferry, std::string("ivshmem:/dev/shm/") + (dir + 5) + "-w,size=64M", threads);
    if (us.addr.empty() || tc.addr.empty() || iv.addr.empty()) {
        std::fprintf(stderr, "bench_remote: could not start %s serve\n", ferry.c_str());
        return 1;
    }
    if (ab_steps > 0) {
        // Not the ivshmem window: a window serves one client at a time.
        Child us_old, tc_old;
        if (server_ab) {
            setenv("FERRY_SERVE_DEFER_SYNC", "0", 1);
            setenv("FERRY_SERVE_REVALIDATE_ALL", "1", 1);
            us_old = spawn_server(ferry, std::string("unix:") + dir + "/s-old", threads);
            tc_old = spawn_server(ferry, "tcp:127.0.0.1:0", threads);
            unsetenv("FERRY_SERVE_DEFER_SYNC");
            unsetenv("FERRY_SERVE_REVALIDATE_ALL");
            if (us_old.addr.empty() || tc_old.addr.empty()) return 1;
        }
        std::vector<const Child*> old;
        if (server_ab) old = {&us_old, &tc_old};
        const int rc = run_ab({&us, &tc}, old, ab_steps, logits);
        for (const Child* c : {&us_old, &tc_old}) {
            if (c->pid > 0) {
                kill(c->pid, SIGTERM);
                waitpid(c->pid, nullptr, 0);
            }
        }
        for (const Child* c : {&us, &tc, &iv}) {
            kill(c->pid, SIGTERM);
            waitpid(c->pid, nullptr, 0);
        }
        unlink(iv.addr.substr(8).c_str());
        return rc;
    }
    std::printf(
        "| transport | empty request RTT median (us) | p99 (us) | set %zu MiB (GB/s) | get "
        "%zu MiB (GB/s) | set+compute+get step median (us) |\n",
        mib, mib);
    std::printf("|---|---|---|---|---|---|\n");
    {
        auto cpu_be = cpu_device()->make_backend();
        if (cpu_be && threads > 0) (*cpu_be)->set_n_threads(threads);
        Expected<double> local = step_median_us(cpu_device(), cpu_be->get(), steps);
        std::printf("| local CPU (no remoting) | - | - | - | - | %.1f |\n", local ? *local : -1.0);
    }
    int rc = 0;
    for (const Child* c : {&us, &tc, &iv}) {
        Expected<std::unique_ptr<Registry>> reg = remote_open(c->addr);
        if (!reg) {
            std::fprintf(stderr, "%s\n", reg.message().c_str());
            rc = 1;
            continue;
        }
        Device* dev = (*reg)->devices()[0];
        std::vector<double> rtt;
        for (int i = 0; i < pings; i++) {
            const auto t0 = Clock::now();
            if (!remote_ping(reg->get())) return 1;
            rtt.push_back(us_since(t0));
        }
        auto be = dev->make_backend();
        const size_t n = mib << 20;
        auto buf = dev->buffer_type()->allocate(n);
        if (!be || !buf) return 1;
        Tensor t;
        t.type = Type::F32;
        t.ne[0] = static_cast<int64_t>(n / 4);
        set_contiguous_strides(&t);
        t.buffer = buf->get();
        std::vector<uint8_t> data(n, 0x3c), back(n);
        double set_best = 1e30, get_best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            auto t0 = Clock::now();
            if (!(*be)->set_tensor_async(&t, data.data(), 0, n)) return 1;
            if (!(*be)->synchronize() || !remote_ping(reg->get())) return 1;
            set_best = std::min(set_best, us_since(t0));
            t0 = Clock::now();
            if (!(*be)->get_tensor_async(&t, back.data(), 0, n)) return 1;
            if (!(*be)->synchronize()) return 1;
            get_best = std::min(get_best, us_since(t0));
        }
        if (back != data) {
            std::fprintf(stderr, "bench_remote: data mismatch\n");
            return 1;
        }
        Expected<double> step = step_median_us(dev, be->get(), steps);
        std::printf("| %s | %.1f | %.1f | %.2f | %.2f | %.1f |\n",
                    c->addr.rfind("unix:", 0) == 0      ? "unix (shared memory)"
                    : c->addr.rfind("ivshmem:", 0) == 0 ? "ivshmem window (host process)"
                                                        : "tcp loopback",
                    percentile(rtt, 0.5), percentile(rtt, 0.99),
                    static_cast<double>(n) / (set_best * 1e3),
                    static_cast<double>(n) / (get_best * 1e3), step ? *step : -1.0);
    }
    for (const Child* c : {&us, &tc, &iv}) {
        kill(c->pid, SIGTERM);
        waitpid(c->pid, nullptr, 0);
    }
    unlink(iv.addr.substr(8).c_str());
    return rc;
}

}  // namespace

int main(int argc, char** argv) {
    ferry::init_backends();
    return run(argc, argv);
}
