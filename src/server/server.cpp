#include "server/server.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <thread>

#include "remote-proto/protocol.h"
#include "remote-proto/step-trace.h"
#include "remote-proto/stripes.h"
#include "server/frame-loop.h"

namespace ferry::server {

Status check_frame(const remote::Header& h) {
    if (h.magic != remote::kMagic) {
        return Status::errorf("bad frame magic 0x%08x (not a ferry client?)", h.magic);
    }
    if (h.len > remote::kMaxPayload) {
        return Status::errorf("frame of %llu bytes exceeds the limit of %llu",
                              static_cast<unsigned long long>(h.len),
                              static_cast<unsigned long long>(remote::kMaxPayload));
    }
    return Status::ok();
}

Status check_hello(const remote::Header& h, bool join_ok) {
    if (h.magic != remote::kMagic) {
        return Status::errorf("bad frame magic 0x%08x (not a ferry client?)", h.magic);
    }
    const bool join = join_ok && h.cmd == static_cast<uint16_t>(remote::Cmd::STRIPE_JOIN);
    if ((h.cmd != static_cast<uint16_t>(remote::Cmd::HELLO) && !join) || h.flags != 0 ||
        h.len > kMaxHelloFrame) {
        return Status::errorf(
            "%s: HELLO must be the first request of a connection, at most %llu bytes (got %llu)",
            remote::cmd_name(h.cmd), static_cast<unsigned long long>(kMaxHelloFrame),
            static_cast<unsigned long long>(h.len));
    }
    return Status::ok();
}

Reply error_reply(const std::string& msg) {
    Reply r;
    r.error = true;
    wire::Writer w(&r.payload);
    w.str(msg);
    return r;
}

using remote::Header;
using remote::Socket;

namespace {

// Frame buffer capacity a session keeps between requests.
constexpr size_t kKeepBytes = 4u << 20;
void write_reply_header(uint8_t* hdr, const Header& req, const Reply& r, size_t len,
                        uint16_t more_flags = 0) {
    Header h;
    h.cmd = req.cmd;
    h.id = req.id;
    h.flags =
        static_cast<uint16_t>(remote::kFlagReply | (r.error ? remote::kFlagError : 0) | more_flags);
    h.len = len;
    remote::write_header(hdr, h);
}

// A tcp session's stripe connections (STRIPE_JOIN): the key a join must show, and the lanes
// that send stripes 1..n-1 of its large replies once STRIPES enabled them.
struct StripeSlot {
    // Lanes that spin at all poll through a read's wait for its compute (as the CUDA
    // runtime's own synchronization polls), up to kStripeExpectNs.
    StripeSlot(int64_t spin_ns, int frame_ms)
        : lanes(remote::StripeLanes::Dir::Send, spin_ns, spin_ns > 0 ? kStripeExpectNs : 0,
                frame_ms) {}
    static constexpr int64_t kStripeExpectNs = 20'000'000;
    uint8_t key[remote::kStripeKeyBytes] = {};
    std::mutex mu;
    int enabled = 0;  // stripes of a transfer once STRIPES came; 0 before
    remote::StripeLanes lanes;
};

// One connection's byte streams. Reads are buffered (BufferedReader: a decode step's
// pipelined requests arrive together and are taken in by one receive). Replies to requests
// that are followed by requests already received are held and go out together, in one send,
// when the server is about to wait for input (or has much to send): a pipelined step is then
// one receive and one send on each side.
class Stream {
  public:
    explicit Stream(Socket& sock) : sock_(sock), in_(sock) {}

    // Reads exactly n bytes (see BufferedReader::read); held replies go out before it waits.
    Status read(void* dst, size_t n, bool idle_ok, size_t* received = nullptr) {
        return in_.read(dst, n, idle_ok, received, nullptr, [this] { return flush(); });
    }
    // True when bytes of another frame have already arrived.
    bool more_input() const { return in_.buffered(); }
    // A failed read between frames ends the session quietly only when the client closed
    // its end.
    bool ended_between_frames() const { return in_.closed(); }
    void end_frame() { sock_.end_frame(); }

