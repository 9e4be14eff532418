#include "backends/cpu/thread-pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FERRY_PAUSE() _mm_pause()
#else
#define FERRY_PAUSE() ((void)0)
#endif

namespace ferry::cpu {

namespace {
constexpr int kSpinsBeforeYield = 1 << 14;
constexpr int kSpinsBeforeSleep = 1 << 17;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_threads_; i++) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    {
        std::lock_guard<std::mutex> lock(mu_);
        generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    fn_ = &fn;
    done_.store(0, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lock(mu_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    if (sleeping_.load() > 0) cv_.notify_all();
    fn(0, n_threads_);
    int spins = 0;
    while (done_.load(std::memory_order_acquire) != n_threads_ - 1) {
        if (++spins < kSpinsBeforeYield) {
            FERRY_PAUSE();
        } else {
            std::this_thread::yield();
        }
    }
    fn_ = nullptr;
}

void ThreadPool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        uint64_t g;
        while ((g = generation_.load(std::memory_order_acquire)) == seen) {
            if (++spins < kSpinsBeforeYield) {
                FERRY_PAUSE();
            } else if (spins < kSpinsBeforeSleep) {
                std::this_thread::yield();
            } else {
                std::unique_lock<std::mutex> lock(mu_);
                sleeping_.fetch_add(1);
                cv_.wait(lock, [&] { return generation_.load() != seen; });
                sleeping_.fetch_sub(1);
            }
        }
        seen = g;
        if (stop_.load()) return;
        (*fn_)(ith, n_threads_);
        done_.fetch_add(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::barrier() {
    if (n_threads_ == 1) return;
    const uint64_t phase = bar_phase_.load(std::memory_order_acquire);
    if (bar_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
        bar_count_.store(0, std::memory_order_relaxed);
        bar_phase_.fetch_add(1, std::memory_order_acq_rel);
        return;
    }
    int spins = 0;
    while (bar_phase_.load(std::memory_order_acquire) == phase) {
        if (++spins < kSpinsBeforeYield) {
            FERRY_PAUSE();
        } else {
            std::this_thread::yield();
        }
    }
}

}  // namespace ferry::cpu
