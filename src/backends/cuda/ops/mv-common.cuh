// Internal to MUL_MAT's matrix-vector kernels: what more than one of their files needs
// (mul_mat.cu: the dispatch and the cuBLAS prefill; mv-float.cu, mv-int8.cu, mv-stream.cu: one
// kernel family each). The launch arguments (MvArgs, MvSeg); the float kernel's decoders
// (Lane8, Dec<T>), which the dequantizer and the streaming form use too, and the int8 kernel's
// (Lane8i, IDec<T>), both on one block locator (Locate<T>); the decode epilogue
// and the folded norm's prologue (the float, int8 and streaming kernels); the block-lane
// decoders (BDec<T>) and b's int8 quantization (the int8 kernel and the streaming form); and
// the host checks and settings the launchers share. Device code here is inline or a template
// in an anonymous namespace: each file that includes it compiles the same code for its kernels.
// The decoders are FERRY_HD (host and device): tests/test_cuda_decoders.cu checks them on the
// host against the CPU dequantizers.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

constexpr int kMaxCols = 8;  // b columns one matrix-vector launch handles per column group
constexpr int kRowsPerBlock = 4;

FERRY_HD float small_u2f(uint32_t v) {  // exact for v < 2^23
    return bits_to_float(0x4B000000u | v) - 8388608.0f;
}

// The 8 weights a lane owns in 256-element chunk c of a row: q[0..3] at elements o0..o0+3 and
// q[4..7] at o1..o1+3; weight = d * q + m. Returns false when the chunk ends before them.
struct Lane8 {
    float q[8];
    float d, m;
    int32_t o0, o1;  // element offsets in the row (rows are < 2^31 elements)
};

// Where a lane's 8 weights of chunk c lie in the six formats both matrix-vector kernels read
// (Dec below: floats; IDec: int8 words): their scale d and min m (0 for the formats without
// one), the raw words lo0/lo1 that hold their low bits and hi0/hi1 their high bits (Q5_K,
// Q6_K), the shifts that select this lane's bits, and the element offsets o0/o1 of q[0..3] and
// q[4..7]. The decoders differ only in how they unpack the words.
struct Loc8 {
    uint32_t lo0, lo1, hi0, hi1;
    int lsh, hsh;  // shift of the low bits (nibble select) and of the high bits
    float d, m;
    int32_t o0, o1;
};

template <Type T>
struct Locate;

// Whether a located format has a min (weight = d * q + m) or not (d * q).
constexpr bool located_min(Type t) {
    return t == Type::Q4_1 || t == Type::Q4_K || t == Type::Q5_K;
}

// 32-element blocks: chunk c holds blocks 8c .. 8c + 7; lane -> block lane / 4, part p.
template <>
struct Locate<Type::Q4_0> {  // 18 bytes: d, 16 bytes of nibbles (q[k] low, q[4 + k] high)
    template <bool Check>
    FERRY_HD static bool at(const char* row, int64_t K, int64_t c, int lane, Loc8& l) {
        const int64_t blk = c * 8 + lane / 4;
        if (Check && blk * 32 >= K) return false;
        const char* bp = row + blk * 18;
        const int p = lane % 4;
        l.lo0 = ld32_a2(bp + 2 + 4 * p);
        l.d = h2f(ld16(bp));
        l.m = 0.0f;
        l.o0 = static_cast<int32_t>(blk * 32 + 4 * p);
        l.o1 = l.o0 + 16;
        return true;
    }
};

template <>
struct Locate<Type::Q4_1> {  // 20 bytes: d, m, 16 bytes of nibbles
    template <bool Check>
    FERRY_HD static bool at(const char* row, int64_t K, int64_t c, int lane, Loc8& l) {
        const int64_t blk = c * 8 + lane / 4;
        if (Check && blk * 32 >= K) return false;
        const char* bp = row + blk * 20;
        const int p = lane % 4;
        l.lo0 = ld32_a2(bp + 4 + 4 * p);
        l.d = h2f(ld16(bp));
        l.m = h2f(ld16(bp + 2));
        l.o0 = static_cast<int32_t>(blk * 32 + 4 * p);
        l.o1 = l.o0 + 16;
        return true;
    }
};

template <>
struct Locate<Type::Q8_0> {  // 34 bytes: d, 32 signed bytes
    template <bool Check>
    FERRY_HD static bool at(const char* row, int64_t K, int64_t c, int lane, Loc8& l) {
        const int64_t blk = c * 8 + lane / 4;
        if (Check && blk * 32 >= K) return false;
        const char* bp = row + blk * 34;
        const int p = lane % 4;
        l.lo0 = ld32_a2(bp + 2 + 8 * p);
        l.lo1 = ld32_a2(bp + 6 + 8 * p);
        l.d = h2f(ld16(bp));
        l.m = 0.0f;
        l.o0 = static_cast<int32_t>(blk * 32 + 8 * p);
        l.o1 = l.o0 + 4;
        return true;
    }
};

// K formats: chunk c is super-block c; lane -> sub-block j = lane / 4 (32 elements), part p.
template <>
struct Locate<Type::Q4_K> {  // 144 bytes: d, dmin, 12 bytes of 6-bit scales/mins, nibbles
    template <bool Check>
    FERRY_HD static bool at(const char* row, int64_t K, int64_t c, int lane, Loc8& l) {
        if (Check && c * 256 >= K) return false;
        const char* bp = row + c * 144;
        const int j = lane / 4, p = lane % 4;
        int sc, mn;
        k_scale_min(reinterpret_cast<const uint8_t*>(bp + 4), j, &sc, &mn);
        l.d = h2f(ld16(bp)) * static_cast<float>(sc);
        l.m = -h2f(ld16(bp + 2)) * static_cast<float>(mn);
        const char* qs = bp + 16 + 32 * (j / 2) + 8 * p;
        l.lo0 = ld32_a2(qs);
        l.lo1 = ld32_a2(qs + 4);
        l.lsh = (j % 2) * 4;
        l.o0 = static_cast<int32_t>(c * 256 + 32 * j + 8 * p);
        l.o1 = l.o0 + 4;
        return true;
    }
};

template <>
struct Locate<Type::Q5_K> {  // 176 bytes: as Q4_K, with 32 bytes of fifth bits before the nibbles
    template <bool Check>
    FERRY_HD static bool at(const char* row, int64_t K, int64_t c, int lane, Loc8& l) {
        if (Check && c * 256 >= K) return false;
        const char* bp = row + c * 176;
        const int j = lane / 4, p = lane % 4;
        int sc, mn;
        k_scale_min(reinterpret_cast<const uint8_t*>(bp + 4), j, &sc, &mn);
        l.d = h2f(ld16(bp)) * static_cast<float>(sc);
        l.m = -h2f(ld16(bp + 2)) * static_cast<float>(mn);
        const char* qs = bp + 48 + 32 * (j / 2) + 8 * p;
        l.lo0 = ld32_a2(qs);
        l.lo1 = ld32_a2(qs + 4);
        l.hi0 = ld32_a2(bp + 16 + 8 * p);
        l.hi1 = ld32_a2(bp + 20 + 8 * p);
        l.lsh = (j % 2) * 4;
        l.hsh = j;  // sub-block j's fifth bit is bit j of each byte
        l.o0 = static_cast<int32_t>(c * 256 + 32 * j + 8 * p);
        l.o1 = l.o0 + 4;
        return true;
    }
};

