// Graph -> ov::Model (see translate.h): the translator table and the value helpers.
#include "backends/openvino/translate.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <openvino/op/ops.hpp>
#include <unordered_map>

#include "backends/openvino/weights.h"

namespace ferry::openvino {

namespace {

using ov::Node;
using ov::Output;
namespace op = ov::op;
using Val = Output<Node>;

ov::element::Type ov_type(Type t) {
    switch (t) {
        case Type::F32:
            return ov::element::f32;
        case Type::F16:
            return ov::element::f16;
        case Type::BF16:
            return ov::element::bf16;
        case Type::I32:
            return ov::element::i32;
        default:
            return ov::element::dynamic;
    }
}

bool plain(Type t) {
    return ov_type(t) != ov::element::dynamic;
}

Val i64c(std::vector<int64_t> v) {
    return op::v0::Constant::create(ov::element::i64, ov::Shape{v.size()}, v);
}
Val i64s(int64_t v) {
    return op::v0::Constant::create(ov::element::i64, ov::Shape{}, {v});
}
Val f32s(float v) {
    return op::v0::Constant::create(ov::element::f32, ov::Shape{}, {v});
}
Val to(Val v, ov::element::Type t) {
    if (v.get_element_type() == t) return v;
    return std::make_shared<op::v0::Convert>(v, t);
}
Val f32(Val v) {
    return to(v, ov::element::f32);
}
Val slice(Val v, Val start, Val stop, int64_t axis) {
    return std::make_shared<op::v8::Slice>(v, start, stop, i64c({1}), i64c({axis}));
}
Val reshape(Val v, Val shape) {
    return std::make_shared<op::v1::Reshape>(v, shape, false);
}
Val transpose(Val v, std::vector<int64_t> order) {
    return std::make_shared<op::v1::Transpose>(v, i64c(order));
}

// The state of one translation.
struct Tr {
    const Graph& g;
    std::unordered_map<const Tensor*, Val> val;      // value of each tensor
    std::unordered_map<const Tensor*, Val> storage;  // current contents of written storages
    // The writes into each leaf storage so far, in order: (flat element index, values).
    std::unordered_map<const Tensor*, std::vector<std::pair<Val, Val>>> writes;
    std::unordered_map<const Tensor*, int> leaf_index;
    std::map<int, std::shared_ptr<op::v0::Parameter>> sym;  // DimSymbol -> i64 [1]
    // Leaves bound by their first rows only (window_symbol): leaf -> the row-count symbol.
    std::unordered_map<const Tensor*, int> windowed;
    // Each SET_ROWS node: the rows it writes (i64 [n]) and their values as the storage holds
    // them (read back as f32, [n, row]), for attention that reads the cache in place.
    struct RowWrite {
        Val rows;
        Val values;
    };
    std::unordered_map<const Tensor*, RowWrite> row_writes;
    ModelPlan plan;
    ov::ParameterVector params;
    ov::ResultVector results;

    explicit Tr(const Graph& graph) : g(graph) {}

    Val sym_param(int s) {
        auto it = sym.find(s);
        if (it != sym.end()) return it->second;
        auto p = std::make_shared<op::v0::Parameter>(ov::element::i64, ov::PartialShape{1});
        p->set_friendly_name("dim_sym_" + std::to_string(s));
        sym[s] = p;
        return p;
    }
    // Extent of ferry dim d of t as i64 [1].
    Val dim(const Tensor* t, int d) {
        if (t->dim_sym[d] != kDimFixed) return sym_param(t->dim_sym[d]);
        return i64c({t->ne[d]});
    }
    bool any_dynamic(const Tensor* t) const {
        for (int d = 0; d < kMaxDims; d++) {
            if (t->dim_sym[d] != kDimFixed) return true;
        }
        return false;
    }
    // [ne3, ne2, ne1, ne0] as i64 [4].
    Val shape4(const Tensor* t) {
        if (!any_dynamic(t)) return i64c({t->ne[3], t->ne[2], t->ne[1], t->ne[0]});
        return std::make_shared<op::v0::Concat>(
            ov::OutputVector{dim(t, 3), dim(t, 2), dim(t, 1), dim(t, 0)}, 0);
    }
    Val numel(const Tensor* t) {
        return std::make_shared<op::v1::ReduceProd>(shape4(t), i64c({0}), true);
    }
    Val v(const Tensor* t) { return val.at(t); }
    Val vf(const Tensor* t) { return f32(val.at(t)); }
    // A converted weight as a 2-D matrix for a product or a gather: one subgraph per weight,
    // shared by every reader (a tied embedding feeds the first gather and the last product).
    std::unordered_map<const Tensor*, Val> matrices;
    Val matrix(const Tensor* w) {
        auto it = matrices.find(w);
        if (it != matrices.end()) return it->second;
        Val m = weight_node(w, *static_cast<const PreparedWeight*>(w->extra), true);
        matrices.emplace(w, m);
        return m;
    }
    // Current contents of a storage owner.
    Val store(const Tensor* s) {
        auto it = storage.find(s);
        return it != storage.end() ? it->second : val.at(s);
    }

    // Elements [start, stop) of storage s as it is now (`flat`: its current flat contents). A
    // leaf that this graph writes into (the KV cache) is read as the window of its bound memory
    // with this graph's writes applied to the window only: the plugin then materializes the
    // rows a reader reads (the attended positions), not the whole storage per write. Writes
    // outside the window land in one spare element past it, cut off after.
    Val window(const Tensor* s, Val flat, Val start, Val stop) {
        auto w = writes.find(s);
        if (w == writes.end() || !leaf_index.count(s)) return slice(flat, start, stop, 0);
        Val cur = slice(reshape(val.at(s), i64c({-1})), start, stop, 0);
        Val len = std::make_shared<op::v1::Subtract>(stop, start);
        Val spare = std::make_shared<op::v3::Broadcast>(
            op::v0::Constant::create(cur.get_element_type(), ov::Shape{}, {0}), i64c({1}));
        cur = std::make_shared<op::v0::Concat>(ov::OutputVector{cur, spare}, 0);
        for (const auto& [idx, vals] : w->second) {
            Val inside = std::make_shared<op::v1::LogicalAnd>(
                std::make_shared<op::v1::GreaterEqual>(idx, start),
                std::make_shared<op::v1::Less>(idx, stop));
            Val at = std::make_shared<op::v1::Select>(
                inside, std::make_shared<op::v1::Subtract>(idx, start), len);
            cur = std::make_shared<op::v3::ScatterUpdate>(cur, at, vals, i64s(0));
        }
        return slice(cur, i64c({0}), len, 0);
    }

