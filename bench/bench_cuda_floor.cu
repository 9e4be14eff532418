// The floor under a decode step made of one kernel per product: a CUDA graph of kernels that
// only stream bytes (the byte counts of the 1B model's decode kernels, one buffer each, so
// nothing is served from L2), replayed as a decode step is. What it measures is the time a
// step cannot go below while it keeps this many kernels of these sizes: launch, ramp-up,
// DRAM and drain, with nothing computed. Compare it with `ferry bench` tg128 on the same
// machine (bench/results/cuda.md).
//
//   bench_cuda_floor [q4_0|f16] [replays] [smem_kib]
//
// Each kernel sums its buffer with 16-byte loads (U loads in flight per thread) and writes one
// value per block. Modes: no PDL; PDL with the loads after griddepcontrol.wait (a kernel that
// must wait for its input before it reads anything); PDL with the loads issued before the wait
// (weights do not depend on the kernel before).
//
// smem_kib (default 0): every block also holds that much dynamic shared memory (untouched), as
// a product kernel holds its b vector and its staged weights. ferry's products fill an SM
// (registers and shared memory), so the next kernel's blocks cannot start beside them, where
// these kernels' can; with smem_kib above half an SM's 227 KiB no two blocks of consecutive
// kernels fit an SM either. The question for a product whose bytes in flight sit in a
// shared-memory ring (TMA) instead of registers: up to which footprint does the chain keep
// its overlap (stop 32's plan for F16).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda-bench.h"

