#include "server/ivshmem-server.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "remote-proto/protocol.h"

namespace ferry::server {

using namespace remote::ivshmem;
using remote::Header;

namespace {

// Payload bytes taken per step: a frame's private buffer grows only as its bytes arrive, so a
// header announcing a large frame costs nothing until the bytes are there.
constexpr size_t kReadStep = 4u << 20;
constexpr size_t kKeepBytes = 16u << 20;  // frame buffer a session keeps between requests
constexpr uint64_t kDirectMin = 256u << 10;
constexpr uint64_t kSetPrefix = 24;

Reply error_reply(const std::string& msg) {
    Reply r;
    r.error = true;
    wire::Writer w(&r.payload);
    w.str(msg);
    return r;
}

// Magic, version and geometry, from the host's private copies.
void publish_header(const Window& win, const Geometry& geo) {
    win.word(kVersionWord).store(uint64_t{kWindowVersion} | (kHeaderBytes << 32));
    win.word(kSizeWord).store(win.size());
    win.word(kReqOffWord).store(geo.req_off);
    win.word(kReqCapWord).store(geo.req_cap);
    win.word(kRepOffWord).store(geo.rep_off);
    win.word(kRepCapWord).store(geo.rep_cap);
    win.word(kMagicWord).store(kWindowMagic, std::memory_order_release);
}

// A guest that scribbled over the header gets it back, so that its next attach finds the
// window (the host itself never reads the geometry from the window).
void repair_header(const Window& win, const Geometry& geo) {
    if (win.word(kMagicWord).load(std::memory_order_relaxed) != kWindowMagic) {
        publish_header(win, geo);
    }
}

}  // namespace

// One session's view of the rings. Positions are private; the window's copies are only
// written (ours) or loaded and checked (the guest's).
struct IvshmemServer::Link {
    const Window& win;
    const Geometry& geo;
    const std::atomic<bool>& stop;
    uint32_t epoch;
    int timeout_ms;
    uint64_t req_tail = 0;  // request bytes consumed
    uint64_t rep_head = 0;  // reply bytes written
    uint64_t beat = 0;
    std::chrono::steady_clock::time_point beat_seen = std::chrono::steady_clock::now();
    bool left = false;  // the client detached or another took the window (not an error)

    // Why waiting must stop now (empty: keep waiting).
    Status keep_waiting(const Backoff& bo, bool idle) {
        if (stop.load(std::memory_order_relaxed)) return Status::error("the server is stopping");
        repair_header(win, geo);
        if (win.word(kClientEpoch).load(std::memory_order_acquire) != epoch) {
            left = true;
            return Status::error("the client detached");
        }
        if (timeout_ms <= 0) return Status::ok();
        if (!idle && bo.waited_ms() > timeout_ms) {
            return Status::errorf("timed out: no progress for %d ms", timeout_ms);
        }
        const uint64_t b = win.word(kClientBeat).load(std::memory_order_relaxed);
        const auto now = std::chrono::steady_clock::now();
        if (b != beat) {
            beat = b;
            beat_seen = now;
        } else if (now - beat_seen > std::chrono::milliseconds(timeout_ms)) {
            return Status::errorf("the client stopped (no heartbeat for %d ms)", timeout_ms);
        }
        return Status::ok();
    }

    // Copies exactly n request bytes into private memory at dst. idle_ok: before the first
    // byte, any wait is fine while the client's heartbeat goes on. *got: bytes copied.
    Status read(void* dst, size_t n, bool idle_ok, size_t* got_out = nullptr) {
        uint8_t* out = static_cast<uint8_t*>(dst);
        size_t got = 0;
        Backoff bo;
        Status st;
        while (got < n) {
            const uint64_t head = win.word(kReqHead).load(std::memory_order_acquire);
            if (head < req_tail || head - req_tail > geo.req_cap) {
                st = Status::errorf(
                    "request ring head %llu out of range (consumed %llu, ring "
                    "of %llu bytes)",
                    static_cast<unsigned long long>(head),
                    static_cast<unsigned long long>(req_tail),
                    static_cast<unsigned long long>(geo.req_cap));
                break;
            }
            const uint64_t avail = head - req_tail;
            if (avail == 0) {
                if (st = keep_waiting(bo, idle_ok && got == 0); !st) break;
                bo.wait();
                continue;
            }
            bo.reset();
            const size_t take = static_cast<size_t>(std::min<uint64_t>(avail, n - got));
            ring_read(win.base() + geo.req_off, geo.req_cap, req_tail, out + got, take);
            got += take;
            req_tail += take;
            win.word(kReqTail).store(req_tail, std::memory_order_release);
        }
        if (got_out) *got_out = got;
        return st;
    }

