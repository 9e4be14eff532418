#include "ferry/scheduler.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace ferry {

namespace {

bool is_view_node(const Tensor* t) {
    return (op_info(t->op).flags & kOpView) != 0;
}
bool is_in_place(const Tensor* t) {
    return (op_info(t->op).flags & kOpInPlace) != 0;
}
const Tensor* in_place_dst(const Tensor* t) {
    return t->src[t->op == Op::CPY ? 1 : 0];
}

struct Split {
    int backend = 0;
    std::vector<Tensor*> nodes;
};

// A source of a split that must be copied from another device before the split runs.
struct CopyIn {
    int split = 0;
    Tensor* from = nullptr;  // storage owner on the other device
    Tensor* to = nullptr;    // copy in the split's device
};

}  // namespace

struct Scheduler::Impl {
    std::vector<Backend*> backends;
    std::vector<std::unique_ptr<GraphAllocator>> allocators;
    std::unordered_map<const Tensor*, int> assignment;
    std::vector<Split> splits;
    std::vector<CopyIn> copies;
    // Copies and their views live in this context; its buffers are reused across graphs.
    std::unique_ptr<Context> copy_ctx;
    std::vector<std::unique_ptr<Buffer>> copy_buffers;
    // Sources replaced by their copies while the graph runs: (node, slot, original, copy).
    struct Patch {
        Tensor* node;
        int slot;
        Tensor* original;
        Tensor* copy;
    };
    std::vector<Patch> patches;
    bool patched = false;
    // The graph the current plan belongs to: compute() reuses the plan while the caller passes
    // the same, unchanged graph (decode steps), and plans again otherwise.
    const Graph* allocated = nullptr;
    size_t allocated_nodes = 0;
    const Tensor* allocated_last = nullptr;

    int backend_index_for_buffer(const Buffer* b) const {
        if (!b) return -1;
        for (size_t i = 0; i < backends.size(); i++) {
            if (backends[i]->device()->supports_buffer_type(b->type())) return static_cast<int>(i);
        }
        return -1;
    }
    bool supports(int bi, const Tensor* node) const {
        return backends[static_cast<size_t>(bi)]->device()->supports_op(node);
    }
    Status assign(Graph& g);
    Status allocate(Graph& g);
    void apply();
    void restore();
};

Scheduler::Scheduler(std::vector<Backend*> backends) : impl_(std::make_unique<Impl>()) {
    FERRY_ASSERT(!backends.empty());
    impl_->backends = std::move(backends);
    for (Backend* b : impl_->backends) {
        impl_->allocators.push_back(std::make_unique<GraphAllocator>(b->device()->buffer_type()));
    }
}

Scheduler::~Scheduler() {
    impl_->restore();
}

void Scheduler::Impl::apply() {
    for (const Patch& p : patches) p.node->src[p.slot] = p.copy;
    patched = true;
}

void Scheduler::Impl::restore() {
    if (!patched) return;
    for (auto it = patches.rbegin(); it != patches.rend(); ++it)
        it->node->src[it->slot] = it->original;
    patched = false;
}

Status Scheduler::Impl::assign(Graph& g) {
    assignment.clear();
    const int n_backends = static_cast<int>(backends.size());
    for (Tensor* n : g.nodes) {
        int chosen = -1;
        if (is_view_node(n)) {
            // Views run nowhere; they follow whoever produced their storage.
            auto it = assignment.find(n->view_src);
            chosen =
                it != assignment.end() ? it->second : backend_index_for_buffer(n->view_src->buffer);
            if (chosen < 0) chosen = n_backends - 1;
            assignment[n] = chosen;
            continue;
        }
        if (is_in_place(n)) {
            // Writes land where the destination lives.
            const Tensor* dst = in_place_dst(n)->storage();
            auto it = assignment.find(dst);
            chosen = it != assignment.end() ? it->second : backend_index_for_buffer(dst->buffer);
            if (chosen >= 0 && !supports(chosen, n)) {
                return Status::errorf("scheduler: %s %s writes into %s on %s, which cannot run it",
                                      op_name(n->op), describe(n).c_str(), describe(dst).c_str(),
                                      backends[static_cast<size_t>(chosen)]->name());
            }
        }
        if (chosen < 0) {
            // The device holding the node's weights.
            for (int s = 0; s < kMaxSrc && chosen < 0; s++) {
                const Tensor* src = n->src[s];
                if (!src || !(src->storage()->flags & kTensorParam)) continue;
                const int bi = backend_index_for_buffer(src->storage()->buffer);
                if (bi >= 0 && supports(bi, n)) chosen = bi;
            }
        }
        if (chosen < 0) {
            // Stay with the producer of the first computed source, when it can run the node.
            for (int s = 0; s < kMaxSrc && chosen < 0; s++) {
                if (!n->src[s]) continue;
                auto it = assignment.find(n->src[s]->storage());
                if (it != assignment.end() && supports(it->second, n)) chosen = it->second;
            }
        }
        for (int bi = 0; bi < n_backends && chosen < 0; bi++) {
            if (supports(bi, n)) chosen = bi;
        }
        if (chosen < 0) {
            return Status::errorf("scheduler: no backend supports %s %s", op_name(n->op),
                                  describe(n).c_str());
        }
        assignment[n] = chosen;
    }
    // Leaves without storage (inputs) go to the backend of their first reader.
    for (Tensor* n : g.nodes) {
        for (int s = 0; s < kMaxSrc; s++) {
            Tensor* src = n->src[s] ? n->src[s]->storage() : nullptr;
            if (src && src->op == Op::NONE && !src->buffer && !assignment.count(src)) {
                assignment[src] = assignment[n];
            }
        }
    }
    splits.clear();
    for (Tensor* n : g.nodes) {
        const int bi = assignment[n];
        if (splits.empty() || splits.back().backend != bi) splits.push_back({bi, {}});
        splits.back().nodes.push_back(n);
    }
    return Status::ok();
}

