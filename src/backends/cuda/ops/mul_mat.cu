// MUL_MAT: out[m, n] = sum_k a[k, m] * b[k, n] per matrix, a broadcast over dims 2-3.
//
// Decode (b has at most kMaxCols columns): a matrix-vector kernel built for memory bandwidth.
// One warp per weight row; the warp walks the row in chunks of 256 elements, each lane taking
// 8 of them, so that its 32 lanes read the chunk's weights (and the matching 1 KiB of b) as
// contiguous, coalesced bytes. Block formats are decoded in registers: each lane's 8 weights
// share one scale (and min), so the lane forms sum(q * x) and applies d (and m * sum(x)) once.
// Small integers become floats through the exponent trick (0x4B000000 | q is 2^23 + q), which
// costs one integer and one float add instead of a slow int-to-float conversion.
//
// Prefill: cuBLAS on tensor cores. F32 weights use SGEMM in pedantic (true fp32) mode; F16/BF16
// weights multiply b rounded to the same type; block formats are first dequantized to F16
// (scratch) — a measured first path, not the final one.
//
// Any layout the fast paths do not take (odd K, unaligned rows) goes through a generic warp-per-
// row kernel that reads elements one by one.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backends/cuda/cublas-api.h"
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"
#include "backends/cuda/ops/trace.cuh"

namespace ferry::cuda {

namespace {

constexpr int kMaxCols = 8;  // b columns one matrix-vector launch handles per column group
// Up to this many b columns run through the matrix-vector kernel (in groups of kMaxCols, the
// weights read once per group) instead of cuBLAS: activations stay in fp32, and small batches
// are bandwidth-bound anyway.
constexpr int64_t kMaxVecCols = 64;
constexpr int kRowsPerBlock = 4;

__device__ __forceinline__ float small_u2f(uint32_t v) {  // exact for v < 2^23
    return __uint_as_float(0x4B000000u | v) - 8388608.0f;
}

// The 8 weights a lane owns in 256-element chunk c of a row: q[0..3] at elements o0..o0+3 and
// q[4..7] at o1..o1+3; weight = d * q + m. Returns false when the chunk ends before them.
struct Lane8 {
    float q[8];
    float d, m;
    int32_t o0, o1;  // element offsets in the row (rows are < 2^31 elements)
};

template <Type T>
struct Dec;

template <>
struct Dec<Type::Q4_0> {
    static constexpr bool kMin = false;
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t blk = c * 8 + lane / 4;
        if (blk * 32 >= K) return false;
        const char* bp = row + blk * 18;
        const int p = lane % 4;
        const uint32_t v = ld32_a2(bp + 2 + 4 * p);
        w.d = h2f(ld16(bp));
        w.m = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w.q[k] = small_u2f((v >> (8 * k)) & 0x0f) - 8.0f;
            w.q[4 + k] = small_u2f((v >> (8 * k + 4)) & 0x0f) - 8.0f;
        }
        w.o0 = blk * 32 + 4 * p;
        w.o1 = w.o0 + 16;
        return true;
    }
};

template <>
struct Dec<Type::Q4_1> {
    static constexpr bool kMin = true;
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t blk = c * 8 + lane / 4;
        if (blk * 32 >= K) return false;
        const char* bp = row + blk * 20;
        const int p = lane % 4;
        const uint32_t v = ld32_a2(bp + 4 + 4 * p);
        w.d = h2f(ld16(bp));
        w.m = h2f(ld16(bp + 2));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w.q[k] = small_u2f((v >> (8 * k)) & 0x0f);
            w.q[4 + k] = small_u2f((v >> (8 * k + 4)) & 0x0f);
        }
        w.o0 = blk * 32 + 4 * p;
        w.o1 = w.o0 + 16;
        return true;
    }
};

template <>
struct Dec<Type::Q8_0> {
    static constexpr bool kMin = false;
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t blk = c * 8 + lane / 4;
        if (blk * 32 >= K) return false;
        const char* bp = row + blk * 34;
        const int p = lane % 4;
        const uint32_t v0 = ld32_a2(bp + 2 + 8 * p), v1 = ld32_a2(bp + 6 + 8 * p);
        w.d = h2f(ld16(bp));
        w.m = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            // (q ^ 0x80) is q + 128 as an unsigned byte.
            w.q[k] = small_u2f(((v0 >> (8 * k)) & 0xff) ^ 0x80) - 128.0f;
            w.q[4 + k] = small_u2f(((v1 >> (8 * k)) & 0xff) ^ 0x80) - 128.0f;
        }
        w.o0 = blk * 32 + 8 * p;
        w.o1 = w.o0 + 4;
        return true;
    }
};

// K formats: chunk c is super-block c; lane -> sub-block j = lane / 4 (32 elements), part p.
template <>
struct Dec<Type::Q4_K> {
    static constexpr bool kMin = true;
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        if (c * 256 >= K) return false;
        const char* bp = row + c * 144;
        const int j = lane / 4, p = lane % 4;
        int sc, mn;
        k_scale_min(reinterpret_cast<const uint8_t*>(bp + 4), j, &sc, &mn);
        w.d = h2f(ld16(bp)) * static_cast<float>(sc);
        w.m = -h2f(ld16(bp + 2)) * static_cast<float>(mn);
        const char* qs = bp + 16 + 32 * (j / 2) + 8 * p;
        const uint32_t v0 = ld32_a2(qs), v1 = ld32_a2(qs + 4);
        const int sh = (j % 2) * 4;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w.q[k] = small_u2f((v0 >> (8 * k + sh)) & 0x0f);
            w.q[4 + k] = small_u2f((v1 >> (8 * k + sh)) & 0x0f);
        }
        w.o0 = c * 256 + 32 * j + 8 * p;
        w.o1 = w.o0 + 4;
        return true;
    }
};

template <>
struct Dec<Type::Q5_K> {
    static constexpr bool kMin = true;
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        if (c * 256 >= K) return false;
        const char* bp = row + c * 176;
        const int j = lane / 4, p = lane % 4;
        int sc, mn;
        k_scale_min(reinterpret_cast<const uint8_t*>(bp + 4), j, &sc, &mn);
        w.d = h2f(ld16(bp)) * static_cast<float>(sc);
        w.m = -h2f(ld16(bp + 2)) * static_cast<float>(mn);
        const char* qs = bp + 48 + 32 * (j / 2) + 8 * p;
        const uint32_t v0 = ld32_a2(qs), v1 = ld32_a2(qs + 4);
        const uint32_t h0 = ld32_a2(bp + 16 + 8 * p), h1 = ld32_a2(bp + 20 + 8 * p);
        const int sh = (j % 2) * 4;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t hb0 = ((h0 >> (8 * k + j)) & 1) << 4;
            const uint32_t hb1 = ((h1 >> (8 * k + j)) & 1) << 4;
            w.q[k] = small_u2f(((v0 >> (8 * k + sh)) & 0x0f) | hb0);
            w.q[4 + k] = small_u2f(((v1 >> (8 * k + sh)) & 0x0f) | hb1);
        }
        w.o0 = c * 256 + 32 * j + 8 * p;
        w.o1 = w.o0 + 4;
        return true;
    }
};

template <>
struct Dec<Type::Q6_K> {
    static constexpr bool kMin = false;
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        if (c * 256 >= K) return false;
        const char* bp = row + c * 210;
        const int j = lane / 4, p = lane % 4;
        const int h = j / 4, part = j % 4;
        const int l0 = 8 * p;  // first l of this lane (l < 32)
        const char* ql = bp + 64 * h + l0 + ((part & 1) ? 32 : 0);
        const char* qh = bp + 128 + 32 * h + l0;
        const uint32_t a0 = ld32_a2(ql), a1 = ld32_a2(ql + 4);
        const uint32_t b0 = ld32_a2(qh), b1 = ld32_a2(qh + 4);
        const int lsh = part >= 2 ? 4 : 0;
        const int hsh = 2 * part;
        const int g = 8 * h + 2 * part + l0 / 16;
        w.d = h2f(ld16(bp + 208)) * static_cast<float>(static_cast<int8_t>(bp[192 + g]));
        w.m = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t q0 = ((a0 >> (8 * k + lsh)) & 0x0f) | (((b0 >> (8 * k + hsh)) & 3) << 4);
            const uint32_t q1 = ((a1 >> (8 * k + lsh)) & 0x0f) | (((b1 >> (8 * k + hsh)) & 3) << 4);
            w.q[k] = small_u2f(q0) - 32.0f;
            w.q[4 + k] = small_u2f(q1) - 32.0f;
        }
        w.o0 = c * 256 + 32 * j + l0;
        w.o1 = w.o0 + 4;
        return true;
    }
};

// The element-read formats (ops.h elem_type) in the float kernel (decode and prefill), the CPU
// dequantizers' values (src/core/quants.cpp). 32-element blocks laid out as Q4_0 (Q5_0, Q5_1,
// IQ4_NL, MXFP4): as Q4_0, lane -> block lane / 4, bytes 4p .. 4p + 3 of its nibbles.
// Four bytes at any address (MXFP4's 17-byte blocks keep no alignment).
__device__ __forceinline__ uint32_t ld32_a1(const char* p) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
    return b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
}
template <Type T>
struct Dec5 {  // Q5_0 (22 bytes: d, qh, qs), Q5_1 (24: d, m, qh, qs)
    static constexpr bool kMin = T == Type::Q5_1;
    static constexpr int kBytes = kMin ? 24 : 22, kQh = kMin ? 4 : 2;
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t blk = c * 8 + lane / 4;
        if (blk * 32 >= K) return false;
        const char* bp = row + blk * kBytes;
        const int p = lane % 4;
        const uint32_t v = ld32_a2(bp + kQh + 4 + 4 * p);
        const uint32_t qh = ld32_a2(bp + kQh);
        w.d = h2f(ld16(bp));
        w.m = kMin ? h2f(ld16(bp + 2)) : 0.0f;
        const float off = kMin ? 0.0f : 16.0f;
#pragma unroll
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
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t blk = c * 8 + lane / 4;
        if (blk * 32 >= K) return false;
        const char* bp = row + blk * (kFp4 ? 17 : 18);
        const int p = lane % 4;
        const uint32_t v = kFp4 ? ld32_a1(bp + 1 + 4 * p) : ld32_a2(bp + 2 + 4 * p);
        w.d = kFp4 ? e8m0_half(static_cast<uint8_t>(bp[0])) : h2f(ld16(bp));
        w.m = 0.0f;
        const uint64_t lo = kFp4 ? kFp4Lo : kIq4Lo, hi = kFp4 ? kFp4Hi : kIq4Hi;
#pragma unroll
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
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        if (c * 256 >= K) return false;
        const char* bp = row + c * 136;
        const int j = lane / 4, p = lane % 4;
        w.d = h2f(ld16(bp)) *
              static_cast<float>(iq4xs_scale(reinterpret_cast<const uint8_t*>(bp), j));
        w.m = 0.0f;
        const uint32_t v = ld32_a2(bp + 8 + 16 * j + 4 * p);
#pragma unroll
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
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
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
#pragma unroll
            for (int k = 0; k < 4; k++) {
                w.q[k] = small_u2f((v0 >> (8 * k + 2 * s)) & 3);
                w.q[4 + k] = small_u2f((v1 >> (8 * k + 2 * s)) & 3);
            }
        } else {
            w.d = h2f(ld16(bp + 108)) * static_cast<float>(q3k_scale(ub + 96, g));
            w.m = 0.0f;
            const uint32_t m0 = ld32_a2(bp + l), m1 = ld32_a2(bp + l + 4);
            const int hb = 4 * h + s;
#pragma unroll
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
        r.a = *reinterpret_cast<const uint4*>(row + e * 4);
        r.b = *reinterpret_cast<const uint4*>(row + e * 4 + 16);
    } else {
        r.a = *reinterpret_cast<const uint4*>(row + e * 2);
        r.b = make_uint4(0u, 0u, 0u, 0u);
    }
    return r;
}

template <>
struct Dec<Type::F16> {
    static constexpr bool kMin = false;
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
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t e = c * 256 + 8 * lane;
        if (e >= K) return false;
        from_raw(load_raw<Type::F16>(row, c, lane), e, w);
        return true;
    }
};

template <>
struct Dec<Type::BF16> {
    static constexpr bool kMin = false;
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
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t e = c * 256 + 8 * lane;
        if (e >= K) return false;
        from_raw(load_raw<Type::BF16>(row, c, lane), e, w);
        return true;
    }
};

template <>
struct Dec<Type::F32> {
    static constexpr bool kMin = false;
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
    __device__ static bool get(const char* row, int64_t K, int64_t c, int lane, Lane8& w) {
        const int64_t e = c * 256 + 8 * lane;
        if (e >= K) return false;
        from_raw(load_raw<Type::F32>(row, c, lane), e, w);
        return true;
    }
};

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
    // Decode epilogue (the int8 kernel, one column; epi below): the rows are those of up to
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
    int trace_id;  // FERRY_CUDA_TRACE builds: the launch's number
};

// The host copy of a progressive product (HostMirror). mirror_row: row r (of the warp's run
// of kMirrorGroup rows from r - r % G), its value v in every lane; `last`: the warp has no
// further row. After the run's last row the warp writes its line and fences at system scope
// (the line is in host memory before the count says so), and its lane 0 counts the warp into
// the step; the warp that completes the step (every warp with a run in it) sets its flag.
__device__ __forceinline__ void mirror_row(const MvArgs& g, int64_t r, float v, bool last,
                                           int64_t W, uint32_t& stash) {
    constexpr int G = kMirrorGroup;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int i = static_cast<int>(r % G);
    if (lane == i) stash = __float_as_uint(v);
    if (i != G - 1 && !last) return;  // (the same in every lane)
    const int64_t r0 = r - i;
    if (lane <= i) {
        asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(g.mirror.buf + r0 + lane),
                     "r"(stash)
                     : "memory");
    }
    __threadfence_system();  // (one fence for the warp: every lane's store)
    __syncwarp();
    if (lane != 0) return;
    const int64_t runs = (g.M + G - 1) / G;
    const int64_t k = r0 / G / W;
    const uint32_t need = static_cast<uint32_t>(min(W, runs - k * W));
    if (atomicAdd_system(g.mirror.count + k, 1u) == need - 1) {
        g.mirror.count[k] = 0u;
        __threadfence_system();
        asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(g.mirror.flags + k), "r"(1u)
                     : "memory");
    }
}

template <bool aligned>
__device__ __forceinline__ float4 ld_x4(const float* x) {
    if constexpr (aligned) {
        return *reinterpret_cast<const float4*>(x);
    } else {
        return make_float4(x[0], x[1], x[2], x[3]);
    }
}

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

template <typename Put>
__device__ __forceinline__ void norm_prologue_fast(const MvArgs& g, const NormW& nw,
                                                   float* red /* 32 floats */, Put put) {
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
#pragma unroll
        for (int j = 0; j < kNormJ; j++) {
            e[j] = make_float4(e[j].x + c[j].x, e[j].y + c[j].y, e[j].z + c[j].z, e[j].w + c[j].w);
        }
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

// Adds one chunk's contribution (8 weights of each of NC columns) to acc.
template <Type T, int NC, bool x_aligned>
__device__ __forceinline__ void mv_chunk(const Lane8& w, const char* bm, int64_t b_nb1, int n_cols,
                                         float* acc) {
#pragma unroll
    for (int n = 0; n < NC; n++) {
        if (NC > 1 && n >= n_cols) continue;  // a kernel for NC columns serves fewer too
        const float* x = reinterpret_cast<const float*>(bm + n * b_nb1);
        const float4 x0 = ld_x4<x_aligned>(x + w.o0);
        const float4 x1 = ld_x4<x_aligned>(x + w.o1);
        const float s = dot8(w.q, x0, x1);
        if constexpr (Dec<T>::kMin) {
            const float sx = (x0.x + x0.y) + (x0.z + x0.w) + (x1.x + x1.y) + (x1.z + x1.w);
            acc[n] = fmaf(w.m, sx, fmaf(w.d, s, acc[n]));
        } else {
            acc[n] = fmaf(w.d, s, acc[n]);
        }
    }
}

// Matrix-vector product: S warps share a row (each takes every S-th 256-element chunk, so a
// short matrix still puts enough loads in flight), kMvWarps / S rows per block. Chunks are
// processed U at a time with every load issued before the first use; a row's sum is the same
// for every U (chunk by chunk in order, each part's sum reduced by warp_sum, the parts added in
// order). GLU: the row of a second matrix (g.a2, the "up" weights) is multiplied too and the
// result is silu(a x) * (a2 x). MINB > 1: the register cap that lets MINB blocks share an SM
// (more warps in flight, fewer chunks in flight per warp); FERRY_CUDA_MV_OCC=0 picks MINB = 1
// for decode, to compare.
//
// fused (one column, one matrix, decode): the int8 kernel's fusions with the same arithmetic
// as the unfused launch, so the two give the same bits: [ADD ->] RMS_NORM -> MUL folded into
// the prologue (g.nx: every block computes b into shared memory, K floats of dynamic shared
// memory, with norm_prologue) and the decode epilogue (g.n_seg > 0: up to kMaxSeg matrices
// of one b as segments, each with its rope and/or KV-cache store, mv_epilogue). Blocks loop
// over row groups (a capped grid shares each block's norm between several groups); every
// segment's rows are a multiple of kMvWarps, so a block's rows lie in one segment and rope
// pairs (2i, 2i + 1) in one block (S <= kMvWarps / 2).
//
// raw (plain weights, one column; FERRY_CUDA_MV_FRAW=0 turns it off): a group's chunks are
// held as their raw bytes (4 registers a chunk for F16/BF16, 8 for F32) and decoded one at a
// time just before use, so that 4-8 chunks per matrix are in flight under the register cap
// instead of 1-2 decoded ones (the same chunks added in the same order: the same sums).
template <Type T>
constexpr bool kPlain = T == Type::F16 || T == Type::BF16 || T == Type::F32;

template <Type T, int NC, bool x_aligned, int S, bool glu, int MINB, bool fused = false,
          bool raw = false>
__global__ void __launch_bounds__(32 * kMvWarps, MINB) k_mul_mat_vec(MvArgs g) {
    constexpr bool kRaw = raw && kPlain<T> && NC == 1;
    constexpr int U = kRaw ? (T == Type::F32 ? (glu ? 2 : 4) : (glu ? 4 : 8))
                           : (MINB > 1 ? (glu ? 1 : 2) : (glu ? 2 : 4));
    constexpr int R = kMvWarps / S;  // rows per block and row group
    static_assert(!fused || NC == 1, "the fused forms take one column");
    __shared__ float sh[kMvWarps][glu ? 2 * NC : NC];
    __shared__ float pair[fused ? kMvWarps : 1], nred[fused ? 32 : 1];
    extern __shared__ float4 mv_smem[];  // fused, g.nx: b, K floats
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int part = warp % S, rl = warp / S;
    const int64_t mat = blockIdx.y;
    const int64_t i2 = mat % g.ne2, i3 = mat / g.ne2;
    const int64_t a_mat = (i2 / g.r2) * g.a_nb2 + (i3 / g.r3) * g.a_nb3;
    const int64_t col0 = static_cast<int64_t>(blockIdx.z) * kMaxCols;
    const int n_cols = static_cast<int>(min(static_cast<int64_t>(NC), g.N - col0));
    const char* bm = g.b + i2 * g.b_nb2 + i3 * g.b_nb3 + col0 * g.b_nb1;
    int64_t b_nb1 = g.b_nb1;
    // Row m's weights (of segment sg, its row ms there, with the epilogue).
    auto row_of = [&](int64_t m, int* sg, int64_t* ms) -> const char* {
        *ms = m;
        *sg = 0;
        if constexpr (fused) {
            if (g.n_seg > 0) {
                *sg = seg_of(g, m, ms);
                return g.seg[*sg].a + *ms * g.a_nb1;
            }
        }
        return g.a + a_mat + m * g.a_nb1;
    };
    const int64_t n_chunks = (g.K + 255) / 256;
    const int64_t n_full = g.K / 256;
    pdl_trigger();
    {
        const int64_t m0 = static_cast<int64_t>(blockIdx.x) * R + rl;
        if (m0 < g.M && part == 0 && blockIdx.z == 0) {
            // Weights never depend on the kernel before: the row's bytes are on their way to
            // L2 while that kernel finishes.
            int sg0;
            int64_t ms0;
            prefetch_l2(row_of(m0, &sg0, &ms0), g.a_row_bytes, lane);
            if constexpr (glu) prefetch_l2(g.a2 + a_mat + m0 * g.a_nb1, g.a_row_bytes, lane);
        }
    }
    // Folded norm (plain weights, g.early): the warp's first group of U chunks is loaded now,
    // so that its loads overlap the kernel before and the norm instead of following them;
    // decoded by the first group's iteration (the same values in the same order).
    constexpr bool kEarly = fused && (T == Type::F16 || T == Type::BF16 || T == Type::F32);
    Raw8 e0[kEarly ? U : 1], e02[kEarly && glu ? U : 1];
    bool early = false;
    if constexpr (kEarly) {
        const int64_t m0 = static_cast<int64_t>(blockIdx.x) * R + rl;
        early = g.nx && g.early && m0 < g.M && part + (U - 1) * S < n_full;
        if (early) {
            int sg0;
            int64_t ms0;
            const char* r0 = row_of(m0, &sg0, &ms0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                e0[u] = load_raw<T>(r0, part + u * S, lane);
                if constexpr (glu)
                    e02[u] = load_raw<T>(g.a2 + a_mat + m0 * g.a_nb1, part + u * S, lane);
            }
        }
    }
    pdl_wait();
    if constexpr (fused) {
        if (g.nx) {
            float4* xs = mv_smem;
            norm_prologue(g, nred, [&](int64_t i, float4 v) { xs[i] = v; });
            __syncthreads();
            bm = reinterpret_cast<const char*>(xs);
            b_nb1 = g.K * 4;
        }
    }
    // Unfused: one row group per block.
    const int64_t group_step = fused ? static_cast<int64_t>(gridDim.x) * R : g.M;
    for (int64_t mb = static_cast<int64_t>(blockIdx.x) * R; mb < g.M; mb += group_step) {
        const int64_t m = mb + rl;
        const bool valid = m < g.M;  // always, with the epilogue
        int sg = 0;
        int64_t ms = 0;
        if constexpr (fused) {
            // The block's next row group: its rows start on their way to L2 now, so that the
            // group's loads do not each wait on DRAM after this one ends.
            const int64_t mn = m + group_step;
            if (g.next && part == 0 && mn < g.M) {
                prefetch_l2(row_of(mn, &sg, &ms), g.a_row_bytes, lane);
                if constexpr (glu) prefetch_l2(g.a2 + a_mat + mn * g.a_nb1, g.a_row_bytes, lane);
            }
        }
        const char* row = row_of(valid ? m : 0, &sg, &ms);
        const char* row2 = glu ? g.a2 + a_mat + (valid ? m : 0) * g.a_nb1 : nullptr;
        float acc[NC], acc2[glu ? NC : 1];
#pragma unroll
        for (int n = 0; n < NC; n++) acc[n] = 0.0f;
#pragma unroll
        for (int n = 0; n < (glu ? NC : 1); n++) acc2[n] = 0.0f;
        int64_t c = part;
        if (valid) {
            if constexpr (kRaw) {
                for (; c + (U - 1) * S < n_full; c += U * S) {
                    Raw8 r[U], r2[glu ? U : 1];
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        if constexpr (kEarly) {
                            if (early) {
                                r[u] = e0[u];
                                if constexpr (glu) r2[u] = e02[u];
                                continue;
                            }
                        }
                        r[u] = load_raw<T>(row, c + u * S, lane);
                        if constexpr (glu) r2[u] = load_raw<T>(row2, c + u * S, lane);
                    }
                    early = false;
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int64_t e = (c + u * S) * 256 + 8 * lane;
                        Lane8 w;
                        Dec<T>::from_raw(r[u], e, w);
                        mv_chunk<T, NC, x_aligned>(w, bm, b_nb1, n_cols, acc);
                        if constexpr (glu) {
                            Dec<T>::from_raw(r2[u], e, w);
                            mv_chunk<T, NC, x_aligned>(w, bm, b_nb1, n_cols, acc2);
                        }
                    }
                }
            }
            if constexpr (!kRaw) {
                for (; c + (U - 1) * S < n_full; c += U * S) {
                    Lane8 w[U], w2[glu ? U : 1];
                    bool decoded = false;
                    if constexpr (kEarly) {
                        if (early) {
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                const int64_t e = (c + u * S) * 256 + 8 * lane;
                                Dec<T>::from_raw(e0[u], e, w[u]);
                                if constexpr (glu) Dec<T>::from_raw(e02[u], e, w2[u]);
                            }
                            early = false;
                            decoded = true;
                        }
                    }
                    if (!decoded) {
#pragma unroll
                        for (int u = 0; u < U; u++) {
                            Dec<T>::get(row, g.K, c + u * S, lane, w[u]);
                            if constexpr (glu) Dec<T>::get(row2, g.K, c + u * S, lane, w2[u]);
                        }
                    }
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        mv_chunk<T, NC, x_aligned>(w[u], bm, b_nb1, n_cols, acc);
                        if constexpr (glu)
                            mv_chunk<T, NC, x_aligned>(w2[u], bm, b_nb1, n_cols, acc2);
                    }
                }
            }
            for (; c < n_chunks; c += S) {
                Lane8 w;
                if (Dec<T>::get(row, g.K, c, lane, w)) {
                    mv_chunk<T, NC, x_aligned>(w, bm, b_nb1, n_cols, acc);
                    if constexpr (glu) {
                        Dec<T>::get(row2, g.K, c, lane, w);
                        mv_chunk<T, NC, x_aligned>(w, bm, b_nb1, n_cols, acc2);
                    }
                }
            }
        }
