// Weight conversion at load time (see weights.h).
#include "backends/openvino/weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <openvino/core/shape.hpp>
#include <openvino/op/constant.hpp>
#include <openvino/op/convert.hpp>
#include <openvino/op/multiply.hpp>
#include <openvino/op/reshape.hpp>
#include <openvino/op/subtract.hpp>

#include "core/quants.h"

namespace ferry::openvino {

namespace {

constexpr size_t kAlign = 64;  // what the CPU plugin needs to use a constant's memory in place

size_t round_up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}

// A weight being converted: its arrays in one 64-byte aligned allocation (values, scales, zero
// points, each starting on a 64-byte boundary).
struct Builder {
    std::unique_ptr<PreparedWeight> w = std::make_unique<PreparedWeight>();
    uint8_t* values = nullptr;
    float* scales = nullptr;
    float* zeros = nullptr;
    size_t value_bytes = 0, scale_bytes = 0;

    Status init(const Tensor* t, PreparedWeight::Kind kind, int64_t group, bool with_zeros) {
        const size_t n = static_cast<size_t>(t->nelements());
        w->kind = kind;
        w->group = group;
        value_bytes = kind == PreparedWeight::U4 ? n / 2 : kind == PreparedWeight::F16 ? n * 2 : n;
        scale_bytes = kind == PreparedWeight::F16 ? 0 : n / static_cast<size_t>(group) * 4;
        const size_t zoff = round_up(round_up(value_bytes) + scale_bytes);
        const size_t total = std::max(round_up(zoff + (with_zeros ? scale_bytes : 0)), kAlign);
        void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return Status::errorf(ErrorCode::OutOfMemory,
                                  "OPENVINO: cannot allocate %zu bytes to convert '%s'", total,
                                  t->name);
        }
        // (fresh pages are zero: u4 values are OR-ed in)
        w->owned = std::unique_ptr<uint8_t, PreparedWeight::Pages>(static_cast<uint8_t*>(p),
                                                                   PreparedWeight::Pages{total});
        w->owned_bytes = total;
        values = w->owned.get();
        scales = reinterpret_cast<float*>(values + round_up(value_bytes));
        zeros = with_zeros ? reinterpret_cast<float*>(values + zoff) : nullptr;
        w->values = values;
        w->scales = kind == PreparedWeight::F16 ? nullptr : scales;
        w->zeros = zeros;
        return Status::ok();
    }
    void put_u4(size_t e, uint8_t v) { values[e / 2] |= static_cast<uint8_t>(e % 2 ? v << 4 : v); }
};

// x = s * (q - zero) for a group whose reference is x = s * q - m; a group whose scale is 0
// (every element is -m) becomes q = 1, zero 0, scale -m. False when the zero point is not a
// finite f32.
bool scale_zero(float s, float m, float* scale, float* zero, bool* all_one) {
    *all_one = s == 0.0f;
    if (*all_one) {
        *scale = -m;
        *zero = 0.0f;
        return true;
    }
    *scale = s;
    *zero = m / s;
    return std::isfinite(*zero) && std::isfinite(*scale);
}

Expected<std::unique_ptr<PreparedWeight>> prepare_q4_0(Builder& b, const Tensor* t) {
    FERRY_TRY(b.init(t, PreparedWeight::U4, kQK4_0, false));
    b.w->zero_point = 8;
    const int64_t nb = t->nelements() / kQK4_0;
    const auto* blocks = static_cast<const BlockQ4_0*>(t->data);
    for (int64_t i = 0; i < nb; i++) {
        const BlockQ4_0& q = blocks[i];
        b.scales[i] = fp16_to_fp32(q.d);
        // GGUF keeps element j in the low nibble and j + 16 in the high nibble of byte j;
        // OpenVINO's u4 packs consecutive elements, the first in the low bits.
        for (int j = 0; j < kQK4_0; j++) {
            const uint8_t v = j < 16 ? (q.qs[j] & 0x0F) : (q.qs[j - 16] >> 4);
            b.put_u4(static_cast<size_t>(i * kQK4_0 + j), v);
        }
    }
    return std::move(b.w);
}

