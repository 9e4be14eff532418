// GET_ROWS and SET_ROWS: gather / scatter rows by I32 indices, with type conversion.
//
// Indices come from data (token ids, KV-cache slots), so each one is checked against the row
// count before any access; a bad one is reported through the error sink and its row skipped.
#include <cstring>
#include <vector>

#include "backends/cpu/cpu-backend.h"
#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

int32_t load_index(const Tensor* idx, int64_t i0, int64_t i1, int64_t i2) {
    int32_t v;
    std::memcpy(&v, kern::at(idx, i0, i1, i2, 0), sizeof(v));
    return v;
}

}  // namespace

// out [a.ne0, idx.ne0, idx.ne1, idx.ne2] row (i, j, k) = a row idx[i, j, k] of matrix (j, k).
void op_get_rows(const ComputeParams& p, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* idx = dst->src[1];
    const int64_t n = idx->ne[0], n1 = idx->ne[1], n2 = idx->ne[2];
    const int64_t ne0 = a->ne[0];
    // A weight the CPU device repacked (a tied embedding, say): rows of full groups are
    // unpacked to their GGUF bytes first.
    bool partial = false;
    const HostBuffer::Repacked* rp = repacked_weight(a, &partial);
    if (partial) {
        if (p.ith == 0 && p.errors) {
            p.errors->fail(strfmt("GET_ROWS '%s': %s is a view into a repacked weight", dst->name,
                                  describe(a).c_str()));
        }
        return;
    }
    std::vector<uint8_t> unpacked(rp ? a->nb[1] : 0);
    const int64_t grouped = rp ? rp->grouped_rows() : 0;
    int64_t r0, r1;
    split_rows(n * n1 * n2, p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i = r % n, j = r / n % n1, k = r / n / n1;
        const int32_t v = load_index(idx, i, j, k);
        if (v < 0 || v >= a->ne[1]) {
            if (p.errors)
                p.errors->fail(
                    strfmt("GET_ROWS '%s': index %d at [%lld, %lld, %lld] out of range "
                           "[0, %lld) of %s",
                           dst->name, v, static_cast<long long>(i), static_cast<long long>(j),
                           static_cast<long long>(k), static_cast<long long>(a->ne[1]),
                           describe(a).c_str()));
            continue;
        }
        if (v < grouped) {
            rp->unpack_row(static_cast<const uint8_t*>(a->data), a->nb[1], v, unpacked.data());
            kern::row_to_f32(a->type, unpacked.data(), reinterpret_cast<float*>(row(dst, i, j, k)),
                             ne0);
        } else if (a->type == Type::I32) {  // index tables gather as they are
            std::memcpy(row(dst, i, j, k), row(a, v, j, k), static_cast<size_t>(ne0) * 4);
        } else {
            kern::row_to_f32(a->type, row(a, v, j, k), reinterpret_cast<float*>(row(dst, i, j, k)),
                             ne0);
        }
    }
}

// dst row idx[i, j, k] of matrix (j, k) = src row (i, j, k). Threads split the destination
// rows (each writes only rows it owns, scanning all indices of the matrices it touches), so a
// repeated index resolves to the last source row in every thread configuration. The bad
// indices of matrix m are reported by thread m % nth.
void op_set_rows(const ComputeParams& p, Tensor* dst) {
    const Tensor* src = dst->src[1];
    const Tensor* idx = dst->src[2];
    const int64_t ne0 = dst->ne[0], ne1 = dst->ne[1], ne2 = dst->ne[2], ne3 = dst->ne[3];
    const int64_t n = src->ne[1];
    int64_t r0, r1;
    split_rows(ne1 * ne2 * ne3, p.ith, p.nth, &r0, &r1);
    for (int64_t i3 = 0; i3 < ne3; i3++) {
        for (int64_t i2 = 0; i2 < ne2; i2++) {
            const int64_t m = i3 * ne2 + i2;
            const int64_t base = m * ne1;
            const bool reporter = m % p.nth == p.ith;
            const bool owns_any = base < r1 && base + ne1 > r0;
            if (!reporter && !owns_any) continue;
            for (int64_t i = 0; i < n; i++) {
                const int32_t v = load_index(idx, i, i2, i3);
                if (v < 0 || v >= ne1) {
                    if (reporter && p.errors) {
                        p.errors->fail(
                            strfmt("SET_ROWS '%s': index %d at [%lld, %lld, %lld] out of range [0, "
                                   "%lld) of %s",
                                   dst->name, v, static_cast<long long>(i),
                                   static_cast<long long>(i2), static_cast<long long>(i3),
                                   static_cast<long long>(ne1), describe(dst->src[0]).c_str()));
                    }
                    continue;
                }
                const int64_t r = base + v;
                if (r < r0 || r >= r1) continue;
                kern::row_from_f32(dst->type, reinterpret_cast<const float*>(row(src, i, i2, i3)),
                                   row(dst, v, i2, i3), ne0);
            }
        }
    }
}

}  // namespace ferry::cpu