    // t's elements from its storage owner's flat contents, by its byte offset and strides.
    Expected<Val> strided(const Tensor* t) {
        const Tensor* s = t->storage();
        const size_t es = type_size(t->type);
        if (is_quantized(t->type) || s->type != t->type) {
            return Status::errorf("OPENVINO: view '%s' of another type", t->name);
        }
        if (t->view_offs % es) return Status::errorf("OPENVINO: view '%s' misaligned", t->name);
        const int64_t offs = static_cast<int64_t>((t == s ? 0 : t->view_offs) / es);
        Val flat = reshape(store(s), i64c({-1}));
        if (t->is_contiguous()) {
            Val start = i64c({offs});
            Val stop = std::make_shared<op::v1::Add>(start, numel(t));
            return reshape(window(s, flat, start, stop), shape4(t));
        }
        struct D {
            int d;
            int64_t stride;
        };
        std::vector<D> ds;
        for (int d = 0; d < kMaxDims; d++) {
            if (t->ne[d] == 1 && t->dim_sym[d] == kDimFixed) continue;
            if (t->nb[d] % es)
                return Status::errorf("OPENVINO: view '%s' stride misaligned", t->name);
            ds.push_back({d, static_cast<int64_t>(t->nb[d] / es)});
        }
        std::sort(ds.begin(), ds.end(), [](const D& a, const D& b) { return a.stride > b.stride; });
        if (ds.empty()) return reshape(slice(flat, i64c({offs}), i64c({offs + 1}), 0), shape4(t));
        std::vector<int64_t> inner;  // extents of the reshape after the outermost
        for (size_t j = 0; j + 1 < ds.size(); j++) {
            if (ds[j + 1].stride == 0 || ds[j].stride % ds[j + 1].stride ||
                ds[j].stride / ds[j + 1].stride < t->ne[ds[j + 1].d]) {
                return Status::errorf("OPENVINO: view '%s' has overlapping or uneven strides",
                                      t->name);
            }
            inner.push_back(ds[j].stride / ds[j + 1].stride);
        }
        const int64_t last = ds.back().stride;
        if (last == 0) return Status::errorf("OPENVINO: view '%s' broadcasts (stride 0)", t->name);
        inner.push_back(last);
        // flat[offs : offs + n_outer * stride_outer] as [n_outer, inner...]
        Val n_outer = dim(t, ds[0].d);
        Val start = i64c({offs});
        Val len = std::make_shared<op::v1::Multiply>(n_outer, i64c({ds[0].stride}));
        // A view whose last outer row ends before the storage does (a strided view of the
        // last rows) reads past the end of a whole row: pad the storage with zeros there
        // (never read: the inner slices stop before them).
        const int64_t need = offs + ds[0].stride * t->ne[ds[0].d];
        int64_t have = s->nelements();
        if (s->op == Op::NONE && !s->is_contiguous()) {
            size_t span = 0;
            if (!tensor_span(s, &span))
                return Status::errorf("OPENVINO: leaf '%s' malformed", s->name);
            have = static_cast<int64_t>(span / es);
        }
        if (need > have) {
            if (any_dynamic(s) || any_dynamic(t)) {
                return Status::errorf("OPENVINO: view '%s' past its dynamic storage", t->name);
            }
            Val zeros = op::v0::Constant::create(
                flat.get_element_type(), ov::Shape{static_cast<size_t>(need - have)},
                std::vector<float>(static_cast<size_t>(need - have), 0.0f));
            flat = std::make_shared<op::v0::Concat>(ov::OutputVector{flat, zeros}, 0);
        }
        Val cur = need > have ? slice(flat, start, std::make_shared<op::v1::Add>(start, len), 0)
                              : window(s, flat, start, std::make_shared<op::v1::Add>(start, len));
        cur = reshape(cur,
                      std::make_shared<op::v0::Concat>(ov::OutputVector{n_outer, i64c(inner)}, 0));
        for (size_t j = 1; j < ds.size(); j++) {
            cur = slice(cur, i64c({0}), dim(t, ds[j].d), static_cast<int64_t>(j));
        }
        cur = slice(cur, i64c({0}), i64c({1}), static_cast<int64_t>(ds.size()));
        // Axes are in stride order; put them in ferry-dim order (outermost dim first).
        std::vector<int64_t> order(ds.size() + 1);
        std::vector<size_t> idx(ds.size());
        for (size_t j = 0; j < ds.size(); j++) idx[j] = j;
        std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return ds[a].d > ds[b].d; });
        for (size_t j = 0; j < ds.size(); j++) order[j] = static_cast<int64_t>(idx[j]);
        order[ds.size()] = static_cast<int64_t>(ds.size());
        return reshape(transpose(cur, order), shape4(t));
    }

    // Writes `values` (dense, t's logical shape) into t's storage: updates the storage's value
    // for later readers and, for a leaf, emits the (index, value) results stored after the run.
    Status write(const Tensor* t, Val values, Val flat_index) {
        const Tensor* s = t->storage();
        Val vals = reshape(to(values, ov_type(s->type)), i64c({-1}));
        // The plugin's f32 -> bf16 conversion does not round to nearest even as ferry's does:
        // bf16 values leave the model as f32 and are rounded on the host (backend store()).
        Val out_vals = s->type == Type::BF16 ? reshape(f32(values), i64c({-1})) : vals;
        Val flat = reshape(store(s), i64c({-1}));
        Val upd = std::make_shared<op::v3::ScatterUpdate>(flat, flat_index, vals, i64s(0));
        storage[s] = reshape(upd, shape4(s));
        writes[s].push_back({flat_index, vals});
        auto li = leaf_index.find(s);
        if (li != leaf_index.end()) {
            results.push_back(std::make_shared<op::v0::Result>(flat_index));
            plan.outputs.push_back({ModelPlan::Output::WriteIndex, li->second});
            results.push_back(std::make_shared<op::v0::Result>(out_vals));
            plan.outputs.push_back({ModelPlan::Output::WriteValue, li->second});
        }
        return Status::ok();
    }
    // Flat element offset (in the storage) of element (0, 0, 0, 0) of t.
    int64_t base_elem(const Tensor* t) const {
        return t->view_src ? static_cast<int64_t>(t->view_offs / type_size(t->type)) : 0;
    }
};

