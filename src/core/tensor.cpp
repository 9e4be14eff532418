#include "ferry/tensor.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ferry/checked.h"

namespace ferry {

namespace {

const OpInfo kOpInfo[] = {
#define X(name, nmin, nmax, flags) {#name, nmin, nmax, flags},
#include "ferry/ops.def"
#undef X
};
static_assert(sizeof(kOpInfo) / sizeof(kOpInfo[0]) == static_cast<size_t>(Op::COUNT));

}  // namespace

const OpInfo& op_info(Op op) {
    FERRY_ASSERT(static_cast<uint32_t>(op) < static_cast<uint32_t>(Op::COUNT));
    return kOpInfo[static_cast<uint32_t>(op)];
}

const OpInfo* op_info_or_null(uint32_t id) {
    if (id >= static_cast<uint32_t>(Op::COUNT)) return nullptr;
    return &kOpInfo[id];
}

Expected<Op> op_from_name(const char* name) {
    for (uint32_t i = 0; i < static_cast<uint32_t>(Op::COUNT); i++) {
        if (strcasecmp(kOpInfo[i].name, name) == 0) return static_cast<Op>(i);
    }
    return Status::errorf("unknown op '%s'", name);
}

bool tensor_span(const Tensor* t, size_t* out) {
    const TypeTraits* tr = type_traits_or_null(static_cast<uint32_t>(t->type));
    if (!tr) return false;
    for (int i = 0; i < kMaxDims; i++) {
        if (t->ne[i] < 0) return false;
    }
    if (t->ne[0] % tr->block_size != 0) return false;
    // The element count and the dense byte size must be representable even when a dimension
    // is empty or a stride is zero: kernels and validation compute them (nelements(), CPY and
    // RESHAPE element checks, scratch sizes), and a wrapped product would match a small one.
    int64_t elems = 1;
    uint64_t dense = 0;
    for (int i = 0; i < kMaxDims; i++) {
        if (!checked_mul(elems, t->ne[i], &elems)) return false;
    }
    if (!checked_mul(static_cast<uint64_t>(t->ne[0] / tr->block_size), tr->type_size, &dense)) {
        return false;
    }
    for (int i = 1; i < kMaxDims; i++) {
        if (!checked_mul(dense, static_cast<uint64_t>(t->ne[i]), &dense)) return false;
    }
    for (int i = 0; i < kMaxDims; i++) {
        if (t->ne[i] == 0) {
            *out = 0;
            return true;
        }
    }
    // Last byte reached + 1: the last block of dim 0 spans type_size bytes, not nb[0] (which
    // differs for transposed views).
    uint64_t total = 0;
    if (!checked_mul(static_cast<uint64_t>(t->ne[0] / tr->block_size - 1), t->nb[0], &total) ||
        !checked_add(total, tr->type_size, &total)) {
        return false;
    }
    for (int i = 1; i < kMaxDims; i++) {
        uint64_t extra = 0;
        if (!checked_mul(static_cast<uint64_t>(t->ne[i] - 1), t->nb[i], &extra)) return false;
        if (!checked_add(total, extra, &total)) return false;
    }
    *out = total;
    return true;
}

bool extents_fit_span(const Tensor* t) {
    size_t span = 0;
    if (!tensor_span(t, &span)) return false;
    if (span == 0) return true;  // an empty tensor reaches nothing
    const TypeTraits& tr = type_traits(t->type);
    // Dense bytes of the dimensions that do not repeat: a zero stride over a dimension longer
    // than 1 is a broadcast and adds no bytes.
    uint64_t dense = tr.type_size;
    if (t->nb[0] != 0) dense = static_cast<uint64_t>(t->ne[0] / tr.block_size) * tr.type_size;
    for (int i = 1; i < kMaxDims; i++) {
        if (t->nb[i] != 0) dense *= static_cast<uint64_t>(t->ne[i]);  // no overflow: see span
    }
    return dense <= span;
}

size_t Tensor::nbytes() const {
    size_t n = 0;
    FERRY_ASSERT(tensor_span(this, &n));
    return n;
}

size_t Tensor::row_bytes() const {
    return row_size(type, ne[0]);
}

bool Tensor::is_contiguous() const {
    const TypeTraits& tr = type_traits(type);
    // Checked products: a stride that equals a wrapped product is not contiguous.
    uint64_t want = 0;
    if (nb[0] != tr.type_size) return false;
    if (!checked_mul(nb[0], static_cast<uint64_t>(ne[0] / tr.block_size), &want) || nb[1] != want)
        return false;
    if (!checked_mul(nb[1], static_cast<uint64_t>(ne[1]), &want) || nb[2] != want) return false;
    if (!checked_mul(nb[2], static_cast<uint64_t>(ne[2]), &want) || nb[3] != want) return false;
    return true;
}

void Tensor::set_name(const std::string& n) {
    std::snprintf(name, sizeof(name), "%s", n.c_str());
}

float Tensor::param_f(int i) const {
    float f;
    std::memcpy(&f, &op_params[i], 4);
    return f;
}

void Tensor::set_param_f(int i, float v) {
    std::memcpy(&op_params[i], &v, 4);
}

bool same_shape(const Tensor* a, const Tensor* b) {
    for (int i = 0; i < kMaxDims; i++) {
        if (a->ne[i] != b->ne[i]) return false;
    }
    return true;
}

void set_contiguous_strides(Tensor* t) {
    const TypeTraits& tr = type_traits(t->type);
    t->nb[0] = tr.type_size;
    t->nb[1] = t->nb[0] * static_cast<size_t>(t->ne[0] / tr.block_size);
    for (int i = 2; i < kMaxDims; i++) t->nb[i] = t->nb[i - 1] * static_cast<size_t>(t->ne[i - 1]);
}

std::string describe(const Tensor* t) {
    const TypeTraits* tr = type_traits_or_null(static_cast<uint32_t>(t->type));
    return strfmt("'%s' [%lld, %lld, %lld, %lld] %s", t->name, static_cast<long long>(t->ne[0]),
                  static_cast<long long>(t->ne[1]), static_cast<long long>(t->ne[2]),
                  static_cast<long long>(t->ne[3]), tr ? tr->name : "unknown-type");
}

// ---------------------------------------------------------------------------------------------
// Validation

namespace {

bool row_elems_contiguous(const Tensor* t) {
    return t->nb[0] == type_size(t->type);
}
bool divides(int64_t small, int64_t big) {
    return small > 0 && big % small == 0;
}

Status check_shape_like(const Tensor* t, const Tensor* ref, const char* what) {
    if (!same_shape(t, ref)) {
        return Status::errorf("result shape must equal %s %s", what, describe(ref).c_str());
    }
    return Status::ok();
}

Status check_result(const Tensor* t, Type type, std::initializer_list<int64_t> ne) {
    if (t->type != type) {
        return Status::errorf("result type %s, expected %s", type_name(t->type), type_name(type));
    }
    int i = 0;
    for (int64_t n : ne) {
        if (t->ne[i] != n) {
            return Status::errorf("result ne[%d] = %lld, expected %lld", i,
                                  static_cast<long long>(t->ne[i]), static_cast<long long>(n));
        }
        i++;
    }
    return Status::ok();
}

Status need_type(const Tensor* s, const char* what, std::initializer_list<Type> ok) {
    for (Type t : ok) {
        if (s->type == t) return Status::ok();
    }
    return Status::errorf("%s %s has unsupported type %s", what, describe(s).c_str(),
                          type_name(s->type));
}

Status validate_view_range(const Tensor* t) {
    const Tensor* vs = t->view_src;
    if (vs->view_src != nullptr) return Status::error("view of a view (view_src must own storage)");
    size_t span = 0, src_span = 0, end = 0;
    if (!tensor_span(t, &span)) return Status::error("view shape/strides overflow");
    if (!tensor_span(vs, &src_span)) return Status::error("viewed tensor is malformed");
    if (!checked_add(t->view_offs, span, &end) || end > src_span) {
        return Status::errorf("view [offset %zu, %zu bytes] reaches past the %zu bytes of %s",
                              t->view_offs, span, src_span, describe(vs).c_str());
    }
    const size_t align = element_alignment(t->type);
    if (t->view_offs % align != 0) {
        return Status::errorf("view offset %zu is not a multiple of %zu (%s alignment)",
                              t->view_offs, align, type_name(t->type));
    }
    for (int d = 0; d < kMaxDims; d++) {
        if (t->nb[d] % align != 0) {
            return Status::errorf("stride nb[%d] = %zu is not a multiple of %zu (%s alignment)", d,
                                  t->nb[d], align, type_name(t->type));
        }
    }
    if (is_quantized(t->type) && t->nb[0] != type_size(t->type)) {
        return Status::error("view of a quantized tensor must keep blocks contiguous");
    }
    return Status::ok();
}

Status validate_op(const Tensor* t) {
    Tensor* const* s = t->src;
    switch (t->op) {
        case Op::NONE:
            return Status::ok();
        case Op::CPY: {
            const Tensor* src = s[0];
            const Tensor* dst = s[1];
            if (src->nelements() != dst->nelements()) {
                return Status::errorf(
                    "element count %lld of %s differs from %lld of %s",
                    static_cast<long long>(src->nelements()), describe(src).c_str(),
                    static_cast<long long>(dst->nelements()), describe(dst).c_str());
            }
            const bool same = src->type == dst->type;
            if (!same && (!type_traits(src->type).to_float || !type_traits(dst->type).from_float)) {
                return Status::errorf("no conversion from %s to %s", type_name(src->type),
                                      type_name(dst->type));
            }
            if ((is_quantized(src->type) || is_quantized(dst->type)) &&
                (src->ne[0] != dst->ne[0] || !row_elems_contiguous(src) ||
                 !row_elems_contiguous(dst))) {
                return Status::error(
                    "copies to or from quantized types need equal, contiguous rows");
            }
            if (t->type != dst->type || !same_shape(t, dst)) {
                return Status::error("CPY result must be a view of its destination");
            }
            return Status::ok();
        }
        case Op::CONT:
            if (t->type != s[0]->type || t->nelements() != s[0]->nelements()) {
                return Status::error("CONT result must have the source's type and element count");
            }
            if (is_quantized(t->type) && (t->ne[0] != s[0]->ne[0] || !row_elems_contiguous(s[0]))) {
                return Status::error("CONT of a quantized tensor needs contiguous rows");
            }
            return Status::ok();
        case Op::RESHAPE:
            if (!s[0]->is_contiguous()) return Status::error("RESHAPE source must be contiguous");
            if (t->nelements() != s[0]->nelements() || t->type != s[0]->type ||
                !t->is_contiguous()) {
                return Status::error("RESHAPE must keep type and element count, contiguous");
            }
            return Status::ok();
        case Op::VIEW:
            if (t->type != s[0]->type) return Status::error("VIEW must keep the type");
            return Status::ok();
        case Op::PERMUTE: {
            bool seen[4] = {};
            for (int i = 0; i < 4; i++) {
                const int ax = t->op_params[i];
                if (ax < 0 || ax > 3 || seen[ax]) {
                    return Status::errorf("PERMUTE axes (%d, %d, %d, %d) are not a permutation",
                                          t->op_params[0], t->op_params[1], t->op_params[2],
                                          t->op_params[3]);
                }
                seen[ax] = true;
                if (t->ne[ax] != s[0]->ne[i] || t->nb[ax] != s[0]->nb[i]) {
                    return Status::error("PERMUTE result does not match its axes");
                }
            }
            if (t->type != s[0]->type) return Status::error("PERMUTE must keep the type");
            if (is_quantized(t->type) && t->op_params[0] != 0) {
                return Status::error("PERMUTE of a quantized tensor must keep dim 0");
            }
            return Status::ok();
        }
        case Op::TRANSPOSE:
            if (t->type != s[0]->type || is_quantized(t->type)) {
                return Status::error("TRANSPOSE must keep a non-quantized type");
            }
            if (t->ne[0] != s[0]->ne[1] || t->ne[1] != s[0]->ne[0] || t->nb[0] != s[0]->nb[1] ||
                t->nb[1] != s[0]->nb[0] || t->ne[2] != s[0]->ne[2] || t->ne[3] != s[0]->ne[3]) {
                return Status::error("TRANSPOSE result does not swap dims 0 and 1");
            }
            return Status::ok();
        case Op::GET_ROWS: {
            const Tensor* a = s[0];
            const Tensor* idx = s[1];
            FERRY_TRY(need_type(idx, "GET_ROWS index", {Type::I32}));
            // I32 rows gather as I32; every other type converts to F32.
            const Type out_type = a->type == Type::I32 ? Type::I32 : Type::F32;
            if (!row_elems_contiguous(a) || !row_elems_contiguous(idx)) {
                return Status::error("GET_ROWS needs contiguous rows");
            }
            if (a->ne[2] != idx->ne[1] || a->ne[3] != idx->ne[2] || idx->ne[3] != 1) {
                return Status::errorf("GET_ROWS index %s does not match source %s",
                                      describe(idx).c_str(), describe(a).c_str());
            }
            return check_result(t, out_type, {a->ne[0], idx->ne[0], idx->ne[1], idx->ne[2]});
        }
        case Op::SET_ROWS: {
            const Tensor* dst = s[0];
            const Tensor* src = s[1];
            const Tensor* idx = s[2];
            FERRY_TRY(need_type(src, "SET_ROWS source", {Type::F32}));
            FERRY_TRY(need_type(idx, "SET_ROWS index", {Type::I32}));
            if (!type_traits(dst->type).from_float) {
                return Status::errorf("SET_ROWS destination type %s", type_name(dst->type));
            }
            if (!row_elems_contiguous(dst) || !row_elems_contiguous(src) ||
                !row_elems_contiguous(idx)) {
                return Status::error("SET_ROWS needs contiguous rows");
            }
            if (src->ne[0] != dst->ne[0] || idx->ne[0] != src->ne[1] || idx->ne[1] != src->ne[2] ||
                idx->ne[2] != src->ne[3] || idx->ne[3] != 1 || dst->ne[2] != src->ne[2] ||
                dst->ne[3] != src->ne[3]) {
                return Status::errorf(
                    "SET_ROWS shapes disagree: destination %s, source %s, "
                    "index %s",
                    describe(dst).c_str(), describe(src).c_str(), describe(idx).c_str());
            }
            if (t->type != dst->type || !same_shape(t, dst)) {
                return Status::error("SET_ROWS result must be a view of its destination");
            }
            return Status::ok();
        }
        case Op::ADD:
        case Op::MUL: {
            FERRY_TRY(need_type(s[0], "operand a", {Type::F32}));
            FERRY_TRY(need_type(s[1], "operand b", {Type::F32}));
            if (!row_elems_contiguous(s[0]) || !row_elems_contiguous(s[1])) {
                return Status::error("operands need contiguous rows");
            }
            for (int d = 0; d < kMaxDims; d++) {
                if (!divides(s[1]->ne[d], s[0]->ne[d])) {
                    return Status::errorf("b %s does not broadcast to a %s (dim %d)",
                                          describe(s[1]).c_str(), describe(s[0]).c_str(), d);
                }
            }
            FERRY_TRY(check_result(t, Type::F32, {}));
            return check_shape_like(t, s[0], "a");
        }
        case Op::SCALE:
        case Op::SILU:
        case Op::GELU:
            FERRY_TRY(need_type(s[0], "operand", {Type::F32}));
            if (!row_elems_contiguous(s[0])) return Status::error("operand needs contiguous rows");
            if (t->op == Op::SCALE &&
                (!std::isfinite(t->param_f(0)) || !std::isfinite(t->param_f(1)))) {
                return Status::error("SCALE factor and bias must be finite");
            }
            FERRY_TRY(check_result(t, Type::F32, {}));
            return check_shape_like(t, s[0], "the operand");
        case Op::RMS_NORM:
        case Op::NORM: {
            FERRY_TRY(need_type(s[0], "operand", {Type::F32}));
            if (!row_elems_contiguous(s[0])) return Status::error("operand needs contiguous rows");
            const float eps = t->param_f(0);
            if (!std::isfinite(eps) || eps < 0.0f) return Status::errorf("bad eps %g", eps);
            FERRY_TRY(check_result(t, Type::F32, {}));
            return check_shape_like(t, s[0], "the operand");
        }
        case Op::MUL_MAT: {
            const Tensor* a = s[0];
            const Tensor* b = s[1];
            if (a->type == Type::I32 || !type_traits(a->type).is_storage) {
                return Status::errorf("MUL_MAT weight type %s", type_name(a->type));
            }
            FERRY_TRY(need_type(b, "MUL_MAT operand b", {Type::F32}));
            if (!row_elems_contiguous(a) || !row_elems_contiguous(b)) {
                return Status::error("MUL_MAT operands need contiguous rows");
            }
            if (a->ne[0] != b->ne[0] || !divides(a->ne[2], b->ne[2]) ||
                !divides(a->ne[3], b->ne[3])) {
                return Status::errorf("MUL_MAT shapes do not match: a %s, b %s",
                                      describe(a).c_str(), describe(b).c_str());
            }
            return check_result(t, Type::F32, {a->ne[1], b->ne[1], b->ne[2], b->ne[3]});
        }
        case Op::SOFT_MAX: {
            FERRY_TRY(need_type(s[0], "operand", {Type::F32}));
            if (!row_elems_contiguous(s[0])) return Status::error("operand needs contiguous rows");
            if (!std::isfinite(t->param_f(0)))
                return Status::error("SOFT_MAX scale must be finite");
            if (const Tensor* m = s[1]) {
                FERRY_TRY(need_type(m, "SOFT_MAX mask", {Type::F32, Type::F16}));
                if (!row_elems_contiguous(m) || m->ne[0] != s[0]->ne[0] || m->ne[1] < s[0]->ne[1] ||
                    !divides(m->ne[2], s[0]->ne[2]) || !divides(m->ne[3], s[0]->ne[3])) {
                    return Status::errorf("SOFT_MAX mask %s does not fit %s", describe(m).c_str(),
                                          describe(s[0]).c_str());
                }
            }
            FERRY_TRY(check_result(t, Type::F32, {}));
            return check_shape_like(t, s[0], "the operand");
        }
        case Op::ROPE: {
            const Tensor* a = s[0];
            const Tensor* pos = s[1];
            FERRY_TRY(need_type(a, "ROPE operand", {Type::F32}));
            FERRY_TRY(need_type(pos, "ROPE positions", {Type::I32}));
            if (!row_elems_contiguous(a) || !pos->is_contiguous() || pos->ne[0] != a->ne[2]) {
                return Status::errorf("ROPE positions %s do not match %s", describe(pos).c_str(),
                                      describe(a).c_str());
            }
            const int n_dims = t->op_params[0];
            const int mode = t->op_params[1];
            if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > a->ne[0]) {
                return Status::errorf("ROPE n_dims %d invalid for rows of %lld", n_dims,
                                      static_cast<long long>(a->ne[0]));
            }
            if (mode != kRopeNormal && mode != kRopeNeox) {
                return Status::errorf("ROPE mode %d unknown", mode);
            }
            const float base = t->param_f(2), scale = t->param_f(3);
            if (!std::isfinite(base) || base <= 0.0f || !std::isfinite(scale) || scale <= 0.0f) {
                return Status::errorf("ROPE freq_base %g / freq_scale %g invalid", base, scale);
            }
            if (const Tensor* ff = s[2]) {
                FERRY_TRY(need_type(ff, "ROPE frequency factors", {Type::F32}));
                if (!ff->is_contiguous() || ff->ne[0] < n_dims / 2) {
                    return Status::errorf("ROPE frequency factors %s: need %d contiguous values",
                                          describe(ff).c_str(), n_dims / 2);
                }
            }
            FERRY_TRY(check_result(t, Type::F32, {}));
            return check_shape_like(t, a, "the operand");
        }
        case Op::FLASH_ATTN_EXT: {
            const Tensor* q = s[0];
            const Tensor* k = s[1];
            const Tensor* v = s[2];
            FERRY_TRY(need_type(q, "query", {Type::F32}));
            FERRY_TRY(need_type(k, "key", {Type::F32, Type::F16, Type::BF16}));
            FERRY_TRY(need_type(v, "value", {Type::F32, Type::F16, Type::BF16}));
            if (!row_elems_contiguous(q) || !row_elems_contiguous(k) || !row_elems_contiguous(v)) {
                return Status::error("attention operands need contiguous rows");
            }
            if (q->ne[0] != k->ne[0] || k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2] ||
                !divides(k->ne[2], q->ne[2]) || k->ne[3] != v->ne[3] ||
                !divides(k->ne[3], q->ne[3])) {
                return Status::errorf("attention shapes disagree: q %s, k %s, v %s",
                                      describe(q).c_str(), describe(k).c_str(),
                                      describe(v).c_str());
            }
            if (!std::isfinite(t->param_f(0)))
                return Status::error("attention scale must be finite");
            if (const Tensor* m = s[3]) {
                FERRY_TRY(need_type(m, "attention mask", {Type::F32, Type::F16}));
                if (!row_elems_contiguous(m) || m->ne[0] != k->ne[1] || m->ne[1] < q->ne[1] ||
                    !divides(m->ne[2], q->ne[2]) || !divides(m->ne[3], q->ne[3])) {
                    return Status::errorf("attention mask %s does not fit k %s and q %s",
                                          describe(m).c_str(), describe(k).c_str(),
                                          describe(q).c_str());
                }
            }
            return check_result(t, Type::F32, {v->ne[0], q->ne[2], q->ne[1], q->ne[3]});
        }
        case Op::SWIGLU:
        case Op::GEGLU:
            FERRY_TRY(need_type(s[0], "operand a", {Type::F32}));
            FERRY_TRY(need_type(s[1], "operand b", {Type::F32}));
            if (!row_elems_contiguous(s[0]) || !row_elems_contiguous(s[1]) ||
                !same_shape(s[0], s[1])) {
                return Status::error("operands need equal shapes and contiguous rows");
            }
            FERRY_TRY(check_result(t, Type::F32, {}));
            return check_shape_like(t, s[0], "a");
        case Op::ARGMAX:
            FERRY_TRY(need_type(s[0], "operand", {Type::F32}));
            if (!row_elems_contiguous(s[0]) || s[0]->ne[0] == 0) {
                return Status::error("ARGMAX needs non-empty contiguous rows");
            }
            return check_result(t, Type::I32, {s[0]->ne[1], s[0]->ne[2], s[0]->ne[3], 1});
        case Op::SUM_ROWS:
            FERRY_TRY(need_type(s[0], "operand", {Type::F32}));
            if (!row_elems_contiguous(s[0])) return Status::error("operand needs contiguous rows");
            return check_result(t, Type::F32, {1, s[0]->ne[1], s[0]->ne[2], s[0]->ne[3]});
        case Op::TOP_K: {
            FERRY_TRY(need_type(s[0], "operand", {Type::F32}));
            if (!row_elems_contiguous(s[0])) return Status::error("operand needs contiguous rows");
            const int32_t k = t->op_params[0];
            if (s[0]->ne[0] > kTopKMaxRow) {
                return Status::errorf("TOP_K rows of %lld exceed %lld (indices would not be exact)",
                                      static_cast<long long>(s[0]->ne[0]),
                                      static_cast<long long>(kTopKMaxRow));
            }
            if (k < 1 || k > s[0]->ne[0]) {
                return Status::errorf("TOP_K k %d invalid for rows of %lld", k,
                                      static_cast<long long>(s[0]->ne[0]));
            }
            return check_result(t, Type::F32,
                                {int64_t{2} * k, s[0]->ne[1], s[0]->ne[2], s[0]->ne[3]});
        }
        case Op::COUNT:
            break;
    }
    return Status::error("unknown op");
}

}  // namespace

