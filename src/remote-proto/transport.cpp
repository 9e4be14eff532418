#include "remote-proto/transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace ferry::remote {

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

bool spare_cores() {
    return std::thread::hardware_concurrency() >= 8;
}

bool Address::is_loopback() const {
    if (kind == Kind::Unix) return true;
    if (host == "localhost" || host == "::1") return true;
    in_addr a{};
    if (inet_pton(AF_INET, host.c_str(), &a) == 1) {
        return (ntohl(a.s_addr) >> 24) == 127;
    }
    return false;
}

Expected<Address> parse_address(const std::string& s) {
    Address a;
    a.text = s;
    if (s.rfind("unix:", 0) == 0) {
        a.kind = Address::Kind::Unix;
        a.path = s.substr(5);
        if (a.path.empty()) return Status::errorf("address '%s': empty socket path", s.c_str());
        if (a.path.size() >= sizeof(sockaddr_un::sun_path)) {
            return Status::errorf("address '%s': socket path longer than %zu bytes", s.c_str(),
                                  sizeof(sockaddr_un::sun_path) - 1);
        }
        return a;
    }
    if (s.rfind("tcp:", 0) == 0) {
        a.kind = Address::Kind::Tcp;
        std::string rest = s.substr(4);
        std::string port;
        if (!rest.empty() && rest[0] == '[') {
            const size_t close = rest.find(']');
            if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
                return Status::errorf("address '%s': expected tcp:[HOST]:PORT", s.c_str());
            }
            a.host = rest.substr(1, close - 1);
            port = rest.substr(close + 2);
        } else {
            const size_t colon = rest.rfind(':');
            if (colon == std::string::npos) {
                return Status::errorf("address '%s': expected tcp:HOST:PORT", s.c_str());
            }
            a.host = rest.substr(0, colon);
            port = rest.substr(colon + 1);
        }
        if (a.host.empty()) return Status::errorf("address '%s': empty host", s.c_str());
        char* end = nullptr;
        const long p = std::strtol(port.c_str(), &end, 10);
        if (port.empty() || *end != '\0' || p < 0 || p > 65535) {
            return Status::errorf("address '%s': bad port '%s'", s.c_str(), port.c_str());
        }
        a.port = static_cast<int>(p);
        return a;
    }
    return Status::errorf("address '%s': expected unix:PATH or tcp:HOST:PORT", s.c_str());
}

namespace {

// Descriptors that came with a received message: appended to *fds, or closed.
void take_fds(msghdr* msg, std::vector<int>* fds) {
    for (cmsghdr* c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd = -1;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (fds) {
                fds->push_back(fd);
            } else {
                ::close(fd);
            }
        }
    }
}

}  // namespace

Socket::~Socket() {
    close();
}

Socket& Socket::operator=(Socket&& o) noexcept {
    if (this != &o) {
        close();
        fd_ = o.fd_;
        o.fd_ = -1;
    }
    return *this;
}

void Socket::close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