Expected<std::unique_ptr<PreparedWeight>> prepare_q8_0(Builder& b, const Tensor* t) {
    FERRY_TRY(b.init(t, PreparedWeight::I8, kQK8_0, false));
    const int64_t nb = t->nelements() / kQK8_0;
    const auto* blocks = static_cast<const BlockQ8_0*>(t->data);
    for (int64_t i = 0; i < nb; i++) {
        b.scales[i] = fp16_to_fp32(blocks[i].d);
        std::memcpy(b.values + i * kQK8_0, blocks[i].qs, kQK8_0);
    }
    return std::move(b.w);
}

// Q4_1: x = d * q + m per 32: u4 values, scale d, zero point -m / d.
Expected<std::unique_ptr<PreparedWeight>> prepare_q4_1(Builder& b, const Tensor* t) {
    FERRY_TRY(b.init(t, PreparedWeight::U4, kQK4_1, true));
    const int64_t nb = t->nelements() / kQK4_1;
    const auto* blocks = static_cast<const BlockQ4_1*>(t->data);
    for (int64_t i = 0; i < nb; i++) {
        const BlockQ4_1& q = blocks[i];
        bool one = false;
        if (!scale_zero(fp16_to_fp32(q.d), -fp16_to_fp32(q.m), &b.scales[i], &b.zeros[i], &one))
            return Status::errorf(ErrorCode::Unsupported, "zero point not finite");
        for (int j = 0; j < kQK4_1; j++) {
            const uint8_t v = j < 16 ? (q.qs[j] & 0x0F) : (q.qs[j - 16] >> 4);
            b.put_u4(static_cast<size_t>(i * kQK4_1 + j), one ? 1 : v);
        }
    }
    return std::move(b.w);
}

// Q4_K / Q5_K: x = (d * sc) * q - dmin * mn per 32: u4 / u8 values, scale d * sc, zero point
// dmin * mn / (d * sc).
template <typename Block, void (*Unpack)(const Block&, uint8_t*, uint8_t*, uint8_t*)>
Expected<std::unique_ptr<PreparedWeight>> prepare_kq(Builder& b, const Tensor* t,
                                                     PreparedWeight::Kind kind) {
    FERRY_TRY(b.init(t, kind, 32, true));
    const int64_t nb = t->nelements() / kQK_K;
    const auto* blocks = static_cast<const Block*>(t->data);
    uint8_t q[kQK_K], sc[8], mn[8];
    for (int64_t i = 0; i < nb; i++) {
        Unpack(blocks[i], q, sc, mn);
        const float d = fp16_to_fp32(blocks[i].d), dmin = fp16_to_fp32(blocks[i].dmin);
        for (int j = 0; j < 8; j++) {
            const size_t g = static_cast<size_t>(i * 8 + j);
            bool one = false;
            if (!scale_zero(d * static_cast<float>(sc[j]), dmin * static_cast<float>(mn[j]),
                            &b.scales[g], &b.zeros[g], &one))
                return Status::errorf(ErrorCode::Unsupported, "zero point not finite");
            for (int l = 0; l < 32; l++) {
                const size_t e = g * 32 + static_cast<size_t>(l);
                const uint8_t v = one ? 1 : q[32 * j + l];
                if (kind == PreparedWeight::U4) {
                    b.put_u4(e, v);
                } else {
                    b.values[e] = v;
                }
            }
        }
    }
    return std::move(b.w);
}

// Q6_K: x = (d * scale) * q per 16, q in [-32, 31]: i8 values, scale d * scale.
Expected<std::unique_ptr<PreparedWeight>> prepare_q6_k(Builder& b, const Tensor* t) {
    FERRY_TRY(b.init(t, PreparedWeight::I8, 16, false));
    const int64_t nb = t->nelements() / kQK_K;
    const auto* blocks = static_cast<const BlockQ6_K*>(t->data);
    for (int64_t i = 0; i < nb; i++) {
        quants::unpack_q6_k(blocks[i], reinterpret_cast<int8_t*>(b.values + i * kQK_K));
        const float d = fp16_to_fp32(blocks[i].d);
        for (int g = 0; g < kQK_K / 16; g++)
            b.scales[i * 16 + g] = d * static_cast<float>(blocks[i].scales[g]);
    }
    return std::move(b.w);
}