Status validate_node(const Tensor* t) {
    const OpInfo* info = op_info_or_null(static_cast<uint32_t>(t->op));
    if (!info)
        return Status::errorf("tensor '%s': unknown op id %u", t->name,
                              static_cast<uint32_t>(t->op));
    auto fail = [&](const Status& st) {
        return st.context(strfmt("%s %s", info->name, describe(t).c_str()));
    };
    if (!type_traits_or_null(static_cast<uint32_t>(t->type)) ||
        (!type_traits(t->type).is_storage)) {
        return fail(Status::errorf("unknown type id %u", static_cast<uint32_t>(t->type)));
    }
    size_t span = 0;
    if (!tensor_span(t, &span)) {
        return fail(
            Status::error("shape or strides invalid (negative, not whole blocks, or an element "
                          "count, byte size or span that overflows)"));
    }
    if (!extents_fit_span(t)) {
        return fail(Status::errorf(
            "extents exceed the %zu bytes its strides reach (overlapping strides; only a zero "
            "stride may repeat elements)",
            span));
    }
    int n_src = 0;
    for (int i = 0; i < kMaxSrc; i++) {
        if (t->src[i]) {
            if (i >= info->n_src_max) return fail(Status::errorf("too many sources (src[%d])", i));
            n_src = i + 1;
        } else if (i < info->n_src_min) {
            return fail(Status::errorf("missing source %d (needs %d)", i, info->n_src_min));
        }
    }
    (void)n_src;
    for (int i = 0; i < kMaxSrc; i++) {
        const Tensor* s = t->src[i];
        if (!s) continue;
        size_t sspan = 0;
        if (!type_traits_or_null(static_cast<uint32_t>(s->type)) || !tensor_span(s, &sspan)) {
            return fail(Status::errorf("source %d is malformed", i));
        }
    }
    const bool is_view_op = (info->flags & kOpView) != 0;
    const bool in_place = (info->flags & kOpInPlace) != 0;
    if (is_view_op || in_place) {
        if (!t->view_src) return fail(Status::error("view/in-place result without view_src"));
        const Tensor* owner = t->src[t->op == Op::CPY ? 1 : 0]->storage();
        if (t->view_src != owner) {
            return fail(Status::error("view_src is not the storage of the viewed source"));
        }
        if (in_place) {
            const Tensor* dst = t->src[t->op == Op::CPY ? 1 : 0];
            if (t->view_offs != (dst->view_src ? dst->view_offs : 0) ||
                std::memcmp(t->nb, dst->nb, sizeof(t->nb)) != 0) {
                return fail(Status::error("in-place result must alias its destination exactly"));
            }
        }
        Status st = validate_view_range(t);
        if (!st) return fail(st);
    } else if (t->view_src) {
        if (t->op != Op::NONE) return fail(Status::error("computed tensor cannot be a view"));
        Status st = validate_view_range(t);
        if (!st) return fail(st);
    } else if (t->op != Op::NONE && !t->is_contiguous()) {
        return fail(Status::error("result must be contiguous"));
    }
    Status st = validate_op(t);
    return st ? st : fail(st);
}