Status Scheduler::Impl::allocate(Graph& g) {
    restore();
    patches.clear();
    copies.clear();
    FERRY_TRY(assign(g));
    const size_t nb = backends.size();
    // Tensors read by a split of another backend must survive their own backend's graph.
    std::vector<Tensor*> kept;
    for (const Split& sp : splits) {
        for (Tensor* n : sp.nodes) {
            for (int s = 0; s < kMaxSrc; s++) {
                if (!n->src[s]) continue;
                Tensor* owner = n->src[s]->storage();
                auto it = assignment.find(owner);
                if (it != assignment.end() && it->second != sp.backend &&
                    !(owner->flags & kTensorOutput)) {
                    owner->flags |= kTensorOutput;
                    kept.push_back(owner);
                }
            }
        }
    }
    // One allocation per backend over the nodes and input leaves assigned to it.
    Status st;
    for (size_t bi = 0; bi < nb && st; bi++) {
        Graph sub;
        for (Tensor* l : g.leafs) {
            auto it = assignment.find(l);
            if (!l->buffer && it != assignment.end() && it->second == static_cast<int>(bi)) {
                sub.leafs.push_back(l);
            }
        }
        for (Tensor* n : g.nodes) {
            if (assignment[n] == static_cast<int>(bi)) sub.nodes.push_back(n);
        }
        if (!sub.nodes.empty() || !sub.leafs.empty()) st = allocators[bi]->allocate(sub);
    }
    for (Tensor* t : kept) t->flags &= ~kTensorOutput;
    FERRY_TRY(st);
    for (Tensor* l : g.leafs) {
        if (!l->buffer && l->view_src && l->view_src->buffer) init_view(l);
        if (!l->buffer)
            return Status::errorf("scheduler: leaf %s has no storage", describe(l).c_str());
    }
    if (splits.size() <= 1 && nb == 1) return Status::ok();

    // Sources a split's device cannot read get a copy in that device's memory.
    copy_ctx = std::make_unique<Context>();
    std::vector<std::unordered_map<const Tensor*, Tensor*>> copy_of(nb);
    std::vector<std::vector<Tensor*>> owners_per_backend(nb);
    for (size_t si = 0; si < splits.size(); si++) {
        const int bi = splits[si].backend;
        Device* dev = backends[static_cast<size_t>(bi)]->device();
        for (Tensor* n : splits[si].nodes) {
            if (is_view_node(n)) continue;
            for (int s = 0; s < kMaxSrc; s++) {
                Tensor* src = n->src[s];
                if (!src) continue;
                Tensor* owner = src->storage();
                if (dev->supports_buffer_type(owner->buffer->type())) continue;
                if (is_in_place(n) && src == in_place_dst(n)) {
                    return Status::errorf("scheduler: %s cannot write into %s from %s",
                                          op_name(n->op), describe(owner).c_str(),
                                          backends[static_cast<size_t>(bi)]->name());
                }
                Tensor*& copy = copy_of[static_cast<size_t>(bi)][owner];
                if (!copy) {
                    copy = copy_ctx->dup_tensor(owner);
                    copy->set_name(std::string(owner->name) + "#copy");
                    owners_per_backend[static_cast<size_t>(bi)].push_back(copy);
                    copies.push_back({static_cast<int>(si), owner, copy});
                } else {
                    // Re-copy when the owner changed since (computed again in between).
                    copies.push_back({static_cast<int>(si), owner, copy});
                }
                Tensor* replacement = copy;
                if (src->view_src) {
                    Tensor* v = copy_ctx->dup_tensor(src);  // metadata only; becomes a view
                    for (int d = 0; d < kMaxDims; d++) v->nb[d] = src->nb[d];
                    v->view_src = copy;
                    v->view_offs = src->view_offs;
                    owners_per_backend[static_cast<size_t>(bi)].push_back(v);
                    replacement = v;
                }
                patches.push_back({n, s, src, replacement});
            }
        }
    }
    // Allocate the copies per backend.
    copy_buffers.clear();
    for (size_t bi = 0; bi < nb; bi++) {
        if (owners_per_backend[bi].empty()) continue;
        BufferType* bt = backends[bi]->device()->buffer_type();
        size_t total = 0;
        const size_t align = bt->alignment();
        for (Tensor* t : owners_per_backend[bi]) {
            if (!t->view_src) total = (total + align - 1) / align * align + bt->alloc_size(t);
        }
        Expected<std::unique_ptr<Buffer>> buf = bt->allocate(total);
        if (!buf) return buf.status().context("scheduler: copies");
        size_t off = 0;
        uint8_t* base = static_cast<uint8_t*>((*buf)->base());
        for (Tensor* t : owners_per_backend[bi]) {
            if (t->view_src) continue;
            off = (off + align - 1) / align * align;
            t->buffer = buf->get();
            t->offs = off;
            t->data = base ? base + off : nullptr;
            FERRY_TRY((*buf)->init_tensor(t));
            off += bt->alloc_size(t);
        }
        for (Tensor* t : owners_per_backend[bi]) {
            if (t->view_src) init_view(t);
        }
        copy_buffers.push_back(std::move(*buf));
    }
    return Status::ok();
}

