// Row reductions: ARGMAX (first index of the maximum), SUM_ROWS (sum in double) and TOP_K
// (the k largest with their indices).
#include <limits>
#include <utility>

#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"
#include "core/top-k.h"

namespace ferry::cpu {

namespace {

using kern::row;

}  // namespace

// Two vectorized passes: the maximum (NaN ignored), then its first position.
// A row of NaN only gives 0.
void op_argmax(const ComputeParams& p, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    int32_t* out = static_cast<int32_t*>(dst->data);
    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        const float* x = reinterpret_cast<const float*>(row(a, i1, i2, i3));
        const float max = kern::row_max(x, ne0);
        int64_t best = 0;
        for (int64_t i = 0; i < ne0; i++) {
            if (x[i] == max) {
                best = i;
                break;
            }
        }
        out[r] = static_cast<int32_t>(best);
    }
}

void op_sum_rows(const ComputeParams& p, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    float* out = static_cast<float*>(dst->data);
    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        const float* x = reinterpret_cast<const float*>(row(a, i1, i2, i3));
        double acc[8] = {};
        int64_t i = 0;
        for (; i + 8 <= ne0; i += 8) {
            for (int j = 0; j < 8; j++) acc[j] += static_cast<double>(x[i + j]);
        }
        double s = 0.0;
        for (int j = 0; j < 8; j++) s += acc[j];
        for (; i < ne0; i++) s += static_cast<double>(x[i]);
        out[r] = static_cast<float>(s);
    }
}

// One pass per row (core/top-k.h); rows split over the threads, each selecting in its own
// slice of the scratch (top_k_work_size: charged like every kernel's scratch when served).
size_t top_k_work_size(const Tensor* node, int n_threads) {
    return static_cast<size_t>(n_threads) * top_k_room(static_cast<size_t>(node->op_params[0])) *
           sizeof(std::pair<float, int32_t>);
}

void op_top_k(const ComputeParams& p, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    const auto k = static_cast<size_t>(dst->op_params[0]);
    float* out = static_cast<float*>(dst->data);
    auto* best = static_cast<std::pair<float, int32_t>*>(p.wdata) +
                 static_cast<size_t>(p.ith) * top_k_room(k);
    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        top_k_of(reinterpret_cast<const float*>(row(a, i1, i2, i3)), static_cast<size_t>(ne0), k,
                 best);
        float* o = out + static_cast<size_t>(r) * 2 * k;
        for (size_t j = 0; j < k; j++) {
            o[j] = best[j].first;
            o[k + j] = static_cast<float>(best[j].second);
        }
    }
}

}  // namespace ferry::cpu