namespace {

constexpr int kThreads = 256;
constexpr int kU = 4;

// mode 0: plain; 1: wait, then load; 2: load, then wait.
template <int mode>
__global__ void __launch_bounds__(kThreads) k_stream(const int4* p, long long n, float* out) {
    if constexpr (mode != 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if constexpr (mode == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
    const long long stride = static_cast<long long>(gridDim.x) * kThreads;
    unsigned acc = 0;
    for (long long i0 = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; i0 < n;
         i0 += kU * stride) {
        int4 v[kU];
#pragma unroll
        for (int u = 0; u < kU; u++) {
            const long long i = i0 + u * stride;
            v[u] = i < n ? __ldcs(p + i) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kU; u++) acc += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if constexpr (mode == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (acc == 0x12345678u) out[blockIdx.x] = 1.0f;  // keeps the loads; never true for zeros
}

struct Kernel {
    const char* name;
    double mb;  // megabytes read
    int count;  // per step
};

size_t g_smem = 0;  // dynamic shared memory per block (smem_kib)

void launch(int mode, const int4* p, long long n, float* out, int blocks, cudaStream_t st) {
    PdlLaunch l(static_cast<unsigned>(blocks), kThreads, g_smem, st, mode != 0);
    const cudaLaunchConfig_t& cfg = l.cfg;
    switch (mode) {
        case 0:
            CK(cudaLaunchKernelEx(&cfg, k_stream<0>, p, n, out));
            break;
        case 1:
            CK(cudaLaunchKernelEx(&cfg, k_stream<1>, p, n, out));
            break;
        default:
            CK(cudaLaunchKernelEx(&cfg, k_stream<2>, p, n, out));
            break;
    }
}

}  // namespace

int main(int argc, char** argv) {
    const char* model = argc > 1 ? argv[1] : "q4_0";
    const int replays = argc > 2 ? std::atoi(argv[2]) : 200;
    g_smem = static_cast<size_t>(argc > 3 ? std::atoi(argv[3]) : 0) << 10;
    if (g_smem > 0) {
        for (const void* f : {reinterpret_cast<const void*>(k_stream<0>),
                              reinterpret_cast<const void*>(k_stream<1>),
                              reinterpret_cast<const void*>(k_stream<2>)}) {
            if (g_smem > 48u << 10) {
                CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(g_smem)));
            }
            // The largest carveout (as ferry's bulk kernels ask): a lone block's smaller one
            // would keep the next kernel's block out until the SM drained.
            CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
        }
    }
    // One layer's decode kernels (ncu's DRAM bytes, bench/results/cuda.md), 16 layers, then the
    // output product and the embedding row.
    std::vector<Kernel> layer, tail;
    if (std::strcmp(model, "f16") == 0) {
        layer = {{"qkv", 12.6, 1},
                 {"attn", 0.06, 1},
                 {"wo", 8.4, 1},
                 {"gate/up", 67.1, 1},
                 {"down", 33.6, 1}};
        tail = {{"output", 525.3, 1}, {"get_rows", 0.01, 1}};
    } else if (std::strcmp(model, "q4_0") == 0) {
        layer = {{"qkv", 3.6, 1},
                 {"attn", 0.07, 1},
                 {"wo", 2.4, 1},
                 {"gate/up", 18.9, 1},
                 {"down", 9.4, 1}};
        tail = {{"output", 215.5, 1}, {"get_rows", 0.01, 1}};
    } else {
        std::fprintf(stderr, "usage: bench_cuda_floor [q4_0|f16] [replays]\n");
        return 2;
    }
    int dev = 0, n_sm = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    std::vector<Kernel> step;
    for (int l = 0; l < 16; l++) step.insert(step.end(), layer.begin(), layer.end());
    step.insert(step.end(), tail.begin(), tail.end());
    std::vector<int4*> bufs;
    std::vector<long long> lens;
    double total_mb = 0;
    for (const Kernel& k : step) {
        const long long n = static_cast<long long>(k.mb * 1e6 / 16);
        int4* p = nullptr;
        CK(cudaMalloc(&p, static_cast<size_t>(std::max(1LL, n)) * 16));
        CK(cudaMemset(p, 0, static_cast<size_t>(std::max(1LL, n)) * 16));
        bufs.push_back(p);
        lens.push_back(n);
        total_mb += k.mb;
    }
    float* out = nullptr;
    CK(cudaMalloc(&out, 1 << 20));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::printf(
        "model %s: %zu kernels per step, %.1f MB per step, %d SMs, %d replays, %zu KiB of shared "
        "memory a block\n",
        model, step.size(), total_mb, n_sm, replays, g_smem >> 10);
    std::printf("%-28s %10s %10s %10s\n", "mode", "us/step", "TB/s", "steps/s");
    const char* names[] = {"no PDL", "PDL, wait then load", "PDL, load then wait"};
    for (int per_sm : {1, 2, 4, 8}) {
        for (int mode = 0; mode < 3; mode++) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (size_t i = 0; i < step.size(); i++) {
                const long long per_block = static_cast<long long>(kThreads) * kU;
                const long long want = (lens[i] + per_block - 1) / per_block;
                const int blocks = static_cast<int>(
                    std::max(1LL, std::min(want, static_cast<long long>(n_sm) * per_sm)));
                launch(mode, bufs[i], lens[i], out, blocks, st);
            }
            CK(cudaStreamEndCapture(st, &graph));
            CK(cudaGraphInstantiate(&exec, graph, 0));
            for (int i = 0; i < 10; i++) CK(cudaGraphLaunch(exec, st));
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            std::vector<float> times;
            for (int r = 0; r < 5; r++) {
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < replays; i++) CK(cudaGraphLaunch(exec, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                times.push_back(ms * 1000.0f / static_cast<float>(replays));
            }
            std::sort(times.begin(), times.end());
            const double us = times[2];
            char label[64];
            std::snprintf(label, sizeof label, "%s, %d blocks/SM", names[mode], per_sm);
            std::printf("%-28s %10.1f %10.2f %10.0f\n", label, us, total_mb / us, 1e6 / us);
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
            CK(cudaEventDestroy(e0));
            CK(cudaEventDestroy(e1));
        }
    }
    // Each kernel kind alone: launches back to back without PDL, cycling through the 16
    // layers' buffers (so that a small one is not served from L2), timed over 160 launches.
    std::printf("\nper kernel kind, launches back to back (no PDL, 4 blocks/SM), us:\n");
    for (size_t i = 0; i < layer.size() + tail.size(); i++) {
        const bool in_layer = i < layer.size();
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        const long long per_block = static_cast<long long>(kThreads) * kU;
        const int n = in_layer ? 160 : 20;
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < n; r++) {
            const size_t at =
                in_layer ? (r % 16) * layer.size() + i : 16 * layer.size() + (i - layer.size());
            const int blocks =
                static_cast<int>(std::max(1LL, std::min((lens[at] + per_block - 1) / per_block,
                                                        static_cast<long long>(n_sm) * 4)));
            launch(0, bufs[at], lens[at], out, blocks, st);
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const Kernel& k = in_layer ? layer[i] : tail[i - layer.size()];
        std::printf("  %-10s %8.2f MB %8.2f us %6.2f TB/s\n", k.name, k.mb,
                    ms * 1000.0f / static_cast<float>(n), k.mb / (ms * 1000.0 / n));
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
    }
    return 0;
}
