// How fast a reply of S bytes crosses tcp loopback when it is striped over N connections, each
// sent and received by its own spinning thread: the question behind `ferry serve`'s tcp target
// (a decode step's 513 KB of logits take ~100 us over one connection on the H200 host).
//
//   bench_tcp_stripes [SIZE_BYTES] [ROUNDS]
//
// A forked server process answers each 16-byte request on connection 0 with SIZE bytes, split
// into N equal stripes, stripe i on connection i (i > 0 by helper threads spinning on a shared
// counter). The client sends the request and receives the stripes the same way. Prints the
// median and 10th/90th percentile of the round trip per N. Standalone: nothing of ferry is used.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "socket-bench.h"

namespace {

using bench::die;
using bench::recv_all;
using bench::send_all;

void nodelay(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Stripe i of n of a size-byte payload: [begin, end).
size_t stripe_begin(size_t size, int n, int i) {
    return (size / static_cast<size_t>(n)) * static_cast<size_t>(i);
}
size_t stripe_end(size_t size, int n, int i) {
    return i == n - 1 ? size : stripe_begin(size, n, i + 1);
}

// Runs one side's rounds: on the server, wait for a request on fds[0] then send; on the client,
// send a request then receive. Helpers spin on `go` (the round number) and count `done`.
double run_side(bool server, const std::vector<int>& fds, size_t size, int rounds,
                std::vector<double>* times) {
    const int n = static_cast<int>(fds.size());
    std::vector<uint8_t> buf(size, 0x5a);
    std::atomic<int> go{0}, done{0};
    std::atomic<bool> quit{false};
    std::vector<std::thread> helpers;
    for (int i = 1; i < n; i++) {
        helpers.emplace_back([&, i] {
            int seen = 0;
            for (;;) {
                while (go.load(std::memory_order_acquire) == seen) {
                    if (quit.load(std::memory_order_relaxed)) return;
                }
                seen++;
                const size_t b = stripe_begin(size, n, i), e = stripe_end(size, n, i);
                if (server) {
                    send_all(fds[static_cast<size_t>(i)], buf.data() + b, e - b);
                } else if (!recv_all(fds[static_cast<size_t>(i)], buf.data() + b, e - b)) {
                    return;
                }
                done.fetch_add(1, std::memory_order_acq_rel);
            }
        });
    }
    uint8_t req[16] = {};
    for (int r = 0; r < rounds; r++) {
        const auto t0 = std::chrono::steady_clock::now();
        if (server) {
            if (!recv_all(fds[0], req, sizeof(req))) break;
        } else {
            send_all(fds[0], req, sizeof(req));
        }
        go.fetch_add(1, std::memory_order_release);
        const size_t e = stripe_end(size, n, 0);
        if (server) {
            send_all(fds[0], buf.data(), e);
        } else if (!recv_all(fds[0], buf.data(), e)) {
            break;
        }
        while (done.load(std::memory_order_acquire) < (r + 1) * (n - 1)) {
        }
        const auto t1 = std::chrono::steady_clock::now();
        if (times) times->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    quit.store(true);
    for (auto& t : helpers) t.join();
    return 0.0;
}

}  // namespace

int main(int argc, char** argv) {
    const size_t size = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 128256 * 4;
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 2000;
    std::printf(
        "| stripes | median us | p10 | p90 | GB/s (median) |\n| ---: | ---: | ---: | ---: | ---: "
        "|\n");
    for (int n : {1, 2, 3, 4, 6, 8}) {
        const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (lfd < 0) die("socket");
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("bind");
        if (::listen(lfd, 16) != 0) die("listen");
        socklen_t al = sizeof(a);
        if (getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &al) != 0) die("getsockname");
        const pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            std::vector<int> fds;
            for (int i = 0; i < n; i++) {
                const int fd = ::accept(lfd, nullptr, nullptr);
                if (fd < 0) die("accept");
                nodelay(fd);
                fds.push_back(fd);
            }
            run_side(true, fds, size, rounds, nullptr);
            std::_Exit(0);
        }
        ::close(lfd);
        std::vector<int> fds;
        for (int i = 0; i < n; i++) {
            const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
            if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
                die("connect");
            }
            nodelay(fd);
            fds.push_back(fd);
        }
        std::vector<double> t;
        run_side(false, fds, size, rounds, &t);
        for (int fd : fds) ::close(fd);
        int status = 0;
        waitpid(pid, &status, 0);
        if (t.size() < 10) {
            std::fprintf(stderr, "bench_tcp_stripes: only %zu rounds\n", t.size());
            return 1;
        }
        t.erase(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 10));  // warm-up
        std::sort(t.begin(), t.end());
        const double med = t[t.size() / 2];
        std::printf("| %d | %.1f | %.1f | %.1f | %.2f |\n", n, med, t[t.size() / 10],
                    t[t.size() * 9 / 10], static_cast<double>(size) / med / 1e3);
        std::fflush(stdout);
    }
    return 0;
}
