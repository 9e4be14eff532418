#include "ferry/graph.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace ferry {

void Graph::visit(Tensor* t) {
    if (!t || !visited_.insert(t).second) return;
    for (int i = 0; i < kMaxSrc; i++) visit(t->src[i]);
    visit(t->view_src);
    if (t->op == Op::NONE) {
        leafs.push_back(t);
    } else {
        nodes.push_back(t);
    }
}

void Graph::build_forward(Tensor* t) {
    visit(t);
}

bool Graph::is_output(const Tensor* t) const {
    if (t->flags & kTensorOutput) return true;
    return std::find(outputs.begin(), outputs.end(), t) != outputs.end();
}

bool Graph::is_copied_in(const Tensor* t) const {
    return std::find(copied_in.begin(), copied_in.end(), t) != copied_in.end();
}

namespace {

inline uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}
// The high and low halves of a 64x64-bit product, folded.
inline uint64_t fold_mul(uint64_t a, uint64_t b) {
    const __uint128_t r = static_cast<__uint128_t>(a) * b;
    return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}
inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}
inline uint64_t load_le64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;  // x86-64 and the other targets ferry builds for are little-endian
}

}  // namespace

Hash128 hash128(const void* data, size_t size) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    // Two lanes, 16 bytes per step. Each lane's state goes through a bijection (xor, rotate,
    // multiply by an odd constant), so no input word can erase what came before.
    uint64_t a = 0x243f6a8885a308d3ull, b = 0x13198a2e03707344ull;
    size_t i = 0;
    for (; i + 16 <= size; i += 16) {
        const uint64_t w0 = load_le64(p + i), w1 = load_le64(p + i + 8);
        a = rotl64(a ^ fold_mul(w0 ^ 0xa4093822299f31d0ull, w1 ^ 0x082efa98ec4e6c89ull), 27) *
                0x9e3779b97f4a7c15ull +
            0x452821e638d01377ull;
        b = rotl64(b ^ fold_mul(w1 ^ 0xbe5466cf34e90c6cull, rotl64(w0, 32) ^ 0xc0ac29b7c97c50ddull),
                   31) *
                0xc2b2ae3d27d4eb4full +
            0x3f84d5b5b5470917ull;
    }
    uint8_t tail[16] = {};
    if (i < size) std::memcpy(tail, p + i, size - i);
    const uint64_t t0 = load_le64(tail), t1 = load_le64(tail + 8);
    a = rotl64(a ^ fold_mul(t0 ^ 0x9216d5d98979fb1bull, t1 ^ size), 27) * 0x9e3779b97f4a7c15ull;
    b = rotl64(b ^ fold_mul(t1 ^ 0xd1310ba698dfb5acull, t0 ^ ~size), 31) * 0xc2b2ae3d27d4eb4full;
    Hash128 h;
    h.lo = fmix64(a ^ rotl64(b, 32));
    h.hi = fmix64(b + h.lo);
    return h;
}

namespace {

// Leaf and node roles in a signature.
enum SigRole : uint8_t {
    kRoleIntermediate = 0,
    kRoleOutput = 1,
    kRoleWeight = 2,
    kRoleInput = 3,
    kRoleCopiedIn = 4,
    kRoleState = 5,
    kRoleExternal = 6,  // referenced but in neither list (a malformed or partial graph)
};

class SigWriter {
  public:
    explicit SigWriter(std::vector<uint8_t>* out) : out_(out) {}
    template <class T>
    void put(const T& v) {
        const size_t at = out_->size();
        out_->resize(at + sizeof(T));
        std::memcpy(out_->data() + at, &v, sizeof(T));
    }

  private:
    std::vector<uint8_t>* out_;
};

}  // namespace