// ---------------------------------------------------------------------------------------------
// Context

Tensor* Context::new_tensor(Type type, int n_dims, const int64_t* ne) {
    Expected<Tensor*> t = new_tensor_checked(type, n_dims, ne);
    if (!t) {
        std::fprintf(stderr, "ferry: new_tensor: %s\n", t.message().c_str());
        std::abort();
    }
    return *t;
}

Tensor* Context::new_tensor(Type type, std::initializer_list<int64_t> ne) {
    FERRY_ASSERT(ne.size() >= 1 && ne.size() <= kMaxDims);
    return new_tensor(type, static_cast<int>(ne.size()), ne.begin());
}

Expected<Tensor*> Context::new_tensor_checked(Type type, int n_dims, const int64_t* ne) {
    if (!type_traits_or_null(static_cast<uint32_t>(type))) {
        return Status::errorf("unknown type id %u", static_cast<uint32_t>(type));
    }
    if (n_dims < 1 || n_dims > kMaxDims) return Status::errorf("n_dims %d out of range", n_dims);
    Tensor t;
    t.type = type;
    for (int i = 0; i < n_dims; i++) t.ne[i] = ne[i];
    for (int i = 0; i < kMaxDims; i++) {
        if (t.ne[i] < 0) {
            return Status::errorf("negative size ne[%d] = %lld", i,
                                  static_cast<long long>(t.ne[i]));
        }
    }
    Expected<size_t> rs = row_size_checked(type, t.ne[0]);
    if (!rs) return rs.status();
    set_contiguous_strides(&t);  // unsigned products; checked just below
    size_t span = 0;
    if (!tensor_span(&t, &span)) {
        return Status::error("tensor element count or byte size overflows");
    }
    tensors_.push_back(t);
    return &tensors_.back();
}

