#include "server/server.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "remote-proto/protocol.h"

namespace ferry::server {

using remote::Header;
using remote::Socket;

namespace {

// Payload bytes read per step: a frame's buffer grows as its bytes arrive, so a header that
// announces a large frame costs nothing until the bytes are actually sent.
constexpr size_t kReadStep = 4u << 20;
// Frame buffer capacity a session keeps between requests.
constexpr size_t kKeepBytes = 16u << 20;
// TENSOR_SET data at least this large is received in place (see serve_connection).
constexpr uint64_t kDirectMin = 256u << 10;

// Uninitialized, geometrically growing storage for one frame's payload.
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

void write_reply_header(uint8_t* hdr, const Header& req, const Reply& r, size_t len) {
    Header h;
    h.cmd = req.cmd;
    h.id = req.id;
    h.flags = static_cast<uint16_t>(remote::kFlagReply | (r.error ? remote::kFlagError : 0));
    h.len = len;
    remote::write_header(hdr, h);
}

Reply error_reply(const std::string& msg) {
    Reply r;
    r.error = true;
    wire::Writer w(&r.payload);
    w.str(msg);
    return r;
}

// A refused connection's answer: an error reply to its first request.
void send_error(Socket& s, const Header& req, const std::string& msg) {
    const Reply r = error_reply(msg);
    uint8_t hdr[remote::kHeaderSize];
    write_reply_header(hdr, req, r, r.payload.size());
    (void)s.send_all(hdr, sizeof(hdr), r.payload.data(), r.payload.size());
}

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
    bool closed() const { return in_.closed(); }  // the client closed its end

    // Sends (or, while more requests are waiting, holds) the reply to `req`.
    Status reply(const Header& req, const Reply& r) {
        const uint8_t* body = r.data ? r.data : r.payload.data();
        const size_t len = r.data ? r.data_len : r.payload.size();
        uint8_t hdr[remote::kHeaderSize];
        write_reply_header(hdr, req, r, len);
        if (r.pass_fd >= 0) {
            // The descriptor travels with the first byte of its own reply.
            FERRY_TRY(flush());
            return sock_.send_all(hdr, sizeof(hdr), body, len, r.pass_fd);
        }
        if (more_input() && remote::HeldFrames::fits(sizeof(hdr) + len)) {
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
    Socket& sock_;
    remote::BufferedReader in_;
    remote::HeldFrames out_;
};

}  // namespace

void serve_connection(Socket sock, const ServerOptions& opts, ServerCounters* counters,
                      bool shared_memory, int io_timeout_ms) {
    if (io_timeout_ms > 0) {
        if (Status st = sock.set_io_timeout(io_timeout_ms); !st) {
            send_error(sock, Header{}, st.message());
            return;
        }
    }
    Session session(opts, counters, shared_memory);
    if (opts.verbose)
        std::fprintf(stderr, "ferry serve: session %llu opened\n",
                     static_cast<unsigned long long>(session.id()));
    Stream io(sock);
    // Answers with an error and ends the connection (the stream cannot be trusted further).
    auto fatal = [&](const Header& h, const std::string& msg) {
        (void)io.reply(h, error_reply(msg));
    };
    FrameBuffer payload;
    Reply reply;
    for (;;) {
        uint8_t hdr[remote::kHeaderSize];
        size_t hdr_got = 0;
        Status st = io.read(hdr, sizeof(hdr), /*idle_ok=*/true, &hdr_got);
        if (!st) {
            // End of file between frames is the client leaving.
            if (hdr_got > 0 || !io.closed()) {
                fatal(Header{}, "truncated frame header: " + st.message());
            }
            break;
        }
        const Header h = remote::read_header(hdr);
        if (h.magic != remote::kMagic) {
            fatal(h, strfmt("bad frame magic 0x%08x (not a ferry client?)", h.magic));
            break;
        }
        if (h.len > remote::kMaxPayload) {
            // The stream cannot be resynchronized without reading the payload: answer, close.
            fatal(h, strfmt("frame of %llu bytes exceeds the limit of %llu",
                            static_cast<unsigned long long>(h.len),
                            static_cast<unsigned long long>(remote::kMaxPayload)));
            break;
        }
        Status rst;  // how receiving the payload failed (closed, timed out)
        uint64_t got = 0;
        // Bulk TENSOR_SET into host-addressable memory: once its 24-byte prefix checks out,
        // the data is received straight into the buffer (no staging copy).
        constexpr uint64_t kSetPrefix = 24;
        if (h.cmd == static_cast<uint16_t>(remote::Cmd::TENSOR_SET) && h.flags == 0 &&
            h.len >= kSetPrefix + kDirectMin) {
            payload.ensure(kSetPrefix, static_cast<size_t>(h.len));
            if (rst = io.read(payload.data(), kSetPrefix, false); !rst) {
                fatal(h, "truncated frame: TENSOR_SET prefix: " + rst.message());
                break;
            }
            got = kSetPrefix;
            if (uint8_t* dst = session.direct_set_target(payload.data(), h.len)) {
                while (got < h.len) {
                    const size_t step =
                        static_cast<size_t>(std::min<uint64_t>(kReadStep, h.len - got));
                    if (rst = io.read(dst + (got - kSetPrefix), step, false); !rst) break;
                    got += step;
                }
                if (!rst) {
                    fatal(h, "truncated frame: TENSOR_SET data: " + rst.message());
                    break;
                }
                if (!io.reply(h, Reply())) break;
                continue;
            }
        }
        // The frame's buffer grows (geometrically, uninitialized) only as its bytes arrive.
        while (got < h.len) {
            const size_t step = static_cast<size_t>(std::min<uint64_t>(kReadStep, h.len - got));
            payload.ensure(static_cast<size_t>(got) + step, static_cast<size_t>(h.len));
            size_t part = 0;
            rst = io.read(payload.data() + got, step, false, &part);
            got += part;
            if (!rst) break;
        }
        if (!rst) {
            fatal(h, strfmt("truncated frame: %llu of %llu payload bytes, then %s",
                            static_cast<unsigned long long>(got),
                            static_cast<unsigned long long>(h.len), rst.message().c_str()));
            break;
        }
        if (h.flags != 0) {
            if (!io.reply(h, error_reply(strfmt("request with flags 0x%x (requests carry none)",
                                                h.flags)))) {
                break;
            }
            continue;
        }
        try {
            session.handle(h.cmd, payload.data(), static_cast<size_t>(h.len), &reply);
        } catch (const std::exception& e) {
            // Out of memory while serving one request: answer it, keep the session.
            reply = error_reply(strfmt("%s: %s", remote::cmd_name(h.cmd), e.what()));
        }
        st = io.reply(h, reply);
        if (reply.pass_fd >= 0) ::close(reply.pass_fd);
        if (!st) {
            if (opts.verbose)
                std::fprintf(stderr, "ferry serve: session %llu: %s\n",
                             static_cast<unsigned long long>(session.id()), st.message().c_str());
            break;
        }
        if (reply.close) break;
        payload.shrink(kKeepBytes);
    }
    (void)io.flush();
    if (opts.verbose)
        std::fprintf(stderr, "ferry serve: session %llu closed\n",
                     static_cast<unsigned long long>(session.id()));
}

// Sessions open per client, shared with the connection threads (which leave after the Server
// may be gone).
struct Server::Admission {
    std::mutex mu;
    int total = 0;
    std::map<std::string, int> per_client;

