// Transports for the remote protocol: Unix sockets (with SCM_RIGHTS file-descriptor passing)
// and TCP. Both carry the same frames; only Unix sockets can hand over shared memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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
    // Blocking receive of exactly n bytes. Received descriptors are appended to *fds (closed
    // when fds is null). *eof_at_start is set when the peer closed before the first byte.
    Status recv_exact(void* p, size_t n, std::vector<int>* fds, bool* eof_at_start = nullptr);

  private:
    int fd_ = -1;
};

// Connects (TCP_NODELAY on tcp).
Expected<Socket> connect_to(const Address& addr);
// Binds and listens; a stale unix socket file is replaced. *bound receives the address
// actually bound (tcp port 0 picks a free port).
Expected<Socket> listen_on(const Address& addr, std::string* bound);
// Accepts one connection (TCP_NODELAY on tcp); fails when the listener was shut down.
Expected<Socket> accept_on(const Socket& listener, bool tcp);

}  // namespace ferry::remote
