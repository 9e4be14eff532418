// The persistent decode step's lowering (persist.h): a decode graph as arch-common.cpp builds it
// for one token (n_tokens = n_out = 1), recognised node by node from its logits back to the
// step's input row, and the range of kernel nodes it replaces. Anything else in the pattern's
// place (a bias, a q/k norm, NeoX rope, a node outside the range reading an intermediate
// result) leaves the graph to the kernel-per-node plan.
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "backends/cuda/ops/persist.h"
#include "ferry/graph.h"

namespace ferry::cuda {

namespace {

bool is_view(const Tensor* t) {
    return t->op == Op::RESHAPE || t->op == Op::VIEW || t->op == Op::PERMUTE;
}

// Follows views to the node that wrote their data; each view met is recorded in `views`.
// Only views at offset 0 are followed (every view of the pattern is one).
const Tensor* through(const Tensor* t, std::unordered_set<const Tensor*>* views) {
    while (t && is_view(t)) {
        if (t->view_offs != 0 || !t->src[0]) return nullptr;
        if (views) views->insert(t);
        t = t->src[0];
    }
    return t;
}

struct Matcher {
    PersistModel* m = nullptr;
    std::string* why = nullptr;
    PersistAddr addr = nullptr;
    std::unordered_set<const Tensor*> nodes;  // kernel nodes replaced
    std::unordered_set<const Tensor*> views;  // views between them
    const Tensor* pos = nullptr;
    const Tensor* out_ids = nullptr;
    const Tensor* rope_ff = nullptr;
    int rope_params[4] = {0, 0, 0, 0};
    bool have_rope = false;
    float eps = NAN;
    const Tensor* first_weight = nullptr;  // its type (F16 or BF16) is every weight's

