#include "backends/remote/transport-ivshmem.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace ferry::remote {

using namespace ivshmem;

Expected<std::unique_ptr<IvshmemChannel>> IvshmemChannel::attach(const std::string& spec) {
    Expected<Window> w = Window::open(spec);
    if (!w) return w.status();
    std::unique_ptr<IvshmemChannel> c(new IvshmemChannel());
    c->win_ = std::move(*w);
    const Window& win = c->win_;
    // The host may be setting the window up (or repairing a header a previous user
    // scribbled over, which can leave the magic intact and another word not): give it a
    // moment to show a whole, consistent header.
    auto header_ok = [&] {
        if (win.word(kMagicWord).load(std::memory_order_acquire) != kWindowMagic) return false;
        const uint64_t v = win.word(kVersionWord).load(std::memory_order_relaxed);
        return static_cast<uint32_t>(v) == kWindowVersion && (v >> 32) == kHeaderBytes;
    };
    Backoff wait_magic;
    while (!header_ok() && wait_magic.waited_ms() < kMagicWaitMs) wait_magic.wait();
    if (win.word(kMagicWord).load(std::memory_order_acquire) != kWindowMagic) {
        return Status::errorf(
            "ivshmem window %s: not set up by a ferry server (no FERRYWIN magic; is `ferry "
            "serve --listen ivshmem:...` running on the host?)",
            win.what().c_str());
    }
    const uint64_t ver = win.word(kVersionWord).load(std::memory_order_relaxed);
    if (static_cast<uint32_t>(ver) != kWindowVersion || (ver >> 32) != kHeaderBytes) {
        return Status::errorf(
            "ivshmem window %s: layout version %u, header %llu bytes; this "
            "client speaks version %u",
            win.what().c_str(), static_cast<uint32_t>(ver),
            static_cast<unsigned long long>(ver >> 32), kWindowVersion);
    }
    const uint64_t ack = win.word(kServerAck).load(std::memory_order_acquire);
    const uint32_t mine = win.word(kClientEpoch).load(std::memory_order_relaxed);
    c->epoch_ = new_epoch(static_cast<uint32_t>(ack >> 32) ^ mine);
    if (c->epoch_ == mine) c->epoch_ = new_epoch(mine);
    win.word(kClientEpoch).store(c->epoch_, std::memory_order_release);
    // Wait for the host to reset the rings and acknowledge this epoch.
    const uint64_t open = (uint64_t{c->epoch_} << 32) | kAckOpen;
    const uint64_t closed = (uint64_t{c->epoch_} << 32) | kAckClosed;
    Backoff bo;
    for (;;) {
        const uint64_t a = win.word(kServerAck).load(std::memory_order_acquire);
        if (a == open) break;
        if (a == closed) {
            return Status::errorf("ivshmem window %s: the server refused the session",
                                  win.what().c_str());
        }
        if (bo.waited_ms() > kAttachTimeoutMs) {
            win.word(kClientEpoch).store(0, std::memory_order_release);
            return Status::errorf(
                "ivshmem window %s: no answer from a ferry server within %d s (is `ferry "
                "serve --listen ivshmem:...` running on the host?)",
                win.what().c_str(), kAttachTimeoutMs / 1000);
        }
        bo.wait();
    }
    // The geometry is read after the acknowledgement: the host publishes it again for every
    // session (a previous user of the window may have scribbled over it).
    Geometry g;
    g.req_off = win.word(kReqOffWord).load(std::memory_order_relaxed);
    g.req_cap = win.word(kReqCapWord).load(std::memory_order_relaxed);
    g.rep_off = win.word(kRepOffWord).load(std::memory_order_relaxed);
    g.rep_cap = win.word(kRepCapWord).load(std::memory_order_relaxed);
    const uint64_t size = win.size();
    auto inside = [&](uint64_t off, uint64_t cap) {
        return off >= kHeaderBytes && cap > 0 && off <= size && cap <= size - off;
    };
    if (!inside(g.req_off, g.req_cap) || !inside(g.rep_off, g.rep_cap) ||
        (g.req_off < g.rep_off + g.rep_cap && g.rep_off < g.req_off + g.req_cap)) {
        c->detach();
        return Status::errorf("ivshmem window %s: ring geometry out of the %llu-byte window",
                              win.what().c_str(), static_cast<unsigned long long>(size));
    }
    c->geo_ = g;
    c->last_beat_ = win.word(kServerBeat).load(std::memory_order_relaxed);
    c->beat_seen_ = std::chrono::steady_clock::now();
    IvshmemChannel* self = c.get();
    c->ticker_ = std::thread([self] {
        while (!self->stop_.load(std::memory_order_relaxed)) {
            self->win_.word(kClientBeat).fetch_add(1, std::memory_order_relaxed);
            std::this_thread::sleep_for(std::chrono::milliseconds(kBeatMs));
        }
    });
    return c;
}

