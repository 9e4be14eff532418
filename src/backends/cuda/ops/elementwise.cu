// ADD, MUL (b broadcast by repetition), SCALE, SILU, GELU, SWIGLU, GEGLU: one block per row of
// the (contiguous) result, threads over the row; sources may have any row strides.
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

enum class EW { Add, Mul, Scale, Silu, Gelu, Swiglu, Geglu };

__device__ __forceinline__ float silu_f(float x) {
    return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float gelu_f(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

template <EW op>
__global__ void k_elementwise(TV d, TV a, TV b, float p0, float p1) {
    pdl_wait();  // launched with launch_pdl: nothing before this touches memory
    pdl_trigger();
    const int64_t r = blockIdx.x;
    const int64_t i1 = r % d.ne[1], i2 = (r / d.ne[1]) % d.ne[2], i3 = r / (d.ne[1] * d.ne[2]);
    float* out = reinterpret_cast<float*>(d.p + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
    const float* x =
        reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
    const float* y = nullptr;
    if constexpr (op == EW::Add || op == EW::Mul) {
        y = reinterpret_cast<const float*>(b.p + (i1 % b.ne[1]) * b.nb[1] +
                                           (i2 % b.ne[2]) * b.nb[2] + (i3 % b.ne[3]) * b.nb[3]);
    } else if constexpr (op == EW::Swiglu || op == EW::Geglu) {
        y = reinterpret_cast<const float*>(b.p + i1 * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3]);
    }
    for (int64_t i0 = threadIdx.x; i0 < d.ne[0]; i0 += blockDim.x) {
        const float v = x[i0];
        float o;
        if constexpr (op == EW::Add) {
            o = v + y[b.ne[0] == d.ne[0] ? i0 : i0 % b.ne[0]];
        } else if constexpr (op == EW::Mul) {
            o = v * y[b.ne[0] == d.ne[0] ? i0 : i0 % b.ne[0]];
        } else if constexpr (op == EW::Scale) {
            o = v * p0 + p1;
        } else if constexpr (op == EW::Silu) {
            o = silu_f(v);
        } else if constexpr (op == EW::Gelu) {
            o = gelu_f(v);
        } else if constexpr (op == EW::Swiglu) {
            o = silu_f(v) * y[i0];
        } else {
            o = gelu_f(v) * y[i0];
        }
        out[i0] = o;
    }
}

template <EW op>
Status launch(OpContext& ctx, const Tensor* dst, const char* name) {
    const TV d = tv(dst);
    const TV a = tv(dst->src[0]);
    const TV b = dst->src[1] ? tv(dst->src[1]) : a;
    const int64_t rows = dst->nrows();
    if (rows == 0 || dst->ne[0] == 0) return Status::ok();
    const int threads = dst->ne[0] >= 256 ? 256 : (dst->ne[0] >= 64 ? 64 : 32);
    launch_pdl(k_elementwise<op>, dim3(n_blocks(rows, 1)), dim3(threads), 0, ctx.stream, d, a, b,
               dst->op == Op::SCALE ? dst->param_f(0) : 0.0f,
               dst->op == Op::SCALE ? dst->param_f(1) : 0.0f);
    return launch_status(name);
}

}  // namespace

Status op_add(OpContext& ctx, const Tensor* dst) {
    return launch<EW::Add>(ctx, dst, "ADD");
}
Status op_mul(OpContext& ctx, const Tensor* dst) {
    return launch<EW::Mul>(ctx, dst, "MUL");
}
Status op_scale(OpContext& ctx, const Tensor* dst) {
    return launch<EW::Scale>(ctx, dst, "SCALE");
}
Status op_silu(OpContext& ctx, const Tensor* dst) {
    return launch<EW::Silu>(ctx, dst, "SILU");
}
Status op_gelu(OpContext& ctx, const Tensor* dst) {
    return launch<EW::Gelu>(ctx, dst, "GELU");
}
Status op_swiglu(OpContext& ctx, const Tensor* dst) {
    return launch<EW::Swiglu>(ctx, dst, "SWIGLU");
}
Status op_geglu(OpContext& ctx, const Tensor* dst) {
    return launch<EW::Geglu>(ctx, dst, "GEGLU");
}

}  // namespace ferry::cuda
