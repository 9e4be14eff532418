// MUL_MAT: out[m, n] = sum_k a[k, m] * b[k, n] per matrix, a broadcast over dims 2-3.
//
// Decode (b has at most kMaxCols columns): a matrix-vector kernel built for memory bandwidth.
// One warp per weight row; the warp walks the row in chunks of 256 elements, each lane taking
// 8 of them, so that its 32 lanes read the chunk's weights (and the matching 1 KiB of b) as
// contiguous, coalesced bytes. Block formats are decoded in registers: each lane's 8 weights
// share one scale (and min), so the lane forms sum(q * x) and applies d (and m * sum(x)) once.
// Small integers become floats through the exponent trick (0x4B000000 | q is 2^23 + q), which
// costs one integer and one float add instead of a slow int-to-float conversion.
//
// Prefill: cuBLAS on tensor cores. F32 weights use SGEMM in pedantic (true fp32) mode; F16/BF16
// weights multiply b rounded to the same type; block formats are first dequantized to F16
// (scratch) — a measured first path, not the final one.
//
// Any layout the fast paths do not take (odd K, unaligned rows) goes through a generic warp-per-
// row kernel that reads elements one by one.
//
// The kernels live in one file per family, so that they compile in parallel: mv-float.cu (the
// float matrix-vector kernel and the generic one), mv-int8.cu (the int8 kernel), mv-stream.cu
// (the streaming and bulk forms); mv-common.cuh holds what they share and mv-launch.h
// their entry points. This file keeps the dispatch, the checks of the fusions and the prefill
// (whose conversion kernels are in mv-float.cu).
#include <algorithm>
#include <cstdlib>

#include "backends/cuda/cublas-api.h"
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/mv-common.cuh"
#include "backends/cuda/ops/mv-launch.h"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

// Up to this many b columns run through the matrix-vector kernel (in groups of kMaxCols, the
// weights read once per group) instead of cuBLAS: activations stay in fp32, and small batches
// are bandwidth-bound anyway.
constexpr int64_t kMaxVecCols = 64;

MvArgs make_args(const Tensor* dst, const Tensor* res) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    MvArgs g{};
    g.a = device_ptr(a);
    g.a2 = nullptr;
    g.a_nb1 = static_cast<int64_t>(a->nb[1]);
    g.a_nb2 = static_cast<int64_t>(a->nb[2]);
    g.a_nb3 = static_cast<int64_t>(a->nb[3]);
    g.K = a->ne[0];
    g.M = a->ne[1];
    g.a_row_bytes = static_cast<int64_t>(row_size(a->type, a->ne[0]));
    g.b = device_ptr(b);
    g.b_nb1 = static_cast<int64_t>(b->nb[1]);
    g.b_nb2 = static_cast<int64_t>(b->nb[2]);
    g.b_nb3 = static_cast<int64_t>(b->nb[3]);
    g.N = b->ne[1];
    g.ne2 = b->ne[2];
    g.ne3 = b->ne[3];
    g.r2 = b->ne[2] / a->ne[2];
    g.r3 = b->ne[3] / a->ne[3];
    g.out = reinterpret_cast<float*>(device_ptr(res ? res : dst));
    g.res = nullptr;
    g.res_nb1 = g.res_nb2 = g.res_nb3 = 0;
    g.n_seg = 0;
    for (MvSeg& sg : g.seg)
        sg = MvSeg{nullptr, nullptr, nullptr, 0, 0, 0, nullptr, Type::F32, false, false};
    g.rope_pos = nullptr;
    g.rope_ff = nullptr;
    g.rope_ff_nb0 = 0;
    g.rope_dims = g.rope_head = 0;
    g.rope_base = g.rope_fscale = 0.0;
    g.err = nullptr;
    g.nx = g.nadd = g.nw = nullptr;
    g.nsum = nullptr;
    g.neps = 0.0f;
    g.norm_threads = 0;
    g.early = false;
    g.next = false;
    return g;
}

bool is_block_type(Type t) {
    return t == Type::Q4_0 || t == Type::Q4_1 || t == Type::Q8_0 || t == Type::Q4_K ||
           t == Type::Q5_K || t == Type::Q6_K;
}

// The fast matrix-vector kernel applies: plain weights need 16-byte rows and K % 8 == 0;
// block formats (and the element-read ones, through the float kernel's decoders) any row.
bool fast_vec_ok(const MvArgs& g, Type t) {
    if (is_block_type(t) || elem_type(t)) return true;
    return g.K % 8 == 0 && aligned16(g.a, {g.a_nb1, g.a_nb2, g.a_nb3});
}

