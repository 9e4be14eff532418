// `ferry serve`: accepts clients on a unix or tcp address and runs one Session per
// connection, each on its own thread. A client that disconnects (or dies) has its session,
// and with it every buffer it allocated, freed.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "remote-proto/transport.h"
#include "server/session.h"

namespace ferry::server {

// Limits on connections, so that no client can hold the server's threads or sessions for
// itself.
struct ConnectionLimits {
    // Once a frame has begun, each of its bytes, and each part of a reply the server sends,
    // must move within this many milliseconds, or the session ends (a client that stops
    // reading, or sends half a frame and stalls). Idle time between frames is unlimited.
    // 0: no limit.
    int io_timeout_ms = 30000;
    int max_sessions = 64;             // sessions at once, over all clients
    int max_sessions_per_client = 16;  // per client: "uid N" (unix) or IP address (tcp)
};

class Server {
  public:
    explicit Server(ServerOptions opts, ConnectionLimits limits = {});
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    // Binds ADDR. Non-loopback tcp addresses require a token. *bound gets the address
    // actually bound (tcp port 0 picks a free port).
    Status listen(const std::string& addr, std::string* bound);
    // Accepts clients until stop(); each connection is served on a thread of its own.
    Status run();
    void stop();

    const ServerCounters& counters() const { return *counters_; }

  private:
    struct Admission;

    ServerOptions opts_;
    ConnectionLimits limits_;
    std::shared_ptr<ServerCounters> counters_;
    std::shared_ptr<Admission> admission_;
    std::shared_ptr<std::atomic<int>> refusing_;  // refusals being answered

    void refuse(remote::Socket sock, std::string why);
    remote::Socket listener_;
    bool tcp_ = false;
    std::atomic<bool> stopping_{false};
};

// Serves one connection until it closes: reads frames, answers each (transport level framing
// checks: magic, size limit, truncation).
// io_timeout_ms: see ConnectionLimits.
void serve_connection(remote::Socket sock, const ServerOptions& opts, ServerCounters* counters,
                      bool shared_memory, int io_timeout_ms = 0);

}  // namespace ferry::server