template <>
struct Locate<Type::Q6_K> {  // 210 bytes: 128 of low nibbles, 64 of high 2 bits, 16 scales, d
    template <bool Check>
    FERRY_HD static bool at(const char* row, int64_t K, int64_t c, int lane, Loc8& l) {
        if (Check && c * 256 >= K) return false;
        const char* bp = row + c * 210;
        const int j = lane / 4, p = lane % 4;
        const int h = j / 4, part = j % 4;
        const int l0 = 8 * p;  // first l of this lane (l < 32)
        const char* ql = bp + 64 * h + l0 + ((part & 1) ? 32 : 0);
        const char* qh = bp + 128 + 32 * h + l0;
        l.lo0 = ld32_a2(ql);
        l.lo1 = ld32_a2(ql + 4);
        l.hi0 = ld32_a2(qh);
        l.hi1 = ld32_a2(qh + 4);
        l.lsh = part >= 2 ? 4 : 0;
        l.hsh = 2 * part;
        const int g = 8 * h + 2 * part + l0 / 16;
        l.d = h2f(ld16(bp + 208)) * static_cast<float>(static_cast<int8_t>(bp[192 + g]));
        l.m = 0.0f;
        l.o0 = static_cast<int32_t>(c * 256 + 32 * j + l0);
        l.o1 = l.o0 + 4;
        return true;
    }
};

template <Type T>
struct Dec;

// The float decoders of the six: Locate, then each byte's bits as exact small floats.
template <Type T>
FERRY_HD bool dec_located(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
    Loc8 l;
    if (!Locate<T>::template at<true>(row, K, c, lane, l)) return false;
    w.d = l.d;
    w.m = l.m;
    FERRY_UNROLL
    for (int k = 0; k < 4; k++) {
        uint32_t q0, q1;
        float bias = 0.0f;
        if constexpr (T == Type::Q4_0 || T == Type::Q4_1) {
            q0 = (l.lo0 >> (8 * k)) & 0x0f;
            q1 = (l.lo0 >> (8 * k + 4)) & 0x0f;
            if constexpr (T == Type::Q4_0) bias = -8.0f;
        } else if constexpr (T == Type::Q8_0) {
            // (q ^ 0x80) is q + 128 as an unsigned byte.
            q0 = ((l.lo0 >> (8 * k)) & 0xff) ^ 0x80;
            q1 = ((l.lo1 >> (8 * k)) & 0xff) ^ 0x80;
            bias = -128.0f;
        } else if constexpr (T == Type::Q4_K) {
            q0 = (l.lo0 >> (8 * k + l.lsh)) & 0x0f;
            q1 = (l.lo1 >> (8 * k + l.lsh)) & 0x0f;
        } else if constexpr (T == Type::Q5_K) {
            q0 = ((l.lo0 >> (8 * k + l.lsh)) & 0x0f) | (((l.hi0 >> (8 * k + l.hsh)) & 1) << 4);
            q1 = ((l.lo1 >> (8 * k + l.lsh)) & 0x0f) | (((l.hi1 >> (8 * k + l.hsh)) & 1) << 4);
        } else {  // Q6_K
            q0 = ((l.lo0 >> (8 * k + l.lsh)) & 0x0f) | (((l.hi0 >> (8 * k + l.hsh)) & 3) << 4);
            q1 = ((l.lo1 >> (8 * k + l.lsh)) & 0x0f) | (((l.hi1 >> (8 * k + l.hsh)) & 3) << 4);
            bias = -32.0f;
        }
        if constexpr (located_min(T)) {
            w.q[k] = small_u2f(q0);
            w.q[4 + k] = small_u2f(q1);
        } else {
            w.q[k] = small_u2f(q0) + bias;
            w.q[4 + k] = small_u2f(q1) + bias;
        }
    }
    w.o0 = l.o0;
    w.o1 = l.o1;
    return true;
}

template <Type T>
struct DecLocated {
    static constexpr bool kMin = located_min(T);
    FERRY_HD static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        return dec_located<T>(row, K, c, lane, w);
    }
};
template <>
struct Dec<Type::Q4_0> : DecLocated<Type::Q4_0> {};
template <>
struct Dec<Type::Q4_1> : DecLocated<Type::Q4_1> {};
template <>
struct Dec<Type::Q8_0> : DecLocated<Type::Q8_0> {};
template <>
struct Dec<Type::Q4_K> : DecLocated<Type::Q4_K> {};
template <>
struct Dec<Type::Q5_K> : DecLocated<Type::Q5_K> {};
template <>
struct Dec<Type::Q6_K> : DecLocated<Type::Q6_K> {};

// The 8 weights of a lane in chunk c as two words of 4 signed bytes: v0 at elements o0..o0+3,
// v1 at o1..o1+3; weight = d * q + m (m only for the types with a min).
struct Lane8i {
    int32_t v0, v1;
    float d, m;
    int32_t o0, o1;
};

template <Type T>
struct IDec;

// The int8 kernel's decoders (mv-int8.cu) of the six formats: Locate, then the bytes as int8
// words.
template <Type T, int Shift>
struct IDecLocated {
    static constexpr bool kMin = located_min(T);
    static constexpr int kShift = Shift;
    FERRY_HD static void get(const char* row, int64_t c, int lane, Lane8i& w) {
        Loc8 l;
        Locate<T>::template at<false>(row, 0, c, lane, l);
        uint32_t v0, v1;
        if constexpr (T == Type::Q4_0) {
            // Each byte 16 * (q - 8): the nibble moved to the byte's top half with its top bit
            // flipped (two logic operations instead of a byte-wise subtract); q8_dot divides the
            // sum by 16 (kShift), exactly, as every product is a multiple of 16.
            v0 = ((l.lo0 << 4) & 0xf0f0f0f0u) ^ 0x80808080u;
            v1 = (l.lo0 & 0xf0f0f0f0u) ^ 0x80808080u;
        } else if constexpr (T == Type::Q4_1) {
            v0 = l.lo0 & 0x0f0f0f0fu;
            v1 = (l.lo0 >> 4) & 0x0f0f0f0fu;
        } else if constexpr (T == Type::Q8_0) {
            v0 = l.lo0;
            v1 = l.lo1;
        } else if constexpr (T == Type::Q4_K) {
            v0 = (l.lo0 >> l.lsh) & 0x0f0f0f0fu;
            v1 = (l.lo1 >> l.lsh) & 0x0f0f0f0fu;
        } else if constexpr (T == Type::Q5_K) {
            v0 = ((l.lo0 >> l.lsh) & 0x0f0f0f0fu) | (((l.hi0 >> l.hsh) & 0x01010101u) << 4);
            v1 = ((l.lo1 >> l.lsh) & 0x0f0f0f0fu) | (((l.hi1 >> l.hsh) & 0x01010101u) << 4);
        } else {  // Q6_K
            const uint32_t q0 =
                ((l.lo0 >> l.lsh) & 0x0f0f0f0fu) | (((l.hi0 >> l.hsh) & 0x03030303u) << 4);
            const uint32_t q1 =
                ((l.lo1 >> l.lsh) & 0x0f0f0f0fu) | (((l.hi1 >> l.hsh) & 0x03030303u) << 4);
            // Each byte 4 * (q - 32): q ^ 32 is q - 32 as a 6-bit two's complement number,
            // shifted to the byte's top; q8_dot divides the sum by 4 (kShift), exactly.
            v0 = (q0 ^ 0x20202020u) << 2;
            v1 = (q1 ^ 0x20202020u) << 2;
        }
        w.v0 = static_cast<int32_t>(v0);
        w.v1 = static_cast<int32_t>(v1);
        w.d = l.d;
        w.m = l.m;
        w.o0 = l.o0;
        w.o1 = l.o1;
    }
};

