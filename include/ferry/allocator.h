// Placing tensors in buffers: the one rule for where a tensor may start in a buffer, the one
// way to put it there, the graph allocator and whole-context allocation.
#pragma once

#include <cstddef>
#include <memory>

#include "ferry/backend.h"
#include "ferry/graph.h"

namespace ferry {

// `offset` rounded up to where a tensor may start in buffers of `type` (its alignment).
size_t align_tensor_offset(size_t offset, const BufferType* type);
// Places t (not a view) at byte `offset` of `buffer`: sets buffer, offs and data (the host
// address when the buffer has one), then lets the buffer initialize it (Buffer::init_tensor).
Status place_tensor(Tensor* t, Buffer* buffer, size_t offset);

// Plans memory for every tensor of a graph that has no storage yet (non-view nodes and leaves
// without a buffer), reusing memory of intermediates whose last reader has run. Outputs
// (Graph::is_output) and leaves keep their memory for the whole graph. Views get their
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
