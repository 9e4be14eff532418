#include "core/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace ferry {

namespace {

// Logical (i0 fastest) view of a tensor's values.
struct Arr {
    int64_t ne[4] = {1, 1, 1, 1};
    std::vector<double> v;
    int64_t idx(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
        return ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0;
    }
    double operator()(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
        return v[static_cast<size_t>(idx(i0, i1, i2, i3))];
    }
};

double read_scalar(Type t, const uint8_t* p) {
    switch (t) {
        case Type::F32: {
            float f;
            std::memcpy(&f, p, 4);
            return f;
        }
        case Type::F16: {
            fp16_t h;
            std::memcpy(&h, p, 2);
            return fp16_to_fp32(h);
        }
        case Type::BF16: {
            bf16_t h;
            std::memcpy(&h, p, 2);
            return bf16_to_fp32(h);
        }
        case Type::I32: {
            int32_t i;
            std::memcpy(&i, p, 4);
            return i;
        }
        default:
            return std::numeric_limits<double>::quiet_NaN();
    }
}

std::string shape_str(const Tensor* t) {
    return describe(t);
}

}  // namespace

double ref_silu(double x) {
    return x / (1.0 + std::exp(-x));
}

double ref_gelu(double x) {
    const double k = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

Status round_through_type(Type t, double* v, int64_t n) {
    switch (t) {
        case Type::F32:
            for (int64_t i = 0; i < n; i++) v[i] = static_cast<float>(v[i]);
            return Status::ok();
        case Type::F16:
            for (int64_t i = 0; i < n; i++)
                v[i] = fp16_to_fp32(fp32_to_fp16(static_cast<float>(v[i])));
            return Status::ok();
        case Type::BF16:
            for (int64_t i = 0; i < n; i++)
                v[i] = bf16_to_fp32(fp32_to_bf16(static_cast<float>(v[i])));
            return Status::ok();
        case Type::I32:
            for (int64_t i = 0; i < n; i++) v[i] = static_cast<double>(static_cast<int32_t>(v[i]));
            return Status::ok();
        default:
            break;
    }
    const TypeTraits& tr = type_traits(t);
    if (!tr.from_float || !tr.to_float) return Status::errorf("cannot store into type %s", tr.name);
    if (n % tr.block_size != 0) {
        return Status::errorf("rounding %lld values through %s: not whole blocks",
                              static_cast<long long>(n), tr.name);
    }
    std::vector<float> f(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) f[static_cast<size_t>(i)] = static_cast<float>(v[i]);
    std::vector<uint8_t> q(static_cast<size_t>(n / tr.block_size) * tr.type_size);
    tr.from_float(f.data(), q.data(), n);
    tr.to_float(q.data(), f.data(), n);
    for (int64_t i = 0; i < n; i++) v[i] = f[static_cast<size_t>(i)];
    return Status::ok();
}

Expected<std::vector<double>> decode_tensor(const Tensor* t, const void* bytes, size_t size) {
    if (size < t->nbytes()) {
        return Status::errorf("decode %s: %zu bytes given, %zu needed", shape_str(t).c_str(), size,
                              t->nbytes());
    }
    const TypeTraits& tr = type_traits(t->type);
    const uint8_t* base = static_cast<const uint8_t*>(bytes);
    std::vector<double> out(static_cast<size_t>(t->nelements()));
    if (tr.is_quantized && t->nb[0] != tr.type_size) {
        return Status::errorf("decode %s: blocks of a row are not contiguous",
                              shape_str(t).c_str());
    }
    if (!tr.to_float && t->type != Type::I32) {
        return Status::errorf("decode %s: type has no conversion", shape_str(t).c_str());
    }
    std::vector<float> row(static_cast<size_t>(t->ne[0]));
    size_t o = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                const uint8_t* r = base + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                if (tr.is_quantized) {
                    tr.to_float(r, row.data(), t->ne[0]);
                    for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
                        out[o++] = row[static_cast<size_t>(i0)];
                } else {
                    for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                        out[o++] = read_scalar(t->type, r + i0 * t->nb[0]);
                    }
                }
            }
        }
    }
    return out;
}