Tensor* Context::dup_tensor(const Tensor* t) {
    return new_tensor(t->type, kMaxDims, t->ne);
}

namespace {

// Dimension d of the result takes the symbol of dimension sd of source s (same size by the
// op's shape rule).
void inherit_dim(Tensor* t, int d, const Tensor* s, int sd) {
    if (s && s->dim_sym[sd] != kDimFixed && s->ne[sd] == t->ne[d]) t->dim_sym[d] = s->dim_sym[sd];
}

// Dynamic dimensions flow from sources to results by each op's shape rule (ops.def). Views
// the builder sizes by hand (VIEW) start fixed: the builder marks them.
void propagate_dynamic_dims(Tensor* t) {
    const Tensor* a = t->src[0];
    switch (t->op) {
        case Op::NONE:
        case Op::VIEW:
            return;
        case Op::CPY:
            for (int d = 0; d < kMaxDims; d++) inherit_dim(t, d, t->src[1], d);
            return;
        case Op::RESHAPE: {
            // A reshape keeps the order of elements: source dim sd maps to the result dim with
            // the same extent and the same number of elements before it.
            int64_t inner_src = 1;
            for (int sd = 0; sd < kMaxDims; sd++) {
                if (a->dim_sym[sd] != kDimFixed) {
                    int64_t inner = 1;
                    for (int d = 0; d < kMaxDims; d++) {
                        if (inner == inner_src && t->ne[d] == a->ne[sd]) {
                            t->dim_sym[d] = a->dim_sym[sd];
                            break;
                        }
                        inner *= t->ne[d];
                        if (inner > inner_src) break;
                    }
                }
                inner_src *= a->ne[sd];
            }
            return;
        }
        case Op::PERMUTE:
        case Op::TRANSPOSE: {
            int axes[kMaxDims] = {1, 0, 2, 3};
            if (t->op == Op::PERMUTE) {
                for (int i = 0; i < kMaxDims; i++) axes[i] = t->op_params[i];
            }
            for (int i = 0; i < kMaxDims; i++) {
                if (axes[i] >= 0 && axes[i] < kMaxDims) inherit_dim(t, axes[i], a, i);
            }
            return;
        }
        case Op::GET_ROWS:
            inherit_dim(t, 0, a, 0);
            for (int d = 1; d < kMaxDims; d++) inherit_dim(t, d, t->src[1], d - 1);
            return;
        case Op::MUL_MAT:
            inherit_dim(t, 0, a, 1);
            for (int d = 1; d < kMaxDims; d++) inherit_dim(t, d, t->src[1], d);
            return;
        case Op::FLASH_ATTN_EXT:
            inherit_dim(t, 0, t->src[2], 0);
            inherit_dim(t, 1, a, 2);
            inherit_dim(t, 2, a, 1);
            inherit_dim(t, 3, a, 3);
            return;
        case Op::ARGMAX:
            for (int d = 0; d + 1 < kMaxDims; d++) inherit_dim(t, d, a, d + 1);
            return;
        case Op::SUM_ROWS:
        case Op::TOP_K:
            for (int d = 1; d < kMaxDims; d++) inherit_dim(t, d, a, d);
            return;
        default:
            // Every other op's result is shaped like its first source.
            for (int d = 0; d < kMaxDims; d++) inherit_dim(t, d, a, d);
            return;
    }
}

}  // namespace