Status Scheduler::alloc(Graph& g) {
    impl_->allocated = nullptr;
    FERRY_TRY(impl_->allocate(g));
    impl_->allocated = &g;
    impl_->allocated_nodes = g.nodes.size();
    impl_->allocated_last = g.nodes.empty() ? nullptr : g.nodes.back();
    return Status::ok();
}

namespace {

Status copy_across(Backend* to_backend, const Tensor* from, Tensor* to) {
    if (to_backend->copy_tensor_async(from, to)) return Status::ok();
    if (to->buffer && to->buffer->copy_tensor(from, to)) return Status::ok();
    std::vector<uint8_t> staging(from->nbytes());
    FERRY_TRY(from->buffer->get_tensor(from, staging.data(), 0, staging.size()));
    return to->buffer->set_tensor(to, staging.data(), 0, staging.size());
}

}  // namespace

Status Scheduler::compute(Graph& g) {
    Impl& m = *impl_;
    if (m.allocated != &g || m.allocated_nodes != g.nodes.size() ||
        m.allocated_last != (g.nodes.empty() ? nullptr : g.nodes.back())) {
        FERRY_TRY(alloc(g));
    }
    m.apply();
    Status result;
    if (m.splits.size() == 1 && m.copies.empty()) {
        // One backend, nothing to hand over: no wait here. Reading an output (tensor_get)
        // waits for the work and reports its errors, so for a remote device the inputs, the
        // compute and the read of the logits are one round trip.
        result = m.backends[static_cast<size_t>(m.splits[0].backend)]->compute(g);
        m.restore();
        return result;
    }
    size_t ci = 0;
    for (size_t si = 0; si < m.splits.size() && result; si++) {
        Split& sp = m.splits[si];
        Backend* be = m.backends[static_cast<size_t>(sp.backend)];
        // Wait for producers on other devices, then bring inputs over.
        bool waited = false;
        for (; ci < m.copies.size() && m.copies[ci].split == static_cast<int>(si); ci++) {
            if (!waited) {
                for (Backend* other : m.backends) {
                    if (other != be && result) result = other->synchronize();
                }
                waited = true;
            }
            if (result) result = copy_across(be, m.copies[ci].from, m.copies[ci].to);
            if (!result) break;
        }
        if (!result) break;
        Graph sub;
        sub.nodes = sp.nodes;
        result = be->compute(sub);
    }
    Status st = synchronize();
    if (result && !st) result = st;
    m.restore();
    return result;
}

Status Scheduler::synchronize() {
    Status result;
    for (Backend* b : impl_->backends) {
        Status st = b->synchronize();
        if (result && !st) result = st;
    }
    return result;
}

Backend* Scheduler::backend_of(const Tensor* node) const {
    auto it = impl_->assignment.find(node);
    if (it == impl_->assignment.end()) return nullptr;
    return impl_->backends[static_cast<size_t>(it->second)];
}

int Scheduler::n_splits() const {
    return static_cast<int>(impl_->splits.size());
}

}  // namespace ferry