template <>
struct IDec<Type::Q4_0> : IDecLocated<Type::Q4_0, 4> {};
template <>
struct IDec<Type::Q4_1> : IDecLocated<Type::Q4_1, 0> {};
template <>
struct IDec<Type::Q8_0> : IDecLocated<Type::Q8_0, 0> {};
template <>
struct IDec<Type::Q4_K> : IDecLocated<Type::Q4_K, 0> {};
template <>
struct IDec<Type::Q5_K> : IDecLocated<Type::Q5_K, 0> {};
template <>
struct IDec<Type::Q6_K> : IDecLocated<Type::Q6_K, 2> {};

// The element-read formats (ops.h elem_type) in the float kernel (decode and prefill), the CPU
// dequantizers' values (src/core/quants.cpp). 32-element blocks laid out as Q4_0 (Q5_0, Q5_1,
// IQ4_NL, MXFP4): as Q4_0, lane -> block lane / 4, bytes 4p .. 4p + 3 of its nibbles.
// Four bytes at any address (MXFP4's 17-byte blocks keep no alignment).
FERRY_HD uint32_t ld32_a1(const char* p) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
    return b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
}
template <Type T>
struct Dec5 {  // Q5_0 (22 bytes: d, qh, qs), Q5_1 (24: d, m, qh, qs)
    static constexpr bool kMin = T == Type::Q5_1;
    static constexpr int kBytes = kMin ? 24 : 22, kQh = kMin ? 4 : 2;
    FERRY_HD static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t blk = c * 8 + lane / 4;
        if (blk * 32 >= K) return false;
        const char* bp = row + blk * kBytes;
        const int p = lane % 4;
        const uint32_t v = ld32_a2(bp + kQh + 4 + 4 * p);
        const uint32_t qh = ld32_a2(bp + kQh);
        w.d = h2f(ld16(bp));
        w.m = kMin ? h2f(ld16(bp + 2)) : 0.0f;
        const float off = kMin ? 0.0f : 16.0f;
        FERRY_UNROLL
        for (int k = 0; k < 4; k++) {
            const uint32_t h0 = ((qh >> (4 * p + k)) & 1) << 4;
            const uint32_t h1 = ((qh >> (16 + 4 * p + k)) & 1) << 4;
            w.q[k] = small_u2f(((v >> (8 * k)) & 0x0f) | h0) - off;
            w.q[4 + k] = small_u2f(((v >> (8 * k + 4)) & 0x0f) | h1) - off;
        }
        w.o0 = static_cast<int32_t>(blk * 32 + 4 * p);
        w.o1 = w.o0 + 16;
        return true;
    }
};
template <>
struct Dec<Type::Q5_0> : Dec5<Type::Q5_0> {};
template <>
struct Dec<Type::Q5_1> : Dec5<Type::Q5_1> {};

template <Type T>
struct DecCode {  // IQ4_NL (18 bytes: d, qs), MXFP4 (17: e, qs): a scale times a table value
    static constexpr bool kMin = false;
    static constexpr bool kFp4 = T == Type::MXFP4;
    FERRY_HD static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t blk = c * 8 + lane / 4;
        if (blk * 32 >= K) return false;
        const char* bp = row + blk * (kFp4 ? 17 : 18);
        const int p = lane % 4;
        const uint32_t v = kFp4 ? ld32_a1(bp + 1 + 4 * p) : ld32_a2(bp + 2 + 4 * p);
        w.d = kFp4 ? e8m0_half(static_cast<uint8_t>(bp[0])) : h2f(ld16(bp));
        w.m = 0.0f;
        const uint64_t lo = kFp4 ? kFp4Lo : kIq4Lo, hi = kFp4 ? kFp4Hi : kIq4Hi;
        FERRY_UNROLL
        for (int k = 0; k < 4; k++) {
            w.q[k] = code_value(lo, hi, (v >> (8 * k)) & 0x0f);
            w.q[4 + k] = code_value(lo, hi, (v >> (8 * k + 4)) & 0x0f);
        }
        w.o0 = static_cast<int32_t>(blk * 32 + 4 * p);
        w.o1 = w.o0 + 16;
        return true;
    }
};
template <>
struct Dec<Type::IQ4_NL> : DecCode<Type::IQ4_NL> {};
template <>
struct Dec<Type::MXFP4> : DecCode<Type::MXFP4> {};

// IQ4_XS (136 bytes: d, scales_h, scales_l[4], qs[128]): chunk c is super-block c; lane ->
// sub-block j = lane / 4 (32 elements laid out as IQ4_NL), bytes 4p .. 4p + 3 of its nibbles.
template <>
struct Dec<Type::IQ4_XS> {
    static constexpr bool kMin = false;
    FERRY_HD static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        if (c * 256 >= K) return false;
        const char* bp = row + c * 136;
        const int j = lane / 4, p = lane % 4;
        w.d = h2f(ld16(bp)) *
              static_cast<float>(iq4xs_scale(reinterpret_cast<const uint8_t*>(bp), j));
        w.m = 0.0f;
        const uint32_t v = ld32_a2(bp + 8 + 16 * j + 4 * p);
        FERRY_UNROLL
        for (int k = 0; k < 4; k++) {
            w.q[k] = code_value(kIq4Lo, kIq4Hi, (v >> (8 * k)) & 0x0f);
            w.q[4 + k] = code_value(kIq4Lo, kIq4Hi, (v >> (8 * k + 4)) & 0x0f);
        }
        w.o0 = static_cast<int32_t>(c * 256 + 32 * j + 4 * p);
        w.o1 = w.o0 + 16;
        return true;
    }
};

// Q2_K (84 bytes: scales[16], qs[64], d, dmin) and Q3_K (110: hmask[32], qs[64], scales[12],
// d): groups of 16 share a scale, so lane -> group lane / 2, its 8 elements
// e = 16 (lane / 2) + 8 (lane % 2) .. + 7, all with h = e / 128, s = e % 128 / 32 and
// l = e % 32 .. + 7: bits 2s of qs[32h + l ..] (and, Q3_K, bit 4h + s of hmask[l ..]).
template <Type T>
struct DecK23 {
    static constexpr bool kQ2 = T == Type::Q2_K;
    static constexpr bool kMin = kQ2;
    FERRY_HD static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        if (c * 256 >= K) return false;
        const char* bp = row + c * (kQ2 ? 84 : 110);
        const uint8_t* ub = reinterpret_cast<const uint8_t*>(bp);
        const int g = lane / 2, e = 16 * g + 8 * (lane % 2);
        const int h = e / 128, s = (e % 128) / 32, l = e % 32;
        const char* qs = bp + (kQ2 ? 16 : 32) + 32 * h + l;
        const uint32_t v0 = ld32_a2(qs), v1 = ld32_a2(qs + 4);
        if constexpr (kQ2) {
            w.d = h2f(ld16(bp + 80)) * static_cast<float>(ub[g] & 0x0f);
            w.m = -h2f(ld16(bp + 82)) * static_cast<float>(ub[g] >> 4);
            FERRY_UNROLL
            for (int k = 0; k < 4; k++) {
                w.q[k] = small_u2f((v0 >> (8 * k + 2 * s)) & 3);
                w.q[4 + k] = small_u2f((v1 >> (8 * k + 2 * s)) & 3);
            }
        } else {
            w.d = h2f(ld16(bp + 108)) * static_cast<float>(q3k_scale(ub + 96, g));
            w.m = 0.0f;
            const uint32_t m0 = ld32_a2(bp + l), m1 = ld32_a2(bp + l + 4);
            const int hb = 4 * h + s;
            FERRY_UNROLL
            for (int k = 0; k < 4; k++) {
                const uint32_t q0 =
                    ((v0 >> (8 * k + 2 * s)) & 3) | (((m0 >> (8 * k + hb)) & 1) << 2);
                const uint32_t q1 =
                    ((v1 >> (8 * k + 2 * s)) & 3) | (((m1 >> (8 * k + hb)) & 1) << 2);
                w.q[k] = small_u2f(q0) - 4.0f;
                w.q[4 + k] = small_u2f(q1) - 4.0f;
            }
        }
        w.o0 = static_cast<int32_t>(c * 256 + e);
        w.o1 = w.o0 + 4;
        return true;
    }
};
template <>
struct Dec<Type::Q2_K> : DecK23<Type::Q2_K> {};
template <>
struct Dec<Type::Q3_K> : DecK23<Type::Q3_K> {};