void Context::mark_dynamic(Tensor* t, int dim, DimSymbol sym) {
    FERRY_ASSERT(dim >= 0 && dim < kMaxDims);
    t->dim_sym[dim] = sym;
}

Tensor* Context::finish(Tensor* t) {
    if (t->src[0]) propagate_dynamic_dims(t);
    Status st = validate_node(t);
    if (!st) {
        std::fprintf(stderr, "ferry: invalid graph node: %s\n", st.message().c_str());
        std::abort();
    }
    return t;
}

Tensor* Context::new_node(Op op, Type type, std::initializer_list<int64_t> ne,
                          std::initializer_list<Tensor*> srcs) {
    int64_t n[kMaxDims] = {1, 1, 1, 1};
    int i = 0;
    for (int64_t v : ne) n[i++] = v;
    Tensor* t = new_tensor(type, kMaxDims, n);
    t->op = op;
    i = 0;
    for (Tensor* s : srcs) t->src[i++] = s;
    return t;
}

Tensor* Context::new_view(Op op, Tensor* a, const int64_t* ne, const size_t* nb, size_t offs) {
    tensors_.emplace_back();
    Tensor* t = &tensors_.back();
    t->type = a->type;
    for (int i = 0; i < kMaxDims; i++) {
        t->ne[i] = ne[i];
        t->nb[i] = nb[i];
    }
    t->op = op;
    t->src[0] = a;
    t->view_src = a->storage();
    t->view_offs = (a->view_src ? a->view_offs : 0) + offs;
    if (a->buffer) {
        t->buffer = a->buffer;
        t->offs = a->storage()->offs + t->view_offs;
        t->data =
            a->storage()->data ? static_cast<uint8_t*>(a->storage()->data) + t->view_offs : nullptr;
    }
    std::snprintf(t->name, sizeof(t->name), "%.56s (view)", a->name);
    return t;
}

