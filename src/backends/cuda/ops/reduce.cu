// ARGMAX (first index of the maximum) and SUM_ROWS: one block per row.
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

__global__ void k_argmax(TV d, TV a) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    const int64_t r = blockIdx.x;
    const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    const float* x =
        reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
    float best = -INFINITY;
    int64_t bi = -1;
    for (int64_t i = threadIdx.x; i < a.ne[0]; i += blockDim.x) {
        const float v = x[i];
        if (bi < 0 || v > best) {
            best = v;
            bi = i;
        }
    }
    // Ties (and NaN-free equal values) go to the lower index, as the reference's strict '>'.
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > best || (ov == best && oi < bi))) {
            best = ov;
            bi = oi;
        }
    }
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0) {
        sv[w] = best;
        si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < static_cast<int>(blockDim.x / 32); k++) {
            if (si[k] >= 0 && (bi < 0 || sv[k] > best || (sv[k] == best && si[k] < bi))) {
                best = sv[k];
                bi = si[k];
            }
        }
        reinterpret_cast<int32_t*>(d.p)[r] = static_cast<int32_t>(bi < 0 ? 0 : bi);
    }
}

__global__ void k_sum_rows(TV d, TV a) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    const float* x =
        reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < a.ne[0]; i += blockDim.x) s += x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) reinterpret_cast<float*>(d.p)[r] = s;
}

}  // namespace

Status op_argmax(OpContext& ctx, const Tensor* dst) {
    const Tensor* a = dst->src[0];
    if (a->nrows() == 0) return Status::ok();
    k_argmax<<<n_blocks(a->nrows(), 1), 256, 0, ctx.stream>>>(tv(dst), tv(a));
    return launch_status("ARGMAX");
}

Status op_sum_rows(OpContext& ctx, const Tensor* dst) {
    const Tensor* a = dst->src[0];
    if (a->nrows() == 0) return Status::ok();
    k_sum_rows<<<n_blocks(a->nrows(), 1), 256, 0, ctx.stream>>>(tv(dst), tv(a));
    return launch_status("SUM_ROWS");
}

}  // namespace ferry::cuda
