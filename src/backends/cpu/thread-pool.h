// A fixed pool of worker threads for the CPU backend. The caller is thread 0; run() dispatches
// one function to all threads and returns when every thread is done. barrier() synchronizes
// all threads inside run(); it spins briefly (nodes take microseconds) before yielding.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
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
    // All threads of the current run() must call it the same number of times.
    void barrier();

  private:
    void worker(int ith);
    int n_threads_;
    std::vector<std::thread> threads_;
    const std::function<void(int, int)>* fn_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> done_{0};
    std::atomic<bool> stop_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<int> sleeping_{0};
    // barrier state
    std::atomic<int> bar_count_{0};
    std::atomic<uint64_t> bar_phase_{0};
};

}  // namespace ferry::cpu
