// What a unix session's decode step would save if its frames crossed in shared memory instead
// of the socket (stop 47's step traces on the GPU host: the compute reaches the server 4-8 us
// after the client's send, the reply reaches the client 2-4 us after the server's). Two
// processes pass a request of REQUEST bytes and a reply of REPLY bytes back and forth, ROUNDS
// times, three ways:
//   - a Unix stream socket, both sides polling it without sleeping (MSG_DONTWAIT), as ferry
//     serve and its clients do on a host with spare cores;
//   - the same socket, both sides blocking in recv (what smaller hosts do);
//   - a doorbell in shared memory: the request's bytes in a shared page, then a sequence number
//     the server polls; the server copies the request out before it reads it (a client can
//     still change shared bytes), answers in a second page and bumps a second number.
// Each round's reply carries the round's number and a sum of the request's bytes, checked by
// the client, so every form moves the bytes it claims to. Prints the round trip's median and
// 10th/90th/99th percentiles per form. Standalone: nothing of ferry is used.
//
//   bench_unix_doorbell [REQUEST_BYTES] [REPLY_BYTES] [ROUNDS] [CLIENT_CPU SERVER_CPU]
//
// The CPUs, when given, pin the two processes (sched_setaffinity), to see what placement does.
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "socket-bench.h"

namespace {

using bench::die;
using bench::recv_all;
using bench::send_all;

constexpr size_t kMaxBytes = 1u << 16;

// The shared pages (MAP_SHARED, mapped before the fork: the same physical pages in both).
struct Shared {
    alignas(64) std::atomic<uint64_t> req_seq;
    alignas(64) std::atomic<uint64_t> rep_seq;
    alignas(64) uint8_t req[kMaxBytes];
    alignas(64) uint8_t rep[kMaxBytes];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters need lock-free atomics");

enum class Form { SocketSpin, SocketBlock, Doorbell };

uint64_t sum_of(const uint8_t* p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += p[i];
    return s;
}

// The request of round r: bytes that change every round.
void fill_request(uint8_t* p, size_t n, int r) {
    for (size_t i = 0; i < n; i++) p[i] = static_cast<uint8_t>(i * 31u + static_cast<unsigned>(r));
}

// The reply: the round's number and the request's sum, then filler.
void make_reply(uint8_t* p, size_t n, uint64_t round, uint64_t sum) {
    std::memset(p, 0x5a, n);
    std::memcpy(p, &round, 8);
    std::memcpy(p + 8, &sum, 8);
}

void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) die("sched_setaffinity");
}

void serve(Form form, int fd, Shared* sh, size_t req_n, size_t rep_n, int rounds) {
    std::vector<uint8_t> req(req_n), rep(rep_n);
    const bool spin = form != Form::SocketBlock;
    for (int r = 0; r < rounds; r++) {
        if (form == Form::Doorbell) {
            const uint64_t want = static_cast<uint64_t>(r) + 1;
            while (sh->req_seq.load(std::memory_order_acquire) != want) {
            }
            std::memcpy(req.data(), sh->req, req_n);  // out of the client's reach first
            make_reply(sh->rep, rep_n, static_cast<uint64_t>(r), sum_of(req.data(), req_n));
            sh->rep_seq.store(want, std::memory_order_release);
        } else {
            if (!recv_all(fd, req.data(), req_n, spin)) return;
            make_reply(rep.data(), rep_n, static_cast<uint64_t>(r), sum_of(req.data(), req_n));
            send_all(fd, rep.data(), rep_n, spin);
        }
    }
}

// The client's rounds; false when a reply is not the one its request asked for.
bool client(Form form, int fd, Shared* sh, size_t req_n, size_t rep_n, int rounds,
            std::vector<double>* times) {
    std::vector<uint8_t> req(req_n), rep(rep_n);
    const bool spin = form != Form::SocketBlock;
    for (int r = 0; r < rounds; r++) {
        fill_request(req.data(), req_n, r);
        const auto t0 = std::chrono::steady_clock::now();
        if (form == Form::Doorbell) {
            const uint64_t want = static_cast<uint64_t>(r) + 1;
            std::memcpy(sh->req, req.data(), req_n);
            sh->req_seq.store(want, std::memory_order_release);
            while (sh->rep_seq.load(std::memory_order_acquire) != want) {
            }
            std::memcpy(rep.data(), sh->rep, rep_n);
        } else {
            send_all(fd, req.data(), req_n, spin);
            if (!recv_all(fd, rep.data(), rep_n, spin)) return false;
        }
        const auto t1 = std::chrono::steady_clock::now();
        uint64_t round = 0, sum = 0;
        std::memcpy(&round, rep.data(), 8);
        std::memcpy(&sum, rep.data() + 8, 8);
        if (round != static_cast<uint64_t>(r) || sum != sum_of(req.data(), req_n)) {
            std::fprintf(stderr, "bench_unix_doorbell: round %d: reply for round %llu, sum %llu\n",
                         r, static_cast<unsigned long long>(round),
                         static_cast<unsigned long long>(sum));
            return false;
        }
        times->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    const size_t req_n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
    const size_t rep_n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 128;
    const int rounds = argc > 3 ? std::atoi(argv[3]) : 20000;
    const int client_cpu = argc > 5 ? std::atoi(argv[4]) : -1;
    const int server_cpu = argc > 5 ? std::atoi(argv[5]) : -1;
    if (req_n < 1 || rep_n < 16 || req_n > kMaxBytes || rep_n > kMaxBytes || rounds < 10) {
        std::fprintf(stderr,
                     "usage: bench_unix_doorbell [REQUEST_BYTES 1..65536] [REPLY_BYTES 16..65536] "
                     "[ROUNDS >= 10] [CLIENT_CPU SERVER_CPU]\n");
        return 2;
    }
    void* mem =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) die("mmap");
    std::printf("request %zu bytes, reply %zu bytes, %d rounds, cpus %d/%d\n", req_n, rep_n, rounds,
                client_cpu, server_cpu);
    std::printf("| form | median us | p10 | p90 | p99 |\n| --- | ---: | ---: | ---: | ---: |\n");
    static const char* const kNames[3] = {"unix socket, both polling", "unix socket, both blocking",
                                          "shared-memory doorbell, both polling"};
    for (Form form : {Form::SocketSpin, Form::SocketBlock, Form::Doorbell}) {
        Shared* sh = new (mem) Shared();
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair");
        const pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            ::close(sv[0]);
            pin(server_cpu);
            serve(form, sv[1], sh, req_n, rep_n, rounds);
            std::_Exit(0);
        }
        ::close(sv[1]);
        pin(client_cpu);
        std::vector<double> t;
        const bool ok = client(form, sv[0], sh, req_n, rep_n, rounds, &t);
        ::close(sv[0]);
        if (!ok) kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        if (!ok) return 1;
        t.erase(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 10));  // warm-up
        std::sort(t.begin(), t.end());
        std::printf("| %s | %.2f | %.2f | %.2f | %.2f |\n", kNames[static_cast<int>(form)],
                    t[t.size() / 2], t[t.size() / 10], t[t.size() * 9 / 10],
                    t[t.size() * 99 / 100]);
        std::fflush(stdout);
    }
    munmap(mem, sizeof(Shared));
    return 0;
}
