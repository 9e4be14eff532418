// bench_remote: round-trip latency, set/get bandwidth and a pipelined decode-like step through
// the remote backend, per transport, against a `ferry serve` this program starts.
//
//   bench_remote [--ferry PATH] [--mib N] [--pings N] [--steps N] [-t THREADS]
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
#include <string>
#include <vector>

#include "ferry/remote.h"
#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/backends.h"
#include "ferry/graph.h"

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

int run(int argc, char** argv) {
    std::string ferry;
    size_t mib = 64;
    int pings = 2000, steps = 500, threads = 0;
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
        } else {
            std::fprintf(stderr,
                         "usage: bench_remote [--ferry PATH] [--mib N] [--pings N] "
                         "[--steps N] [-t THREADS]\n");
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
    if (us.addr.empty() || tc.addr.empty()) {
        std::fprintf(stderr, "bench_remote: could not start %s serve\n", ferry.c_str());
        return 1;
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
    for (const Child* c : {&us, &tc}) {
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
                    c->addr.rfind("unix:", 0) == 0 ? "unix (shared memory)" : "tcp loopback",
                    percentile(rtt, 0.5), percentile(rtt, 0.99),
                    static_cast<double>(n) / (set_best * 1e3),
                    static_cast<double>(n) / (get_best * 1e3), step ? *step : -1.0);
    }
    kill(us.pid, SIGTERM);
    kill(tc.pid, SIGTERM);
    waitpid(us.pid, nullptr, 0);
    waitpid(tc.pid, nullptr, 0);
    return rc;
}

}  // namespace

int main(int argc, char** argv) {
    ferry::init_backends();
    return run(argc, argv);
}
