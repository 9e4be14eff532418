// Timeline of the decode kernels (compile with -DFERRY_CUDA_TRACE; off in every normal
// build): each block of a traced kernel appends one record with %globaltimer at its start,
// after griddepcontrol.wait, after its inputs are in shared memory and at its end (and, for
// the int8 products, the cycles thread 0 spent waiting on the ring). Every translation unit
// that includes this keeps its own ring (internal linkage: the kernels are compiled whole per
// file) and dumps it at exit to FERRY_CUDA_TRACE_OUT (default /tmp/ferry-trace.bin) with its
// suffix appended (mv-stream.cu: none; mv-int8.cu: ".q8"; attention.cu: ".attn"); launches are
// numbered across all of them (trace_next_id). bench/tools/trace-timeline.py reads the files.
#pragma once

#ifdef FERRY_CUDA_TRACE
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ferry::cuda {

struct TraceRec {
    uint64_t t0, t1, t2, t3;
    uint64_t wait_cyc;
    uint32_t id, block, smid, groups, M, kind;
};
constexpr unsigned kTraceN = 1u << 18;
static __device__ TraceRec g_trace[kTraceN];
static __device__ unsigned long long g_trace_n;

__device__ __forceinline__ uint64_t gtime() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint32_t smid() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
// Thread 0 appends the block's record (t3: now), after the whole block is done.
__device__ __forceinline__ void trace_block(int id, int64_t M, uint32_t kind, uint64_t t0,
                                            uint64_t t1, uint64_t t2, uint64_t wait_cyc,
                                            uint32_t groups) {
    __syncthreads();
    if (threadIdx.x != 0) return;
    const unsigned long long at = atomicAdd(&g_trace_n, 1ull) % kTraceN;
    TraceRec r;
    r.t0 = t0;
    r.t1 = t1;
    r.t2 = t2;
    r.t3 = gtime();
    r.wait_cyc = wait_cyc;
    r.id = static_cast<uint32_t>(id);
    r.block = blockIdx.x + blockIdx.y * gridDim.x;
    r.smid = smid();
    r.groups = groups;
    r.M = static_cast<uint32_t>(M);
    r.kind = kind;
    g_trace[at] = r;
}

// The next launch's number, counted across files (an inline function's one static).
inline int trace_next_id_shared() {
    static std::atomic<int> seq{0};
    return seq++;
}

// This file's ring, oldest first.
static void trace_dump_tu(const char* suffix) {
    static std::vector<TraceRec> h(kTraceN);
    unsigned long long n = 0;
    cudaDeviceSynchronize();
    cudaMemcpyFromSymbol(&n, g_trace_n, sizeof n);
    cudaMemcpyFromSymbol(h.data(), g_trace, sizeof(TraceRec) * kTraceN);
    const char* path = std::getenv("FERRY_CUDA_TRACE_OUT");
    const std::string file = std::string(path ? path : "/tmp/ferry-trace.bin") + suffix;
    FILE* f = std::fopen(file.c_str(), "wb");
    if (!f) return;
    const uint64_t count = n < kTraceN ? n : kTraceN;
    std::fwrite(&count, sizeof count, 1, f);
    const uint64_t start = n < kTraceN ? 0 : n % kTraceN;
    for (uint64_t i = 0; i < count; i++) {
        std::fwrite(&h[(start + i) % kTraceN], sizeof(TraceRec), 1, f);
    }
    std::fclose(f);
}

// Numbers a launch, the first time registering this file's dump (its file name's suffix).
static const char* g_trace_suffix = "";
static int trace_next_id_tu(const char* suffix) {
    static const bool once = [suffix] {
        g_trace_suffix = suffix;
        std::atexit([] { trace_dump_tu(g_trace_suffix); });
        return true;
    }();
    (void)once;
    return trace_next_id_shared();
}

}  // namespace ferry::cuda
#endif