// The float kernel's fused forms (norm prologue, decode epilogue) for plain weights, on
// unless FERRY_CUDA_MV_FFUSED=0 (then the F16/BF16/F32 decode runs as before: norm kernels
// apart, rope and KV store as their own kernels).
bool vec_fused_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_FFUSED");
        return !(v && v[0] == '0');
    }();
    return on;
}

// The float kernel takes this product fused: plain weights, one column of one matrix, and the
// fast path's layout (what launch_mat_vec picks for it unfused).
bool vec_fused_ok(const MvArgs& g, Type t) {
    return vec_fused_mode() && (t == Type::F32 || t == Type::F16 || t == Type::BF16) && g.N == 1 &&
           g.ne2 == 1 && g.ne3 == 1 && fast_vec_ok(g, t) &&
           aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3});
}

bool q8_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_Q8");
        return !(v && v[0] == '0');
    }();
    return on;
}

// The dp4a path takes single-column products of block-format weights whose rows are whole
// 256-element chunks, with b's column 16-byte aligned; FERRY_CUDA_MV_Q8=0 turns it off.
bool q8_vec_ok(const MvArgs& g, Type t) {
    return q8_mode() && is_block_type(t) && g.N == 1 && g.K % 256 == 0 && g.K <= kQ8MaxK &&
           aligned16(g.b, {g.b_nb2, g.b_nb3});
}

Status launch_mat_vec(OpContext& ctx, const Tensor* dst, MvArgs g) {
    const Type t = dst->src[0]->type;
    const dim3 grid(n_blocks(g.M, kRowsPerBlock), static_cast<unsigned>(g.ne2 * g.ne3), 1);
    const bool fast = fast_vec_ok(g, t) && aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3});
    if (fast && ctx.mv_stream && stream_ok(g, t, false)) return launch_stream(ctx, g, t, false);
    if (!fast) return launch_vec_generic(ctx, g, t, grid);
    if (q8_vec_ok(g, t)) return launch_q8_product(ctx, g, t, false, false);
    return launch_vec_product(ctx, g, t, grid, choose_split(g.M, g.K, ctx.n_sm), false);
}

// ---------------------------------------------------------------------------------------------
// Prefill through cuBLAS

Status cublas_status(const CublasApi* api, cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
    return Status::errorf("CUDA: MUL_MAT: %s failed: %s", what, api->status_string(s));
}

size_t round_up(size_t v) {
    return (v + 255) / 256 * 256;
}

Status launch_gemm(OpContext& ctx, const Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    cublasHandle_t h = static_cast<cublasHandle_t>(ctx.cublas);
    const CublasApi* api = ctx.cublas_api;
    if (!h || !api) return Status::error("CUDA: MUL_MAT: no cuBLAS handle");
    FERRY_TRY(cublas_status(api, api->set_stream(h, ctx.stream), "cublasSetStream"));
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    float* out = reinterpret_cast<float*>(device_ptr(dst));
    const float one = 1.0f, zero = 0.0f;
    const Type t = a->type;
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            const char* am = device_ptr(a) + (i2 / r2) * a->nb[2] + (i3 / r3) * a->nb[3];
            const char* bm = device_ptr(b) + i2 * b->nb[2] + i3 * b->nb[3];
            float* om = out + (i3 * b->ne[2] + i2) * M * N;
            if (t == Type::F32) {
                FERRY_TRY(
                    cublas_status(api, api->set_math_mode(h, CUBLAS_PEDANTIC_MATH), "math mode"));
                FERRY_TRY(cublas_status(
                    api,
                    api->sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(M),
                               static_cast<int>(N), static_cast<int>(K), &one,
                               reinterpret_cast<const float*>(am), static_cast<int>(a->nb[1] / 4),
                               reinterpret_cast<const float*>(bm), static_cast<int>(b->nb[1] / 4),
                               &zero, om, static_cast<int>(M)),
                    "cublasSgemm"));
                continue;
            }
            FERRY_TRY(cublas_status(api, api->set_math_mode(h, CUBLAS_DEFAULT_MATH), "math mode"));
            const bool bf16 = t == Type::BF16;
            uint16_t* bh = reinterpret_cast<uint16_t*>(ctx.scratch.ptr);
            const int64_t bnb1 = static_cast<int64_t>(b->nb[1]);
            launch_to_half(bm, bnb1, K, N, bh, bf16, ctx.stream);
            FERRY_TRY(launch_status("MUL_MAT (convert b)"));
            const void* aw = am;
            int64_t lda = static_cast<int64_t>(a->nb[1] / 2);
            if (is_block_type(t) || elem_type(t)) {
                uint16_t* ah = bh + round_up(static_cast<size_t>(K * N) * 2) / 2;
                const unsigned blocks = n_blocks(M * ((K + 255) / 256) * 32, 256) > 16384
                                            ? 16384
                                            : n_blocks(M * ((K + 255) / 256) * 32, 256);
                const int64_t nb1 = static_cast<int64_t>(a->nb[1]);
                FERRY_TRY(dequant_f16(t, blocks, ctx.stream, am, nb1, K, M, ah));
                FERRY_TRY(launch_status("MUL_MAT (dequantize)"));
                aw = ah;
                lda = K;
            }
            const cudaDataType_t dt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
            FERRY_TRY(cublas_status(
                api,
                api->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(M), static_cast<int>(N),
                             static_cast<int>(K), &one, aw, dt, static_cast<int>(lda), bh, dt,
                             static_cast<int>(K), &zero, om, CUDA_R_32F, static_cast<int>(M),
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx"));
        }
    }
    return Status::ok();
}