#pragma unroll
        for (int n = 0; n < NC; n++) acc[n] = warp_sum(acc[n]);
        if constexpr (glu) {
#pragma unroll
            for (int n = 0; n < NC; n++) acc2[n] = warp_sum(acc2[n]);
        }
        if constexpr (S > 1) {
            if (lane == 0) {
#pragma unroll
                for (int n = 0; n < NC; n++) {
                    sh[warp][n] = acc[n];
                    if constexpr (glu) sh[warp][NC + n] = acc2[n];
                }
            }
            __syncthreads();
#pragma unroll
            for (int n = 0; n < NC; n++) {
                float t = 0.0f, t2 = 0.0f;
#pragma unroll
                for (int p = 0; p < S; p++) {
                    t += sh[rl * S + p][n];
                    if constexpr (glu) t2 += sh[rl * S + p][NC + n];
                }
                acc[n] = t;
                if constexpr (glu) acc2[n] = t2;
            }
            if constexpr (fused) __syncthreads();  // sh is written again by the next group
        }
        const bool leader = part == 0 && valid;
        if constexpr (fused && !glu) {
            if (g.n_seg > 0) {
                mv_epilogue(g, g.seg[sg], ms, rl, leader, lane, acc[0], pair);
                continue;
            }
        }
        if (!leader || lane >= n_cols) continue;
        float v = 0.0f, v2 = 0.0f;
#pragma unroll
        for (int n = 0; n < NC; n++) {
            if (n == lane) {
                v = acc[n];
                if constexpr (glu) v2 = acc2[n];
            }
        }
        const int64_t col = col0 + lane;
        if constexpr (glu) v = v / (1.0f + expf(-v)) * v2;
        if (g.res) {
            v += reinterpret_cast<const float*>(g.res + col * g.res_nb1 + i2 * g.res_nb2 +
                                                i3 * g.res_nb3)[m];
        }
        g.out[((i3 * g.ne2 + i2) * g.N + col) * g.M + m] = v;
    }
}

// Any layout: warp per (row, matrix), lanes over elements, columns one after another.
__global__ void k_mul_mat_generic(MvArgs g, Type t) {
    const int lane = threadIdx.x % 32;
    const int64_t m = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
    const int64_t mat = blockIdx.y;
    const int64_t i2 = mat % g.ne2, i3 = mat / g.ne2;
    if (m >= g.M) return;
    const char* row = g.a + m * g.a_nb1 + (i2 / g.r2) * g.a_nb2 + (i3 / g.r3) * g.a_nb3;
    for (int64_t n = blockIdx.z; n < g.N; n += gridDim.z) {
        const float* x =
            reinterpret_cast<const float*>(g.b + n * g.b_nb1 + i2 * g.b_nb2 + i3 * g.b_nb3);
        float s = 0.0f;
        for (int64_t k = lane; k < g.K; k += 32) s = fmaf(load_elem(t, row, k), x[k], s);
        s = warp_sum(s);
        if (lane == 0) {
            if (g.res) {
                s += reinterpret_cast<const float*>(g.res + n * g.res_nb1 + i2 * g.res_nb2 +
                                                    i3 * g.res_nb3)[m];
            }
            g.out[((i3 * g.ne2 + i2) * g.N + n) * g.M + m] = s;
        }
    }
}

// Instantiated variants (compile time matters: CI builds every one): split-K (S > 1) and the
// GLU pair for single-column products (decode), S = 1 for 2..8 columns; x rows 16-byte
// aligned (the launcher sends other layouts to the generic kernel).
bool occupancy_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_OCC");
        return !(v && v[0] == '0');
    }();
    return on;
}

template <Type T, int NC, int S, bool glu>
void launch_vec_s(const MvArgs& g, dim3 grid, cudaStream_t st, bool raw) {
    grid.x = n_blocks(g.M, kMvWarps / S);
    if constexpr (kPlain<T> && NC == 1) {
        if (occupancy_mode() && raw) {
            launch_pdl(k_mul_mat_vec<T, 1, true, S, glu, 3, false, true>, grid, dim3(32 * kMvWarps),
                       0, st, g);
            return;
        }
    }
    // Measured on the H200 (bench/results/cuda.md, 1B Q4_0 tg128, same machine): the cap for
    // every split gave 504 t/s, for splits <= 2 only 473, none 428.
    if (NC == 1 && occupancy_mode()) {
        launch_pdl(k_mul_mat_vec<T, NC, true, S, glu, 3>, grid, dim3(32 * kMvWarps), 0, st, g);
    } else {
        launch_pdl(k_mul_mat_vec<T, NC, true, S, glu, 1>, grid, dim3(32 * kMvWarps), 0, st, g);
    }
}

template <Type T, bool glu>
void launch_vec(const MvArgs& g, dim3 grid, int split, cudaStream_t st, bool raw) {
    grid.z = static_cast<unsigned>((g.N + kMaxCols - 1) / kMaxCols);
    if (g.N == 1) {
        switch (split) {
            case 1:
                return launch_vec_s<T, 1, 1, glu>(g, grid, st, raw);
            case 2:
                return launch_vec_s<T, 1, 2, glu>(g, grid, st, raw);
            default:
                return launch_vec_s<T, 1, 4, glu>(g, grid, st, raw);
        }
    }
    if constexpr (!glu) {
        switch (g.N) {
            case 2:
                return launch_vec_s<T, 2, 1, false>(g, grid, st, raw);
            case 3:
            case 4:
                return launch_vec_s<T, 4, 1, false>(g, grid, st, raw);
            default:
                return launch_vec_s<T, 8, 1, false>(g, grid, st, raw);
        }
    }
}

bool aligned(const void* p, int64_t n, std::initializer_list<int64_t> strides) {
    if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(n) != 0) return false;
    for (int64_t s : strides) {
        if (s % n != 0) return false;
    }
    return true;
}
bool aligned16(const void* p, std::initializer_list<int64_t> strides) {
    return aligned(p, 16, strides);
}

// Every row of a's matrices (a2's for GLU, each epilogue segment's) starts at a multiple of n
// bytes.
bool rows_aligned(const MvArgs& g, bool glu, bool segs, int64_t n) {
    if (!aligned(g.a, n, {g.a_nb1, g.a_nb2, g.a_nb3}) || (glu && !aligned(g.a2, n, {}))) {
        return false;
    }
    for (int s = 0; segs && s < g.n_seg; s++) {
        if (!aligned(g.seg[s].a, n, {})) return false;
    }
    return true;
}

MvArgs make_args(const Tensor* dst, const Tensor* res) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    MvArgs g{};
    g.a = device_ptr(a);
    g.a2 = nullptr;
    g.a_nb1 = static_cast<int64_t>(a->nb[1]);
    g.a_nb2 = static_cast<int64_t>(a->nb[2]);
    g.a_nb3 = static_cast<int64_t>(a->nb[3]);
    g.K = a->ne[0];
    g.M = a->ne[1];
    g.a_row_bytes = static_cast<int64_t>(row_size(a->type, a->ne[0]));
    g.b = device_ptr(b);
    g.b_nb1 = static_cast<int64_t>(b->nb[1]);
    g.b_nb2 = static_cast<int64_t>(b->nb[2]);
    g.b_nb3 = static_cast<int64_t>(b->nb[3]);
    g.N = b->ne[1];
    g.ne2 = b->ne[2];
    g.ne3 = b->ne[3];
    g.r2 = b->ne[2] / a->ne[2];
    g.r3 = b->ne[3] / a->ne[3];
    g.out = reinterpret_cast<float*>(device_ptr(res ? res : dst));
    g.res = nullptr;
    g.res_nb1 = g.res_nb2 = g.res_nb3 = 0;
    g.n_seg = 0;
    for (MvSeg& sg : g.seg)
        sg = MvSeg{nullptr, nullptr, nullptr, 0, 0, 0, nullptr, Type::F32, false, false};
    g.rope_pos = nullptr;
    g.rope_ff = nullptr;
    g.rope_ff_nb0 = 0;
    g.rope_dims = g.rope_head = 0;
    g.rope_base = g.rope_fscale = 0.0;
    g.err = nullptr;
    g.nx = g.nadd = g.nw = nullptr;
    g.nsum = nullptr;
    g.neps = 0.0f;
    g.norm_threads = 0;
    g.early = false;
    g.next = false;
    return g;
}

bool is_block_type(Type t) {
    return t == Type::Q4_0 || t == Type::Q4_1 || t == Type::Q8_0 || t == Type::Q4_K ||
           t == Type::Q5_K || t == Type::Q6_K;
}

// The fast matrix-vector kernel applies: plain weights need 16-byte rows and K % 8 == 0;
// block formats (and the element-read ones, through the float kernel's decoders) any row.
bool fast_vec_ok(const MvArgs& g, Type t) {
    if (is_block_type(t) || elem_type(t)) return true;
    return g.K % 8 == 0 && aligned16(g.a, {g.a_nb1, g.a_nb2, g.a_nb3});
}

// Warps per row: enough rows x warps to give every SM ~32 warps, at most one per chunk, and
// at most kMvWarps / 2, so that a block holds row pairs (the fused epilogue's rope; the
// unfused product must add the same parts: a k or v projection of 512 rows took 8 before).
int choose_split(int64_t M, int64_t K, int n_sm) {
    const int64_t target = 32 * static_cast<int64_t>(n_sm);
    const int64_t chunks = (K + 255) / 256;
    int s = 1;
    while (2 * s <= kMvWarps / 2 && M * s < target && 2 * s <= chunks) s *= 2;
    return s;
}

// The float kernel's fused forms (norm prologue, decode epilogue) for plain weights, on
// unless FERRY_CUDA_MV_FFUSED=0 (then the F16/BF16/F32 decode runs as before: norm kernels
// apart, rope and KV store as their own kernels).
bool vec_fused_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_FFUSED");
        return !(v && v[0] == '0');
    }();
    return on;
}

// The float kernel takes this product fused: plain weights, one column of one matrix, and the
// fast path's layout (what launch_mat_vec picks for it unfused).
bool vec_fused_ok(const MvArgs& g, Type t) {
    return vec_fused_mode() && (t == Type::F32 || t == Type::F16 || t == Type::BF16) && g.N == 1 &&
           g.ne2 == 1 && g.ne3 == 1 && fast_vec_ok(g, t) &&
           aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3});
}

// The fused float kernel, raw or decoded form, for split S = 1, 2 or 4.
template <Type T, bool glu, bool raw>
void launch_vec_fused_form(const MvArgs& g, int split, dim3 grid, size_t smem, cudaStream_t st) {
    const dim3 block(32 * kMvWarps);
    switch (split) {
        case 1:
            launch_pdl(k_mul_mat_vec<T, 1, true, 1, glu, 3, true, raw>, grid, block, smem, st, g);
            break;
        case 2:
            launch_pdl(k_mul_mat_vec<T, 1, true, 2, glu, 3, true, raw>, grid, block, smem, st, g);
            break;
        default:
            launch_pdl(k_mul_mat_vec<T, 1, true, 4, glu, 3, true, raw>, grid, block, smem, st, g);
            break;
    }
}

template <Type T, bool glu>
void launch_vec_fused(const OpContext& ctx, const MvArgs& ga, int split) {
    MvArgs g = ga;
    g.next = ctx.mv_next;
    const size_t smem = g.nx ? static_cast<size_t>(g.K) * sizeof(float) : 0;
    const int R = kMvWarps / split;
    // A few blocks per SM loop over the row groups (each computes the folded norm once).
    // FERRY_CUDA_MV_FCAP=0: a block per row group, as the unfused launch (not yet measured;
    // ncu on the H200 read the capped q/k/v epilogue launch at 13.4 us for 12.6 MB: each
    // block takes ~4 row groups one after another, a DRAM round trip and 1-3 barriers each).
    static const bool cap = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_FCAP");
        return !(v && v[0] == '0');
    }();
    const unsigned blocks =
        cap ? std::min(n_blocks(g.M, R), static_cast<unsigned>(ctx.n_sm) * 3) : n_blocks(g.M, R);
    const dim3 grid(blocks, 1, 1);
    if (ctx.mv_raw) {
        launch_vec_fused_form<T, glu, true>(g, split, grid, smem, ctx.stream);
    } else {
        launch_vec_fused_form<T, glu, false>(g, split, grid, smem, ctx.stream);
    }
}

// The fused float kernel with the unfused launch's split for this product (M rows).
template <bool glu>
Status dispatch_vec_fused(OpContext& ctx, const MvArgs& g, Type t, int64_t M) {
    const int split = choose_split(M, g.K, ctx.n_sm);
    switch (t) {
        case Type::F32:
            launch_vec_fused<Type::F32, glu>(ctx, g, split);
            break;
        case Type::F16:
            launch_vec_fused<Type::F16, glu>(ctx, g, split);
            break;
        case Type::BF16:
            launch_vec_fused<Type::BF16, glu>(ctx, g, split);
            break;
        default:
            return Status::errorf("CUDA: fused MUL_MAT weight type %s", type_name(t));
    }
    return launch_status(glu ? "MUL_MAT+MUL_MAT+SWIGLU (vec, fused)" : "MUL_MAT (vec, fused)");
}

template <bool glu>
Status dispatch_vec(OpContext& ctx, const MvArgs& g, Type t, dim3 grid, int split) {
    switch (t) {
        case Type::F32:
            launch_vec<Type::F32, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::F16:
            launch_vec<Type::F16, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::BF16:
            launch_vec<Type::BF16, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q4_0:
            launch_vec<Type::Q4_0, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q4_1:
            launch_vec<Type::Q4_1, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q8_0:
            launch_vec<Type::Q8_0, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q4_K:
            launch_vec<Type::Q4_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q5_K:
            launch_vec<Type::Q5_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q6_K:
            launch_vec<Type::Q6_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q5_0:
            launch_vec<Type::Q5_0, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q5_1:
            launch_vec<Type::Q5_1, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q2_K:
            launch_vec<Type::Q2_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::Q3_K:
            launch_vec<Type::Q3_K, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::IQ4_NL:
            launch_vec<Type::IQ4_NL, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::IQ4_XS:
            launch_vec<Type::IQ4_XS, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        case Type::MXFP4:
            launch_vec<Type::MXFP4, glu>(g, grid, split, ctx.stream, ctx.mv_raw);
            break;
        default:
            return Status::errorf("CUDA: MUL_MAT weight type %s", type_name(t));
    }
    return launch_status(glu ? "MUL_MAT+MUL_MAT+SWIGLU" : "MUL_MAT (vec)");
}

// ---------------------------------------------------------------------------------------------
// Decode with block-format weights: b quantized to int8 and integer dot products (dp4a).
//
// Measured first (bench/results/cuda.md, ncu): the float kernel above reaches only 360-830 GB/s
// on Q4_0/Q6_K rows because it spends ~7 instructions per weight (unpack, int-to-float, FMA,
// and 4 bytes of b per weight from L1) — instruction-bound far below the memory's rate. Here
// each block first quantizes its column of b into shared memory (int8, one float scale per 32
// elements: the Q8_0 scheme of the CPU backend with an unrounded scale), then a lane's 8
// weights take 2 dp4a (4 products each) against the matching b words, and one FMA applies the
// weight scale times b's scale: ~1.5 instructions per weight. The quantized b's rounding is
// what kMulMatQ in the op tests bounds (NMSE ~1.6e-5). A lane's 8 weights always lie in one
// 32-element block of b (the layouts of Dec above), so one b scale applies to them.