    // Writes the pieces into the reply ring, waiting (for the I/O timeout) for room.
    Status write(std::initializer_list<std::pair<const void*, size_t>> pieces) {
        Backoff bo;
        for (auto [p, n] : pieces) {
            const uint8_t* src = static_cast<const uint8_t*>(p);
            while (n > 0) {
                const uint64_t tail = win.word(kRepTail).load(std::memory_order_acquire);
                if (tail > rep_head || rep_head - tail > geo.rep_cap) {
                    return Status::errorf("reply ring tail %llu out of range (written %llu)",
                                          static_cast<unsigned long long>(tail),
                                          static_cast<unsigned long long>(rep_head));
                }
                const uint64_t room = geo.rep_cap - (rep_head - tail);
                if (room == 0) {
                    FERRY_TRY(keep_waiting(bo, false));
                    bo.wait();
                    continue;
                }
                bo.reset();
                const size_t take = static_cast<size_t>(std::min<uint64_t>(room, n));
                ring_write(win.base() + geo.rep_off, geo.rep_cap, rep_head, src, take);
                rep_head += take;
                src += take;
                n -= take;
                win.word(kRepHead).store(rep_head, std::memory_order_release);
            }
        }
        return Status::ok();
    }

    Status reply(const Header& req, const Reply& r) {
        const uint8_t* body = r.data ? r.data : r.payload.data();
        const size_t len = r.data ? r.data_len : r.payload.size();
        Header h;
        h.cmd = req.cmd;
        h.id = req.id;
        h.flags = static_cast<uint16_t>(remote::kFlagReply | (r.error ? remote::kFlagError : 0));
        h.len = len;
        uint8_t hdr[remote::kHeaderSize];
        remote::write_header(hdr, h);
        return write({{hdr, sizeof(hdr)}, {body, len}});
    }
};

Expected<std::unique_ptr<IvshmemServer>> IvshmemServer::open(const std::string& spec,
                                                             const ServerOptions& opts,
                                                             ServerCounters* counters,
                                                             int io_timeout_ms) {
    std::string path;
    uint64_t size = 0;
    FERRY_TRY(parse_listen_spec(spec, &path, &size));
    Expected<Window> w = Window::create(path, size);
    if (!w) return w.status();
    std::unique_ptr<IvshmemServer> s(new IvshmemServer(opts, counters));
    s->io_timeout_ms_ = io_timeout_ms;
    s->address_ = "ivshmem:" + path;
    s->win_ = std::move(*w);
    s->geo_ = geometry_for(s->win_.size());
    const Window& win = s->win_;
    // Any client of an earlier server sees the magic vanish and its session end.
    win.word(kMagicWord).store(0, std::memory_order_release);
    std::memset(win.base() + 8, 0, kHeaderBytes - 8);
    publish_header(s->win_, s->geo_);
    IvshmemServer* self = s.get();
    s->ticker_ = std::thread([self] {
        while (!self->stop_.load(std::memory_order_relaxed)) {
            self->win_.word(kServerBeat).fetch_add(1, std::memory_order_relaxed);
            std::this_thread::sleep_for(std::chrono::milliseconds(kBeatMs));
        }
    });
    return s;
}

IvshmemServer::~IvshmemServer() {
    stop();
    if (ticker_.joinable()) ticker_.join();
    Backoff bo;
    while (running_.load()) bo.wait();
    if (win_.base()) win_.word(kServerAck).store(kAckNone, std::memory_order_release);
}

void IvshmemServer::run() {
    running_.store(true);
    uint32_t served = 0;  // the last epoch served: a session per epoch, never twice
    Backoff bo(10000);    // an idle window: a guest's attach waits at most ~10 ms more
    while (!stop_.load(std::memory_order_relaxed)) {
        // The guest writes the epoch: anything but a fresh 32-bit value is ignored.
        const uint64_t e = win_.word(kClientEpoch).load(std::memory_order_acquire);
        if (e != 0 && e <= UINT32_MAX && e != served) {
            served = static_cast<uint32_t>(e);
            serve_session(served);
            bo.reset();
            continue;
        }
        repair_header(win_, geo_);
        bo.wait();
    }
    running_.store(false);
}

void IvshmemServer::serve_session(uint32_t epoch) {
    // A fresh pair of rings, then the acknowledgement (release: the zeroed counters are
    // visible before it).
    for (uint64_t w : {kReqHead, kReqTail, kRepHead, kRepTail}) {
        win_.word(w).store(0, std::memory_order_relaxed);
    }
    publish_header(win_, geo_);  // a guest that scribbled over it before gets a clean window
    win_.word(kServerAck).store((uint64_t{epoch} << 32) | kAckOpen, std::memory_order_release);
    Link io{win_, geo_, stop_, epoch, io_timeout_ms_};
    std::string why;
    {
        Session session(opts_, counters_, /*shared_memory=*/false);
        if (opts_.verbose)
            std::fprintf(stderr, "ferry serve: %s: session %llu opened (epoch %08x)\n",
                         address_.c_str(), static_cast<unsigned long long>(session.id()), epoch);
        // Answers with an error and ends the session (the stream cannot be trusted further).
        auto fatal = [&](const Header& h, const std::string& msg) {
            why = msg;
            (void)io.reply(h, error_reply(msg));
        };
        std::unique_ptr<uint8_t[]> buf;
        size_t cap = 0;
        // Makes room for n bytes, keeping the first `keep` (grows geometrically).
        auto ensure = [&](size_t n, size_t keep, size_t limit) {
            if (n <= cap) return;
            size_t c = std::max<size_t>(cap * 2, 64u << 10);
            c = std::max(std::min(c, limit), n);
            std::unique_ptr<uint8_t[]> q(new uint8_t[c]);
            if (keep) std::memcpy(q.get(), buf.get(), keep);
            buf = std::move(q);
            cap = c;
        };
        Reply reply;
        for (;;) {
            uint8_t hdr[remote::kHeaderSize];
            size_t hdr_got = 0;
            Status st = io.read(hdr, sizeof(hdr), /*idle_ok=*/true, &hdr_got);
            if (!st) {
                if (io.left && hdr_got == 0) {
                    why = st.message();
                } else {
                    fatal(Header{}, "truncated frame header: " + st.message());
                }
                break;
            }
            // The header is in private memory now: what is checked is what is used.
            const Header h = remote::read_header(hdr);
            if (h.magic != remote::kMagic) {
                fatal(h, strfmt("bad frame magic 0x%08x (not a ferry client?)", h.magic));
                break;
            }
            if (h.len > remote::kMaxPayload) {
                fatal(h, strfmt("frame of %llu bytes exceeds the limit of %llu",
                                static_cast<unsigned long long>(h.len),
                                static_cast<unsigned long long>(remote::kMaxPayload)));
                break;
            }
            uint64_t got = 0;
            Status rst;
            // Bulk TENSOR_SET into host-addressable memory: once its prefix checks out, the
            // data is copied from the ring straight into the buffer (no staging copy).
            if (h.cmd == static_cast<uint16_t>(remote::Cmd::TENSOR_SET) && h.flags == 0 &&
                h.len >= kSetPrefix + kDirectMin) {
                ensure(kSetPrefix, 0, static_cast<size_t>(h.len));
                if (rst = io.read(buf.get(), kSetPrefix, false); !rst) {
                    fatal(h, "truncated frame: TENSOR_SET prefix: " + rst.message());
                    break;
                }
                got = kSetPrefix;
                if (uint8_t* dst = session.direct_set_target(buf.get(), h.len)) {
                    rst = io.read(dst, static_cast<size_t>(h.len - kSetPrefix), false);
                    if (!rst) {
                        fatal(h, "truncated frame: TENSOR_SET data: " + rst.message());
                        break;
                    }
                    if (Status ws = io.reply(h, Reply()); !ws) {
                        why = ws.message();
                        break;
                    }
                    continue;
                }
            }
            while (got < h.len) {
                const size_t step = static_cast<size_t>(std::min<uint64_t>(kReadStep, h.len - got));
                ensure(static_cast<size_t>(got) + step, static_cast<size_t>(got),
                       static_cast<size_t>(h.len));
                size_t part = 0;
                rst = io.read(buf.get() + got, step, false, &part);
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
                reply =
                    error_reply(strfmt("request with flags 0x%x (requests carry none)", h.flags));
            } else {
                try {
                    session.handle(h.cmd, buf.get(), static_cast<size_t>(h.len), &reply);
                } catch (const std::exception& e) {
                    reply = error_reply(strfmt("%s: %s", remote::cmd_name(h.cmd), e.what()));
                }
            }
            st = io.reply(h, reply);
            if (reply.pass_fd >= 0) ::close(reply.pass_fd);
            if (!st) {
                why = st.message();
                break;
            }
            if (reply.close) {
                why = "closed after an error";
                break;
            }
            if (cap > kKeepBytes) {
                buf.reset();
                cap = 0;
            }
        }
        if (opts_.verbose)
            std::fprintf(stderr, "ferry serve: %s: session %llu closed: %s\n", address_.c_str(),
                         static_cast<unsigned long long>(session.id()), why.c_str());
    }  // the session, and every buffer it holds, is freed here
    win_.word(kServerAck).store((uint64_t{epoch} << 32) | kAckClosed, std::memory_order_release);
}

}  // namespace ferry::server
