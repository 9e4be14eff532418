// RMS_NORM and NORM over ne0 (one block per row), and RMS_NORM fused with the MUL by its
// weight that follows it in every llama layer (one pass over the row instead of two kernels).
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

// mode 0: rms norm, 1: norm (mean removed). w (optional): multiplies the result, broadcast
// by repetition like MUL's b. with_add: the row normalised is a + b (same shapes), written to s
// first (the residual stream the layer keeps, sum_out), then read back by the thread that wrote
// it.
template <int mode, bool with_w, bool with_add = false>
__global__ void k_norm(TV d, TV a, TV w, float eps, TV b, TV sum_out) {
    __shared__ float sh[32];
    pdl_wait();     // launched with launch_pdl: nothing before this touches memory
    pdl_trigger();  // the matrix-vector product that follows may start prefetching its weights
    const int64_t r = blockIdx.x;
    const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
    const float* x =
        reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
    float* y = reinterpret_cast<float*>(d.p + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
    const int64_t n = d.ne[0];
    if constexpr (with_add) {
        const float* xb =
            reinterpret_cast<const float*>(b.p + i1 * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3]);
        float* xs = reinterpret_cast<float*>(sum_out.p + i1 * sum_out.nb[1] + i2 * sum_out.nb[2] +
                                             i3 * sum_out.nb[3]);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xs[i] = x[i] + xb[i];
        x = xs;
    }
    float mean = 0.0f;
    if (mode == 1) {
        float s = 0.0f;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
        mean = block_sum(s, sh) / static_cast<float>(n);
    }
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[i] - mean;
        ss = fmaf(v, v, ss);  // the order the int8 product's folded norm repeats (norm_inv)
    }
    ss = block_sum(ss, sh);
    const float inv = rsqrtf(ss / static_cast<float>(n) + eps);
    const float* wr = nullptr;
    if constexpr (with_w) {
        wr = reinterpret_cast<const float*>(w.p + (i1 % w.ne[1]) * w.nb[1] +
                                            (i2 % w.ne[2]) * w.nb[2] + (i3 % w.ne[3]) * w.nb[3]);
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = (x[i] - mean) * inv;
        if constexpr (with_w) v *= wr[w.ne[0] == n ? i : i % w.ne[0]];
        y[i] = v;
    }
}

int threads_for(int64_t n) {
    return n >= 1024 ? 1024 : (n >= 256 ? 256 : (n >= 64 ? 64 : 32));
}

}  // namespace

int norm_threads(int64_t n) {
    return threads_for(n);
}

Status op_rms_norm(OpContext& ctx, const Tensor* dst) {
    if (dst->nrows() == 0) return Status::ok();
    const TV d = tv(dst), a = tv(dst->src[0]);
    launch_pdl(k_norm<0, false>, dim3(n_blocks(dst->nrows(), 1)), dim3(threads_for(dst->ne[0])), 0,
               ctx.stream, d, a, a, dst->param_f(0), TV{}, TV{});
    return launch_status("RMS_NORM");
}

Status op_norm(OpContext& ctx, const Tensor* dst) {
    if (dst->nrows() == 0) return Status::ok();
    const TV d = tv(dst), a = tv(dst->src[0]);
    launch_pdl(k_norm<1, false>, dim3(n_blocks(dst->nrows(), 1)), dim3(threads_for(dst->ne[0])), 0,
               ctx.stream, d, a, a, dst->param_f(0), TV{}, TV{});
    return launch_status("NORM");
}

bool can_fuse_rms_norm_mul(const Tensor* norm, const Tensor* mul) {
    return norm->op == Op::RMS_NORM && mul->op == Op::MUL && mul->src[0] == norm &&
           mul->src[1] != norm && same_shape(norm, mul);
}

// Writes mul (the norm's own result is not kept: the caller checked nothing else reads it).
Status op_rms_norm_mul(OpContext& ctx, const Tensor* norm, const Tensor* mul) {
    if (mul->nrows() == 0) return Status::ok();
    const TV d = tv(mul), a = tv(norm->src[0]), w = tv(mul->src[1]);
    launch_pdl(k_norm<0, true>, dim3(n_blocks(mul->nrows(), 1)), dim3(threads_for(mul->ne[0])), 0,
               ctx.stream, d, a, w, norm->param_f(0), TV{}, TV{});
    return launch_status("RMS_NORM+MUL");
}

bool can_fuse_add_rms_norm_mul(const Tensor* add, const Tensor* norm, const Tensor* mul) {
    if (add->op != Op::ADD || norm->src[0] != add || !can_fuse_rms_norm_mul(norm, mul)) {
        return false;
    }
    const Tensor* a = add->src[0];
    const Tensor* b = add->src[1];
    return same_shape(a, add) && same_shape(b, add) && a->type == Type::F32 &&
           b->type == Type::F32 && a->nb[0] == sizeof(float) && b->nb[0] == sizeof(float) &&
           add->nb[0] == sizeof(float);
}

// Writes add (the residual stream, kept) and mul; the norm's own result is not kept.
Status op_add_rms_norm_mul(OpContext& ctx, const Tensor* add, const Tensor* norm,
                           const Tensor* mul) {
    if (mul->nrows() == 0) return Status::ok();
    const TV d = tv(mul), a = tv(add->src[0]), b = tv(add->src[1]), s = tv(add),
             w = tv(mul->src[1]);
    launch_pdl(k_norm<0, true, true>, dim3(n_blocks(mul->nrows(), 1)),
               dim3(threads_for(mul->ne[0])), 0, ctx.stream, d, a, w, norm->param_f(0), b, s);
    return launch_status("ADD+RMS_NORM+MUL");
}

}  // namespace ferry::cuda
