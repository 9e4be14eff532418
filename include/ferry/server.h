// The public face of `ferry serve`: hosts local devices for remote clients (API remoting) on
// a unix socket, a tcp address and any number of ivshmem shared-memory windows at once. Every
// byte a client sends is treated as hostile; the limits below bound what one client can take.
// The protocol is docs/remote-protocol.md; the threat model is in its first section.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/backend.h"
#include "ferry/status.h"

namespace ferry {

struct ServeOptions {
    // Addresses: "unix:PATH", "tcp:HOST:PORT" (port 0 picks a free port) — at most one of
    // those two — and any number of "ivshmem:PATH[,size=BYTES]" windows (one client each).
    std::vector<std::string> listen;
    std::vector<Device*> devices;  // served, in this order; empty: every local device
    std::string token;             // required in HELLO when non-empty (non-loopback tcp: always)
    // Per-session limit on everything a session holds: buffers (whole pages), kernel scratch,
    // cached graphs, events. 0: the machine's physical memory.
    uint64_t max_memory = 0;
    uint64_t max_scratch = 0;          // per-session cap on kernel scratch (0: max_memory only)
    uint64_t max_work = 1ull << 48;    // estimated operations per graph compute (0: no limit)
    int max_sessions = 64;             // sessions at once, all clients
    int max_sessions_per_client = 16;  // per uid (unix), host (tcp; IPv6 by /64)
    int io_timeout_ms = 30000;         // per-frame deadline, per reply (0: never)
    int hello_timeout_ms = 5000;       // HELLO (token checked) before a session slot
    int n_threads = 0;                 // CPU threads per session (0: the device default)
    bool verbose = false;              // log sessions and requests to stderr
};

class RemoteServer {
  public:
    // Checks the options and binds every address (creating the ivshmem window files); a bad
    // address, device or limit is an error naming it. Nothing is served before run().
    static Expected<std::unique_ptr<RemoteServer>> start(ServeOptions opts);
    virtual ~RemoteServer() = default;

    // The addresses clients use, in the order of ServeOptions::listen (tcp with the port
    // actually bound).
    virtual const std::vector<std::string>& addresses() const = 0;
    // Serves every address until stop(); each client on a thread of its own.
    virtual Status run() = 0;
    // Asks run() to return (from any thread).
    virtual void stop() = 0;
};

}  // namespace ferry