// Repeats dims of v ([ne3, ne2, ne1, ne0] of `from`) so they match `to_ne`, where a larger
// extent is a multiple: tiled (x[i % n], as ADD/MUL/SOFT_MAX broadcast) or each element
// repeated (x[i / r], as MUL_MAT / FLASH_ATTN_EXT broadcast). Extents 1 broadcast as they are.
Val expand(Val v, const Tensor* from, const int64_t* to_ne, bool interleave, int first_dim = 0) {
    for (int d = first_dim; d < kMaxDims; d++) {
        const int64_t n = from->ne[d], want = to_ne[d];
        if (n == want || n == 1 || from->dim_sym[d] != kDimFixed) continue;
        const int64_t r = want / n;
        const int64_t ax = 3 - d;
        if (!interleave) {
            std::vector<int64_t> reps(4, 1);
            reps[static_cast<size_t>(ax)] = r;
            v = std::make_shared<op::v0::Tile>(v, i64c(reps));
        } else {
            // [.., n, ..] -> [.., n, r, ..] -> [.., n*r, ..]
            Val u = std::make_shared<op::v0::Unsqueeze>(v, i64c({ax + 1}));
            Val sh = std::make_shared<op::v3::ShapeOf>(u, ov::element::i64);
            std::vector<int64_t> mul(5, 1);
            mul[static_cast<size_t>(ax + 1)] = r;
            Val tgt = std::make_shared<op::v1::Multiply>(sh, i64c(mul));
            u = std::make_shared<op::v3::Broadcast>(u, tgt);
            Val sh4 = std::make_shared<op::v3::ShapeOf>(v, ov::element::i64);
            std::vector<int64_t> mul4(4, 1);
            mul4[static_cast<size_t>(ax)] = r;
            v = reshape(u, std::make_shared<op::v1::Multiply>(sh4, i64c(mul4)));
        }
    }
    return v;
}

bool is_weight(const Tensor* t) {
    return (t->flags & kTensorParam) || (t->storage()->flags & kTensorParam);
}

using TranslateFn = Status (*)(Tr&, const Tensor*);
using SupportsFn = bool (*)(const Tensor*, std::string*);

bool fail(std::string* why, const char* msg) {
    if (why) *why = msg;
    return false;
}

// --- supports ---

bool float_srcs(const Tensor* t, std::string* why) {
    for (int i = 0; i < kMaxSrc && t->src[i]; i++) {
        const Type ty = t->src[i]->type;
        if (ty != Type::F32 && ty != Type::F16 && ty != Type::BF16) {
            return fail(why, "sources must be f32, f16 or bf16");
        }
    }
    return true;
}
bool sup_none(const Tensor*, std::string* why) {
    return fail(why, "not an op");
}
bool sup_any(const Tensor*, std::string*) {
    return true;
}
bool sup_view(const Tensor* t, std::string* why) {
    if (is_quantized(t->type)) return fail(why, "views of quantized tensors");
    return true;
}
bool sup_float(const Tensor* t, std::string* why) {
    return float_srcs(t, why);
}
bool sup_cpy(const Tensor* t, std::string* why) {
    if (!plain(t->src[0]->type) || !plain(t->src[1]->type)) return fail(why, "quantized copies");
    if ((t->src[0]->type == Type::I32) != (t->src[1]->type == Type::I32)) {
        return fail(why, "copies between i32 and floats");
    }
    return true;
}
bool sup_cont(const Tensor* t, std::string* why) {
    if (!plain(t->type)) return fail(why, "quantized tensors");
    return true;
}
bool sup_get_rows(const Tensor* t, std::string* why) {
    // Any type: quantized weights are converted once (prepare_weights) or dequantized on the
    // host per run.
    if (t->src[0]->type == Type::I32) return true;
    return type_traits(t->src[0]->type).to_float != nullptr || fail(why, "no dequantizer");
}
bool sup_set_rows(const Tensor* t, std::string* why) {
    if (!plain(t->src[0]->type) || t->src[0]->type == Type::I32) {
        return fail(why, "destinations must be f32, f16 or bf16");
    }
    return float_srcs(t->src[1], why) || true;
}
bool sup_mul_mat(const Tensor* t, std::string* why) {
    if (!plain(t->src[1]->type) || t->src[1]->type == Type::I32)
        return fail(why, "b must be float");
    if (t->src[0]->type == Type::I32) return fail(why, "i32 weights");
    return type_traits(t->src[0]->type).to_float != nullptr || fail(why, "no dequantizer");
}
bool sup_argmax(const Tensor* t, std::string* why) {
    return float_srcs(t, why);
}

// --- translators ---

Status tr_none(Tr&, const Tensor* t) {
    return Status::errorf("OPENVINO: '%s' has no op", t->name);
}

Status tr_reshape(Tr& tr, const Tensor* t) {
    tr.val[t] = reshape(tr.v(t->src[0]), tr.shape4(t));
    return Status::ok();
}

Status tr_permute(Tr& tr, const Tensor* t) {
    int axes[kMaxDims] = {1, 0, 2, 3};
    if (t->op == Op::PERMUTE) {
        for (int i = 0; i < kMaxDims; i++) axes[i] = t->op_params[i];
    }
    // Source dim i goes to result dim axes[i]; OpenVINO axis of ferry dim k is 3 - k.
    std::vector<int64_t> order(4);
    for (int i = 0; i < kMaxDims; i++) order[static_cast<size_t>(3 - axes[i])] = 3 - i;
    tr.val[t] = transpose(tr.v(t->src[0]), order);
    return Status::ok();
}

Status tr_view(Tr& tr, const Tensor* t) {
    Expected<Val> r = tr.strided(t);
    if (!r) return r.status();
    tr.val[t] = *r;
    return Status::ok();
}

Status tr_cont(Tr& tr, const Tensor* t) {
    tr.val[t] = tr.v(t->src[0]);
    return Status::ok();
}

Status tr_cpy(Tr& tr, const Tensor* t) {
    const Tensor* dst = t->src[1];
    if (tr.any_dynamic(dst))
        return Status::errorf("OPENVINO: CPY '%s' into a dynamic shape", t->name);
    Val vals = reshape(to(tr.v(t->src[0]), ov_type(dst->type)), tr.shape4(dst));
    // Flat storage index of every destination element, in logical order.
    const size_t es = type_size(dst->type);
    std::vector<int64_t> idx;
    idx.reserve(static_cast<size_t>(dst->nelements()));
    const int64_t b = tr.base_elem(t);
    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < dst->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < dst->ne[0]; i0++)
                    idx.push_back(b + static_cast<int64_t>((i0 * t->nb[0] + i1 * t->nb[1] +
                                                            i2 * t->nb[2] + i3 * t->nb[3]) /
                                                           es));
    FERRY_TRY(tr.write(t, vals, i64c(idx)));
    tr.val[t] = vals;
    return Status::ok();
}