// The 8 weights of a lane in chunk c as two words of 4 signed bytes: v0 at elements o0..o0+3,
// v1 at o1..o1+3; weight = d * q + m (m only for the types with a min).
struct Lane8i {
    int32_t v0, v1;
    float d, m;
    int32_t o0, o1;
};

template <Type T>
struct IDec;

template <>
struct IDec<Type::Q4_0> {
    static constexpr bool kMin = false;
    static constexpr int kShift = 4;
    __device__ static void get(const char* row, int64_t c, int lane, Lane8i& w) {
        const int64_t blk = c * 8 + lane / 4;
        const char* bp = row + blk * 18;
        const int p = lane % 4;
        const uint32_t v = ld32_a2(bp + 2 + 4 * p);
        // Each byte 16 * (q - 8): the nibble moved to the byte's top half with its top bit
        // flipped (two logic operations instead of a byte-wise subtract); q8_dot divides the
        // sum by 16 (kShift), exactly, as every product is a multiple of 16.
        w.v0 = static_cast<int32_t>(((v << 4) & 0xf0f0f0f0u) ^ 0x80808080u);
        w.v1 = static_cast<int32_t>((v & 0xf0f0f0f0u) ^ 0x80808080u);
        w.d = h2f(ld16(bp));
        w.m = 0.0f;
        w.o0 = static_cast<int32_t>(blk * 32 + 4 * p);
        w.o1 = w.o0 + 16;
    }
};

template <>
struct IDec<Type::Q4_1> {
    static constexpr bool kMin = true;
    static constexpr int kShift = 0;
    __device__ static void get(const char* row, int64_t c, int lane, Lane8i& w) {
        const int64_t blk = c * 8 + lane / 4;
        const char* bp = row + blk * 20;
        const int p = lane % 4;
        const uint32_t v = ld32_a2(bp + 4 + 4 * p);
        w.v0 = static_cast<int32_t>(v & 0x0f0f0f0fu);
        w.v1 = static_cast<int32_t>((v >> 4) & 0x0f0f0f0fu);
        w.d = h2f(ld16(bp));
        w.m = h2f(ld16(bp + 2));
        w.o0 = static_cast<int32_t>(blk * 32 + 4 * p);
        w.o1 = w.o0 + 16;
    }
};

template <>
struct IDec<Type::Q8_0> {
    static constexpr bool kMin = false;
    static constexpr int kShift = 0;
    __device__ static void get(const char* row, int64_t c, int lane, Lane8i& w) {
        const int64_t blk = c * 8 + lane / 4;
        const char* bp = row + blk * 34;
        const int p = lane % 4;
        w.v0 = static_cast<int32_t>(ld32_a2(bp + 2 + 8 * p));
        w.v1 = static_cast<int32_t>(ld32_a2(bp + 6 + 8 * p));
        w.d = h2f(ld16(bp));
        w.m = 0.0f;
        w.o0 = static_cast<int32_t>(blk * 32 + 8 * p);
        w.o1 = w.o0 + 4;
    }
};

template <>
struct IDec<Type::Q4_K> {
    static constexpr bool kMin = true;
    static constexpr int kShift = 0;
    __device__ static void get(const char* row, int64_t c, int lane, Lane8i& w) {
        const char* bp = row + c * 144;
        const int j = lane / 4, p = lane % 4;
        int sc, mn;
        k_scale_min(reinterpret_cast<const uint8_t*>(bp + 4), j, &sc, &mn);
        w.d = h2f(ld16(bp)) * static_cast<float>(sc);
        w.m = -h2f(ld16(bp + 2)) * static_cast<float>(mn);
        const char* qs = bp + 16 + 32 * (j / 2) + 8 * p;
        const int sh = (j % 2) * 4;
        w.v0 = static_cast<int32_t>((ld32_a2(qs) >> sh) & 0x0f0f0f0fu);
        w.v1 = static_cast<int32_t>((ld32_a2(qs + 4) >> sh) & 0x0f0f0f0fu);
        w.o0 = static_cast<int32_t>(c * 256 + 32 * j + 8 * p);
        w.o1 = w.o0 + 4;
    }
};

template <>
struct IDec<Type::Q5_K> {
    static constexpr bool kMin = true;
    static constexpr int kShift = 0;
    __device__ static void get(const char* row, int64_t c, int lane, Lane8i& w) {
        const char* bp = row + c * 176;
        const int j = lane / 4, p = lane % 4;
        int sc, mn;
        k_scale_min(reinterpret_cast<const uint8_t*>(bp + 4), j, &sc, &mn);
        w.d = h2f(ld16(bp)) * static_cast<float>(sc);
        w.m = -h2f(ld16(bp + 2)) * static_cast<float>(mn);
        const char* qs = bp + 48 + 32 * (j / 2) + 8 * p;
        const int sh = (j % 2) * 4;
        const uint2 hh = make_uint2(ld32_a2(bp + 16 + 8 * p), ld32_a2(bp + 20 + 8 * p));
        const uint2 q = make_uint2(ld32_a2(qs), ld32_a2(qs + 4));
        w.v0 =
            static_cast<int32_t>(((q.x >> sh) & 0x0f0f0f0fu) | (((hh.x >> j) & 0x01010101u) << 4));
        w.v1 =
            static_cast<int32_t>(((q.y >> sh) & 0x0f0f0f0fu) | (((hh.y >> j) & 0x01010101u) << 4));
        w.o0 = static_cast<int32_t>(c * 256 + 32 * j + 8 * p);
        w.o1 = w.o0 + 4;
    }
};

template <>
struct IDec<Type::Q6_K> {
    static constexpr bool kMin = false;
    static constexpr int kShift = 2;
    __device__ static void get(const char* row, int64_t c, int lane, Lane8i& w) {
        const char* bp = row + c * 210;
        const int j = lane / 4, p = lane % 4;
        const int h = j / 4, part = j % 4;
        const int l0 = 8 * p;
        const char* ql = bp + 64 * h + l0 + ((part & 1) ? 32 : 0);
        const char* qh = bp + 128 + 32 * h + l0;
        const int lsh = part >= 2 ? 4 : 0;
        const int hsh = 2 * part;
        const uint2 lo = make_uint2(ld32_a2(ql), ld32_a2(ql + 4));
        const uint2 hi = make_uint2(ld32_a2(qh), ld32_a2(qh + 4));
        const uint32_t q0 = ((lo.x >> lsh) & 0x0f0f0f0fu) | (((hi.x >> hsh) & 0x03030303u) << 4);
        const uint32_t q1 = ((lo.y >> lsh) & 0x0f0f0f0fu) | (((hi.y >> hsh) & 0x03030303u) << 4);
        // Each byte 4 * (q - 32): q ^ 32 is q - 32 as a 6-bit two's complement number, shifted
        // to the byte's top; q8_dot divides the sum by 4 (kShift), exactly.
        w.v0 = static_cast<int32_t>((q0 ^ 0x20202020u) << 2);
        w.v1 = static_cast<int32_t>((q1 ^ 0x20202020u) << 2);
        const int g = 8 * h + 2 * part + l0 / 16;
        w.d = h2f(ld16(bp + 208)) * static_cast<float>(static_cast<int8_t>(bp[192 + g]));
        w.m = 0.0f;
        w.o0 = static_cast<int32_t>(c * 256 + 32 * j + l0);
        w.o1 = w.o0 + 4;
    }
};

// Bytes of one 256-element chunk of a row.
template <Type T>
struct Chunk;
template <>
struct Chunk<Type::Q4_0> {
    static constexpr int64_t kBytes = 8 * 18;
};
template <>
struct Chunk<Type::Q4_1> {
    static constexpr int64_t kBytes = 8 * 20;
};
template <>
struct Chunk<Type::Q8_0> {
    static constexpr int64_t kBytes = 8 * 34;
};
template <>
struct Chunk<Type::Q4_K> {
    static constexpr int64_t kBytes = 144;
};
template <>
struct Chunk<Type::Q5_K> {
    static constexpr int64_t kBytes = 176;
};
template <>
struct Chunk<Type::Q6_K> {
    static constexpr int64_t kBytes = 210;
};

constexpr int kQ8Warps = 8;
constexpr int kQ8MinBlocks = 4;
// The int8 decode kernel's ring form (weights streamed into shared memory by bulk copies, see
// k_mul_mat_vec_q8 below): at most this many stage slots, in a block of at most kRingSmem2
// bytes of dynamic shared memory (two blocks per SM) or, when two stages do not fit there,
// kRingSmem1 (one block per SM; the H200 lets a block take 227 KiB). kRingSmem2 was 110 KiB
// (two blocks filled the SM's shared memory); measured on the H200 with the block-lane form
// (bench/results/cuda.md, stop 21, 1B Q4_0 tg128): 1,301 t/s at 64 KiB against 1,260 at
// 110 and 1,243 at 40. FERRY_CUDA_MV_RING_KB=N (N <= kRingSmem2Max / 1024) sets it.
constexpr int kRingMaxStages = 8;
constexpr size_t kRingSmem2 = 64 * 1024;
constexpr size_t kRingSmem2Max = 110 * 1024;
constexpr size_t kRingSmem1 = 220 * 1024;

template <Type T>
__device__ __forceinline__ float q8_dot(const Lane8i& w, const int32_t* xq, const float* xd) {
    // Offsets are never negative: unsigned division is a shift (signed division by a power
    // of two costs a sign correction, ~10 instructions per chunk here).
    const uint32_t o0 = static_cast<uint32_t>(w.o0), o1 = static_cast<uint32_t>(w.o1);
    const int32_t a = xq[o0 / 4], b = xq[o1 / 4];
    const int s = __dp4a(w.v1, b, __dp4a(w.v0, a, 0)) >> IDec<T>::kShift;
    const float dx = xd[o0 / 32];
    float r = w.d * dx * static_cast<float>(s);
    if constexpr (IDec<T>::kMin) {
        const int sx = __dp4a(0x01010101, b, __dp4a(0x01010101, a, 0));
        r = fmaf(w.m * dx, static_cast<float>(sx), r);
    }
    return r;
}

// ---------------------------------------------------------------------------------------------
// The block-lane form (Q4_0 and Q6_K; `blk` below; FERRY_CUDA_MV_BLK=0 turns it off per
// backend). Measured first (ncu, stop 20): the lane-per-8-weights decoders above spend ~50
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

__device__ __forceinline__ int4 ld_group(const int32_t* xq, uint32_t word) {
    return *reinterpret_cast<const int4*>(xq + word);
}

template <Type T>
struct BDec;

