// The pieces the architectures share: the weights loader, norms, attention and feed-forward.
#include <algorithm>
#include <cmath>

#include "model/arch.h"

namespace ferry {

namespace {

std::string shape_str(int n_dims, const int64_t* ne) {
    std::string s = "[";
    for (int i = 0; i < n_dims; i++) {
        if (i) s += ", ";
        s += std::to_string(ne[i]);
    }
    return s + "]";
}

std::string blk(int il, const char* name) {
    return "blk." + std::to_string(il) + "." + name;
}

}  // namespace

Status TensorLoader::take(const std::string& name, std::initializer_list<int64_t> shape,
                          bool f32_only, Tensor** out) {
    int64_t want[kMaxDims] = {1, 1, 1, 1};
    int n_want = 0;
    for (int64_t v : shape) want[n_want++] = v;
    const GgufTensorInfo* info = f_.find_tensor(name);
    if (!info) {
        return Status::errorf("missing tensor '%s' (expected shape %s)", name.c_str(),
                              shape_str(n_want, want).c_str());
    }
    bool ok = true;
    for (int i = 0; i < kMaxDims; i++) ok = ok && info->ne[i] == want[i];
    if (!ok) {
        return Status::errorf("tensor '%s' has shape %s, expected %s", name.c_str(),
                              shape_str(std::max(info->n_dims, 1), info->ne).c_str(),
                              shape_str(n_want, want).c_str());
    }
    const TypeTraits* tr = type_traits_or_null(static_cast<uint32_t>(info->type));
    if (!tr || !tr->is_storage || info->type == Type::I32) {
        return Status::errorf("tensor '%s' has unsupported type id %u", name.c_str(),
                              static_cast<uint32_t>(info->type));
    }
    if (f32_only && info->type != Type::F32) {
        return Status::errorf(
            "tensor '%s' has type %s; norm weights, biases and rope factors "
            "must be f32",
            name.c_str(), tr->name);
    }
    Tensor* t = m_.weights.new_tensor(info->type, kMaxDims, info->ne);
    t->set_name(name);
    t->flags |= kTensorParam;
    if (t->nbytes() != info->nbytes) {
        return Status::errorf("tensor '%s': %zu bytes in the file, %zu expected", name.c_str(),
                              info->nbytes, t->nbytes());
    }
    infos_.push_back(info);
    tensors_.push_back(t);
    *out = t;
    return Status::ok();
}

Status TensorLoader::take_optional(const std::string& name, std::initializer_list<int64_t> shape,
                                   bool f32_only, Tensor** out) {
    *out = nullptr;
    if (!f_.find_tensor(name)) return Status::ok();
    return take(name, shape, f32_only, out);
}

const float* TensorLoader::f32_data(const Tensor* t) const {
    for (size_t i = 0; i < tensors_.size(); i++) {
        if (tensors_[i] == t) return reinterpret_cast<const float*>(f_.tensor_data(*infos_[i]));
    }
    return nullptr;
}

Status TensorLoader::take_attention(int il, LlamaLayer& l) {
    const LlamaHParams& hp = m_.hp;
    const int64_t n_q = int64_t{hp.n_head} * hp.head_dim;
    const int64_t n_kv = int64_t{hp.n_head_kv} * hp.head_dim;
    FERRY_TRY(take(blk(il, "attn_norm.weight"), {hp.n_embd}, true, &l.attn_norm));
    FERRY_TRY(take(blk(il, "attn_q.weight"), {hp.n_embd, n_q}, false, &l.wq));
    FERRY_TRY(take(blk(il, "attn_k.weight"), {hp.n_embd, n_kv}, false, &l.wk));
    FERRY_TRY(take(blk(il, "attn_v.weight"), {hp.n_embd, n_kv}, false, &l.wv));
    return take(blk(il, "attn_output.weight"), {n_q, hp.n_embd}, false, &l.wo);
}

Status TensorLoader::take_qkv_bias(int il, LlamaLayer& l) {
    const LlamaHParams& hp = m_.hp;
    const int64_t n_q = int64_t{hp.n_head} * hp.head_dim;
    const int64_t n_kv = int64_t{hp.n_head_kv} * hp.head_dim;
    FERRY_TRY(take(blk(il, "attn_q.bias"), {n_q}, true, &l.bq));
    FERRY_TRY(take(blk(il, "attn_k.bias"), {n_kv}, true, &l.bk));
    return take(blk(il, "attn_v.bias"), {n_kv}, true, &l.bv);
}

Status TensorLoader::take_qk_norm(int il, LlamaLayer& l) {
    const int64_t hd = m_.hp.head_dim;
    FERRY_TRY(take(blk(il, "attn_q_norm.weight"), {hd}, true, &l.q_norm));
    return take(blk(il, "attn_k_norm.weight"), {hd}, true, &l.k_norm);
}

Status TensorLoader::take_ffn(int il, LlamaLayer& l) {
    const LlamaHParams& hp = m_.hp;
    FERRY_TRY(take(blk(il, "ffn_norm.weight"), {hp.n_embd}, true, &l.ffn_norm));
    FERRY_TRY(take(blk(il, "ffn_gate.weight"), {hp.n_embd, hp.n_ff}, false, &l.ffn_gate));
    FERRY_TRY(take(blk(il, "ffn_up.weight"), {hp.n_embd, hp.n_ff}, false, &l.ffn_up));
    return take(blk(il, "ffn_down.weight"), {hp.n_ff, hp.n_embd}, false, &l.ffn_down);
}

Status TensorLoader::take_rope_freqs() {
    const int64_t half = m_.hp.n_rot / 2;
    FERRY_TRY(take_optional("rope_freqs.weight", {half}, true, &m_.rope_freqs));
    if (!m_.rope_freqs) return Status::ok();
    // The factors divide angles: zero, negative or non-finite ones would make every position
    // look alike (or NaN) instead of failing.
    const float* v = f32_data(m_.rope_freqs);
    for (int64_t i = 0; v && i < half; i++) {
        if (!std::isfinite(v[i]) || v[i] <= 0.0f) {
            return Status::errorf(
                "tensor 'rope_freqs.weight'[%lld] = %g: rope frequency factors "
                "must be positive and finite",
                static_cast<long long>(i), static_cast<double>(v[i]));
        }
    }
    return Status::ok();
}

Tensor* build_rms_norm(ForwardContext& f, Tensor* x, Tensor* w) {
    return f.c.mul(f.c.rms_norm(x, f.m.hp.norm_eps), w);
}

Tensor* keep_out_rows(ForwardContext& f, Tensor* x) {
    if (f.out_ids) return f.c.get_rows(x, f.out_ids);  // [n_embd, n_out]
    if (f.n_out == f.n_tokens) return x;
    const size_t skip = static_cast<size_t>(f.n_tokens - f.n_out);
    return f.c.view_2d(x, x->ne[0], f.n_out, x->nb[1], skip * x->nb[1]);  // [n_embd, n_out]
}

Tensor* build_attention(ForwardContext& f, const LlamaLayer& l, Tensor* cur) {
    Context& c = f.c;
    const LlamaHParams& hp = f.m.hp;
    const int64_t hd = hp.head_dim, n_head = hp.n_head, n_head_kv = hp.n_head_kv;
    const int64_t nt = f.n_tokens;
    const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));

    Tensor* q = c.mul_mat(l.wq, cur);  // [n_head*hd, n_tokens]
    Tensor* k = c.mul_mat(l.wk, cur);  // [n_head_kv*hd, n_tokens]
    Tensor* v = c.mul_mat(l.wv, cur);  // [n_head_kv*hd, n_tokens]
    if (l.bq) q = c.add(q, l.bq);
    if (l.bk) k = c.add(k, l.bk);
    if (l.bv) v = c.add(v, l.bv);
    q = c.reshape(q, {hd, n_head, nt});     // [hd, n_head, n_tokens]
    k = c.reshape(k, {hd, n_head_kv, nt});  // [hd, n_head_kv, n_tokens]
    if (l.q_norm) q = build_rms_norm(f, q, l.q_norm);
    if (l.k_norm) k = build_rms_norm(f, k, l.k_norm);
    q = c.rope(q, f.pos, hp.n_rot, hp.rope_mode, hp.rope_freq_base, hp.rope_freq_scale,
               f.m.rope_freqs);  // [hd, n_head, n_tokens]
    k = c.rope(k, f.pos, hp.n_rot, hp.rope_mode, hp.rope_freq_base, hp.rope_freq_scale,
               f.m.rope_freqs);  // [hd, n_head_kv, n_tokens]

    // Store the new positions, then attend over the cache as the stores left it (the views
    // read the SET_ROWS results, which orders them after the stores).
    Tensor* kc = f.k_cache;
    Tensor* vc = f.v_cache;
    Tensor* k_st = c.set_rows(kc, c.reshape(k, {hd * n_head_kv, nt}), f.pos);  // [hd*n_kv_h, n_ctx]
    Tensor* v_st = c.set_rows(vc, v, f.pos);                                   // [hd*n_kv_h, n_ctx]
    const size_t head_bytes = static_cast<size_t>(hd) * type_size(f.kv_type);
    // [hd, n_kv, n_head_kv]
    Tensor* kv_k = c.view_3d(k_st, hd, f.n_kv, n_head_kv, kc->nb[1], head_bytes, 0);
    // [hd, n_kv, n_head_kv]
    Tensor* kv_v = c.view_3d(v_st, hd, f.n_kv, n_head_kv, vc->nb[1], head_bytes, 0);
    // The attended length changes from step to step while the structure stays
    // (graph_signature).
    c.mark_dynamic(kv_k, 1, kDimKv);
    c.mark_dynamic(kv_v, 1, kDimKv);
    // When only the last n_out tokens feed the logits (last layer), their queries alone attend.
    const int64_t n_q = f.n_out;
    const size_t skip = static_cast<size_t>(nt - n_q);
    Tensor* mask = f.mask;  // [n_kv, n_tokens] or nullptr
    if (f.out_ids) {
        // [hd, n_head, n_out]
        q = c.reshape(c.get_rows(c.reshape(q, {hd * n_head, nt}), f.out_ids), {hd, n_head, n_q});
        mask = f.mask_out;
    } else if (skip > 0) {
        // [hd, n_head, n_out]
        q = c.view_3d(q, hd, n_head, n_q, q->nb[1], q->nb[2], skip * q->nb[2]);
        // [n_kv, n_out]
        if (mask) mask = c.view_2d(mask, f.n_kv, n_q, mask->nb[1], skip * mask->nb[1]);
    }
    Tensor* qp = c.permute(q, 0, 2, 1, 3);                           // [hd, n_out, n_head]
    Tensor* att = c.flash_attn_ext(qp, kv_k, kv_v, mask, kq_scale);  // [hd, n_head, n_out]
    att = c.reshape(att, {hd * n_head, n_q});                        // [n_head*hd, n_out]
    return c.mul_mat(l.wo, att);                                     // [n_embd, n_out]
}