// Whether the element-read formats (ops.h elem_type) take cuBLAS past kMaxVecCols columns,
// dequantized to F16 by the float kernel's decoders (k_dequant_f16), as Q4_0/Q6_K do;
// FERRY_CUDA_ELEM_GEMM=0: the float kernel's column groups at any width. Stop 39 on an H100
// (bench/results/cuda.md): 1B pp512 68.9-73.0k t/s against 2.1k for Q5_0, Q3_K, IQ4_XS and
// MXFP4, the _wide op cases (72 columns) at nmse 3.4e-8 to 7.2e-8, as Q4_0's.
bool elem_gemm() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_ELEM_GEMM");
        return !(v && v[0] == '0');
    }();
    return on;
}

// cuBLAS takes over when b has more columns than the vector kernel handles and the layout
// suits it (element strides of whole elements; int-sized dimensions).
bool use_gemm(const Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    // F32 weights: SGEMM (true fp32) past one column group; measured closer to the oracle on
    // the f32 model than the vector kernel's column groups.
    if (b->ne[1] <= (a->type == Type::F32 ? kMaxCols : kMaxVecCols)) return false;
    if (a->ne[0] % 8 != 0) return false;
    if (a->ne[0] > INT32_MAX || a->ne[1] > INT32_MAX || b->ne[1] > INT32_MAX) return false;
    if (b->nb[1] % 4 != 0) return false;
    // The element-read formats: cuBLAS on their F16 dequantization unless elem_gemm() is off
    // (then the float kernel's column groups at any width).
    if (elem_type(a->type)) return elem_gemm();
    if (!is_block_type(a->type) && a->nb[1] % type_size(a->type) != 0) return false;
    return true;
}

}  // namespace

bool pdl_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_PDL");
        return !(v && v[0] == '0');
    }();
    return on;
}

bool needs_cublas(const Tensor* node) {
    return node->op == Op::MUL_MAT && use_gemm(node);
}

size_t mul_mat_scratch_size(const Tensor* node) {
    if (!use_gemm(node)) return 0;
    const Tensor* a = node->src[0];
    const Tensor* b = node->src[1];
    if (a->type == Type::F32) return 0;
    size_t s = round_up(static_cast<size_t>(b->ne[0] * b->ne[1]) * 2);
    if (is_block_type(a->type) || elem_type(a->type))
        s += round_up(static_cast<size_t>(a->ne[0] * a->ne[1]) * 2);
    return s;
}

Status op_mul_mat(OpContext& ctx, const Tensor* dst) {
    if (dst->nelements() == 0) return Status::ok();
    if (use_gemm(dst)) return launch_gemm(ctx, dst);
    return launch_mat_vec(ctx, dst, make_args(dst, nullptr));
}

bool can_fuse_mul_mat_add(const Tensor* mm, const Tensor* add) {
    if (mm->op != Op::MUL_MAT || add->op != Op::ADD || add->src[0] != mm) return false;
    const Tensor* r = add->src[1];
    if (r == mm || !same_shape(r, mm) || r->nb[0] != sizeof(float)) return false;
    return !use_gemm(mm);
}

