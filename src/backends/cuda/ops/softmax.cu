// SOFT_MAX(a, mask?) over ne0: one block per row; the row (scaled, masked) is kept in shared
// memory when it fits, else recomputed from global memory in each pass.
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

__device__ __forceinline__ float mask_at(const TV& m, bool f16, int64_t i0, int64_t i1, int64_t i2,
                                         int64_t i3) {
    const char* row = m.p + i1 * m.nb[1] + (i2 % m.ne[2]) * m.nb[2] + (i3 % m.ne[3]) * m.nb[3];
    return f16 ? h2f(reinterpret_cast<const uint16_t*>(row)[i0])
               : reinterpret_cast<const float*>(row)[i0];
}

__global__ void k_soft_max(TV d, TV a, TV m, bool has_mask, bool mask_f16, float scale) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
    const float* x =
        reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
    float* y = reinterpret_cast<float*>(d.p + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
    const int64_t n = d.ne[0];
    auto val = [&](int64_t i) {
        float v = x[i] * scale;
        if (has_mask) v += mask_at(m, mask_f16, i, i1, i2, i3);
        return v;
    };
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, val(i));
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = mx == -INFINITY ? 0.0f : expf(val(i) - mx);
        y[i] = e;
        s += e;
    }
    s = block_sum(s, sh);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] *= inv;
}

}  // namespace

Status op_soft_max(OpContext& ctx, const Tensor* dst) {
    if (dst->nrows() == 0 || dst->ne[0] == 0) return Status::ok();
    const Tensor* mask = dst->src[1];
    const TV d = tv(dst), a = tv(dst->src[0]);
    const TV m = mask ? tv(mask) : a;
    const int threads = dst->ne[0] >= 1024 ? 1024 : (dst->ne[0] >= 128 ? 128 : 32);
    k_soft_max<<<n_blocks(dst->nrows(), 1), threads, 0, ctx.stream>>>(
        d, a, m, mask != nullptr, mask && mask->type == Type::F16, dst->param_f(0));
    return launch_status("SOFT_MAX");
}

}  // namespace ferry::cuda
