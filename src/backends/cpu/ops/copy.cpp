// CPY and CONT: element copies with type conversion between any layouts.
//
// Elements are matched in logical (row-major, innermost-first) order, so source and
// destination may have different shapes with the same element count. Three paths:
//  - both contiguous, same type: one memcpy split by bytes over the threads;
//  - equal ne0 and contiguous rows (always the case with a quantized side): row by row,
//    through the type traits' row conversions;
//  - anything else (plain types only): element by element under arbitrary strides.
// Every destination element is written by exactly one thread, so results do not depend on
// the thread count.
#include <algorithm>
#include <cstring>

#include "backends/cpu/ops/kernel-util.h"
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

namespace {

using kern::row;

bool rows_contiguous(const Tensor* t) {
    return t->nb[0] == type_size(t->type);
}

// Whether a row copy between these types needs a float row in scratch (neither side F32 and
// the types differ).
bool needs_float_row(Type s, Type d) {
    return s != d && s != Type::F32 && d != Type::F32;
}

// Converts one contiguous row of n elements; tmp holds n floats when needs_float_row().
void convert_row(Type st, const void* s, Type dt, void* d, int64_t n, float* tmp) {
    if (st == dt) {
        std::memcpy(d, s, row_size(st, n));
        return;
    }
    if (st == Type::F32) {
        kern::row_from_f32(dt, static_cast<const float*>(s), d, n);
        return;
    }
    float* df = dt == Type::F32 ? static_cast<float*>(d) : tmp;
    kern::row_to_f32(st, s, df, n);
    if (dt != Type::F32) kern::row_from_f32(dt, df, d, n);
}

// Element loads/stores for the strided path (plain types).
template <class T>
struct Elem;
template <>
struct Elem<float> {
    static float load(const uint8_t* p) {
        float v;
        std::memcpy(&v, p, 4);
        return v;
    }
    static void store(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
};
struct F16Tag {};
struct BF16Tag {};
template <>
struct Elem<F16Tag> {
    static float load(const uint8_t* p) {
        fp16_t h;
        std::memcpy(&h, p, 2);
        return fp16_to_fp32(h);
    }
    static void store(uint8_t* p, float v) {
        const fp16_t h = fp32_to_fp16(v);
        std::memcpy(p, &h, 2);
    }
};
template <>
struct Elem<BF16Tag> {
    static float load(const uint8_t* p) {
        bf16_t h;
        std::memcpy(&h, p, 2);
        return bf16_to_fp32(h);
    }
    static void store(uint8_t* p, float v) {
        const bf16_t h = kern::f32_to_bf16(v);
        std::memcpy(p, &h, 2);
    }
};

// Copies n elements from s (stride ss bytes) to d (stride ds bytes).
template <class S, class D>
void copy_strided(const uint8_t* s, size_t ss, uint8_t* d, size_t ds, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        Elem<D>::store(d + static_cast<size_t>(i) * ds,
                       Elem<S>::load(s + static_cast<size_t>(i) * ss));
    }
}

template <size_t kBytes>
void copy_strided_raw(const uint8_t* s, size_t ss, uint8_t* d, size_t ds, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        std::memcpy(d + static_cast<size_t>(i) * ds, s + static_cast<size_t>(i) * ss, kBytes);
    }
}

using StridedFn = void (*)(const uint8_t*, size_t, uint8_t*, size_t, int64_t);

template <class S>
StridedFn strided_to(Type dt) {
    switch (dt) {
        case Type::F32:
            return copy_strided<S, float>;
        case Type::F16:
            return copy_strided<S, F16Tag>;
        case Type::BF16:
            return copy_strided<S, BF16Tag>;
        default:
            return nullptr;
    }
}

StridedFn strided_fn(Type st, Type dt) {
    if (st == dt) {
        switch (type_size(st)) {
            case 1:
                return copy_strided_raw<1>;
            case 2:
                return copy_strided_raw<2>;
            case 4:
                return copy_strided_raw<4>;
            case 8:
                return copy_strided_raw<8>;
            default:
                return nullptr;
        }
    }
    switch (st) {
        case Type::F32:
            return strided_to<float>(dt);
        case Type::F16:
            return strided_to<F16Tag>(dt);
        case Type::BF16:
            return strided_to<BF16Tag>(dt);
        default:
            return nullptr;
    }
}