Tensor* Context::cpy(Tensor* src, Tensor* dst) {
    Tensor* t = new_view(Op::CPY, dst, dst->ne, dst->nb, 0);
    t->src[0] = src;
    t->src[1] = dst;
    std::snprintf(t->name, sizeof(t->name), "%.56s (copy)", dst->name);
    return finish(t);
}

Tensor* Context::cont(Tensor* a) {
    return finish(new_node(Op::CONT, a->type, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a}));
}

Tensor* Context::reshape(Tensor* a, std::initializer_list<int64_t> ne) {
    int64_t n[kMaxDims] = {1, 1, 1, 1};
    int i = 0;
    for (int64_t v : ne) n[i++] = v;
    Tensor tmp;
    tmp.type = a->type;
    std::memcpy(tmp.ne, n, sizeof(n));
    set_contiguous_strides(&tmp);
    return finish(new_view(Op::RESHAPE, a, tmp.ne, tmp.nb, 0));
}

Tensor* Context::view(Tensor* a, std::initializer_list<int64_t> ne,
                      std::initializer_list<size_t> nb, size_t offs) {
    int64_t n[kMaxDims] = {1, 1, 1, 1};
    size_t b[kMaxDims] = {type_size(a->type), 0, 0, 0};
    int i = 0;
    for (int64_t v : ne) n[i++] = v;
    i = 1;
    for (size_t v : nb) b[i++] = v;
    // Unspecified outer strides continue contiguously.
    for (int d = static_cast<int>(nb.size()) + 1; d < kMaxDims; d++) {
        b[d] = d == 1 ? row_size(a->type, n[0]) : b[d - 1] * static_cast<size_t>(n[d - 1]);
    }
    return finish(new_view(Op::VIEW, a, n, b, offs));
}

