// GET_ROWS (any storage type -> F32, I32 -> I32) and SET_ROWS (F32 rows into F32/F16/BF16 or
// Q4_0/Q4_1/Q8_0 rows). Indices come from data: each is checked on the device, and an index
// out of range is reported through the error word and its row is not written.
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

// One block per output row (i, j, k) = blockIdx.x flattened over [idx.ne0, idx.ne1, idx.ne2].
__global__ void k_get_rows(TV d, TV a, TV idx, Type t, DeviceError* err) {
    pdl_wait();  // launched with launch_pdl: nothing before this touches memory
    pdl_trigger();
    const int64_t r = blockIdx.x;
    const int64_t i = r % idx.ne[0], j = (r / idx.ne[0]) % idx.ne[1],
                  k = r / (idx.ne[0] * idx.ne[1]);
    const int32_t row =
        *reinterpret_cast<const int32_t*>(idx.p + i * idx.nb[0] + j * idx.nb[1] + k * idx.nb[2]);
    if (row < 0 || row >= a.ne[1]) {
        if (threadIdx.x == 0) report_error(err, Op::GET_ROWS, row, a.ne[1], r);
        return;
    }
    const char* src = a.p + row * a.nb[1] + j * a.nb[2] + k * a.nb[3];
    char* out = d.p + i * d.nb[1] + j * d.nb[2] + k * d.nb[3];
    if (t == Type::I32) {
        for (int64_t e = threadIdx.x; e < d.ne[0]; e += blockDim.x) {
            reinterpret_cast<int32_t*>(out)[e] = reinterpret_cast<const int32_t*>(src)[e];
        }
        return;
    }
    for (int64_t e = threadIdx.x; e < d.ne[0]; e += blockDim.x) {
        reinterpret_cast<float*>(out)[e] = load_elem(t, src, e);
    }
}

// One block per source row; plain destinations: threads over elements; block formats: one
// thread per 32-element block.
__global__ void k_set_rows(TV d, TV s, TV idx, Type t, DeviceError* err) {
    pdl_wait();  // launched with launch_pdl: nothing before this touches memory
    pdl_trigger();
    const int64_t r = blockIdx.x;
    const int64_t i = r % s.ne[1], j = (r / s.ne[1]) % s.ne[2], k = r / (s.ne[1] * s.ne[2]);
    const int32_t row =
        *reinterpret_cast<const int32_t*>(idx.p + i * idx.nb[0] + j * idx.nb[1] + k * idx.nb[2]);
    if (row < 0 || row >= d.ne[1]) {
        if (threadIdx.x == 0) report_error(err, Op::SET_ROWS, row, d.ne[1], r);
        return;
    }
    const float* x = reinterpret_cast<const float*>(s.p + i * s.nb[1] + j * s.nb[2] + k * s.nb[3]);
    char* out = d.p + row * d.nb[1] + j * d.nb[2] + k * d.nb[3];
    if (t == Type::Q4_0 || t == Type::Q4_1 || t == Type::Q8_0) {
        const int bs = t == Type::Q4_0 ? 18 : (t == Type::Q4_1 ? 20 : 34);
        for (int64_t b = threadIdx.x; b < s.ne[0] / 32; b += blockDim.x) {
            quantize_block(t, x + 32 * b, out + b * bs);
        }
        return;
    }
    for (int64_t e = threadIdx.x; e < s.ne[0]; e += blockDim.x) store_plain(t, out, e, x[e]);
}

}  // namespace

Status op_get_rows(OpContext& ctx, const Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* idx = dst->src[1];
    const int64_t n = idx->ne[0] * idx->ne[1] * idx->ne[2];
    if (n == 0) return Status::ok();
    launch_pdl(k_get_rows, dim3(n_blocks(n, 1)), dim3(dst->ne[0] >= 256 ? 256 : 32), 0, ctx.stream,
               tv(dst), tv(a), tv(idx), a->type, ctx.err);
    return launch_status("GET_ROWS");
}

Status op_set_rows(OpContext& ctx, const Tensor* dst) {
    const Tensor* d = dst->src[0];
    const Tensor* s = dst->src[1];
    const Tensor* idx = dst->src[2];
    const int64_t n = s->nrows();
    if (n == 0) return Status::ok();
    launch_pdl(k_set_rows, dim3(n_blocks(n, 1)), dim3(s->ne[0] >= 256 ? 256 : 32), 0, ctx.stream,
               tv(d), tv(s), tv(idx), d->type, ctx.err);
    return launch_status("SET_ROWS");
}

}  // namespace ferry::cuda