    // The session's stripe connections (tcp sessions that offer them).
    void set_stripes(StripeSlot* slot) { stripes_ = slot; }
    // Where a progressive reply stamps its pieces (FERRY_STEP_TRACE).
    void set_step_trace(remote::StepTrace* t) { steps_ = t; }

    // Sends (or, while more requests are waiting or another reply follows at once, holds)
    // the reply to `req`.
    Status reply(const Header& req, const Reply& r, bool more = false) {
        const uint8_t* body = r.data ? r.data : r.payload.data();
        const size_t len = r.data ? r.data_len : r.payload.size();
        uint8_t hdr[remote::kHeaderSize];
        if (r.more && r.data && !r.error) {
            // FERRY_SERVE_PIECE_STRIPES=0: progressive reads on one connection.
            static const bool striped_ok = !env_off("FERRY_SERVE_PIECE_STRIPES");
            return reply_in_order(hdr, req, r, body, len,
                                  striped_ok && len >= remote::kStripeMin ? stripes_enabled() : 1);
        }
        if (r.data && !r.error && r.pass_fd < 0 && len >= remote::kStripeMin &&
            req.cmd == static_cast<uint16_t>(remote::Cmd::TENSOR_GET)) {
            if (const int n = stripes_enabled(); n >= 2) {
                return reply_in_order(hdr, req, r, body, len, n);
            }
        }
        write_reply_header(hdr, req, r, len);
        if (r.pass_fd >= 0) {
            // The descriptor travels with the first byte of its own reply.
            FERRY_TRY(flush());
            return sock_.send_all(hdr, sizeof(hdr), body, len, r.pass_fd);
        }
        if ((more || more_input()) && remote::HeldFrames::fits(sizeof(hdr) + len)) {
            return out_.add({{hdr, sizeof(hdr)}, {body, len}}) ? flush() : Status::ok();
        }
        const iovec parts[3] = {{const_cast<uint8_t*>(out_.data()), out_.size()},
                                {hdr, sizeof(hdr)},
                                {const_cast<uint8_t*>(body), len}};
        Status st = sock_.send_parts(parts, 3);
        out_.clear();
        return st;
    }
    Status flush() {
        if (out_.empty()) return Status::ok();
        Status st = sock_.send_all(out_.data(), out_.size(), nullptr, 0);
        out_.clear();
        return st;
    }

  private:
    // Stripes a large read's reply is split into (1: none, or not yet STRIPES).
    int stripes_enabled() {
        if (!stripes_) return 1;
        std::lock_guard<std::mutex> lock(stripes_->mu);
        return std::max(stripes_->enabled, 1);
    }
    // A read's reply in order of its bytes: the held replies, the header and the bytes in place
    // in one send, then, for a progressive read (Reply::more), each piece as the device hands
    // it over. Over n >= 2 stripes the header is flagged striped, this connection moves stripe
    // 0 and the lanes stripes 1..n-1 at the same time, each sending what of its stripe is in
    // place (StripeLanes::advance). Returns once all was sent (the bytes are only valid until
    // the next request).
    Status reply_in_order(uint8_t* hdr, const Header& req, const Reply& r, const uint8_t* body,
                          size_t len, int n) {
        const bool striped = n >= 2;
        if (steps_ && r.more) steps_->ev('F', req.cmd);
        size_t ready = r.more ? std::min(r.data_ready, len) : len;
        // Stripe 0 (all of it without stripes) is this connection's: its parts below `ready`
        // go out now, the rest as they come.
        write_reply_header(hdr, req, r, len,
                           static_cast<uint16_t>(striped ? remote::kFlagStriped : 0));
        if (striped) stripes_->lanes.start(const_cast<uint8_t*>(body), len, ready);
        const iovec before[2] = {{const_cast<uint8_t*>(out_.data()), out_.size()},
                                 {hdr, remote::kHeaderSize}};
        Status st = remote::send_stripe(sock_, body, len, n, 0, 0, ready, before, 2);
        out_.clear();
        while (st && ready < len) {
            Expected<size_t> now = r.more(ready);
            if (!now) {
                st = now.status();
                break;
            }
            if (*now <= ready || *now > len) {
                st = Status::errorf("progressive read: %zu bytes ready after %zu of %zu", *now,
                                    ready, len);
                break;
            }
            const size_t prev = ready;
            ready = *now;
            if (steps_) steps_->ev(ready == len ? 'L' : 'P', req.cmd);
            if (striped) stripes_->lanes.advance(ready);
            st = remote::send_stripe(sock_, body, len, n, 0, prev, ready);
        }
        // When a progressive read failed, the lanes wait for bytes that will not come: the
        // session ends, and its lanes with it.
        if (!striped || ready < len) return st;
        if (steps_) steps_->ev('0', req.cmd);
        const Status lanes = stripes_->lanes.finish();
        if (steps_) steps_->ev('A', req.cmd);
        return st ? lanes : st;
    }

