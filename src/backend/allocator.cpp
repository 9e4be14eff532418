// Placing tensors in buffers: the graph allocator (liveness-planned memory for a graph's
// intermediates) and whole-context allocation (weights, caches, test inputs). This is the
// backend layer: it knows buffer types; the core's graph.h does not.
#include "ferry/allocator.h"

#include <algorithm>
#include <unordered_map>

namespace ferry {

namespace {

size_t align_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

}  // namespace

size_t align_tensor_offset(size_t offset, const BufferType* type) {
    return align_up(offset, type->alignment());
}

Status place_tensor(Tensor* t, Buffer* buffer, size_t offset) {
    FERRY_ASSERT(!t->view_src);
    t->buffer = buffer;
    t->offs = offset;
    uint8_t* base = static_cast<uint8_t*>(buffer->base());
    t->data = base ? base + offset : nullptr;
    return buffer->init_tensor(t);
}

namespace {

// First-fit allocator over a virtual address range; tracks the high-water mark.
class OffsetPlanner {
  public:
    explicit OffsetPlanner(size_t align) : align_(align) {}
    size_t alloc(size_t size) {
        size = align_up(std::max<size_t>(size, 1), align_);
        for (size_t i = 0; i < free_.size(); i++) {
            if (free_[i].size >= size) {
                const size_t off = free_[i].off;
                free_[i].off += size;
                free_[i].size -= size;
                if (free_[i].size == 0) free_.erase(free_.begin() + static_cast<long>(i));
                return off;
            }
        }
        const size_t off = top_;
        top_ += size;
        return off;
    }
    void release(size_t off, size_t size) {
        size = align_up(std::max<size_t>(size, 1), align_);
        free_.push_back({off, size});
        std::sort(free_.begin(), free_.end(),
                  [](const Block& a, const Block& b) { return a.off < b.off; });
        std::vector<Block> merged;
        for (const Block& b : free_) {
            if (!merged.empty() && merged.back().off + merged.back().size == b.off) {
                merged.back().size += b.size;
            } else {
                merged.push_back(b);
            }
        }
        // A free block at the top shrinks the high-water region.
        if (!merged.empty() && merged.back().off + merged.back().size == top_) {
            top_ = merged.back().off;
            merged.pop_back();
        }
        free_ = std::move(merged);
        peak_ = std::max(peak_, top_);
    }
    size_t peak() const { return std::max(peak_, top_); }
    void note_peak() { peak_ = std::max(peak_, top_); }

  private:
    struct Block {
        size_t off, size;
    };
    size_t align_;
    size_t top_ = 0;
    size_t peak_ = 0;
    std::vector<Block> free_;
};

}  // namespace

GraphAllocator::GraphAllocator(BufferType* type) : type_(type) {}
GraphAllocator::~GraphAllocator() = default;

Status GraphAllocator::allocate(Graph& g) {
    const size_t align = type_->alignment();
    // Last step at which each storage owner is read or written.
    std::unordered_map<const Tensor*, size_t> last_use;
    std::unordered_map<const Tensor*, int> n_consumers;
    for (size_t i = 0; i < g.nodes.size(); i++) {
        const Tensor* n = g.nodes[i];
        for (int s = 0; s < kMaxSrc; s++) {
            if (n->src[s]) {
                last_use[n->src[s]->storage()] = i;
                n_consumers[n->src[s]]++;
            }
        }
        if (n->view_src) last_use[n->view_src] = std::max(last_use[n->view_src], i);
    }
    OffsetPlanner planner(align);
    std::unordered_map<Tensor*, size_t> offset;
    auto needs_storage = [](const Tensor* t) { return !t->buffer && !t->view_src; };
    for (Tensor* t : g.leafs) {
        if (needs_storage(t)) offset[t] = planner.alloc(type_->alloc_size(t));
    }
    // Nodes free their storage after their last reader ran; outputs and nodes nobody reads
    // (results) stay.
    std::vector<std::vector<Tensor*>> frees(g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); i++) {
        Tensor* n = g.nodes[i];
        if (needs_storage(n)) {
            offset[n] = planner.alloc(type_->alloc_size(n));
            planner.note_peak();
            const bool keep = g.is_output(n) || !last_use.count(n);
            if (!keep) frees[last_use[n]].push_back(n);
        }
        for (Tensor* f : frees[i]) planner.release(offset[f], type_->alloc_size(f));
    }
    planned_ = planner.peak();
    if (planned_ > 0 && (!buffer_ || buffer_->size() < planned_)) {
        // Growing: a quarter more than asked, so that plans which creep up step by step (a
        // decode graph rebuilt as the KV length grows) keep one buffer instead of paying a
        // fresh allocation, its first-touch page faults and, on a remote device, a
        // free / alloc round trip at every rebuild.
        size_t want = planned_;
        if (buffer_) want = std::max(planned_, planned_ + planned_ / 4);
        buffer_.reset();
        Expected<std::unique_ptr<Buffer>> b = type_->allocate(want);
        if (!b && want > planned_) b = type_->allocate(planned_);
        if (!b) return b.status().context("graph allocator");
        buffer_ = std::move(*b);
        buffer_->set_usage(BufferUsage::Compute);
    }
    for (auto& [t, off] : offset) FERRY_TRY(place_tensor(t, buffer_.get(), off));
    for (Tensor* t : g.leafs) {
        if (t->view_src && !t->buffer) init_view(t);
    }
    for (Tensor* t : g.nodes) {
        if (t->view_src && t->view_src->buffer) init_view(t);
    }
    return Status::ok();
}

Expected<std::unique_ptr<Buffer>> allocate_context_tensors(Context& ctx, BufferType* type,
                                                           BufferUsage usage) {
    size_t total = 0;
    for (Tensor& t : ctx) {
        if (!t.buffer && !t.view_src)
            total = align_tensor_offset(total, type) + type->alloc_size(&t);
    }
    if (total == 0) return std::unique_ptr<Buffer>();
    Expected<std::unique_ptr<Buffer>> b = type->allocate_for(total, usage);
    if (!b) return b.status();
    Buffer* buf = b->get();
    size_t off = 0;
    for (Tensor& t : ctx) {
        if (t.buffer || t.view_src) continue;
        off = align_tensor_offset(off, type);
        FERRY_TRY(place_tensor(&t, buf, off));
        off += type->alloc_size(&t);
    }
    for (Tensor& t : ctx) {
        if (t.view_src && t.view_src->buffer) init_view(&t);
    }
    return b;
}

}  // namespace ferry
