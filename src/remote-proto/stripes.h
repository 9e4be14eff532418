// Stripe lanes: the extra tcp connections of one session (STRIPE_JOIN, STRIPES) that move
// stripes 1..n-1 of a large reply while the session's own connection moves stripe 0, each lane
// driven by a thread of its own, so that n cores on each side copy the bytes instead of one.
// The server's lanes send, the client's receive. See docs/remote-protocol.md ("Striped
// replies").
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/status.h"
#include "remote-proto/protocol.h"
#include "remote-proto/step-trace.h"
#include "remote-proto/transport.h"

namespace ferry::remote {

// Hands the parts of stripe i (of n) of a len-byte payload at data that lie in [from, to)
// (stripe_parts) to io(parts, k), after the n_before pieces `before`, in batches of at most
// Socket::kMaxParts pieces; stops at the first error io returns.
template <class Io>
Status stripe_io(uint8_t* data, uint64_t len, int n, int i, uint64_t from, uint64_t to, Io&& io,
                 const iovec* before = nullptr, int n_before = 0) {
    iovec parts[Socket::kMaxParts];
    int k = 0;
    for (; k < n_before; k++) parts[k] = before[k];
    Status st;
    stripe_parts(len, n, i, from, to, [&](uint64_t off, uint64_t size) {
        if (st && k == Socket::kMaxParts) {
            st = io(parts, k);
            k = 0;
        }
        if (st) parts[k++] = iovec{data + off, static_cast<size_t>(size)};
    });
    if (st && k > 0) st = io(parts, k);
    return st;
}

// Sends the parts of stripe i in [from, to) after `before` (a reply's held frames and header),
// in as few system calls as Socket::send_parts allows (stripe_io).
Status send_stripe(Socket& sock, const uint8_t* data, uint64_t len, int n, int i, uint64_t from,
                   uint64_t to, const iovec* before = nullptr, int n_before = 0);

class StripeLanes {
  public:
    enum class Dir { Send, Receive };
    // spin_ns: how long an idle lane polls for the next transfer after one, before it sleeps
    // (and finish() for the lanes); expect_ns: how long after wake() (a transfer is coming:
    // on the server, a read that waits for the device's compute first); frame_ms: each
    // stripe's deadline (0: none). FERRY_LANE_IDLE_SPIN_US, when set, replaces spin_ns for
    // the idle lanes (an experiment: 0 makes them sleep between transfers until wake(), so
    // that they do not poll beside the host's work of the next step).
    StripeLanes(Dir dir, int64_t spin_ns, int64_t expect_ns, int frame_ms);
    ~StripeLanes();  // stops the lanes (their sockets are shut down) and joins the threads
    StripeLanes(const StripeLanes&) = delete;
    StripeLanes& operator=(const StripeLanes&) = delete;

    // Adds the next lane (index lanes() + 1) with its connection and starts its thread. Only
    // before the first start().
    Status add(Socket sock);
    int lanes() const { return static_cast<int>(lanes_.size()); }
    // Stripes of a transfer: the lanes and the session's own connection.
    int stripes() const { return lanes() + 1; }

    // Starts moving stripes 1..stripes()-1 of [data, data + len) (sending them, or receiving
    // into them); returns at once. The caller moves stripe 0 on its own connection, then calls
    // finish() before it starts another transfer or lets data go.
    void start(uint8_t* data, uint64_t len) { start(data, len, len); }
    // A send of bytes that are still being produced (a progressive read): only the first
    // `ready` are in place; each lane sends what of its stripe is, and the rest as advance()
    // says more are.
    void start(uint8_t* data, uint64_t len, uint64_t ready);
    void advance(uint64_t ready);
    // Waits until every lane has moved its stripe. A lane whose connection failed fails this
    // transfer and every later one (its error names the lane).
    Status finish();
    // A transfer is coming: the lanes poll for it for up to expect_ns (so that it does not
    // wait for the kernel to schedule sleeping threads: tens of microseconds on an idle host).
    void wake();

  private:
    struct Lane {
        Socket sock;
        std::thread thread;
        // FERRY_STEP_TRACE: the lane's own events (a file per lane, "lane-send" or
        // "lane-receive"): 'w' it found bytes of its stripe in place and sends them, 's' that
        // send returned, 'r' its stripe of a transfer all received.
        std::unique_ptr<StepTrace> trace;
    };
    void run(Lane& me, int index);
    // Waits until `pred` or stop_; polls for spin_ns first. Returns false on stop. (The
    // counters are sequentially consistent: a waiter counts itself in sleepers_ before it
    // checks pred under mu_, a mover changes the counter before it looks at sleepers_.)
    template <class Pred>
    bool wait_for(Pred pred, int64_t spin_ns);
    // Wakes the threads in cv_.wait after a counter they wait on moved (sequentially
    // consistent, before this reads sleepers_).
    void notify_sleepers();

    const Dir dir_;
    const int64_t spin_ns_;
    const int64_t idle_ns_;  // spin_ns_, or FERRY_LANE_IDLE_SPIN_US
    const int64_t expect_ns_;
    const int frame_ms_;
    std::vector<std::unique_ptr<Lane>> lanes_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> seq_{0};   // transfers started
    std::atomic<uint64_t> done_{0};  // stripes moved (lanes x transfers, when all went well)
    std::atomic<uint64_t> wake_{0};  // wake() calls
    std::atomic<int> sleepers_{0};   // threads in cv_.wait (lanes and finish())
    uint8_t* data_ = nullptr;        // the current transfer (written before seq_ moves)
    uint64_t len_ = 0;
    int n_ = 1;
    std::atomic<uint64_t> ready_{0};  // bytes of the current transfer in place (sends)
    Status failed_;                   // the first lane error (under mu_)
};

}  // namespace ferry::remote
