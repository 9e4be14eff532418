// The op test suite: a table of cases, one per op / type / shape / layout variant, each run on a
// Backend and compared to the float64 reference (core/reference.h).
//
// A case builds its graph in two contexts: inputs (leaves, allocated together on the device's
// buffer type with allocate_context_tensors and filled through Buffer set only, so the suite
// runs unchanged through a non-host-addressable backend such as remote) and the graph (nodes,
// allocated with GraphAllocator). Outputs are read with tensor_get.
//
// Each case carries an NMSE bound, NMSE = sum((out - ref)^2) / sum(ref^2), chosen per op and
// type from the rounding the op is allowed to do (see the bounds table in op-tests.cpp for
// each justification). Integer outputs (ARGMAX) must match exactly. Because an NMSE over many
// elements can hide a single wrong one, no element may also be off by more than
// 10 sqrt(bound) max(|ref|, rms(ref)).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/tensor.h"

namespace ferry::testing {

// How an input's values are generated (deterministically from the case seed).
struct Fill {
    enum Kind {
        Uniform,    // floats uniform in [lo, hi)
        Indices,    // I32 uniform in [0, n)
        RowPerm,    // I32: distinct row indices in [0, n) within each index row (SET_ROWS)
        Positions,  // I32: distinct positions in [0, n), out of order (ROPE)
        Mask,       // floats uniform in [lo, hi), a fraction p of entries -inf (never a whole row)
        Distinct,   // floats, distinct within each row (no ties: ARGMAX)
        Causal,     // a causal mask [n_kv, n_q, ...]: row r sees keys i <= n_kv - n - n_q + r
                    // (uniform in [lo, hi)), the rest -inf (n: the KV view's padding)
    };
    Kind kind = Uniform;
    double lo = -1.0, hi = 1.0;
    int64_t n = 0;
    double p = 0.0;

    static Fill uniform(double lo, double hi) { return {Uniform, lo, hi, 0, 0.0}; }
    static Fill indices(int64_t n) { return {Indices, 0, 0, n, 0.0}; }
    static Fill row_perm(int64_t n) { return {RowPerm, 0, 0, n, 0.0}; }
    static Fill positions(int64_t n) { return {Positions, 0, 0, n, 0.0}; }
    static Fill mask(double p_neg_inf) { return {Mask, -1.0, 1.0, 0, p_neg_inf}; }
    static Fill distinct() { return {Distinct, -1.0, 1.0, 0, 0.0}; }
    static Fill causal(int64_t pad = 0) { return {Causal, -1.0, 1.0, pad, 0.0}; }
};

// Handed to a case's build function: creates inputs and gives the graph context.
class CaseBuilder {
  public:
    CaseBuilder(Context& inputs, Context& graph) : inputs_(inputs), graph_(graph) {}
    Context& g() { return graph_; }
    // A leaf input of the given type and shape (innermost first).
    Tensor* in(Type type, std::initializer_list<int64_t> ne, Fill fill = {});
    // The tensor compared with the reference; defaults to the graph root the build returns.
    // Set it to read e.g. a whole destination after an in-place write into part of it.
    void read(Tensor* t) { read_ = t; }

    struct Input {
        Tensor* t;
        Fill fill;
    };
    const std::vector<Input>& inputs() const { return in_; }
    Tensor* read_tensor() const { return read_; }

  private:
    Context& inputs_;
    Context& graph_;
    std::vector<Input> in_;
    Tensor* read_ = nullptr;
};

struct OpTestCase {
    std::string name;    // unique, [A-Za-z0-9_] (a GoogleTest parameter name)
    Op op = Op::NONE;    // the op under test
    std::string types;   // source types of the op under test, e.g. "q4_0,f32" or "f32->f16"
    std::string shapes;  // source shapes; "(nc)" marks non-contiguous sources
    double max_nmse = 0.0;
    const char* bound_note = "";  // why this bound
    uint64_t seed = 0;
    // Builds inputs (through b.in) and the graph; returns the root node.
    std::function<Tensor*(CaseBuilder& b)> build;
};

struct OpTestResult {
    bool passed = false;
    bool supported = true;  // false: the device declined a node (supports_op)
    double nmse = 0.0;
    double bound = 0.0;
    std::string message;  // why it failed (empty when passed)
    // The bytes read back from the device (the read tensor, contiguous; empty when the case
    // failed before the read), for comparing two devices bit for bit.
    std::vector<uint8_t> output;
};

// Every case (empty filter), or those matching any comma-separated token of `filter`: a token
// that is an op name ("mul_mat") selects that op's cases, any other token the cases whose name
// contains it ("MUL_MAT_q4"); case-insensitive.
std::vector<OpTestCase> make_op_tests(const std::string& filter = "");

// Runs one case on `backend` (its device's buffer type holds every tensor).
OpTestResult run_op_test(const OpTestCase& c, Backend* backend);

// Deterministic input bytes for a leaf (t->nbytes(), contiguous layout).
std::vector<uint8_t> make_input_bytes(const Tensor* t, const Fill& fill, uint64_t seed);

}  // namespace ferry::testing