    bool f32_row(const Tensor* t, int64_t n) const {
        return t && t->type == Type::F32 && t->ne[0] == n && t->ne[1] == 1 && t->ne[2] == 1 &&
               t->ne[3] == 1 && t->nb[0] == sizeof(float) && addr(t);
    }
    bool no(const char* w) {
        if (why && why->empty()) *why = w;
        return false;
    }
    // A node of op `op` (not a view), recorded.
    const Tensor* take(const Tensor* t, Op op) {
        if (!t || t->op != op || !addr(t)) return nullptr;
        nodes.insert(t);
        return t;
    }
    // A contiguous 2-D weight of K columns, F16 or BF16 as every other one (the kernel
    // converts one type); its rows.
    int64_t weight(const Tensor* w, int64_t K) {
        if (!w || (w->type != Type::F16 && w->type != Type::BF16) || w->ne[0] != K ||
            w->ne[2] != 1 || w->ne[3] != 1 || !w->is_contiguous() || !addr(w)) {
            return 0;
        }
        if (!first_weight) first_weight = w;
        if (w->type != first_weight->type) return 0;
        return w->ne[1];
    }
    // MUL_MAT(w, b) of one column with b = `b`; the weight's address, or nullptr.
    const void* product(const Tensor* mm, const Tensor* b, int64_t K, int64_t rows) {
        if (!take(mm, Op::MUL_MAT) || mm->type != Type::F32 || !f32_row(mm, rows)) return nullptr;
        if (through(mm->src[1], &views) != b || weight(mm->src[0], K) != rows) return nullptr;
        return addr(mm->src[0]);
    }
    // MUL(RMS_NORM(x), g): x and g's address, or nullptr.
    const Tensor* normed(const Tensor* mul, int64_t H, const float** g) {
        if (!take(mul, Op::MUL) || !f32_row(mul, H) || !take(mul->src[0], Op::RMS_NORM)) {
            return nullptr;
        }
        const Tensor* rms = mul->src[0];
        if (!f32_row(rms, H) || !f32_row(mul->src[1], H)) return nullptr;
        const float e = rms->param_f(0);
        if (std::isnan(eps)) eps = e;
        if (e != eps) return nullptr;
        *g = reinterpret_cast<const float*>(addr(mul->src[1]));
        const Tensor* x = rms->src[0];
        return f32_row(x, H) && x->is_contiguous() ? x : nullptr;
    }
    // ROPE of a product (through its reshape) at the step's position.
    const Tensor* roped(const Tensor* r, int64_t heads) {
        if (!take(r, Op::ROPE) || r->type != Type::F32 || r->ne[0] != m->head_dim ||
            r->ne[1] != heads || r->ne[2] != 1 || r->ne[3] != 1 || !r->is_contiguous()) {
            return nullptr;
        }
        if (have_rope) {
            for (int p = 0; p < 4; p++) {
                if (r->op_params[p] != rope_params[p]) return nullptr;
            }
            if (r->src[2] != rope_ff || r->src[1] != pos) return nullptr;
        } else {
            for (int p = 0; p < 4; p++) rope_params[p] = r->op_params[p];
            rope_ff = r->src[2];
            if (!pos) pos = r->src[1];
            if (r->src[1] != pos) return nullptr;
            have_rope = true;
        }
        return through(r->src[0], &views);
    }
    // SET_ROWS(cache, src, pos) of one row: the cache, or nullptr.
    const Tensor* stored(const Tensor* s, const Tensor** src) {
        if (!take(s, Op::SET_ROWS)) return nullptr;
        const Tensor* c = s->src[0];
        const int64_t kvd = int64_t{m->n_head_kv} * m->head_dim;
        if (!pos) pos = s->src[2];
        if (!c || c->type != Type::F16 || c->ne[0] != kvd || c->ne[2] != 1 || c->ne[3] != 1 ||
            c->nb[0] != 2 || !addr(c) || s->src[2] != pos || s->src[1]->ne[0] != kvd ||
            s->src[1]->nelements() != kvd) {
            return nullptr;
        }
        if (m->cache_rows == 0) {
            m->cache_rows = c->ne[1];
            m->cache_row_bytes = static_cast<int64_t>(c->nb[1]);
        }
        if (c->ne[1] != m->cache_rows || static_cast<int64_t>(c->nb[1]) != m->cache_row_bytes) {
            return nullptr;
        }
        *src = through(s->src[1], &views);
        return c;
    }
    // t itself, or GET_ROWS(t, out_ids) of one row of t by the step's one index (out_ids:
    // the same tensor at every such node): t, or nullptr when it is neither.
    // (Any other GET_ROWS, the token's embedding row above all, is a tensor like any other.)
    const Tensor* picked(const Tensor* t) {
        if (!t || t->op != Op::GET_ROWS) return t;
        const Tensor* src = t->src[0];
        const Tensor* idx = t->src[1];
        const bool one_row =
            src && src->type == Type::F32 && src->ne[1] == 1 && src->ne[2] == 1 && src->ne[3] == 1;
        if (out_ids ? idx != out_ids : !one_row) return t;
        if (!one_row || !take(t, Op::GET_ROWS) || t->ne[0] != src->ne[0] || t->ne[1] != 1 ||
            !t->is_contiguous() || !src->is_contiguous() || !idx || idx->type != Type::I32 ||
            idx->nelements() != 1 || !addr(idx)) {
            return nullptr;
        }
        out_ids = idx;
        return src;
    }
    // The attention's K or V: a VIEW of the SET_ROWS at offset 0 over rows [0, n_kv) (its
    // row stride, the cache's, checked once the cache is known).
    const Tensor* kv_view(const Tensor* v, const Tensor** writer) {
        if (!v || v->op != Op::VIEW || v->view_offs != 0 || v->type != Type::F16 ||
            v->ne[0] != m->head_dim || v->ne[2] != m->n_head_kv || v->ne[3] != 1 ||
            v->nb[2] != static_cast<size_t>(m->head_dim) * 2) {
            return nullptr;
        }
        if (m->n_kv == 0) m->n_kv = static_cast<int>(v->ne[1]);
        if (v->ne[1] != m->n_kv) return nullptr;
        views.insert(v);
        *writer = v->src[0];
        return v;
    }

