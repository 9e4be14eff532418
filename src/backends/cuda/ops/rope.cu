// ROPE: rotary position embedding of the first n_dims elements of each row (normal mode:
// adjacent pairs; NeoX: x[i] with x[i + n_dims/2]); elements past n_dims are copied. Angles
// are computed in double from the exact power, as the reference and the CPU kernel do, so long
// positions keep full precision. Optional frequency factors (Llama 3's rope_freqs.weight,
// src[2]) divide the angles.
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

__global__ void k_rope(TV d, TV a, const int32_t* pos, const char* ff, int64_t ff_nb0, int n_dims,
                       int mode, double base, double fscale) {
    pdl_wait();  // launched with launch_pdl: nothing before this touches memory
    pdl_trigger();
    const int64_t r = blockIdx.x;
    const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
    const float* x =
        reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
    float* y = reinterpret_cast<float*>(d.p + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
    const double p = static_cast<double>(pos[i2]);
    const int half = n_dims / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float2 r = rope_cos_sin(p, i, n_dims, base, fscale, ff, ff_nb0);
        const float cs = r.x, sn = r.y;
        const int j0 = mode == kRopeNeox ? i : 2 * i;
        const int j1 = mode == kRopeNeox ? i + half : 2 * i + 1;
        const float x0 = x[j0], x1 = x[j1];
        y[j0] = x0 * cs - x1 * sn;
        y[j1] = x0 * sn + x1 * cs;
    }
    for (int64_t i = n_dims + threadIdx.x; i < d.ne[0]; i += blockDim.x) y[i] = x[i];
}

// Prefill: one block per position (i2, i3) for all rows (heads) i1 of it. The angles depend
// on the position and the pair only, so each is computed once (same double arithmetic as
// k_rope, hence the same bits) into shared memory and applied to every head.
constexpr int kRopeMaxHalf = 256;  // n_dims / 2 at most (checked by the launcher)

__global__ void k_rope_heads(TV d, TV a, const int32_t* pos, const char* ff, int64_t ff_nb0,
                             int n_dims, int mode, double base, double fscale) {
    __shared__ float s_cs[kRopeMaxHalf], s_sn[kRopeMaxHalf];
    pdl_wait();
    pdl_trigger();
    const int64_t i2 = blockIdx.x, i3 = blockIdx.y;
    const double p = static_cast<double>(pos[i2]);
    const int half = n_dims / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float2 r = rope_cos_sin(p, i, n_dims, base, fscale, ff, ff_nb0);
        s_cs[i] = r.x;
        s_sn[i] = r.y;
    }
    __syncthreads();
    const int64_t n1 = d.ne[1];
    for (int64_t t = threadIdx.x; t < n1 * half; t += blockDim.x) {
        const int64_t i1 = t / half;
        const int i = static_cast<int>(t % half);
        const float* x =
            reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
        float* y = reinterpret_cast<float*>(d.p + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
        const float cs = s_cs[i], sn = s_sn[i];
        const int j0 = mode == kRopeNeox ? i : 2 * i;
        const int j1 = mode == kRopeNeox ? i + half : 2 * i + 1;
        const float x0 = x[j0], x1 = x[j1];
        y[j0] = x0 * cs - x1 * sn;
        y[j1] = x0 * sn + x1 * cs;
    }
    const int64_t rest = d.ne[0] - n_dims;
    for (int64_t t = threadIdx.x; rest > 0 && t < n1 * rest; t += blockDim.x) {
        const int64_t i1 = t / rest, i = n_dims + t % rest;
        const float* x =
            reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
        float* y = reinterpret_cast<float*>(d.p + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
        y[i] = x[i];
    }
}

}  // namespace

Status op_rope(OpContext& ctx, const Tensor* dst) {
    if (dst->nrows() == 0) return Status::ok();
    const int n_dims = dst->op_params[0];
    const int threads = n_dims / 2 >= 64 ? 64 : 32;
    const Tensor* ff = dst->src[2];
    // Many positions (prefill): a block per position, the angles shared by its heads. The
    // in-place case (d == a) stays safe: each element is read and written by one thread.
    if (dst->ne[2] * dst->ne[3] >= 16 && n_dims / 2 <= kRopeMaxHalf && dst->ne[2] <= INT32_MAX &&
        dst->ne[3] <= 65535) {
        launch_pdl(k_rope_heads,
                   dim3(static_cast<unsigned>(dst->ne[2]), static_cast<unsigned>(dst->ne[3])),
                   dim3(128), 0, ctx.stream, tv(dst), tv(dst->src[0]),
                   reinterpret_cast<const int32_t*>(device_ptr(dst->src[1])),
                   ff ? static_cast<const char*>(device_ptr(ff)) : nullptr,
                   ff ? static_cast<int64_t>(ff->nb[0]) : int64_t{0}, n_dims, dst->op_params[1],
                   static_cast<double>(dst->param_f(2)), static_cast<double>(dst->param_f(3)));
        return launch_status("ROPE");
    }
    launch_pdl(k_rope, dim3(n_blocks(dst->nrows(), 1)), dim3(threads), 0, ctx.stream, tv(dst),
               tv(dst->src[0]), reinterpret_cast<const int32_t*>(device_ptr(dst->src[1])),
               ff ? static_cast<const char*>(device_ptr(ff)) : nullptr,
               ff ? static_cast<int64_t>(ff->nb[0]) : int64_t{0}, n_dims, dst->op_params[1],
               static_cast<double>(dst->param_f(2)), static_cast<double>(dst->param_f(3)));
    return launch_status("ROPE");
}

}  // namespace ferry::cuda