IvshmemChannel::~IvshmemChannel() {
    stop_.store(true);
    if (ticker_.joinable()) ticker_.join();
    if (win_.base()) detach();  // unless another client has taken the window over since
}

Status IvshmemChannel::violation(const char* what) {
    return Status::errorf("ivshmem window %s: %s", win_.what().c_str(), what);
}

Status IvshmemChannel::check_alive() {
    const uint64_t a = win_.word(kServerAck).load(std::memory_order_acquire);
    if (a != ((uint64_t{epoch_} << 32) | kAckOpen)) {
        if ((a >> 32) == epoch_) return violation("the server ended the session");
        return violation(
            "the session is gone (the server restarted or another client took "
            "the window over)");
    }
    const uint64_t beat = win_.word(kServerBeat).load(std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (beat != last_beat_) {
        last_beat_ = beat;
        beat_seen_ = now;
    } else if (now - beat_seen_ > std::chrono::milliseconds(kServerGoneMs)) {
        return Status::errorf("ivshmem window %s: the server stopped (no heartbeat for %d s)",
                              win_.what().c_str(), kServerGoneMs / 1000);
    }
    return Status::ok();
}

Expected<size_t> IvshmemChannel::write_some(const void* p, size_t n) {
    const uint64_t tail = win_.word(kReqTail).load(std::memory_order_acquire);
    if (tail > req_head_ || req_head_ - tail > geo_.req_cap) {
        return violation("request ring tail out of range");
    }
    const uint64_t room = geo_.req_cap - (req_head_ - tail);
    const size_t take = static_cast<size_t>(std::min<uint64_t>(room, n));
    if (take == 0) return size_t{0};
    ring_write(win_.base() + geo_.req_off, geo_.req_cap, req_head_, p, take);
    req_head_ += take;
    win_.word(kReqHead).store(req_head_, std::memory_order_release);
    return take;
}

bool IvshmemChannel::readable() {
    return win_.word(kRepHead).load(std::memory_order_acquire) != rep_tail_;
}

void IvshmemChannel::detach() {
    uint64_t expected = epoch_;
    win_.word(kClientEpoch).compare_exchange_strong(expected, 0, std::memory_order_release);
}

Status IvshmemChannel::read(void* dst, size_t n, int timeout_ms) {
    using Clock = std::chrono::steady_clock;
    uint8_t* out = static_cast<uint8_t*>(dst);
    size_t got = 0;
    Backoff bo;
    bool waited = false, predicted = false, polled = false;
    Clock::time_point t0;
    // The prediction slot of this read (0: none), used once.
    const uint16_t slot = expect_cmd_;
    expect_cmd_ = 0;
    uint32_t& expect_us = expect_us_[slot];
    while (got < n) {
        const uint64_t head = win_.word(kRepHead).load(std::memory_order_acquire);
        if (head < rep_tail_ || head - rep_tail_ > geo_.rep_cap) {
            return violation("reply ring head out of range");
        }
        const uint64_t avail = head - rep_tail_;
        if (avail == 0) {
            // Data already written comes before the end of a session: look for it once more
            // after seeing the session end (the host publishes the head first).
            if (Status st = check_alive(); !st) {
                if (win_.word(kRepHead).load(std::memory_order_acquire) != rep_tail_) continue;
                return st;
            }
            if (timeout_ms > 0 && bo.waited_ms() > timeout_ms) {
                return violation("timed out waiting for a reply");
            }
            if (!waited) {
                waited = true;
                t0 = Clock::now();
                // Sleep through most of a predicted wait that is longer than the spin phase
                // would cover (a wait the spin covers is answered soonest by spinning).
                constexpr uint32_t kMinPredictUs = 60, kWakeUs = 30;
                static const int64_t min_predict =
                    std::max<int64_t>(kMinPredictUs, Backoff::spin_us());
                if (slot != 0 && expect_us >= min_predict) {
                    predicted = true;
                    sleep_us(expect_us - kWakeUs);
                    continue;
                }
            }
            polled = true;
            bo.wait();
            continue;
        }
        if (waited && slot != 0) {
            // Learn the next wait for this command's reply from this one (only the first wait
            // of a header's read; a payload's wait teaches nothing).
            constexpr uint32_t kMaxPredictUs = 20000;
            if (predicted && !polled) {
                expect_us /= 2;  // the reply was there when the sleep ended: maybe earlier
            } else {
                const auto us =
                    std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0)
                        .count();
                expect_us = static_cast<uint32_t>(std::min<int64_t>(kMaxPredictUs, us * 3 / 4));
            }
        }
        waited = false;
        bo.reset();
        const size_t take = static_cast<size_t>(std::min<uint64_t>(avail, n - got));
        ring_read(win_.base() + geo_.rep_off, geo_.rep_cap, rep_tail_, out + got, take);
        got += take;
        rep_tail_ += take;
        win_.word(kRepTail).store(rep_tail_, std::memory_order_release);
    }
    return Status::ok();
}

}  // namespace ferry::remote