Status op_mul_mat_add(OpContext& ctx, const Tensor* mm, const Tensor* add) {
    if (add->nelements() == 0) return Status::ok();
    MvArgs g = make_args(mm, add);
    const Tensor* r = add->src[1];
    g.res = device_ptr(r);
    g.res_nb1 = static_cast<int64_t>(r->nb[1]);
    g.res_nb2 = static_cast<int64_t>(r->nb[2]);
    g.res_nb3 = static_cast<int64_t>(r->nb[3]);
    return launch_mat_vec(ctx, mm, g);
}

bool can_fuse_swiglu(const Tensor* gate, const Tensor* up, const Tensor* glu) {
    if (glu->op != Op::SWIGLU || glu->src[0] != gate || glu->src[1] != up) return false;
    if (gate->op != Op::MUL_MAT || up->op != Op::MUL_MAT || gate == up) return false;
    const Tensor* ga = gate->src[0];
    const Tensor* ua = up->src[0];
    if (gate->src[1] != up->src[1] || ga->type != ua->type || !same_shape(ga, ua)) return false;
    for (int d = 0; d < kMaxDims; d++) {
        if (ga->nb[d] != ua->nb[d]) return false;
    }
    if (use_gemm(gate) || gate->src[1]->ne[1] != 1) return false;  // decode: one column
    MvArgs g = make_args(gate, nullptr);
    return fast_vec_ok(g, ga->type) && aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3});
}

bool can_fuse_mul_mat_epilogue(const Tensor* mm, const Tensor* rope, const Tensor* set_rows) {
    if (mm->op != Op::MUL_MAT || (!rope && !set_rows) || use_gemm(mm)) return false;
    const Tensor* b = mm->src[1];
    if (b->ne[1] != 1 || b->ne[2] != 1 || b->ne[3] != 1) return false;  // decode: one column
    if (mm->src[0]->ne[2] != 1 || mm->src[0]->ne[3] != 1) return false;
    MvArgs g = make_args(mm, nullptr);
    if (!fast_vec_ok(g, mm->src[0]->type) || !aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3}) ||
        !(q8_vec_ok(g, mm->src[0]->type) || vec_fused_ok(g, mm->src[0]->type)) ||
        g.M % kQ8Warps != 0 || g.M % kMvWarps != 0 || !mm->is_contiguous()) {
        return false;
    }
    const Tensor* last = mm;  // the tensor set_rows stores
    if (rope) {
        const Tensor* x = rope->src[0];
        const Tensor* ff = rope->src[2];
        const int n_dims = rope->op_params[0];
        if (rope->op != Op::ROPE || x->storage() != mm || device_ptr(x) != device_ptr(mm) ||
            !x->is_contiguous() || !rope->is_contiguous() || rope->type != Type::F32 ||
            rope->op_params[1] != kRopeNormal || rope->nelements() != g.M || rope->ne[2] != 1 ||
            rope->ne[3] != 1 || rope->ne[0] % 2 != 0 || n_dims % 2 != 0 || n_dims > rope->ne[0] ||
            rope->src[1]->type != Type::I32 || rope->src[1]->ne[0] < 1 ||
            (ff && (ff->type != Type::F32 || ff->ne[0] < n_dims / 2))) {
            return false;
        }
        last = rope;
    }
    if (set_rows) {
        const Tensor* d = set_rows->src[0];
        const Tensor* s = set_rows->src[1];
        const Tensor* idx = set_rows->src[2];
        if (set_rows->op != Op::SET_ROWS || s->storage() != last ||
            device_ptr(s) != device_ptr(last) || !s->is_contiguous() || s->ne[0] != g.M ||
            s->ne[1] != 1 || s->ne[2] != 1 || s->ne[3] != 1 || idx->type != Type::I32 ||
            idx->ne[0] != 1 || d->ne[0] != g.M || d->ne[2] != 1 || d->ne[3] != 1 ||
            (d->type != Type::F32 && d->type != Type::F16 && d->type != Type::BF16) ||
            d->nb[0] != type_size(d->type)) {
            return false;
        }
    }
    return true;
}

