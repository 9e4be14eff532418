// What a persistent decode kernel would reach on the 1B F16 shapes (docs/design-notes.md, "Batch-1
// F16 decode is bound by the dependency chain"): one cooperative launch a step, one block per
// SM, in which a producer warp copies every weight tile the block will use, product after
// product and layer after layer, into a ring of shared-memory stages (cp.async.bulk, completion
// on mbarriers) without waiting for any activation, while 8 consumer warps wait for each
// product's input (a counter per product that every block bumps when its rows are stored) and
// sum the tiles as they land. So DRAM keeps streaming the next products' weights while the chain
// (q/k/v -> attention -> wo) waits on its dependencies, which ferry's kernel-per-product
// structure cannot do (its next kernel's blocks only start once the SMs are free).
//
//   bench_cuda_persist [steps] [layers] [positions] [output 0|1]
//
// The step (synthetic F16 weights of the 1B shapes: hidden 2048, 32 heads of 64 over 8 KV
// heads, FFN 8192, vocabulary 128,256), per layer: x_n = rmsnorm(x); qkv = Wqkv x_n; for each
// head, softmax over `positions` cached keys and the new one, its output the values' weighted
// sum; x += Wo attn; x_n = rmsnorm(x); g, u = Wg x_n, Wu x_n; x += Wd (silu(g) u); then
// (output 1) logits = Wout rmsnorm(x). No rope, KV store or norm weights: the bytes and the
// chain of dependencies are the decode step's, the arithmetic is not all of it. Three forms of
// the same code: persistent (one cooperative launch a step); a launch a product (ferry's
// structure: each product's blocks start once the one before has left the SMs); and that with
// programmatic dependent launch (they start as its blocks leave, their producers streaming at
// once). Each is checked once against plain kernels of the same math (nmse of x and of the
// logits), then timed: steps launched back to back, median of 5 runs of `steps` steps, against
// the bytes of weights a step reads.
//
// Not run on a GPU yet (stop 48 had no device time left when it was written): its first run is
// also its first test.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda-bench.h"

namespace {

constexpr int kH = 2048, kHeads = 32, kKvHeads = 8, kD = 64, kFf = 8192, kVocab = 128256;
constexpr int kQkv = kH + 2 * kKvHeads * kD;  // 3072 rows
constexpr int kStageBytes = 16384;            // a tile: 4 rows of K 2048, 1 row of K 8192
constexpr int kStages = 11;                   // 176 KiB of ring
constexpr int kConsumers = 8;                 // warps; warp 8 is the producer
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr int kMaxVec = kFf;  // floats of a product's input in shared memory

enum Kind : int { kQkvK, kAttnK, kWoK, kGuK, kDownK, kOutK };

// One product or the attention of the step, in order.
struct Phase {
    int kind;
    const __half* w;  // rows x K, row-major (gate/up: the gate's 8192 rows, then the up's)
    int64_t rows;
    int K;
    int64_t tiles;  // rows * K * 2 / kStageBytes
};

struct Args {
    const Phase* phases;
    int n_phases;
    float* x;          // [kH], the residual
    float* qkv;        // [kQkv]
    float* attn;       // [kH]
    float* gu;         // [2 kFf]: g then u
    float* logits;     // [kVocab]
    const __half* kc;  // [kKvHeads][positions][kD], the cached keys
    const __half* vc;  // values, the same
    int positions;
    unsigned* done;  // [n_phases]: blocks past each phase, times the launch's epoch
    unsigned epoch;  // 1 for the first launch, 2 for the next, ...
    int max_tiles;   // a block's tiles of one phase at most (room for their partial sums)
    int lo, hi;      // the phases this launch runs: all of them (persistent) or one
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
}
// Every wait gives up after kWaitNs (a bug in the prototype's bookkeeping must end the launch
// with an error, not hold the GPU machine until the run's limit).
constexpr uint64_t kWaitNs = 2000000000ull;
__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void give_up_after(uint64_t t0, const char* what) {
    if (now_ns() - t0 > kWaitNs) {
        printf("bench_cuda_persist: block %d thread %d waited 2 s for %s\n",
               static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x), what);
        __trap();
    }
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
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity, const char* what) {
    if (mbar_try(b, parity)) return;
    const uint64_t t0 = now_ns();
    while (!mbar_try(b, parity)) give_up_after(t0, what);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* b) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(b))
        : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(32 * kConsumers) : "memory");
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// A reduction (op: a sum or a max) over the consumers' 256 threads (red: kConsumers floats),
// the same in every thread.
template <class Op>
__device__ float consumers_reduce(float v, float* red, float init, Op op) {
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red[warp] = v;
    consumers_sync();
    float s = init;
    for (int w = 0; w < kConsumers; w++) s = op(s, red[w]);
    consumers_sync();  // red read by all before its next use
    return s;
}
__device__ float consumers_sum(float v, float* red) {
    return consumers_reduce(v, red, 0.0f, [](float x, float y) { return x + y; });
}
__device__ float consumers_max(float v, float* red) {
    return consumers_reduce(v, red, -INFINITY, [](float x, float y) { return fmaxf(x, y); });
}

