// `ferry serve`: accepts clients on a unix or tcp address and runs one Session per
// connection, each on its own thread. A client that disconnects (or dies) has its session,
// and with it every buffer it allocated, freed.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "backends/remote/transport.h"
#include "server/session.h"

namespace ferry::server {

class Server {
  public:
    explicit Server(ServerOptions opts);
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
    ServerOptions opts_;
    std::shared_ptr<ServerCounters> counters_;
    remote::Socket listener_;
    bool tcp_ = false;
    std::atomic<bool> stopping_{false};
};

// Serves one connection until it closes: reads frames, answers each (transport level framing
// checks: magic, size limit, truncation).
void serve_connection(remote::Socket sock, const ServerOptions& opts, ServerCounters* counters,
                      bool shared_memory);

}  // namespace ferry::server
