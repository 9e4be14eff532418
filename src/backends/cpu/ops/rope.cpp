// ROPE: rotary position embedding of the first n_dims elements of each row.
//
// theta_i = pos * freq_scale * freq_base^(-2i / n_dims) / ff[i], i in [0, n_dims / 2), with
// ff the optional frequency factors (src[2], Llama 3's rope_freqs; 1 without). The angles are
// computed in double from the exact power (not by repeated multiplication, which drifts), and
// cos/sin are cached per position (see AngleCache): rows of one token (all its heads), and the
// ROPE nodes of every layer, share them. Normal mode
// rotates adjacent pairs (x[2i], x[2i+1]); NeoX mode rotates (x[i], x[i + n_dims/2]). Elements
// past n_dims are copied.
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

// cos/sin of every angle of the positions seen, per thread, reused across calls with the same
// parameters: the 2 * n_layer ROPE nodes of a forward pass share positions, so only the first
// one pays for pow/sincos. The values come from the same expressions whether cached or not, so
// results do not depend on the cache, the order of calls or the thread count.
struct AngleCache {
    double base = 0.0, freq_scale = 0.0;
    int64_t n_dims = -1;
    std::vector<float> factors;    // [half] frequency factors (empty: none)
    std::vector<double> inv_freq;  // [half]
    int64_t lo = 0;                // first cached position
    std::vector<float> cs;         // [positions][2 * half]: cos then sin
    std::vector<uint8_t> valid;    // per cached position

    // At most this many consecutive positions are cached; a position outside the window
    // restarts it there.
    static constexpr int64_t kMaxPositions = 4096;

    void reset(double b, double fs, int64_t nd, const float* ff) {
        base = b;
        freq_scale = fs;
        n_dims = nd;
        const int64_t half = nd / 2;
        if (ff) {
            factors.assign(ff, ff + half);
        } else {
            factors.clear();
        }
        inv_freq.resize(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; i++) {
            const double f = ff ? static_cast<double>(ff[i]) : 1.0;
            inv_freq[static_cast<size_t>(i)] =
                fs * std::pow(b, -2.0 * static_cast<double>(i) / static_cast<double>(nd)) / f;
        }
        valid.clear();
        cs.clear();
    }
    // The factors are compared by value: a cached table must never outlive the data it came
    // from (another model, or a tensor rewritten in place).
    bool matches(double b, double fs, int64_t nd, const float* ff) const {
        if (nd != n_dims || std::memcmp(&b, &base, sizeof b) != 0 ||
            std::memcmp(&fs, &freq_scale, sizeof fs) != 0) {
            return false;
        }
        if (!ff) return factors.empty();
        return factors.size() == static_cast<size_t>(nd / 2) &&
               std::memcmp(ff, factors.data(), factors.size() * sizeof(float)) == 0;
    }
    void fill(int32_t position, float* out) const {
        const int64_t half = n_dims / 2;
        const double ps = static_cast<double>(position);
        for (int64_t i = 0; i < half; i++) {
            const double theta = ps * inv_freq[static_cast<size_t>(i)];
            out[i] = static_cast<float>(std::cos(theta));
            out[half + i] = static_cast<float>(std::sin(theta));
        }
    }
    // cos (then sin, half further) of position's angles; valid until the next call.
    const float* get(int32_t position) {
        const size_t stride = static_cast<size_t>(n_dims / 2) * 2;
        int64_t idx = static_cast<int64_t>(position) - lo;
        if (valid.empty() || idx < 0 || idx >= kMaxPositions) {
            valid.clear();
            lo = position;
            idx = 0;
        }
        if (static_cast<size_t>(idx) >= valid.size()) {
            valid.resize(static_cast<size_t>(idx) + 1, 0);
            cs.resize(valid.size() * stride);
        }
        float* slot = cs.data() + static_cast<size_t>(idx) * stride;
        if (!valid[static_cast<size_t>(idx)]) {
            fill(position, slot);
            valid[static_cast<size_t>(idx)] = 1;
        }
        return slot;
    }
};

thread_local AngleCache t_angles;

}  // namespace

void op_rope(const ComputeParams& p, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* pos = dst->src[1];
    const int64_t ne1 = a->ne[1], ne2 = a->ne[2];
    const int64_t n_dims = dst->op_params[0];
    const int64_t ne0 = a->ne[0];
    const int mode = dst->op_params[1];
    const double base = dst->param_f(2);
    const double freq_scale = dst->param_f(3);
    const int64_t half = n_dims / 2;

    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    if (r0 >= r1) return;

    const float* ff = dst->src[2] ? static_cast<const float*>(dst->src[2]->data) : nullptr;
    AngleCache& ac = t_angles;
    if (!ac.matches(base, freq_scale, n_dims, ff)) ac.reset(base, freq_scale, n_dims, ff);

    const int32_t* positions = static_cast<const int32_t*>(pos->data);
    int64_t cached_token = -1;
    const float* cos_t = nullptr;
    const float* sin_t = nullptr;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        if (i2 != cached_token) {
            cos_t = ac.get(positions[i2]);
            sin_t = cos_t + half;
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
    return 0;
}

}  // namespace ferry::cpu