    Socket& sock_;
    remote::BufferedReader in_;
    remote::HeldFrames out_;
    StripeSlot* stripes_ = nullptr;
    remote::StepTrace* steps_ = nullptr;
};

}  // namespace

// Sessions and handshakes open per client, shared with the connection threads (which leave
// after the Server may be gone).
struct Server::Admission {
    std::mutex mu;
    ConnectionLimits lim;
    int total = 0;
    std::map<std::string, int> per_client;

    // Connections accepted and not yet through HELLO, oldest first. A new one that finds
    // the table full (overall, or for its client) pushes out the oldest pending one (its
    // socket is shut down, so its thread ends at once): a client that completes its HELLO
    // in milliseconds is never locked out by connections that send nothing, and silent
    // connections cost at most max_handshakes threads.
    struct Pending {
        uint64_t id;
        std::string who;
        int fd;
    };
    std::list<Pending> pending;
    uint64_t next_pending = 1;

    uint64_t begin_handshake(const std::string& who, int fd) {
        std::lock_guard<std::mutex> lock(mu);
        int mine = 0;
        for (const Pending& p : pending) mine += p.who == who;
        auto evict = [&](auto it) {
            ::shutdown(it->fd, SHUT_RDWR);  // still open: removed from here before it closes
            pending.erase(it);
        };
        if (mine >= lim.max_handshakes_per_client) {
            evict(std::find_if(pending.begin(), pending.end(),
                               [&](const Pending& p) { return p.who == who; }));
        } else if (static_cast<int>(pending.size()) >= lim.max_handshakes) {
            evict(pending.begin());
        }
        pending.push_back({next_pending, who, fd});
        return next_pending++;
    }
    // Before the connection's socket closes (or once it is admitted).
    void end_handshake(uint64_t id) {
        std::lock_guard<std::mutex> lock(mu);
        pending.remove_if([&](const Pending& p) { return p.id == id; });
    }
    // Admits one more session of `who` (after its HELLO), or says why not.
    Status admit(const std::string& who) {
        std::lock_guard<std::mutex> lock(mu);
        if (total >= lim.max_sessions) {
            return Status::errorf("server busy: %d sessions open (--max-sessions)", total);
        }
        int& mine = per_client[who];
        if (mine >= lim.max_sessions_per_client) {
            return Status::errorf(
                "server busy: %s has %d sessions open (--max-sessions-per-client)", who.c_str(),
                mine);
        }
        mine++;
        total++;
        return Status::ok();
    }
    void leave(const std::string& who) {
        std::lock_guard<std::mutex> lock(mu);
        total--;
        auto it = per_client.find(who);
        if (it != per_client.end() && --it->second <= 0) per_client.erase(it);
    }

