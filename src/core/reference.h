// The float64 scalar reference: evaluates a Graph with textbook double-precision formulas.
//
// This is the oracle every kernel and every backend is compared against (see ops.def for the
// semantics). It never looks at buffers: leaf values are handed in as host bytes (set_leaf) or
// read from t->data when the leaf is host-addressable.
//
// Storage model: every storage owner (a leaf, or a non-view node) holds its element values as
// doubles in its logical order (i0 fastest), which for a contiguous owner is also its memory
// order. Views (RESHAPE, VIEW, PERMUTE, TRANSPOSE and the results of the in-place ops CPY and
// SET_ROWS) are resolved on demand: element (i0, i1, i2, i3) of a view lives at byte
// view_offs + (i0 / block_size) * nb0 + i1 * nb1 + i2 * nb2 + i3 * nb3 of its owner, i.e. at
// owner element (byte / type_size) * block_size + i0 % block_size. Owners that are viewed must
// be contiguous.
//
// Writes into a destination of type F32/F16/BF16 or a block format (CPY, SET_ROWS) store each
// value rounded through that type (quantize -> dequantize per written block, with the
// reference quantizer), so later readers see what a real backend stores. Intermediate F32
// results of other ops are kept unrounded: they are the exact answer the kernels approximate.
//
// Conventions where ops.def leaves a choice:
//  - MUL_MAT and FLASH_ATTN_EXT broadcast the smaller operand over dims 2-3 by division
//    (GQA grouping: b matrix k2 uses a matrix k2 / (b.ne2 / a.ne2); query head h uses kv head
//    h / (n_head / n_head_kv)).
//  - ADD/MUL operand b and the SOFT_MAX / FLASH_ATTN_EXT masks broadcast by repetition
//    (index modulo the smaller size).
//  - SOFT_MAX of a row whose every logit is -inf is all zeros.
//  - GELU is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "ferry/graph.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry {

class RefEval {
  public:
    // Supplies a leaf's bytes: at least t->nbytes() bytes laid out under t's strides, exactly
    // what was (or will be) written to the tensor's buffer. Decoded immediately.
    Status set_leaf(const Tensor* t, const void* bytes, size_t size);

    // Evaluates every node in order. Leaves without set_leaf values are read from t->data
    // (fails when they are not host-addressable). In-place ops update their owner's values, so
    // run a graph once per set of leaf values.
    Status run(const Graph& g);

    // Values of a leaf, node or view of one, in logical order (i0 fastest); integers (I32,
    // ARGMAX results) as exact doubles.
    Expected<std::vector<double>> values(const Tensor* t) const;

  private:
    Status eval(const Tensor* node);
    // For each logical element of t: its index in the owner's values.
    Expected<std::vector<int64_t>> owner_index(const Tensor* t) const;
    // Writes v (t's logical order) into t's owner; `modified` (nullable) marks the elements
    // written, which are rounded through the owner's type unless `round` is false.
    Status write(const Tensor* t, const std::vector<double>& v,
                 const std::vector<uint8_t>* modified, bool round);

    std::unordered_map<const Tensor*, std::vector<double>> store_;
};

// Decodes a tensor's bytes (at least t->nbytes(), laid out under t's strides) into values in
// logical order. Quantized tensors need contiguous blocks within a row (nb0 == type size).
Expected<std::vector<double>> decode_tensor(const Tensor* t, const void* bytes, size_t size);

// Rounds n values (contiguous, a whole number of blocks for block formats) through type t, as
// storing them in a tensor of that type and reading them back would.
Status round_through_type(Type t, double* v, int64_t n);

double ref_silu(double x);
double ref_gelu(double x);  // tanh approximation

}  // namespace ferry
