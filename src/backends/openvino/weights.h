// Weights converted once (Device::prepare_weights) into what OpenVINO compiles into low-bit
// matrix products: integer values plus f16 scales (and zero points) per group, built in the
// model as constant -> convert -> subtract -> multiply.
#pragma once

#include <cstdint>
#include <memory>
#include <openvino/core/node.hpp>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::openvino {

struct PreparedWeight {
    // Kind of the values: u4 (zero point zp), i8, or f16 (dequantized, no scales).
    enum Kind { U4, I8, F16 } kind = F16;
    int64_t group = 32;            // elements per scale
    std::vector<uint8_t> values;   // packed u4 (2 per byte, element 0 in the low bits), i8, f16
    std::vector<uint16_t> scales;  // f16, one per group
    std::vector<uint16_t> zeros;   // f16 zero points per group (U4 with per-group zero), or empty
    uint8_t zero_point = 0;        // the common zero point (U4 without per-group zeros)
};

// Converts a quantized weight's blocks. Fails for types it has no conversion for.
Expected<std::unique_ptr<PreparedWeight>> prepare_weight(const Tensor* t);

// The decompression subgraph of a prepared weight: F32 [ne3, ne2, ne1, ne0], or with
// `matrix` F32 [ne3*ne2*ne1, ne0], the form the CPU plugin fuses into a low-bit matrix product
// (constant -> convert -> subtract -> multiply -> reshape -> convert -> MatMul).
ov::Output<ov::Node> weight_node(const Tensor* t, const PreparedWeight& w, bool matrix = false);

}  // namespace ferry::openvino