// Plain types: lane takes 8 consecutive elements (one 16-byte load for F16/BF16, two for F32);
// the row must be 16-byte aligned and K a multiple of 8 (checked by the launcher).
// The raw bytes of a lane's 8 weights of a plain-type row in chunk c (one 16-byte load for
// F16/BF16, two for F32), so that they can be loaded early and decoded later (from_raw).
struct Raw8 {
    uint4 a, b;
};

template <Type T>
__device__ __forceinline__ Raw8 load_raw(const char* row, int64_t c, int lane) {
    const int64_t e = c * 256 + 8 * lane;
    Raw8 r;
    if constexpr (T == Type::F32) {
        r.a = ld_weight16(row + e * 4);
        r.b = ld_weight16(row + e * 4 + 16);
    } else {
        r.a = ld_weight16(row + e * 2);
        r.b = make_uint4(0u, 0u, 0u, 0u);
    }
    return r;
}

// The plain types' get: the lane's raw bytes of chunk c, decoded by Dec<T>::from_raw
// (nothing at or past K).
template <Type T>
struct DecPlain {
    static constexpr bool kMin = false;
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t e = c * 256 + 8 * lane;
        if (e >= K) return false;
        Dec<T>::from_raw(load_raw<T>(row, c, lane), e, w);
        return true;
    }
};

template <>
struct Dec<Type::F16> : DecPlain<Type::F16> {
    __device__ static void from_raw(const Raw8& r, int64_t e, Lane8& w) {
        const uint32_t u[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[k]));
            w.q[2 * k] = f.x;
            w.q[2 * k + 1] = f.y;
        }
        w.d = 1.0f;
        w.m = 0.0f;
        w.o0 = e;
        w.o1 = e + 4;
    }
};

template <>
struct Dec<Type::BF16> : DecPlain<Type::BF16> {
    __device__ static void from_raw(const Raw8& r, int64_t e, Lane8& w) {
        const uint32_t u[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w.q[2 * k] = __uint_as_float(u[k] << 16);
            w.q[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
        }
        w.d = 1.0f;
        w.m = 0.0f;
        w.o0 = e;
        w.o1 = e + 4;
    }
};

template <>
struct Dec<Type::F32> : DecPlain<Type::F32> {
    __device__ static void from_raw(const Raw8& r, int64_t e, Lane8& w) {
        w.q[0] = __uint_as_float(r.a.x);
        w.q[1] = __uint_as_float(r.a.y);
        w.q[2] = __uint_as_float(r.a.z);
        w.q[3] = __uint_as_float(r.a.w);
        w.q[4] = __uint_as_float(r.b.x);
        w.q[5] = __uint_as_float(r.b.y);
        w.q[6] = __uint_as_float(r.b.z);
        w.q[7] = __uint_as_float(r.b.w);
        w.d = 1.0f;
        w.m = 0.0f;
        w.o0 = e;
        w.o1 = e + 4;
    }
};

}  // namespace

// (Outside the anonymous namespace: the launchers of mv-launch.h take MvArgs across files.)

// One segment of a decode epilogue: its rows' weights, where the result goes, whether it is
// rotated (ROPE), and the KV cache it is stored into as row kv_idx[0] (SET_ROWS; kv nullptr:
// none); out is written only when write_out.
constexpr int kMaxSeg = 3;
struct MvSeg {
    const char* a;
    float* out;
    char* kv;
    int64_t kv_nb1, kv_rows;
    int64_t end;  // one past the segment's last row, counted over all segments
    const int32_t* kv_idx;
    Type kv_type;
    bool rope, write_out;
};

struct MvArgs {
    const char* a;
    const char* a2;  // GLU: the second ("up") matrix, same type and strides as a
    int64_t a_nb1, a_nb2, a_nb3;
    int64_t K, M;
    int64_t a_row_bytes;  // bytes of one row of a (K elements)
    const char* b;
    int64_t b_nb1, b_nb2, b_nb3;
    int64_t N;
    int64_t ne2, ne3;  // result matrices (b's dims 2-3)
    int64_t r2, r3;    // broadcast ratios b.ne / a.ne
    float* out;        // contiguous [M, N, ne2, ne3]
    const char* res;   // optional residual added to out (ADD fusion), rows like out
    int64_t res_nb1, res_nb2, res_nb3;
    // Decode epilogue (the int8 kernel's epi, one column): the rows are those of up to
    // kMaxSeg matrices of the same type and row size multiplied by the same b (segments: rows
    // [seg[s - 1].end, seg[s].end), each a multiple of kQ8Warps), each with its own epilogue.
    MvSeg seg[kMaxSeg];
    int n_seg;
    // ROPE shared by the segments with rope (normal mode: rows 2i, 2i+1 of each head of
    // rope_head rows rotate together).
    const int32_t* rope_pos;
    const char* rope_ff;  // frequency factors (F32) or nullptr
    int64_t rope_ff_nb0;
    int rope_dims, rope_head;
    double rope_base, rope_fscale;
    DeviceError* err;
    // [ADD ->] RMS_NORM -> MUL folded into the int8 kernel's prologue (nx nullptr: none): b is
    // ((nx + nadd) * 1/rms) * nw, computed by every block in the RMS_NORM kernel's order of
    // operations (norm_threads virtual threads); nsum (or nullptr) receives nx + nadd, written
    // by block (0, 0) only.
    const float* nx;
    const float* nadd;
    const float* nw;
    float* nsum;
    float neps;
    int norm_threads;
    // The float kernel with a folded norm: the first group of weights is loaded before the
    // norm is computed (FERRY_CUDA_MV_FNORM=2 turns it off).
    bool early;
    // The float kernel's capped launch: each warp asks for its next row group's rows in L2
    // as it starts a group (set by launch_vec_fused from OpContext::mv_next).
    bool next;
    // The int8 kernel's folded norm in one round trip (norm_prologue_fast; set by
    // launch_q8_form from OpContext::mv_nfast).
    bool nfast;
    // A progressive product's host copy (HostMirror; buf nullptr: none). Taken by the
    // streaming form for one column of one matrix without an epilogue.
    HostMirror mirror;
    // The graph's output also stored into host memory the device maps: the device word that
    // holds its address (OpContext::host_out; nullptr, or nullptr in it: not stored). Taken
    // like the mirror; read at run time, so that a captured launch follows the word.
    float* const* host_out;
    int trace_id;  // FERRY_CUDA_TRACE builds: the launch's number
};

