// ROPE: rotary position embedding of the first n_dims elements of each row.
//
// theta_i = pos * freq_scale * freq_base^(-2i / n_dims), i in [0, n_dims / 2). The angles are
// computed in double from the exact power (not by repeated multiplication, which drifts), and
// cos/sin are cached per token: rows of one token (all its heads) share them. Normal mode
// rotates adjacent pairs (x[2i], x[2i+1]); NeoX mode rotates (x[i], x[i + n_dims/2]). Elements
// past n_dims are copied.
#include <cmath>
#include <cstring>

#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

// Per-thread scratch: n_dims/2 inverse frequencies (double), then cos and sin (float).
size_t rope_scratch_bytes(int64_t ne0) {
    const size_t half = static_cast<size_t>(ne0 / 2 + 1);
    return half * sizeof(double) + 2 * half * sizeof(float);
}

}  // namespace

void op_rope(const ComputeParams& p, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* pos = dst->src[1];
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    const int64_t n_dims = dst->op_params[0];
    const int mode = dst->op_params[1];
    const double base = dst->param_f(2);
    const double freq_scale = dst->param_f(3);
    const int64_t half = n_dims / 2;

    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    if (r0 >= r1) return;

    uint8_t* scratch = static_cast<uint8_t*>(kern::thread_scratch(p, rope_scratch_bytes(ne0)));
    double* inv_freq = reinterpret_cast<double*>(scratch);
    float* cos_t = reinterpret_cast<float*>(scratch + static_cast<size_t>(ne0 / 2 + 1) * 8);
    float* sin_t = cos_t + (ne0 / 2 + 1);
    for (int64_t i = 0; i < half; i++) {
        inv_freq[i] = freq_scale *
                      std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_dims));
    }

    const int32_t* positions = static_cast<const int32_t*>(pos->data);
    int64_t cached_token = -1;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        if (i2 != cached_token) {
            const double ps = static_cast<double>(positions[i2]);
            for (int64_t i = 0; i < half; i++) {
                const double theta = ps * inv_freq[i];
                cos_t[i] = static_cast<float>(std::cos(theta));
                sin_t[i] = static_cast<float>(std::sin(theta));
            }
            cached_token = i2;
        }
        const float* x = reinterpret_cast<const float*>(row(a, i1, i2, i3));
        float* y = reinterpret_cast<float*>(row(dst, i1, i2, i3));
        if (mode == kRopeNeox) {
            for (int64_t i = 0; i < half; i++) {
                const float x0 = x[i], x1 = x[i + half];
                y[i] = x0 * cos_t[i] - x1 * sin_t[i];
                y[i + half] = x0 * sin_t[i] + x1 * cos_t[i];
            }
        } else {
            for (int64_t i = 0; i < half; i++) {
                const float x0 = x[2 * i], x1 = x[2 * i + 1];
                y[2 * i] = x0 * cos_t[i] - x1 * sin_t[i];
                y[2 * i + 1] = x0 * sin_t[i] + x1 * cos_t[i];
            }
        }
        if (n_dims < ne0) {
            std::memmove(y + n_dims, x + n_dims, static_cast<size_t>(ne0 - n_dims) * sizeof(float));
        }
    }
}

size_t rope_work_size(const Tensor* node, int n_threads) {
    return kern::scratch_size(rope_scratch_bytes(node->src[0]->ne[0]), n_threads);
}

}  // namespace ferry::cpu