Tensor* build_ffn_swiglu(ForwardContext& f, const LlamaLayer& l, Tensor* cur) {
    Context& c = f.c;
    Tensor* gate = c.mul_mat(l.ffn_gate, cur);         // [n_ff, n]
    Tensor* up = c.mul_mat(l.ffn_up, cur);             // [n_ff, n]
    return c.mul_mat(l.ffn_down, c.swiglu(gate, up));  // [n_embd, n]
}

Tensor* build_pre_norm_layer(ForwardContext& f, const LlamaLayer& l, Tensor* x) {
    Tensor* cur = build_rms_norm(f, x, l.attn_norm);               // [n_embd, n_tokens]
    x = f.c.add(build_attention(f, l, cur), keep_out_rows(f, x));  // [n_embd, n_out]
    cur = build_rms_norm(f, x, l.ffn_norm);                        // [n_embd, n_out]
    return f.c.add(build_ffn_swiglu(f, l, cur), x);                // [n_embd, n_out]
}

const Arch* find_arch(const std::string& name) {
    for (const Arch* a : {&kArchLlama, &kArchQwen2, &kArchQwen3}) {
        if (name == a->name) return a;
    }
    return nullptr;
}

std::string known_arch_names() {
    return std::string(kArchLlama.name) + ", " + kArchQwen2.name + ", " + kArchQwen3.name;
}

}  // namespace ferry