namespace {

constexpr int kMvWarps = 8;  // warps per block of the vector kernel

// The segment holding row m (of all segments) and m's row within it.
__device__ __forceinline__ int seg_of(const MvArgs& g, int64_t m, int64_t* ms) {
    int s = 0;
    while (s + 1 < g.n_seg && m >= g.seg[s].end) s++;
    *ms = m - (s > 0 ? g.seg[s - 1].end : 0);
    return s;
}

// Row ms of segment sg, value v (after its rope): the segment's result and its KV-cache row
// (SET_ROWS: row kv_idx[0], bounds-checked on the device).
__device__ __forceinline__ void epilogue_store(const MvArgs& g, const MvSeg& sg, int64_t ms,
                                               float v) {
    if (sg.write_out) sg.out[ms] = v;
    if (sg.kv) {
        const int32_t row = sg.kv_idx[0];
        if (row < 0 || row >= sg.kv_rows) {
            report_error(g.err, Op::SET_ROWS, row, sg.kv_rows, 0);
        } else {
            store_plain(sg.kv_type, sg.kv + row * sg.kv_nb1, ms, v);
        }
    }
}

// The rope epilogue's rotation of rows ms, ms + 1 of a segment (ms even; sums x0, x1): the
// same rotation as the ROPE kernel (rope_cos_sin), or the sums as they are past rope_dims.
__device__ __forceinline__ float2 rope_pair(const MvArgs& g, int64_t ms, float x0, float x1) {
    const int e = static_cast<int>(ms % g.rope_head);
    if (e >= g.rope_dims) return make_float2(x0, x1);
    const float2 r = rope_cos_sin(static_cast<double>(g.rope_pos[0]), e / 2, g.rope_dims,
                                  g.rope_base, g.rope_fscale, g.rope_ff, g.rope_ff_nb0);
    return make_float2(x0 * r.x - x1 * r.y, x0 * r.y + x1 * r.x);
}

// The decode epilogue, called by every warp of the block for each row group (the rows loop
// is the same for all of them: M % (8 / S) == 0); v is the sum of row m (row ms of
// segment sg), in every lane of the row's leading warp (part 0). Row pairs (2i, 2i+1) are rows
// rl and rl ^ 1 of the block (segments hold whole row groups).
__device__ __forceinline__ void mv_epilogue(const MvArgs& g, const MvSeg& sg, int64_t ms, int rl,
                                            bool leader, int lane, float v, float* pair) {
    if (sg.rope) {
        if (leader && lane == 0) pair[rl] = v;
        __syncthreads();
        const float x0 = pair[rl & ~1], x1 = pair[rl | 1];
        __syncthreads();  // the next row group's pair may be written after this
        if (leader && lane == 0) {
            const float2 y = rope_pair(g, ms & ~int64_t{1}, x0, x1);
            v = ms % 2 == 0 ? y.x : y.y;
        }
    }
    if (!leader || lane != 0) return;
    epilogue_store(g, sg, ms, v);
}

// 1/rms of the row nx (+ nadd) exactly as the RMS_NORM kernel (k_norm) computes it: virtual
// thread v < T (T = that kernel's block size, g.norm_threads) sums the squares of elements
// v, v + T, ... with fmaf, each warp of 32 virtual threads adds its sums by warp_sum, and the
// T / 32 warp sums are added by warp_sum again (block_sum). Thread t of this block plays
// virtual threads t + 256 k, lane for lane, so every sum is the same tree of the same
// operations and b comes out bit for bit as the unfused kernels give it.
__device__ __forceinline__ float norm_inv(const MvArgs& g, float* red /* 32 floats */) {
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int T = g.norm_threads;
    static_assert(kMvWarps * 32 == 256, "thread t plays virtual threads t + 256 k");
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
    for (int64_t base = 0; base < g.K; base += T) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int v = tid + 256 * k;
            const int64_t i = base + v;
            if (v < T && i < g.K) {
                float e = g.nx[i];
                if (g.nadd) e = e + g.nadd[i];
                part[k] = fmaf(e, e, part[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        part[k] = warp_sum(part[k]);
        if (lane == 0) red[warp + 8 * k] = part[k];
    }
    __syncthreads();
    float t = lane < T / 32 ? red[lane] : 0.0f;
    t = warp_sum(t);
    return rsqrtf(t / static_cast<float>(g.K) + g.neps);
}

// b = the folded [ADD ->] RMS_NORM -> MUL, element for element as the unfused kernels compute
// it ((e * inv) * w with e = nx + nadd): put(i, v) takes float4 number i of b, called by
// thread i % blockDim.x (whole warps together when K / 4 is a multiple of 32, as q8_quantize4
// needs). Block (0, 0) writes the ADD's sum. Shared by the int8 and the float kernel.
template <typename Put>
__device__ __forceinline__ void norm_prologue(const MvArgs& g, float* nred, Put put) {
    const float inv = norm_inv(g, nred);
    const bool write_sum = g.nsum && blockIdx.x == 0 && blockIdx.y == 0;
    const int64_t n4 = g.K / 4;
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 e = reinterpret_cast<const float4*>(g.nx)[i];
        const float4 w = reinterpret_cast<const float4*>(g.nw)[i];
        if (g.nadd) {
            const float4 c = reinterpret_cast<const float4*>(g.nadd)[i];
            e = make_float4(e.x + c.x, e.y + c.y, e.z + c.z, e.w + c.w);
            if (write_sum) reinterpret_cast<float4*>(g.nsum)[i] = e;
        }
        put(i, make_float4((e.x * inv) * w.x, (e.y * inv) * w.y, (e.z * inv) * w.z,
                           (e.w * inv) * w.w));
    }
}

// The folded norm in one round trip (the int8 kernel, k_norm's block of T = 1024, K % 4 == 0,
// K <= 1024 * kNormJ): thread t loads float4s t + 256 j (j < kNormJ) of nx (+ nadd) at once,
// and its weights before griddepcontrol.wait (norm_w_load: a model weight, which no kernel
// writes). Those are elements 4t + c + 1024 j, exactly the ones k_norm's virtual threads
// v = 4t + c (c = 0..3) sum, base j in order: each thread's four sums are theirs. k_norm's
// warp_sum over virtual lanes L = 4 (t % 8) + c (xor 16, 8, 4, 2, 1) is then xor 4, 2, 1
// on t (shuffles) and xor 2, 1 on c (in the thread), and its block sum the same second
// warp_sum as norm_inv's: the same tree of the same additions, so b comes out bit for bit
// as the unfused kernels give it. norm_inv's form (its loads in up to four dependent rounds
// and the weights loaded after the wait) took 3.5-5.5 us of each launch (trace, stop 23).
constexpr int kNormJ = 4;

struct NormW {
    float4 w[kNormJ];
};

__device__ __forceinline__ bool norm_fast_ok(const MvArgs& g) {
    return g.norm_threads == 1024 && g.K % 4 == 0 && g.K <= 1024 * kNormJ;
}

__device__ __forceinline__ void norm_w_load(const MvArgs& g, NormW& nw) {
    const float4* w4 = reinterpret_cast<const float4*>(g.nw);
    const int64_t n4 = g.K / 4;
#pragma unroll
    for (int j = 0; j < kNormJ; j++) {
        const int64_t i = threadIdx.x + 256 * j;
        if (i < n4) nw.w[j] = w4[i];
    }
}

// The hook of norm_prologue_fast and put_b that does nothing: `after` runs once in every
// thread when its loads of b are issued, before any is used (the bulk form issues the rest of
// its slots' copies there, so that b's loads queue ahead of them: k_mv_bulk).
struct NoAfter {
    __device__ void operator()() const {}
};

template <typename Put, typename After = NoAfter>
__device__ __forceinline__ void norm_prologue_fast(const MvArgs& g, const NormW& nw,
                                                   float* red /* 32 floats */, Put put,
                                                   After after = {}) {
    static_assert(kMvWarps * 32 == 256, "thread t holds float4s t + 256 j");
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32;
    const int64_t n4 = g.K / 4;
    const float4* x4 = reinterpret_cast<const float4*>(g.nx);
    float4 e[kNormJ];
#pragma unroll
    for (int j = 0; j < kNormJ; j++) {
        const int64_t i = tid + 256 * j;
        if (i < n4) e[j] = x4[i];
    }
    if (g.nadd) {
        const float4* a4 = reinterpret_cast<const float4*>(g.nadd);
        float4 c[kNormJ];
#pragma unroll
        for (int j = 0; j < kNormJ; j++) {
            const int64_t i = tid + 256 * j;
            if (i < n4) c[j] = a4[i];
        }
        after();
#pragma unroll
        for (int j = 0; j < kNormJ; j++) {
            e[j] = make_float4(e[j].x + c[j].x, e[j].y + c[j].y, e[j].z + c[j].z, e[j].w + c[j].w);
        }
    } else {
        after();
    }
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kNormJ; j++) {
        if (tid + 256 * j < n4) {
            p[0] = fmaf(e[j].x, e[j].x, p[0]);
            p[1] = fmaf(e[j].y, e[j].y, p[1]);
            p[2] = fmaf(e[j].z, e[j].z, p[2]);
            p[3] = fmaf(e[j].w, e[j].w, p[3]);
        }
    }
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) {
#pragma unroll
        for (int c = 0; c < 4; c++) p[c] += __shfl_xor_sync(0xffffffffu, p[c], o);
    }
    const float q0 = p[0] + p[2], q1 = p[1] + p[3];
    if (tid % 8 == 0) red[tid / 8] = q0 + q1;  // virtual warp t / 8 of k_norm's 32
    __syncthreads();
    const float t = warp_sum(red[lane]);
    const float inv = rsqrtf(t / static_cast<float>(g.K) + g.neps);
    const bool write_sum = g.nsum && blockIdx.x == 0 && blockIdx.y == 0;
#pragma unroll
    for (int j = 0; j < kNormJ; j++) {
        const int64_t i = tid + 256 * j;
        if (i >= n4) break;
        if (write_sum) reinterpret_cast<float4*>(g.nsum)[i] = e[j];
        const float4 w = nw.w[j];
        put(i, make_float4((e[j].x * inv) * w.x, (e[j].y * inv) * w.y, (e[j].z * inv) * w.z,
                           (e[j].w * inv) * w.w));
    }
}