void Socket::shutdown_both() {
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Status Socket::send_all(const void* a, size_t na, const void* b, size_t nb, int pass_fd) {
    const iovec parts[2] = {{const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
    return send_parts(parts, 2, pass_fd);
}

namespace {

// The non-empty ones of n pieces, into left (kMaxParts of room); returns how many.
int nonempty_parts(const iovec* parts, int n, iovec* left) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (parts[i].iov_len) left[k++] = parts[i];
    }
    return k;
}

// Drops the first `done` bytes of pieces left[first, n) (first moves past the emptied ones).
void consume_parts(iovec* left, int n, int& first, size_t done) {
    while (first < n && done > 0) {
        const size_t take = std::min(done, left[first].iov_len);
        left[first].iov_base = static_cast<uint8_t*>(left[first].iov_base) + take;
        left[first].iov_len -= take;
        done -= take;
        if (left[first].iov_len == 0) first++;
    }
}

}  // namespace

Status Socket::send_parts(const iovec* parts, int n_parts, int pass_fd) {
    if (n_parts < 0 || n_parts > kMaxParts) return Status::errorf("send: %d pieces", n_parts);
    iovec left[kMaxParts];
    int first = 0;
    const int n = nonempty_parts(parts, n_parts, left);
    bool fd_pending = pass_fd >= 0;
    int64_t send_deadline = 0, spin_until = 0;
    while (first < n) {
        msghdr msg{};
        msg.msg_iov = left + first;
        msg.msg_iovlen = static_cast<size_t>(n - first);
        alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
        if (fd_pending) {
            std::memset(ctrl, 0, sizeof(ctrl));
            msg.msg_control = ctrl;
            msg.msg_controllen = sizeof(ctrl);
            cmsghdr* c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
        }
        // A socket that spins before a receive blocks also retries a full send buffer
        // without sleeping for as long (the peer is draining it, and a sleeping sender pays
        // a wake-up for every refill).
        const bool spinning = spin_ns_ && (!spin_until || now_ns() < spin_until);
        const ssize_t sent =
            ::sendmsg(fd_, &msg, MSG_NOSIGNAL | (frame_ms_ || spinning ? MSG_DONTWAIT : 0));
        if (sent < 0) {
            if (errno == EINTR) continue;
            if (spinning && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                if (!spin_until) spin_until = now_ns() + spin_ns_;
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (frame_ms_) {
                    // The whole send must finish within the frame timeout from here.
                    if (!send_deadline) send_deadline = now_ns() + int64_t{frame_ms_} * 1000000;
                    if (wait_until_deadline(POLLOUT, send_deadline)) continue;
                }
                return Status::error("send timed out: the peer stopped reading");
            }
            return Status::errorf("send: %s", std::strerror(errno));
        }
        fd_pending = false;
        consume_parts(left, n, first, static_cast<size_t>(sent));
    }
    return Status::ok();
}

bool Socket::wait_until_deadline(short events, int64_t deadline_ns) {
    for (;;) {
        const int64_t left = deadline_ns - now_ns();
        if (left <= 0) return false;
        pollfd pfd{fd_, events, 0};
        const int r =
            ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left / 1000000 + 1, 1 << 30)));
        if (r > 0) return true;  // ready, or an error the next call reports
        if (r < 0 && errno != EINTR) return true;
    }
}

int64_t env_spin_ns(const char* name, int64_t otherwise) {
    const char* v = std::getenv(name);
    if (!v) return otherwise;
    const long us = std::strtol(v, nullptr, 10);
    return us > 0 ? int64_t{std::min(us, 1000000L)} * 1000 : int64_t{0};
}

int64_t socket_spin_ns(bool client, bool cpu_device) {
    if (std::getenv("FERRY_SOCKET_SPIN_US")) return env_spin_ns("FERRY_SOCKET_SPIN_US", 0);
    // A client on a host with cores to spare spins through a GPU step's wait, as the CUDA
    // runtime's own synchronization does when cores outnumber contexts; on small machines the
    // core may be the server's (a CPU device next door), so it sleeps at once. A server on such
    // a host spins between a session's frames unless it serves a CPU device (whose threads
    // would share the cores).
    if (!spare_cores()) return 0;
    if (client) return kClientSpinNs;
    return cpu_device ? 0 : kServerSpinNs;
}

Status Socket::recv_some(void* p, size_t cap, size_t* got, bool idle_ok, std::vector<int>* fds) {
    iovec iov{p, cap};
    return recv_some_parts(&iov, 1, got, idle_ok, fds);
}

Status Socket::recv_some_parts(const iovec* parts, int n, size_t* got, bool idle_ok,
                               std::vector<int>* fds) {
    *got = 0;
    const bool timed = frame_ms_ > 0 && !idle_ok;
    if (timed && !deadline_ns_) deadline_ns_ = now_ns() + int64_t{frame_ms_} * 1000000;
    const int64_t spin = spin_ns_;
    int64_t spin_until = 0;
    for (;;) {
        msghdr msg{};
        msg.msg_iov = const_cast<iovec*>(parts);
        msg.msg_iovlen = static_cast<size_t>(n);
        alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)];
        msg.msg_control = ctrl;
        msg.msg_controllen = sizeof(ctrl);
        const bool spinning = spin && (!spin_until || now_ns() < spin_until);
        const ssize_t r =
            ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | (timed || spinning ? MSG_DONTWAIT : 0));
        if (r >= 0) {
            take_fds(&msg, fds);
            *got = static_cast<size_t>(r);
            return Status::ok();
        }
        if (errno == EINTR) continue;
        if (spinning && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!spin_until) spin_until = now_ns() + spin;
            continue;
        }
        if (timed && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_until_deadline(POLLIN, deadline_ns_)) continue;
            return Status::errorf("timed out (a frame must arrive within %d ms)", frame_ms_);
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            // SO_RCVTIMEO expired (see set_io_timeout).
            if (idle_ok) continue;
            return Status::error("timed out");
        }
        return Status::errorf("receive: %s", std::strerror(errno));
    }
}