// The input of a product into vec: rmsnorm(x), attn, or silu(g) u. Read through L2 (ld.cg):
// other SMs wrote them during this launch, and this SM's L1 may hold older lines.
__device__ void load_input(const Args& a, int kind, float* vec, float* red) {
    const int t = threadIdx.x;
    if (kind == kWoK) {
        for (int i = t; i < kH; i += 32 * kConsumers) vec[i] = __ldcg(a.attn + i);
    } else if (kind == kDownK) {
        for (int i = t; i < kFf; i += 32 * kConsumers) {
            const float g = __ldcg(a.gu + i), u = __ldcg(a.gu + kFf + i);
            vec[i] = g / (1.0f + __expf(-g)) * u;
        }
    } else {
        float ss = 0.0f;
        for (int i = t; i < kH; i += 32 * kConsumers) {
            const float v = __ldcg(a.x + i);
            vec[i] = v;
            ss += v * v;
        }
        const float inv = rsqrtf(consumers_sum(ss, red) / kH + 1e-5f);
        for (int i = t; i < kH; i += 32 * kConsumers) vec[i] *= inv;
    }
    consumers_sync();
}

// One head's attention (block h < kHeads): q, the new key and value from qkv, the cached ones.
__device__ void attention(const Args& a, int h, float* sm, float* red) {
    const int t = threadIdx.x, n = a.positions + 1;
    const int hk = h / (kHeads / kKvHeads);
    float* q = sm;        // [kD]
    float* kn = sm + kD;  // the new key, then the new value
    float* vn = kn + kD;
    float* p = vn + kD;  // [n]
    if (t < kD) {
        q[t] = __ldcg(a.qkv + h * kD + t);
        kn[t] = __ldcg(a.qkv + kH + hk * kD + t);
        vn[t] = __ldcg(a.qkv + kH + kKvHeads * kD + hk * kD + t);
    }
    consumers_sync();
    const float scale = 1.0f / sqrtf(static_cast<float>(kD));
    float m = -INFINITY;
    for (int j = t; j < n; j += 32 * kConsumers) {
        float s = 0.0f;
        if (j < a.positions) {
            const __half* k = a.kc + (static_cast<int64_t>(hk) * a.positions + j) * kD;
            for (int d = 0; d < kD; d++) s += q[d] * __half2float(k[d]);
        } else {
            for (int d = 0; d < kD; d++) s += q[d] * kn[d];
        }
        p[j] = s * scale;
        m = fmaxf(m, s * scale);
    }
    m = consumers_max(m, red);
    float l = 0.0f;
    for (int j = t; j < n; j += 32 * kConsumers) {
        p[j] = __expf(p[j] - m);
        l += p[j];
    }
    l = consumers_sum(l, red);  // (its barriers also publish p)
    if (t < kD) {
        float o = 0.0f;
        for (int j = 0; j < n; j++) {
            const float v =
                j < a.positions
                    ? __half2float(a.vc[(static_cast<int64_t>(hk) * a.positions + j) * kD + t])
                    : vn[t];
            o += p[j] * v;
        }
        a.attn[h * kD + t] = o / l;
    }
}