    // x_out = x + FFN(x_mid) with x_mid = x + attention(x): one layer, matched back from its
    // output; *x_in, the layer's input.
    bool layer(const Tensor* x_out, PersistLayer* l, const Tensor** x_in) {
        const int64_t H = m->n_embd, D = m->head_dim;
        const int64_t kvd = int64_t{m->n_head_kv} * D;
        if (!take(x_out, Op::ADD) || !f32_row(x_out, H)) return no("a layer's output");
        const Tensor* down = x_out->src[0];
        const Tensor* x_mid = x_out->src[1];
        if (!take(x_mid, Op::ADD) || !f32_row(x_mid, H)) return no("the attention's residual");
        if (!take(down, Op::MUL_MAT)) return no("down");
        const Tensor* glu = through(down->src[1], &views);
        if (!take(glu, Op::SWIGLU) || !f32_row(glu, glu->ne[0])) return no("SwiGLU");
        if (m->n_ff == 0) m->n_ff = static_cast<int>(glu->ne[0]);
        if (glu->ne[0] != m->n_ff) return no("n_ff");
        l->down = product(down, glu, m->n_ff, H);
        const Tensor* gate = glu->src[0];
        const Tensor* up = glu->src[1];
        if (!gate || !up || gate->op != Op::MUL_MAT || up->op != Op::MUL_MAT) return no("gate/up");
        const Tensor* c2 = through(gate->src[1], &views);
        const Tensor* xm = normed(c2, H, &l->ffn_norm);
        if (!l->down || xm != x_mid) return no("the FFN's norm");
        l->gate = product(gate, c2, H, m->n_ff);
        l->up = product(up, c2, H, m->n_ff);
        if (!l->gate || !l->up) return no("gate/up weights");

        const Tensor* wo = x_mid->src[0];
        // The residual: the layer's input, or (the last layer of a step whose logits rows are
        // picked by index) its one row picked by the one index, which must be 0 (the kernel
        // reports any other as GET_ROWS's error).
        const Tensor* x = picked(x_mid->src[1]);
        if (!x) return no("the attention's residual row");
        if (!take(wo, Op::MUL_MAT)) return no("wo");
        const Tensor* att = through(wo->src[1], &views);
        if (!take(att, Op::FLASH_ATTN_EXT) || att->type != Type::F32 || att->ne[0] != D ||
            att->ne[1] != m->n_head || att->ne[2] != 1 || att->ne[3] != 1 ||
            !att->is_contiguous()) {
            return no("the attention");
        }
        l->wo = product(wo, att, H, H);
        if (!l->wo) return no("wo's weights");
        const float scale = att->param_f(0);
        if (m->kq_scale == 0.0f) m->kq_scale = scale;
        if (scale != m->kq_scale) return no("the attention's scale");
        for (int p = 1; p < kMaxOpParams; p++) {
            if (att->op_params[p] != 0) return no("the attention's parameters");
        }
        const Tensor* qp = att->src[0];
        if (!qp || qp->op != Op::PERMUTE || qp->view_offs != 0 || qp->ne[0] != D ||
            qp->ne[1] != 1 || qp->ne[2] != m->n_head) {
            return no("q's permutation");
        }
        views.insert(qp);
        const Tensor* mask = att->src[3];
        if (!mask || mask->type != Type::F16 || mask->nb[0] != 2 || !addr(mask)) {
            return no("the mask");
        }
        l->mask = reinterpret_cast<const uint16_t*>(addr(mask));
        const Tensor *kw = nullptr, *vw = nullptr;
        if (!kv_view(att->src[1], &kw) || !kv_view(att->src[2], &vw)) return no("K/V views");
        if (mask->ne[0] < m->n_kv) return no("the mask's length");
        // V first: its SET_ROWS stores the product itself (and names the position).
        const Tensor* mv = nullptr;
        const Tensor* vc = stored(vw, &mv);
        if (!vc || !mv) return no("V's store");
        for (const Tensor* v : {att->src[1], att->src[2]}) {
            if (static_cast<int64_t>(v->nb[1]) != m->cache_row_bytes) return no("K/V rows");
        }
        const Tensor* q_rope = through(qp->src[0], &views);
        if (q_rope && q_rope->op == Op::GET_ROWS) {
            q_rope = picked(q_rope);
            if (!q_rope) return no("q's row");
            q_rope = through(q_rope, &views);
        }
        const Tensor* mq = roped(q_rope, m->n_head);
        if (!mq) return no("q's rope");
        const Tensor* c1 = through(mq->src[1], &views);
        l->wq = product(mq, c1, H, H);
        l->wv = product(mv, c1, H, kvd);
        const Tensor* k_src = nullptr;
        const Tensor* kc = stored(kw, &k_src);
        if (!kc || !k_src) return no("K's store");
        const Tensor* mk = roped(k_src, m->n_head_kv);
        if (!mk) return no("k's rope");
        l->wk = product(mk, c1, H, kvd);
        if (!l->wq || !l->wk || !l->wv) return no("q/k/v weights");
        const Tensor* xin = normed(c1, H, &l->attn_norm);
        if (xin != x) return no("the attention's norm");
        l->kc = addr(kc);
        l->vc = addr(vc);
        *x_in = x;
        return true;
    }
};

}  // namespace

bool match_persist(const Graph& g, const std::vector<const Tensor*>& kn, size_t* lo, size_t* hi,
                   PersistModel* m, std::string* why, PersistAddr addr) {
    *m = PersistModel{};
    Matcher mt;
    mt.m = m;
    mt.why = why;
    mt.addr = addr;
    auto no = [&mt](const char* w) { return mt.no(w); };
    // The logits: the last product.
    const Tensor* out = nullptr;
    for (size_t i = kn.size(); i-- > 0;) {
        if (kn[i]->op == Op::MUL_MAT) {
            out = kn[i];
            break;
        }
    }
    if (!out || out->ne[1] != 1 || out->type != Type::F32) return no("no one-column product last");
    const Tensor* w_out = out->src[0];
    m->n_embd = static_cast<int>(w_out->ne[0]);
    const int64_t H = m->n_embd;
    m->n_vocab = out->ne[0];
    const Tensor* c = through(out->src[1], &mt.views);
    const Tensor* x = mt.normed(c, H, &m->out_norm);
    m->w_out = mt.product(out, c, H, m->n_vocab);
    if (!x || !m->w_out) return no("the output's norm or weights");
    m->bf16 = mt.first_weight->type == Type::BF16;
    m->logits = reinterpret_cast<float*>(addr(out));
    if (!out->is_contiguous()) return no("the logits");
    // Heads from the first attention met (the last layer's).
    {
        const Tensor* a = x->op == Op::ADD ? x->src[1] : nullptr;
        const Tensor* att = a && a->op == Op::ADD ? through(a->src[0], nullptr) : nullptr;
        att = att && att->op == Op::MUL_MAT ? through(att->src[1], nullptr) : nullptr;
        if (!att || att->op != Op::FLASH_ATTN_EXT || !att->src[1]) return no("no attention");
        m->head_dim = static_cast<int>(att->ne[0]);
        m->n_head = static_cast<int>(att->ne[1]);
        m->n_head_kv = static_cast<int>(att->src[1]->ne[2]);
    }
    std::vector<PersistLayer> rev;
    while (x->op == Op::ADD) {
        PersistLayer l;
        const Tensor* x_in = nullptr;
        if (!mt.layer(x, &l, &x_in)) return false;
        rev.push_back(l);
        x = x_in;
    }
    if (rev.empty()) return no("no layer");
    m->layers.assign(rev.rbegin(), rev.rend());
    if (!mt.f32_row(x, H) || !x->is_contiguous()) return no("the input row");
    m->x0 = reinterpret_cast<const float*>(addr(x));
    if (!mt.pos || mt.pos->type != Type::I32 || mt.pos->ne[0] != 1 || !addr(mt.pos)) {
        return no("the position");
    }
    m->pos = reinterpret_cast<const int32_t*>(addr(mt.pos));
    if (mt.out_ids) m->out_ids = reinterpret_cast<const int32_t*>(addr(mt.out_ids));
    m->eps = mt.eps;
    m->n_rot = mt.rope_params[0];
    if (mt.rope_params[1] != kRopeNormal) return no("rope mode");
    float base, scale;
    std::memcpy(&base, &mt.rope_params[2], sizeof(float));
    std::memcpy(&scale, &mt.rope_params[3], sizeof(float));
    m->rope_base = base;
    m->rope_scale = scale;
    if (mt.rope_ff) {
        if (mt.rope_ff->type != Type::F32 || mt.rope_ff->ne[0] < m->n_rot / 2 ||
            !addr(mt.rope_ff)) {
            return no("rope frequency factors");
        }
        m->rope_ff = addr(mt.rope_ff);
        m->rope_ff_nb0 = static_cast<int64_t>(mt.rope_ff->nb[0]);
    }
    // The nodes replaced are one run of the kernel nodes, and nothing outside it reads what
    // they computed (but the logits).
    size_t first = kn.size(), last = 0, n = 0;
    for (size_t i = 0; i < kn.size(); i++) {
        if (!mt.nodes.count(kn[i])) continue;
        first = std::min(first, i);
        last = i;
        n++;
    }
    if (n != mt.nodes.size() || last + 1 - first != n) return no("not one run of kernel nodes");
    auto inner = [&](const Tensor* t) {
        return t != out && (mt.nodes.count(t) || mt.views.count(t));
    };
    for (const Tensor* t : g.nodes) {
        const bool mine = mt.nodes.count(t) || mt.views.count(t);
        if (mine && t != out && (t->flags & kTensorOutput)) return no("an output inside");
        if (mine) continue;
        for (const Tensor* s : t->src) {
            if (s && inner(s)) return no("a reader outside");
        }
        if (t->view_src && inner(t->view_src)) return no("a view outside");
    }
    for (const Tensor* t : g.outputs) {
        if (inner(t)) return no("a result read after the graph");
    }
    *lo = first;
    *hi = last;
    return true;
}

}  // namespace ferry::cuda