void copy_tensor(const ComputeParams& p, const Tensor* src, const Tensor* dst) {
    const int64_t n = src->nelements();
    if (n == 0 || n != dst->nelements()) return;
    const Type st = src->type, dt = dst->type;

    if (st == dt && src->is_contiguous() && dst->is_contiguous()) {
        const size_t bytes = src->nbytes();
        const size_t per =
            kern::align_up((bytes + static_cast<size_t>(p.nth) - 1) / static_cast<size_t>(p.nth),
                           kern::kCacheLine);
        const size_t b0 = std::min(bytes, per * static_cast<size_t>(p.ith));
        const size_t b1 = std::min(bytes, b0 + per);
        if (b1 > b0) {
            std::memcpy(static_cast<uint8_t*>(dst->data) + b0,
                        static_cast<const uint8_t*>(src->data) + b0, b1 - b0);
        }
        return;
    }

    if (src->ne[0] == dst->ne[0] && rows_contiguous(src) && rows_contiguous(dst)) {
        const int64_t ne0 = src->ne[0];
        float* tmp = needs_float_row(st, dt) ? static_cast<float*>(kern::thread_scratch(
                                                   p, static_cast<size_t>(ne0) * sizeof(float)))
                                             : nullptr;
        int64_t r0, r1;
        split_rows(src->nrows(), p.ith, p.nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t s1 = r % src->ne[1], s2 = r / src->ne[1] % src->ne[2],
                          s3 = r / src->ne[1] / src->ne[2];
            const int64_t d1 = r % dst->ne[1], d2 = r / dst->ne[1] % dst->ne[2],
                          d3 = r / dst->ne[1] / dst->ne[2];
            convert_row(st, row(src, s1, s2, s3), dt, row(dst, d1, d2, d3), ne0, tmp);
        }
        return;
    }

    // Strided element path: source row by source row; the destination position walks along.
    const StridedFn fn = strided_fn(st, dt);
    if (!fn) {  // validation admits no other case; never touch memory we cannot convert
        if (p.ith == 0 && p.errors) {
            p.errors->fail(strfmt("CPY '%s': no strided copy from %s to %s", dst->name,
                                  type_name(st), type_name(dt)));
        }
        return;
    }
    const int64_t ne0 = src->ne[0];
    int64_t r0, r1;
    split_rows(src->nrows(), p.ith, p.nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t s1 = r % src->ne[1], s2 = r / src->ne[1] % src->ne[2],
                      s3 = r / src->ne[1] / src->ne[2];
        const uint8_t* s = row(src, s1, s2, s3);
        // Destination coordinates of flat element r * ne0.
        int64_t e = r * ne0;
        int64_t d0 = e % dst->ne[0];
        e /= dst->ne[0];
        int64_t d1 = e % dst->ne[1];
        e /= dst->ne[1];
        int64_t d2 = e % dst->ne[2];
        int64_t d3 = e / dst->ne[2];
        int64_t i0 = 0;
        while (i0 < ne0) {
            const int64_t len = std::min(ne0 - i0, dst->ne[0] - d0);
            fn(s + static_cast<size_t>(i0) * src->nb[0], src->nb[0], kern::at(dst, d0, d1, d2, d3),
               dst->nb[0], len);
            i0 += len;
            d0 += len;
            if (d0 == dst->ne[0]) {
                d0 = 0;
                if (++d1 == dst->ne[1]) {
                    d1 = 0;
                    if (++d2 == dst->ne[2]) {
                        d2 = 0;
                        ++d3;
                    }
                }
            }
        }
    }
}

}  // namespace

// CPY(src, dst): the result is a view of dst with dst's strides; write through it.
void op_cpy(const ComputeParams& p, Tensor* dst) {
    copy_tensor(p, dst->src[0], dst);
}

void op_cont(const ComputeParams& p, Tensor* dst) {
    copy_tensor(p, dst->src[0], dst);
}

// Scratch for CPY/CONT: one float row per thread when a row converts through float.
size_t copy_work_size(const Tensor* node, int n_threads) {
    const Tensor* src = node->src[0];
    if (!src || !needs_float_row(src->type, node->type)) return 0;
    return kern::scratch_size(static_cast<size_t>(src->ne[0]) * sizeof(float), n_threads);
}

}  // namespace ferry::cpu
