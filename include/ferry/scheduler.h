// The scheduler: splits a graph across backends and runs the splits.
//
// Each node goes to the backend whose device holds its weights (a source flagged
// kTensorParam, or the view source of one) when that device supports the op; otherwise to the
// first backend in the list whose device supports it; the CPU (last in the list) catches the
// rest. Consecutive nodes on the same backend form a split. Each backend receives its split as
// a complete graph of its own (Graph::nodes, Graph::leafs, Graph::copied_in, Graph::outputs):
// results of other splits appear as leaves, and sources on a device the split's device cannot
// read are copied into its memory first. The caller's graph is never modified. Weights stay
// where they were loaded; only activations move. Cross-device order is kept with events where
// the devices have them (else by waiting for the producer); reading an output waits for the
// backend that wrote it.
#pragma once

#include <memory>
#include <vector>

#include "ferry/allocator.h"
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
    // Waits for work in flight first (its memory may be planned anew).
    Status alloc(Graph& g);
    // Copies split inputs across devices and runs every split in order. Called again with
    // the same Graph object (same nodes), it reuses the plan: inputs keep their storage.
    // It may return before asynchronous devices finish: read outputs with get_tensor (which
    // waits for the backend that wrote them), or call synchronize(); both report the work's
    // errors.
    Status compute(Graph& g);
    // Waits for every backend's work; returns the first error.
    Status synchronize();

    // Writes an input through the stream of the backend that reads it (ordered before the
    // next compute on that stream), or through its buffer when no backend reads it.
    Status set_tensor(Tensor* t, const void* src, size_t size);
    // set_tensor of several inputs (whole tensors, offset 0), those of one backend in one
    // Backend::set_tensors_async.
    Status set_tensors(std::span<const TensorWrite> writes);
    // Reads a tensor after compute: through the backend that wrote it, then waits for that
    // backend. Whole tensor: size must be t->nbytes().
    Status get_tensor(const Tensor* t, void* dst, size_t size);

    // After alloc: which backend runs node i, the number of splits, and each split's graph
    // as its backend receives it.
    Backend* backend_of(const Tensor* node) const;
    int n_splits() const;
    const Graph& split_graph(int i) const;
    Backend* split_backend(int i) const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
