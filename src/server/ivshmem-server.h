// `ferry serve --listen ivshmem:PATH[,size=BYTES]`: serves one shared-memory window (one QEMU
// guest, or one host process that maps the file) with the same sessions as a socket. Each
// window is its own client: one session at a time, on a thread of its own; a new epoch from
// the guest (a reboot, a new process) ends the previous session and frees its memory.
//
// The guest is hostile: every request is copied out of the window before it is parsed (the
// guest may rewrite the ring while the host reads), every counter it writes is range-checked,
// a guest that does not complete its HELLO within the hello deadline, does not complete a
// frame (or take a reply) within the per-frame I/O deadline, or stops its heartbeat for the
// I/O timeout loses its session, and a running compute stops once its guest is gone. A guest
// reaches nothing outside its own window.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "remote-proto/ivshmem-window.h"
#include "server/session.h"

namespace ferry::server {

class IvshmemServer {
  public:
    // spec: "PATH[,size=BYTES]" (the text after "ivshmem:"). Creates or opens the window file
    // and sets up its header and rings (any client of a previous server is cut off).
    // io_timeout_ms, hello_timeout_ms: as ConnectionLimits says for sockets (0: never time
    // out): a guest must send its HELLO within hello_timeout_ms of attaching, and every
    // later frame, once begun, within io_timeout_ms (a trickle does not extend it); a guest
    // whose heartbeat stops for io_timeout_ms loses its session, even mid-compute.
    static Expected<std::unique_ptr<IvshmemServer>> open(const std::string& spec,
                                                         const ServerOptions& opts,
                                                         ServerCounters* counters,
                                                         int io_timeout_ms,
                                                         int hello_timeout_ms = 5000);
    ~IvshmemServer();  // stop(), then waits for run() to return

    // "ivshmem:PATH": the address clients use on the host.
    const std::string& address() const { return address_; }
    // Serves sessions, one after another, until stop().
    void run();
    void stop() { stop_.store(true); }

    struct Link;  // one session's view of the rings (ivshmem-server.cpp)

  private:
    IvshmemServer(const ServerOptions& opts, ServerCounters* counters)
        : opts_(opts), counters_(counters) {}
    void serve_session(uint32_t epoch);
    bool hello(Link& io, Session& session, std::string* why);

    const ServerOptions& opts_;
    ServerCounters* counters_;
    int io_timeout_ms_ = 0;
    int hello_timeout_ms_ = 0;
    std::string address_;
    remote::ivshmem::Window win_;
    remote::ivshmem::Geometry geo_;  // private copy: never read back from the window
    std::atomic<bool> stop_{false};
    std::atomic<bool> running_{false};
    std::thread ticker_;
};

}  // namespace ferry::server