__global__ void __launch_bounds__(kThreads, 1) k_persist(Args a) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* ring = smem;
    float* vec = reinterpret_cast<float*>(smem + kStages * kStageBytes);
    float* red = vec + kMaxVec;      // [kConsumers]
    float* part = red + kConsumers;  // [max_tiles][kConsumers]: each warp's sum of each tile
    uint64_t* full = reinterpret_cast<uint64_t*>(part + a.max_tiles * kConsumers);
    uint64_t* empty = full + kStages;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nb = gridDim.x, b = blockIdx.x;
    // One launch a product (the comparison): the next launch may start as this one's blocks
    // leave (programmatic dependent launch, when the host asked for it): its producer streams
    // its weights at once and its consumers wait on the counter, as in the persistent form.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; s++) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, kConsumers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == kConsumers) {
        // The producer: every tile of this block, in the consumers' order, as fast as the ring
        // frees stages. Weights depend on nothing, so it never waits for an activation.
        if (lane != 0) return;
        int64_t it = 0;
        for (int pi = a.lo; pi < a.hi; pi++) {
            const Phase ph = a.phases[pi];
            if (ph.kind == kAttnK) continue;
            for (int64_t tile = b; tile < ph.tiles; tile += nb, it++) {
                const int s = static_cast<int>(it % kStages);
                mbar_wait(empty + s, static_cast<unsigned>((it / kStages) & 1) ^ 1u, "a stage");
                mbar_expect(full + s, kStageBytes);
                bulk_copy(ring + s * kStageBytes,
                          reinterpret_cast<const unsigned char*>(ph.w) + tile * kStageBytes,
                          kStageBytes, full + s);
            }
        }
        return;
    }
    // The consumers.
    int64_t it = 0;
    for (int pi = a.lo; pi < a.hi; pi++) {
        const Phase ph = a.phases[pi];
        // The phase before, stored by every block (the first phase: the step before's last,
        // which a launch a product with programmatic dependent launch may still be running).
        if (pi > 0 || a.epoch > 1) {
            if (threadIdx.x == 0) {
                const unsigned* c = a.done + (pi > 0 ? pi - 1 : a.n_phases - 1);
                const unsigned want = (pi > 0 ? a.epoch : a.epoch - 1) * static_cast<unsigned>(nb);
                const uint64_t t0 = now_ns();
                while (ld_acquire(c) < want) give_up_after(t0, "the phase before");
            }
            consumers_sync();
        }
        if (ph.kind == kAttnK) {
            if (b < kHeads) attention(a, b, vec, red);
        } else {
            load_input(a, ph.kind, vec, red);
            const int rows_per_tile = kStageBytes / (2 * ph.K);  // 4 or 1
            const int warps_per_row = kConsumers / rows_per_tile;
            // Warp w sums halves [w 1024, (w + 1) 1024) of every tile, in one row: the same
            // 1024 of the input each time, so each lane keeps its 32 of them in registers (read
            // from shared memory per tile, lanes 8 floats apart, they cost 8-way bank conflicts:
            // the first run's consumers streamed 1.6 TB/s, stop 49).
            const int e0 = warp * 1024;
            const int k0 = e0 % ph.K;
            float v[32];
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int c = 0; c < 8; c++) v[8 * j + c] = vec[k0 + j * 256 + lane * 8 + c];
            }
            int lt = 0;  // the tile's place among the block's tiles of the phase
            for (int64_t tile = b; tile < ph.tiles; tile += nb, it++, lt++) {
                const int s = static_cast<int>(it % kStages);
                mbar_wait(full + s, static_cast<unsigned>((it / kStages) & 1), "a tile");
                const uint4* src = reinterpret_cast<const uint4*>(ring + s * kStageBytes + e0 * 2);
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint4 w = src[j * 32 + lane];
                    const __half2* h2 = reinterpret_cast<const __half2*>(&w);
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const float2 f = __half22float2(h2[c]);
                        acc = fmaf(f.x, v[8 * j + 2 * c], acc);
                        acc = fmaf(f.y, v[8 * j + 2 * c + 1], acc);
                    }
                }
                acc = warp_sum(acc);
                __syncwarp();
                if (lane == 0) {
                    mbar_arrive(empty + s);  // this warp has read the stage
                    part[lt * kConsumers + warp] = acc;
                }
            }
            // The rows of the phase's tiles, once every warp's sums are in (one barrier a
            // phase, not one a tile).
            consumers_sync();
            for (int i = threadIdx.x; i < lt * rows_per_tile; i += 32 * kConsumers) {
                const int t = i / rows_per_tile, r = i % rows_per_tile;
                float v = 0.0f;
                for (int w = r * warps_per_row; w < (r + 1) * warps_per_row; w++) {
                    v += part[t * kConsumers + w];
                }
                const int64_t row = (b + static_cast<int64_t>(t) * nb) * rows_per_tile + r;
                switch (ph.kind) {
                    case kQkvK:
                        a.qkv[row] = v;
                        break;
                    case kGuK:
                        a.gu[row] = v;
                        break;
                    case kOutK:
                        a.logits[row] = v;
                        break;
                    default:  // wo, down: into the residual
                        a.x[row] = __ldcg(a.x + row) + v;
                        break;
                }
            }
        }
        // This block's part of the phase is stored: count it (a release at gpu scope).
        consumers_sync();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(a.done + pi, 1u);
        }
    }
}

