// CPU kernels: one function per op (one file per op or op family in this folder), called by
// every thread of the pool with its index; kernels split their work by rows over ith/nth.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>

#include "backends/cpu/thread-pool.h"
#include "ferry/tensor.h"

namespace ferry::cpu {

// Collects the first error a kernel reports (data-dependent failures such as an out-of-range
// GET_ROWS index). Thread-safe.
class ErrorSink {
  public:
    void fail(std::string msg);
    bool failed() const { return failed_.load(std::memory_order_acquire); }
    std::string message();

  private:
    std::atomic<bool> failed_{false};
    std::mutex mu_;
    std::string msg_;
};

struct ComputeParams {
    int ith = 0;
    int nth = 1;
    void* wdata = nullptr;  // scratch shared by all threads, work_size() bytes
    size_t wsize = 0;
    ThreadPool* pool = nullptr;  // for barrier() between phases of one kernel
    ErrorSink* errors = nullptr;
    // Cancellation: `stop` is shared by the threads of one compute; thread 0 also polls the
    // host's callback (ComputeLimits::should_abort). Long kernels check aborted() between
    // pieces of work (never between barriers they would then skip) and return early.
    std::atomic<bool>* stop = nullptr;
    // The callback is asked on every kPollEvery-th check only: it reads a clock, which cost a
    // tenth of a served tiny-llama decode step when asked between every two nodes.
    static constexpr uint32_t kPollEvery = 64;
    const std::function<bool()>* poll = nullptr;
    mutable uint32_t checks = 0;
    // A counter shared by the node's threads, 0 when the node starts (nullptr outside a
    // backend's compute): a kernel may claim work from it without a barrier of its own. Each
    // node may use it for one sequence of claims.
    std::atomic<int64_t>* claims = nullptr;
    void barrier() const {
        if (pool) pool->barrier();
    }
    bool aborted() const {
        if (!stop) return false;
        if (ith == 0 && poll && *poll && ++checks % kPollEvery == 0 &&
            !stop->load(std::memory_order_relaxed) && (*poll)()) {
            stop->store(true, std::memory_order_relaxed);
        }
        return stop->load(std::memory_order_relaxed);
    }
};

// Rows [first, last) of n for thread ith of nth.
inline void split_rows(int64_t n, int ith, int nth, int64_t* first, int64_t* last) {
    const int64_t per = (n + nth - 1) / nth;
    *first = per * ith < n ? per * ith : n;
    *last = *first + per < n ? *first + per : n;
}

// Kernels (see ops.def for semantics). View ops need no kernel.
#define FERRY_CPU_KERNELS(X) \
    X(cpy)                   \
    X(cont)                  \
    X(get_rows)              \
    X(set_rows)              \
    X(add)                   \
    X(mul)                   \
    X(scale)                 \
    X(rms_norm)              \
    X(norm)                  \
    X(mul_mat)               \
    X(soft_max)              \
    X(rope)                  \
    X(flash_attn_ext)        \
    X(silu)                  \
    X(gelu)                  \
    X(swiglu)                \
    X(geglu)                 \
    X(argmax)                \
    X(sum_rows)              \
    X(top_k)

#define X(name) void op_##name(const ComputeParams& p, Tensor* dst);
FERRY_CPU_KERNELS(X)
#undef X

// Scratch bytes a node needs (shared by all threads); 0 for most ops.
size_t work_size(const Tensor* node, int n_threads);
// Scratch bytes a MUL_MAT node needs (defined with the MUL_MAT kernel; used by work_size).
size_t mul_mat_work_size(const Tensor* node, int n_threads);

}  // namespace ferry::cpu