Tensor* Context::view_1d(Tensor* a, int64_t ne0, size_t offs) {
    return view(a, {ne0}, {}, offs);
}

Tensor* Context::view_2d(Tensor* a, int64_t ne0, int64_t ne1, size_t nb1, size_t offs) {
    return view(a, {ne0, ne1}, {nb1}, offs);
}

Tensor* Context::view_3d(Tensor* a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2,
                         size_t offs) {
    return view(a, {ne0, ne1, ne2}, {nb1, nb2}, offs);
}

Tensor* Context::permute(Tensor* a, int ax0, int ax1, int ax2, int ax3) {
    const int ax[4] = {ax0, ax1, ax2, ax3};
    int64_t ne[4];
    size_t nb[4];
    for (int i = 0; i < 4; i++) {
        FERRY_ASSERT(ax[i] >= 0 && ax[i] < 4);
        ne[ax[i]] = a->ne[i];
        nb[ax[i]] = a->nb[i];
    }
    Tensor* t = new_view(Op::PERMUTE, a, ne, nb, 0);
    for (int i = 0; i < 4; i++) t->op_params[i] = ax[i];
    return finish(t);
}

Tensor* Context::transpose(Tensor* a) {
    const int64_t ne[4] = {a->ne[1], a->ne[0], a->ne[2], a->ne[3]};
    const size_t nb[4] = {a->nb[1], a->nb[0], a->nb[2], a->nb[3]};
    return finish(new_view(Op::TRANSPOSE, a, ne, nb, 0));
}

