// Weight conversion at load time (see weights.h).
#include "backends/openvino/weights.h"

#include <cstring>
#include <openvino/core/shape.hpp>
#include <openvino/op/constant.hpp>
#include <openvino/op/convert.hpp>
#include <openvino/op/multiply.hpp>
#include <openvino/op/reshape.hpp>
#include <openvino/op/subtract.hpp>

namespace ferry::openvino {

namespace {

Expected<std::unique_ptr<PreparedWeight>> prepare_q4_0(const Tensor* t) {
    auto w = std::make_unique<PreparedWeight>();
    w->kind = PreparedWeight::U4;
    w->group = kQK4_0;
    w->zero_point = 8;
    const int64_t n = t->nelements();
    const int64_t nb = n / kQK4_0;
    w->values.assign(static_cast<size_t>(n / 2), 0);
    w->scales.resize(static_cast<size_t>(nb));
    const auto* blocks = static_cast<const BlockQ4_0*>(t->data);
    for (int64_t b = 0; b < nb; b++) {
        const BlockQ4_0& q = blocks[b];
        w->scales[static_cast<size_t>(b)] = q.d;
        // GGUF keeps element j in the low nibble and j + 16 in the high nibble of byte j;
        // OpenVINO's u4 packs consecutive elements, the first in the low bits.
        uint8_t* out = &w->values[static_cast<size_t>(b * kQK4_0 / 2)];
        for (int j = 0; j < kQK4_0; j++) {
            const uint8_t v = j < 16 ? (q.qs[j] & 0x0F) : (q.qs[j - 16] >> 4);
            out[j / 2] |= static_cast<uint8_t>(j % 2 == 0 ? v : v << 4);
        }
    }
    return w;
}

Expected<std::unique_ptr<PreparedWeight>> prepare_q8_0(const Tensor* t) {
    auto w = std::make_unique<PreparedWeight>();
    w->kind = PreparedWeight::I8;
    w->group = kQK8_0;
    const int64_t n = t->nelements();
    const int64_t nb = n / kQK8_0;
    w->values.resize(static_cast<size_t>(n));
    w->scales.resize(static_cast<size_t>(nb));
    const auto* blocks = static_cast<const BlockQ8_0*>(t->data);
    for (int64_t b = 0; b < nb; b++) {
        w->scales[static_cast<size_t>(b)] = blocks[b].d;
        std::memcpy(&w->values[static_cast<size_t>(b * kQK8_0)], blocks[b].qs, kQK8_0);
    }
    return w;
}

// Every other block format: dequantized with the reference dequantizer into f16 (its rounding,
// 2^-11 relative, is far below any of these formats' quantization steps).
Expected<std::unique_ptr<PreparedWeight>> prepare_f16(const Tensor* t) {
    const TypeTraits& tr = type_traits(t->type);
    if (!tr.to_float) return Status::errorf("OPENVINO: no dequantizer for %s", tr.name);
    auto w = std::make_unique<PreparedWeight>();
    w->kind = PreparedWeight::F16;
    const int64_t n0 = t->ne[0], rows = t->nrows();
    w->values.resize(static_cast<size_t>(t->nelements()) * 2);
    std::vector<float> row(static_cast<size_t>(n0));
    auto* out = reinterpret_cast<fp16_t*>(w->values.data());
    const size_t rb = t->row_bytes();
    for (int64_t r = 0; r < rows; r++) {
        tr.to_float(static_cast<const uint8_t*>(t->data) + static_cast<size_t>(r) * rb, row.data(),
                    n0);
        for (int64_t i = 0; i < n0; i++)
            out[r * n0 + i] = fp32_to_fp16(row[static_cast<size_t>(i)]);
    }
    return w;
}

}  // namespace

Expected<std::unique_ptr<PreparedWeight>> prepare_weight(const Tensor* t) {
    if (!t->data) return Status::errorf("OPENVINO: weight '%s' has no host memory", t->name);
    if (!t->is_contiguous())
        return Status::errorf("OPENVINO: weight '%s' is not contiguous", t->name);
    switch (t->type) {
        case Type::Q4_0:
            return prepare_q4_0(t);
        case Type::Q8_0:
            return prepare_q8_0(t);
        default:
            return prepare_f16(t);
    }
}

ov::Output<ov::Node> weight_node(const Tensor* t, const PreparedWeight& w, bool matrix) {
    using namespace ov;
    const Shape full = matrix
                           ? Shape{static_cast<size_t>(t->nrows()), static_cast<size_t>(t->ne[0])}
                           : Shape{static_cast<size_t>(t->ne[3]), static_cast<size_t>(t->ne[2]),
                                   static_cast<size_t>(t->ne[1]), static_cast<size_t>(t->ne[0])};
    // The constants share the converted memory (no copy here; the plugin may repack it).
    auto share = [](element::Type et, const Shape& s, const void* p) {
        return std::make_shared<op::v0::Constant>(ov::Tensor(et, s, const_cast<void*>(p)));
    };
    Output<Node> v;
    if (w.kind == PreparedWeight::F16) {
        v = share(element::f16, full, w.values.data());
    } else {
        const size_t n = static_cast<size_t>(t->nelements());
        const size_t g = static_cast<size_t>(w.group);
        const size_t rows = static_cast<size_t>(t->nrows());
        const Shape grouped{rows, n / rows / g, g};
        Output<Node> q = share(w.kind == PreparedWeight::U4 ? element::u4 : element::i8, grouped,
                               w.values.data());
        q = std::make_shared<op::v0::Convert>(q, element::f16);
        if (w.kind == PreparedWeight::U4) {
            auto zp = op::v0::Constant::create(element::u4, Shape{}, {w.zero_point});
            q = std::make_shared<op::v1::Subtract>(
                q, std::make_shared<op::v0::Convert>(zp, element::f16));
        }
        auto sc = share(element::f16, Shape{rows, n / rows / g, 1}, w.scales.data());
        q = std::make_shared<op::v1::Multiply>(q, sc);
        std::vector<int64_t> dims;
        for (size_t d : full) dims.push_back(static_cast<int64_t>(d));
        auto shape = op::v0::Constant::create(element::i64, Shape{dims.size()}, dims);
        v = std::make_shared<op::v1::Reshape>(q, shape, false);
    }
    return std::make_shared<op::v0::Convert>(v, element::f32);
}

}  // namespace ferry::openvino
