#include "backends/cpu/thread-pool.h"

#include <algorithm>
#include <chrono>

#include "core/spin.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#endif

namespace ferry::cpu {

namespace {

// How long a wait spins before it sleeps. Waking a sleeping thread takes tens of microseconds
// (longer in a virtual machine); a spin shorter than that lets two threads fall into a convoy
// where each barrier costs a full wake-up. A partner that is running arrives well within it,
// and one that was preempted costs us this much CPU before we give the core away.
constexpr auto kSpinTime = std::chrono::microseconds(300);
// Waiting for the next run(): the caller's host work between graphs (inputs, logits,
// sampling) takes a few microseconds; spin somewhat longer there.
constexpr auto kIdleSpinTime = std::chrono::microseconds(1000);
// Longest stretch of run() calls made by the caller alone after threads went missing.
constexpr int kMaxSoloRuns = 128;

void sleep_while(ThreadPool::Signal& s, uint32_t old) {
    s.slept.fetch_add(1, std::memory_order_relaxed);
    s.sleepers.fetch_add(1, std::memory_order_seq_cst);
    while (s.word.load(std::memory_order_seq_cst) == old) {
#if defined(__linux__)
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&s.word), FUTEX_WAIT_PRIVATE, old, nullptr,
                nullptr, 0);
#else
        s.word.wait(old, std::memory_order_seq_cst);
#endif
    }
    s.sleepers.fetch_sub(1, std::memory_order_relaxed);
}

// Returns the new value of s.word once it differs from old.
template <class Duration>
uint32_t wait_while(ThreadPool::Signal& s, uint32_t old, Duration spin_time) {
    std::chrono::steady_clock::time_point deadline{};
    for (int i = 0;; i++) {
        for (int k = 0; k < 16; k++) {
            const uint32_t w = s.word.load(std::memory_order_acquire);
            if (w != old) return w;
            cpu_pause();
        }
        const auto now = std::chrono::steady_clock::now();
        if (i == 0) {
            deadline = now + spin_time;
        } else if (now > deadline) {
            break;
        }
    }
    sleep_while(s, old);
    return s.word.load(std::memory_order_acquire);
}

// Changes s.word by one (seq_cst: ordered against the sleepers check, as a sleeper orders its
// sleepers increment against its check of the word) and wakes the sleepers, if any.
void signal(ThreadPool::Signal& s) {
    s.word.fetch_add(1, std::memory_order_seq_cst);
    if (s.sleepers.load(std::memory_order_seq_cst) > 0) {
#if defined(__linux__)
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&s.word), FUTEX_WAKE_PRIVATE, INT_MAX,
                nullptr, nullptr, 0);
#else
        s.word.notify_all();
#endif
    }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_threads_; i++) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    stop_ = true;
    signal(dispatch_);
    for (auto& t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    if (solo_left_ > 0) {
        // Recently the other threads were not there when needed (preempted by other work on
        // a busy machine): the caller runs alone for a while. Kernels give the same bits for
        // any thread count, so this changes speed only.
        solo_left_--;
        active_ = 1;
        fn(0, 1);
        return;
    }
    active_ = n_threads_;
    fn_ = &fn;
    const int slept0 =
        done_.slept.load(std::memory_order_relaxed) + phase_.slept.load(std::memory_order_relaxed);
    const uint32_t done0 = done_.word.load(std::memory_order_relaxed);
    const uint32_t phase0 = phase_.word.load(std::memory_order_relaxed);
    signal(dispatch_);
    fn(0, n_threads_);
    // Each worker adds one to done_ when it finishes.
    const uint32_t target = done0 + static_cast<uint32_t>(n_threads_ - 1);
    uint32_t d = done_.word.load(std::memory_order_acquire);
    while (d != target) d = wait_while(done_, d, kSpinTime);
    fn_ = nullptr;
    // Waits that outlast their spin on a good share of the barriers mean threads keep going
    // missing (preempted by other work): run alone for a number of calls that doubles while
    // it keeps happening, and try all threads again after that. A few long waits are only
    // uneven work (a big matmul split by rows) and must not send a busy 1B decode down to
    // one thread: measured 29.8 -> 33.4 tokens/s on llama-3.2-1b Q4_0 tg64, 2 threads.
    const int slept = done_.slept.load(std::memory_order_relaxed) +
                      phase_.slept.load(std::memory_order_relaxed) - slept0;
    const int barriers = static_cast<int>(phase_.word.load(std::memory_order_relaxed) - phase0);
    if (slept > 0 && 4 * slept > barriers + 1) {
        solo_backoff_ = std::min(kMaxSoloRuns, solo_backoff_ > 0 ? solo_backoff_ * 2 : 1);
        solo_left_ = solo_backoff_;
    } else {
        solo_backoff_ /= 2;
    }
}

void ThreadPool::worker(int ith) {
    uint32_t seen = 0;
    for (;;) {
        seen = wait_while(dispatch_, seen, kIdleSpinTime);
        if (stop_) return;
        (*fn_)(ith, n_threads_);
        signal(done_);
    }
}

bool ThreadPool::barrier_any(bool flag) {
    if (active_ == 1) return flag;
    const uint32_t phase = phase_.word.load(std::memory_order_acquire);
    if (flag) bar_flag_.fetch_or(1, std::memory_order_acq_rel);
    if (bar_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
        // Last to arrive: everyone's flag is in (their RMWs precede ours), and nobody touches
        // the flag or the result again before all of them have read the result.
        bar_result_.store(bar_flag_.exchange(0, std::memory_order_relaxed) != 0,
                          std::memory_order_relaxed);
        bar_count_.store(0, std::memory_order_relaxed);
        signal(phase_);
        return bar_result_.load(std::memory_order_relaxed);
    }
    wait_while(phase_, phase, kSpinTime);
    return bar_result_.load(std::memory_order_relaxed);
}

}  // namespace ferry::cpu
