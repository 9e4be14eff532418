// `ferry serve`: accepts clients on a unix or tcp address and runs one Session per
// connection, each on its own thread. A client that disconnects (or dies) has its session,
// and with it every buffer it allocated, freed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "remote-proto/protocol.h"
#include "remote-proto/transport.h"
#include "server/session.h"

namespace ferry::server {

// Limits on connections, so that no client can hold the server's threads or sessions for
// itself.
struct ConnectionLimits {
    // Per-frame deadline: once a frame has begun, all of it must arrive within this many
    // milliseconds (a trickle of bytes does not extend it), and a reply that has to wait for
    // the client to read must be sent within it, or the session ends. Idle time between
    // frames is unlimited. 0: no limit.
    int io_timeout_ms = 30000;
    // A new connection must complete its HELLO (token checked) within this many
    // milliseconds of being accepted, before it is given a session slot. 0: no limit.
    int hello_timeout_ms = 5000;
    int max_sessions = 64;             // sessions at once, over all clients
    int max_sessions_per_client = 16;  // per client (Socket::peer_identity: uid, host, /64)
    // Connections accepted but not yet through HELLO (each holds a thread, never a session
    // slot); a new one beyond these pushes out the oldest pending one (of its client, when
    // the per-client number is reached).
    int max_handshakes = 32;
    int max_handshakes_per_client = 8;
};

// Largest frame accepted before HELLO succeeds (a HELLO is 4 + 8 + 4 + token bytes).
constexpr uint64_t kMaxHelloFrame = 4096;

// Payload bytes read per step: a frame's buffer grows as its bytes arrive, so a header that
// announces a large frame costs nothing until the bytes are actually sent.
constexpr size_t kReadStep = 4u << 20;
// TENSOR_SET data at least this large is received in place, once its prefix (u64 handle,
// offset, size: kSetPrefix bytes) checks out.
constexpr uint64_t kDirectMin = 256u << 10;
constexpr uint64_t kSetPrefix = 24;

// Uninitialized, geometrically growing storage for one frame's payload (every transport's
// server stages frames in one).
class FrameBuffer {
  public:
    uint8_t* data() { return p_.get(); }
    // Makes room for n bytes, keeping those of the previous call, growing towards `limit`.
    void ensure(size_t n, size_t limit) {
        if (n <= cap_) {
            used_ = n;
            return;
        }
        size_t cap = std::max<size_t>(cap_ * 2, 64u << 10);
        cap = std::max(std::min(cap, limit), n);
        std::unique_ptr<uint8_t[]> q(new uint8_t[cap]);
        if (used_) std::memcpy(q.get(), p_.get(), used_);
        p_ = std::move(q);
        cap_ = cap;
        used_ = n;
    }
    // Between frames: forgets the bytes, and frees the storage if it is larger than `keep`.
    void shrink(size_t keep) {
        used_ = 0;
        if (cap_ > keep) {
            p_.reset();
            cap_ = 0;
        }
    }

  private:
    std::unique_ptr<uint8_t[]> p_;
    size_t cap_ = 0;
    size_t used_ = 0;
};

// The checks every transport makes on a frame header it has copied into private memory, with
// the error a client is told. check_frame: the magic and the payload limit (a stream cannot be
// resynchronized after either fails: answer, then close). check_hello: the first frame of a
// connection must be a HELLO (or, join_ok: a STRIPE_JOIN), unflagged, of at most
// kMaxHelloFrame bytes (its magic checked first).
Status check_frame(const remote::Header& h);
Status check_hello(const remote::Header& h, bool join_ok = false);
// A reply that carries an error message.
Reply error_reply(const std::string& msg);

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
    // For other transports' sessions (ivshmem windows) served beside this server's.
    const ServerOptions& options() const { return opts_; }
    ServerCounters* counters_ptr() const { return counters_.get(); }

    struct Admission;

  private:
    ServerOptions opts_;
    ConnectionLimits limits_;
    std::shared_ptr<ServerCounters> counters_;
    std::shared_ptr<Admission> admission_;

    remote::Socket listener_;
    bool tcp_ = false;
    std::atomic<bool> stopping_{false};
};

// Serves one connection until it closes: the HELLO (within limits.hello_timeout_ms, at most
// kMaxHelloFrame bytes, token checked), then, once `admission` (if given) grants a session
// slot for `who`, every later frame (transport level framing checks: magic, size limit,
// per-frame deadline, truncation). Never throws: running out of memory or threads ends this
// connection only.
void serve_connection(remote::Socket sock, const ServerOptions& opts, ServerCounters* counters,
                      bool shared_memory, const ConnectionLimits& limits,
                      Server::Admission* admission = nullptr, const std::string& who = "",
                      uint64_t pending_id = 0);

}  // namespace ferry::server
