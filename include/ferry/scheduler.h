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
    // get_tensor, and before it waits, `then` queued ahead on its backend
    // (Backend::compute_ahead) to run again once run_ahead gives it its inputs: a decode
    // step launched while the device computes the one before. `then` must be the graph
    // computed last, run whole by the backend that writes t. *queued: whether it was (a
    // graph of several splits, or a backend that does not offer it: not). The queued run may
    // store its t into dst as it computes it (Backend::compute_ahead): dst stays allocated
    // and unwritten until it has run, or synchronize() settled it.
    Status get_tensor_then(const Tensor* t, void* dst, size_t size, Graph& then, bool* queued);
    // Starts the graph queued by get_tensor_then with these inputs (set_tensors and compute
    // in one). false: it could not (nothing queued, or the inputs are not all that graph's),
    // the inputs were set as by set_tensors, and the caller calls compute() as usual. Any
    // other call releases a queued graph with the inputs it last had; synchronize() and
    // alloc() wait for it then.
    Expected<bool> run_ahead(std::span<const TensorWrite> inputs);

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