// A lane's 8 weights against b's 8 values, in one fixed order (the float kernel and the
// streaming form add their chunks with it, so their sums are the same).
__device__ __forceinline__ float dot8(const float (&q)[8], float4 x0, float4 x1) {
    float s = q[0] * x0.x;
    s = fmaf(q[1], x0.y, s);
    s = fmaf(q[2], x0.z, s);
    s = fmaf(q[3], x0.w, s);
    s = fmaf(q[4], x1.x, s);
    s = fmaf(q[5], x1.y, s);
    s = fmaf(q[6], x1.z, s);
    return fmaf(q[7], x1.w, s);
}

constexpr int kQ8Warps = 8;  // warps per block of the int8 kernel (mv-int8.cu)
// Block formats (the int8 kernels and the streaming form): rows of at most this many elements
// (b's int8 quants and scales in shared memory).
constexpr int64_t kQ8MaxK = 32768;

// ---------------------------------------------------------------------------------------------
// The block-lane form (Q4_0 and Q6_K; `blk` in mv-int8.cu; FERRY_CUDA_MV_BLK=0 turns it off per
// backend). Measured first (ncu, stop 20): the lane-per-8-weights decoders (IDec) spend ~50
// warp instructions per 256 weights (two 16-bit loads and a merge per word, 64-bit block
// arithmetic, a scale conversion per 8 weights), and the products were bound by instruction
// issue at a quarter of the memory's rate. Here each lane takes 64 weights of a span of 2048
// (a warp's 32 lanes): whole words, scales converted once per 16 or 32 weights, b's quants as
// 16-byte loads. Rows must be 4-byte aligned (the launcher checks). Measured on the H200
// (bench/results/cuda.md, stop 21, ncu, one layer of 1B Q4_0): gate/up 16.4 -> 14.9 us, down
// 11.9 -> 10.8, the Q6_K output 96 -> 84 us; tg128 1,260 against 1,129 t/s with
// FERRY_CUDA_MV_BLK=0 (1,035 against 971 before the short-cache attention kernel). The
// products now wait on their weights (the ring's spin counts in the instructions ncu sees):
// gate/up reads 19 MB at 1.3 TB/s; the Q6_K reads still meet 2-way bank conflicts.
//
// b's quants are stored swizzled for each type's reads: 16-byte group G (elements 16 G ..
// 16 G + 15) at a position whose low three bits differ for the 8 lanes of a quarter warp, so
// that their 16-byte loads hit 8 different bank groups (BDec<T>::swz, on 32-bit word indices).
constexpr int kSpan = 2048;  // weights per span

// The lane's share of b in a span: four groups of 16 quants and up to four block scales.
struct BlkX {
    int4 x[4];
    float4 d;
};

FERRY_HD int4 ld_group(const int32_t* xq, uint32_t word) {
    return *reinterpret_cast<const int4*>(xq + word);
}

// A block-lane decoder's word at p: from a row in global memory (Global: weights, read once,
// evict-first in L2: ld_weight4) or from a copy of it anywhere (the host's test, the int8
// kernel's ring in shared memory).
template <bool Global>
FERRY_HD uint32_t span_word(const uint32_t* p) {
#ifdef __CUDA_ARCH__
    if constexpr (Global) return ld_weight4(p);
#endif
    return *p;
}

template <Type T>
struct BDec;

