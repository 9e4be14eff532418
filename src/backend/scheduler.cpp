#include "ferry/scheduler.h"

#include <algorithm>
#include <cstring>
#include <functional>
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
// The source an in-place or view node aliases.
int aliased_src(const Tensor* t) {
    return t->op == Op::CPY ? 1 : 0;
}
// Byte offset of t within its storage owner.
size_t storage_offset(const Tensor* t) {
    return t->view_src ? t->view_offs : 0;
}

struct Split {
    int backend = 0;
    std::vector<Tensor*> nodes;  // the caller's nodes
    Graph graph;                 // what the backend runs (see Scheduler::Impl::build_splits)
};

// A source of a split that must be copied from another device before the split runs.
struct CopyIn {
    int split = 0;
    int producer = -1;             // backend index that wrote `from` (or holds it)
    Tensor* from = nullptr;        // storage owner on the other device
    Tensor* to = nullptr;          // copy in the split's device (a leaf of the split's graph)
    std::vector<uint8_t> staging;  // host bytes when the devices cannot copy directly
};

}  // namespace

struct Scheduler::Impl {
    std::vector<Backend*> backends;
    std::vector<std::unique_ptr<GraphAllocator>> allocators;
    std::unordered_map<const Tensor*, int> assignment;
    std::vector<Split> splits;
    std::vector<CopyIn> copies;
    // Split graphs' tensors (copies of the caller's nodes wired to each other, leaves standing
    // for other splits' results, copies of sources from other devices) live here.
    std::unique_ptr<Context> split_ctx;
    std::vector<std::unique_ptr<Buffer>> copy_buffers;
    // One event per backend, recorded after a split whose results another device copies
    // (nullptr where the device has no events: its consumer waits for the whole backend).
    std::vector<std::unique_ptr<Event>> events;
    std::vector<bool> events_tried;
    // The graph the current plan belongs to: compute() reuses the plan while the caller passes
    // the same, unchanged graph (decode steps), and plans again otherwise.
    const Graph* allocated = nullptr;
    size_t allocated_nodes = 0;
    const Tensor* allocated_last = nullptr;
    bool single = true;  // one split, nothing copied: the backend runs the caller's graph
    // The current plan is g's (the same Graph object, unchanged in its nodes).
    bool planned_for(const Graph& g) const {
        return allocated == &g && allocated_nodes == g.nodes.size() &&
               allocated_last == (g.nodes.empty() ? nullptr : g.nodes.back());
    }
    // The backend holding a graph queued ahead (get_tensor_then), until run_ahead starts it or
    // another call releases it.
    Backend* ahead = nullptr;

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
    // An input leaf that has no storage yet (it goes where its first reader runs).
    bool unplaced_input(const Tensor* t) const {
        const Tensor* s = t->storage();
        return s->op == Op::NONE && !s->buffer && !assignment.count(s);
    }
    // The backend that last wrote t's storage, else the one whose device holds it.
    int writer_of(const Tensor* t) const {
        auto it = assignment.find(t);
        if (it != assignment.end()) return it->second;
        it = assignment.find(t->storage());
        if (it != assignment.end()) return it->second;
        return backend_index_for_buffer(t->storage()->buffer);
    }
    Event* event_of(size_t bi) {
        if (!events_tried[bi]) {
            events_tried[bi] = true;
            Expected<std::unique_ptr<Event>> e = backends[bi]->device()->make_event();
            if (e) events[bi] = std::move(*e);
        }
        return events[bi].get();
    }
    Status assign(Graph& g);
    Status allocate(Graph& g);
    Status build_splits();
    Status copy_in(CopyIn& c, Backend* be);
};

Scheduler::Scheduler(std::vector<Backend*> backends) : impl_(std::make_unique<Impl>()) {
    FERRY_ASSERT(!backends.empty());
    impl_->backends = std::move(backends);
    for (Backend* b : impl_->backends) {
        impl_->allocators.push_back(std::make_unique<GraphAllocator>(b->device()->buffer_type()));
    }
    impl_->events.resize(impl_->backends.size());
    impl_->events_tried.assign(impl_->backends.size(), false);
}