Status tr_get_rows(Tr& tr, const Tensor* t) {
    const Tensor* A = t->src[0];
    // Rows of all matrices as one [A3*A2*A1, A0] table, indexed by row + (k*A2 + j)*A1: a
    // plain gather (the CPU plugin crashes on some Gathers with batch dims).
    Val a;
    if (A->extra && is_weight(A) && A->ne[2] == 1 && A->ne[3] == 1) {
        // A converted weight straight into the Gather (no reshape between), the pattern the CPU
        // plugin gathers from compressed rows with instead of folding the table into f32.
        a = tr.matrix(A);
    } else {
        a = reshape(tr.v(A), std::make_shared<op::v0::Concat>(
                                 ov::OutputVector{i64c({-1}), tr.dim(A, 0)}, 0));
    }
    Val idx = std::make_shared<op::v0::Squeeze>(tr.v(t->src[1]), i64c({0}));  // [I2, I1, I0]
    if (A->ne[2] > 1 || A->ne[3] > 1) {
        if (A->dim_sym[1] || A->dim_sym[2] || A->dim_sym[3]) {
            return Status::errorf("OPENVINO: GET_ROWS '%s' of dynamic matrices", t->name);
        }
        std::vector<int32_t> base;
        for (int64_t k = 0; k < A->ne[3]; k++)
            for (int64_t j = 0; j < A->ne[2]; j++)
                base.push_back(static_cast<int32_t>((k * A->ne[2] + j) * A->ne[1]));
        idx = std::make_shared<op::v1::Add>(
            idx,
            op::v0::Constant::create(
                ov::element::i32,
                ov::Shape{static_cast<size_t>(A->ne[3]), static_cast<size_t>(A->ne[2]), 1}, base));
    }
    Val r = std::make_shared<op::v8::Gather>(a, idx, i64s(0), 0);  // [I2, I1, I0, A0]
    tr.val[t] = t->type == Type::I32 ? r : f32(r);
    return Status::ok();
}

Status tr_set_rows(Tr& tr, const Tensor* t) {
    const Tensor* dst = t->src[0];
    const Tensor* src = t->src[1];
    if (t->nb[0] != type_size(t->type)) {
        return Status::errorf("OPENVINO: SET_ROWS '%s' into strided rows", t->name);
    }
    const size_t es = type_size(t->type);
    const int64_t K = src->ne[3], J = src->ne[2], C = src->ne[0];
    if (src->dim_sym[2] || src->dim_sym[3] || src->dim_sym[0]) {
        return Status::errorf("OPENVINO: SET_ROWS '%s' with dynamic matrices", t->name);
    }
    // Flat index of element c of row i of matrix (j, k): base + idx*s1 + j*s2 + k*s3 + c*s0.
    Val rows = to(tr.v(t->src[2]), ov::element::i64);  // [1, K, J, n]
    rows = std::make_shared<op::v0::Squeeze>(rows, i64c({0}));
    rows = std::make_shared<op::v1::Multiply>(rows, i64s(static_cast<int64_t>(t->nb[1] / es)));
    std::vector<int64_t> grid;
    for (int64_t k = 0; k < K; k++)
        for (int64_t j = 0; j < J; j++)
            grid.push_back(tr.base_elem(t) +
                           static_cast<int64_t>((j * t->nb[2] + k * t->nb[3]) / es));
    Val g = op::v0::Constant::create(
        ov::element::i64, ov::Shape{static_cast<size_t>(K), static_cast<size_t>(J), 1}, grid);
    rows = std::make_shared<op::v1::Add>(rows, g);                // [K, J, n]
    rows = std::make_shared<op::v0::Unsqueeze>(rows, i64c({3}));  // [K, J, n, 1]
    std::vector<int64_t> cols(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; c++) cols[static_cast<size_t>(c)] = c;
    Val flat = reshape(std::make_shared<op::v1::Add>(rows, i64c(cols)), i64c({-1}));
    // The rows and their values as the storage will hold them, rounded to its type: the CPU
    // plugin computes in f32 and drops a Convert to f16 and back inside a model, so an f16
    // storage's rounding is made in f32 arithmetic (Veltkamp: x rounded to the 11 significant
    // bits of f16, to nearest; f16's range limits aside, which K and V rows stay far from).
    Val row_vals = reshape(tr.vf(src), i64c({-1, C}));
    if (dst->type == Type::F16) {
        Val big = std::make_shared<op::v1::Multiply>(row_vals, f32s(8193.0f));  // (2^13 + 1) x
        Val diff = std::make_shared<op::v1::Subtract>(row_vals, big);
        row_vals = std::make_shared<op::v1::Add>(big, diff);
    }
    tr.row_writes[t] = {reshape(to(tr.v(t->src[2]), ov::element::i64), i64c({-1})), row_vals};
    FERRY_TRY(tr.write(t, tr.v(src), flat));
    Expected<Val> r = tr.strided(t);
    if (!r) return r.status();
    tr.val[t] = *r;
    return Status::ok();
}

Status tr_binary(Tr& tr, const Tensor* t) {
    Val a = tr.vf(t->src[0]);
    Val b = expand(tr.vf(t->src[1]), t->src[1], t->src[0]->ne, false);
    if (t->op == Op::ADD) {
        tr.val[t] = std::make_shared<op::v1::Add>(a, b);
    } else {
        tr.val[t] = std::make_shared<op::v1::Multiply>(a, b);
    }
    return Status::ok();
}

Status tr_scale(Tr& tr, const Tensor* t) {
    Val r = std::make_shared<op::v1::Multiply>(tr.vf(t->src[0]), f32s(t->param_f(0)));
    if (t->param_f(1) != 0.0f) r = std::make_shared<op::v1::Add>(r, f32s(t->param_f(1)));
    tr.val[t] = r;
    return Status::ok();
}

Status tr_norm(Tr& tr, const Tensor* t) {
    Val x = tr.vf(t->src[0]);
    Val axis = i64c({3});
    if (t->op == Op::NORM) {
        x = std::make_shared<op::v1::Subtract>(x,
                                               std::make_shared<op::v1::ReduceMean>(x, axis, true));
    }
    Val ms =
        std::make_shared<op::v1::ReduceMean>(std::make_shared<op::v1::Multiply>(x, x), axis, true);
    Val inv =
        std::make_shared<op::v0::Sqrt>(std::make_shared<op::v1::Add>(ms, f32s(t->param_f(0))));
    tr.val[t] = std::make_shared<op::v1::Divide>(x, inv);
    return Status::ok();
}

Status tr_mul_mat(Tr& tr, const Tensor* t) {
    const Tensor* A = t->src[0];
    const Tensor* B = t->src[1];
    Val a = tr.vf(A);
    if (A->extra && is_weight(A) && A->ne[2] == 1 && A->ne[3] == 1) {
        // A converted weight straight into the product, as the plugin's pattern wants it.
        a = tr.matrix(A);
    } else if (A->ne[2] == 1 && A->ne[3] == 1 && !A->dim_sym[2] && !A->dim_sym[3]) {
        // A plain matrix (a weight): 2-D, so the plugin sees a fully connected layer.
        a = reshape(
            a, std::make_shared<op::v0::Concat>(ov::OutputVector{tr.dim(A, 1), tr.dim(A, 0)}, 0));
    } else {
        a = expand(a, A, B->ne, true, 2);
    }
    tr.val[t] = std::make_shared<op::v0::MatMul>(tr.vf(B), a, false, true);
    return Status::ok();
}

