// The frame loop every transport's server runs once a session's HELLO was answered: read a
// frame header into private memory, check it, receive the payload (in place for bulk
// TENSOR_SET, dropped unstaged when the session's memory budget cannot hold it), let the
// session handle it, reply. One loop, so that a check made for one transport holds for all.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "core/env.h"
#include "remote-proto/protocol.h"
#include "remote-proto/step-trace.h"
#include "server/server.h"

namespace ferry::server {

// A frame may exceed what the session's memory budget has left by this much (small requests
// always pass; the frame buffer is part of the fixed per-session allowance).
constexpr uint64_t kFrameSlack = 1u << 20;

// FERRY_SERVE_PROFILE=1: where a session's time went, printed to stderr when it ends (when
// this goes away): waiting for the client between frames, receiving payloads, handling each
// command, replying.
class FrameProfile {
  public:
    using Clock = std::chrono::steady_clock;
    explicit FrameProfile(Session& session)
        : session_(&session), on_(env_on("FERRY_SERVE_PROFILE")), last_(Clock::now()) {
        session.time_validation(on_);
    }
    FrameProfile(const FrameProfile&) = delete;
    FrameProfile& operator=(const FrameProfile&) = delete;
    ~FrameProfile() {
        if (!on_) return;
        std::string line;
        for (size_t i = 0; i < ns_.size(); i++) {
            if (!n_[i]) continue;
            const char* name = i == kIdle      ? "idle"
                               : i == kReceive ? "receive"
                               : i == kReply   ? "reply"
                                               : remote::cmd_name(static_cast<uint16_t>(i));
            line += strfmt(" %s %llu x %.1f us;", name, static_cast<unsigned long long>(n_[i]),
                           static_cast<double>(ns_[i]) / 1e3 / static_cast<double>(n_[i]));
        }
        // Of GRAPH_COMPUTE's time: deserializing and validating tables that were not cached.
        if (session_->validations()) {
            line +=
                strfmt(" of which table validation %llu x %.1f us (%llu of %llu entries checked);",
                       static_cast<unsigned long long>(session_->validations()),
                       static_cast<double>(session_->validation_ns()) / 1e3 /
                           static_cast<double>(session_->validations()),
                       static_cast<unsigned long long>(session_->validated_entries()),
                       static_cast<unsigned long long>(session_->table_entries()));
        }
        if (session_->computes()) {
            const double n = static_cast<double>(session_->computes());
            line +=
                strfmt(" of which inputs %.1f us and the backend's compute call %.1f us a compute;",
                       static_cast<double>(session_->inputs_ns()) / 1e3 / n,
                       static_cast<double>(session_->backend_ns()) / 1e3 / n);
        }
        std::fprintf(stderr, "ferry serve: session %llu profile:%s\n",
                     static_cast<unsigned long long>(session_->id()), line.c_str());
    }
    // Adds the time since the last mark to `slot` (a command id, or one of the phases).
    void mark(size_t slot) {
        if (!on_) return;
        const auto now = Clock::now();
        if (slot < ns_.size()) {
            ns_[slot] += static_cast<uint64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count());
            n_[slot]++;
        }
        last_ = now;
    }
    static constexpr size_t kIdle = remote::kCmdMax + 1, kReceive = remote::kCmdMax + 2,
                            kReply = remote::kCmdMax + 3;

  private:
    Session* session_;
    bool on_ = false;
    Clock::time_point last_;
    std::array<uint64_t, remote::kCmdMax + 4> ns_{}, n_{};
};

