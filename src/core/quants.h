// Reference quantizers, dequantizers and dot products for the GGUF block formats.
// n is always a multiple of the type's block size (callers check).
#pragma once

#include <cstdint>

#include "ferry/types.h"

namespace ferry::quants {

#define FERRY_QUANT_FNS(T)                                           \
    void dequantize_row_##T(const void* src, float* dst, int64_t n); \
    void quantize_row_##T(const float* src, void* dst, int64_t n);   \
    void vec_dot_##T(int64_t n, float* out, const void* x, const void* y);

FERRY_QUANT_FNS(q4_0)
FERRY_QUANT_FNS(q4_1)
FERRY_QUANT_FNS(q8_0)
FERRY_QUANT_FNS(q4_k)
FERRY_QUANT_FNS(q5_k)
FERRY_QUANT_FNS(q6_k)
FERRY_QUANT_FNS(q8_k)
FERRY_QUANT_FNS(q5_0)
FERRY_QUANT_FNS(q5_1)
FERRY_QUANT_FNS(q2_k)
FERRY_QUANT_FNS(q3_k)
FERRY_QUANT_FNS(iq4_nl)
FERRY_QUANT_FNS(iq4_xs)
FERRY_QUANT_FNS(mxfp4)
#undef FERRY_QUANT_FNS

// K blocks unpacked into plain per-element quants in element order, with their sub-block scales
// (and mins): Q4_K/Q5_K give unsigned q (x = d * sc[j] * q - dmin * mn[j] over 32-element
// sub-block j), Q6_K signed q in [-32, 31] (x = d * scales[g] * q over 16-element group g).
// For backends that convert the blocks into another runtime's layout.
void unpack_q4_k(const BlockQ4_K& b, uint8_t* q, uint8_t* sc, uint8_t* mn);
void unpack_q5_k(const BlockQ5_K& b, uint8_t* q, uint8_t* sc, uint8_t* mn);
void unpack_q6_k(const BlockQ6_K& b, int8_t* q);

}  // namespace ferry::quants
