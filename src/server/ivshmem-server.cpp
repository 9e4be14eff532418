#include "server/ivshmem-server.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "remote-proto/protocol.h"
#include "server/frame-loop.h"
#include "server/server.h"

namespace ferry::server {

using namespace remote::ivshmem;
using remote::Header;

namespace {

constexpr size_t kKeepBytes = 16u << 20;  // frame buffer a session keeps between requests

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
// window (the host itself never reads the geometry from the window). Every host-owned word is
// compared with the private copy: a scribbled version or geometry word under an intact magic
// would otherwise turn the next client away.
void repair_header(const Window& win, const Geometry& geo) {
    const uint64_t want[][2] = {{kVersionWord, uint64_t{kWindowVersion} | (kHeaderBytes << 32)},
                                {kSizeWord, win.size()},
                                {kReqOffWord, geo.req_off},
                                {kReqCapWord, geo.req_cap},
                                {kRepOffWord, geo.rep_off},
                                {kRepCapWord, geo.rep_cap},
                                {kMagicWord, kWindowMagic}};
    for (const auto& [word, value] : want) {
        if (win.word(word).load(std::memory_order_relaxed) != value) {
            win.word(kMagicWord).store(0, std::memory_order_relaxed);
            publish_header(win, geo);
            return;
        }
    }
}

}  // namespace

// One session's view of the rings. Positions are private; the window's copies are only
// written (ours) or loaded and checked (the guest's).
struct IvshmemServer::Link {
    using Clock = std::chrono::steady_clock;
    const Window& win;
    const Geometry& geo;
    const std::atomic<bool>& stop;
    uint32_t epoch;
    int timeout_ms;
    uint64_t req_tail = 0;  // request bytes consumed
    uint64_t rep_head = 0;  // reply bytes written
    uint64_t beat = 0;
    Clock::time_point beat_seen = Clock::now();
    bool left = false;  // the client detached or another took the window (not an error)
    // The deadline of the frame being received or sent (none between frames): the whole
    // frame must pass within it, however its bytes trickle in.
    bool has_deadline = false;
    Clock::time_point deadline{};
    std::string deadline_what{};  // what the deadline was for, for its error

    void set_deadline(Clock::time_point at, std::string what) {
        has_deadline = true;
        deadline = at;
        deadline_what = std::move(what);
    }
    // Starts a frame's deadline (the I/O timeout from now) unless one runs already.
    void start_frame() {
        if (has_deadline || timeout_ms <= 0) return;
        set_deadline(Clock::now() + std::chrono::milliseconds(timeout_ms),
                     strfmt("a frame must pass in full within %d ms (--io-timeout)", timeout_ms));
    }
    void end_frame() { has_deadline = false; }
    // A window has no end to close: a failed read between frames (the guest detached or
    // stopped) ends the session quietly.
    bool ended_between_frames() const { return true; }
    // Whether request bytes beyond those read have been published (a hint: the frame loop
    // only decides whether to answer a compute now or with the request that follows).
    bool more_input() const {
        return win.word(kReqHead).load(std::memory_order_acquire) != req_tail;
    }

    // Why waiting must stop now (empty: keep waiting). idle: between frames, where only the
    // client's heartbeat must go on.
    Status keep_waiting(bool idle) {
        if (stop.load(std::memory_order_relaxed)) return Status::error("the server is stopping");
        repair_header(win, geo);
        if (win.word(kClientEpoch).load(std::memory_order_acquire) != epoch) {
            left = true;
            return Status::error("the client detached");
        }
        const auto now = Clock::now();
        if (!idle && has_deadline && now > deadline) {
            return Status::errorf("timed out: %s", deadline_what.c_str());
        }
        if (heartbeat_stopped(now)) {
            return Status::errorf("the client stopped (no heartbeat for %d ms)", timeout_ms);
        }
        return Status::ok();
    }

    // True once the guest's heartbeat has not moved for the I/O timeout (never when that is
    // 0). Called by the session's thread and, while it waits for a compute, by the compute.
    bool heartbeat_stopped(Clock::time_point now) {
        if (timeout_ms <= 0) return false;
        const uint64_t b = win.word(kClientBeat).load(std::memory_order_relaxed);
        if (b != beat) {
            beat = b;
            beat_seen = now;
            return false;
        }
        return now - beat_seen > std::chrono::milliseconds(timeout_ms);
    }

