// Compute graphs, structural graph keys and the graph allocator.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry {

// Nodes in topological order (every source of a node is a leaf or an earlier node) and leaves
// (tensors with op NONE that nodes read but do not compute: weights, inputs, state such as a
// KV cache, results of other splits). View nodes (RESHAPE, VIEW, PERMUTE, TRANSPOSE) appear as
// nodes; backends skip them.
//
// The roles a backend needs to run the graph on its own: a leaf flagged kTensorParam (or whose
// storage is) is a weight, kTensorInput an input the caller sets before each compute, a leaf
// in `copied_in` holds values another split produced (copied into this device before the
// graph runs), any other leaf is state that persists between computes (a KV cache). A node is
// an output when it is flagged kTensorOutput or listed in `outputs` (a later split reads it);
// other nodes are intermediates whose memory may be reused.
struct Graph {
    std::vector<Tensor*> nodes;
    std::vector<Tensor*> leafs;
    std::vector<Tensor*> copied_in;  // leaves (scheduler splits only)
    std::vector<Tensor*> outputs;    // nodes read after this graph, besides kTensorOutput ones

    // Adds `t` and everything it depends on (sources and view sources) in dependency order.
    void build_forward(Tensor* t);
    void clear() {
        nodes.clear();
        leafs.clear();
        copied_in.clear();
        outputs.clear();
        visited_.clear();
    }
    bool is_output(const Tensor* t) const;
    bool is_copied_in(const Tensor* t) const;

  private:
    void visit(Tensor* t);
    std::unordered_set<const Tensor*> visited_;
};

// A 128-bit hash (not cryptographic; equality of the hashed bytes is always checked on a hit).
struct Hash128 {
    uint64_t lo = 0, hi = 0;
    bool operator==(const Hash128& o) const { return lo == o.lo && hi == o.hi; }
};
Hash128 hash128(const void* data, size_t size);

// The structure of a graph as canonical bytes: for every leaf and node in order, its role
// (weight, input, state, copied in, intermediate, output), type, shape, strides (recorded as
// "contiguous" when they follow from the shape; ignored for dims of extent 1), op, op params,
// source wiring, view source and offset. Never data, buffers, addresses or names. Two graphs
// with equal signatures can share whatever a backend compiled or deserialized for either.
//
// Dynamic: a dimension the model marked dynamic (Tensor::dim_sym, see Context::mark_dynamic)
// is recorded as its symbol, not its size, so one compilation serves every token count or KV
// length; Exact records every size.
enum class SignatureMode { Exact, Dynamic };
struct GraphSignature {
    std::vector<uint8_t> bytes;
    Hash128 hash;
    // Equal hashes and equal bytes: a hash collision never passes for a hit.
    bool operator==(const GraphSignature& o) const { return hash == o.hash && bytes == o.bytes; }
};
GraphSignature graph_signature(const Graph& g, SignatureMode mode = SignatureMode::Dynamic);
// For unordered containers keyed by signature (equality compares the bytes).
struct GraphSignatureHash {
    size_t operator()(const GraphSignature& s) const { return static_cast<size_t>(s.hash.lo); }
};

// Sets buffer/offs/data of a view from its view_src (which must have storage).
void init_view(Tensor* t);

}  // namespace ferry