Status RefEval::set_leaf(const Tensor* t, const void* bytes, size_t size) {
    if (t->view_src) return Status::errorf("set_leaf %s: tensor is a view", shape_str(t).c_str());
    Expected<std::vector<double>> v = decode_tensor(t, bytes, size);
    if (!v) return v.status();
    store_[t] = std::move(*v);
    return Status::ok();
}

Expected<std::vector<int64_t>> RefEval::owner_index(const Tensor* t) const {
    const Tensor* owner = t->storage();
    auto it = store_.find(owner);
    if (it == store_.end()) {
        return Status::errorf("reference: %s has no values (storage owner %s not evaluated)",
                              shape_str(t).c_str(), shape_str(owner).c_str());
    }
    const int64_t n = t->nelements();
    std::vector<int64_t> idx(static_cast<size_t>(n));
    if (owner == t) {
        for (int64_t i = 0; i < n; i++) idx[static_cast<size_t>(i)] = i;
        return idx;
    }
    if (!owner->is_contiguous()) {
        return Status::errorf("reference: view %s of a non-contiguous owner %s",
                              shape_str(t).c_str(), shape_str(owner).c_str());
    }
    const int64_t bs = block_size(t->type);
    const size_t ts = type_size(t->type);
    if (t->type != owner->type && (is_quantized(t->type) || is_quantized(owner->type) ||
                                   type_size(t->type) != type_size(owner->type))) {
        return Status::errorf("reference: view %s reinterprets %s", shape_str(t).c_str(),
                              shape_str(owner).c_str());
    }
    const int64_t owner_n = owner->nelements();
    size_t o = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                const size_t row = t->view_offs + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    const size_t byte = row + static_cast<size_t>(i0 / bs) * t->nb[0];
                    if (byte % ts != 0) {
                        return Status::errorf(
                            "reference: view %s: byte offset %zu is not on an "
                            "element/block boundary",
                            shape_str(t).c_str(), byte);
                    }
                    const int64_t e = static_cast<int64_t>(byte / ts) * bs + i0 % bs;
                    if (e >= owner_n) {
                        return Status::errorf("reference: view %s reaches past its owner",
                                              shape_str(t).c_str());
                    }
                    idx[o++] = e;
                }
            }
        }
    }
    return idx;
}

Expected<std::vector<double>> RefEval::values(const Tensor* t) const {
    const Tensor* owner = t->storage();
    auto it = store_.find(owner);
    if (it == store_.end()) {
        return Status::errorf("reference: %s has no values", shape_str(t).c_str());
    }
    if (owner == t) return it->second;
    Expected<std::vector<int64_t>> idx = owner_index(t);
    if (!idx) return idx.status();
    std::vector<double> out(idx->size());
    for (size_t i = 0; i < out.size(); i++) out[i] = it->second[static_cast<size_t>((*idx)[i])];
    return out;
}

Status RefEval::write(const Tensor* t, const std::vector<double>& v,
                      const std::vector<uint8_t>* modified, bool round) {
    Tensor* owner_mut = const_cast<Tensor*>(t)->storage();
    const Tensor* owner = owner_mut;
    Expected<std::vector<int64_t>> idx = owner_index(t);
    if (!idx) return idx.status();
    std::vector<double>& dst = store_[owner];
    const int64_t bs = block_size(owner->type);
    std::vector<uint8_t> touched_blocks;
    if (bs > 1) touched_blocks.assign(dst.size() / static_cast<size_t>(bs), 0);
    for (size_t i = 0; i < v.size(); i++) {
        if (modified && !(*modified)[i]) continue;
        const size_t e = static_cast<size_t>((*idx)[i]);
        dst[e] = v[i];
        if (!round) continue;
        if (bs > 1) {
            touched_blocks[e / static_cast<size_t>(bs)] = 1;
        } else {
            FERRY_TRY(round_through_type(owner->type, &dst[e], 1));
        }
    }
    for (size_t b = 0; b < touched_blocks.size(); b++) {
        if (touched_blocks[b]) {
            FERRY_TRY(round_through_type(owner->type, &dst[b * static_cast<size_t>(bs)], bs));
        }
    }
    return Status::ok();
}