// Q4_0: lane l takes blocks 2l and 2l + 1 of the span's 64: 36 bytes, 4-byte aligned, nine
// words (a stride of 9 words: no bank conflicts in the ring), block A's quants realigned by
// four funnel shifts. b: groups 4l + j, swizzled G ^ ((G >> 3) & 3).
template <>
struct BDec<Type::Q4_0> {
    static constexpr int64_t kSpanBytes = 64 * 18;
    __device__ static uint32_t swz(uint32_t u) { return u ^ (((u >> 5) & 3u) << 2); }
    // Blocks of 32 in the span's part of a row of K: lanes past them have nothing.
    __device__ static bool active(int64_t K, int64_t sp, int lane) {
        return sp * 64 + 2 * lane < K / 32;
    }
    __device__ static void load_x(const int32_t* xq, const float* xd, int64_t sp, int lane,
                                  BlkX& x) {
        const uint32_t g0 = static_cast<uint32_t>(sp) * 128u + 4u * lane;
#pragma unroll
        for (int j = 0; j < 4; j++) x.x[j] = ld_group(xq, swz(4u * (g0 + j)));
        const float2 d = reinterpret_cast<const float2*>(xd)[sp * 32 + lane];
        x.d = make_float4(d.x, d.y, 0.0f, 0.0f);
    }
    // A block's 16 bytes of quants against b's 32 (xl: elements 0-15, xh: 16-31): byte i holds
    // element i in its low nibble and i + 16 in its high one, each made the signed byte
    // 16 (q - 8) as in IDec<Q4_0>; the sum is divided by 16.
    __device__ static int block(uint32_t q0, uint32_t q1, uint32_t q2, uint32_t q3, int4 xl,
                                int4 xh) {
        auto lo = [](uint32_t v) {
            return static_cast<int32_t>(((v << 4) & 0xf0f0f0f0u) ^ 0x80808080u);
        };
        auto hi = [](uint32_t v) { return static_cast<int32_t>((v & 0xf0f0f0f0u) ^ 0x80808080u); };
        int s = __dp4a(lo(q0), xl.x, 0);
        s = __dp4a(lo(q1), xl.y, s);
        s = __dp4a(lo(q2), xl.z, s);
        s = __dp4a(lo(q3), xl.w, s);
        s = __dp4a(hi(q0), xh.x, s);
        s = __dp4a(hi(q1), xh.y, s);
        s = __dp4a(hi(q2), xh.z, s);
        s = __dp4a(hi(q3), xh.w, s);
        return s >> 4;
    }
    // The lane's nine words of span sp (load_raw), then their products with b (dot_raw): apart
    // so that the streaming form can load spans ahead of their use.
    struct Raw {
        uint32_t v[9];
    };
    // (load_span: the same words from a copy of the span, e.g. in shared memory.)
    __device__ static void load_span(const char* span, int lane, Raw& r) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(span + lane * 36);
#pragma unroll
        for (int i = 0; i < 9; i++) r.v[i] = w[i];
    }
    __device__ static void load_raw(const char* row, int64_t sp, int lane, Raw& r) {
        load_span(row + sp * kSpanBytes, lane, r);
    }
    __device__ static float dot(const char* row, int64_t sp, int lane, const BlkX& x, float acc) {
        Raw r;
        load_raw(row, sp, lane, r);
        return dot_raw(r, sp, lane, x, acc);
    }
    __device__ static float dot_raw(const Raw& r, int64_t, int, const BlkX& x, float acc) {
        const uint32_t* v = r.v;
        // Block A: scale in bytes 0-1, quants in 2-17; block B: scale in 18-19, quants in
        // 20-35 (words 5-8).
        const int sa =
            block(__funnelshift_r(v[0], v[1], 16), __funnelshift_r(v[1], v[2], 16),
                  __funnelshift_r(v[2], v[3], 16), __funnelshift_r(v[3], v[4], 16), x.x[0], x.x[1]);
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
    __device__ static uint32_t swz(uint32_t u) { return u ^ (((u >> 5) & 3u) << 3); }
    __device__ static bool active(int64_t K, int64_t sp, int lane) {
        return sp * 8 + lane / 4 < K / 256;
    }
    __device__ static void load_x(const int32_t* xq, const float* xd, int64_t sp, int lane,
                                  BlkX& x) {
        const uint32_t sb = static_cast<uint32_t>(sp) * 8u + lane / 4;
        const uint32_t h = (lane / 2) % 2, e = lane % 2;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            x.x[p] = ld_group(xq, swz(4u * (16u * sb + 8u * h + 2u * p + e)));
        }
        x.d = reinterpret_cast<const float4*>(xd)[2 * sb + h];
    }
    // One part's 16 quants: 4 (q - 32) as signed bytes (q: the low or high nibble of ql, two
    // bits of qh at 2p), against b's group; the sum is divided by 4 (exact, as in IDec<Q6_K>).
    __device__ static int part(uint4 ql, uint4 qh, int lsh, int hsh, int4 xg) {
        auto q = [&](uint32_t l, uint32_t hh) {
            const uint32_t v = ((l >> lsh) & 0x0f0f0f0fu) | (((hh >> hsh) & 0x03030303u) << 4);
            return static_cast<int32_t>((v ^ 0x20202020u) << 2);
        };
        int s = __dp4a(q(ql.x, qh.x), xg.x, 0);
        s = __dp4a(q(ql.y, qh.y), xg.y, s);
        s = __dp4a(q(ql.z, qh.z), xg.z, s);
        s = __dp4a(q(ql.w, qh.w), xg.w, s);
        return s >> 2;
    }
    // The lane's words of span sp (load_raw: three runs of five, the scales' two or three and
    // d's), then their products with b (dot_raw): apart so that the streaming form can load
    // spans ahead of their use.
    struct Raw {
        uint32_t a[5], b[5], h[5], s[3], d;
    };
    __device__ static uint32_t base_of(int64_t sp, int lane) {
        return static_cast<uint32_t>(sp * kSpanBytes) + 210u * static_cast<uint32_t>(lane / 4);
    }
    __device__ static void words5(const char* row, uint32_t at, uint32_t (&w)[5]) {
        const uint32_t* p = reinterpret_cast<const uint32_t*>(row + (at & ~3u));
#pragma unroll
        for (int i = 0; i < 5; i++) w[i] = p[i];
    }
    // The words at byte `base` of row (load_raw: base_of(sp, lane) from the row's start;
    // load_span: base_of(0, lane) from a copy of the span, e.g. in shared memory; a span is a
    // multiple of 4 bytes, so the words' alignment within it is their alignment in the row).
    __device__ static void load_raw(const char* row, int64_t sp, int lane, Raw& r) {
        load_at(row, base_of(sp, lane), lane, r);
    }
    __device__ static void load_span(const char* span, int lane, Raw& r) {
        load_at(span, base_of(0, lane), lane, r);
    }
    __device__ static void load_at(const char* row, uint32_t base, int lane, Raw& r) {
        const uint32_t h = (lane / 2) % 2, e = lane % 2;
        const uint32_t sh = (base & 2u) * 8u;
        words5(row, base + 64u * h + 16u * e, r.a);
        words5(row, base + 64u * h + 32u + 16u * e, r.b);
        words5(row, base + 128u + 32u * h + 16u * e, r.h);
        // Scales 8h .. 8h + 7 (two words from 192 + 8h), then d (the low half at 208).
        const uint32_t* ws =
            reinterpret_cast<const uint32_t*>(row + ((base + 192u + 8u * h) & ~3u));
        r.s[0] = ws[0];
        r.s[1] = ws[1];
        // (The third word only when realigning: unshifted, it could lie past the row's end.)
        r.s[2] = sh ? ws[2] : 0u;
        r.d = *reinterpret_cast<const uint32_t*>(row + ((base + 208u) & ~3u));
    }
    __device__ static uint4 shifted(const uint32_t (&w)[5], uint32_t sh) {
        return make_uint4(__funnelshift_r(w[0], w[1], sh), __funnelshift_r(w[1], w[2], sh),
                          __funnelshift_r(w[2], w[3], sh), __funnelshift_r(w[3], w[4], sh));
    }
    __device__ static float dot(const char* row, int64_t sp, int lane, const BlkX& x, float acc) {
        Raw r;
        load_raw(row, sp, lane, r);
        return dot_raw(r, sp, lane, x, acc);
    }
    __device__ static float dot_raw(const Raw& r, int64_t sp, int lane, const BlkX& x, float acc) {
        const uint32_t e = lane % 2;
        const uint32_t sh = (base_of(sp, lane) & 2u) * 8u;
        const uint4 qa = shifted(r.a, sh);
        const uint4 qb = shifted(r.b, sh);
        const uint4 qh = shifted(r.h, sh);
        const uint32_t s0 = __funnelshift_r(r.s[0], r.s[1], sh);
        const uint32_t s1 = __funnelshift_r(r.s[1], r.s[2], sh);
        const uint32_t sc = __byte_perm(s0, s1, 0x6420u + 0x1111u * e);  // 2p + e, p = 0..3
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

template <Type T>
constexpr bool kHasBlk = T == Type::Q4_0 || T == Type::Q6_K;

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
// q8_quantize4 needs).
template <int kPre, typename Put>
__device__ __forceinline__ void put_b(const float4* x4, int64_t n4, Put put) {
    for (int64_t i0 = threadIdx.x; i0 < n4; i0 += kPre * blockDim.x) {
        float4 xv[kPre];
#pragma unroll
        for (int j = 0; j < kPre; j++) {
            const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
            if (i < n4) xv[j] = x4[i];
        }
#pragma unroll
        for (int j = 0; j < kPre; j++) {
            const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
            if (i >= n4) break;
            put(i, xv[j]);
        }
    }
}

// One column of b (N == 1), K a multiple of 256, b 16-byte aligned. Dynamic shared memory:
// K / 4 words of int8 quants, then K / 32 float scales. Blocks loop over groups of
// kQ8Warps / S rows (grid capped so that each block's quantization of b is shared by several
// rows); S warps share a row (split-K: warp part p takes the groups of U chunks p, p + S, ...,
// and the block adds the parts), so that a short matrix or a long row still has enough loads
// in flight. With S > 1 or the epilogue, M % (kQ8Warps / S) == 0 (the launcher checks).
// Ring (`ring`, sm_90; FERRY_CUDA_MV_RING=0 turns it off): the weights reach the warps through
// shared memory instead of registers. The block's row groups are its stages (each the R rows
// of a group, contiguous in memory: one bulk copy per matrix); a ring of P stage slots
// (cp.async.bulk, completion on one mbarrier per slot) is started by lanes 0..P-1 of warp 0
// before griddepcontrol.wait, so the weights stream in while the kernel before finishes and
// while b is quantized, and refilled by thread 0 as slots free up. The warps then read the
// rows from shared memory with the same decoders and add the same chunks in the same order:
// bit for bit the register form. Measured on the H200 (bench/results/cuda.md, stop 20): 1B
// Q4_0 tg128 +1.5-3% (the Q6_K output product 110 against 123-136 us); the products stay
// bound by instruction issue, not by bytes in flight. The same ring in the float kernel
// (F16 weights) was slower (656 against 669-677 t/s) and was removed.
// Block-lane (`blk`, Q4_0 and Q6_K with 4-byte aligned rows): each warp's part of a row is
// taken in spans of 2048 weights, span p, p + S, ... for part p (BDec above), in both forms.
template <Type T, bool glu, bool epi, bool wide, bool ring = false, bool blk = false>
__global__ void __launch_bounds__(32 * kQ8Warps, ring ? 2 : kQ8MinBlocks)
    k_mul_mat_vec_q8(MvArgs g, int S, int P, int64_t stage_bytes) {
    static_assert(!blk || kHasBlk<T>, "the block-lane form decodes Q4_0 and Q6_K");
    // Chunks per warp whose loads are issued before the first is used. Wide (the default;
    // FERRY_CUDA_MV_WIDE=0 turns it off): a row of K = 2048 in one round trip instead of two.
    // With S = 1 the chunks are added in the same order either way (bit-identical).
    constexpr int U = wide ? (glu ? 4 : 8) : (glu ? 2 : 4);
    extern __shared__ __align__(16) int32_t q8_smem[];
    __shared__ float red[kQ8Warps], red2[glu ? kQ8Warps : 1], pair[kQ8Warps], nred[32];
    int32_t* xq = q8_smem;
    float* xd = reinterpret_cast<float*>(q8_smem + g.K / 4);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int R = kQ8Warps / S;  // rows per block and iteration
    const int part = warp % S, rl = warp / S;
    const int64_t mat = blockIdx.y;
    const int64_t i2 = mat % g.ne2, i3 = mat / g.ne2;
    const float4* x4 = reinterpret_cast<const float4*>(g.b + i2 * g.b_nb2 + i3 * g.b_nb3);
    const int64_t a_mat = (i2 / g.r2) * g.a_nb2 + (i3 / g.r3) * g.a_nb3;
    const int64_t n_chunks = g.K / 256;
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
    uint64_t tr1 = 0, tr2 = 0, tr_wait = 0;
    uint32_t tr_groups = 0;
#endif
    pdl_trigger();
    // The ring's slots start after b's quants and scales (128-byte aligned); slot s holds the
    // rows of the block's iterations s, s + P, ...; the k-th use of a slot completes its
    // barrier's phase k.
    __shared__ uint64_t ring_bar[ring ? kRingMaxStages : 1];
    [[maybe_unused]] char* ring_base =
        reinterpret_cast<char*>(q8_smem) + ((g.K + g.K / 8 + 127) / 128) * 128;
    [[maybe_unused]] const int64_t ring_rows =
        static_cast<int64_t>(R) * g.a_nb1;  // bytes of one matrix's rows
    // Issues the copies of the block's iteration j (when that row group exists).
    // (slot = j % P, passed in: a 64-bit modulo by a run-time P is a long emulated sequence.)
    [[maybe_unused]] auto issue = [&](int64_t j, int slot) {
        const int64_t mb = (static_cast<int64_t>(blockIdx.x) + j * gridDim.x) * R;
        if (mb >= g.M) return;
        const int64_t rows = min(static_cast<int64_t>(R), g.M - mb);
        const uint32_t bytes = static_cast<uint32_t>(rows * g.a_nb1);
        const char* src = g.a + a_mat + mb * g.a_nb1;
        if constexpr (epi) {
            int64_t ms = 0;
            src = g.seg[seg_of(g, mb, &ms)].a + ms * g.a_nb1;
        }
        char* dst = ring_base + slot * stage_bytes;
        mbar_expect(&ring_bar[slot], glu ? 2 * bytes : bytes);
        bulk_to_smem(dst, src, bytes, &ring_bar[slot]);
        if constexpr (glu) {
            bulk_to_smem(dst + ring_rows, g.a2 + a_mat + mb * g.a_nb1, bytes, &ring_bar[slot]);
        }
    };
    if constexpr (ring) {
        // Lane s of warp 0 starts slot s (one thread's issue is ~100 instructions of address
        // arithmetic: P of them in a row would hold up the block's first barrier).
        if (threadIdx.x < static_cast<unsigned>(P)) {
            mbar_init(&ring_bar[threadIdx.x], 1);
            mbar_init_fence();
            issue(threadIdx.x, static_cast<int>(threadIdx.x));
        }
    } else {
        // Weights never depend on the kernel before: this warp's part of its first row is on
        // its way to L2 while that kernel finishes.
        const int64_t m0 = static_cast<int64_t>(blockIdx.x) * R + rl;
        const int64_t row_bytes = n_chunks * Chunk<T>::kBytes;
        const int64_t part_bytes = (row_bytes + S - 1) / S;
        const int64_t off = part * part_bytes;
        if (m0 < g.M && off < row_bytes) {
            const int64_t n = min(part_bytes, row_bytes - off);
            const char* a0 = g.a + a_mat + m0 * g.a_nb1;
            if constexpr (epi) {
                int64_t ms = 0;
                a0 = g.seg[seg_of(g, m0, &ms)].a + ms * g.a_nb1;
            }
            prefetch_l2(a0 + off, n, lane);
            if constexpr (glu) prefetch_l2(g.a2 + a_mat + m0 * g.a_nb1 + off, n, lane);
        }
    }
    NormW nw;
    const bool nfast = g.nx && g.nfast && norm_fast_ok(g);
    if (nfast) norm_w_load(g, nw);
    pdl_wait();
#ifdef FERRY_CUDA_TRACE
    tr1 = gtime();
#endif
    // 8 consecutive threads quantize one block of 32 (K / 4 is a multiple of the block size,
    // so every warp runs each iteration whole). kPre loads per thread are issued before the
    // first is used: b (32 KiB for K = 8192) arrives in one round trip, not kPre
    // (FERRY_CUDA_MV_WIDE=0: one load at a time, as before).
    const int64_t n4 = g.K / 4;
    if (nfast) {
        // b = the folded RMS_NORM (+ ADD) and MUL, element for element as k_norm computes it.
        norm_prologue_fast(g, nw, nred,
                           [&](int64_t i, float4 v) { q8_quantize4<blk, T>(v, i, lane, xq, xd); });
    } else if (g.nx) {
        norm_prologue(g, nred,
                      [&](int64_t i, float4 v) { q8_quantize4<blk, T>(v, i, lane, xq, xd); });
    } else {
        put_b<wide ? 8 : 1>(x4, n4,
                            [&](int64_t i, float4 v) { q8_quantize4<blk, T>(v, i, lane, xq, xd); });
    }
    __syncthreads();
#ifdef FERRY_CUDA_TRACE
    tr2 = gtime();
#endif
    const int64_t n_groups = n_chunks / U;
    // The block's iteration, its ring slot it % P and the slot's phase (it / P) % 2, the last
    // two kept by counting: a 64-bit division by the run-time P was ~5% of a gate/up launch's
    // instructions (ncu).
    int64_t it = 0;
    [[maybe_unused]] int slot = 0;
    [[maybe_unused]] uint32_t phase = 0;
    for (int64_t mb = static_cast<int64_t>(blockIdx.x) * R; mb < g.M;
         mb += static_cast<int64_t>(gridDim.x) * R, it++) {
        const int64_t m = mb + rl;
        const bool valid = m < g.M;  // always, when S > 1 or epi
        const char* row = g.a + a_mat + (valid ? m : 0) * g.a_nb1;
        int64_t ms = m;
        int sg = 0;
        if constexpr (epi) {
            sg = seg_of(g, m, &ms);
            row = g.seg[sg].a + ms * g.a_nb1;
        }
        const char* row2 = glu ? g.a2 + a_mat + (valid ? m : 0) * g.a_nb1 : nullptr;
        if constexpr (ring) {
#ifdef FERRY_CUDA_TRACE
            const uint64_t c0 = clock64();
            mbar_wait(&ring_bar[slot], phase);
            tr_wait += clock64() - c0;
            tr_groups++;
#else
            mbar_wait(&ring_bar[slot], phase);
#endif
            row = ring_base + slot * stage_bytes + rl * g.a_nb1;
            row2 = row + ring_rows;
        }
        float acc = 0.0f, acc2 = 0.0f;
        if constexpr (blk) {
            // Spans of 2048 weights; the last may be short (lanes past the row have nothing).
            const int64_t n_spans = (g.K + kSpan - 1) / kSpan;
            for (int64_t sp = valid ? part : n_spans; sp < n_spans; sp += S) {
                if (!BDec<T>::active(g.K, sp, lane)) continue;
                BlkX x;
                BDec<T>::load_x(xq, xd, sp, lane, x);
                acc = BDec<T>::dot(row, sp, lane, x, acc);
                if constexpr (glu) acc2 = BDec<T>::dot(row2, sp, lane, x, acc2);
            }
        }
        for (int64_t gi = valid && !blk ? part : n_groups; gi < n_groups; gi += S) {
            const int64_t c = gi * U;
            Lane8i w[U], w2[glu ? U : 1];
#pragma unroll
            for (int u = 0; u < U; u++) {
                IDec<T>::get(row, c + u, lane, w[u]);
                if constexpr (glu) IDec<T>::get(row2, c + u, lane, w2[u]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                acc += q8_dot<T>(w[u], xq, xd);
                if constexpr (glu) acc2 += q8_dot<T>(w2[u], xq, xd);
            }
        }
        for (int64_t c = valid && !blk ? n_groups * U + part : n_chunks; c < n_chunks; c += S) {
            Lane8i w;
            IDec<T>::get(row, c, lane, w);
            acc += q8_dot<T>(w, xq, xd);
            if constexpr (glu) {
                IDec<T>::get(row2, c, lane, w);
                acc2 += q8_dot<T>(w, xq, xd);
            }
        }
        if constexpr (ring) {
            // Every warp is done with the slot: refill it with the block's iteration it + P.
            __syncthreads();
            if (threadIdx.x == 0) issue(it + P, slot);
            if (++slot == P) {
                slot = 0;
                phase ^= 1u;
            }
        }
        acc = warp_sum(acc);
        if constexpr (glu) acc2 = warp_sum(acc2);
        if (S > 1) {
            if (lane == 0) {
                red[warp] = acc;
                if constexpr (glu) red2[warp] = acc2;
            }
            __syncthreads();
            acc = 0.0f;
            acc2 = 0.0f;
            for (int p = 0; p < S; p++) {
                acc += red[rl * S + p];
                if constexpr (glu) acc2 += red2[rl * S + p];
            }
            __syncthreads();  // red is written again by the next row group
        }
        const bool leader = part == 0 && valid;
        if constexpr (epi) {
            mv_epilogue(g, g.seg[sg], ms, rl, leader, lane, acc, pair);
            continue;
        }
        if (leader && lane == 0) {
            float v = acc;
            if constexpr (glu) v = v / (1.0f + expf(-v)) * acc2;
            if (g.res) {
                v += reinterpret_cast<const float*>(g.res + i2 * g.res_nb2 + i3 * g.res_nb3)[m];
            }
            g.out[(i3 * g.ne2 + i2) * g.M + m] = v;
        }
    }
#ifdef FERRY_CUDA_TRACE
    trace_block(g.trace_id, g.M,
                (glu ? 1u : 0u) | (epi ? 2u : 0u) | (g.nx ? 4u : 0u) | (ring ? 8u : 0u) |
                    (static_cast<uint32_t>(T) << 8),
                tr0, tr1, tr2, tr_wait, tr_groups);
#endif
}

#ifdef FERRY_CUDA_TRACE
int trace_next_id() {
    return trace_next_id_tu("");
}
#endif

bool q8_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_Q8");
        return !(v && v[0] == '0');
    }();
    return on;
}

// ---------------------------------------------------------------------------------------------
// Decode, the streaming form (F16, BF16, Q4_0 and Q6_K weights, one column; FERRY_CUDA_MV_STREAM=0
// turns it off, per backend): a grid of at most two blocks per SM whose warps stream their rows
// one piece of 2048 weights after another, D pieces in flight per warp, the first ones issued
// before griddepcontrol.wait (weights never depend on the kernel before). b is put once per
// block into shared memory: as floats for F16/BF16 (stored so that the two float4s a lane
// multiplies with its 8 weights are read by the warp without bank conflicts), quantized to
// int8 in the block-lane form's layout for Q4_0/Q6_K; or computed there, the folded
// [ADD ->] RMS_NORM -> MUL. Measured first (bench/results/cuda.md, stop 25): the float kernel
// read F16 gate/up at 2.4 TB/s and took twice the time of a kernel that only streams the same
// bytes (bench_cuda_floor); its grid runs in waves of short blocks, each a DRAM round trip,
// 1-3 barriers and a reduction, with little in flight between them.
//
// Work items: a row (wo, down, output), a gate/up row pair (glu: silu(a x) * (a2 x)), or rows
// 2i, 2i + 1 of the decode epilogue's segments (rope pairs in one warp; segment ends are
// multiples of kMvWarps). Item i is taken by warp i % W (W warps in the grid). Every row is
// summed the same way, fused or not (each lane adds its pieces in order as the S = 1 forms of
// the kernels above do, then warp_sum), so the fused launches give the bits of the unfused ones.
// Blocks per SM (and the grid). Measured on the H200 (bench/results/cuda.md, stop 26 run D):
// one block per SM, so that a block of the next kernel fits beside it, gave 1B F16 899-908
// t/s against 1,090-1,102 and Q4_0 1,214-1,222 against 1,635-1,659: bytes in flight count
// for more than the overlap.
constexpr int kStreamMinBlocks = 2;
constexpr int64_t kStreamMaxK = 12288;  // F16/BF16: b as floats in at most 48 KiB
// Block formats (the int8 kernels and the streaming form): rows of at most this many elements
// (b's int8 quants and scales in shared memory).
constexpr int64_t kQ8MaxK = 32768;

// One piece (2048 weights of a row) of a lane: its raw words (load) and their products with b
// (dot); kD pieces in flight per warp.
template <Type T>
struct SPiece {  // F16, BF16: chunks 8p .. 8p + 7, the lane's 8 elements of each (16 bytes)
    static constexpr int kD = 2;
    struct Raw {
        uint4 w[8];
    };
    __device__ static void load(const char* row, int64_t p, int lane, int64_t K, Raw& r) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t e = (p * 8 + j) * 256 + 8 * lane;
            r.w[j] = e < K ? __ldg(reinterpret_cast<const uint4*>(row + e * 2))
                           : make_uint4(0u, 0u, 0u, 0u);
        }
    }
    // b's float4 i (elements 4i .. 4i + 3: chunk c, lane l, half h) at c * 64 + h * 32 + l.
    __device__ static void put(void* smem, int64_t i, float4 v, int) {
        const int64_t c = i / 64, rem = i % 64;
        static_cast<float4*>(smem)[c * 64 + (rem % 2) * 32 + rem / 2] = v;
    }
    static size_t smem_bytes(int64_t K) {
        return static_cast<size_t>((K + 255) / 256) * 1024;
    }
    __device__ static float dot(const Raw& r, int64_t p, int lane, int64_t K, const void* smem,
                                float a) {
        const float4* xs = static_cast<const float4*>(smem);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t c = p * 8 + j;
            if (c * 256 + 8 * lane >= K) continue;
            // The float kernel's decoder and mv_chunk's products and order (d = 1).
            Lane8 w;
            Dec<T>::from_raw(Raw8{r.w[j], make_uint4(0u, 0u, 0u, 0u)}, 0, w);
            a = fmaf(1.0f, dot8(w.q, xs[c * 64 + lane], xs[c * 64 + 32 + lane]), a);
        }
        return a;
    }
};

// Q4_0, Q6_K: span p of the block-lane form (BDec), b as its int8 quants (K / 4 words, in
// BDec's swizzled order) then K / 32 float scales.
template <Type T>
struct SBlkPiece {
    // Measured on the H200 (stop 26 run E): 6 and 4 (a few bytes of spills under the
    // 128-register cap) gave 1B Q4_0 1,544-1,551 t/s against 1,665-1,672.
    static constexpr int kD = T == Type::Q4_0 ? 4 : 3;
    using Raw = typename BDec<T>::Raw;
    __device__ static void load(const char* row, int64_t p, int lane, int64_t K, Raw& r) {
        if (BDec<T>::active(K, p, lane)) BDec<T>::load_raw(row, p, lane, r);
    }
    // Called by whole warps (8 consecutive threads quantize a block of 32).
    __device__ static void put(void* smem, int64_t i, float4 v, int64_t K) {
        int32_t* xq = static_cast<int32_t*>(smem);
        q8_quantize4<true, T>(v, i, static_cast<int>(threadIdx.x % 32), xq,
                              reinterpret_cast<float*>(xq + K / 4));
    }
    static size_t smem_bytes(int64_t K) { return static_cast<size_t>(K + K / 8); }
    __device__ static float dot(const Raw& r, int64_t p, int lane, int64_t K, const void* smem,
                                float a) {
        if (!BDec<T>::active(K, p, lane)) return a;
        const int32_t* xq = static_cast<const int32_t*>(smem);
        BlkX x;
        BDec<T>::load_x(xq, reinterpret_cast<const float*>(xq + K / 4), p, lane, x);
        return BDec<T>::dot_raw(r, p, lane, x, a);
    }
};
template <>
struct SPiece<Type::Q4_0> : SBlkPiece<Type::Q4_0> {};
template <>
struct SPiece<Type::Q6_K> : SBlkPiece<Type::Q6_K> {};

// A warp's walk through its work items (the streaming and the bulk form): item it's row r
// (two rows an item for glu and pair), piece p of ppr; item i goes to warp i % W, or, in a
// mirrored launch (HostMirror), warp gw takes runs of kMirrorGroup rows, its k-th run rows
// (k W + gw) G ..., so that each of its line writes holds whole rows in order.
template <bool glu, bool pair>
struct StreamWalk {
    static constexpr int kRows = (glu || pair) ? 2 : 1;  // rows loaded per item
    const MvArgs& g;
    int64_t W, items;
    int ppr;
    bool mirrored;
    __device__ StreamWalk(const MvArgs& ga, int64_t w)
        : g(ga),
          W(w),
          items(pair ? ga.M / 2 : ga.M),
          ppr(static_cast<int>((ga.K + 2047) / 2048)),
          mirrored(!glu && !pair && ga.mirror.buf) {}
    __device__ const char* row(int64_t it, int r) const {
        if constexpr (glu) return (r == 0 ? g.a : g.a2) + it * g.a_nb1;
        if constexpr (pair) {
            int64_t ms;
            const int sg = seg_of(g, 2 * it + r, &ms);
            return g.seg[sg].a + ms * g.a_nb1;
        }
        return g.a + it * g.a_nb1;
    }
    __device__ int64_t first(int64_t gw) const { return mirrored ? gw * kMirrorGroup : gw; }
    __device__ int64_t next_item(int64_t it) const {
        if (!mirrored) return it + W;
        return (it + 1) % kMirrorGroup != 0 ? it + 1 : it + 1 + (W - 1) * kMirrorGroup;
    }
    __device__ void advance(int64_t& it, int& r, int& p) const {
        if (++p == ppr) {
            p = 0;
            if (++r == kRows) {
                r = 0;
                it = next_item(it);
            }
        }
    }
    // Item it is summed (v0, v1: its rows' warp sums, in every lane): its epilogue.
    __device__ void done(int64_t it, float v0, float v1, int lane, uint32_t& stash) const {
        if constexpr (pair) {
            int64_t ms;
            const MvSeg& sg = g.seg[seg_of(g, 2 * it, &ms)];
            const float2 y = sg.rope ? rope_pair(g, ms, v0, v1) : make_float2(v0, v1);
            if (lane < 2) epilogue_store(g, sg, ms + lane, lane == 0 ? y.x : y.y);
        } else {
            float v = v0;
            if constexpr (glu) v = v / (1.0f + expf(-v)) * v1;
            if (g.res) v += reinterpret_cast<const float*>(g.res)[it];
            if (lane == 0) g.out[it] = v;
            if (mirrored) mirror_row(g, it, v, next_item(it) >= items, W, stash);
        }
    }
};

