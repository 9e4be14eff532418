// What the standalone socket benchmarks (bench_tcp_stripes, bench_unix_doorbell) share: an exit
// naming the failing call, and whole sends and receives that either poll (MSG_DONTWAIT,
// retried at once, as ferry's spinning sockets do) or block.
#pragma once

#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bench {

// "PROGRAM: WHAT: the error's message", then exit 1.
[[noreturn]] inline void die(const char* what) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, std::strerror(errno));
    std::exit(1);
}

inline void send_all(int fd, const uint8_t* p, size_t n, bool poll = true) {
    while (n > 0) {
        const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | (poll ? MSG_DONTWAIT : 0));
        if (k < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            die("send");
        }
        p += k;
        n -= static_cast<size_t>(k);
    }
}

// False when the peer closed the connection first.
inline bool recv_all(int fd, uint8_t* p, size_t n, bool poll = true) {
    while (n > 0) {
        const ssize_t k = ::recv(fd, p, n, poll ? MSG_DONTWAIT : 0);
        if (k == 0) return false;
        if (k < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            die("recv");
        }
        p += k;
        n -= static_cast<size_t>(k);
    }
    return true;
}

}  // namespace bench