Status RefEval::run(const Graph& g) {
    for (const Tensor* l : g.leafs) {
        if (l->view_src || store_.count(l)) continue;
        if (!l->data) {
            return Status::errorf("reference: leaf %s has no values and no host data",
                                  shape_str(l).c_str());
        }
        Expected<std::vector<double>> v = decode_tensor(l, l->data, l->nbytes());
        if (!v) return v.status();
        store_[l] = std::move(*v);
    }
    for (const Tensor* n : g.nodes) {
        Status st = eval(n);
        if (!st) return st.context(strfmt("reference %s %s", op_name(n->op), shape_str(n).c_str()));
    }
    return Status::ok();
}

Status RefEval::eval(const Tensor* t) {
    auto get = [&](int i, Arr* a) -> Status {
        const Tensor* s = t->src[i];
        Expected<std::vector<double>> v = values(s);
        if (!v) return v.status();
        for (int d = 0; d < 4; d++) a->ne[d] = s->ne[d];
        a->v = std::move(*v);
        return Status::ok();
    };
    const int64_t* ne = t->ne;
    std::vector<double> out(static_cast<size_t>(t->nelements()));
    auto at = [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) -> double& {
        return out[static_cast<size_t>(((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0)];
    };
    auto for_each = [&](auto&& fn) {
        for (int64_t i3 = 0; i3 < ne[3]; i3++)
            for (int64_t i2 = 0; i2 < ne[2]; i2++)
                for (int64_t i1 = 0; i1 < ne[1]; i1++)
                    for (int64_t i0 = 0; i0 < ne[0]; i0++) fn(i0, i1, i2, i3);
    };
    Arr a, b, c, d;
    switch (t->op) {
        case Op::NONE:
        case Op::RESHAPE:
        case Op::VIEW:
        case Op::PERMUTE:
        case Op::TRANSPOSE:
            return Status::ok();  // resolved on demand
        case Op::COUNT:
            return Status::error("unknown op");
        case Op::CPY: {
            FERRY_TRY(get(0, &a));
            // Elements in logical order of src go to logical order of dst. Same-type block
            // copies move blocks unchanged (re-quantizing is not idempotent for every format).
            const bool round = !(t->src[0]->type == t->type && is_quantized(t->type));
            return write(t, a.v, nullptr, round);
        }
        case Op::CONT:
            FERRY_TRY(get(0, &a));
            store_[t] = std::move(a.v);
            return Status::ok();
        case Op::GET_ROWS: {
            FERRY_TRY(get(0, &a));
            FERRY_TRY(get(1, &b));
            for (int64_t k = 0; k < ne[3]; k++) {
                for (int64_t j = 0; j < ne[2]; j++) {
                    for (int64_t i = 0; i < ne[1]; i++) {
                        const double r = b(i, j, k, 0);
                        if (r < 0 || r >= static_cast<double>(a.ne[1])) {
                            return Status::errorf(
                                "GET_ROWS index %.0f at (%lld, %lld, %lld) out of "
                                "range [0, %lld)",
                                r, static_cast<long long>(i), static_cast<long long>(j),
                                static_cast<long long>(k), static_cast<long long>(a.ne[1]));
                        }
                        for (int64_t i0 = 0; i0 < ne[0]; i0++) {
                            at(i0, i, j, k) = a(i0, static_cast<int64_t>(r), j, k);
                        }
                    }
                }
            }
            break;
        }
        case Op::SET_ROWS: {
            FERRY_TRY(get(0, &a));  // destination's current values
            FERRY_TRY(get(1, &b));  // rows to write
            FERRY_TRY(get(2, &c));  // indices
            std::vector<uint8_t> modified(a.v.size(), 0);
            for (int64_t k = 0; k < b.ne[3]; k++) {
                for (int64_t j = 0; j < b.ne[2]; j++) {
                    for (int64_t i = 0; i < b.ne[1]; i++) {
                        const double r = c(i, j, k, 0);
                        if (r < 0 || r >= static_cast<double>(a.ne[1])) {
                            return Status::errorf(
                                "SET_ROWS index %.0f at (%lld, %lld, %lld) out of "
                                "range [0, %lld)",
                                r, static_cast<long long>(i), static_cast<long long>(j),
                                static_cast<long long>(k), static_cast<long long>(a.ne[1]));
                        }
                        const int64_t ri = static_cast<int64_t>(r);
                        for (int64_t i0 = 0; i0 < b.ne[0]; i0++) {
                            const size_t e = static_cast<size_t>(a.idx(i0, ri, j, k));
                            a.v[e] = b(i0, i, j, k);
                            modified[e] = 1;
                        }
                    }
                }
            }
            return write(t, a.v, &modified, true);
        }
        case Op::ADD:
        case Op::MUL: {
            FERRY_TRY(get(0, &a));
            FERRY_TRY(get(1, &b));
            const bool add = t->op == Op::ADD;
            for_each([&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
                const double x = a(i0, i1, i2, i3);
                const double y = b(i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
                at(i0, i1, i2, i3) = add ? x + y : x * y;
            });
            break;
        }
        case Op::SCALE: {
            FERRY_TRY(get(0, &a));
            const double s = t->param_f(0), bias = t->param_f(1);
            for (size_t i = 0; i < out.size(); i++) out[i] = a.v[i] * s + bias;
            break;
        }
        case Op::RMS_NORM:
        case Op::NORM: {
            FERRY_TRY(get(0, &a));
            const double eps = t->param_f(0);
            const int64_t n0 = ne[0];
            for (int64_t r = 0; r < t->nrows(); r++) {
                const double* x = &a.v[static_cast<size_t>(r * n0)];
                double* y = &out[static_cast<size_t>(r * n0)];
                double mean = 0;
                if (t->op == Op::NORM) {
                    for (int64_t i = 0; i < n0; i++) mean += x[i];
                    mean /= static_cast<double>(n0);
                }
                double ss = 0;
                for (int64_t i = 0; i < n0; i++) ss += (x[i] - mean) * (x[i] - mean);
                const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n0) + eps);
                for (int64_t i = 0; i < n0; i++) y[i] = (x[i] - mean) * inv;
            }
            break;
        }
        case Op::MUL_MAT: {
            FERRY_TRY(get(0, &a));
            FERRY_TRY(get(1, &b));
            const int64_t K = a.ne[0];
            const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
            for_each([&](int64_t i, int64_t j, int64_t k2, int64_t k3) {
                const double* x = &a.v[static_cast<size_t>(a.idx(0, i, k2 / r2, k3 / r3))];
                const double* y = &b.v[static_cast<size_t>(b.idx(0, j, k2, k3))];
                double s = 0;
                for (int64_t l = 0; l < K; l++) s += x[l] * y[l];
                at(i, j, k2, k3) = s;
            });
            break;
        }
        case Op::SOFT_MAX: {
            FERRY_TRY(get(0, &a));
            const bool has_mask = t->src[1] != nullptr;
            if (has_mask) FERRY_TRY(get(1, &b));
            const double scale = t->param_f(0);
            std::vector<double> x(static_cast<size_t>(ne[0]));
            for (int64_t i3 = 0; i3 < ne[3]; i3++) {
                for (int64_t i2 = 0; i2 < ne[2]; i2++) {
                    for (int64_t i1 = 0; i1 < ne[1]; i1++) {
                        double mx = -std::numeric_limits<double>::infinity();
                        for (int64_t i0 = 0; i0 < ne[0]; i0++) {
                            double v = a(i0, i1, i2, i3) * scale;
                            if (has_mask) v += b(i0, i1, i2 % b.ne[2], i3 % b.ne[3]);
                            x[static_cast<size_t>(i0)] = v;
                            mx = std::max(mx, v);
                        }
                        double sum = 0;
                        for (int64_t i0 = 0; i0 < ne[0]; i0++) {
                            double& v = x[static_cast<size_t>(i0)];
                            v = mx == -std::numeric_limits<double>::infinity() ? 0.0
                                                                               : std::exp(v - mx);
                            sum += v;
                        }
                        for (int64_t i0 = 0; i0 < ne[0]; i0++) {
                            at(i0, i1, i2, i3) = sum > 0 ? x[static_cast<size_t>(i0)] / sum : 0.0;
                        }
                    }
                }
            }
            break;
        }
        case Op::ROPE: {
            FERRY_TRY(get(0, &a));
            FERRY_TRY(get(1, &b));
            const int n_dims = t->op_params[0];
            const int mode = t->op_params[1];
            const double base = t->param_f(2), fscale = t->param_f(3);
            const bool has_ff = t->src[2] != nullptr;
            if (has_ff) FERRY_TRY(get(2, &c));
            out = a.v;
            const int half = n_dims / 2;
            for (int64_t i3 = 0; i3 < ne[3]; i3++) {
                for (int64_t i2 = 0; i2 < ne[2]; i2++) {
                    const double p = b(i2, 0, 0, 0);
                    for (int64_t i1 = 0; i1 < ne[1]; i1++) {
                        for (int i = 0; i < half; i++) {
                            const double ff = has_ff ? c(i, 0, 0, 0) : 1.0;
                            const double theta =
                                p * fscale *
                                std::pow(base, -2.0 * i / static_cast<double>(n_dims)) / ff;
                            const int64_t j0 = mode == kRopeNeox ? i : 2 * i;
                            const int64_t j1 = mode == kRopeNeox ? i + half : 2 * i + 1;
                            const double x0 = a(j0, i1, i2, i3), x1 = a(j1, i1, i2, i3);
                            const double cs = std::cos(theta), sn = std::sin(theta);
                            at(j0, i1, i2, i3) = x0 * cs - x1 * sn;
                            at(j1, i1, i2, i3) = x0 * sn + x1 * cs;
                        }
                    }
                }
            }
            break;
        }
        case Op::FLASH_ATTN_EXT: {
            FERRY_TRY(get(0, &a));  // q [D, n_q, n_head, ne3]
            FERRY_TRY(get(1, &b));  // k [D, n_kv, n_head_kv, ne3k]
            FERRY_TRY(get(2, &c));  // v [Dv, n_kv, n_head_kv, ne3k]
            const bool has_mask = t->src[3] != nullptr;
            if (has_mask) FERRY_TRY(get(3, &d));  // mask [n_kv, >= n_q, m2, m3]
            const double scale = t->param_f(0);
            const int64_t D = a.ne[0], n_q = a.ne[1], n_head = a.ne[2];
            const int64_t n_kv = b.ne[1], Dv = c.ne[0];
            const int64_t rh = n_head / b.ne[2], r3 = a.ne[3] / b.ne[3];
            std::vector<double> s(static_cast<size_t>(n_kv));
            for (int64_t i3 = 0; i3 < a.ne[3]; i3++) {
                for (int64_t h = 0; h < n_head; h++) {
                    const int64_t hk = h / rh, k3 = i3 / r3;
                    for (int64_t iq = 0; iq < n_q; iq++) {
                        double mx = -std::numeric_limits<double>::infinity();
                        for (int64_t j = 0; j < n_kv; j++) {
                            double dot = 0;
                            for (int64_t l = 0; l < D; l++)
                                dot += a(l, iq, h, i3) * b(l, j, hk, k3);
                            double v = dot * scale;
                            if (has_mask) v += d(j, iq, h % d.ne[2], i3 % d.ne[3]);
                            s[static_cast<size_t>(j)] = v;
                            mx = std::max(mx, v);
                        }
                        double sum = 0;
                        for (int64_t j = 0; j < n_kv; j++) {
                            double& v = s[static_cast<size_t>(j)];
                            v = mx == -std::numeric_limits<double>::infinity() ? 0.0
                                                                               : std::exp(v - mx);
                            sum += v;
                        }
                        for (int64_t l = 0; l < Dv; l++) {
                            double acc = 0;
                            for (int64_t j = 0; j < n_kv; j++) {
                                acc += s[static_cast<size_t>(j)] * c(l, j, hk, k3);
                            }
                            at(l, h, iq, i3) = sum > 0 ? acc / sum : 0.0;
                        }
                    }
                }
            }
            break;
        }
        case Op::SILU:
        case Op::GELU: {
            FERRY_TRY(get(0, &a));
            const bool silu = t->op == Op::SILU;
            for (size_t i = 0; i < out.size(); i++) {
                out[i] = silu ? ref_silu(a.v[i]) : ref_gelu(a.v[i]);
            }
            break;
        }
        case Op::SWIGLU:
        case Op::GEGLU: {
            FERRY_TRY(get(0, &a));
            FERRY_TRY(get(1, &b));
            const bool swi = t->op == Op::SWIGLU;
            for (size_t i = 0; i < out.size(); i++) {
                out[i] = (swi ? ref_silu(a.v[i]) : ref_gelu(a.v[i])) * b.v[i];
            }
            break;
        }
        case Op::ARGMAX: {
            FERRY_TRY(get(0, &a));
            const int64_t n0 = a.ne[0];
            for (int64_t r = 0; r < a.ne[1] * a.ne[2] * a.ne[3]; r++) {
                const double* x = &a.v[static_cast<size_t>(r * n0)];
                int64_t best = 0;
                for (int64_t i = 1; i < n0; i++) {
                    if (x[i] > x[best]) best = i;
                }
                out[static_cast<size_t>(r)] = static_cast<double>(best);
            }
            break;
        }
        case Op::TOP_K: {
            // Sorts every row in double: independent of the single pass the devices use.
            FERRY_TRY(get(0, &a));
            const int64_t n0 = a.ne[0], k = t->op_params[0];
            std::vector<std::pair<double, int64_t>> row(static_cast<size_t>(n0));
            for (int64_t r = 0; r < a.ne[1] * a.ne[2] * a.ne[3]; r++) {
                for (int64_t i = 0; i < n0; i++) {
                    const double x = a.v[static_cast<size_t>(r * n0 + i)];
                    row[static_cast<size_t>(i)] = {
                        std::isnan(x) ? -std::numeric_limits<double>::infinity() : x, i};
                }
                std::stable_sort(row.begin(), row.end(),
                                 [](const auto& p, const auto& q) { return p.first > q.first; });
                for (int64_t j = 0; j < k; j++) {
                    out[static_cast<size_t>(r * 2 * k + j)] = row[static_cast<size_t>(j)].first;
                    out[static_cast<size_t>(r * 2 * k + k + j)] =
                        static_cast<double>(row[static_cast<size_t>(j)].second);
                }
            }
            break;
        }
        case Op::SUM_ROWS: {
            FERRY_TRY(get(0, &a));
            const int64_t n0 = a.ne[0];
            for (int64_t r = 0; r < a.ne[1] * a.ne[2] * a.ne[3]; r++) {
                double s = 0;
                for (int64_t i = 0; i < n0; i++) s += a.v[static_cast<size_t>(r * n0 + i)];
                out[static_cast<size_t>(r)] = s;
            }
            break;
        }
    }
    if (t->view_src) return Status::error("computed result is a view");
    store_[t] = std::move(out);
    return Status::ok();
}

}  // namespace ferry