// b into shared memory by P::put: the folded [ADD ->] RMS_NORM -> MUL (g.nx; blocks of
// kMvWarps warps) or g.b's K floats. (The caller's __syncthreads follows.)
template <typename P, bool norm_ok>
__device__ __forceinline__ void stream_put_b(const MvArgs& g, void* smem, float* nred) {
    auto put = [&](int64_t i, float4 v) { P::put(smem, i, v, g.K); };
    if (norm_ok && g.nx) {
        if constexpr (norm_ok) {
            if (g.nfast && norm_fast_ok(g)) {
                NormW nw;
                norm_w_load(g, nw);
                norm_prologue_fast(g, nw, nred, put);
            } else {
                norm_prologue(g, nred, put);
            }
        }
    } else {
        // Up to 8 float4s a thread in one round trip (32 KiB for K = 8192).
        put_b<8>(reinterpret_cast<const float4*>(g.b), g.K / 4, put);
    }
}

// kW warps a block: kMvWarps (two blocks per SM), or 2 * kMvWarps (one block per SM, the same
// warps, so b is loaded and quantized once per SM instead of twice) for Q4_0/Q6_K launches
// without a folded norm (wo, down; the folded norm's bit-exact prologue is built for 256
// threads). Measured on the H200 (bench/results/cuda.md, stop 27 run G, three rounds side by
// side): 1B Q4_0 tg128 1,745-1,760 t/s against 1,633-1,640 (run B's timeline had Q4_0 down's
// prologue, every block loading and quantizing the whole 32 KiB of b, at 3.65 us against 2.14
// of rows); 1B F16, whose b is only copied, 1,078-1,108 against 1,102-1,109, so F16/BF16 keep
// two blocks. FERRY_CUDA_MV_STREAM_WIDE=0 turns it off, =2 takes F16/BF16 too.
template <Type T, bool glu, bool pair, int kW = kMvWarps>
__global__ void __launch_bounds__(32 * kW, kW == kMvWarps ? kStreamMinBlocks : 1)
    k_mv_stream(MvArgs g) {
    using P = SPiece<T>;
    constexpr int D = P::kD;
    constexpr int kRows = StreamWalk<glu, pair>::kRows;
    extern __shared__ __align__(16) float4 sm_b[];
    __shared__ float nred[32];
    void* smem = sm_b;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const StreamWalk<glu, pair> w(g, static_cast<int64_t>(gridDim.x) * kW);
    const int64_t gw = static_cast<int64_t>(blockIdx.x) * kW + warp;
    const int64_t items = w.items;
    const int64_t K = g.K;
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
    uint64_t tr1 = 0, tr2 = 0;
#endif
    pdl_trigger();
    typename P::Raw buf[D];
    // Load cursor: item lit, row lr, piece lp.
    const int64_t first = w.first(gw);
    int64_t lit = first;
    int lr = 0, lp = 0;
#pragma unroll
    for (int s = 0; s < D; s++) {
        if (lit < items) P::load(w.row(lit, lr), lp, lane, K, buf[s]);
        w.advance(lit, lr, lp);
    }
    pdl_wait();
    uint32_t stash = 0;
#ifdef FERRY_CUDA_TRACE
    tr1 = gtime();
#endif
    // (wide blocks are launched without a folded norm)
    stream_put_b<P, kW == kMvWarps>(g, smem, nred);
    __syncthreads();
#ifdef FERRY_CUDA_TRACE
    tr2 = gtime();
#endif
    int64_t cit = first;
    int cr = 0, cp = 0;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
    while (cit < items) {
#pragma unroll
        for (int s = 0; s < D; s++) {
            if (cit >= items) break;
            if constexpr (kRows == 2) {
                if (cr == 0) {
                    acc[0] = P::dot(buf[s], cp, lane, K, smem, acc[0]);
                } else {
                    acc[1] = P::dot(buf[s], cp, lane, K, smem, acc[1]);
                }
            } else {
                acc[0] = P::dot(buf[s], cp, lane, K, smem, acc[0]);
            }
            // The slot's next piece goes out before this item's epilogue.
            if (lit < items) P::load(w.row(lit, lr), lp, lane, K, buf[s]);
            w.advance(lit, lr, lp);
            const int64_t it = cit;
            const bool last = cp + 1 == w.ppr && cr + 1 == kRows;
            w.advance(cit, cr, cp);
            if (!last) continue;
            const float v0 = warp_sum(acc[0]);
            const float v1 = kRows == 2 ? warp_sum(acc[kRows - 1]) : 0.0f;
#pragma unroll
            for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
            w.done(it, v0, v1, lane, stash);
        }
    }
#ifdef FERRY_CUDA_TRACE
    trace_block(g.trace_id, g.M,
                (glu ? 1u : 0u) | (pair ? 2u : 0u) | (g.nx ? 4u : 0u) | 16u |
                    (static_cast<uint32_t>(T) << 8),
                tr0, tr1, tr2, 0, 0);
#endif
}

// The bulk form of the streaming kernel (FERRY_CUDA_MV_BULK=S for F16/BF16 weights, S = 2 in
// two blocks per SM by default; FERRY_CUDA_MV_BULK_Q=S for Q4_0/Q6_K, off by default: see
// OpContext::mv_bulk for the measurements): the pieces in flight sit in shared
// memory instead of registers. Each warp owns S slots of one piece (F16/BF16: 2048 weights,
// 4 KiB; Q4_0/Q6_K: one span of 2048, 1,152 / 1,680 bytes) with an mbarrier each; its lane 0
// fills a slot with one bulk copy (cp.async.bulk, completion counted in bytes) and refills it
// once the warp has read it, so the warps need no buffer registers and no block-wide
// synchronization. The plan behind it (bench/results/cuda.md, stops 22, 26, 27, 29): a block
// holds its bytes in flight with few registers, so that with PDL the next kernels' blocks fit
// on the SM beside it and start their own copies while this one drains and while the
// attention runs (the register form fills the register file with two blocks, and one block
// per SM halved its bytes in flight). b: as in the register form (the folded norm's result,
// or Q4_0/Q6_K's int8 quants, in shared memory), except F16/BF16 without a folded norm, whose
// b is read from global memory through L1 (down's 32 KiB stay out of the block's shared
// memory). Same pieces, same decoders, same order of additions: the register form's bits.
constexpr int kBulkMaxSlots = 16;
constexpr int kBulkMinBlocks = 2;  // (a register cap of 128: two such blocks share an SM)

template <Type T>
struct BulkSlot {  // F16, BF16
    static constexpr int64_t kBytes = 4096;
    static constexpr bool kBGlobal = true;  // b may stay in global memory (bulk_x_global)
    __host__ __device__ static int64_t row_bytes(int64_t K) { return K * 2; }
    // b's elements c * 256 + 8 lane .. + 7: float4s 2 lane, 2 lane + 1 of chunk c in global
    // memory, lane and 32 + lane in SPiece::put's shared layout.
    __device__ static float dot(const char* slot, int64_t p, int lane, int64_t K, const void* xb,
                                bool x_global, float a) {
        const float4* xs = static_cast<const float4*>(xb);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t c = p * 8 + j;
            if (c * 256 + 8 * lane >= K) continue;
            const uint4 raw = *reinterpret_cast<const uint4*>(slot + j * 512 + 16 * lane);
            Lane8 w;
            Dec<T>::from_raw(Raw8{raw, make_uint4(0u, 0u, 0u, 0u)}, 0, w);
            const float4 x0 = x_global ? xs[c * 64 + 2 * lane] : xs[c * 64 + lane];
            const float4 x1 = x_global ? xs[c * 64 + 2 * lane + 1] : xs[c * 64 + 32 + lane];
            a = fmaf(1.0f, dot8(w.q, x0, x1), a);
        }
        return a;
    }
};
template <Type T>
struct BulkBlkSlot {  // Q4_0, Q6_K: a span, read as the register form reads it from memory
    static constexpr int64_t kBytes = BDec<T>::kSpanBytes;
    static constexpr bool kBGlobal = false;
    __host__ __device__ static int64_t row_bytes(int64_t K) {
        return T == Type::Q4_0 ? K / 32 * 18 : K / 256 * 210;
    }
    __device__ static float dot(const char* slot, int64_t p, int lane, int64_t K, const void* xb,
                                bool, float a) {
        if (!BDec<T>::active(K, p, lane)) return a;
        typename BDec<T>::Raw r;
        BDec<T>::load_span(slot, lane, r);
        return SPiece<T>::dot(r, p, lane, K, xb, a);
    }
};
template <>
struct BulkSlot<Type::Q4_0> : BulkBlkSlot<Type::Q4_0> {};
template <>
struct BulkSlot<Type::Q6_K> : BulkBlkSlot<Type::Q6_K> {};

// Dynamic shared memory of a bulk launch: the warps' slots, b (when it is in shared memory),
// the slots' barriers.
template <Type T>
size_t bulk_b_offset(int S) {
    return static_cast<size_t>(kMvWarps) * S * BulkSlot<T>::kBytes;
}
template <Type T>
size_t bulk_bar_offset(int S, int64_t K, bool x_global) {
    const size_t b = x_global ? 0 : SPiece<T>::smem_bytes(K);
    return (bulk_b_offset<T>(S) + b + 15) / 16 * 16;
}
template <Type T>
size_t bulk_smem_bytes(int S, int64_t K, bool x_global) {
    return bulk_bar_offset<T>(S, K, x_global) + static_cast<size_t>(kMvWarps) * S * 8;
}

// F16/BF16 b read from global memory (x_global) instead of shared: only without a folded norm
// (whose b the block computes), and by default only for K <= kBulkXGlobalK: a block's shared
// memory then leaves the SM ~28 KiB of L1 (two bulk blocks take the largest carveout), which
// holds wo's 8 KiB of b but not down's 32 KiB, which every row reads whole
// (FERRY_CUDA_MV_BULK_XGLOBAL=1: any K, to measure).
constexpr int64_t kBulkXGlobalK = 4096;
template <Type T>
bool bulk_x_global(const OpContext& ctx, const MvArgs& g) {
    return BulkSlot<T>::kBGlobal && g.nx == nullptr &&
           (g.K <= kBulkXGlobalK || ctx.mv_bulk_xglobal);
}

// The bulk form's steps as functions, for the chained products (k_mv_chain, below). They are
// k_mv_bulk's own steps, which keeps its inline copy for now: written without a GPU (stop 36),
// k_mv_bulk on these functions compiled to other sm_90 code for its GLU and row-pair forms,
// which no run has measured yet (k_mv_bulk_fn below; bench/runs/stop36-b.sh measures it).
// One warp's slots: S slots of B::kBytes with an mbarrier each, and the parity each
// completes next (bit s), carried from product to product in a chain.
struct BulkWarp {
    char* slots;
    uint64_t* bars;
    int S;
    uint32_t phase;
    int64_t row_bytes;  // of the product at hand (BulkSlot<T>::row_bytes)
};

// Lane 0 starts the copy of (item it, row r, piece p) of walk w into slot s.
template <Type T, bool glu, bool pair>
__device__ __forceinline__ void bulk_issue(const StreamWalk<glu, pair>& w, const BulkWarp& bw,
                                           int s, int64_t it, int r, int p) {
    using B = BulkSlot<T>;
    const int64_t o = static_cast<int64_t>(p) * B::kBytes;
    const uint32_t bytes = static_cast<uint32_t>(min(B::kBytes, bw.row_bytes - o));
    mbar_expect(&bw.bars[s], bytes);
    bulk_to_smem(bw.slots + static_cast<size_t>(s) * B::kBytes, w.row(it, r) + o, bytes,
                 &bw.bars[s]);
}

// The load cursor of a warp's items (item lit, row lr, piece lp): bulk_first issues the
// first S pieces from item `first` into slots 0 .. S - 1 and leaves the cursor past them.
struct BulkCursor {
    int64_t lit;
    int lr, lp;
};
template <Type T, bool glu, bool pair>
__device__ __forceinline__ BulkCursor bulk_first(const StreamWalk<glu, pair>& w, const BulkWarp& bw,
                                                 int64_t first, int lane) {
    BulkCursor c{first, 0, 0};
    for (int s = 0; s < bw.S; s++) {
        if (c.lit < w.items && lane == 0) bulk_issue<T>(w, bw, s, c.lit, c.lr, c.lp);
        w.advance(c.lit, c.lr, c.lp);
    }
    return c;
}

// Sums the warp's items of walk w from `first` (bulk_first has issued their first S pieces;
// b at xb, in global memory when x_global) and runs their epilogues, each slot refilled once
// the warp has read it. Every copy issued is waited for: the slots are idle at the end.
template <Type T, bool glu, bool pair>
__device__ __forceinline__ void bulk_rows(const StreamWalk<glu, pair>& w, BulkWarp& bw,
                                          BulkCursor c, int64_t first, int64_t K, const void* xb,
                                          bool x_global, int lane) {
    using B = BulkSlot<T>;
    constexpr int kRows = StreamWalk<glu, pair>::kRows;
    const int64_t items = w.items;
    uint32_t stash = 0;
    int64_t cit = first;
    int cr = 0, cp = 0, s = 0;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
    while (cit < items) {
        mbar_wait(&bw.bars[s], (bw.phase >> s) & 1u);
        bw.phase ^= 1u << s;
        const char* slot = bw.slots + static_cast<size_t>(s) * B::kBytes;
        if constexpr (kRows == 2) {
            if (cr == 0) {
                acc[0] = B::dot(slot, cp, lane, K, xb, x_global, acc[0]);
            } else {
                acc[1] = B::dot(slot, cp, lane, K, xb, x_global, acc[1]);
            }
        } else {
            acc[0] = B::dot(slot, cp, lane, K, xb, x_global, acc[0]);
        }
        // Every lane has read the slot: its next piece goes out before this item's epilogue.
        __syncwarp();
        if (c.lit < items && lane == 0) {
            fence_proxy_async();
            bulk_issue<T>(w, bw, s, c.lit, c.lr, c.lp);
        }
        w.advance(c.lit, c.lr, c.lp);
        if (++s == bw.S) s = 0;
        const int64_t it = cit;
        const bool last = cp + 1 == w.ppr && cr + 1 == kRows;
        w.advance(cit, cr, cp);
        if (!last) continue;
        const float v0 = warp_sum(acc[0]);
        const float v1 = kRows == 2 ? warp_sum(acc[kRows - 1]) : 0.0f;
#pragma unroll
        for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
        w.done(it, v0, v1, lane, stash);
    }
}

// k_mv_bulk's offsets (b_off, bar_off: bulk_b_offset, bulk_bar_offset) and x_global
// (bulk_x_global) come from the launch.
template <Type T, bool glu, bool pair>
__global__ void __launch_bounds__(32 * kMvWarps, kBulkMinBlocks)
    k_mv_bulk(MvArgs g, int S, uint32_t b_off, uint32_t bar_off, bool x_global) {
    using P = SPiece<T>;
    using B = BulkSlot<T>;
    constexpr int kRows = StreamWalk<glu, pair>::kRows;
    extern __shared__ __align__(16) char bulk_sm[];
    __shared__ float nred[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const StreamWalk<glu, pair> w(g, static_cast<int64_t>(gridDim.x) * kMvWarps);
    const int64_t gw = static_cast<int64_t>(blockIdx.x) * kMvWarps + warp;
    const int64_t items = w.items, K = g.K, row_bytes = B::row_bytes(K);
    char* slots = bulk_sm + static_cast<size_t>(warp) * S * B::kBytes;
    void* smem_b = bulk_sm + b_off;
    uint64_t* bars = reinterpret_cast<uint64_t*>(bulk_sm + bar_off) + warp * S;
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
    uint64_t tr1 = 0, tr2 = 0;
#endif
    pdl_trigger();
    if (lane == 0) {
        for (int s = 0; s < S; s++) mbar_init(&bars[s], 1);
        mbar_init_fence();
    }
    __syncwarp();
    // Lane 0 starts the copy of (item it, row r, piece p) into slot s.
    auto issue = [&](int s, int64_t it, int r, int p) {
        const int64_t o = static_cast<int64_t>(p) * B::kBytes;
        const uint32_t bytes = static_cast<uint32_t>(min(B::kBytes, row_bytes - o));
        mbar_expect(&bars[s], bytes);
        bulk_to_smem(slots + static_cast<size_t>(s) * B::kBytes, w.row(it, r) + o, bytes, &bars[s]);
    };
    // Load cursor: item lit, row lr, piece lp (S pieces ahead of the sums).
    const int64_t first = w.first(gw);
    int64_t lit = first;
    int lr = 0, lp = 0;
    for (int s = 0; s < S; s++) {
        if (lit < items && lane == 0) issue(s, lit, lr, lp);
        w.advance(lit, lr, lp);
    }
    pdl_wait();
#ifdef FERRY_CUDA_TRACE
    tr1 = gtime();
#endif
    if (!x_global) {
        stream_put_b<P, true>(g, smem_b, nred);
        __syncthreads();
    }
    const void* xb = x_global ? static_cast<const void*>(g.b) : smem_b;
#ifdef FERRY_CUDA_TRACE
    tr2 = gtime();
#endif
    uint32_t stash = 0, phase = 0;  // phase bit s: the parity slot s completes next
    int64_t cit = first;
    int cr = 0, cp = 0, s = 0;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
    while (cit < items) {
        mbar_wait(&bars[s], (phase >> s) & 1u);
        phase ^= 1u << s;
        const char* slot = slots + static_cast<size_t>(s) * B::kBytes;
        if constexpr (kRows == 2) {
            if (cr == 0) {
                acc[0] = B::dot(slot, cp, lane, K, xb, x_global, acc[0]);
            } else {
                acc[1] = B::dot(slot, cp, lane, K, xb, x_global, acc[1]);
            }
        } else {
            acc[0] = B::dot(slot, cp, lane, K, xb, x_global, acc[0]);
        }
        // Every lane has read the slot: its next piece goes out before this item's epilogue.
        __syncwarp();
        if (lit < items && lane == 0) {
            fence_proxy_async();
            issue(s, lit, lr, lp);
        }
        w.advance(lit, lr, lp);
        if (++s == S) s = 0;
        const int64_t it = cit;
        const bool last = cp + 1 == w.ppr && cr + 1 == kRows;
        w.advance(cit, cr, cp);
        if (!last) continue;
        const float v0 = warp_sum(acc[0]);
        const float v1 = kRows == 2 ? warp_sum(acc[kRows - 1]) : 0.0f;
#pragma unroll
        for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
        w.done(it, v0, v1, lane, stash);
    }
#ifdef FERRY_CUDA_TRACE
    trace_block(g.trace_id, g.M,
                (glu ? 1u : 0u) | (pair ? 2u : 0u) | (g.nx ? 4u : 0u) | 16u | 128u |
                    (static_cast<uint32_t>(T) << 8),
                tr0, tr1, tr2, 0, 0);
#endif
}

// k_mv_bulk on the functions above (FERRY_CUDA_MV_BULK_FN=1, to measure against the inline
// copy; the same steps in the same order, so the same bits).
template <Type T, bool glu, bool pair>
__global__ void __launch_bounds__(32 * kMvWarps, kBulkMinBlocks)
    k_mv_bulk_fn(MvArgs g, int S, uint32_t b_off, uint32_t bar_off, bool x_global) {
    using P = SPiece<T>;
    using B = BulkSlot<T>;
    extern __shared__ __align__(16) char bulk_sm[];
    __shared__ float nred[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const StreamWalk<glu, pair> w(g, static_cast<int64_t>(gridDim.x) * kMvWarps);
    const int64_t K = g.K;
    BulkWarp bw{bulk_sm + static_cast<size_t>(warp) * S * B::kBytes,
                reinterpret_cast<uint64_t*>(bulk_sm + bar_off) + warp * S, S, 0u, B::row_bytes(K)};
    void* smem_b = bulk_sm + b_off;
    pdl_trigger();
    if (lane == 0) {
        for (int s = 0; s < S; s++) mbar_init(&bw.bars[s], 1);
        mbar_init_fence();
    }
    __syncwarp();
    const int64_t first = w.first(static_cast<int64_t>(blockIdx.x) * kMvWarps + warp);
    const BulkCursor c = bulk_first<T>(w, bw, first, lane);
    pdl_wait();
    if (!x_global) {
        stream_put_b<P, true>(g, smem_b, nred);
        __syncthreads();
    }
    bulk_rows<T>(w, bw, c, first, K, x_global ? static_cast<const void*>(g.b) : smem_b, x_global,
                 lane);
}

// Chained products (k_mv_chain; FERRY_CUDA_CHAIN=1 when the backend is made, off by default:
// written in stop 36 without a GPU). A decode layer's products run one after another (wo,
// gate/up, down, the next layer's q/k/v), each a launch of k_mv_bulk (F16/BF16) or k_mv_stream
// (Q4_0/Q6_K, the register form), and each boundary
// costs the tail of one kernel (its last pieces arriving while fewer and fewer warps load),
// the start of the next and its prologue (bench/results/cuda.md, stop 27's timeline: about
// 4-5 us a product beyond its bytes at the H200's bandwidth). In a chain the same warps, in
// one launch of every block that fits the GPU at once (two per SM), run the products as
// stages: a warp that has issued the last copy of its rows of stage i issues its first S
// pieces of stage i + 1 (the register form: loads its first D pieces into registers;
// weights: constants of the graph) and waits at a grid barrier for
// every block to finish stage i; then b (stage i's result, or the folded norm of it) and
// the rows of stage i + 1. The copies of the next product stream while the last rows of this
// one are summed and while the barrier waits. Same walks, pieces and additions as k_mv_bulk
// and k_mv_stream: the bits of the unchained launches (Q4_0/Q6_K's wo and down included,
// which unchained run one 16-warp block an SM: a row's sum does not depend on its warp).

// The forms a chain takes at each position (bit f: form f, ChainArgs::form): a decode layer's
// products from wo on, wo (+ residual), gate/up (folded norm, SwiGLU), down (+ residual), then
// the next layer's q/k/v (folded norm, rope, KV store) or the output product (folded norm).
constexpr int kChainForms[4] = {1, 2, 1, 1 | 4};
static_assert(kMaxChain == 4, "kChainForms has a mask for each position");

#ifdef FERRY_CUDA_TRACE
// A chain stage's trace record kind: the plain launch's bits, with bit 24 for the chain.
template <Type T>
__device__ __forceinline__ uint32_t chain_trace_kind(bool glu, bool pair, const MvArgs& g,
                                                     uint32_t form) {
    return (glu ? 1u : 0u) | (pair ? 2u : 0u) | (g.nx ? 4u : 0u) | 16u | form |
           (static_cast<uint32_t>(T) << 8) | (1u << 24);
}
#endif

struct ChainArgs {
    MvArgs g[kMaxChain];
    int form[kMaxChain];  // 0 plain, 1 gate/up (glu), 2 row pairs with epilogue segments
    int n, S;             // S: the bulk form's slots a warp (0: the register form)
    uint32_t b_off, bar_off;
    bool x_global0;  // stage 0's b read from global memory (bulk_x_global)
    uint32_t* ctr;   // kChainCtrWords words (arrivals at 0, exits at 32), zero between launches
};
static_assert(sizeof(ChainArgs) <= 4096, "a kernel's parameters take at most 4 KiB");

// Every block of the grid has arrived here `k` times (this block's k-th arrival included):
// the block's writes before it are visible to every block after it (release and acquire at
// GPU scope by thread 0, bar.sync on each side for the other threads).
__device__ __forceinline__ void chain_barrier(uint32_t* arrivals, uint32_t k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(arrivals) : "memory");
        const uint32_t target = k * gridDim.x;
        uint32_t seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                         : "=r"(seen)
                         : "l"(arrivals)
                         : "memory");
        } while (seen < target);
        __threadfence();
    }
    __syncthreads();
}