// Every other block format: dequantized with the reference dequantizer into f16 (its rounding,
// 2^-11 relative, is far below any of these formats' quantization steps).
Expected<std::unique_ptr<PreparedWeight>> prepare_f16(Builder& b, const Tensor* t) {
    const TypeTraits& tr = type_traits(t->type);
    if (!tr.to_float) return Status::errorf("OPENVINO: no dequantizer for %s", tr.name);
    FERRY_TRY(b.init(t, PreparedWeight::F16, 1, false));
    const int64_t n0 = t->ne[0], rows = t->nrows();
    std::vector<float> row(static_cast<size_t>(n0));
    auto* out = reinterpret_cast<fp16_t*>(b.values);
    const size_t rb = t->row_bytes();
    for (int64_t r = 0; r < rows; r++) {
        tr.to_float(static_cast<const uint8_t*>(t->data) + static_cast<size_t>(r) * rb, row.data(),
                    n0);
        for (int64_t i = 0; i < n0; i++)
            out[r * n0 + i] = fp32_to_fp16(row[static_cast<size_t>(i)]);
    }
    return std::move(b.w);
}

Expected<std::unique_ptr<PreparedWeight>> low_bit(Builder& b, const Tensor* t) {
    switch (t->type) {
        case Type::Q4_0:
            return prepare_q4_0(b, t);
        case Type::Q8_0:
            return prepare_q8_0(b, t);
        case Type::Q4_1:
            return prepare_q4_1(b, t);
        case Type::Q4_K:
            return prepare_kq<BlockQ4_K, quants::unpack_q4_k>(b, t, PreparedWeight::U4);
        case Type::Q5_K:
            return prepare_kq<BlockQ5_K, quants::unpack_q5_k>(b, t, PreparedWeight::U8);
        case Type::Q6_K:
            return prepare_q6_k(b, t);
        default:
            return Status::errorf(ErrorCode::Unsupported, "no low-bit form");
    }
}

Expected<std::unique_ptr<PreparedWeight>> convert(const Tensor* t) {
    Builder b;
    Expected<std::unique_ptr<PreparedWeight>> w = low_bit(b, t);
    if (w || w.status().code() != ErrorCode::Unsupported) return w;
    // No low-bit form (or a zero point that is not finite): f16 values.
    Builder f;
    return prepare_f16(f, t);
}

}  // namespace

void PreparedWeight::Pages::operator()(uint8_t* p) const {
    if (p) munmap(p, bytes);
}

bool release_pages(void* p, size_t n) {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    return b > a && madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED) == 0;
}