Tensor* Context::get_rows(Tensor* a, Tensor* idx) {
    const Type out = a->type == Type::I32 ? Type::I32 : Type::F32;
    return finish(
        new_node(Op::GET_ROWS, out, {a->ne[0], idx->ne[0], idx->ne[1], idx->ne[2]}, {a, idx}));
}

Tensor* Context::set_rows(Tensor* dst, Tensor* src, Tensor* idx) {
    Tensor* t = new_view(Op::SET_ROWS, dst, dst->ne, dst->nb, 0);
    t->src[0] = dst;
    t->src[1] = src;
    t->src[2] = idx;
    return finish(t);
}

Tensor* Context::add(Tensor* a, Tensor* b) {
    return finish(new_node(Op::ADD, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a, b}));
}

Tensor* Context::mul(Tensor* a, Tensor* b) {
    return finish(new_node(Op::MUL, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a, b}));
}

Tensor* Context::scale(Tensor* a, float s, float bias) {
    Tensor* t = new_node(Op::SCALE, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a});
    t->set_param_f(0, s);
    t->set_param_f(1, bias);
    return finish(t);
}

Tensor* Context::rms_norm(Tensor* a, float eps) {
    Tensor* t = new_node(Op::RMS_NORM, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a});
    t->set_param_f(0, eps);
    return finish(t);
}

Tensor* Context::norm(Tensor* a, float eps) {
    Tensor* t = new_node(Op::NORM, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a});
    t->set_param_f(0, eps);
    return finish(t);
}

Tensor* Context::mul_mat(Tensor* a, Tensor* b) {
    return finish(
        new_node(Op::MUL_MAT, Type::F32, {a->ne[1], b->ne[1], b->ne[2], b->ne[3]}, {a, b}));
}

Tensor* Context::soft_max(Tensor* a, Tensor* mask, float scale) {
    Tensor* t =
        new_node(Op::SOFT_MAX, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a, mask});
    t->set_param_f(0, scale);
    return finish(t);
}

Tensor* Context::rope(Tensor* a, Tensor* pos, int n_dims, int mode, float freq_base,
                      float freq_scale, Tensor* freq_factors) {
    Tensor* t = new_node(Op::ROPE, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]},
                         {a, pos, freq_factors});
    t->op_params[0] = n_dims;
    t->op_params[1] = mode;
    t->set_param_f(2, freq_base);
    t->set_param_f(3, freq_scale);
    return finish(t);
}

Tensor* Context::flash_attn_ext(Tensor* q, Tensor* k, Tensor* v, Tensor* mask, float scale) {
    Tensor* t = new_node(Op::FLASH_ATTN_EXT, Type::F32, {v->ne[0], q->ne[2], q->ne[1], q->ne[3]},
                         {q, k, v, mask});
    t->set_param_f(0, scale);
    return finish(t);
}

Tensor* Context::silu(Tensor* a) {
    return finish(new_node(Op::SILU, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a}));
}

Tensor* Context::gelu(Tensor* a) {
    return finish(new_node(Op::GELU, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a}));
}

Tensor* Context::swiglu(Tensor* a, Tensor* b) {
    return finish(
        new_node(Op::SWIGLU, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a, b}));
}

Tensor* Context::geglu(Tensor* a, Tensor* b) {
    return finish(new_node(Op::GEGLU, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a, b}));
}

Tensor* Context::argmax(Tensor* a) {
    return finish(new_node(Op::ARGMAX, Type::I32, {a->ne[1], a->ne[2], a->ne[3]}, {a}));
}

Tensor* Context::sum_rows(Tensor* a) {
    return finish(new_node(Op::SUM_ROWS, Type::F32, {1, a->ne[1], a->ne[2], a->ne[3]}, {a}));
}

Tensor* Context::top_k(Tensor* a, int32_t k) {
    Tensor* t = new_node(Op::TOP_K, Type::F32, {int64_t{2} * k, a->ne[1], a->ne[2], a->ne[3]}, {a});
    t->op_params[0] = k;
    return finish(t);
}

}  // namespace ferry
