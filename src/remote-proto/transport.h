// Transports for the remote protocol: Unix sockets (with SCM_RIGHTS file-descriptor passing)
// and TCP. Both carry the same frames; only Unix sockets can hand over shared memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct iovec;

#include "ferry/status.h"

namespace ferry::remote {

struct Address {
    enum class Kind { Unix, Tcp };
    Kind kind = Kind::Unix;
    std::string path;  // unix
    std::string host;  // tcp
    int port = 0;      // tcp
    std::string text;  // as given: "unix:/tmp/s", "tcp:127.0.0.1:7070"
    // True for unix sockets and tcp hosts in 127.0.0.0/8, ::1 or "localhost".
    bool is_loopback() const;
};

// Parses "unix:PATH" or "tcp:HOST:PORT" ("tcp:[::1]:PORT" for IPv6).
Expected<Address> parse_address(const std::string& s);

// An owned socket file descriptor.
class Socket {
  public:
    Socket() = default;
    explicit Socket(int fd) : fd_(fd) {}
    ~Socket();
    Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    Socket& operator=(Socket&& o) noexcept;
    Socket(const Socket&) = delete;
    Socket& operator=(const Socket&) = delete;

    int fd() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    void close();
    // Stops both directions (wakes a thread blocked in recv on this socket).
    void shutdown_both();

    // Blocking send of two pieces (e.g. header + payload); when pass_fd >= 0 it travels with
    // the first byte (SCM_RIGHTS, Unix sockets only). Never raises SIGPIPE.
    Status send_all(const void* a, size_t na, const void* b, size_t nb, int pass_fd = -1);
    // The same for n <= kMaxParts pieces (empty ones allowed), in one system call when they
    // fit.
    static constexpr int kMaxParts = 48;
    Status send_parts(const iovec* parts, int n, int pass_fd = -1);
    // Blocking receive of at most cap bytes; *got gets the count, 0 at the end of the stream.
    // Timeouts and idle_ok as in recv_exact (idle_ok: a timeout just keeps waiting).
    // Received descriptors are appended to *fds (closed when fds is null).
    Status recv_some(void* p, size_t cap, size_t* got, bool idle_ok,
                     std::vector<int>* fds = nullptr);
    // Blocking receive of exactly n bytes. Received descriptors are appended to *fds (closed
    // when fds is null). *eof_at_start is set when the peer closed before the first byte.
    // With an I/O timeout set, a wait that sees no byte for that long fails ("timed out"),
    // except, with idle_ok, the wait for the first byte (a connection may idle between frames).
    // Errors say "connection closed" or "timed out"; *received (if given) gets the bytes that
    // did arrive.
    Status recv_exact(void* p, size_t n, std::vector<int>* fds, bool* eof_at_start = nullptr,
                      bool idle_ok = false, size_t* received = nullptr);
    // recv_some into n pieces (in order; one system call), and recv_exact of n <= kMaxParts
    // pieces (as few calls as the bytes' arrival allows; descriptors are not expected).
    Status recv_some_parts(const iovec* parts, int n, size_t* got, bool idle_ok,
                           std::vector<int>* fds = nullptr);
    Status recv_exact_parts(const iovec* parts, int n);
    // Makes every blocking receive and send give up after ms milliseconds without progress
    // (0: wait forever).
    Status set_io_timeout(int ms);
    // Per-frame deadline (the server's): once a receive that is not idle_ok starts, every
    // receive until end_frame() must complete within ms milliseconds in total, and each send
    // that has to wait must finish within ms of when it began waiting; a trickle of bytes does
    // not extend either. Costs nothing while data is already there (a non-blocking attempt
    // comes first; poll only when it would block). 0: off.
    void set_frame_timeout(int ms) { frame_ms_ = ms; }
    // Before a receive blocks, poll without sleeping for up to ns nanoseconds (0: block at
    // once); see socket_spin_ns.
    void set_spin_ns(int64_t ns) { spin_ns_ = ns; }
    void end_frame() { deadline_ns_ = 0; }
    // Who is on the other end, for per-client limits: "uid N" on unix sockets; on tcp one key
    // per host that cannot be changed by picking another source address on it: "loopback"
    // for all of 127.0.0.0/8 and ::1, the IPv4 address (IPv4-mapped IPv6 included) otherwise,
    // and the /64 prefix for IPv6 ("2001:db8:1:2::/64").
    std::string peer_identity() const;

