// Elementwise ops: SCALE, SILU, GELU and the gated SWIGLU / GEGLU.
//
// Activation choices (documented for comparison with llama.cpp and the float64 oracle):
//  - SILU(x) = x / (1 + exp(-x)), exp in float (kern::exp_f32, ~1 ulp).
//  - GELU is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), llama.cpp's
//    default GELU. It is evaluated through the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)),
//    which has no cancellation for large |x| (x -> 0 for x -> -inf, x for x -> +inf).
#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

inline float silu(float x) {
    return x * kern::sigmoid_f32(x);
}

inline float gelu(float x) {
    constexpr float kSqrt2OverPi = 0.79788456080286535588f;
    constexpr float kCoef = 0.044715f;
    const float u = kSqrt2OverPi * x * (1.0f + kCoef * x * x);
    return x * kern::sigmoid_f32(2.0f * u);
}

// Applies fn(x[i]) (unary) or fn(x[i], y[i]) (gated) row by row.
template <class Fn>
void unary(const ComputeParams& p, Tensor* dst, Fn fn) {
    const Tensor* a = dst->src[0];
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        const float* x = reinterpret_cast<const float*>(row(a, i1, i2, i3));
        float* out = reinterpret_cast<float*>(row(dst, i1, i2, i3));
        for (int64_t i = 0; i < ne0; i++) out[i] = fn(x[i]);
    }
}

template <class Fn>
void gated(const ComputeParams& p, Tensor* dst, Fn fn) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        const float* x = reinterpret_cast<const float*>(row(a, i1, i2, i3));
        const float* y = reinterpret_cast<const float*>(row(b, i1, i2, i3));
        float* out = reinterpret_cast<float*>(row(dst, i1, i2, i3));
        for (int64_t i = 0; i < ne0; i++) out[i] = fn(x[i]) * y[i];
    }
}

}  // namespace

// a * s + bias (multiply, then add: no fused multiply-add, as llama.cpp)
void op_scale(const ComputeParams& p, Tensor* dst) {
    const float s = dst->param_f(0), bias = dst->param_f(1);
    if (bias == 0.0f) {
        unary(p, dst, [s](float x) { return x * s; });
    } else {
        unary(p, dst, [s, bias](float x) { return x * s + bias; });
    }
}

// Lambdas (not function pointers) so the element function inlines into the row loops.
void op_silu(const ComputeParams& p, Tensor* dst) {
    unary(p, dst, [](float x) { return silu(x); });
}
void op_gelu(const ComputeParams& p, Tensor* dst) {
    unary(p, dst, [](float x) { return gelu(x); });
}
void op_swiglu(const ComputeParams& p, Tensor* dst) {
    gated(p, dst, [](float x) { return silu(x); });
}
void op_geglu(const ComputeParams& p, Tensor* dst) {
    gated(p, dst, [](float x) { return gelu(x); });
}

}  // namespace ferry::cpu
