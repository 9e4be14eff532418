// A fixed pool of worker threads for the CPU backend. The caller is thread 0; run() dispatches
// one function to all threads and returns when every thread is done. barrier() synchronizes
// all threads inside run().
//
// Every wait (a worker waiting for work, the caller waiting for the workers, a barrier) spins
// briefly, since nodes take microseconds and a core that is free answers fastest that way, and
// then sleeps on a futex: on a machine shared with other work, a thread whose partner was
// preempted gives its core away instead of burning it, and wakes as soon as the partner
// arrives. Wakers issue the wake-up system call only when a thread actually sleeps. When
// threads keep missing (a machine busy with other work), run() lets the caller run alone for a
// while: kernels give the same results for any thread count, and one thread that is running
// beats two that wait for each other's time slices.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>  // ErrorSink (ops.h) relies on it
#include <thread>
#include <vector>

namespace ferry::cpu {

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int n_threads() const { return n_threads_; }
    // Runs fn(ith, nth) on every thread (the caller runs ith 0).
    void run(const std::function<void(int, int)>& fn);
    // All threads of the current run() must call barrier()/barrier_any() the same number of
    // times, in the same order.
    void barrier() { (void)barrier_any(false); }
    // A barrier that also returns, on every thread, whether any thread passed flag = true:
    // all threads see the same answer, so they can leave a loop together.
    bool barrier_any(bool flag);

    // A futex word with a count of its sleepers (one cache line each, no false sharing).
    struct alignas(64) Signal {
        std::atomic<uint32_t> word{0};
        std::atomic<int> sleepers{0};
        std::atomic<int> slept{0};  // sleeps so far (statistics)
    };

  private:
    void worker(int ith);
    int n_threads_;
    std::vector<std::thread> threads_;
    const std::function<void(int, int)>* fn_ = nullptr;
    bool stop_ = false;  // written before a dispatch, read after it
    int active_ = 1;     // threads taking part in the current run (set before it starts)
    int solo_left_ = 0;  // run() calls still to make on the caller alone
    int solo_backoff_ = 0;
    Signal dispatch_;  // word: run generation
    Signal done_;      // word: workers finished with the current run
    Signal phase_;     // word: barrier phase
    alignas(64) std::atomic<int> bar_count_{0};
    std::atomic<int> bar_flag_{0};
    std::atomic<bool> bar_result_{false};
};

}  // namespace ferry::cpu
