#include "remote-proto/stripes.h"

#include <sys/uio.h>

#include <algorithm>
#include <string>
#include <utility>

#include "core/spin.h"
#include "remote-proto/protocol.h"

namespace ferry::remote {

Status send_stripe(Socket& sock, const uint8_t* data, uint64_t len, int n, int i, uint64_t from,
                   uint64_t to, const iovec* before, int n_before) {
    return stripe_io(
        const_cast<uint8_t*>(data), len, n, i, from, to,
        [&](const iovec* parts, int k) { return sock.send_parts(parts, k); }, before, n_before);
}

StripeLanes::StripeLanes(Dir dir, int64_t spin_ns, int64_t expect_ns, int frame_ms)
    : dir_(dir),
      spin_ns_(spin_ns),
      idle_ns_(env_spin_ns("FERRY_LANE_IDLE_SPIN_US", spin_ns)),
      expect_ns_(expect_ns),
      frame_ms_(frame_ms) {
    lanes_.reserve(kMaxStripes);
}

StripeLanes::~StripeLanes() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_.store(true);
    }
    cv_.notify_all();
    for (auto& l : lanes_) l->sock.shutdown_both();  // a lane blocked in send or recv returns
    for (auto& l : lanes_) {
        if (l->thread.joinable()) l->thread.join();
    }
}

Status StripeLanes::add(Socket sock) {
    if (lanes() + 1 >= kMaxStripes) return Status::errorf("more than %d stripes", kMaxStripes);
    if (seq_.load() != 0) return Status::error("stripe lanes are added before the first transfer");
    auto l = std::make_unique<Lane>();
    l->sock = std::move(sock);
    l->sock.set_spin_ns(spin_ns_);
    l->sock.set_frame_timeout(frame_ms_);
    l->trace = std::make_unique<StepTrace>(dir_ == Dir::Send ? "lane-send" : "lane-receive");
    const int index = lanes() + 1;
    Lane* lane = l.get();
    lanes_.push_back(std::move(l));
    try {
        lane->thread = std::thread([this, lane, index] { run(*lane, index); });
    } catch (const std::exception& e) {
        lanes_.pop_back();
        return Status::errorf("stripe lane %d: %s", index, e.what());
    }
    return Status::ok();
}

template <class Pred>
bool StripeLanes::wait_for(Pred pred, int64_t spin_ns) {
    if (pred()) return true;
    if (spin_ns > 0) {
        const int64_t until = now_ns() + spin_ns;
        do {
            if (stop_.load(std::memory_order_relaxed)) return false;
            if (pred()) return true;
            cpu_pause();
        } while (now_ns() < until);
    }
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1);
    cv_.wait(lock, [&] { return stop_.load() || pred(); });
    sleepers_.fetch_sub(1);
    return !stop_.load();
}

void StripeLanes::run(Lane& me, int index) {
    uint64_t seen = 0;
    int64_t spin = idle_ns_;
    for (;;) {
        const uint64_t woken = wake_.load();
        // Poll for the next transfer (after wake(), for up to expect_ns_), then sleep.
        if (!wait_for([&] { return seq_.load() != seen || wake_.load() != woken; }, spin)) {
            return;
        }
        if (seq_.load() == seen) {  // woken: a transfer is coming
            spin = expect_ns_;
            continue;
        }
        spin = idle_ns_;
        seen++;
        uint8_t* data;
        uint64_t len;
        int n;
        bool ok;
        {
            std::lock_guard<std::mutex> lock(mu_);
            data = data_;
            len = len_;
            n = n_;
            ok = failed_.is_ok();
        }
        const uint64_t first = stripe_next(len, n, index, 0);
        Status st;
        if (ok && first < len && dir_ == Dir::Receive) {
            // The stripe's chunks straight into place, as few receives as their arrival allows.
            st = stripe_io(data, len, n, index, 0, len, [&](const iovec* parts, int k) {
                return me.sock.recv_exact_parts(parts, k);
            });
            me.trace->ev('r', 0);
            me.sock.end_frame();
        } else if (ok && first < len) {
            // What of the stripe is in place, as it comes (all of it at once, but for a
            // progressive read), in one send each time.
            for (uint64_t at = first; at < len && st;) {
                if (!wait_for([&] { return ready_.load(std::memory_order_acquire) > at; },
                              expect_ns_)) {
                    return;
                }
                const uint64_t upto = std::min(len, ready_.load(std::memory_order_acquire));
                me.trace->ev('w', 0);
                st = send_stripe(me.sock, data, len, n, index, at, upto);
                me.trace->ev('s', 0);
                at = stripe_next(len, n, index, upto);
            }
            me.sock.end_frame();
        }
        if (!st) {
            std::lock_guard<std::mutex> lock(mu_);
            if (failed_)
                failed_ = Status::errorf("stripe connection %d: %s", index, st.message().c_str());
        }
        done_.fetch_add(1);
        notify_sleepers();
    }
}

void StripeLanes::start(uint8_t* data, uint64_t len, uint64_t ready) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        data_ = data;
        len_ = len;
        n_ = stripes();
        ready_.store(std::min(ready, len), std::memory_order_release);
        seq_.fetch_add(1);
    }
    if (sleepers_.load() > 0) cv_.notify_all();
}

void StripeLanes::advance(uint64_t ready) {
    ready_.store(ready);  // sequentially consistent, before sleepers_ is read (wait_for)
    notify_sleepers();
}

Status StripeLanes::finish() {
    const uint64_t want = seq_.load() * static_cast<uint64_t>(lanes());
    if (!wait_for([&] { return done_.load() >= want; }, spin_ns_)) {
        return Status::error("stripe connections stopped");
    }
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
}

void StripeLanes::notify_sleepers() {
    if (sleepers_.load() == 0) return;
    // A sleeper counted itself and checked its condition under mu_: once mu_ has been ours,
    // it either saw the change or waits on cv_. The notification then comes after the unlock,
    // so that the woken thread does not run into the lock at once and sleep on it again.
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
}

void StripeLanes::wake() {
    wake_.fetch_add(1);
    notify_sleepers();
}

}  // namespace ferry::remote