// Stage i of the chain (a constant index: its arguments are read where the kernel's
// parameters are, as k_mv_bulk reads its own).
template <Type T, bool glu, bool pair, int i>
__device__ __forceinline__ void chain_stage(const ChainArgs& c, BulkWarp& bw, void* smem_b,
                                            float* nred, int lane) {
    using P = SPiece<T>;
    const MvArgs& g = c.g[i];
    const StreamWalk<glu, pair> w(g, static_cast<int64_t>(gridDim.x) * kMvWarps);
    const int64_t first = w.first(static_cast<int64_t>(blockIdx.x) * kMvWarps + threadIdx.x / 32);
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
#endif
    bw.row_bytes = BulkSlot<T>::row_bytes(g.K);
    if constexpr (i > 0) {
        // The slots' last reads (generic proxy) before the bulk copies (async proxy) into them.
        __syncwarp();
        if (lane == 0) fence_proxy_async();
    }
    const BulkCursor cur = bulk_first<T>(w, bw, first, lane);
    if constexpr (i == 0) {
        pdl_wait();
    } else {
        chain_barrier(c.ctr, static_cast<uint32_t>(i));
        // Every block is on an SM now: the next kernel may take the room they leave.
        if constexpr (i == 1) pdl_trigger();
    }
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr1 = gtime();
#endif
    const bool xg = i == 0 && c.x_global0;
    if (!xg) {
        stream_put_b<P, true>(g, smem_b, nred);
        __syncthreads();
    }
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr2 = gtime();
#endif
    bulk_rows<T>(w, bw, cur, first, g.K, xg ? static_cast<const void*>(g.b) : smem_b, xg, lane);
#ifdef FERRY_CUDA_TRACE
    trace_block(g.trace_id, g.M, chain_trace_kind<T>(glu, pair, g, 128u), tr0, tr1, tr2, 0, 0);
#endif
}

// Stage i in the register form (k_mv_stream's steps, the pieces in flight in registers: the
// chain of Q4_0/Q6_K products, and of F16/BF16 with FERRY_CUDA_MV_BULK=0). The first D pieces
// of the stage go out before the barrier, as k_mv_stream's go out before its wait. A call,
// not inlined: inlined, the stages of one kernel spilled 1.1-1.8 KB under the 128-register
// cap; as calls, each stage's own spills are 16-44 bytes for Q4_0 and 124-204 for F16/BF16
// and Q6_K (ptxas, sm_90; k_mv_stream's F16 uses all 128 registers without). Its loop is
// k_mv_stream's, a copy kept apart (as bulk_rows is k_mv_bulk's) until a GPU run shows that
// sharing one function leaves k_mv_stream's speed alone: k_mv_stream on a shared loop
// compiled to other sm_90 code in all 12 of its forms (3 of them 128 bytes longer).
template <Type T, bool glu, bool pair, int i>
__device__ __noinline__ void chain_stage_reg(const ChainArgs& c, void* smem, float* nred,
                                             int lane) {
    using P = SPiece<T>;
    constexpr int D = P::kD;
    constexpr int kRows = StreamWalk<glu, pair>::kRows;
    const MvArgs& g = c.g[i];
    const StreamWalk<glu, pair> w(g, static_cast<int64_t>(gridDim.x) * kMvWarps);
    const int64_t first = w.first(static_cast<int64_t>(blockIdx.x) * kMvWarps + threadIdx.x / 32);
    const int64_t items = w.items, K = g.K;
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr0 = gtime();
#endif
    typename P::Raw buf[D];
    int64_t lit = first;
    int lr = 0, lp = 0;
#pragma unroll
    for (int s = 0; s < D; s++) {
        if (lit < items) P::load(w.row(lit, lr), lp, lane, K, buf[s]);
        w.advance(lit, lr, lp);
    }
    if constexpr (i == 0) {
        pdl_wait();
    } else {
        chain_barrier(c.ctr, static_cast<uint32_t>(i));
        if constexpr (i == 1) pdl_trigger();
    }
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr1 = gtime();
#endif
    stream_put_b<P, true>(g, smem, nred);
    __syncthreads();
#ifdef FERRY_CUDA_TRACE
    const uint64_t tr2 = gtime();
#endif
    uint32_t stash = 0;
    int64_t cit = first;
    int cr = 0, cp = 0;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
    while (cit < items) {
#pragma unroll
        for (int s = 0; s < D; s++) {
            if (cit >= items) break;
            if constexpr (kRows == 2) {
                if (cr == 0) {
                    acc[0] = P::dot(buf[s], cp, lane, K, smem, acc[0]);
                } else {
                    acc[1] = P::dot(buf[s], cp, lane, K, smem, acc[1]);
                }
            } else {
                acc[0] = P::dot(buf[s], cp, lane, K, smem, acc[0]);
            }
            if (lit < items) P::load(w.row(lit, lr), lp, lane, K, buf[s]);
            w.advance(lit, lr, lp);
            const int64_t it = cit;
            const bool last = cp + 1 == w.ppr && cr + 1 == kRows;
            w.advance(cit, cr, cp);
            if (!last) continue;
            const float v0 = warp_sum(acc[0]);
            const float v1 = kRows == 2 ? warp_sum(acc[kRows - 1]) : 0.0f;
#pragma unroll
            for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
            w.done(it, v0, v1, lane, stash);
        }
    }
#ifdef FERRY_CUDA_TRACE
    trace_block(g.trace_id, g.M, chain_trace_kind<T>(glu, pair, g, 0u), tr0, tr1, tr2, 0, 0);
#endif
}

// Stage i in form f (ChainArgs::form), bulk or register.
template <Type T, bool reg, bool glu, bool pair, int i>
__device__ __forceinline__ void chain_run_stage(const ChainArgs& c, BulkWarp& bw, void* smem_b,
                                                float* nred, int lane) {
    if constexpr (reg) {
        chain_stage_reg<T, glu, pair, i>(c, smem_b, nred, lane);
    } else {
        chain_stage<T, glu, pair, i>(c, bw, smem_b, nred, lane);
    }
}

// Stages i .. c.n - 1, each in its form: only the forms kChainForms allows at each position
// are compiled (every form at every position took 128 registers and spilled 144 bytes).
template <Type T, bool reg, int i>
__device__ __forceinline__ void chain_stages(const ChainArgs& c, BulkWarp& bw, void* smem_b,
                                             float* nred, int lane) {
    if constexpr (i < kMaxChain) {
        if (i >= c.n) return;
        constexpr int allowed = kChainForms[i];
        if (c.form[i] == 1) {
            if constexpr ((allowed & 2) != 0) {
                chain_run_stage<T, reg, true, false, i>(c, bw, smem_b, nred, lane);
            }
        } else if (c.form[i] == 2) {
            if constexpr ((allowed & 4) != 0) {
                chain_run_stage<T, reg, false, true, i>(c, bw, smem_b, nred, lane);
            }
        } else {
            if constexpr ((allowed & 1) != 0) {
                chain_run_stage<T, reg, false, false, i>(c, bw, smem_b, nred, lane);
            }
        }
        chain_stages<T, reg, i + 1>(c, bw, smem_b, nred, lane);
    }
}

// reg: the register form (no slots: c.S, c.bar_off unused, b at c.b_off = 0).
template <Type T, bool reg>
__global__ void __launch_bounds__(32 * kMvWarps, kBulkMinBlocks)
    k_mv_chain(const __grid_constant__ ChainArgs c) {
    using B = BulkSlot<T>;
    static_assert(kBulkMinBlocks == kStreamMinBlocks, "both forms: two blocks an SM");
    extern __shared__ __align__(16) char bulk_sm[];
    __shared__ float nred[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    BulkWarp bw{bulk_sm + static_cast<size_t>(warp) * c.S * B::kBytes,
                reinterpret_cast<uint64_t*>(bulk_sm + c.bar_off) + warp * c.S, c.S, 0u, 0};
    void* smem_b = bulk_sm + c.b_off;
    if (!reg && lane == 0) {
        for (int s = 0; s < c.S; s++) mbar_init(&bw.bars[s], 1);
        mbar_init_fence();
    }
    __syncwarp();
    chain_stages<T, reg, 0>(c, bw, smem_b, nred, lane);
    // The last block out (every block past every barrier) zeroes the counters for the next
    // launch.
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(c.ctr + 32, 1u) == gridDim.x - 1) {
        c.ctr[0] = 0u;
        c.ctr[32] = 0u;
    }
}

// A plain streaming launch of `warps` warps (one column of one matrix: stream_ok) takes the
// backend's host mirror (OpContext::mirror, set only for a progressive product's launch) when
// the rows fit and come in at most kMirrorSteps steps, and says so (OpContext::mirror_taken,
// mirror_step_rows).
void keep_mirror(const OpContext& ctx, MvArgs& g, int64_t warps) {
    const int64_t step = warps * kMirrorGroup;
    if (!ctx.mirror.buf ||
        (g.M + kMirrorGroup - 1) / kMirrorGroup * kMirrorGroup > ctx.mirror.stride ||
        (g.M + step - 1) / step > kMirrorSteps) {
        return;
    }
    g.mirror = ctx.mirror;
    ctx.mirror_taken = true;
    ctx.mirror_step_rows = step;
}

// The streaming form takes this product: F16/BF16 (K % 8 == 0, 16-byte rows, b in 48 KiB) or
// Q4_0/Q6_K (K % 256 == 0, 4-byte rows) weights, one column of one matrix, a2's and every
// segment's rows aligned alike, b 16-byte aligned.
bool stream_ok(const MvArgs& g, Type t, bool glu) {
    if (g.N != 1 || g.ne2 != 1 || g.ne3 != 1 || !aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3}) ||
        (g.n_seg > 0 && g.M % 2 != 0)) {
        return false;
    }
    if (t == Type::F16 || t == Type::BF16) {
        return g.K % 8 == 0 && g.K <= kStreamMaxK && rows_aligned(g, glu, g.n_seg > 0, 16);
    }
    if (t == Type::Q4_0 || t == Type::Q6_K) {
        return g.K % 256 == 0 && g.K <= kQ8MaxK && rows_aligned(g, glu, g.n_seg > 0, 4);
    }
    return false;
}

// b's 48 KiB for K = kStreamMaxK F16/BF16 weights and the kernel's static shared memory are
// over the 48 KiB a launch gets without asking: each kernel of the streaming form may take
// this much dynamic shared memory (set once per device and weight type).
constexpr size_t kStreamSmem = kStreamMaxK * 4 + 1024;

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

template <Type T>
void allow_stream_smem() {
    static std::atomic<uint64_t> done{0};
    allow_dyn_smem<void (*)(MvArgs)>(
        {k_mv_stream<T, true, false>, k_mv_stream<T, false, true>, k_mv_stream<T, false, false>,
         k_mv_stream<T, false, false, 2 * kMvWarps>},
        kStreamSmem, done);
}

// The bulk form's launch (S slots a warp, at most ctx.mv_bulk_blocks blocks per SM); false
// when it does not take the product (then the register form): its shared memory would not fit
// a block, or its copies would not be 16-byte aligned (every row and piece must be).
template <Type T>
bool launch_bulk_t(const OpContext& ctx, MvArgs& g, bool glu, int S) {
    constexpr size_t kMaxSmem = 227 * 1024 - 256;  // (the H200's block limit; nred beside)
    using B = BulkSlot<T>;
    S = std::min(S, kBulkMaxSlots);
    const bool pair = g.n_seg > 0, x_global = bulk_x_global<T>(ctx, g);
    // One block per SM: fewer slots where b would leave no room for the next kernel's block
    // beside it (each block also takes 1 KiB of the SM's 228; FERRY_CUDA_MV_BULK_FIT=0 keeps
    // S): with S = 3, F16 down (b's 32 KiB) takes 2.
    constexpr size_t kHalfSm = 113 * 1024 - 256;
    while (ctx.mv_bulk_fit && ctx.mv_bulk_blocks <= 1 && S > 1 &&
           bulk_smem_bytes<T>(S, g.K, x_global) > kHalfSm) {
        S--;
    }
    const size_t smem = bulk_smem_bytes<T>(S, g.K, x_global);
    if (smem > kMaxSmem || B::row_bytes(g.K) % 16 != 0 || !rows_aligned(g, glu, pair, 16)) {
        return false;
    }
    // The SM's largest shared-memory carveout (228 KiB, ~28 KiB of L1) whenever a bulk block
    // runs: with a smaller one picked for a single block (e.g. 132 KiB), the next kernel's
    // block could not join it until the SM drained and was configured anew.
    static std::atomic<uint64_t> done{0};
    allow_dyn_smem<void (*)(MvArgs, int, uint32_t, uint32_t, bool)>(
        {k_mv_bulk<T, true, false>, k_mv_bulk<T, false, true>, k_mv_bulk<T, false, false>,
         k_mv_bulk_fn<T, true, false>, k_mv_bulk_fn<T, false, true>, k_mv_bulk_fn<T, false, false>},
        kMaxSmem, done, /*max_carveout=*/true);
    const bool fn = ctx.mv_bulk_fn;
    const int64_t items = pair ? g.M / 2 : g.M;
    const unsigned blocks =
        std::min(n_blocks(items, kMvWarps),
                 static_cast<unsigned>(ctx.n_sm * std::max(1, ctx.mv_bulk_blocks)));
    const dim3 grid(blocks), block(32 * kMvWarps);
    const auto b_off = static_cast<uint32_t>(bulk_b_offset<T>(S));
    const auto bar_off = static_cast<uint32_t>(bulk_bar_offset<T>(S, g.K, x_global));
    if (glu) {
        launch_pdl(fn ? k_mv_bulk_fn<T, true, false> : k_mv_bulk<T, true, false>, grid, block, smem,
                   ctx.stream, g, S, b_off, bar_off, x_global);
    } else if (pair) {
        launch_pdl(fn ? k_mv_bulk_fn<T, false, true> : k_mv_bulk<T, false, true>, grid, block, smem,
                   ctx.stream, g, S, b_off, bar_off, x_global);
    } else {
        keep_mirror(ctx, g, static_cast<int64_t>(blocks) * kMvWarps);
        launch_pdl(fn ? k_mv_bulk_fn<T, false, false> : k_mv_bulk<T, false, false>, grid, block,
                   smem, ctx.stream, g, S, b_off, bar_off, x_global);
    }
    return true;
}

template <Type T>
void launch_stream_t(const OpContext& ctx, MvArgs g, bool glu) {
    const int bulk = T == Type::F16 || T == Type::BF16 ? ctx.mv_bulk : ctx.mv_bulk_q;
    if (bulk > 0 && launch_bulk_t<T>(ctx, g, glu, bulk)) return;
    allow_stream_smem<T>();
    const bool pair = g.n_seg > 0;
    const int64_t items = pair ? g.M / 2 : g.M;
    const size_t smem = SPiece<T>::smem_bytes(g.K);
    const bool block_format = T == Type::Q4_0 || T == Type::Q6_K;
    if (ctx.mv_stream_wide > (block_format ? 0 : 1) && !glu && !pair && !g.nx) {
        constexpr int kW = 2 * kMvWarps;
        const unsigned blocks = std::min(n_blocks(items, kW), static_cast<unsigned>(ctx.n_sm));
        keep_mirror(ctx, g, static_cast<int64_t>(blocks) * kW);
        launch_pdl(k_mv_stream<T, false, false, kW>, dim3(blocks), dim3(32 * kW), smem, ctx.stream,
                   g);
        return;
    }
    const unsigned blocks =
        std::min(n_blocks(items, kMvWarps), static_cast<unsigned>(ctx.n_sm * kStreamMinBlocks));
    const dim3 grid(blocks), block(32 * kMvWarps);
    if (glu) {
        launch_pdl(k_mv_stream<T, true, false>, grid, block, smem, ctx.stream, g);
    } else if (pair) {
        launch_pdl(k_mv_stream<T, false, true>, grid, block, smem, ctx.stream, g);
    } else {
        keep_mirror(ctx, g, static_cast<int64_t>(blocks) * kMvWarps);
        launch_pdl(k_mv_stream<T, false, false>, grid, block, smem, ctx.stream, g);
    }
}

}  // namespace