// softmax over ne0 of x + mask (mask rows sliced to x's, dims 2-3 tiled)
Val masked_softmax(Tr& tr, Val x, const Tensor* xt_shape_of, const Tensor* mask,
                   const int64_t* ne) {
    if (mask) {
        Val m = tr.vf(mask);
        Val rows = std::make_shared<op::v8::Gather>(
            std::make_shared<op::v3::ShapeOf>(x, ov::element::i64), i64c({2}), i64s(0));
        m = slice(m, i64c({0}), rows, 2);
        m = expand(m, mask, ne, false, 2);
        x = std::make_shared<op::v1::Add>(x, m);
    }
    (void)xt_shape_of;
    return std::make_shared<op::v8::Softmax>(x, 3);
}

Status tr_soft_max(Tr& tr, const Tensor* t) {
    Val x = std::make_shared<op::v1::Multiply>(tr.vf(t->src[0]), f32s(t->param_f(0)));
    tr.val[t] = masked_softmax(tr, x, t, t->src[1], t->ne);
    return Status::ok();
}

Status tr_rope(Tr& tr, const Tensor* t) {
    const Tensor* a = t->src[0];
    const int n_dims = t->op_params[0];
    const int mode = t->op_params[1];
    const int half = n_dims / 2;
    const double base = t->param_f(2), fscale = t->param_f(3);
    std::vector<float> inv(static_cast<size_t>(half));
    for (int i = 0; i < half; i++) {
        inv[static_cast<size_t>(i)] =
            static_cast<float>(fscale * std::pow(base, -2.0 * i / static_cast<double>(n_dims)));
    }
    Val freq =
        op::v0::Constant::create(ov::element::f32, ov::Shape{static_cast<size_t>(half)}, inv);
    if (t->src[2]) {
        Val ff = slice(reshape(tr.vf(t->src[2]), i64c({-1})), i64c({0}), i64c({half}), 0);
        freq = std::make_shared<op::v1::Divide>(freq, ff);
    }
    // theta [n_tokens, 1, half]: pos along ferry dim 2 (OpenVINO axis 1)
    Val pos = f32(reshape(tr.v(t->src[1]), i64c({-1, 1, 1})));
    Val theta = std::make_shared<op::v1::Multiply>(pos, freq);
    Val cs = std::make_shared<op::v0::Cos>(theta);
    Val sn = std::make_shared<op::v0::Sin>(theta);
    Val x = tr.vf(a);  // [ne3, n_tokens, n_head, D]
    Val rot = slice(x, i64c({0}), i64c({n_dims}), 3);
    Val x0, x1;
    if (mode == kRopeNeox) {
        x0 = slice(rot, i64c({0}), i64c({half}), 3);
        x1 = slice(rot, i64c({half}), i64c({n_dims}), 3);
    } else {
        Val pairs = reshape(
            rot, std::make_shared<op::v0::Concat>(
                     ov::OutputVector{tr.dim(a, 3), tr.dim(a, 2), tr.dim(a, 1), i64c({half, 2})},
                     0));  // [ne3, nt, nh, half, 2]
        x0 = std::make_shared<op::v0::Squeeze>(slice(pairs, i64c({0}), i64c({1}), 4), i64c({4}));
        x1 = std::make_shared<op::v0::Squeeze>(slice(pairs, i64c({1}), i64c({2}), 4), i64c({4}));
    }
    Val y0 = std::make_shared<op::v1::Subtract>(std::make_shared<op::v1::Multiply>(x0, cs),
                                                std::make_shared<op::v1::Multiply>(x1, sn));
    Val y1 = std::make_shared<op::v1::Add>(std::make_shared<op::v1::Multiply>(x0, sn),
                                           std::make_shared<op::v1::Multiply>(x1, cs));
    Val y;
    if (mode == kRopeNeox) {
        y = std::make_shared<op::v0::Concat>(ov::OutputVector{y0, y1}, 3);
    } else {
        y = std::make_shared<op::v0::Concat>(
            ov::OutputVector{std::make_shared<op::v0::Unsqueeze>(y0, i64c({4})),
                             std::make_shared<op::v0::Unsqueeze>(y1, i64c({4}))},
            4);
        y = reshape(
            y, std::make_shared<op::v0::Concat>(
                   ov::OutputVector{tr.dim(a, 3), tr.dim(a, 2), tr.dim(a, 1), i64c({n_dims})}, 0));
    }
    if (n_dims < a->ne[0]) {
        Val pass = slice(x, i64c({n_dims}), i64c({a->ne[0]}), 3);
        y = std::make_shared<op::v0::Concat>(ov::OutputVector{y, pass}, 3);
    }
    tr.val[t] = y;
    return Status::ok();
}

std::atomic<bool> g_attention_in_place{true};

// A K or V operand that reads a KV cache in place: a view of whole rows [D, n_kv, G] (heads
// side by side in a row) of the SET_ROWS result on a leaf bound by its first n_kv rows, the only
// write into that leaf in this graph.
struct CacheOperand {
    const Tensor* leaf = nullptr;
    const Tensor* index = nullptr;  // the SET_ROWS row indices
    Val window;                     // the bound rows as [n_kv, G, D] (the cache's own type)
    Val rows;                       // the rows written: i64 [n]
    Val values;                     // their values as stored, f32 [n, G, D]
    Val n_kv;                       // i64 [1]
};

bool cache_operand(Tr& tr, const Tensor* view, CacheOperand* out) {
    if (view->op != Op::VIEW || view->view_offs != 0 || view->ne[3] != 1) return false;
    const Tensor* st = view->src[0];
    if (!st || st->op != Op::SET_ROWS || st->view_offs != 0) return false;
    const Tensor* s = st->src[0];
    if (s->op != Op::NONE || (s->type != Type::F32 && s->type != Type::F16)) return false;
    auto w = tr.windowed.find(s);
    auto rw = tr.row_writes.find(st);
    auto wr = tr.writes.find(s);
    if (w == tr.windowed.end() || rw == tr.row_writes.end() || wr == tr.writes.end() ||
        wr->second.size() != 1) {
        return false;
    }
    const Tensor* src = st->src[1];
    const size_t es = type_size(s->type);
    const int64_t D = view->ne[0], G = view->ne[2];
    if (src->ne[0] != s->ne[0] || src->ne[2] != 1 || src->ne[3] != 1 || view->nb[0] != es ||
        view->nb[1] != s->nb[1] || view->dim_sym[1] != w->second ||
        view->nb[2] != static_cast<size_t>(D) * es || D * G != s->ne[0] ||
        view->dim_sym[0] != kDimFixed || view->dim_sym[2] != kDimFixed) {
        return false;
    }
    out->leaf = s;
    out->index = st->src[2];
    out->n_kv = tr.sym_param(w->second);
    out->window = reshape(tr.val.at(s), i64c({-1, G, D}));
    out->rows = rw->second.rows;
    out->values = reshape(rw->second.values, i64c({-1, G, D}));
    return true;
}