// Q4_0: lane l takes blocks 2l and 2l + 1 of the span's 64: 36 bytes, 4-byte aligned, nine
// words (a stride of 9 words: no bank conflicts in the ring), block A's quants realigned by
// four funnel shifts. b: groups 4l + j, swizzled G ^ ((G >> 3) & 3).
template <>
struct BDec<Type::Q4_0> {
    static constexpr int64_t kSpanBytes = 64 * 18;
    FERRY_HD static uint32_t swz(uint32_t u) { return u ^ (((u >> 5) & 3u) << 2); }
    // Blocks of 32 in the span's part of a row of K: lanes past them have nothing.
    FERRY_HD static bool active(int64_t K, int64_t sp, int lane) {
        return sp * 64 + 2 * lane < K / 32;
    }
    FERRY_HD static void load_x(const int32_t* xq, const float* xd, int64_t sp, int lane, BlkX& x) {
        const uint32_t g0 = static_cast<uint32_t>(sp) * 128u + 4u * lane;
        FERRY_UNROLL
        for (int j = 0; j < 4; j++) x.x[j] = ld_group(xq, swz(4u * (g0 + j)));
        const float2 d = reinterpret_cast<const float2*>(xd)[sp * 32 + lane];
        x.d = make_float4(d.x, d.y, 0.0f, 0.0f);
    }
    // A block's 16 bytes of quants against b's 32 (xl: elements 0-15, xh: 16-31): byte i holds
    // element i in its low nibble and i + 16 in its high one, each made the signed byte
    // 16 (q - 8) as in IDec<Q4_0>; the sum is divided by 16.
    FERRY_HD static int block(uint32_t q0, uint32_t q1, uint32_t q2, uint32_t q3, int4 xl,
                              int4 xh) {
        auto lo = [](uint32_t v) {
            return static_cast<int32_t>(((v << 4) & 0xf0f0f0f0u) ^ 0x80808080u);
        };
        auto hi = [](uint32_t v) { return static_cast<int32_t>((v & 0xf0f0f0f0u) ^ 0x80808080u); };
        int s = dp4a(lo(q0), xl.x, 0);
        s = dp4a(lo(q1), xl.y, s);
        s = dp4a(lo(q2), xl.z, s);
        s = dp4a(lo(q3), xl.w, s);
        s = dp4a(hi(q0), xh.x, s);
        s = dp4a(hi(q1), xh.y, s);
        s = dp4a(hi(q2), xh.z, s);
        s = dp4a(hi(q3), xh.w, s);
        return s >> 4;
    }
    // The lane's nine words of span sp (load_raw), then their products with b (dot_raw): apart
    // so that the streaming form can load spans ahead of their use.
    struct Raw {
        uint32_t v[9];
    };
    // (load_span: the same words from a copy of the span, e.g. in shared memory.)
    template <bool Global = false>
    FERRY_HD static void load_span(const char* span, int lane, Raw& r) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(span + lane * 36);
        FERRY_UNROLL
        for (int i = 0; i < 9; i++) r.v[i] = span_word<Global>(w + i);
    }
    FERRY_HD static void load_raw(const char* row, int64_t sp, int lane, Raw& r) {
        load_span<true>(row + sp * kSpanBytes, lane, r);
    }
    // (dot: row may be a copy in shared memory, the int8 kernel's ring: no global-only loads.)
    FERRY_HD static float dot(const char* row, int64_t sp, int lane, const BlkX& x, float acc) {
        Raw r;
        load_span(row + sp * kSpanBytes, lane, r);
        return dot_raw(r, sp, lane, x, acc);
    }
    FERRY_HD static float dot_raw(const Raw& r, int64_t, int, const BlkX& x, float acc) {
        const uint32_t* v = r.v;
        // Block A: scale in bytes 0-1, quants in 2-17; block B: scale in 18-19, quants in
        // 20-35 (words 5-8).
        const int sa = block(funnel_r(v[0], v[1], 16), funnel_r(v[1], v[2], 16),
                             funnel_r(v[2], v[3], 16), funnel_r(v[3], v[4], 16), x.x[0], x.x[1]);
        const int sb = block(v[5], v[6], v[7], v[8], x.x[2], x.x[3]);
        const float da = h2f(static_cast<uint16_t>(v[0] & 0xffffu));
        const float db = h2f(static_cast<uint16_t>(v[4] >> 16));
        acc = fmaf(da * x.d.x, static_cast<float>(sa), acc);
        return fmaf(db * x.d.y, static_cast<float>(sb), acc);
    }
};

// Q6_K: four lanes per super-block (8 per span): lane l takes super-block l / 4, half
// h = (l / 2) % 2 and sixteen l-positions from 16 e (e = l % 2), all four parts: elements
// 128 h + 32 p + 16 e .. + 15 (p = 0..3), each part one scale. Its bytes: ql at 64 h + 16 e
// (parts 0 and 2, low and high nibbles) and 64 h + 32 + 16 e (parts 1 and 3), qh at
// 128 + 32 h + 16 e (two bits per part), scales 192 + 8 h + 2 p + e, d at 208. A super-block
// is 210 bytes, so every other one starts 2 bytes off a word: each 16-byte run is read as five
// words from the word below it and realigned by a funnel shift of 0 or 16. b: groups
// 16 sb + 8 h + 2 p + e, swizzled G ^ (((G >> 3) & 3) << 1); its scales 8 sb + 4 h + p.
template <>
struct BDec<Type::Q6_K> {
    static constexpr int64_t kSpanBytes = 8 * 210;
    FERRY_HD static uint32_t swz(uint32_t u) { return u ^ (((u >> 5) & 3u) << 3); }
    FERRY_HD static bool active(int64_t K, int64_t sp, int lane) {
        return sp * 8 + lane / 4 < K / 256;
    }
    FERRY_HD static void load_x(const int32_t* xq, const float* xd, int64_t sp, int lane, BlkX& x) {
        const uint32_t sb = static_cast<uint32_t>(sp) * 8u + lane / 4;
        const uint32_t h = (lane / 2) % 2, e = lane % 2;
        FERRY_UNROLL
        for (int p = 0; p < 4; p++) {
            x.x[p] = ld_group(xq, swz(4u * (16u * sb + 8u * h + 2u * p + e)));
        }
        x.d = reinterpret_cast<const float4*>(xd)[2 * sb + h];
    }
    // One part's 16 quants: 4 (q - 32) as signed bytes (q: the low or high nibble of ql, two
    // bits of qh at 2p), against b's group; the sum is divided by 4 (exact, as in IDec<Q6_K>).
    FERRY_HD static int part(uint4 ql, uint4 qh, int lsh, int hsh, int4 xg) {
        auto q = [&](uint32_t l, uint32_t hh) {
            const uint32_t v = ((l >> lsh) & 0x0f0f0f0fu) | (((hh >> hsh) & 0x03030303u) << 4);
            return static_cast<int32_t>((v ^ 0x20202020u) << 2);
        };
        int s = dp4a(q(ql.x, qh.x), xg.x, 0);
        s = dp4a(q(ql.y, qh.y), xg.y, s);
        s = dp4a(q(ql.z, qh.z), xg.z, s);
        s = dp4a(q(ql.w, qh.w), xg.w, s);
        return s >> 2;
    }
    // The lane's words of span sp (load_raw: three runs of five, the scales' two or three and
    // d's), then their products with b (dot_raw): apart so that the streaming form can load
    // spans ahead of their use.
    struct Raw {
        uint32_t a[5], b[5], h[5], s[3], d;
    };
    FERRY_HD static uint32_t base_of(int64_t sp, int lane) {
        return static_cast<uint32_t>(sp * kSpanBytes) + 210u * static_cast<uint32_t>(lane / 4);
    }
    template <bool Global>
    FERRY_HD static void words5(const char* row, uint32_t at, uint32_t (&w)[5]) {
        const uint32_t* p = reinterpret_cast<const uint32_t*>(row + (at & ~3u));
        FERRY_UNROLL
        for (int i = 0; i < 5; i++) w[i] = span_word<Global>(p + i);
    }
    // The words at byte `base` of row (load_raw: base_of(sp, lane) from the row's start;
    // load_span: base_of(0, lane) from a copy of the span, e.g. in shared memory; a span is a
    // multiple of 4 bytes, so the words' alignment within it is their alignment in the row).
    FERRY_HD static void load_raw(const char* row, int64_t sp, int lane, Raw& r) {
        load_at<true>(row, base_of(sp, lane), lane, r);
    }
    FERRY_HD static void load_span(const char* span, int lane, Raw& r) {
        load_at<false>(span, base_of(0, lane), lane, r);
    }
    template <bool Global>
    FERRY_HD static void load_at(const char* row, uint32_t base, int lane, Raw& r) {
        const uint32_t h = (lane / 2) % 2, e = lane % 2;
        const uint32_t sh = (base & 2u) * 8u;
        words5<Global>(row, base + 64u * h + 16u * e, r.a);
        words5<Global>(row, base + 64u * h + 32u + 16u * e, r.b);
        words5<Global>(row, base + 128u + 32u * h + 16u * e, r.h);
        // Scales 8h .. 8h + 7 (two words from 192 + 8h), then d (the low half at 208).
        const uint32_t* ws =
            reinterpret_cast<const uint32_t*>(row + ((base + 192u + 8u * h) & ~3u));
        r.s[0] = span_word<Global>(ws);
        r.s[1] = span_word<Global>(ws + 1);
        // (The third word only when realigning: unshifted, it could lie past the row's end.)
        r.s[2] = sh ? span_word<Global>(ws + 2) : 0u;
        r.d = span_word<Global>(reinterpret_cast<const uint32_t*>(row + ((base + 208u) & ~3u)));
    }
    FERRY_HD static uint4 shifted(const uint32_t (&w)[5], uint32_t sh) {
        return make_uint4(funnel_r(w[0], w[1], sh), funnel_r(w[1], w[2], sh),
                          funnel_r(w[2], w[3], sh), funnel_r(w[3], w[4], sh));
    }
    // (dot: row may be a copy in shared memory, the int8 kernel's ring: no global-only loads.)
    FERRY_HD static float dot(const char* row, int64_t sp, int lane, const BlkX& x, float acc) {
        Raw r;
        load_at<false>(row, base_of(sp, lane), lane, r);
        return dot_raw(r, sp, lane, x, acc);
    }
    FERRY_HD static float dot_raw(const Raw& r, int64_t sp, int lane, const BlkX& x, float acc) {
        const uint32_t e = lane % 2;
        const uint32_t sh = (base_of(sp, lane) & 2u) * 8u;
        const uint4 qa = shifted(r.a, sh);
        const uint4 qb = shifted(r.b, sh);
        const uint4 qh = shifted(r.h, sh);
        const uint32_t s0 = funnel_r(r.s[0], r.s[1], sh);
        const uint32_t s1 = funnel_r(r.s[1], r.s[2], sh);
        const uint32_t sc = byte_perm(s0, s1, 0x6420u + 0x1111u * e);  // 2p + e, p = 0..3
        const float d = h2f(static_cast<uint16_t>((r.d >> sh) & 0xffffu));
        const int s0p = part(qa, qh, 0, 0, x.x[0]);
        const int s1p = part(qb, qh, 0, 2, x.x[1]);
        const int s2p = part(qa, qh, 4, 4, x.x[2]);
        const int s3p = part(qb, qh, 4, 6, x.x[3]);
        auto scale = [&](int p) {
            return d * static_cast<float>(static_cast<int8_t>((sc >> (8 * p)) & 0xffu));
        };
        acc = fmaf(scale(0) * x.d.x, static_cast<float>(s0p), acc);
        acc = fmaf(scale(1) * x.d.y, static_cast<float>(s1p), acc);
        acc = fmaf(scale(2) * x.d.z, static_cast<float>(s2p), acc);
        return fmaf(scale(3) * x.d.w, static_cast<float>(s3p), acc);
    }
};

