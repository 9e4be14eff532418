// RMS_NORM and NORM over ne0. Row statistics accumulate in double (eight independent lanes,
// summed in a fixed order), so results do not depend on the thread count.
#include <cmath>

#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

double sum_f64(const float* x, int64_t n) {
    double acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) acc[j] += static_cast<double>(x[i + j]);
    }
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += acc[j];
    for (; i < n; i++) s += static_cast<double>(x[i]);
    return s;
}

// sum((x - c)^2) in double
double sum_sq_f64(const float* x, int64_t n, double c) {
    double acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) {
            const double d = static_cast<double>(x[i + j]) - c;
            acc[j] += d * d;
        }
    }
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += acc[j];
    for (; i < n; i++) {
        const double d = static_cast<double>(x[i]) - c;
        s += d * d;
    }
    return s;
}

template <class RowFn>
void for_rows(const ComputeParams& p, Tensor* dst, RowFn fn) {
    const Tensor* a = dst->src[0];
    const int64_t ne1 = a->ne[1], ne2 = a->ne[2];
    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        fn(reinterpret_cast<const float*>(row(a, i1, i2, i3)),
           reinterpret_cast<float*>(row(dst, i1, i2, i3)));
    }
}

}  // namespace

// y = x / sqrt(mean(x^2) + eps)
void op_rms_norm(const ComputeParams& p, Tensor* dst) {
    const int64_t n = dst->ne[0];
    const double eps = dst->param_f(0);
    for_rows(p, dst, [n, eps](const float* x, float* y) {
        if (n == 0) return;
        const double mean_sq = sum_sq_f64(x, n, 0.0) / static_cast<double>(n);
        const float scale = static_cast<float>(1.0 / std::sqrt(mean_sq + eps));
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
    });
}

// y = (x - mean) / sqrt(var + eps), population variance (two passes in double)
void op_norm(const ComputeParams& p, Tensor* dst) {
    const int64_t n = dst->ne[0];
    const double eps = dst->param_f(0);
    for_rows(p, dst, [n, eps](const float* x, float* y) {
        if (n == 0) return;
        const double mean = sum_f64(x, n) / static_cast<double>(n);
        const double var = sum_sq_f64(x, n, mean) / static_cast<double>(n);
        const double scale = 1.0 / std::sqrt(var + eps);
        for (int64_t i = 0; i < n; i++) {
            y[i] = static_cast<float>((static_cast<double>(x[i]) - mean) * scale);
        }
    });
}

}  // namespace ferry::cpu