    // Sessions that take stripe connections, by session id (while they last).
    std::map<uint64_t, std::weak_ptr<StripeSlot>> stripes;
    void add_stripes(uint64_t session, const std::shared_ptr<StripeSlot>& slot) {
        std::lock_guard<std::mutex> lock(mu);
        stripes[session] = slot;
    }
    void remove_stripes(uint64_t session) {
        std::lock_guard<std::mutex> lock(mu);
        stripes.erase(session);
    }
    std::shared_ptr<StripeSlot> find_stripes(uint64_t session) {
        std::lock_guard<std::mutex> lock(mu);
        auto it = stripes.find(session);
        return it == stripes.end() ? nullptr : it->second.lock();
    }
};

namespace {

// Polls the connection for its client going away while a compute runs (POLLRDHUP: the peer
// closed or shut down its end), at most every 10 ms. Called from one compute thread.
std::function<bool()> disconnect_check(int fd) {
    auto last = std::make_shared<std::chrono::steady_clock::time_point>();
    return [fd, last]() {
        const auto now = std::chrono::steady_clock::now();
        if (now - *last < std::chrono::milliseconds(10)) return false;
        *last = now;
        pollfd p{fd, POLLRDHUP, 0};
        return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    };
}

// The session part of a connection (after its HELLO was answered).
void serve_session(Socket& sock, Stream& io, Session& session, const ServerOptions& opts) {
    session.set_abort_check(disconnect_check(sock.fd()));
    std::string why;
    serve_frames(io, session, opts, kKeepBytes, &why);
    (void)io.flush();
    if (opts.verbose && !why.empty()) {
        std::fprintf(stderr, "ferry serve: session %llu: %s\n",
                     static_cast<unsigned long long>(session.id()), why.c_str());
    }
}

// A STRIPE_JOIN (the first frame of a tcp connection, already read and checked for size):
// token and key checked, the connection becomes the session's next stripe lane (its socket
// moves there; this thread ends). Any failure is answered with an error, and the connection
// closes.
void join_stripes(Socket& sock, Stream& io, const Header& h, const uint8_t* body,
                  const ServerOptions& opts, Server::Admission* admission) {
    wire::Reader r(body, static_cast<size_t>(h.len));
    const uint32_t version = r.u32();
    const std::string token = r.str(1024);
    const uint64_t session = r.u64();
    const uint8_t* key = r.bytes(remote::kStripeKeyBytes);
    const uint8_t index = r.u8();
    auto refuse = [&](const std::string& why) { (void)io.reply(h, error_reply(why)); };
    if (!r.done() || !key) return refuse("malformed STRIPE_JOIN");
    if (Status st = check_client(opts, version, token); !st) return refuse(st.message());
    // One answer for an unknown session and a wrong key: the key is the session's secret.
    std::shared_ptr<StripeSlot> slot = admission->find_stripes(session);
    const std::string want =
        slot ? std::string(reinterpret_cast<const char*>(slot->key), remote::kStripeKeyBytes)
             : std::string(remote::kStripeKeyBytes, '\0');
    if (!slot || !tokens_equal(want, std::string(reinterpret_cast<const char*>(key),
                                                 remote::kStripeKeyBytes))) {
        return refuse(strfmt("STRIPE_JOIN: no session %llu with that key",
                             static_cast<unsigned long long>(session)));
    }
    // The answer goes out under the slot's lock, and the lane is added before the lock is let
    // go: a client that has its answer finds the lane there (its next join, its STRIPES). The
    // answer is one small frame on a fresh connection, so the send never waits for the client.
    std::lock_guard<std::mutex> lock(slot->mu);
    if (slot->enabled) return refuse("STRIPE_JOIN: the session's stripes are already in use");
    if (index >= remote::kMaxStripes) {
        return refuse(strfmt("STRIPE_JOIN: stripe %u of at most %d", index, remote::kMaxStripes));
    }
    if (index != slot->lanes.lanes() + 1) {
        return refuse(
            strfmt("STRIPE_JOIN: stripe %u, expected %d", index, slot->lanes.lanes() + 1));
    }
    if (!io.reply(h, Reply{}).is_ok() || !io.flush().is_ok()) return;
    if (Status st = slot->lanes.add(std::move(sock)); !st) {  // no thread: STRIPES will say so
        if (opts.verbose) std::fprintf(stderr, "ferry serve: %s\n", st.message().c_str());
        return;
    }
    if (opts.verbose) {
        std::fprintf(stderr, "ferry serve: session %llu: stripe connection %u joined\n",
                     static_cast<unsigned long long>(session), index);
    }
}

void serve_connection_impl(Socket& sock, const ServerOptions& opts, ServerCounters* counters,
                           bool shared_memory, const ConnectionLimits& limits,
                           Server::Admission* admission, const std::string& who,
                           uint64_t pending_id, bool* admitted) {
    // The HELLO: one small frame, all of it within the hello deadline.
    if (limits.hello_timeout_ms > 0) {
        if (Status st = sock.set_io_timeout(limits.hello_timeout_ms); !st) return;
        sock.set_frame_timeout(limits.hello_timeout_ms);
    }
    Stream io(sock);
    uint8_t hdr[remote::kHeaderSize];
    if (!io.read(hdr, sizeof(hdr), /*idle_ok=*/false)) return;  // silent, late or gone
    const Header h = remote::read_header(hdr);
    if (h.magic != remote::kMagic) {
        (void)io.reply(h, error_reply(check_hello(h).message()));
        return;
    }
    uint8_t body[kMaxHelloFrame];
    // A small frame is read in full before any answer (closing a socket with unread bytes
    // resets it and the answer would be lost); a larger one is never read.
    if (h.len <= kMaxHelloFrame) {
        if (Status st = io.read(body, static_cast<size_t>(h.len), false); !st) {
            (void)io.reply(h, error_reply("truncated HELLO: " + st.message()));
            return;
        }
    }
    const bool stripes_ok = !shared_memory && admission;  // tcp connections of a Server
    if (Status st = check_hello(h, stripes_ok); !st) {
        (void)io.reply(h, error_reply(st.message()));
        return;
    }
    sock.end_frame();
    if (h.cmd == static_cast<uint16_t>(remote::Cmd::STRIPE_JOIN)) {
        join_stripes(sock, io, h, body, opts, admission);
        return;
    }
    bool cpu_device = false;
    for (Device* d : opts.devices) cpu_device |= d->type() == DeviceType::CPU;
    const int64_t spin_ns = remote::socket_spin_ns(false, cpu_device);
    Session session(opts, counters, shared_memory);
    if (!shared_memory) session.offer_progressive();
    std::shared_ptr<StripeSlot> stripes;
    if (stripes_ok) {
        stripes = std::make_shared<StripeSlot>(spin_ns, limits.io_timeout_ms);
        if (getrandom(stripes->key, sizeof(stripes->key), 0) ==
            static_cast<ssize_t>(sizeof(stripes->key))) {
            Session::StripeHooks hooks;
            std::memcpy(hooks.key, stripes->key, sizeof(hooks.key));
            StripeSlot* slot = stripes.get();
            hooks.enable = [slot](int n) {
                std::lock_guard<std::mutex> lock(slot->mu);
                if (slot->lanes.lanes() != n - 1) {
                    return Status::errorf("STRIPES: %d stripes asked, %d connections joined", n,
                                          slot->lanes.lanes() + 1);
                }
                slot->enabled = n;
                return Status::ok();
            };
            hooks.wake = [slot] { slot->lanes.wake(); };
            session.offer_stripes(std::move(hooks));
            io.set_stripes(slot);
        } else {
            stripes.reset();  // no randomness: no stripes
        }
    }
    Reply reply;
    session.handle(h.cmd, body, static_cast<size_t>(h.len), &reply);
    if (reply.error) {
        (void)io.reply(h, reply);
        return;
    }
    // Authenticated: now (and only now) it takes a session slot.
    if (admission) {
        if (Status st = admission->admit(who); !st) {
            if (opts.verbose) std::fprintf(stderr, "ferry serve: %s\n", st.message().c_str());
            (void)io.reply(h, error_reply("HELLO: " + st.message()));
            return;
        }
        *admitted = true;
        admission->end_handshake(pending_id);
    }
    if (Status st = sock.set_io_timeout(limits.io_timeout_ms); !st) return;
    sock.set_frame_timeout(limits.io_timeout_ms);
    sock.set_spin_ns(spin_ns);
    if (opts.verbose)
        std::fprintf(stderr, "ferry serve: session %llu opened (%s)\n",
                     static_cast<unsigned long long>(session.id()), who.c_str());
    if (stripes) admission->add_stripes(session.id(), stripes);
    // The stripe connections end with the session (their lanes stop when the slot goes).
    struct Unregister {
        Server::Admission* a;
        uint64_t id;
        ~Unregister() {
            if (a) a->remove_stripes(id);
        }
    } unregister{stripes ? admission : nullptr, session.id()};
    if (!io.reply(h, reply)) return;
    serve_session(sock, io, session, opts);
    if (opts.verbose)
        std::fprintf(stderr, "ferry serve: session %llu closed\n",
                     static_cast<unsigned long long>(session.id()));
}

}  // namespace

void serve_connection(Socket sock, const ServerOptions& opts, ServerCounters* counters,
                      bool shared_memory, const ConnectionLimits& limits,
                      Server::Admission* admission, const std::string& who, uint64_t pending_id) {
    bool admitted = false;
    try {
        serve_connection_impl(sock, opts, counters, shared_memory, limits, admission, who,
                              pending_id, &admitted);
    } catch (const std::exception& e) {
        // Out of memory (or threads) for this connection: it ends, the server carries on.
        if (opts.verbose) std::fprintf(stderr, "ferry serve: connection ended: %s\n", e.what());
    }
    if (admission) {
        if (admitted) {
            admission->leave(who);
        } else {
            admission->end_handshake(pending_id);
        }
    }
}

Server::Server(ServerOptions opts, ConnectionLimits limits)
    : opts_(std::move(opts)),
      limits_(limits),
      counters_(std::make_shared<ServerCounters>()),
      admission_(std::make_shared<Admission>()) {
    admission_->lim = limits_;
}

Server::~Server() {
    stop();
}

Status Server::listen(const std::string& addr, std::string* bound) {
    Expected<remote::Address> a = remote::parse_address(addr);
    if (!a) return a.status();
    if (!a->is_loopback() && opts_.token.empty()) {
        return Status::errorf(
            "listening on non-loopback address %s requires --token or "
            "FERRY_TOKEN",
            addr.c_str());
    }
    Expected<Socket> s = remote::listen_on(*a, bound);
    if (!s) return s.status();
    listener_ = std::move(*s);
    tcp_ = a->kind == remote::Address::Kind::Tcp;
    return Status::ok();
}

Status Server::run() {
    auto opts = std::make_shared<const ServerOptions>(opts_);
    int failures = 0;
    while (!stopping_.load()) {
        Expected<Socket> c = remote::accept_on(listener_, tcp_);
        if (!c) {
            if (stopping_.load()) break;
            // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS): wait and carry on;
            // only a listener that keeps failing ends the server.
            if (++failures > 1000) return c.status();
            if (opts_.verbose) std::fprintf(stderr, "ferry serve: %s\n", c.message().c_str());
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        failures = 0;
        std::string who = c->peer_identity();
        const uint64_t pending_id = admission_->begin_handshake(who, c->fd());
        auto counters = counters_;
        auto admission = admission_;
        const bool shm = !tcp_;
        const ConnectionLimits limits = limits_;
        try {
            std::thread([sock = std::move(*c), opts, counters, admission, who, shm, limits,
                         pending_id]() mutable {
                serve_connection(std::move(sock), *opts, counters.get(), shm, limits,
                                 admission.get(), who, pending_id);
            }).detach();
        } catch (const std::exception& e) {
            // No thread (std::system_error) or no memory: this connection closes (its socket
            // went with the lambda), the server carries on.
            admission_->end_handshake(pending_id);
            if (opts_.verbose) {
                std::fprintf(stderr, "ferry serve: cannot serve %s: %s\n", who.c_str(), e.what());
            }
        }
    }
    return Status::ok();
}

void Server::stop() {
    stopping_.store(true);
    listener_.shutdown_both();
}

}  // namespace ferry::server