// The products a chain collects (OpContext::chain): launch_stream appends each instead of
// launching it.
struct MvChain {
    MvArgs g[kMaxChain];
    bool glu[kMaxChain];
    Type t[kMaxChain];
    int n = 0;
    bool refused = false;  // a product took (or would take) another kernel: nothing more joins
};

void MvChainDeleter::operator()(MvChain* c) const {
    delete c;
}
std::unique_ptr<MvChain, MvChainDeleter> make_mv_chain() {
    return std::unique_ptr<MvChain, MvChainDeleter>(new MvChain());
}
void mv_chain_reset(MvChain* c) {
    c->n = 0;
    c->refused = false;
}
int mv_chain_stages(const MvChain* c) {
    return c->n;
}

namespace {

// Whether a chain of type-t products runs in the register form (else the bulk form); -1:
// no chain for t. F16/BF16 follow mv_bulk; Q4_0/Q6_K take the register form (their bulk
// form, slower on the H200, has no chain).
int chain_reg(const OpContext& ctx, Type t) {
    if (t == Type::F16 || t == Type::BF16) return ctx.mv_bulk > 0 ? 0 : 1;
    if (t == Type::Q4_0 || t == Type::Q6_K) return ctx.mv_bulk_q > 0 ? -1 : 1;
    return -1;
}

// A product that a chain collects instead of launching, or refuses (nothing runs either way).
void chain_collect(const OpContext& ctx, const MvArgs& g, Type t, bool glu) {
    MvChain* c = ctx.chain;
    if (c->refused || c->n == kMaxChain || chain_reg(ctx, t) < 0 || g.mirror.buf ||
        (c->n > 0 && c->t[0] != t)) {
        c->refused = true;
        return;
    }
    c->g[c->n] = g;
    c->glu[c->n] = glu;
    c->t[c->n] = t;
    c->n++;
}

// Refuses the chain for a product that takes any kernel but the streaming form's.
Status chain_refuse(const OpContext& ctx) {
    ctx.chain->refused = true;
    return Status::ok();
}

// Launches the longest prefix (at most `most` products) that the chain takes, if of two or
// more products; returns its length (0: nothing ran).
template <Type T, bool reg>
int launch_chain_t(const OpContext& ctx, const MvChain& mc, int most) {
    constexpr size_t kMaxSmem = 227 * 1024 - 256;
    using B = BulkSlot<T>;
    ChainArgs c{};
    c.S = reg ? 0 : std::min(ctx.mv_bulk, kBulkMaxSlots);
    c.x_global0 = !reg && bulk_x_global<T>(ctx, mc.g[0]);
    size_t b_bytes = 0;
    int n = 0;
    for (; n < most; n++) {
        const MvArgs& g = mc.g[n];
        const bool pair = g.n_seg > 0;
        const int form = mc.glu[n] ? 1 : (pair ? 2 : 0);
        if ((kChainForms[n] & (1 << form)) == 0) break;
        if (!reg && (B::row_bytes(g.K) % 16 != 0 || !rows_aligned(g, mc.glu[n], pair, 16))) break;
        const size_t nb = n > 0 || !c.x_global0 ? SPiece<T>::smem_bytes(g.K) : 0;
        c.g[n] = g;
        c.form[n] = form;
        b_bytes = std::max(b_bytes, nb);
    }
    if (n < 2) return 0;
    c.n = n;
    c.b_off = reg ? 0u : static_cast<uint32_t>(bulk_b_offset<T>(c.S));
    c.bar_off = static_cast<uint32_t>((c.b_off + b_bytes + 15) / 16 * 16);
    const size_t smem = c.bar_off + static_cast<size_t>(kMvWarps) * c.S * 8;
    if (smem > kMaxSmem) return 0;
    static std::atomic<uint64_t> done{0};
    allow_dyn_smem<void (*)(ChainArgs)>({k_mv_chain<T, reg>}, kMaxSmem, done,
                                        /*max_carveout=*/!reg);
    // Every block on an SM at once, or the barrier would wait for blocks that cannot start.
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_mv_chain<T, reg>, 32 * kMvWarps,
                                                      smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    per_sm = std::min(per_sm, kBulkMinBlocks);
    if (per_sm < 1) return 0;
    c.ctr = ctx.chain_ctr;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(ctx.n_sm * per_sm));
    cfg.blockDim = dim3(32 * kMvWarps);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx.stream;
    // Cooperative: the driver places every block at once (FERRY_CUDA_CHAIN_COOP=0, or a
    // device without cooperative launches: a plain launch of the blocks that fit).
    int coop = 0;
    if (cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, ctx.device) != cudaSuccess) {
        cudaGetLastError();
        coop = 0;
    }
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
    attr[1].id = cudaLaunchAttributeCooperative;
    attr[1].val.cooperative = ctx.chain_coop && coop ? 1 : 0;
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    cudaLaunchKernelEx(&cfg, k_mv_chain<T, reg>, c);  // (an error: launch_mv_chain reports it)
    return n;
}

template <Type T>
int launch_chain_form(const OpContext& ctx, const MvChain& mc, int most) {
    return chain_reg(ctx, T) == 1 ? launch_chain_t<T, true>(ctx, mc, most)
                                  : launch_chain_t<T, false>(ctx, mc, most);
}

std::atomic<uint64_t> g_chain_launches{0}, g_chained_products{0};

}  // namespace

uint64_t chain_launches() {
    return g_chain_launches.load(std::memory_order_relaxed);
}
uint64_t chained_products() {
    return g_chained_products.load(std::memory_order_relaxed);
}

Status launch_mv_chain(OpContext& ctx, const MvChain& c, int most, int* taken) {
    *taken = 0;
    most = std::min(most, c.n);
    if (most < 2 || !ctx.chain_ctr) return Status::ok();
    switch (c.t[0]) {
        case Type::F16:
            *taken = launch_chain_form<Type::F16>(ctx, c, most);
            break;
        case Type::BF16:
            *taken = launch_chain_form<Type::BF16>(ctx, c, most);
            break;
        case Type::Q4_0:
            *taken = launch_chain_t<Type::Q4_0, true>(ctx, c, most);
            break;
        case Type::Q6_K:
            *taken = launch_chain_t<Type::Q6_K, true>(ctx, c, most);
            break;
        default:
            return Status::ok();
    }
    if (*taken == 0) return Status::ok();
    g_chain_launches.fetch_add(1, std::memory_order_relaxed);
    g_chained_products.fetch_add(static_cast<uint64_t>(*taken), std::memory_order_relaxed);
    return launch_status("MUL_MAT chain (stream)");
}

namespace {

Status launch_stream(const OpContext& ctx, const MvArgs& g0, Type t, bool glu) {
    MvArgs g = g0;
    g.err = ctx.err;
    g.nfast = ctx.mv_nfast;
#ifdef FERRY_CUDA_TRACE
    g.trace_id = trace_next_id();
#endif
    if (ctx.chain) {
        chain_collect(ctx, g, t, glu);
        return Status::ok();
    }
    switch (t) {
        case Type::F16:
            launch_stream_t<Type::F16>(ctx, g, glu);
            break;
        case Type::BF16:
            launch_stream_t<Type::BF16>(ctx, g, glu);
            break;
        case Type::Q4_0:
            launch_stream_t<Type::Q4_0>(ctx, g, glu);
            break;
        case Type::Q6_K:
            launch_stream_t<Type::Q6_K>(ctx, g, glu);
            break;
        default:
            return Status::errorf("CUDA: streaming MUL_MAT weight type %s", type_name(t));
    }
    return launch_status(glu ? "MUL_MAT+MUL_MAT+SWIGLU (stream)" : "MUL_MAT (stream)");
}

// The dp4a path takes single-column products of block-format weights whose rows are whole
// 256-element chunks, with b's column 16-byte aligned; FERRY_CUDA_MV_Q8=0 turns it off.
bool q8_vec_ok(const MvArgs& g, Type t) {
    return q8_mode() && is_block_type(t) && g.N == 1 && g.K % 256 == 0 && g.K <= kQ8MaxK &&
           aligned16(g.b, {g.b_nb2, g.b_nb3});
}

// On unless FERRY_CUDA_MV_WIDE=0: measured on the H200 (bench/results/cuda.md, 1B Q4_0
// tg128, same run) 935 t/s with it against 896 without (its kernels spill a few bytes of
// registers under the 64-register cap, and gain anyway).
bool q8_wide_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_WIDE");
        return !(v && v[0] == '0');
    }();
    return on;
}

// FERRY_CUDA_MV_SPLIT: 0 no split-K; 1 the row-count rule below (measured on the H200,
// bench/results/cuda.md, 1B Q4_0 tg128: 798 t/s with it against 814 without, when b's
// quantization took one round trip per 1 KiB); unset: the row-length rule (long rows only).
int q8_split_mode() {
    static const int mode = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_SPLIT");
        return v && v[0] == '0' ? 0 : (v && v[0] == '1' ? 1 : 2);
    }();
    return mode;
}

// Warps per row of the int8 kernel. Default (mode 2): two warps per row when a row holds at
// least 4 * U chunks (the down projection's K = 8192: two round trips of U chunks per warp
// instead of four, and twice the blocks); it depends only on K and M, so a product computes
// the same sums alone and in a fused launch (the epilogue launch keeps S = 1). Mode 1: doubled
// while the grid holds fewer than two waves of warps and every warp keeps at least one whole
// group of U chunks. A block's rows come in groups of kQ8Warps / S, which must divide M (and,
// for the rope epilogue, hold row pairs).
int q8_split(int64_t M, int64_t n_chunks, int U, int n_sm, bool epi) {
    const int mode = q8_split_mode();
    if (mode == 0) return 1;
    if (mode == 2) {
        return !epi && n_chunks >= 32 && M % (kQ8Warps / 2) == 0 ? 2 : 1;
    }
    const int64_t target = 2 * static_cast<int64_t>(n_sm) * kQ8MinBlocks * kQ8Warps;
    const int max_s = epi ? kQ8Warps / 2 : kQ8Warps;
    int s = 1;
    while (2 * s <= max_s && M * s < target && n_chunks >= 2 * s * U &&
           M % (kQ8Warps / (2 * s)) == 0) {
        s *= 2;
    }
    return s;
}

// How a ring launch streams its rows: P stage slots of `stage` bytes (one row group of R rows,
// both matrices for GLU) after b_bytes of the kernel's own shared memory, `smem` bytes in
// all, per_sm blocks per SM. P = 0: the register form instead. Bulk copies need 16-byte
// aligned sources and sizes: rows contiguous (a_nb1 == a row's bytes), a multiple of 16 bytes
// long, every matrix (and epilogue segment) 16-byte aligned.
struct RingPlan {
    int P = 0;
    int per_sm = 0;
    int64_t stage = 0;
    size_t smem = 0;
};

RingPlan plan_ring(const MvArgs& g, int R, bool glu, bool segs, size_t b_bytes) {
    RingPlan r;
    if (g.a_nb1 != g.a_row_bytes || !rows_aligned(g, glu, segs, 16)) return r;
    const int64_t stage = static_cast<int64_t>(R) * g.a_nb1 * (glu ? 2 : 1);
    const size_t b = (b_bytes + 127) / 128 * 128;
    static const size_t budget2 = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_RING_KB");
        const long kb = v ? std::strtol(v, nullptr, 10) : 0;
        return kb > 0 && static_cast<size_t>(kb) * 1024 <= kRingSmem2Max
                   ? static_cast<size_t>(kb) * 1024
                   : kRingSmem2;
    }();
    for (int per_sm : {2, 1}) {
        const size_t budget = per_sm == 2 ? budget2 : kRingSmem1;
        if (b >= budget) continue;
        const int64_t p = static_cast<int64_t>(budget - b) / stage;
        if (p < 2) continue;
        r.P = static_cast<int>(std::min<int64_t>(p, kRingMaxStages));
        r.per_sm = per_sm;
        r.stage = stage;
        r.smem = b + static_cast<size_t>(r.P) * static_cast<size_t>(stage);
        return r;
    }
    return r;
}

template <Type T, bool glu, bool epi, bool blk>
void launch_q8_form(const OpContext& ctx, const MvArgs& g0, unsigned mats) {
    MvArgs g = g0;
    g.nfast = ctx.mv_nfast;
    const int n_sm = ctx.n_sm;
    cudaStream_t st = ctx.stream;
#ifdef FERRY_CUDA_TRACE
    g.trace_id = trace_next_id();
#endif
    const size_t smem = static_cast<size_t>(g.K) + static_cast<size_t>(g.K) / 8;
    const bool wide = q8_wide_mode();
    const int U = wide ? (glu ? 4 : 8) : (glu ? 2 : 4);
    const int S = q8_split(g.M, g.K / 256, U, n_sm, epi);
    const int R = kQ8Warps / S;
    const RingPlan rp = wide && ctx.mv_ring ? plan_ring(g, R, glu, epi, smem) : RingPlan{};
    if (rp.P > 0) {
        const unsigned cap = static_cast<unsigned>(n_sm * rp.per_sm);
        const unsigned blocks = std::min(n_blocks(g.M, R), std::max(1u, cap / mats));
        auto k = k_mul_mat_vec_q8<T, glu, epi, true, true, blk>;
        static std::atomic<uint64_t> smem_set{0};
        allow_dyn_smem({k}, kRingSmem1, smem_set);
        launch_pdl(k, dim3(blocks, mats, 1), dim3(32 * kQ8Warps), rp.smem, st, g, S, rp.P,
                   rp.stage);
        return;
    }
    const unsigned cap = static_cast<unsigned>(n_sm) * kQ8MinBlocks;
    const unsigned blocks = std::min(n_blocks(g.M, R), std::max(1u, cap / mats));
    if (wide) {
        launch_pdl(k_mul_mat_vec_q8<T, glu, epi, true, false, blk>, dim3(blocks, mats, 1),
                   dim3(32 * kQ8Warps), smem, st, g, S, 0, int64_t{0});
    } else {
        launch_pdl(k_mul_mat_vec_q8<T, glu, epi, false, false, blk>, dim3(blocks, mats, 1),
                   dim3(32 * kQ8Warps), smem, st, g, S, 0, int64_t{0});
    }
}

template <Type T, bool glu, bool epi>
void launch_q8(const OpContext& ctx, const MvArgs& g, unsigned mats) {
    if constexpr (kHasBlk<T>) {
        // The block-lane form reads whole words of the rows.
        if (ctx.mv_blk && rows_aligned(g, glu, epi, 4)) {
            launch_q8_form<T, glu, epi, true>(ctx, g, mats);
            return;
        }
    }
    launch_q8_form<T, glu, epi, false>(ctx, g, mats);
}

template <bool glu, bool epi = false>
Status dispatch_q8(OpContext& ctx, const MvArgs& g, Type t) {
    const unsigned mats = static_cast<unsigned>(g.ne2 * g.ne3);
    switch (t) {
        case Type::Q4_0:
            launch_q8<Type::Q4_0, glu, epi>(ctx, g, mats);
            break;
        case Type::Q4_1:
            launch_q8<Type::Q4_1, glu, epi>(ctx, g, mats);
            break;
        case Type::Q8_0:
            launch_q8<Type::Q8_0, glu, epi>(ctx, g, mats);
            break;
        case Type::Q4_K:
            launch_q8<Type::Q4_K, glu, epi>(ctx, g, mats);
            break;
        case Type::Q5_K:
            launch_q8<Type::Q5_K, glu, epi>(ctx, g, mats);
            break;
        case Type::Q6_K:
            launch_q8<Type::Q6_K, glu, epi>(ctx, g, mats);
            break;
        default:
            return Status::errorf("CUDA: MUL_MAT weight type %s", type_name(t));
    }
    return launch_status(glu   ? "MUL_MAT+MUL_MAT+SWIGLU (q8)"
                         : epi ? "MUL_MAT+ROPE/SET_ROWS (q8)"
                               : "MUL_MAT (vec q8)");
}

Status launch_mat_vec(OpContext& ctx, const Tensor* dst, MvArgs g) {
    const Type t = dst->src[0]->type;
    const dim3 grid(n_blocks(g.M, kRowsPerBlock), static_cast<unsigned>(g.ne2 * g.ne3), 1);
    const bool fast = fast_vec_ok(g, t) && aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3});
    if (fast && ctx.mv_stream && stream_ok(g, t, false)) return launch_stream(ctx, g, t, false);
    if (ctx.chain) return chain_refuse(ctx);
    if (!fast) {
        k_mul_mat_generic<<<dim3(grid.x, grid.y, static_cast<unsigned>(g.N < 32 ? g.N : 32)),
                            32 * kRowsPerBlock, 0, ctx.stream>>>(g, t);
        return launch_status("MUL_MAT (generic)");
    }
    if (q8_vec_ok(g, t)) return dispatch_q8<false>(ctx, g, t);
    return dispatch_vec<false>(ctx, g, t, grid, choose_split(g.M, g.K, ctx.n_sm));
}

// ---------------------------------------------------------------------------------------------
// Prefill through cuBLAS

// Converts rows of F32 (any row strides) into a contiguous [K, N] matrix of F16 or BF16.
__global__ void k_to_half(const char* b, int64_t nb1, int64_t K, int64_t N, uint16_t* out,
                          bool bf16) {
    const int64_t n = K * N;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t k = i % K, c = i / K;
        const float v = reinterpret_cast<const float*>(b + c * nb1)[k];
        out[i] = bf16 ? f2bf(v) : f2h(v);
    }
}

// k_to_half for rows of whole float4s (K % 4 == 0, b and nb1 16-byte aligned): one 16-byte
// load and one 8-byte store per 4 elements.
__global__ void k_to_half4(const char* b, int64_t nb1, int64_t K, int64_t N, uint16_t* out,
                           bool bf16) {
    const int64_t k4 = K / 4, n = k4 * N;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t c = i / k4, k = i % k4;
        const float4 v = reinterpret_cast<const float4*>(b + c * nb1)[k];
        const uint32_t lo = bf16 ? f2bf(v.x) | (static_cast<uint32_t>(f2bf(v.y)) << 16)
                                 : f2h(v.x) | (static_cast<uint32_t>(f2h(v.y)) << 16);
        const uint32_t hi = bf16 ? f2bf(v.z) | (static_cast<uint32_t>(f2bf(v.w)) << 16)
                                 : f2h(v.z) | (static_cast<uint32_t>(f2h(v.w)) << 16);
        reinterpret_cast<uint2*>(out)[i] = make_uint2(lo, hi);
    }
}

// Dequantizes rows of a block format (rows at stride nb1) into a contiguous F16 [K, M].
template <Type T>
__global__ void k_dequant_f16(const char* a, int64_t nb1, int64_t K, int64_t M, uint16_t* out) {
    const int64_t n_chunks = (K + 255) / 256;
    const int64_t n = M * n_chunks;
    const int lane = threadIdx.x % 32;
    for (int64_t wi = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; wi < n;
         wi += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
        const int64_t m = wi / n_chunks, c = wi % n_chunks;
        Lane8 w;
        if (!Dec<T>::get(a + m * nb1, K, c, lane, w)) continue;
        // Each lane's two runs of 4 weights as two 8-byte stores (K % 4 == 0: aligned).
        uint16_t* o = out + m * K;
        uint32_t h[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            h[k] = static_cast<uint32_t>(f2h(fmaf(w.d, w.q[2 * k], w.m))) |
                   (static_cast<uint32_t>(f2h(fmaf(w.d, w.q[2 * k + 1], w.m))) << 16);
        }
        *reinterpret_cast<uint2*>(o + w.o0) = make_uint2(h[0], h[1]);
        *reinterpret_cast<uint2*>(o + w.o1) = make_uint2(h[2], h[3]);
    }
}