// Io is one session's transport:
//   Status read(void* dst, size_t n, bool idle_ok, size_t* got): exactly n request bytes
//       (idle_ok: before the first byte, waiting is fine);
//   Status reply(const Header& req, const Reply& r, bool more): more: another reply
//       follows at once (the transport may hold this one to send both together);
//   void end_frame(): the current frame's deadline is over;
//   bool ended_between_frames() const: after a failed read of 0 header bytes, whether that
//       is the client leaving (no error owed) rather than a broken frame;
//   bool more_input() const: bytes of another frame have already arrived.
// keep_bytes: frame buffer capacity kept between requests. *why: how the session ended.
template <class Io>
void serve_frames(Io& io, Session& session, const ServerOptions& opts, size_t keep_bytes,
                  std::string* why) {
    using remote::Header;
    // A GRAPH_COMPUTE whose device work still runs (Session::sync_pending): its reply waits
    // for the session's wait for it, and its payload (which queued input copies may read)
    // stays in `spare` while the next frame is received into `payload`.
    FrameBuffer payload, spare;
    Reply reply, held;
    Header held_h{};
    bool holding = false;
    // Sends the held reply, an error reply instead when the compute's wait failed. Another
    // reply always follows it (the next request's, or an error), so the transport may keep it
    // to send both at once.
    auto release = [&](const Status& waited) -> Status {
        if (!holding) return Status::ok();
        holding = false;
        if (!waited) {
            held = error_reply(
                strfmt("%s: %s", remote::cmd_name(held_h.cmd), waited.message().c_str()));
        }
        return io.reply(held_h, held, /*more=*/true);
    };
    // Waits for a deferred compute now (the next request is not handled by the session).
    auto settle = [&]() -> Status { return holding ? release(session.settle()) : Status::ok(); };
    // Answers with an error and ends the session (the stream cannot be trusted further).
    auto fatal = [&](const Header& h, const std::string& msg) {
        *why = msg;
        (void)settle();
        (void)io.reply(h, error_reply(msg));
    };
    FrameProfile prof(session);
    remote::StepTrace steps("server");
    if constexpr (requires { io.set_step_trace(&steps); }) io.set_step_trace(&steps);
    session.set_step_trace(&steps);
    for (;;) {
        uint8_t hdr[remote::kHeaderSize];
        size_t hdr_got = 0;
        io.end_frame();
        const Status hst = io.read(hdr, sizeof(hdr), /*idle_ok=*/true, &hdr_got);
        prof.mark(FrameProfile::kIdle);
        if (!hst) {
            if (hdr_got == 0 && io.ended_between_frames()) {
                *why = hst.message();
                (void)settle();
            } else {
                fatal(Header{}, "truncated frame header: " + hst.message());
            }
            return;
        }
        // The header is in private memory now: what is checked is what is used.
        const Header h = remote::read_header(hdr);
        steps.ev('H', h.cmd);
        if (Status st = check_frame(h); !st) return fatal(h, st.message());
        Status rst;  // how receiving the payload failed (closed, timed out, detached)
        uint64_t got = 0;
        // Bulk TENSOR_SET into host-addressable memory: once its prefix (handle, offset,
        // size) checks out, the data is received straight into the buffer (no staging copy).
        if (h.cmd == static_cast<uint16_t>(remote::Cmd::TENSOR_SET) && h.flags == 0 &&
            h.len >= kSetPrefix + kDirectMin) {
            // Bytes written straight into a buffer: nothing may still be computing.
            if (Status st = settle(); !st) {
                *why = st.message();
                return;
            }
            payload.ensure(kSetPrefix, static_cast<size_t>(h.len));
            if (rst = io.read(payload.data(), kSetPrefix, false, nullptr); !rst) {
                return fatal(h, "truncated frame: TENSOR_SET prefix: " + rst.message());
            }
            got = kSetPrefix;
            if (uint8_t* dst = session.direct_set_target(payload.data(), h.len)) {
                while (got < h.len) {
                    const size_t step =
                        static_cast<size_t>(std::min<uint64_t>(kReadStep, h.len - got));
                    if (rst = io.read(dst + (got - kSetPrefix), step, false, nullptr); !rst) {
                        return fatal(h, "truncated frame: TENSOR_SET data: " + rst.message());
                    }
                    got += step;
                }
                io.end_frame();
                prof.mark(FrameProfile::kReceive);
                const Status ws = io.reply(h, Reply());
                prof.mark(FrameProfile::kReply);
                if (!ws) {
                    *why = ws.message();
                    return;
                }
                continue;
            }
        }
        // A frame the session's memory budget cannot hold (it would be staged in server
        // memory) is read and dropped in small pieces, and answered with an error.
        const uint64_t charged = session.charged();
        const uint64_t room = opts.max_memory > charged ? opts.max_memory - charged : 0;
        if (opts.max_memory && h.len > room + kFrameSlack) {
            if (Status st = settle(); !st) {
                *why = st.message();
                return;
            }
            uint8_t sink[16384];
            while (got < h.len) {
                const size_t step =
                    static_cast<size_t>(std::min<uint64_t>(sizeof(sink), h.len - got));
                if (rst = io.read(sink, step, false, nullptr); !rst) {
                    return fatal(h, "truncated frame: " + rst.message());
                }
                got += step;
            }
            io.end_frame();
            prof.mark(FrameProfile::kReceive);
            reply = error_reply(strfmt(
                "%s: frame of %llu bytes exceeds what the session memory limit has left (%llu "
                "of %llu bytes charged)",
                remote::cmd_name(h.cmd), static_cast<unsigned long long>(h.len),
                static_cast<unsigned long long>(charged),
                static_cast<unsigned long long>(opts.max_memory)));
        } else {
            // The frame's buffer grows (geometrically, uninitialized) only as its bytes
            // arrive.
            while (got < h.len) {
                const size_t step = static_cast<size_t>(std::min<uint64_t>(kReadStep, h.len - got));
                payload.ensure(static_cast<size_t>(got) + step, static_cast<size_t>(h.len));
                size_t part = 0;
                rst = io.read(payload.data() + got, step, false, &part);
                got += part;
                if (!rst) break;
            }
            if (!rst) {
                return fatal(h,
                             strfmt("truncated frame: %llu of %llu payload bytes, then %s",
                                    static_cast<unsigned long long>(got),
                                    static_cast<unsigned long long>(h.len), rst.message().c_str()));
            }
            io.end_frame();
            prof.mark(FrameProfile::kReceive);
            if (h.flags != 0) {
                if (Status st = settle(); !st) {
                    *why = st.message();
                    return;
                }
                reply =
                    error_reply(strfmt("request with flags 0x%x (requests carry none)", h.flags));
            } else {
                // A compute may be left running when the next request is already arriving
                // (a decode step's read of its logits): that read then waits for both.
                // (Only for frames the buffer keeps anyway: the held payload costs nothing.)
                const bool more = io.more_input();
                session.set_more_input(h.cmd == static_cast<uint16_t>(remote::Cmd::GRAPH_COMPUTE) &&
                                       h.len <= keep_bytes && more);
                session.set_next_waiting(more);
                try {
                    session.handle(h.cmd, payload.data(), static_cast<size_t>(h.len), &reply);
                } catch (const std::exception& e) {
                    // Out of memory while serving one request: answer it, keep the session.
                    reply = error_reply(strfmt("%s: %s", remote::cmd_name(h.cmd), e.what()));
                }
                prof.mark(h.cmd);
                steps.ev('D', h.cmd);
                // The held compute was waited for in this request (before it, or with its
                // read): its reply goes first.
                if (holding) {
                    if (Status st = release(session.take_settled()); !st) {
                        *why = st.message();
                        return;
                    }
                }
                if (session.sync_pending()) {
                    held = std::move(reply);
                    reply = Reply();
                    held_h = h;
                    holding = true;
                    std::swap(payload, spare);
                    continue;
                }
            }
        }
        const Status st = io.reply(h, reply);
        steps.ev('R', h.cmd);
        if (st) session.replied(io.more_input());
        prof.mark(FrameProfile::kReply);
        if (reply.pass_fd >= 0) ::close(reply.pass_fd);
        if (!st) {
            *why = st.message();
            return;
        }
        if (reply.close) {
            *why = "closed after an error";
            return;
        }
        payload.shrink(keep_bytes);
        spare.shrink(keep_bytes);
    }
}

}  // namespace ferry::server
