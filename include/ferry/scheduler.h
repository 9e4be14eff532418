// The scheduler: splits a graph across backends and runs the splits.
//
// Each node goes to the backend whose device holds its weights (a source flagged
// kTensorParam, or the view source of one) when that device supports the op; otherwise to the
// first backend in the list whose device supports it; the CPU (last in the list) catches the
// rest. Consecutive nodes on the same backend form a split; a split's inputs that live on
// another device are copied into that split's device before it runs. Weights stay where they
// were loaded; only activations move.
#pragma once

#include <memory>
#include <vector>

#include "ferry/backend.h"
#include "ferry/graph.h"

namespace ferry {

class Scheduler {
  public:
    // backends: in order of preference; the last must be a CPU backend.
    explicit Scheduler(std::vector<Backend*> backends);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Assigns nodes to backends and allocates every tensor without storage (intermediates by
    // liveness, input leaves in the buffer of the backend that first reads them). Call it
    // before setting input tensors; compute() calls it when the graph was not allocated yet.
    Status alloc(Graph& g);
    // Copies split inputs across devices and runs every split in order. Output tensors
    // (kTensorOutput) can be read with tensor_get afterwards. Called again with the same
    // Graph object (same nodes), it reuses the plan: inputs keep their storage.
    // With a single backend it may return before an asynchronous device (remote) finishes:
    // reading an output or synchronize() waits, and reports the work's errors.
    Status compute(Graph& g);
    // Waits for every backend's work; returns the first error.
    Status synchronize();

    // After compute: which backend ran node i, and how many splits the last graph had.
    Backend* backend_of(const Tensor* node) const;
    int n_splits() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