// Attention over a KV cache read in place (cache_operand): the scores and the weighted sum
// read the bound rows of the cache as they were before this graph, and the rows this graph
// writes (the step's tokens) enter apart: one softmax runs over the old rows' scores (the
// stale rows where the new ones go masked to -inf) and the new rows' side by side, and the
// weighted sum adds the old rows' part and the new rows'. So the plugin makes no copy of the
// window with the new rows scattered in, and the query heads that share a KV head are one
// product (no repeated copies of K and V); what it still does to the window per step is the
// one pass that lays it out head-major for its products (and converts f16 to f32).
// (Positions repeated within one step would be attended twice; the reference keeps the last.)
Status attend_in_place(Tr& tr, const Tensor* t, const CacheOperand& kc, const CacheOperand& vc) {
    const Tensor* q = t->src[0];
    const Tensor* k = t->src[1];
    const Tensor* v = t->src[2];
    const int64_t H = q->ne[2], G = k->ne[2], D = k->ne[0], Dv = v->ne[0];
    Val nq = tr.dim(q, 1);
    Val n_kv = kc.n_kv;
    // [G, r*n_q, D]: query head h = g*r + j reads KV head g.
    Val qg = reshape(tr.vf(q), i64c({G, -1, D}));
    Val kw = transpose(f32(kc.window), {1, 0, 2});  // [G, n_kv, D]
    Val kn = transpose(kc.values, {1, 0, 2});       // [G, n, D]
    auto per_head = [&](Val x, Val cols) {          // [G, r*n_q, c] -> [1, H, n_q, c]
        return reshape(
            x, std::make_shared<op::v0::Concat>(ov::OutputVector{i64c({1, H}), nq, cols}, 0));
    };
    auto grouped = [&](Val x, Val cols) {  // [1, H, n_q, c] -> [G, r*n_q, c]
        return reshape(x,
                       std::make_shared<op::v0::Concat>(ov::OutputVector{i64c({G, -1}), cols}, 0));
    };
    Val n_new = std::make_shared<op::v3::ShapeOf>(kc.rows, ov::element::i64);
    Val scale = f32s(t->param_f(0));
    Val s_old = std::make_shared<op::v1::Multiply>(
        per_head(std::make_shared<op::v0::MatMul>(qg, kw, false, true), n_kv), scale);
    Val s_new = std::make_shared<op::v1::Multiply>(
        per_head(std::make_shared<op::v0::MatMul>(qg, kn, false, true), n_new), scale);
    // Column of each new row in the window (rows past it are not attended, as the reference's
    // view would not reach them: -inf). The stale rows at those columns get -inf, a mask of
    // n_kv floats: the scores are never copied to put the new ones in their place.
    Val inside = std::make_shared<op::v1::Less>(kc.rows, n_kv);
    Val at = std::make_shared<op::v1::Select>(inside, kc.rows, n_kv);  // n_kv: a spare column
    const float inf = std::numeric_limits<float>::infinity();
    Val n_kv1 = std::make_shared<op::v1::Add>(n_kv, i64c({1}));
    Val stale = std::make_shared<op::v3::ScatterUpdate>(
        std::make_shared<op::v3::Broadcast>(f32s(0.0f), n_kv1), at,
        std::make_shared<op::v3::Broadcast>(f32s(-inf), n_new), i64s(0));
    s_old = std::make_shared<op::v1::Add>(s_old, slice(stale, i64c({0}), n_kv, 0));
    s_new = std::make_shared<op::v1::Add>(
        s_new, std::make_shared<op::v1::Select>(inside, f32s(0.0f), f32s(-inf)));
    if (const Tensor* mask = t->src[3]) {
        // The mask's rows for the queries, its columns for the old rows and the new rows.
        const int64_t sne[4] = {k->ne[1], q->ne[1], q->ne[2], q->ne[3]};
        Val m = slice(tr.vf(mask), i64c({0}), nq, 2);
        m = expand(m, mask, sne, false, 2);
        s_old = std::make_shared<op::v1::Add>(s_old, m);
        s_new = std::make_shared<op::v1::Add>(
            s_new, std::make_shared<op::v8::Gather>(
                       m, std::make_shared<op::v1::Select>(inside, kc.rows, i64s(0)), i64s(3)));
    }
    // One softmax over the old rows' scores and the new rows' side by side.
    Val p = std::make_shared<op::v8::Softmax>(
        std::make_shared<op::v0::Concat>(ov::OutputVector{s_old, s_new}, 3), 3);
    Val p_old = slice(p, i64c({0}), n_kv, 3);
    Val p_new = slice(p, n_kv, i64c({std::numeric_limits<int64_t>::max()}), 3);
    Val vw = transpose(f32(vc.window), {1, 0, 2});  // [G, n_kv, Dv]
    Val vn = transpose(vc.values, {1, 0, 2});       // [G, n, Dv]
    Val o = std::make_shared<op::v1::Add>(
        std::make_shared<op::v0::MatMul>(grouped(p_old, n_kv), vw),
        std::make_shared<op::v0::MatMul>(grouped(p_new, n_new), vn));  // [G, r*n_q, Dv]
    o = per_head(o, i64c({Dv}));                                       // [1, H, n_q, Dv]
    tr.val[t] = transpose(o, {0, 2, 1, 3});                            // [1, n_q, H, Dv]
    tr.plan.attention_in_place++;
    return Status::ok();
}

Status tr_flash_attn(Tr& tr, const Tensor* t) {
    const Tensor* q = t->src[0];
    const Tensor* k = t->src[1];
    const Tensor* v = t->src[2];
    CacheOperand kc, vc;
    if (g_attention_in_place.load() && q->ne[3] == 1 && k->ne[2] == v->ne[2] && k->ne[2] > 0 &&
        q->ne[2] % k->ne[2] == 0 && q->dim_sym[2] == kDimFixed && q->dim_sym[0] == kDimFixed &&
        v->dim_sym[0] == kDimFixed && cache_operand(tr, k, &kc) && cache_operand(tr, v, &vc) &&
        kc.leaf != vc.leaf && kc.index == vc.index) {
        return attend_in_place(tr, t, kc, vc);
    }
    // Heads of k/v repeated to q's (head h reads kv head h / (n_head / n_head_kv)).
    Val kv_k = expand(tr.vf(k), k, q->ne, true, 2);                         // [ne3, H, n_kv, D]
    Val kv_v = expand(tr.vf(v), v, q->ne, true, 2);                         // [ne3, H, n_kv, Dv]
    Val s = std::make_shared<op::v0::MatMul>(tr.vf(q), kv_k, false, true);  // [ne3, H, n_q, n_kv]
    s = std::make_shared<op::v1::Multiply>(s, f32s(t->param_f(0)));
    const int64_t sne[4] = {k->ne[1], q->ne[1], q->ne[2], q->ne[3]};
    Val p = masked_softmax(tr, s, t, t->src[3], sne);
    Val o = std::make_shared<op::v0::MatMul>(p, kv_v, false, false);  // [ne3, H, n_q, Dv]
    tr.val[t] = transpose(o, {0, 2, 1, 3});                           // [ne3, n_q, H, Dv]
    return Status::ok();
}