// The same math in plain kernels (the check): one warp a row.
__global__ void k_rmsnorm(const float* x, float* out) {
    __shared__ float red[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < kH; i += blockDim.x) ss += x[i] * x[i];
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    float s = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; w++) s += red[w];
    const float inv = rsqrtf(s / kH + 1e-5f);
    for (int i = threadIdx.x; i < kH; i += blockDim.x) out[i] = x[i] * inv;
}
__global__ void k_matvec(const __half* w, int64_t rows, int K, const float* v, float* out,
                         const float* add) {
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float acc = 0.0f;
    for (int k = lane; k < K; k += 32) acc += __half2float(w[row * K + k]) * v[k];
    acc = warp_sum(acc);
    if (lane == 0) out[row] = (add ? add[row] : 0.0f) + acc;
}
__global__ void k_swiglu(const float* gu, float* h) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < kFf) {
        const float g = gu[i];
        h[i] = g / (1.0f + expf(-g)) * gu[kFf + i];
    }
}
__global__ void k_attention_ref(const float* qkv, const __half* kc, const __half* vc, int positions,
                                float* out) {
    const int h = blockIdx.x, e = threadIdx.x;  // kD threads: output element e
    const int hk = h / (kHeads / kKvHeads), n = positions + 1;
    const float* q = qkv + h * kD;
    const float* kn = qkv + kH + hk * kD;
    const float* vn = qkv + kH + kKvHeads * kD + hk * kD;
    const float scale = 1.0f / sqrtf(static_cast<float>(kD));
    auto score = [&](int j) {
        float s = 0.0f;
        for (int c = 0; c < kD; c++) {
            const float k =
                j < positions
                    ? __half2float(kc[(static_cast<int64_t>(hk) * positions + j) * kD + c])
                    : kn[c];
            s += q[c] * k;
        }
        return s * scale;
    };
    float m = -INFINITY;
    for (int j = 0; j < n; j++) m = fmaxf(m, score(j));
    float l = 0.0f, o = 0.0f;
    for (int j = 0; j < n; j++) {
        const float p = expf(score(j) - m);
        const float v = j < positions
                            ? __half2float(vc[(static_cast<int64_t>(hk) * positions + j) * kD + e])
                            : vn[e];
        l += p;
        o += p * v;
    }
    out[h * kD + e] = o / l;
}

__global__ void k_fill(__half* p, int64_t n, uint32_t seed, float scale) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2half(scale * (static_cast<float>(h & 0xffff) / 32768.0f - 1.0f));
    }
}

double nmse(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        den += static_cast<double>(b[i]) * b[i];
    }
    return den > 0.0 ? num / den : num;
}

}  // namespace