    // Copies exactly n request bytes into private memory at dst. idle_ok: before the first
    // byte, any wait is fine while the client's heartbeat goes on; the first byte starts the
    // frame's deadline. *got: bytes copied.
    Status read(void* dst, size_t n, bool idle_ok, size_t* got_out = nullptr) {
        uint8_t* out = static_cast<uint8_t*>(dst);
        size_t got = 0;
        Backoff bo;
        Status st;
        bool rechecked = false;
        if (!idle_ok) start_frame();
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
                if (st = keep_waiting(idle_ok && got == 0 && !has_deadline); !st) {
                    // Bytes the client published before it detached come first (it writes the
                    // head, then detaches): look once more, once, before reporting the end
                    // (only once: a detached client that goes on writing must not outlast the
                    // frame deadline).
                    if (left && !rechecked &&
                        win.word(kReqHead).load(std::memory_order_acquire) != req_tail) {
                        rechecked = true;
                        st = Status::ok();
                        continue;
                    }
                    break;
                }
                bo.wait();
                continue;
            }
            bo.reset();
            start_frame();
            const size_t take = static_cast<size_t>(std::min<uint64_t>(avail, n - got));
            ring_read(win.base() + geo.req_off, geo.req_cap, req_tail, out + got, take);
            got += take;
            req_tail += take;
            win.word(kReqTail).store(req_tail, std::memory_order_release);
        }
        if (got_out) *got_out = got;
        return st;
    }

    // Writes the pieces into the reply ring, waiting for room until the frame's deadline.
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
                    FERRY_TRY(keep_waiting(false));
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

    // Sends one reply frame, all of it within its own deadline (`more`: another reply
    // follows at once; the ring needs no batching).
    Status reply(const Header& req, const Reply& r, bool more = false) {
        (void)more;
        const uint8_t* body = r.data ? r.data : r.payload.data();
        const size_t len = r.data ? r.data_len : r.payload.size();
        Header h;
        h.cmd = req.cmd;
        h.id = req.id;
        h.flags = static_cast<uint16_t>(remote::kFlagReply | (r.error ? remote::kFlagError : 0));
        h.len = len;
        uint8_t hdr[remote::kHeaderSize];
        remote::write_header(hdr, h);
        end_frame();
        start_frame();
        Status st = write({{hdr, sizeof(hdr)}, {body, len}});
        end_frame();
        return st;
    }
};

namespace {

// A running compute's view of the guest (called from one compute thread, at most every
// 10 ms, while the session's thread waits for the compute): true once the guest detached,
// another client took the window, the guest's heartbeat stopped for the I/O timeout (a killed
// or frozen VM), or the server is stopping.
std::function<bool()> guest_gone_check(IvshmemServer::Link* io) {
    auto last = std::make_shared<std::chrono::steady_clock::time_point>();
    return [io, last]() {
        const auto now = std::chrono::steady_clock::now();
        if (now - *last < std::chrono::milliseconds(10)) return false;
        *last = now;
        return io->stop.load(std::memory_order_relaxed) ||
               io->win.word(kClientEpoch).load(std::memory_order_acquire) != io->epoch ||
               io->heartbeat_stopped(now);
    };
}

}  // namespace

Expected<std::unique_ptr<IvshmemServer>> IvshmemServer::open(const std::string& spec,
                                                             const ServerOptions& opts,
                                                             ServerCounters* counters,
                                                             int io_timeout_ms,
                                                             int hello_timeout_ms) {
    std::string path;
    uint64_t size = 0;
    FERRY_TRY(parse_listen_spec(spec, &path, &size));
    Expected<Window> w = Window::create(path, size);
    if (!w) return w.status();
    std::unique_ptr<IvshmemServer> s(new IvshmemServer(opts, counters));
    s->io_timeout_ms_ = io_timeout_ms;
    s->hello_timeout_ms_ = hello_timeout_ms;
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

// The first frame of a session must be a HELLO of at most kMaxHelloFrame bytes, all of it
// within the hello deadline of the attach, as on a socket; anything else is answered with an
// error and ends the session (the guest attaches again with a new epoch to retry).
bool IvshmemServer::hello(Link& io, Session& session, std::string* why) {
    auto refuse = [&](const Header& h, const std::string& msg) {
        *why = msg;
        if (!io.left) (void)io.reply(h, error_reply(msg));
        return false;
    };
    if (hello_timeout_ms_ > 0) {
        io.set_deadline(
            Link::Clock::now() + std::chrono::milliseconds(hello_timeout_ms_),
            strfmt("no HELLO within %d ms of attaching (--hello-timeout)", hello_timeout_ms_));
    }
    uint8_t hdr[remote::kHeaderSize];
    if (Status st = io.read(hdr, sizeof(hdr), /*idle_ok=*/hello_timeout_ms_ <= 0); !st) {
        return refuse(Header{}, "HELLO: " + st.message());
    }
    const Header h = remote::read_header(hdr);
    if (h.magic != remote::kMagic) return refuse(h, check_hello(h).message());
    uint8_t body[kMaxHelloFrame];
    if (h.len <= kMaxHelloFrame) {
        if (Status st = io.read(body, static_cast<size_t>(h.len), false); !st) {
            return refuse(h, "truncated HELLO: " + st.message());
        }
    }
    if (Status st = check_hello(h); !st) return refuse(h, st.message());
    io.end_frame();
    Reply reply;
    session.handle(h.cmd, body, static_cast<size_t>(h.len), &reply);
    if (Status st = io.reply(h, reply); !st) {
        *why = st.message();
        return false;
    }
    if (reply.error) {
        wire::Reader r(reply.payload.data(), reply.payload.size());
        *why = r.str(4096);
        return false;
    }
    return true;
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
        if (hello(io, session, &why)) {
            session.set_abort_check(guest_gone_check(&io));
            serve_frames(io, session, opts_, kKeepBytes, &why);
        }
        if (opts_.verbose)
            std::fprintf(stderr, "ferry serve: %s: session %llu closed: %s\n", address_.c_str(),
                         static_cast<unsigned long long>(session.id()), why.c_str());
    }  // the session, and every buffer it holds, is freed here
    win_.word(kServerAck).store((uint64_t{epoch} << 32) | kAckClosed, std::memory_order_release);
}

}  // namespace ferry::server