// Quantizes b's float4 number i (v: its values) into xq / xd; 8 consecutive threads hold one
// block of 32 and call it together. With swz, xq is in BDec<T>'s swizzled order.
template <bool swz = false, Type T = Type::Q4_0>
__device__ __forceinline__ void q8_quantize4(float4 v, int64_t i, int lane, int32_t* xq,
                                             float* xd) {
    float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4));
    const float d = a / 127.0f;
    const float id = a > 0.0f ? 127.0f / a : 0.0f;
    const uint32_t q0 = static_cast<uint32_t>(round_clamp(v.x * id, -127, 127)) & 0xffu;
    const uint32_t q1 = static_cast<uint32_t>(round_clamp(v.y * id, -127, 127)) & 0xffu;
    const uint32_t q2 = static_cast<uint32_t>(round_clamp(v.z * id, -127, 127)) & 0xffu;
    const uint32_t q3 = static_cast<uint32_t>(round_clamp(v.w * id, -127, 127)) & 0xffu;
    int64_t at = i;
    if constexpr (swz) at = static_cast<int64_t>(BDec<T>::swz(static_cast<uint32_t>(i)));
    xq[at] = static_cast<int32_t>(q0 | (q1 << 8) | (q2 << 16) | (q3 << 24));
    if (lane % 8 == 0) xd[i / 8] = d;
}

// b's n4 float4s handed to put(i, v) by thread i % blockDim.x, kPre loads per thread issued
// before the first is used (whole warps together when n4 is a multiple of 32, as
// q8_quantize4 needs); after() once in every thread when its first loads are issued.
template <int kPre, typename Put, typename After = NoAfter>
__device__ __forceinline__ void put_b(const float4* x4, int64_t n4, Put put, After after = {}) {
    constexpr bool kAfter = !std::is_same_v<After, NoAfter>;
    bool first = kAfter;
    // (With an `after`, every thread enters the loop once, also one with no float4 of b.)
    for (int64_t i0 = threadIdx.x; kAfter || i0 < n4; i0 += kPre * blockDim.x) {
        float4 xv[kPre];
#pragma unroll
        for (int j = 0; j < kPre; j++) {
            const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
            if (i < n4) xv[j] = x4[i];
        }
        if constexpr (kAfter) {
            if (first) after();
            first = false;
            if (i0 >= n4) break;
        }
#pragma unroll
        for (int j = 0; j < kPre; j++) {
            const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
            if (i >= n4) break;
            put(i, xv[j]);
        }
    }
}

// Host: alignment checks of the launchers.
inline bool aligned(const void* p, int64_t n, std::initializer_list<int64_t> strides) {
    if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(n) != 0) return false;
    for (int64_t s : strides) {
        if (s % n != 0) return false;
    }
    return true;
}
inline bool aligned16(const void* p, std::initializer_list<int64_t> strides) {
    return aligned(p, 16, strides);
}

// Every row of a's matrices (a2's for GLU, each epilogue segment's) starts at a multiple of n
// bytes.
inline bool rows_aligned(const MvArgs& g, bool glu, bool segs, int64_t n) {
    if (!aligned(g.a, n, {g.a_nb1, g.a_nb2, g.a_nb3}) || (glu && !aligned(g.a2, n, {}))) {
        return false;
    }
    for (int s = 0; segs && s < g.n_seg; s++) {
        if (!aligned(g.seg[s].a, n, {})) return false;
    }
    return true;
}

// Lets kernels ks take `bytes` of dynamic shared memory on the current device (once per device;
// `done` is the caller's, one per set of kernels); max_carveout: they also ask for the SM's
// largest shared-memory carveout.
template <typename Kernel>
void allow_dyn_smem(std::initializer_list<Kernel> ks, size_t bytes, std::atomic<uint64_t>& done,
                    bool max_carveout = false) {
    int dev = 0;
    cudaGetDevice(&dev);
    const uint64_t bit = uint64_t{1} << (dev % 64);
    if (done.load(std::memory_order_acquire) & bit) return;
    for (Kernel k : ks) {
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes));
        if (max_carveout) {
            cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
        }
    }
    done.fetch_or(bit, std::memory_order_acq_rel);
}

}  // namespace

}  // namespace ferry::cuda
