// The persistent decode step's device primitives (persist.cu), shared with the prototype it
// came from (bench/bench_cuda_persist.cu): mbarriers, bulk copies into shared memory with an L2
// policy, activations as tagged 64-bit words (a value's float bits low, the tag of the phase
// and launch that stored it high, stored and read whole), and a warp's dot product of its
// 1024 F16 weights of a 16 KiB tile. Plain CUDA (C++17), sm_90.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace ferry::cuda::psync {

using Word = unsigned long long;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ bool mbar_try(uint64_t* b, unsigned parity) {
    uint32_t ok;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
    return ok != 0;
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ uint64_t evict_first() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* b,
                                          uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
        "[%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(b)), "l"(policy)
        : "memory");
}
__device__ __forceinline__ Word ld_word(const Word* p) {
    Word v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ void ld_words2(const Word* p, Word& a, Word& b) {
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p));
}
__device__ __forceinline__ void st_word(Word* p, float v, unsigned tag) {
    const Word w = static_cast<Word>(tag) << 32 | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned tag_word(Word w) {
    return static_cast<unsigned>(w >> 32);
}
__device__ __forceinline__ float val_word(Word w) {
    return __uint_as_float(static_cast<unsigned>(w));
}
// A warp's dot product of its 1024 weights of a tile with v: 4 chains.
__device__ __forceinline__ float tile_dot(const unsigned char* stage, int e0, int lane,
                                          const float (&v)[32]) {
    const uint4* src = reinterpret_cast<const uint4*>(stage + e0 * 2);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 w = src[j * 32 + lane];
        const __half2* h2 = reinterpret_cast<const __half2*>(&w);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const float2 f = __half22float2(h2[c]);
            acc[j] = fmaf(f.x, v[8 * j + 2 * c], acc[j]);
            acc[j] = fmaf(f.y, v[8 * j + 2 * c + 1], acc[j]);
        }
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace ferry::cuda::psync
