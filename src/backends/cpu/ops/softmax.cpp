// SOFT_MAX over ne0: y = softmax(x * scale + mask). The maximum is subtracted before exp; the
// sum accumulates in double. Masked entries (-inf) give exactly 0; a row with no finite entry
// gives all zeros rather than NaN.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

constexpr int64_t kChunk = 64;

}  // namespace

void op_soft_max(const ComputeParams& p, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* mask = dst->src[1];
    const float scale = dst->param_f(0);
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        const float* x = reinterpret_cast<const float*>(row(a, i1, i2, i3));
        float* y = reinterpret_cast<float*>(row(dst, i1, i2, i3));

        // y = x * scale + mask, in chunks (the mask row converts through a small buffer, so
        // y may even alias x)
        if (!mask) {
            for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * scale;
        } else {
            const uint8_t* m = row(mask, i1, i2 % mask->ne[2], i3 % mask->ne[3]);
            float tmp[kChunk];
            for (int64_t c = 0; c < ne0; c += kChunk) {
                const int64_t len = std::min(kChunk, ne0 - c);
                const float* mf;
                if (mask->type == Type::F16) {
                    kern::f16_to_f32_row(reinterpret_cast<const fp16_t*>(m) + c, tmp, len);
                    mf = tmp;
                } else {
                    mf = reinterpret_cast<const float*>(m) + c;
                }
                for (int64_t i = 0; i < len; i++) y[c + i] = x[c + i] * scale + mf[i];
            }
        }

        const float max = kern::row_max(y, ne0);
        if (max == -std::numeric_limits<float>::infinity()) {
            std::memset(y, 0, static_cast<size_t>(ne0) * sizeof(float));
            continue;
        }
        for (int64_t i = 0; i < ne0; i++) y[i] = kern::exp_f32(y[i] - max);
        double acc[8] = {};
        int64_t i = 0;
        for (; i + 8 <= ne0; i += 8) {
            for (int j = 0; j < 8; j++) acc[j] += static_cast<double>(y[i + j]);
        }
        double sum = 0.0;
        for (int j = 0; j < 8; j++) sum += acc[j];
        for (; i < ne0; i++) sum += static_cast<double>(y[i]);
        const float inv = static_cast<float>(1.0 / sum);
        for (i = 0; i < ne0; i++) y[i] *= inv;
    }
}

}  // namespace ferry::cpu