Expected<std::unique_ptr<PreparedWeight>> prepare_weight(Tensor* t, bool in_place) {
    if (!t->data) return Status::errorf("OPENVINO: weight '%s' has no host memory", t->name);
    if (!t->is_contiguous())
        return Status::errorf("OPENVINO: weight '%s' is not contiguous", t->name);
    Expected<std::unique_ptr<PreparedWeight>> w = convert(t);
    if (!w) return w;
    PreparedWeight& p = **w;
    // Values in place where they and the blocks' f16 scales fill exactly the blocks' bytes and
    // stay aligned (Q4_0, Q8_0; the others are lossy to rebuild or larger than their blocks).
    // The scales go to pages of their own as f32 (the plugin makes an f32 copy of f16 scales on
    // top of its own transposed one), and the whole pages of the blocks' bytes past the values
    // go back to the system.
    const size_t vb = p.kind == PreparedWeight::U4 ? static_cast<size_t>(t->nelements()) / 2
                                                   : static_cast<size_t>(t->nelements());
    const size_t groups = static_cast<size_t>(t->nelements() / p.group);
    if (in_place && (t->type == Type::Q4_0 || t->type == Type::Q8_0) &&
        vb + groups * 2 == t->nbytes() && vb % kAlign == 0 &&
        reinterpret_cast<uintptr_t>(t->data) % kAlign == 0) {
        const size_t sbytes = std::max(round_up(groups * 4), kAlign);
        void* sp =
            mmap(nullptr, sbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (sp == MAP_FAILED) {
            return Status::errorf(ErrorCode::OutOfMemory,
                                  "OPENVINO: cannot allocate %zu bytes to convert '%s'", sbytes,
                                  t->name);
        }
        std::memcpy(sp, p.scales, groups * 4);
        auto* dst = static_cast<uint8_t*>(t->data);
        std::memcpy(dst, p.values, vb);
        p.values = dst;
        p.scales = static_cast<const float*>(sp);
        p.owned = std::unique_ptr<uint8_t, PreparedWeight::Pages>(static_cast<uint8_t*>(sp),
                                                                  PreparedWeight::Pages{sbytes});
        p.owned_bytes = sbytes;
        p.in_place = true;
        release_pages(dst + vb, t->nbytes() - vb);
    }
    return w;
}

Status restore_blocks(const Tensor* t, const PreparedWeight& w, size_t offset, size_t size,
                      void* dst) {
    if (!w.in_place) return Status::errorf("OPENVINO: '%s' was not converted in place", t->name);
    const size_t bs = type_size(t->type);
    const size_t nb = static_cast<size_t>(t->nelements() / w.group);
    if (offset + size > nb * bs)
        return Status::errorf("OPENVINO: range past the blocks of '%s'", t->name);
    auto* out = static_cast<uint8_t*>(dst);
    uint8_t block[64];
    for (size_t i = offset / bs; size > 0 && i < nb; i++) {
        if (t->type == Type::Q4_0) {
            BlockQ4_0 q;
            q.d = fp32_to_fp16(w.scales[i]);  // exact: they were f16
            for (int j = 0; j < 16; j++) {
                const uint8_t lo = w.values[i * 16 + static_cast<size_t>(j) / 2];
                const uint8_t hi = w.values[i * 16 + 8 + static_cast<size_t>(j) / 2];
                const uint8_t a = j % 2 ? lo >> 4 : lo & 0x0F;
                const uint8_t c = j % 2 ? hi >> 4 : hi & 0x0F;
                q.qs[j] = static_cast<uint8_t>(a | c << 4);
            }
            std::memcpy(block, &q, sizeof q);
        } else {
            BlockQ8_0 q;
            q.d = fp32_to_fp16(w.scales[i]);
            std::memcpy(q.qs, w.values + i * kQK8_0, kQK8_0);
            std::memcpy(block, &q, sizeof q);
        }
        const size_t from = offset > i * bs ? offset - i * bs : 0;
        const size_t n = std::min(bs - from, size);
        std::memcpy(out, block + from, n);
        out += n;
        size -= n;
        offset += n;
    }
    return Status::ok();
}

ov::Output<ov::Node> weight_node(const Tensor* t, const PreparedWeight& w, bool matrix) {
    using namespace ov;
    const Shape full = matrix
                           ? Shape{static_cast<size_t>(t->nrows()), static_cast<size_t>(t->ne[0])}
                           : Shape{static_cast<size_t>(t->ne[3]), static_cast<size_t>(t->ne[2]),
                                   static_cast<size_t>(t->ne[1]), static_cast<size_t>(t->ne[0])};
    // The constants share the converted memory (64-byte aligned: the plugin uses it in place).
    auto share = [](element::Type et, const Shape& s, const void* p) {
        return std::make_shared<op::v0::Constant>(ov::Tensor(et, s, const_cast<void*>(p)));
    };
    Output<Node> v;
    if (w.kind == PreparedWeight::F16) {
        v = share(element::f16, full, w.values);
    } else {
        const size_t n = static_cast<size_t>(t->nelements());
        const size_t g = static_cast<size_t>(w.group);
        const size_t rows = static_cast<size_t>(t->nrows());
        const Shape grouped{rows, n / rows / g, g};
        const Shape per_group{rows, n / rows / g, 1};
        const element::Type et = w.kind == PreparedWeight::U4   ? element::u4
                                 : w.kind == PreparedWeight::U8 ? element::u8
                                                                : element::i8;
        Output<Node> q = share(et, grouped, w.values);
        q = std::make_shared<op::v0::Convert>(q, element::f32);
        if (w.zeros) {
            q = std::make_shared<op::v1::Subtract>(q, share(element::f32, per_group, w.zeros));
        } else if (w.zero_point >= 0) {
            auto zp = op::v0::Constant::create(et, Shape{}, {w.zero_point});
            q = std::make_shared<op::v1::Subtract>(
                q, std::make_shared<op::v0::Convert>(zp, element::f32));
        }
        q = std::make_shared<op::v1::Multiply>(q, share(element::f32, per_group, w.scales));
        std::vector<int64_t> dims;
        for (size_t d : full) dims.push_back(static_cast<int64_t>(d));
        auto shape = op::v0::Constant::create(element::i64, Shape{dims.size()}, dims);
        return std::make_shared<op::v1::Reshape>(q, shape, false);
    }
    return std::make_shared<op::v0::Convert>(v, element::f32);
}

}  // namespace ferry::openvino