GraphSignature graph_signature(const Graph& g, SignatureMode mode) {
    std::unordered_map<const Tensor*, int32_t> index;
    std::vector<const Tensor*> order;
    order.reserve(g.leafs.size() + g.nodes.size());
    for (const Tensor* t : g.leafs) order.push_back(t);
    for (const Tensor* t : g.nodes) order.push_back(t);
    // Tensors a node refers to that neither list holds are appended (role External), so
    // their type and shape are part of the signature too.
    for (size_t i = 0; i < order.size(); i++) index.emplace(order[i], static_cast<int32_t>(i));
    for (size_t i = 0; i < order.size(); i++) {
        const Tensor* t = order[i];
        auto add_ref = [&](const Tensor* r) {
            if (r && index.emplace(r, static_cast<int32_t>(order.size())).second)
                order.push_back(r);
        };
        for (int s = 0; s < kMaxSrc; s++) add_ref(t->src[s]);
        add_ref(t->view_src);
    }
    const std::unordered_set<const Tensor*> leaf_set(g.leafs.begin(), g.leafs.end());
    const std::unordered_set<const Tensor*> node_set(g.nodes.begin(), g.nodes.end());
    const std::unordered_set<const Tensor*> copied(g.copied_in.begin(), g.copied_in.end());
    const std::unordered_set<const Tensor*> outs(g.outputs.begin(), g.outputs.end());

    GraphSignature sig;
    sig.bytes.reserve(order.size() * 112 + 16);
    SigWriter w(&sig.bytes);
    w.put(static_cast<uint32_t>(g.leafs.size()));
    w.put(static_cast<uint32_t>(g.nodes.size()));
    w.put(static_cast<uint32_t>(order.size()));
    w.put(static_cast<uint8_t>(mode));
    for (const Tensor* t : order) {
        uint8_t role = kRoleExternal;
        if (node_set.count(t)) {
            role = (t->flags & kTensorOutput) || outs.count(t) ? kRoleOutput : kRoleIntermediate;
        } else if (leaf_set.count(t)) {
            if (copied.count(t)) {
                role = kRoleCopiedIn;
            } else if ((t->flags | t->storage()->flags) & kTensorParam) {
                role = kRoleWeight;
            } else if (t->flags & kTensorInput) {
                role = kRoleInput;
            } else {
                role = kRoleState;
            }
        }
        w.put(role);
        w.put(static_cast<uint32_t>(t->type));
        w.put(static_cast<uint32_t>(t->op));
        for (int d = 0; d < kMaxDims; d++) {
            if (mode == SignatureMode::Dynamic && t->dim_sym[d] != kDimFixed) {
                w.put(int64_t{-1} - t->dim_sym[d]);  // sizes are never negative
            } else {
                w.put(static_cast<int64_t>(t->ne[d]));
            }
        }
        // Strides that follow from the shape are recorded as such (they stay right when a
        // dynamic size changes); a dim of extent 1 is never stepped over, unless its extent is
        // dynamic (1 this step, more the next: a decode step and a prefill share a signature).
        const bool contiguous = t->is_contiguous();
        w.put(static_cast<uint8_t>(contiguous));
        for (int d = 0; d < kMaxDims; d++) {
            const bool dynamic = mode == SignatureMode::Dynamic && t->dim_sym[d] != kDimFixed;
            w.put(static_cast<uint64_t>(contiguous || (t->ne[d] == 1 && !dynamic) ? 0 : t->nb[d]));
        }
        w.put(t->op_params);
        for (int s = 0; s < kMaxSrc; s++) w.put(t->src[s] ? index.at(t->src[s]) : int32_t{-1});
        w.put(t->view_src ? index.at(t->view_src) : int32_t{-1});
        w.put(static_cast<uint64_t>(t->view_offs));
    }
    sig.hash = hash128(sig.bytes.data(), sig.bytes.size());
    return sig;
}

void init_view(Tensor* t) {
    Tensor* vs = t->view_src;
    FERRY_ASSERT(vs && vs->buffer);
    t->buffer = vs->buffer;
    t->offs = vs->offs + t->view_offs;
    t->data = vs->data ? static_cast<uint8_t*>(vs->data) + t->view_offs : nullptr;
}

}  // namespace ferry