Val gelu_tanh(Val x) {
    return std::make_shared<op::v7::Gelu>(x, op::GeluApproximationMode::TANH);
}
Val silu(Val x) {
    return std::make_shared<op::v4::Swish>(x);
}

Status tr_unary(Tr& tr, const Tensor* t) {
    Val x = tr.vf(t->src[0]);
    tr.val[t] = t->op == Op::SILU ? silu(x) : gelu_tanh(x);
    return Status::ok();
}

Status tr_glu(Tr& tr, const Tensor* t) {
    Val x = tr.vf(t->src[0]);
    Val a = t->op == Op::SWIGLU ? silu(x) : gelu_tanh(x);
    tr.val[t] = std::make_shared<op::v1::Multiply>(a, tr.vf(t->src[1]));
    return Status::ok();
}

Status tr_argmax(Tr& tr, const Tensor* t) {
    auto topk =
        std::make_shared<op::v11::TopK>(tr.vf(t->src[0]), i64s(1), 3, op::TopKMode::MAX,
                                        op::TopKSortType::SORT_VALUES, ov::element::i32, true);
    tr.val[t] = reshape(topk->output(1), tr.shape4(t));
    return Status::ok();
}

// NaN made -inf first (TopK's order for NaN is its own), a stable TopK (equal values keep the
// order of their indices), then the values and the indices as f32 side by side along the row.
Status tr_top_k(Tr& tr, const Tensor* t) {
    Val x = tr.vf(t->src[0]);
    x = std::make_shared<op::v1::Select>(std::make_shared<op::v10::IsNaN>(x),
                                         f32s(-std::numeric_limits<float>::infinity()), x);
    auto topk =
        std::make_shared<op::v11::TopK>(x, i64s(t->op_params[0]), 3, op::TopKMode::MAX,
                                        op::TopKSortType::SORT_VALUES, ov::element::i32, true);
    Val ids = std::make_shared<op::v0::Convert>(topk->output(1), ov::element::f32);
    tr.val[t] = reshape(std::make_shared<op::v0::Concat>(ov::OutputVector{topk->output(0), ids}, 3),
                        tr.shape4(t));
    return Status::ok();
}

Status tr_sum_rows(Tr& tr, const Tensor* t) {
    tr.val[t] = std::make_shared<op::v1::ReduceSum>(tr.vf(t->src[0]), i64c({3}), true);
    return Status::ok();
}

struct Translator {
    Op op;
    SupportsFn supports;
    TranslateFn translate;
};

// Which translator each op uses; the table below is generated from ops.def, so an op added
// there without an entry here fails to compile.
#define OV_NONE sup_none, tr_none
#define OV_CPY sup_cpy, tr_cpy
#define OV_CONT sup_cont, tr_cont
#define OV_RESHAPE sup_view, tr_reshape
#define OV_VIEW sup_view, tr_view
#define OV_PERMUTE sup_view, tr_permute
#define OV_TRANSPOSE sup_view, tr_permute
#define OV_GET_ROWS sup_get_rows, tr_get_rows
#define OV_SET_ROWS sup_set_rows, tr_set_rows
#define OV_ADD sup_float, tr_binary
#define OV_MUL sup_float, tr_binary
#define OV_SCALE sup_float, tr_scale
#define OV_RMS_NORM sup_float, tr_norm
#define OV_NORM sup_float, tr_norm
#define OV_MUL_MAT sup_mul_mat, tr_mul_mat
#define OV_SOFT_MAX sup_float, tr_soft_max
#define OV_ROPE sup_any, tr_rope
#define OV_FLASH_ATTN_EXT sup_float, tr_flash_attn
#define OV_SILU sup_float, tr_unary
#define OV_GELU sup_float, tr_unary
#define OV_SWIGLU sup_float, tr_glu
#define OV_GEGLU sup_float, tr_glu
#define OV_ARGMAX sup_argmax, tr_argmax
#define OV_SUM_ROWS sup_float, tr_sum_rows
#define OV_TOP_K sup_float, tr_top_k

constexpr Translator kTranslators[] = {
#define X(name, nmin, nmax, flags) {Op::name, OV_##name},
#include "ferry/ops.def"
#undef X
};
static_assert(sizeof(kTranslators) / sizeof(kTranslators[0]) == static_cast<size_t>(Op::COUNT));

const Translator& translator(Op op) {
    return kTranslators[static_cast<size_t>(op)];
}

// The symbol of the dynamic row count every reader of leaf s stays within, when s is a matrix
// that this graph only writes rows into (SET_ROWS) and reads through views that start at its
// first row and span whole rows up to that many (the attention's K and V views of a KV cache);
// 0 otherwise. Such a leaf is bound by those rows only: the plugin then reads (and converts,
// for f16) the attended window of the cache, not all of it.
int window_symbol(const Graph& g, const Tensor* s) {
    if (s->ne[2] != 1 || s->ne[3] != 1 || !s->is_contiguous() || !plain(s->type)) return 0;
    for (int d = 0; d < kMaxDims; d++) {
        if (s->dim_sym[d] != kDimFixed) return 0;
    }
    const size_t es = type_size(s->type);
    int symbol = 0;
    bool written = false;
    for (const Tensor* n : g.nodes) {
        // Nodes reading s other than through one of its views (whose value is windowed).
        bool refers = n->storage() == s;
        for (int i = 0; i < kMaxSrc && !refers; i++) {
            refers = n->src[i] && n->src[i]->storage() == s && n->src[i]->op != Op::VIEW;
        }
        if (!refers) continue;
        if (n->op == Op::SET_ROWS && n->src[0] == s && n->view_offs == 0) {
            written = true;
            continue;
        }
        if (n->op != Op::VIEW || n->storage() != s || n->view_offs != 0) return 0;
        // The outermost stepped dim walks whole rows over a dynamic extent; the others stay
        // inside one row.
        int outer = -1;
        for (int d = 0; d < kMaxDims; d++) {
            if (n->nb[d] == s->nb[1] && n->dim_sym[d] != kDimFixed) outer = d;
        }
        if (outer < 0 || (symbol && n->dim_sym[outer] != symbol)) return 0;
        size_t inner = es;
        for (int d = 0; d < kMaxDims; d++) {
            if (d == outer) continue;
            if (n->dim_sym[d] != kDimFixed) return 0;
            inner += static_cast<size_t>(n->ne[d] - 1) * n->nb[d];
        }
        if (inner > s->nb[1]) return 0;
        symbol = n->dim_sym[outer];
    }
    // Readers of the SET_ROWS results other than those views (e.g. an output) see all rows.
    for (const Tensor* n : g.nodes) {
        if (n->storage() == s && n->op == Op::SET_ROWS && g.is_output(n)) return 0;
    }
    return written ? symbol : 0;
}

}  // namespace