// a's rows as F16 (row stride K) for cuBLAS: every quantized type the float kernel decodes.
Status dequant_f16(Type t, unsigned blocks, cudaStream_t st, const char* am, int64_t nb1, int64_t K,
                   int64_t M, uint16_t* ah) {
    switch (t) {
#define FERRY_DEQ(T)                                                       \
    case Type::T:                                                          \
        k_dequant_f16<Type::T><<<blocks, 256, 0, st>>>(am, nb1, K, M, ah); \
        return Status::ok();
        FERRY_DEQ(Q4_0)
        FERRY_DEQ(Q4_1)
        FERRY_DEQ(Q8_0)
        FERRY_DEQ(Q4_K)
        FERRY_DEQ(Q5_K)
        FERRY_DEQ(Q6_K)
        FERRY_DEQ(Q5_0)
        FERRY_DEQ(Q5_1)
        FERRY_DEQ(Q2_K)
        FERRY_DEQ(Q3_K)
        FERRY_DEQ(IQ4_NL)
        FERRY_DEQ(IQ4_XS)
        FERRY_DEQ(MXFP4)
#undef FERRY_DEQ
        default:
            return Status::errorf("CUDA: MUL_MAT weight type %s", type_name(t));
    }
}

Status cublas_status(const CublasApi* api, cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
    return Status::errorf("CUDA: MUL_MAT: %s failed: %s", what, api->status_string(s));
}

size_t round_up(size_t v) {
    return (v + 255) / 256 * 256;
}

Status launch_gemm(OpContext& ctx, const Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    cublasHandle_t h = static_cast<cublasHandle_t>(ctx.cublas);
    const CublasApi* api = ctx.cublas_api;
    if (!h || !api) return Status::error("CUDA: MUL_MAT: no cuBLAS handle");
    FERRY_TRY(cublas_status(api, api->set_stream(h, ctx.stream), "cublasSetStream"));
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    float* out = reinterpret_cast<float*>(device_ptr(dst));
    const float one = 1.0f, zero = 0.0f;
    const Type t = a->type;
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            const char* am = device_ptr(a) + (i2 / r2) * a->nb[2] + (i3 / r3) * a->nb[3];
            const char* bm = device_ptr(b) + i2 * b->nb[2] + i3 * b->nb[3];
            float* om = out + (i3 * b->ne[2] + i2) * M * N;
            if (t == Type::F32) {
                FERRY_TRY(
                    cublas_status(api, api->set_math_mode(h, CUBLAS_PEDANTIC_MATH), "math mode"));
                FERRY_TRY(cublas_status(
                    api,
                    api->sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(M),
                               static_cast<int>(N), static_cast<int>(K), &one,
                               reinterpret_cast<const float*>(am), static_cast<int>(a->nb[1] / 4),
                               reinterpret_cast<const float*>(bm), static_cast<int>(b->nb[1] / 4),
                               &zero, om, static_cast<int>(M)),
                    "cublasSgemm"));
                continue;
            }
            FERRY_TRY(cublas_status(api, api->set_math_mode(h, CUBLAS_DEFAULT_MATH), "math mode"));
            const bool bf16 = t == Type::BF16;
            uint16_t* bh = reinterpret_cast<uint16_t*>(ctx.scratch.ptr);
            const int64_t bnb1 = static_cast<int64_t>(b->nb[1]);
            if (K % 4 == 0 && bnb1 % 16 == 0 && reinterpret_cast<uintptr_t>(bm) % 16 == 0) {
                k_to_half4<<<std::min(n_blocks(K / 4 * N, 256), 8192u), 256, 0, ctx.stream>>>(
                    bm, bnb1, K, N, bh, bf16);
            } else {
                k_to_half<<<std::min(n_blocks(K * N, 256), 8192u), 256, 0, ctx.stream>>>(
                    bm, bnb1, K, N, bh, bf16);
            }
            FERRY_TRY(launch_status("MUL_MAT (convert b)"));
            const void* aw = am;
            int64_t lda = static_cast<int64_t>(a->nb[1] / 2);
            if (is_block_type(t) || elem_type(t)) {
                uint16_t* ah = bh + round_up(static_cast<size_t>(K * N) * 2) / 2;
                const unsigned blocks = n_blocks(M * ((K + 255) / 256) * 32, 256) > 16384
                                            ? 16384
                                            : n_blocks(M * ((K + 255) / 256) * 32, 256);
                const int64_t nb1 = static_cast<int64_t>(a->nb[1]);
                FERRY_TRY(dequant_f16(t, blocks, ctx.stream, am, nb1, K, M, ah));
                FERRY_TRY(launch_status("MUL_MAT (dequantize)"));
                aw = ah;
                lda = K;
            }
            const cudaDataType_t dt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
            FERRY_TRY(cublas_status(
                api,
                api->gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(M), static_cast<int>(N),
                             static_cast<int>(K), &one, aw, dt, static_cast<int>(lda), bh, dt,
                             static_cast<int>(K), &zero, om, CUDA_R_32F, static_cast<int>(M),
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx"));
        }
    }
    return Status::ok();
}

// Whether the element-read formats (ops.h elem_type) take cuBLAS past kMaxVecCols columns,
// dequantized to F16 by the float kernel's decoders (k_dequant_f16): FERRY_CUDA_ELEM_GEMM=1.
// Off by default until a GPU has run it: written in stop 36 without one; stop 35 measured
// pp512 43.7-50.7k t/s on 1B models with an earlier form (bench/results/cuda.md).
bool elem_gemm() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_ELEM_GEMM");
        return v && v[0] == '1';
    }();
    return on;
}

// cuBLAS takes over when b has more columns than the vector kernel handles and the layout
// suits it (element strides of whole elements; int-sized dimensions).
bool use_gemm(const Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    // F32 weights: SGEMM (true fp32) past one column group; measured closer to the oracle on
    // the f32 model than the vector kernel's column groups.
    if (b->ne[1] <= (a->type == Type::F32 ? kMaxCols : kMaxVecCols)) return false;
    if (a->ne[0] % 8 != 0) return false;
    if (a->ne[0] > INT32_MAX || a->ne[1] > INT32_MAX || b->ne[1] > INT32_MAX) return false;
    if (b->nb[1] % 4 != 0) return false;
    // The element-read formats: the float kernel's column groups at any width, unless
    // elem_gemm() asks for cuBLAS.
    if (elem_type(a->type)) return elem_gemm();
    if (!is_block_type(a->type) && a->nb[1] % type_size(a->type) != 0) return false;
    return true;
}

}  // namespace

bool pdl_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_PDL");
        return !(v && v[0] == '0');
    }();
    return on;
}

bool needs_cublas(const Tensor* node) {
    return node->op == Op::MUL_MAT && use_gemm(node);
}

size_t mul_mat_scratch_size(const Tensor* node) {
    if (!use_gemm(node)) return 0;
    const Tensor* a = node->src[0];
    const Tensor* b = node->src[1];
    if (a->type == Type::F32) return 0;
    size_t s = round_up(static_cast<size_t>(b->ne[0] * b->ne[1]) * 2);
    if (is_block_type(a->type) || elem_type(a->type))
        s += round_up(static_cast<size_t>(a->ne[0] * a->ne[1]) * 2);
    return s;
}

Status op_mul_mat(OpContext& ctx, const Tensor* dst) {
    if (dst->nelements() == 0) return Status::ok();
    if (use_gemm(dst)) return launch_gemm(ctx, dst);
    return launch_mat_vec(ctx, dst, make_args(dst, nullptr));
}

bool can_fuse_mul_mat_add(const Tensor* mm, const Tensor* add) {
    if (mm->op != Op::MUL_MAT || add->op != Op::ADD || add->src[0] != mm) return false;
    const Tensor* r = add->src[1];
    if (r == mm || !same_shape(r, mm) || r->nb[0] != sizeof(float)) return false;
    return !use_gemm(mm);
}

Status op_mul_mat_add(OpContext& ctx, const Tensor* mm, const Tensor* add) {
    if (add->nelements() == 0) return Status::ok();
    MvArgs g = make_args(mm, add);
    const Tensor* r = add->src[1];
    g.res = device_ptr(r);
    g.res_nb1 = static_cast<int64_t>(r->nb[1]);
    g.res_nb2 = static_cast<int64_t>(r->nb[2]);
    g.res_nb3 = static_cast<int64_t>(r->nb[3]);
    return launch_mat_vec(ctx, mm, g);
}

bool can_fuse_swiglu(const Tensor* gate, const Tensor* up, const Tensor* glu) {
    if (glu->op != Op::SWIGLU || glu->src[0] != gate || glu->src[1] != up) return false;
    if (gate->op != Op::MUL_MAT || up->op != Op::MUL_MAT || gate == up) return false;
    const Tensor* ga = gate->src[0];
    const Tensor* ua = up->src[0];
    if (gate->src[1] != up->src[1] || ga->type != ua->type || !same_shape(ga, ua)) return false;
    for (int d = 0; d < kMaxDims; d++) {
        if (ga->nb[d] != ua->nb[d]) return false;
    }
    if (use_gemm(gate) || gate->src[1]->ne[1] != 1) return false;  // decode: one column
    MvArgs g = make_args(gate, nullptr);
    return fast_vec_ok(g, ga->type) && aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3});
}

bool can_fuse_mul_mat_epilogue(const Tensor* mm, const Tensor* rope, const Tensor* set_rows) {
    if (mm->op != Op::MUL_MAT || (!rope && !set_rows) || use_gemm(mm)) return false;
    const Tensor* b = mm->src[1];
    if (b->ne[1] != 1 || b->ne[2] != 1 || b->ne[3] != 1) return false;  // decode: one column
    if (mm->src[0]->ne[2] != 1 || mm->src[0]->ne[3] != 1) return false;
    MvArgs g = make_args(mm, nullptr);
    if (!fast_vec_ok(g, mm->src[0]->type) || !aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3}) ||
        !(q8_vec_ok(g, mm->src[0]->type) || vec_fused_ok(g, mm->src[0]->type)) ||
        g.M % kQ8Warps != 0 || g.M % kMvWarps != 0 || !mm->is_contiguous()) {
        return false;
    }
    const Tensor* last = mm;  // the tensor set_rows stores
    if (rope) {
        const Tensor* x = rope->src[0];
        const Tensor* ff = rope->src[2];
        const int n_dims = rope->op_params[0];
        if (rope->op != Op::ROPE || x->storage() != mm || device_ptr(x) != device_ptr(mm) ||
            !x->is_contiguous() || !rope->is_contiguous() || rope->type != Type::F32 ||
            rope->op_params[1] != kRopeNormal || rope->nelements() != g.M || rope->ne[2] != 1 ||
            rope->ne[3] != 1 || rope->ne[0] % 2 != 0 || n_dims % 2 != 0 || n_dims > rope->ne[0] ||
            rope->src[1]->type != Type::I32 || rope->src[1]->ne[0] < 1 ||
            (ff && (ff->type != Type::F32 || ff->ne[0] < n_dims / 2))) {
            return false;
        }
        last = rope;
    }
    if (set_rows) {
        const Tensor* d = set_rows->src[0];
        const Tensor* s = set_rows->src[1];
        const Tensor* idx = set_rows->src[2];
        if (set_rows->op != Op::SET_ROWS || s->storage() != last ||
            device_ptr(s) != device_ptr(last) || !s->is_contiguous() || s->ne[0] != g.M ||
            s->ne[1] != 1 || s->ne[2] != 1 || s->ne[3] != 1 || idx->type != Type::I32 ||
            idx->ne[0] != 1 || d->ne[0] != g.M || d->ne[2] != 1 || d->ne[3] != 1 ||
            (d->type != Type::F32 && d->type != Type::F16 && d->type != Type::BF16) ||
            d->nb[0] != type_size(d->type)) {
            return false;
        }
    }
    return true;
}

bool can_join_mul_mat_epilogues(const EpilogueUnit& a, const EpilogueUnit& b) {
    const Tensor* ma = a.mm;
    const Tensor* mb = b.mm;
    if (ma->src[1] != mb->src[1] || ma->src[0]->type != mb->src[0]->type ||
        ma->src[0]->ne[0] != mb->src[0]->ne[0] || ma->src[0]->nb[1] != mb->src[0]->nb[1]) {
        return false;
    }
    if (!a.rope || !b.rope) return true;
    const Tensor* ra = a.rope;
    const Tensor* rb = b.rope;
    for (int p = 0; p < 4; p++) {
        if (ra->op_params[p] != rb->op_params[p]) return false;
    }
    return ra->src[1] == rb->src[1] && ra->src[2] == rb->src[2] && ra->ne[0] == rb->ne[0];
}

namespace {

// FERRY_CUDA_MV_FNORM=2: the float kernel's folded norm without the early weight loads.
bool fnorm_early_mode() {
    static const bool on = [] {
        const char* v = std::getenv("FERRY_CUDA_MV_FNORM");
        return !(v && v[0] == '2');
    }();
    return on;
}

// A row of K F32 elements, contiguous and 16-byte aligned.
bool f32_row(const Tensor* t, int64_t K) {
    return t->type == Type::F32 && t->ne[0] == K && t->nrows() == 1 && t->is_contiguous() &&
           aligned16(device_ptr(t), {});
}

void set_norm(MvArgs& g, const NormPrologue* p) {
    if (!p || !p->norm) return;
    const Tensor* x = p->add ? p->add->src[0] : p->norm->src[0];
    g.nx = reinterpret_cast<const float*>(device_ptr(x));
    g.nadd = p->add ? reinterpret_cast<const float*>(device_ptr(p->add->src[1])) : nullptr;
    g.nsum = p->add ? reinterpret_cast<float*>(device_ptr(p->add)) : nullptr;
    g.nw = reinterpret_cast<const float*>(device_ptr(p->mul->src[1]));
    g.neps = p->norm->param_f(0);
    g.norm_threads = norm_threads(g.K);
    g.early = fnorm_early_mode();
}

}  // namespace

bool can_fold_norm(const NormPrologue& p, const Tensor* mm, bool float_kernel, bool stream) {
    const Tensor* mul = p.mul;
    const Tensor* norm = p.norm;
    if (!mul || !norm || mm->op != Op::MUL_MAT || mm->src[1] != mul || use_gemm(mm)) return false;
    if (norm->op != Op::RMS_NORM || mul->op != Op::MUL || mul->src[0] != norm) return false;
    const int64_t K = mul->ne[0];
    const Tensor* x = norm->src[0];
    if (!f32_row(mul, K) || !f32_row(x, K) || !f32_row(mul->src[1], K)) return false;
    if (p.add && (p.add != x || p.add->op != Op::ADD || !f32_row(p.add->src[0], K) ||
                  !f32_row(p.add->src[1], K))) {
        return false;
    }
    if (norm_threads(K) > 4 * 32 * kQ8Warps) return false;
    MvArgs g = make_args(mm, nullptr);
    if (g.K != K || g.ne2 != 1 || g.ne3 != 1) return false;
    // The float kernel keeps b in (at most 48 KiB of) shared memory.
    return q8_vec_ok(g, mm->src[0]->type) || (stream && stream_ok(g, mm->src[0]->type, false)) ||
           (float_kernel && vec_fused_ok(g, mm->src[0]->type) && K * 4 <= 48 * 1024);
}

bool mirror_product_ok(const OpContext& ctx, const Tensor* mm, bool folded_norm) {
    if (mm->op != Op::MUL_MAT || use_gemm(mm)) return false;
    const MvArgs g = make_args(mm, nullptr);
    const Type t = mm->src[0]->type;
    if (!folded_norm && (!fast_vec_ok(g, t) || !aligned16(g.b, {g.b_nb1, g.b_nb2, g.b_nb3}))) {
        return false;  // launch_mat_vec's generic kernel
    }
    return ctx.mv_stream && stream_ok(g, t, false);  // (one column of one matrix)
}

Status op_mul_mat_norm(OpContext& ctx, const Tensor* mm, const NormPrologue& p) {
    MvArgs g = make_args(mm, nullptr);
    set_norm(g, &p);
    const Type t = mm->src[0]->type;
    if (ctx.mv_stream && stream_ok(g, t, false)) return launch_stream(ctx, g, t, false);
    if (ctx.chain) return chain_refuse(ctx);
    if (q8_vec_ok(g, t)) return dispatch_q8<false>(ctx, g, t);
    if (vec_fused_ok(g, t)) return dispatch_vec_fused<false>(ctx, g, t, g.M);
    return Status::error("CUDA: folded RMS_NORM without the int8 or the fused float kernel");
}

Status op_mul_mat_epilogue(OpContext& ctx, const EpilogueUnit* units, int n_units,
                           const NormPrologue* pro) {
    if (n_units < 1 || n_units > kMaxSeg) {
        return Status::errorf("CUDA: MUL_MAT epilogue of %d products", n_units);
    }
    MvArgs g = make_args(units[0].mm, nullptr);
    const Type t = units[0].mm->src[0]->type;
    g.err = ctx.err;
    g.n_seg = n_units;
    int64_t rows = 0;
    for (int u = 0; u < n_units; u++) {
        const EpilogueUnit& e = units[u];
        MvSeg& sg = g.seg[u];
        rows += e.mm->src[0]->ne[1];
        sg.a = device_ptr(e.mm->src[0]);
        sg.end = rows;
        sg.out = reinterpret_cast<float*>(device_ptr(e.rope ? e.rope : e.mm));
        sg.write_out = e.write_out;
        sg.rope = e.rope != nullptr;
        if (e.rope) {
            const Tensor* ff = e.rope->src[2];
            g.rope_pos = reinterpret_cast<const int32_t*>(device_ptr(e.rope->src[1]));
            g.rope_ff = ff ? device_ptr(ff) : nullptr;
            g.rope_ff_nb0 = ff ? static_cast<int64_t>(ff->nb[0]) : 0;
            g.rope_dims = e.rope->op_params[0];
            g.rope_head = static_cast<int>(e.rope->ne[0]);
            g.rope_base = static_cast<double>(e.rope->param_f(2));
            g.rope_fscale = static_cast<double>(e.rope->param_f(3));
        }
        if (e.set_rows) {
            const Tensor* d = e.set_rows->src[0];
            sg.kv = device_ptr(d);
            sg.kv_nb1 = static_cast<int64_t>(d->nb[1]);
            sg.kv_rows = d->ne[1];
            sg.kv_idx = reinterpret_cast<const int32_t*>(device_ptr(e.set_rows->src[2]));
            sg.kv_type = d->type;
        }
    }
    g.M = rows;
    set_norm(g, pro);
    // The streaming form takes every unit in one launch (a row is summed alike whatever the
    // matrix's size).
    if (ctx.mv_stream && stream_ok(g, t, false)) return launch_stream(ctx, g, t, false);
    if (ctx.chain) return chain_refuse(ctx);
    if (q8_vec_ok(g, t)) return dispatch_q8<false, true>(ctx, g, t);
    // The float kernel: one launch for the units whose products split their rows alike (each
    // adds its parts as its unfused launch would), one after another otherwise.
    if (!vec_fused_ok(g, t)) return Status::error("CUDA: MUL_MAT epilogue: no fused kernel");
    const int s0 = choose_split(units[0].mm->src[0]->ne[1], g.K, ctx.n_sm);
    int n = 1;
    while (n < n_units && choose_split(units[n].mm->src[0]->ne[1], g.K, ctx.n_sm) == s0) n++;
    if (n < n_units) {
        FERRY_TRY(op_mul_mat_epilogue(ctx, units, n, pro));
        return op_mul_mat_epilogue(ctx, units + n, n_units - n, pro);
    }
    return dispatch_vec_fused<false>(ctx, g, t, units[0].mm->src[0]->ne[1]);
}

Status op_mul_mat_swiglu(OpContext& ctx, const Tensor* gate, const Tensor* up, const Tensor* glu,
                         const NormPrologue* pro) {
    if (glu->nelements() == 0) return Status::ok();
    MvArgs g = make_args(gate, glu);
    g.a2 = device_ptr(up->src[0]);
    if (ctx.mv_stream && stream_ok(g, gate->src[0]->type, true)) {
        set_norm(g, pro);
        return launch_stream(ctx, g, gate->src[0]->type, true);
    }
    if (ctx.chain) return chain_refuse(ctx);
    if (q8_vec_ok(g, gate->src[0]->type)) {
        set_norm(g, pro);
        return dispatch_q8<true>(ctx, g, gate->src[0]->type);
    }
    if (pro && pro->norm) {
        if (!vec_fused_ok(g, gate->src[0]->type)) {
            return Status::error(
                "CUDA: folded RMS_NORM without the int8 or the fused float kernel");
        }
        set_norm(g, pro);
        return dispatch_vec_fused<true>(ctx, g, gate->src[0]->type, g.M);
    }
    const dim3 grid(1, static_cast<unsigned>(g.ne2 * g.ne3), 1);
    return dispatch_vec<true>(ctx, g, gate->src[0]->type, grid, choose_split(g.M, g.K, ctx.n_sm));
}

}  // namespace ferry::cuda