bool can_join_mul_mat_epilogues(const EpilogueUnit& a, const EpilogueUnit& b) {
    const Tensor* ma = a.mm;
    const Tensor* mb = b.mm;
    if (ma->src[1] != mb->src[1] || ma->src[0]->type != mb->src[0]->type ||
        ma->src[0]->ne[0] != mb->src[0]->ne[0] || ma->src[0]->nb[1] != mb->src[0]->nb[1]) {
        return false;
    }
    if (!a.rope || !b.rope) return true;
    const Tensor* ra = a.rope;
    const Tensor* rb = b.rope;
    for (int p = 0; p < 4; p++) {
        if (ra->op_params[p] != rb->op_params[p]) return false;
    }
    return ra->src[1] == rb->src[1] && ra->src[2] == rb->src[2] && ra->ne[0] == rb->ne[0];
}

namespace {

// FERRY_CUDA_MV_FNORM=2: the float kernel's folded norm without the early weight loads.
bool fnorm_early_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_FNORM");
        return !(v && v[0] == '2');
    }();
    return on;
}

// A row of K F32 elements, contiguous and 16-byte aligned.
bool f32_row(const Tensor* t, int64_t K) {
    return t->type == Type::F32 && t->ne[0] == K && t->nrows() == 1 && t->is_contiguous() &&
           aligned16(device_ptr(t), {});
}

void set_norm(MvArgs& g, const NormPrologue* p) {
    if (!p || !p->norm) return;
    const Tensor* x = p->add ? p->add->src[0] : p->norm->src[0];
    g.nx = reinterpret_cast<const float*>(device_ptr(x));
    g.nadd = p->add ? reinterpret_cast<const float*>(device_ptr(p->add->src[1])) : nullptr;
    g.nsum = p->add ? reinterpret_cast<float*>(device_ptr(p->add)) : nullptr;
    g.nw = reinterpret_cast<const float*>(device_ptr(p->mul->src[1]));
    g.neps = p->norm->param_f(0);
    g.norm_threads = norm_threads(g.K);
    g.early = fnorm_early_mode();
}

}  // namespace

bool can_fold_norm(const NormPrologue& p, const Tensor* mm, bool float_kernel, bool stream) {
    const Tensor* mul = p.mul;
    const Tensor* norm = p.norm;
    if (!mul || !norm || mm->op != Op::MUL_MAT || mm->src[1] != mul || use_gemm(mm)) return false;
    if (norm->op != Op::RMS_NORM || mul->op != Op::MUL || mul->src[0] != norm) return false;
    const int64_t K = mul->ne[0];
    const Tensor* x = norm->src[0];
    if (!f32_row(mul, K) || !f32_row(x, K) || !f32_row(mul->src[1], K)) return false;
    if (p.add && (p.add != x || p.add->op != Op::ADD || !f32_row(p.add->src[0], K) ||
                  !f32_row(p.add->src[1], K))) {
        return false;
    }
    if (norm_threads(K) > 4 * 32 * kQ8Warps) return false;
    MvArgs g = make_args(mm, nullptr);
    if (g.K != K || g.ne2 != 1 || g.ne3 != 1) return false;
    // The float kernel keeps b in (at most 48 KiB of) shared memory.
    return q8_vec_ok(g, mm->src[0]->type) || (stream && stream_ok(g, mm->src[0]->type, false)) ||
           (float_kernel && vec_fused_ok(g, mm->src[0]->type) && K * 4 <= 48 * 1024);
}

bool mirror_product_ok(const OpContext& ctx, const Tensor* mm, bool folded_norm) {
    if (mm->op != Op::MUL_MAT || use_gemm(mm)) return false;
    const MvArgs g = make_args(mm, nullptr);
    const Type t = mm->src[0]->type;
    if (!folded_norm && (!fast_vec_ok(g, t) || !aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3}))) {
        return false;  // launch_mat_vec's generic kernel
    }
    return ctx.mv_stream && stream_ok(g, t, false);  // (one column of one matrix)
}

Status op_mul_mat_norm(OpContext& ctx, const Tensor* mm, const NormPrologue& p) {
    MvArgs g = make_args(mm, nullptr);
    set_norm(g, &p);
    const Type t = mm->src[0]->type;
    if (ctx.mv_stream && stream_ok(g, t, false)) return launch_stream(ctx, g, t, false);
    if (q8_vec_ok(g, t)) return launch_q8_product(ctx, g, t, false, false);
    if (vec_fused_ok(g, t)) return launch_vec_fused_product(ctx, g, t, g.M, false);
    return Status::error("CUDA: folded RMS_NORM without the int8 or the fused float kernel");
}