Status Socket::recv_exact(void* p, size_t n, std::vector<int>* fds, bool* eof_at_start,
                          bool idle_ok, size_t* received) {
    uint8_t* out = static_cast<uint8_t*>(p);
    size_t got = 0;
    if (received) *received = 0;
    if (eof_at_start) *eof_at_start = false;
    while (got < n) {
        size_t part = 0;
        FERRY_TRY(recv_some(out + got, n - got, &part, idle_ok && got == 0, fds));
        if (part == 0) {
            if (got == 0 && eof_at_start) *eof_at_start = true;
            return Status::error("connection closed");
        }
        got += part;
        if (received) *received = got;
    }
    return Status::ok();
}

Status Socket::recv_exact_parts(const iovec* parts, int n_parts) {
    if (n_parts < 0 || n_parts > kMaxParts) return Status::errorf("receive: %d pieces", n_parts);
    iovec left[kMaxParts];
    int first = 0;
    const int n = nonempty_parts(parts, n_parts, left);
    while (first < n) {
        size_t got = 0;
        FERRY_TRY(recv_some_parts(left + first, n - first, &got, false, nullptr));
        if (got == 0) return Status::error("connection closed");
        consume_parts(left, n, first, got);
    }
    return Status::ok();
}

Status BufferedReader::read_parts(const iovec* parts, int n_parts) {
    if (n_parts < 0 || n_parts > Socket::kMaxParts) {
        return Status::errorf("receive: %d pieces", n_parts);
    }
    // What the buffer holds goes first; the rest comes straight into place.
    iovec left[Socket::kMaxParts];
    int n = 0;
    for (int i = 0; i < n_parts; i++) {
        iovec p = parts[i];
        const size_t take = std::min(p.iov_len, w_ - r_);
        if (take) {
            std::memcpy(p.iov_base, buf_.get() + r_, take);
            r_ += take;
            p.iov_base = static_cast<uint8_t*>(p.iov_base) + take;
            p.iov_len -= take;
        }
        if (p.iov_len) left[n++] = p;
    }
    if (n == 0) return Status::ok();
    r_ = w_ = 0;
    receives_++;
    return sock_.recv_exact_parts(left, n);
}

Status BufferedReader::read(void* dst, size_t n, bool idle_ok, size_t* received,
                            std::vector<int>* fds, const std::function<Status()>& before_block) {
    uint8_t* out = static_cast<uint8_t*>(dst);
    size_t got = 0;
    Status st;
    while (got < n) {
        if (r_ < w_) {
            const size_t take = std::min(n - got, w_ - r_);
            std::memcpy(out + got, buf_.get() + r_, take);
            r_ += take;
            got += take;
            continue;
        }
        r_ = w_ = 0;
        if (before_block) {
            if (st = before_block(); !st) break;
        }
        receives_++;
        if (n - got >= kCap / 2) {
            size_t part = 0;
            st = sock_.recv_exact(out + got, n - got, fds, nullptr, idle_ok && got == 0, &part);
            got += part;
            break;
        }
        if (!buf_) buf_.reset(new uint8_t[kCap]);
        size_t part = 0;
        if (st = sock_.recv_some(buf_.get(), kCap, &part, idle_ok && got == 0, fds); !st) break;
        if (part == 0) {
            closed_ = true;
            st = Status::error("connection closed");
            break;
        }
        w_ = part;
    }
    if (received) *received = got;
    return st;
}

Status Socket::set_io_timeout(int ms) {
    timeval tv{};
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    if (setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
        setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
        return Status::errorf("setting the I/O timeout: %s", std::strerror(errno));
    }
    return Status::ok();
}