void set_attention_in_place(bool on) {
    g_attention_in_place = on;
}

bool translatable(const Tensor* node, std::string* why) {
    if (static_cast<size_t>(node->op) >= static_cast<size_t>(Op::COUNT)) return false;
    // ROPE: the rotated values of f32 only (the pairs are read as floats).
    if (node->op == Op::ROPE && !float_srcs(node, why)) {
        // pos is i32 by the op's rules: check a and the factors only.
        if (node->src[0]->type != Type::F32 || (node->src[2] && node->src[2]->type != Type::F32)) {
            return false;
        }
    }
    return translator(node->op).supports(node, why);
}

Expected<ModelPlan> translate_graph(const Graph& g) {
    Tr tr(g);
    // Leaves: weights with a prepared form become constants over it; plain-typed leaves are
    // parameters bound to ferry's memory; other quantized leaves are dequantized on the host
    // into an f32 parameter for each run.
    for (size_t i = 0; i < g.leafs.size(); i++) {
        const Tensor* t = g.leafs[i];
        tr.leaf_index[t] = static_cast<int>(i);
        if (t->extra && is_weight(t)) {
            tr.val[t] = weight_node(t, *static_cast<const PreparedWeight*>(t->extra));
            continue;
        }
        if (is_weight(t) && t->data && t->is_contiguous() && plain(t->type) &&
            t->type != Type::I32) {
            // F32/F16/BF16 weights as they are: a constant over ferry's memory.
            const ov::Shape sh{static_cast<size_t>(t->ne[3]), static_cast<size_t>(t->ne[2]),
                               static_cast<size_t>(t->ne[1]), static_cast<size_t>(t->ne[0])};
            tr.val[t] =
                f32(std::make_shared<op::v0::Constant>(ov::Tensor(ov_type(t->type), sh, t->data)));
            continue;
        }
        if (!t->is_contiguous()) {
            // Another split's strided view: its bytes as a flat parameter, read through its
            // strides like any view.
            if (!plain(t->type)) {
                return Status::errorf(ErrorCode::Unsupported,
                                      "OPENVINO: quantized leaf '%s' is not contiguous", t->name);
            }
            auto p = std::make_shared<op::v0::Parameter>(ov_type(t->type), ov::PartialShape{-1});
            p->set_friendly_name(std::string("leaf_") + std::to_string(i));
            tr.params.push_back(p);
            tr.plan.inputs.push_back({ModelPlan::Input::StridedLeaf, static_cast<int>(i), 0});
            tr.val[t] = p;
            Expected<Val> v = tr.strided(t);
            if (!v) return v.status();
            tr.val[t] = *v;
            continue;
        }
        ov::PartialShape ps{t->ne[3], t->ne[2], t->ne[1], t->ne[0]};
        for (int d = 0; d < kMaxDims; d++) {
            if (t->dim_sym[d] != kDimFixed)
                ps[static_cast<size_t>(3 - d)] = ov::Dimension::dynamic();
        }
        if (const int w = window_symbol(g, t)) {
            // Its first rows only (a KV cache: the attended window), bound in place per run.
            ps[2] = ov::Dimension::dynamic();
            auto p = std::make_shared<op::v0::Parameter>(ov_type(t->type), ps);
            p->set_friendly_name(std::string("leaf_") + std::to_string(i));
            tr.params.push_back(p);
            ModelPlan::Input in{ModelPlan::Input::Leaf, static_cast<int>(i), 0};
            in.window = w;
            tr.plan.inputs.push_back(in);
            tr.val[t] = p;
            tr.windowed[t] = w;
            continue;
        }
        const bool deq = !plain(t->type);
        auto p = std::make_shared<op::v0::Parameter>(deq ? ov::element::f32 : ov_type(t->type), ps);
        p->set_friendly_name(std::string("leaf_") + std::to_string(i));
        tr.params.push_back(p);
        tr.plan.inputs.push_back(
            {deq ? ModelPlan::Input::DequantLeaf : ModelPlan::Input::Leaf, static_cast<int>(i), 0});
        tr.val[t] = p;
    }
    for (const Tensor* t : g.nodes) {
        std::string why;
        if (!translatable(t, &why)) {
            return Status::errorf(ErrorCode::Unsupported,
                                  "OPENVINO: cannot translate %s node '%s'%s%s", op_name(t->op),
                                  t->name, why.empty() ? "" : ": ", why.c_str());
        }
        Status st = translator(t->op).translate(tr, t);
        if (!st) return st.context(strfmt("node '%s' (%s)", t->name, op_name(t->op)));
        // Every value is [ne3, ne2, ne1, ne0]: a translator that gets a shape wrong fails here,
        // naming the node, instead of computing something else.
        const ov::PartialShape ps = tr.val.at(t).get_partial_shape();
        bool ok = ps.rank().is_static() && ps.rank().get_length() == 4;
        for (int d = 0; ok && d < kMaxDims; d++) {
            const ov::Dimension& dim = ps[static_cast<size_t>(3 - d)];
            if (t->dim_sym[d] == kDimFixed && dim.is_static()) ok = dim.get_length() == t->ne[d];
        }
        if (!ok) {
            return Status::errorf("OPENVINO: node '%s' (%s) translated to shape %s, expected %s",
                                  t->name, op_name(t->op), ps.to_string().c_str(),
                                  describe(t).c_str());
        }
    }
    // Results: every node read after the graph, whose storage is a node computed here
    // (outputs that are views of leaves are in place already, written after the run).
    std::vector<char> done(g.nodes.size(), 0);
    std::unordered_map<const Tensor*, int> node_index;
    for (size_t i = 0; i < g.nodes.size(); i++) node_index[g.nodes[i]] = static_cast<int>(i);
    for (size_t i = 0; i < g.nodes.size(); i++) {
        const Tensor* t = g.nodes[i];
        if (!g.is_output(t)) continue;
        const Tensor* s = t->storage();
        auto ni = node_index.find(s);
        if (ni == node_index.end() || done[static_cast<size_t>(ni->second)]) continue;
        done[static_cast<size_t>(ni->second)] = 1;
        if (!plain(s->type)) {
            return Status::errorf(ErrorCode::Unsupported, "OPENVINO: output '%s' is quantized",
                                  s->name);
        }
        tr.results.push_back(std::make_shared<op::v0::Result>(to(tr.store(s), ov_type(s->type))));
        tr.plan.outputs.push_back({ModelPlan::Output::Node, ni->second});
    }
    for (auto& [s, p] : tr.sym) {
        tr.params.push_back(p);
        tr.plan.inputs.push_back({ModelPlan::Input::Symbol, -1, s});
    }
    if (tr.results.empty()) return Status::error("OPENVINO: graph has no outputs");
    tr.plan.model = std::make_shared<ov::Model>(tr.results, tr.params, "ferry");
    return std::move(tr.plan);
}

}  // namespace ferry::openvino
