#include "server/server.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>

#include "backends/remote/protocol.h"

namespace ferry::server {

using remote::Header;
using remote::Socket;

namespace {

constexpr uint64_t kMaxSessions = 256;
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

Status send_reply(Socket& s, const Header& req, const Reply& r) {
    Header h;
    h.cmd = req.cmd;
    h.id = req.id;
    h.flags = static_cast<uint16_t>(remote::kFlagReply | (r.error ? remote::kFlagError : 0));
    const uint8_t* body = r.data ? r.data : r.payload.data();
    const size_t len = r.data ? r.data_len : r.payload.size();
    h.len = len;
    uint8_t hdr[remote::kHeaderSize];
    remote::write_header(hdr, h);
    return s.send_all(hdr, sizeof(hdr), body, len, r.pass_fd);
}

// A transport-level error reply (the frame could not be decoded).
void send_error(Socket& s, const Header& req, const std::string& msg) {
    Reply r;
    r.error = true;
    wire::Writer w(&r.payload);
    w.str(msg);
    (void)send_reply(s, req, r);
}

}  // namespace

void serve_connection(Socket sock, const ServerOptions& opts, ServerCounters* counters,
                      bool shared_memory) {
    Session session(opts, counters, shared_memory);
    if (opts.verbose)
        std::fprintf(stderr, "ferry serve: session %llu opened\n",
                     static_cast<unsigned long long>(session.id()));
    FrameBuffer payload;
    Reply reply;
    for (;;) {
        uint8_t hdr[remote::kHeaderSize];
        bool eof = false;
        Status st = sock.recv_exact(hdr, sizeof(hdr), nullptr, &eof);
        if (!st) {
            if (!eof) send_error(sock, Header{}, "truncated frame header: " + st.message());
            break;
        }
        const Header h = remote::read_header(hdr);
        if (h.magic != remote::kMagic) {
            send_error(sock, h, strfmt("bad frame magic 0x%08x (not a ferry client?)", h.magic));
            break;
        }
        if (h.len > remote::kMaxPayload) {
            // The stream cannot be resynchronized without reading the payload: answer, close.
            send_error(sock, h,
                       strfmt("frame of %llu bytes exceeds the limit of %llu",
                              static_cast<unsigned long long>(h.len),
                              static_cast<unsigned long long>(remote::kMaxPayload)));
            break;
        }
        bool truncated = false;
        uint64_t got = 0;
        // Bulk TENSOR_SET into host-addressable memory: once its 24-byte prefix checks out,
        // the data is received straight into the buffer (no staging copy).
        constexpr uint64_t kSetPrefix = 24;
        if (h.cmd == static_cast<uint16_t>(remote::Cmd::TENSOR_SET) && h.flags == 0 &&
            h.len >= kSetPrefix + kDirectMin) {
            payload.ensure(kSetPrefix, static_cast<size_t>(h.len));
            if (!sock.recv_exact(payload.data(), kSetPrefix, nullptr)) {
                send_error(sock, h, "truncated frame: connection closed in a TENSOR_SET prefix");
                break;
            }
            got = kSetPrefix;
            if (uint8_t* dst = session.direct_set_target(payload.data(), h.len)) {
                while (got < h.len) {
                    const size_t step =
                        static_cast<size_t>(std::min<uint64_t>(kReadStep, h.len - got));
                    if (!sock.recv_exact(dst + (got - kSetPrefix), step, nullptr)) {
                        truncated = true;
                        break;
                    }
                    got += step;
                }
                if (truncated) {
                    send_error(sock, h, "truncated frame: connection closed in TENSOR_SET data");
                    break;
                }
                reply = Reply();
                if (!send_reply(sock, h, reply)) break;
                continue;
            }
        }
        // The frame's buffer grows (geometrically, uninitialized) only as its bytes arrive.
        while (got < h.len) {
            const size_t step = static_cast<size_t>(std::min<uint64_t>(kReadStep, h.len - got));
            payload.ensure(static_cast<size_t>(got) + step, static_cast<size_t>(h.len));
            if (!sock.recv_exact(payload.data() + got, step, nullptr)) {
                truncated = true;
                break;
            }
            got += step;
        }
        if (truncated) {
            send_error(sock, h,
                       strfmt("truncated frame: %zu of %llu payload bytes before the connection "
                              "closed",
                              static_cast<size_t>(got), static_cast<unsigned long long>(h.len)));
            break;
        }
        if (h.flags != 0) {
            send_error(sock, h, strfmt("request with flags 0x%x (requests carry none)", h.flags));
            continue;
        }
        try {
            session.handle(h.cmd, payload.data(), static_cast<size_t>(h.len), &reply);
        } catch (const std::exception& e) {
            // Out of memory while serving one request: answer it, keep the session.
            reply = Reply();
            reply.error = true;
            wire::Writer w(&reply.payload);
            w.str(strfmt("%s: %s", remote::cmd_name(h.cmd), e.what()));
        }
        st = send_reply(sock, h, reply);
        if (reply.pass_fd >= 0) ::close(reply.pass_fd);
        if (!st || reply.close) break;
        payload.shrink(kKeepBytes);
    }
    if (opts.verbose)
        std::fprintf(stderr, "ferry serve: session %llu closed\n",
                     static_cast<unsigned long long>(session.id()));
}

Server::Server(ServerOptions opts)
    : opts_(std::move(opts)), counters_(std::make_shared<ServerCounters>()) {}

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
        if (counters_->sessions.load() >= kMaxSessions) {
            send_error(*c, Header{}, "server busy: too many sessions");
            continue;
        }
        auto counters = counters_;
        const bool shm = !tcp_;
        std::thread([sock = std::move(*c), opts, counters, shm]() mutable {
            serve_connection(std::move(sock), *opts, counters.get(), shm);
        }).detach();
    }
    return Status::ok();
}

void Server::stop() {
    stopping_.store(true);
    listener_.shutdown_both();
}

}  // namespace ferry::server