int main(int argc, char** argv) {
    const int steps = argc > 1 ? std::atoi(argv[1]) : 50;
    const int layers = argc > 2 ? std::atoi(argv[2]) : 16;
    const int positions = argc > 3 ? std::atoi(argv[3]) : 64;
    const bool output = argc > 4 ? std::atoi(argv[4]) != 0 : true;
    if (steps < 1 || layers < 1 || positions < 1 || positions > 4096) {
        std::fprintf(stderr, "usage: bench_cuda_persist [steps] [layers] [positions] [output]\n");
        return 2;
    }
    int dev = 0, n_sm = 0, coop = 0, smem_max = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    CK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));

    // Weights: one allocation a matrix (no reuse in L2 across a step).
    auto weights = [](int64_t n, uint32_t seed, float scale) {
        __half* p = nullptr;
        CK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(__half)));
        k_fill<<<1024, 256>>>(p, n, seed, scale);
        CK(cudaGetLastError());
        return p;
    };
    std::vector<Phase> ph;
    double bytes = 0.0;
    auto product = [&](int kind, int64_t rows, int K, uint32_t seed) {
        const __half* w = weights(rows * K, seed, 1.0f / std::sqrt(static_cast<float>(K)));
        ph.push_back({kind, w, rows, K, rows * K * 2 / kStageBytes});
        bytes += static_cast<double>(rows) * K * 2;
    };
    for (int l = 0; l < layers; l++) {
        product(kQkvK, kQkv, kH, 100u * l + 1);
        ph.push_back({kAttnK, nullptr, 0, 0, 0});
        product(kWoK, kH, kH, 100u * l + 2);
        product(kGuK, 2 * kFf, kH, 100u * l + 3);
        product(kDownK, kH, kFf, 100u * l + 4);
    }
    if (output) product(kOutK, kVocab, kH, 7);
    // Shared memory: the ring, a product's input, the reduction words, every warp's sum of each
    // of the block's tiles of the largest phase, the barriers.
    int64_t most = 0;
    for (const Phase& p : ph) most = std::max(most, p.tiles);
    const int max_tiles = static_cast<int>((most + n_sm - 1) / n_sm);
    const size_t smem = static_cast<size_t>(kStages) * kStageBytes + sizeof(float) * kMaxVec +
                        sizeof(float) * kConsumers +
                        sizeof(float) * static_cast<size_t>(max_tiles) * kConsumers +
                        sizeof(uint64_t) * 2 * kStages;
    if (!coop || smem > static_cast<size_t>(smem_max)) {
        std::fprintf(stderr,
                     "needs cooperative launch and %zu bytes of shared memory a block (%d SMs, "
                     "the device allows %d)\n",
                     smem, n_sm, smem_max);
        return 1;
    }
    CK(cudaFuncSetAttribute(k_persist, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem)));
    Phase* d_ph = nullptr;
    CK(cudaMalloc(&d_ph, ph.size() * sizeof(Phase)));
    CK(cudaMemcpy(d_ph, ph.data(), ph.size() * sizeof(Phase), cudaMemcpyHostToDevice));

    float *x, *x0, *qkv, *attn, *gu, *logits, *xn, *h;
    unsigned* done;
    CK(cudaMalloc(&x, kH * sizeof(float)));
    CK(cudaMalloc(&x0, kH * sizeof(float)));
    CK(cudaMalloc(&qkv, kQkv * sizeof(float)));
    CK(cudaMalloc(&attn, kH * sizeof(float)));
    CK(cudaMalloc(&gu, 2 * kFf * sizeof(float)));
    CK(cudaMalloc(&logits, kVocab * sizeof(float)));
    CK(cudaMalloc(&xn, kH * sizeof(float)));
    CK(cudaMalloc(&h, kFf * sizeof(float)));
    CK(cudaMalloc(&done, ph.size() * sizeof(unsigned)));
    CK(cudaMemset(done, 0, ph.size() * sizeof(unsigned)));
    std::vector<float> hx(kH);
    for (int i = 0; i < kH; i++) hx[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
    CK(cudaMemcpy(x0, hx.data(), kH * sizeof(float), cudaMemcpyHostToDevice));
    const __half* kc = weights(static_cast<int64_t>(kKvHeads) * positions * kD, 11, 1.0f);
    const __half* vc = weights(static_cast<int64_t>(kKvHeads) * positions * kD, 12, 1.0f);
    CK(cudaDeviceSynchronize());

    Args a{};
    a.phases = d_ph;
    a.n_phases = static_cast<int>(ph.size());
    a.x = x;
    a.qkv = qkv;
    a.attn = attn;
    a.gu = gu;
    a.logits = logits;
    a.kc = kc;
    a.vc = vc;
    a.positions = positions;
    a.done = done;
    a.max_tiles = max_tiles;
    unsigned epoch = 0;
    // A step: mode 0, the persistent form (one cooperative launch); 1, one launch a product
    // (the same code and math, ferry's structure); 2, that with programmatic dependent launch.
    int mode = 0;
    auto launch = [&](cudaStream_t st) {
        a.epoch = ++epoch;
        if (mode == 0) {
            a.lo = 0;
            a.hi = a.n_phases;
            void* params[] = {&a};
            CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k_persist), dim3(n_sm),
                                           dim3(kThreads), params, smem, st));
            return;
        }
        for (int pi = 0; pi < a.n_phases; pi++) {
            a.lo = pi;
            a.hi = pi + 1;
            PdlLaunch l(static_cast<unsigned>(n_sm), kThreads, smem, st, mode == 2);
            CK(cudaLaunchKernelEx(&l.cfg, k_persist, a));
        }
    };

    // The check: one step from x0 by each form, and by the plain kernels.
    std::vector<std::vector<float>> px(3, std::vector<float>(kH)),
        plog(3, std::vector<float>(kVocab));
    for (mode = 0; mode < 3; mode++) {
        CK(cudaMemcpy(x, x0, kH * sizeof(float), cudaMemcpyDeviceToDevice));
        launch(nullptr);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(px[mode].data(), x, kH * sizeof(float), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(plog[mode].data(), logits, kVocab * sizeof(float), cudaMemcpyDeviceToHost));
    }
    CK(cudaMemcpy(x, x0, kH * sizeof(float), cudaMemcpyDeviceToDevice));
    auto mv = [&](const Phase& p, const float* v, float* out, const float* add) {
        const int64_t threads = p.rows * 32;
        k_matvec<<<static_cast<unsigned>((threads + 255) / 256), 256>>>(p.w, p.rows, p.K, v, out,
                                                                        add);
    };
    for (const Phase& p : ph) {
        switch (p.kind) {
            case kQkvK:
                k_rmsnorm<<<1, 256>>>(x, xn);
                mv(p, xn, qkv, nullptr);
                break;
            case kAttnK:
                k_attention_ref<<<kHeads, kD>>>(qkv, kc, vc, positions, attn);
                break;
            case kWoK:
                mv(p, attn, x, x);
                break;
            case kGuK:
                k_rmsnorm<<<1, 256>>>(x, xn);
                mv(p, xn, gu, nullptr);
                break;
            case kDownK:
                k_swiglu<<<kFf / 256, 256>>>(gu, h);
                mv(p, h, x, x);
                break;
            default:
                k_rmsnorm<<<1, 256>>>(x, xn);
                mv(p, xn, logits, nullptr);
                break;
        }
        CK(cudaGetLastError());
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> rx(kH), rlog(kVocab);
    CK(cudaMemcpy(rx.data(), x, kH * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(rlog.data(), logits, kVocab * sizeof(float), cudaMemcpyDeviceToHost));
    static const char* const kModes[3] = {"persistent", "a launch a product",
                                          "a launch a product, PDL"};
    bool ok = true;
    for (int m = 0; m < 3; m++) {
        const double ex = nmse(px[m], rx), el = output ? nmse(plog[m], rlog) : 0.0;
        const bool good = ex < 1e-8 && el < 1e-8;
        std::printf("check, %s: nmse x %.3g, logits %.3g (%s)\n", kModes[m], ex, el,
                    good ? "ok" : "FAILED");
        ok = ok && good;
    }
    if (!ok) return 1;

    // Timing: steps back to back (x keeps growing; its values do not change the bytes).
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (mode = 0; mode < 3; mode++) {
        for (int i = 0; i < 5; i++) launch(st);
        std::vector<double> per;
        for (int r = 0; r < 5; r++) {
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < steps; i++) launch(st);
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            per.push_back(1e3 * ms / steps);
        }
        std::sort(per.begin(), per.end());
        const double us = per[per.size() / 2];
        std::printf(
            "%s: %d SMs, %d layers, %d cached keys, output %s: %.1f us a step (%.1f-%.1f), %.0f "
            "MB of weights, %.2f TB/s, %.0f steps/s\n",
            kModes[mode], n_sm, layers, positions, output ? "on" : "off", us, per.front(),
            per.back(), bytes / 1e6, bytes / us / 1e6, 1e6 / us);
    }
    return 0;
}