    // Admits one more session of `who`, or says why not.
    Status admit(const std::string& who, const ConnectionLimits& lim) {
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
};

Server::Server(ServerOptions opts, ConnectionLimits limits)
    : opts_(std::move(opts)),
      limits_(limits),
      counters_(std::make_shared<ServerCounters>()),
      admission_(std::make_shared<Admission>()),
      refusing_(std::make_shared<std::atomic<int>>(0)) {}

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
    while (!stopping_.load()) {
        Expected<Socket> c = remote::accept_on(listener_, tcp_);
        if (!c) {
            if (stopping_.load()) break;
            return c.status();
        }
        std::string who = c->peer_identity();
        if (Status st = admission_->admit(who, limits_); !st) {
            if (opts_.verbose) std::fprintf(stderr, "ferry serve: %s\n", st.message().c_str());
            refuse(std::move(*c), st.message());
            continue;
        }
        auto counters = counters_;
        auto admission = admission_;
        const bool shm = !tcp_;
        const int timeout = limits_.io_timeout_ms;
        std::thread([sock = std::move(*c), opts, counters, admission, who = std::move(who), shm,
                     timeout]() mutable {
            serve_connection(std::move(sock), *opts, counters.get(), shm, timeout);
            admission->leave(who);
        }).detach();
    }
    return Status::ok();
}

void Server::refuse(Socket sock, std::string why) {
    // The refusal answers the client's first request (its HELLO), so that the client reads
    // it as an ordinary error reply instead of finding the connection reset. Refusals run on
    // a few threads of their own with a short timeout; beyond that, connections just close.
    constexpr int kMaxRefusing = 8;
    if (refusing_->fetch_add(1) >= kMaxRefusing) {
        refusing_->fetch_sub(1);
        return;
    }
    std::thread([sock = std::move(sock), why = std::move(why), n = refusing_]() mutable {
        uint8_t hdr[remote::kHeaderSize];
        Header h;
        if (sock.set_io_timeout(2000) && sock.recv_exact(hdr, sizeof(hdr), nullptr)) {
            h = remote::read_header(hdr);
            std::vector<uint8_t> skip(static_cast<size_t>(std::min<uint64_t>(h.len, 1u << 16)));
            if (h.magic != remote::kMagic || h.len > skip.size() ||
                !sock.recv_exact(skip.data(), skip.size(), nullptr)) {
                h = Header{};
            }
        }
        send_error(sock, h, why);
        n->fetch_sub(1);
    }).detach();
}

void Server::stop() {
    stopping_.store(true);
    listener_.shutdown_both();
}

}  // namespace ferry::server
