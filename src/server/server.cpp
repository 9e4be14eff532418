#include "server/server.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <thread>

#include "backends/remote/protocol.h"

namespace ferry::server {

using remote::Header;
using remote::Socket;

namespace {

constexpr uint64_t kMaxSessions = 256;
// Payload bytes read per step: a frame's buffer grows as its bytes arrive, so a header that
// announces a large frame costs nothing until the bytes are actually sent.
constexpr size_t kReadStep = 1u << 20;

Status send_reply(Socket& s, const Header& req, const Reply& r) {
    Header h;
    h.cmd = req.cmd;
    h.id = req.id;
    h.flags = static_cast<uint16_t>(remote::kFlagReply | (r.error ? remote::kFlagError : 0));
    h.len = r.payload.size();
    uint8_t hdr[remote::kHeaderSize];
    remote::write_header(hdr, h);
    return s.send_all(hdr, sizeof(hdr), r.payload.data(), r.payload.size(), r.pass_fd);
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
    std::vector<uint8_t> payload;
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
        payload.clear();
        bool truncated = false;
        while (payload.size() < h.len) {
            const size_t at = payload.size();
            const size_t step = std::min<uint64_t>(kReadStep, h.len - at);
            payload.resize(at + step);
            if (!sock.recv_exact(payload.data() + at, step, nullptr)) {
                truncated = true;
                break;
            }
        }
        if (truncated) {
            send_error(sock, h,
                       strfmt("truncated frame: %zu of %llu payload bytes before the connection "
                              "closed",
                              payload.size(), static_cast<unsigned long long>(h.len)));
            break;
        }
        if (h.flags != 0) {
            send_error(sock, h, strfmt("request with flags 0x%x (requests carry none)", h.flags));
            continue;
        }
        try {
            session.handle(h.cmd, payload.data(), payload.size(), &reply);
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
        if (payload.capacity() > (8u << 20)) payload = std::vector<uint8_t>();
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