Status op_mul_mat_epilogue(OpContext& ctx, const EpilogueUnit* units, int n_units,
                           const NormPrologue* pro) {
    if (n_units < 1 || n_units > kMaxSeg) {
        return Status::errorf("CUDA: MUL_MAT epilogue of %d products", n_units);
    }
    MvArgs g = make_args(units[0].mm, nullptr);
    const Type t = units[0].mm->src[0]->type;
    g.err = ctx.err;
    g.n_seg = n_units;
    int64_t rows = 0;
    for (int u = 0; u < n_units; u++) {
        const EpilogueUnit& e = units[u];
        MvSeg& sg = g.seg[u];
        rows += e.mm->src[0]->ne[1];
        sg.a = device_ptr(e.mm->src[0]);
        sg.end = rows;
        sg.out = reinterpret_cast<float*>(device_ptr(e.rope ? e.rope : e.mm));
        sg.write_out = e.write_out;
        sg.rope = e.rope != nullptr;
        if (e.rope) {
            const Tensor* ff = e.rope->src[2];
            g.rope_pos = reinterpret_cast<const int32_t*>(device_ptr(e.rope->src[1]));
            g.rope_ff = ff ? device_ptr(ff) : nullptr;
            g.rope_ff_nb0 = ff ? static_cast<int64_t>(ff->nb[0]) : 0;
            g.rope_dims = e.rope->op_params[0];
            g.rope_head = static_cast<int>(e.rope->ne[0]);
            g.rope_base = static_cast<double>(e.rope->param_f(2));
            g.rope_fscale = static_cast<double>(e.rope->param_f(3));
        }
        if (e.set_rows) {
            const Tensor* d = e.set_rows->src[0];
            sg.kv = device_ptr(d);
            sg.kv_nb1 = static_cast<int64_t>(d->nb[1]);
            sg.kv_rows = d->ne[1];
            sg.kv_idx = reinterpret_cast<const int32_t*>(device_ptr(e.set_rows->src[2]));
            sg.kv_type = d->type;
        }
    }
    g.M = rows;
    set_norm(g, pro);
    // The streaming form takes every unit in one launch (a row is summed alike whatever the
    // matrix's size).
    if (ctx.mv_stream && stream_ok(g, t, false)) return launch_stream(ctx, g, t, false);
    if (q8_vec_ok(g, t)) return launch_q8_product(ctx, g, t, false, true);
    // The float kernel: one launch for the units whose products split their rows alike (each
    // adds its parts as its unfused launch would), one after another otherwise.
    if (!vec_fused_ok(g, t)) return Status::error("CUDA: MUL_MAT epilogue: no fused kernel");
    const int s0 = choose_split(units[0].mm->src[0]->ne[1], g.K, ctx.n_sm);
    int n = 1;
    while (n < n_units && choose_split(units[n].mm->src[0]->ne[1], g.K, ctx.n_sm) == s0) n++;
    if (n < n_units) {
        FERRY_TRY(op_mul_mat_epilogue(ctx, units, n, pro));
        return op_mul_mat_epilogue(ctx, units + n, n_units - n, pro);
    }
    return launch_vec_fused_product(ctx, g, t, units[0].mm->src[0]->ne[1], false);
}

Status op_mul_mat_swiglu(OpContext& ctx, const Tensor* gate, const Tensor* up, const Tensor* glu,
                         const NormPrologue* pro) {
    if (glu->nelements() == 0) return Status::ok();
    MvArgs g = make_args(gate, glu);
    g.a2 = device_ptr(up->src[0]);
    if (ctx.mv_stream && stream_ok(g, gate->src[0]->type, true)) {
        set_norm(g, pro);
        return launch_stream(ctx, g, gate->src[0]->type, true);
    }
    if (q8_vec_ok(g, gate->src[0]->type)) {
        set_norm(g, pro);
        return launch_q8_product(ctx, g, gate->src[0]->type, true, false);
    }
    if (pro && pro->norm) {
        if (!vec_fused_ok(g, gate->src[0]->type)) {
            return Status::error(
                "CUDA: folded RMS_NORM without the int8 or the fused float kernel");
        }
        set_norm(g, pro);
        return launch_vec_fused_product(ctx, g, gate->src[0]->type, g.M, true);
    }
    const dim3 grid(1, static_cast<unsigned>(g.ne2 * g.ne3), 1);
    return launch_vec_product(ctx, g, gate->src[0]->type, grid, choose_split(g.M, g.K, ctx.n_sm),
                              true);
}

}  // namespace ferry::cuda