Scheduler::~Scheduler() {
    // Work in flight may still read the split graphs and copy buffers freed below.
    (void)synchronize();
}

Status Scheduler::Impl::assign(Graph& g) {
    assignment.clear();
    std::vector<Tensor*> deferred;  // views of inputs without storage yet
    const int n_backends = static_cast<int>(backends.size());
    for (Tensor* n : g.nodes) {
        int chosen = -1;
        if (is_view_node(n)) {
            // Views run nowhere; they follow whoever produced their storage. A view of an input
            // not placed yet follows its first reader instead (below): placing it on the last
            // backend would cut the reader's run in two for nothing.
            auto it = assignment.find(n->view_src);
            chosen =
                it != assignment.end() ? it->second : backend_index_for_buffer(n->view_src->buffer);
            if (chosen < 0 && unplaced_input(n->view_src)) {
                deferred.push_back(n);
                continue;
            }
            if (chosen < 0) chosen = n_backends - 1;
            assignment[n] = chosen;
            continue;
        }
        if (is_in_place(n)) {
            // Writes land where the destination lives.
            const Tensor* dst = n->src[aliased_src(n)]->storage();
            auto it = assignment.find(dst);
            chosen = it != assignment.end() ? it->second : backend_index_for_buffer(dst->buffer);
            if (chosen >= 0 && !supports(chosen, n)) {
                return Status::errorf(ErrorCode::Unsupported,
                                      "scheduler: %s %s writes into %s on %s, which cannot run it",
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
            return Status::errorf(ErrorCode::Unsupported, "scheduler: no backend supports %s %s",
                                  op_name(n->op), describe(n).c_str());
        }
        assignment[n] = chosen;
    }
    // Views of unplaced inputs: with their first reader (a view's reader may itself be such a
    // view, later in the order, so the nodes are walked backwards and earlier readers win).
    if (!deferred.empty()) {
        std::unordered_set<const Tensor*> pending(deferred.begin(), deferred.end());
        std::unordered_map<const Tensor*, int> first_reader;
        for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) {
            const Tensor* n = *it;
            int bi = -1;
            if (auto a = assignment.find(n); a != assignment.end()) {
                bi = a->second;
            } else if (auto f = first_reader.find(n); f != first_reader.end()) {
                bi = f->second;
            }
            if (bi < 0) continue;
            for (int s = 0; s <= kMaxSrc; s++) {
                const Tensor* src = s < kMaxSrc ? n->src[s] : n->view_src;
                if (src && pending.count(src)) first_reader[src] = bi;
            }
        }
        for (Tensor* n : deferred) {
            auto f = first_reader.find(n);
            assignment[n] = f != first_reader.end() ? f->second : n_backends - 1;
        }
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
        if (splits.empty() || splits.back().backend != bi) splits.push_back({bi, {}, {}});
        splits.back().nodes.push_back(n);
    }
    return Status::ok();
}

Status Scheduler::Impl::allocate(Graph& g) {
    copies.clear();
    copy_buffers.clear();
    split_ctx.reset();
    FERRY_TRY(assign(g));
    const size_t nb = backends.size();
    // Tensors read by a split of another backend must survive their own backend's graph: the
    // per-backend plans see them as outputs (in graphs of the scheduler's own).
    std::unordered_set<const Tensor*> read_elsewhere;
    for (const Split& sp : splits) {
        for (Tensor* n : sp.nodes) {
            for (int s = 0; s < kMaxSrc; s++) {
                if (!n->src[s]) continue;
                const Tensor* owner = n->src[s]->storage();
                auto it = assignment.find(owner);
                if (it != assignment.end() && it->second != sp.backend)
                    read_elsewhere.insert(owner);
            }
        }
    }
    // One allocation per backend over the nodes and input leaves assigned to it.
    for (size_t bi = 0; bi < nb; bi++) {
        Graph sub;
        for (Tensor* l : g.leafs) {
            auto it = assignment.find(l);
            if (!l->buffer && it != assignment.end() && it->second == static_cast<int>(bi)) {
                sub.leafs.push_back(l);
            }
        }
        for (Tensor* n : g.nodes) {
            if (assignment[n] != static_cast<int>(bi)) continue;
            sub.nodes.push_back(n);
            if (read_elsewhere.count(n)) sub.outputs.push_back(n);
        }
        if (!sub.nodes.empty() || !sub.leafs.empty()) FERRY_TRY(allocators[bi]->allocate(sub));
    }
    for (Tensor* l : g.leafs) {
        if (!l->buffer && l->view_src && l->view_src->buffer) init_view(l);
        if (!l->buffer)
            return Status::errorf("scheduler: leaf %s has no storage", describe(l).c_str());
    }
    single = splits.size() <= 1;
    if (single && !splits.empty()) {
        // One backend runs everything; it still needs every source in memory it can read.
        Device* dev = backends[static_cast<size_t>(splits[0].backend)]->device();
        for (Tensor* n : splits[0].nodes) {
            for (int s = 0; s < kMaxSrc && single; s++) {
                const Tensor* src = n->src[s];
                if (src && !dev->supports_buffer_type(src->storage()->buffer->type()))
                    single = false;
            }
        }
    }
    if (single) return Status::ok();
    return build_splits();
}

// Gives each split a complete graph of its own. Its nodes are copies of the caller's nodes
// that share their storage (so results land where the caller reads them) but whose sources
// point into the split: a result of another split becomes a leaf standing for it (same
// storage), and a source in memory this device cannot read becomes a leaf in this device's
// memory that compute() fills from the other device first.
Status Scheduler::Impl::build_splits() {
    split_ctx = std::make_unique<Context>();
    Context& ctx = *split_ctx;
    const size_t nb = backends.size();
    // Nodes read after their split: by a later split (the caller's reads are kTensorOutput).
    std::unordered_map<const Tensor*, size_t> split_of;
    for (size_t si = 0; si < splits.size(); si++) {
        for (const Tensor* n : splits[si].nodes) split_of[n] = si;
    }
    std::unordered_set<const Tensor*> read_later;
    for (size_t si = 0; si < splits.size(); si++) {
        for (const Tensor* n : splits[si].nodes) {
            for (int s = 0; s <= kMaxSrc; s++) {
                const Tensor* src = s < kMaxSrc ? n->src[s] : n->view_src;
                if (!src) continue;
                for (const Tensor* t : {src, src->storage()}) {
                    auto it = split_of.find(t);
                    if (it != split_of.end() && it->second != si) read_later.insert(t);
                }
            }
        }
    }
    std::vector<std::unordered_map<const Tensor*, Tensor*>> copy_of(nb);
    std::vector<std::vector<Tensor*>> copies_per_backend(nb);
    struct Deferred {
        Tensor* leaf;
        Tensor* copy;
        size_t offs;
    };
    std::vector<Deferred> deferred;  // leaves inside copies, placed once copies have memory
    std::vector<Tensor*> view_clones;

    for (size_t si = 0; si < splits.size(); si++) {
        Split& sp = splits[si];
        const size_t bi = static_cast<size_t>(sp.backend);
        Device* dev = backends[bi]->device();
        Graph& sg = sp.graph;
        sg.clear();
        std::unordered_map<const Tensor*, Tensor*> local;  // caller's tensor -> split's
        auto add_leaf = [&](Tensor* l) {
            if (std::find(sg.leafs.begin(), sg.leafs.end(), l) == sg.leafs.end())
                sg.leafs.push_back(l);
        };
        // A leaf that reads t's bytes where they are.
        auto stand_in = [&](const Tensor* t) {
            Tensor* l = ctx.dup_tensor(t);
            std::memcpy(l->nb, t->nb, sizeof(l->nb));
            std::memcpy(l->dim_sym, t->dim_sym, sizeof(l->dim_sym));
            l->flags = t->flags & ~(kTensorOutput | kTensorInput);
            l->flags |= t->storage()->flags & kTensorParam;
            l->buffer = t->buffer;
            l->offs = t->offs;
            l->data = t->data;
            l->set_name(t->name);
            return l;
        };
        std::function<Expected<Tensor*>(Tensor*)> resolve = [&](Tensor* t) -> Expected<Tensor*> {
            auto it = local.find(t);
            if (it != local.end()) return it->second;
            Tensor* owner = t->storage();
            Tensor* out = nullptr;
            if (!dev->supports_buffer_type(owner->buffer->type())) {
                Tensor*& copy = copy_of[bi][owner];
                if (!copy) {
                    copy = ctx.dup_tensor(owner);
                    std::memcpy(copy->dim_sym, owner->dim_sym, sizeof(copy->dim_sym));
                    copy->set_name(std::string(owner->name) + "#copy");
                    copies_per_backend[bi].push_back(copy);
                }
                const bool listed = std::any_of(copies.begin(), copies.end(), [&](const CopyIn& c) {
                    return c.split == static_cast<int>(si) && c.to == copy;
                });
                if (!listed) {
                    CopyIn c;
                    c.split = static_cast<int>(si);
                    c.producer = writer_of(owner);
                    c.from = owner;
                    c.to = copy;
                    copies.push_back(std::move(c));
                    sg.copied_in.push_back(copy);
                }
                if (t == owner) {
                    out = copy;
                } else {
                    out = stand_in(t);
                    deferred.push_back({out, copy, storage_offset(t)});
                    sg.copied_in.push_back(out);
                }
            } else if (t->op == Op::NONE && !t->view_src) {
                out = t;  // a leaf of the caller's graph: weights, inputs, state
            } else {
                out = stand_in(t);  // computed by another split
            }
            add_leaf(out);
            local[t] = out;
            return out;
        };

        for (Tensor* n : sp.nodes) {
            if (is_in_place(n)) {
                const Tensor* dst = n->src[aliased_src(n)]->storage();
                if (!dev->supports_buffer_type(dst->buffer->type())) {
                    return Status::errorf(
                        ErrorCode::Unsupported, "scheduler: %s cannot write into %s from %s",
                        op_name(n->op), describe(dst).c_str(), backends[bi]->name());
                }
            }
            Tensor* c = ctx.dup_tensor(n);
            std::memcpy(c, n, sizeof(Tensor));  // every field, then rewired below
            for (int s = 0; s < kMaxSrc; s++) {
                if (!n->src[s]) continue;
                Expected<Tensor*> r = resolve(n->src[s]);
                if (!r) return r.status();
                c->src[s] = *r;
            }
            if (n->view_src) {
                // Views and in-place results alias their (resolved) source, at the same place
                // within it.
                const Tensor* orig = n->src[aliased_src(n)];
                Tensor* s0 = c->src[aliased_src(n)];
                c->view_src = s0->storage();
                c->view_offs = storage_offset(s0) + (n->view_offs - storage_offset(orig));
                view_clones.push_back(c);
            }
            local[n] = c;
            sg.nodes.push_back(c);
            if (n->flags & kTensorOutput || read_later.count(n)) sg.outputs.push_back(c);
        }
    }

    // Memory for the copies, per backend.
    for (size_t bi = 0; bi < nb; bi++) {
        if (copies_per_backend[bi].empty()) continue;
        BufferType* bt = backends[bi]->device()->buffer_type();
        size_t total = 0;
        for (Tensor* t : copies_per_backend[bi]) {
            total = align_tensor_offset(total, bt) + bt->alloc_size(t);
        }
        Expected<std::unique_ptr<Buffer>> buf = bt->allocate_for(total, BufferUsage::Compute);
        if (!buf) return buf.status().context("scheduler: copies");
        size_t off = 0;
        for (Tensor* t : copies_per_backend[bi]) {
            off = align_tensor_offset(off, bt);
            FERRY_TRY(place_tensor(t, buf->get(), off));
            off += bt->alloc_size(t);
        }
        copy_buffers.push_back(std::move(*buf));
    }
    for (const Deferred& d : deferred) {
        d.leaf->buffer = d.copy->buffer;
        d.leaf->offs = d.copy->offs + d.offs;
        d.leaf->data = d.copy->data ? static_cast<uint8_t*>(d.copy->data) + d.offs : nullptr;
    }
    for (Tensor* v : view_clones) init_view(v);
    return Status::ok();
}

Status Scheduler::alloc(Graph& g) {
    impl_->allocated = nullptr;
    // Memory is planned anew: nothing in flight may still use it.
    FERRY_TRY(synchronize());
    FERRY_TRY(impl_->allocate(g));
    impl_->allocated = &g;
    impl_->allocated_nodes = g.nodes.size();
    impl_->allocated_last = g.nodes.empty() ? nullptr : g.nodes.back();
    return Status::ok();
}

// Brings one source into the consuming backend's memory once its producer has written it.
Status Scheduler::Impl::copy_in(CopyIn& c, Backend* be) {
    Backend* producer = c.producer >= 0 ? backends[static_cast<size_t>(c.producer)] : nullptr;
    if (producer && producer != be) {
        // Device to device, ordered by an event when both sides have them.
        Event* ev = event_of(static_cast<size_t>(c.producer));
        if (ev && producer->record_event(ev).is_ok() && be->wait_event(ev).is_ok() &&
            be->copy_tensor_async(c.from, c.to)) {
            return Status::ok();
        }
        // Otherwise through the host: read on the producer's stream, wait for it alone.
        c.staging.resize(c.from->nbytes());
        FERRY_TRY(producer->get_tensor_async(c.from, c.staging.data(), 0, c.staging.size()));
        FERRY_TRY(producer->synchronize());
    } else {
        c.staging.resize(c.from->nbytes());
        FERRY_TRY(c.from->buffer->get_tensor(c.from, c.staging.data(), 0, c.staging.size()));
    }
    // The staging bytes stay alive until the next compute: an asynchronous write may read
    // them later.
    return be->set_tensor_async(c.to, c.staging.data(), 0, c.staging.size());
}

Status Scheduler::compute(Graph& g) {
    Impl& m = *impl_;
    m.ahead = nullptr;  // a graph queued ahead is released by the backend's next call
    if (!m.planned_for(g)) FERRY_TRY(alloc(g));
    if (m.splits.empty()) return Status::ok();
    if (m.single) {
        // One backend, nothing to hand over: no wait here. Reading an output (get_tensor)
        // waits for the work and reports its errors, so for a remote device the inputs, the
        // compute and the read of the logits are one round trip.
        return m.backends[static_cast<size_t>(m.splits[0].backend)]->compute(g);
    }
    size_t ci = 0;
    for (size_t si = 0; si < m.splits.size(); si++) {
        Split& sp = m.splits[si];
        Backend* be = m.backends[static_cast<size_t>(sp.backend)];
        for (; ci < m.copies.size() && m.copies[ci].split == static_cast<int>(si); ci++) {
            FERRY_TRY(m.copy_in(m.copies[ci], be));
        }
        FERRY_TRY(be->compute(sp.graph));
    }
    return Status::ok();
}

Status Scheduler::synchronize() {
    Status result;
    if (Backend* a = impl_->ahead) {
        // The queued graph runs with its last inputs: then nothing waits for inputs.
        impl_->ahead = nullptr;
        result = a->settle_ahead();
    }
    for (Backend* b : impl_->backends) {
        Status st = b->synchronize();
        if (result && !st) result = st;
    }
    return result;
}

Status Scheduler::set_tensor(Tensor* t, const void* src, size_t size) {
    const TensorWrite w{t, src, 0, size};
    return set_tensors(std::span<const TensorWrite>(&w, 1));
}

Status Scheduler::set_tensors(std::span<const TensorWrite> writes) {
    impl_->ahead = nullptr;  // released by the backend's next call
    for (const TensorWrite& w : writes) {
        if (w.offset != 0 || w.size != w.t->nbytes()) {
            return Status::errorf(ErrorCode::InvalidArgument,
                                  "tensor %s holds %zu bytes, %zu given", describe(w.t).c_str(),
                                  w.t->nbytes(), w.size);
        }
    }
    // Usually one backend reads them all: one call, no copies of the list.
    Backend* const first = writes.empty() ? nullptr : backend_of(writes[0].t);
    bool one = first != nullptr;
    for (size_t i = 1; one && i < writes.size(); i++) one = backend_of(writes[i].t) == first;
    if (one) return first->set_tensors_async(writes);
    std::vector<TensorWrite> group;
    std::vector<bool> done(writes.size(), false);
    for (size_t i = 0; i < writes.size(); i++) {
        if (done[i]) continue;
        Backend* be = backend_of(writes[i].t);
        if (!be) {
            FERRY_TRY(tensor_set(writes[i].t, writes[i].src, writes[i].size));
            continue;
        }
        group.clear();
        for (size_t j = i; j < writes.size(); j++) {
            if (!done[j] && backend_of(writes[j].t) == be) {
                group.push_back(writes[j]);
                done[j] = true;
            }
        }
        FERRY_TRY(be->set_tensors_async(group));
    }
    return Status::ok();
}

Status Scheduler::get_tensor(const Tensor* t, void* dst, size_t size) {
    if (size != t->nbytes()) {
        return Status::errorf(ErrorCode::InvalidArgument,
                              "tensor %s holds %zu bytes, %zu asked for", describe(t).c_str(),
                              t->nbytes(), size);
    }
    const int bi = impl_->writer_of(t);
    if (bi < 0) return tensor_get(t, dst, size);
    Backend* be = impl_->backends[static_cast<size_t>(bi)];
    impl_->ahead = nullptr;  // released by the backend's next call
    FERRY_TRY(be->get_tensor_async(t, dst, 0, size));
    return be->synchronize();
}

Status Scheduler::get_tensor_then(const Tensor* t, void* dst, size_t size, Graph& then,
                                  bool* queued) {
    *queued = false;
    Impl& m = *impl_;
    const int bi = m.writer_of(t);
    const bool one =
        m.single && m.splits.size() == 1 && bi == m.splits[0].backend && m.planned_for(then);
    if (!one || size != t->nbytes()) return get_tensor(t, dst, size);
    Backend* be = m.backends[static_cast<size_t>(bi)];
    m.ahead = nullptr;
    FERRY_TRY(be->get_tensor_async(t, dst, 0, size));
    Expected<bool> q = be->compute_ahead(then);
    const Status waited = be->synchronize();  // not for the graph queued ahead
    if (!q) {
        (void)be->settle_ahead();  // whatever it left queued
        return q.status();
    }
    if (*q) m.ahead = be;
    *queued = *q;
    return waited;
}

Expected<bool> Scheduler::run_ahead(std::span<const TensorWrite> writes) {
    Backend* be = impl_->ahead;
    impl_->ahead = nullptr;
    bool mine = be != nullptr;
    for (const TensorWrite& w : writes) {
        mine = mine && w.offset == 0 && w.size == w.t->nbytes() && backend_of(w.t) == be;
    }
    if (!mine) {
        FERRY_TRY(set_tensors(writes));  // releases a queued graph on its backend's next call
        return false;
    }
    return be->run_ahead(writes);
}

Backend* Scheduler::backend_of(const Tensor* node) const {
    auto it = impl_->assignment.find(node);
    if (it == impl_->assignment.end()) return nullptr;
    return impl_->backends[static_cast<size_t>(it->second)];
}

int Scheduler::n_splits() const {
    return static_cast<int>(impl_->splits.size());
}

const Graph& Scheduler::split_graph(int i) const {
    const Impl& m = *impl_;
    FERRY_ASSERT(i >= 0 && static_cast<size_t>(i) < m.splits.size());
    // Without copies or a second split the backend runs the caller's graph itself.
    if (m.single) return *m.allocated;
    return m.splits[static_cast<size_t>(i)].graph;
}

Backend* Scheduler::split_backend(int i) const {
    FERRY_ASSERT(i >= 0 && static_cast<size_t>(i) < impl_->splits.size());
    return impl_->backends[static_cast<size_t>(impl_->splits[static_cast<size_t>(i)].backend)];
}

}  // namespace ferry
