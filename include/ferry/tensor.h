// Tensors, the op enum and the graph-building context.
//
// A Tensor is plain data. Shapes are innermost-first: ne[0] elements per row, ne[1] rows, ...
// nb[] are byte strides (nb[0] = type size for plain types, block bytes for quantized ones).
// Storage is (buffer, offs); `data` caches the host address buffer->base() + offs when the
// buffer is host-addressable (nullptr otherwise, e.g. remote or device buffers).
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <string>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry {

class Buffer;

enum OpFlags : uint32_t { kOpView = 1u, kOpInPlace = 2u };

enum class Op : uint32_t {
#define X(name, nmin, nmax, flags) name,
#include "ferry/ops.def"
#undef X
    COUNT
};

struct OpInfo {
    const char* name;
    int n_src_min;
    int n_src_max;
    uint32_t flags;
};
const OpInfo& op_info(Op op);
inline const char* op_name(Op op) {
    return op_info(op).name;
}
// nullptr for unknown ids (ids arrive from outside in the remote protocol).
const OpInfo* op_info_or_null(uint32_t id);
Expected<Op> op_from_name(const char* name);

enum TensorFlags : uint32_t {
    kTensorInput = 1u,   // set by the caller before each compute
    kTensorOutput = 2u,  // read by the caller after compute: never reused by the allocator
    kTensorParam = 4u,   // weights
};

constexpr int kMaxDims = 4;
constexpr int kMaxSrc = 4;
constexpr int kMaxOpParams = 8;
constexpr int kMaxName = 64;

// Symbols for dynamic dimensions (Tensor::dim_sym): sizes that change from one step to the
// next while the graph's structure stays the same. 0 means a fixed size.
enum DimSymbol : uint8_t {
    kDimFixed = 0,
    kDimTokens = 1,   // tokens in the step (batch)
    kDimKv = 2,       // attended KV positions
    kDimOutputs = 3,  // rows of logits produced
};

struct Tensor {
    Type type = Type::F32;
    int64_t ne[kMaxDims] = {1, 1, 1, 1};
    size_t nb[kMaxDims] = {0, 0, 0, 0};

    Op op = Op::NONE;
    int32_t op_params[kMaxOpParams] = {};
    Tensor* src[kMaxSrc] = {};

    Tensor* view_src = nullptr;  // storage owner when this tensor is a view (never a view itself)
    size_t view_offs = 0;        // byte offset into view_src's storage

    Buffer* buffer = nullptr;
    size_t offs = 0;       // byte offset of element 0 in buffer
    void* data = nullptr;  // host address of element 0, when the buffer has one

    uint32_t flags = 0;
    char name[kMaxName] = {};

    // Symbol of each dimension the model marked dynamic (0: a fixed size). See
    // Context::mark_dynamic and graph_signature.
    uint8_t dim_sym[kMaxDims] = {};

    // Private data of the device that holds the tensor (e.g. a repacked copy of a weight, a
    // device-side descriptor), set by that device's buffer or prepare_weights and owned and
    // freed by that buffer. Never part of a graph's structure, never sent over the wire.
    void* extra = nullptr;

    // --- derived properties ---
    // Unchecked products: valid for tensors that passed validate_node() or tensor_span(),
    // which reject shapes whose element count overflows int64.
    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
    // Bytes spanned by the tensor's elements under its strides (0 if empty).
    size_t nbytes() const;
    size_t row_bytes() const;  // bytes of one row of ne[0] elements, contiguous
    bool is_contiguous() const;
    bool is_view() const { return view_src != nullptr; }
    // Storage owner: view_src for views, this otherwise.
    const Tensor* storage() const { return view_src ? view_src : this; }
    Tensor* storage() { return view_src ? view_src : this; }
    void set_name(const std::string& n);

    float param_f(int i) const;
    void set_param_f(int i, float v);
};

// The one overflow-checked measure of a tensor's storage: *out = bytes spanned under its
// strides (one past the last byte any element reaches, so transposed and permuted layouts are
// measured exactly; 0 when a dimension is empty). False for a malformed shape: a negative
// size, ne[0] not a whole number of blocks, an element count or a dense byte size that
// overflows (int64 / size_t), or a span that overflows. Every check of a tensor that came from
// outside (validate_node, the remote server's buffer ranges) goes through it.
bool tensor_span(const Tensor* t, size_t* out);
// True when the tensor's extents fit in the bytes its strides reach: a tensor whose strides
// are all non-zero (over dimensions longer than 1) spans at least its dense byte size. A zero
// stride (broadcast) repeats elements on purpose and is exempt for that dimension. Requires
// tensor_span() to succeed.
bool extents_fit_span(const Tensor* t);

bool same_shape(const Tensor* a, const Tensor* b);
// Standard contiguous strides for a type and shape (requires ne[0] % block_size == 0).
void set_contiguous_strides(Tensor* t);
// "name [ne0, ne1, ne2, ne3] type" for error messages.
std::string describe(const Tensor* t);

// Checks a node against its op's rules: source count and types, shapes, strides, view range
// within the viewed tensor's bytes, op parameters. Used by the graph builders and by anything
// that receives graphs from outside (the remote server). Does not look at buffers.
Status validate_node(const Tensor* t);

// Owns tensor metadata (never tensor data). Builders create nodes and validate them; misuse by
// the caller (shapes that violate an op's rules) aborts with a message: callers validate
// outside input before building.
class Context {
  public:
    Context() = default;
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    Tensor* new_tensor(Type type, std::initializer_list<int64_t> ne);
    Tensor* new_tensor(Type type, int n_dims, const int64_t* ne);
    // Fallible variant for shapes from outside: rejects negative sizes, ne0 not a multiple of
    // the block size, and byte sizes that overflow.
    Expected<Tensor*> new_tensor_checked(Type type, int n_dims, const int64_t* ne);
    Tensor* dup_tensor(const Tensor* t);  // same type and shape, no data, no op

    size_t size() const { return tensors_.size(); }
    Tensor* at(size_t i) { return &tensors_[i]; }
    const Tensor* at(size_t i) const { return &tensors_[i]; }
    // Iteration over all tensors created (leaves, nodes, views).
    auto begin() { return tensors_.begin(); }
    auto end() { return tensors_.end(); }

    // Marks dimension `dim` of t (an input, or a view the builder sized by hand) as the dynamic
    // size `sym`. Nodes built from it inherit the symbol through each op's shape rule.
    void mark_dynamic(Tensor* t, int dim, DimSymbol sym);

    // --- ops (see ops.def for semantics) ---
    Tensor* cpy(Tensor* src, Tensor* dst);
    Tensor* cont(Tensor* a);
    Tensor* reshape(Tensor* a, std::initializer_list<int64_t> ne);
    // View of a with shape ne, byte strides nb (nb[0] implied by the type), at byte offset offs.
    Tensor* view(Tensor* a, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb,
                 size_t offs);
    Tensor* view_1d(Tensor* a, int64_t ne0, size_t offs);
    Tensor* view_2d(Tensor* a, int64_t ne0, int64_t ne1, size_t nb1, size_t offs);
    Tensor* view_3d(Tensor* a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2,
                    size_t offs);
    // Result dim axes[i] of... as in numpy's transpose inverse: source dim i goes to axis[i].
    Tensor* permute(Tensor* a, int ax0, int ax1, int ax2, int ax3);
    Tensor* transpose(Tensor* a);  // swaps dims 0 and 1
    Tensor* get_rows(Tensor* a, Tensor* idx);
    Tensor* set_rows(Tensor* dst, Tensor* src, Tensor* idx);
    Tensor* add(Tensor* a, Tensor* b);
    Tensor* mul(Tensor* a, Tensor* b);
    Tensor* scale(Tensor* a, float s, float bias = 0.0f);
    Tensor* rms_norm(Tensor* a, float eps);
    Tensor* norm(Tensor* a, float eps);
    Tensor* mul_mat(Tensor* a, Tensor* b);
    Tensor* soft_max(Tensor* a, Tensor* mask, float scale);
    // freq_factors: optional F32 [n_dims / 2] divisors of the angles (see ops.def).
    Tensor* rope(Tensor* a, Tensor* pos, int n_dims, int mode, float freq_base, float freq_scale,
                 Tensor* freq_factors = nullptr);
    Tensor* flash_attn_ext(Tensor* q, Tensor* k, Tensor* v, Tensor* mask, float scale);
    Tensor* silu(Tensor* a);
    Tensor* gelu(Tensor* a);
    Tensor* swiglu(Tensor* a, Tensor* b);
    Tensor* geglu(Tensor* a, Tensor* b);
    Tensor* argmax(Tensor* a);
    Tensor* sum_rows(Tensor* a);
    Tensor* top_k(Tensor* a, int32_t k);

  private:
    Tensor* new_node(Op op, Type type, std::initializer_list<int64_t> ne,
                     std::initializer_list<Tensor*> srcs);
    Tensor* new_view(Op op, Tensor* a, const int64_t* ne, const size_t* nb, size_t offs);
    Tensor* finish(Tensor* t);  // validates (aborts on misuse)
    std::deque<Tensor> tensors_;
};

constexpr int kRopeNormal = 0;
constexpr int kRopeNeox = 2;
// TOP_K's longest row: its indices come out as floats, exact up to 2^24.
constexpr int64_t kTopKMaxRow = int64_t{1} << 24;

}  // namespace ferry
