// Weights converted once (Device::prepare_weights) into what OpenVINO compiles into low-bit
// matrix products: integer values plus f32 scales (and zero points) per group, built in the
// model as constant -> convert -> subtract -> multiply. (f32, not f16: the CPU plugin keeps an
// f32 copy of f16 scales beside the transposed f32 copy its products use, see
// docs/openvino.md.)
//
// Memory: the CPU plugin wraps a constant's memory without copying it only when it is 64-byte
// aligned, so every converted form is. The values of Q4_0 and Q8_0 fit in their blocks, so they
// are converted in place, over the tensor's own bytes in ferry's buffer (their scales apart, the
// rest of the blocks' pages given back): the model then holds one copy of those weights, not
// two (OvBuffer::get_tensor converts them back for a reader of the GGUF bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <openvino/core/node.hpp>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::openvino {

struct PreparedWeight {
    // Kind of the values: u4, u8 or i8 with a scale per group, or f16 (dequantized, no scales).
    enum Kind { U4, U8, I8, F16 } kind = F16;
    int64_t group = 32;               // elements per scale
    const uint8_t* values = nullptr;  // packed u4 (2 per byte, element 0 low), u8, i8, or f16
    const float* scales = nullptr;    // one per group
    const float* zeros = nullptr;     // per-group zero points (x = scale * (q - zero)), or null
    int zero_point = -1;              // the common zero point when zeros is null; -1: none
    bool in_place = false;            // values lie over the tensor's own bytes (GGUF layout gone)
    bool released = false;  // converted apart, and the tensor's own bytes given back (gone too)
    // Memory of the arrays not in place (all, or the scales of a weight converted in place):
    // pages of their own (mmap), so that what a conversion staged goes back to the system.
    struct Pages {
        size_t bytes;
        void operator()(uint8_t* p) const;
    };
    std::unique_ptr<uint8_t, Pages> owned;
    size_t owned_bytes = 0;
};

// Converts a quantized weight's blocks: Q4_0 -> u4 (zero point 8), Q8_0 -> i8, Q4_1 and Q4_K ->
// u4 with per-group zero points, Q5_K -> u8 with per-group zero points, Q6_K -> i8 with a scale
// per 16; every other block format -> f16. With in_place, the values of Q4_0 and Q8_0 are
// written over the tensor's bytes (which must stay where they are while the weight is in use)
// and the pages past them are given back (they read as zeros).
Expected<std::unique_ptr<PreparedWeight>> prepare_weight(Tensor* t, bool in_place);

// The GGUF blocks of a weight converted in place, rebuilt from its converted form: bytes
// [offset, offset + size) of what the tensor held before (exact: the conversion is lossless).
Status restore_blocks(const Tensor* t, const PreparedWeight& w, size_t offset, size_t size,
                      void* dst);

// Gives the whole pages inside [p, p + n) back to the system (they read as zeros after).
bool release_pages(void* p, size_t n);

// The decompression subgraph of a prepared weight: F32 [ne3, ne2, ne1, ne0], or with
// `matrix` F32 [ne3*ne2*ne1, ne0], the form the CPU plugin fuses into a low-bit matrix product
// (constant -> convert -> subtract -> multiply -> reshape -> convert -> MatMul).
ov::Output<ov::Node> weight_node(const Tensor* t, const PreparedWeight& w, bool matrix = false);

}  // namespace ferry::openvino