std::string Socket::peer_identity() const {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        char host[INET6_ADDRSTRLEN] = {};
        auto v4 = [&](const uint8_t* a) -> std::string {
            if (a[0] == 127) return "loopback";  // every 127.0.0.0/8 address is this host
            inet_ntop(AF_INET, a, host, sizeof(host));
            return host;
        };
        if (ss.ss_family == AF_INET) {
            return v4(reinterpret_cast<const uint8_t*>(
                &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr));
        }
        if (ss.ss_family == AF_INET6) {
            const in6_addr& a6 = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
            if (IN6_IS_ADDR_LOOPBACK(&a6)) return "loopback";
            if (IN6_IS_ADDR_V4MAPPED(&a6)) return v4(a6.s6_addr + 12);
            // A host is usually given a whole /64: key the client by it.
            in6_addr prefix = a6;
            std::memset(prefix.s6_addr + 8, 0, 8);
            if (inet_ntop(AF_INET6, &prefix, host, sizeof(host))) return std::string(host) + "/64";
        }
    }
    ucred cred{};
    socklen_t clen = sizeof(cred);
    if (getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) {
        return "uid " + std::to_string(cred.uid);
    }
    return "unknown peer";
}

namespace {

Status sockaddr_for(const Address& a, sockaddr_storage* ss, socklen_t* len, int* family) {
    std::memset(ss, 0, sizeof(*ss));
    if (a.kind == Address::Kind::Unix) {
        sockaddr_un* un = reinterpret_cast<sockaddr_un*>(ss);
        un->sun_family = AF_UNIX;
        std::memcpy(un->sun_path, a.path.c_str(), a.path.size() + 1);
        *len = sizeof(sockaddr_un);
        *family = AF_UNIX;
        return Status::ok();
    }
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &res);
    if (rc != 0 || !res) {
        return Status::errorf("cannot resolve host '%s': %s", a.host.c_str(), gai_strerror(rc));
    }
    std::memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    *family = res->ai_family;
    freeaddrinfo(res);
    return Status::ok();
}

void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

Expected<Socket> connect_to(const Address& addr) {
    sockaddr_storage ss;
    socklen_t len = 0;
    int family = 0;
    FERRY_TRY(sockaddr_for(addr, &ss, &len, &family));
    Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return Status::errorf("socket: %s", std::strerror(errno));
    while (::connect(s.fd(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
        if (errno == EINTR) continue;
        return Status::errorf("cannot connect to %s: %s", addr.text.c_str(), std::strerror(errno));
    }
    if (addr.kind == Address::Kind::Tcp) set_nodelay(s.fd());
    return s;
}

Expected<Socket> listen_on(const Address& addr, std::string* bound) {
    sockaddr_storage ss;
    socklen_t len = 0;
    int family = 0;
    FERRY_TRY(sockaddr_for(addr, &ss, &len, &family));
    Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return Status::errorf("socket: %s", std::strerror(errno));
    if (addr.kind == Address::Kind::Unix) {
        struct stat st {};
        if (::lstat(addr.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode))
            ::unlink(addr.path.c_str());
    } else {
        int one = 1;
        setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
        return Status::errorf("cannot bind %s: %s", addr.text.c_str(), std::strerror(errno));
    }
    if (::listen(s.fd(), 64) != 0) {
        return Status::errorf("cannot listen on %s: %s", addr.text.c_str(), std::strerror(errno));
    }
    if (bound) {
        *bound = addr.text;
        if (addr.kind == Address::Kind::Tcp) {
            sockaddr_storage got{};
            socklen_t glen = sizeof(got);
            if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&got), &glen) == 0) {
                int port = 0;
                if (got.ss_family == AF_INET) {
                    port = ntohs(reinterpret_cast<sockaddr_in*>(&got)->sin_port);
                } else if (got.ss_family == AF_INET6) {
                    port = ntohs(reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
                }
                const bool v6 = addr.host.find(':') != std::string::npos;
                *bound =
                    "tcp:" + (v6 ? "[" + addr.host + "]" : addr.host) + ":" + std::to_string(port);
            }
        }
    }
    return s;
}

Expected<Socket> accept_on(const Socket& listener, bool tcp) {
    for (;;) {
        const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
            if (tcp) set_nodelay(fd);
            return Socket(fd);
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return Status::errorf("accept: %s", std::strerror(errno));
    }
}

}  // namespace ferry::remote