  private:
    // Waits (poll) for `events` until the frame deadline; false when it has passed.
    bool wait_until_deadline(short events, int64_t deadline_ns);
    int fd_ = -1;
    int frame_ms_ = 0;
    int64_t deadline_ns_ = 0;  // steady clock; 0: no frame in progress
    int64_t spin_ns_ = 0;
};

// How long a receive spins before it blocks (and a send through a full buffer retries before
// it waits): FERRY_SOCKET_SPIN_US when set (either side; 0 turns spinning off); otherwise, on
// a host of 8 or more hardware threads, kClientSpinNs for a client and kServerSpinNs for a
// server that serves no CPU device; 0 on smaller hosts. A blocked thread the kernel wakes may
// take tens of microseconds to run again on an idle host (a deep C-state), and a remote decode
// step waits for one reply: measured on the H200 host, spinning clients raised 1B Q4_0 decode
// over unix sockets from 0.88 to 0.96 of local in one run and from 0.90 to 0.92 in another
// (stop 18, when a step took ~1 ms and spinning servers gained nothing); with 0.6 ms steps,
// servers spinning 300 us raised it from 0.948 to 0.975 over unix and 0.831 to 0.845 over tcp
// (stop 27, the same minutes).
// A host of 8 or more hardware threads, where a thread may poll instead of sleeping (socket
// spins, stripe lanes).
bool spare_cores();
// The steady clock in nanoseconds.
int64_t now_ns();
constexpr int64_t kClientSpinNs = 2'000'000;
constexpr int64_t kServerSpinNs = 300'000;
int64_t socket_spin_ns(bool client, bool cpu_device = false);
// A spin time in microseconds from environment variable `name` (0 or less: none; at most
// one second), in nanoseconds; `otherwise` when it is not set.
int64_t env_spin_ns(const char* name, int64_t otherwise);

// Reads a socket through a buffer: one receive takes in every frame that has arrived (a
// pipeline's requests or replies come together); large reads bypass the buffer.
class BufferedReader {
  public:
    explicit BufferedReader(Socket& sock) : sock_(sock) {}
    // Reads exactly n bytes. idle_ok: the first byte may take any time. *received: bytes that
    // arrived before an error. Descriptors that come along go to *fds (closed when null).
    // before_block runs whenever the reader is about to wait for the socket.
    Status read(void* dst, size_t n, bool idle_ok, size_t* received, std::vector<int>* fds,
                const std::function<Status()>& before_block = nullptr);
    // Reads exactly the n <= Socket::kMaxParts pieces in order: what is buffered is copied,
    // the rest is received straight into place (no copy through the buffer).
    Status read_parts(const iovec* parts, int n);
    bool buffered() const { return r_ < w_; }  // bytes already here, not yet read
    bool closed() const { return closed_; }    // a read found the end of the stream
    void reset() { r_ = w_ = 0; }
    uint64_t receives() const { return receives_; }

  private:
    static constexpr size_t kCap = 64u << 10;
    Socket& sock_;
    std::unique_ptr<uint8_t[]> buf_;
    size_t r_ = 0, w_ = 0;
    uint64_t receives_ = 0;
    bool closed_ = false;
};

// Small frames held back to go out together with the next send, in one system call (both
// sides batch a pipelined step this way; see docs/remote-protocol.md).
class HeldFrames {
  public:
    static constexpr size_t kMaxFrame = 64u << 10;  // larger frames are sent at once
    static constexpr size_t kFlushAt = 256u << 10;  // held bytes that call for a send

    // Whether a frame of this many bytes (header included) may be held.
    static bool fits(size_t frame_bytes) { return frame_bytes <= kMaxFrame; }
    // Appends the pieces of one frame; true when the held bytes now call for a send.
    bool add(std::initializer_list<std::pair<const void*, size_t>> pieces) {
        for (const auto& [p, n] : pieces) {
            const uint8_t* b = static_cast<const uint8_t*>(p);
            if (n) buf_.insert(buf_.end(), b, b + n);
        }
        return buf_.size() >= kFlushAt;
    }
    const uint8_t* data() const { return buf_.data(); }
    size_t size() const { return buf_.size(); }
    bool empty() const { return buf_.empty(); }
    // After the bytes were sent (or dropped): empties, giving back what a burst grew.
    void clear() {
        buf_.clear();
        if (buf_.capacity() > 2 * kFlushAt) buf_.shrink_to_fit();
    }

  private:
    std::vector<uint8_t> buf_;
};

// Connects (TCP_NODELAY on tcp).
Expected<Socket> connect_to(const Address& addr);
// Binds and listens; a stale unix socket file is replaced. *bound receives the address
// actually bound (tcp port 0 picks a free port).
Expected<Socket> listen_on(const Address& addr, std::string* bound);
// Accepts one connection (TCP_NODELAY on tcp); fails when the listener was shut down.
Expected<Socket> accept_on(const Socket& listener, bool tcp);

}  // namespace ferry::remote
