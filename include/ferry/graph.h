// Compute graphs, structural graph keys and the graph allocator.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry {

class Buffer;
class BufferType;
enum class BufferUsage : int;  // ferry/backend.h

// Nodes in topological order (every source of a node is a leaf or an earlier node) and leaves
// (tensors with op NONE that nodes read: weights, inputs). View nodes (RESHAPE, VIEW, PERMUTE,
// TRANSPOSE) appear as nodes; backends skip them.
struct Graph {
    std::vector<Tensor*> nodes;
    std::vector<Tensor*> leafs;

    // Adds `t` and everything it depends on (sources and view sources) in dependency order.
    void build_forward(Tensor* t);
    void clear() {
        nodes.clear();
        leafs.clear();
        visited_.clear();
    }

  private:
    void visit(Tensor* t);
    std::unordered_set<const Tensor*> visited_;
};

// Structural key: ops, types, shapes, strides, view offsets, op params, source wiring and
// flags of every node and leaf; never data, buffers or names. Two graphs with the same key can
// reuse whatever a backend compiled or deserialized for the other.
uint64_t graph_key(const Graph& g);

// Sets buffer/offs/data of a view from its view_src (which must have storage).
void init_view(Tensor* t);

// Plans memory for every tensor of a graph that has no storage yet (non-view nodes and leaves
// without a buffer), reusing memory of intermediates whose last reader has run. Tensors
// flagged kTensorOutput and leaves keep their memory for the whole graph. Views get their
// storage from view_src. The buffer is kept across calls and grown when a graph needs more.
class GraphAllocator {
  public:
    explicit GraphAllocator(BufferType* type);
    ~GraphAllocator();
    GraphAllocator(const GraphAllocator&) = delete;
    GraphAllocator& operator=(const GraphAllocator&) = delete;

    Status allocate(Graph& g);
    // Bytes the last plan needed (peak of live intermediates + leaves + outputs).
    size_t planned_size() const { return planned_; }
    Buffer* buffer() const { return buffer_.get(); }

  private:
    BufferType* type_;
    std::unique_ptr<Buffer> buffer_;
    size_t planned_ = 0;
};

// Allocates one buffer holding every tensor of `ctx` that has no storage and is not a view
// (e.g. weights or test inputs), and initializes all views. Returns the buffer (nullptr when
// there was nothing to allocate).
// usage: BufferUsage{} is Any.
Expected<std::unique_ptr<Buffer>> allocate_context_tensors(Context& ctx, BufferType* type,
                                                           BufferUsage usage = BufferUsage{});

}  // namespace ferry
