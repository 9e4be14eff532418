// ADD and MUL: out = a op b, b broadcast over a by modulo in every dimension.
#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

struct AddOp {
    static float apply(float x, float y) { return x + y; }
};
struct MulOp {
    static float apply(float x, float y) { return x * y; }
};

template <class Op>
void binary(const ComputeParams& p, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    const int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    const int64_t nb0 = b->ne[0];
    int64_t r0, r1;
    split_rows(a->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / ne1 / ne2;
        const float* x = reinterpret_cast<const float*>(row(a, i1, i2, i3));
        const float* y =
            reinterpret_cast<const float*>(row(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]));
        float* out = reinterpret_cast<float*>(row(dst, i1, i2, i3));
        if (nb0 == ne0) {
            for (int64_t i = 0; i < ne0; i++) out[i] = Op::apply(x[i], y[i]);
        } else if (nb0 == 1) {
            const float y0 = y[0];
            for (int64_t i = 0; i < ne0; i++) out[i] = Op::apply(x[i], y0);
        } else {
            for (int64_t c = 0; c < ne0; c += nb0) {
                for (int64_t i = 0; i < nb0; i++) out[c + i] = Op::apply(x[c + i], y[i]);
            }
        }
    }
}

}  // namespace

void op_add(const ComputeParams& p, Tensor* dst) {
    binary<AddOp>(p, dst);
}
void op_mul(const ComputeParams& p, Tensor* dst) {
    binary<MulOp>(p, dst);
}

}  // namespace ferry::cpu
