// The persistent decode step (persist.h): the kernel of bench/bench_cuda_persist.cu's best form
// (stop 51: a block's tiles of a phase consecutive, in whole lines of the words they store; the
// producer's copies in flight capped at 3, at 1 while the consumers are in the attention's
// chain; the attention's cached keys and values loaded before its wait), with the graph's
// shapes, rope, mask and position read at run time, errors reported instead of trapping, and
// the launch counter kept on the device so that a captured graph replays it unchanged.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/persist-sync.cuh"
#include "backends/cuda/ops/persist.h"

namespace ferry::cuda {

namespace {

using namespace psync;

#define PERSIST_TRY(expr, ...)                                                         \
    do {                                                                               \
        const cudaError_t e_ = (expr);                                                 \
        if (e_ != cudaSuccess) {                                                       \
            cudaGetLastError();                                                        \
            return Status::error(strfmt(__VA_ARGS__) + ": " + cudaGetErrorString(e_)); \
        }                                                                              \
    } while (0)

constexpr int kStageBytes = kTileBytes;  // rows of K <= 8192, whole rows
constexpr int kStages = 13;              // 208 KiB of ring
constexpr int kConsumers = 8;            // warps; warp 8 is the producer
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr int kD = 64;                       // head size (persist_shapes_ok)
constexpr int kMaxEmbd = 2048;               // n_embd at most (the input's shared copy)
constexpr int kMaxKeys = 1024;               // keys attended at most (the scores' scratch)
constexpr int kInflight = 3;                 // copies in flight a block (stop 51: 3 ...
constexpr int kChainInflight = 1;            // ... and 1 in q/k/v, the attention and wo)
constexpr int kEarlyKeys = 32 * kConsumers;  // keys a block loads before its wait: a thread each
constexpr int kEarlyValues = kEarlyKeys / kConsumers;  // values a warp loads before its wait
constexpr int kValueBatch = 8;                         // values a warp loads at once after its wait
constexpr int kMaxSplits = 4;  // blocks a head's attention at most (merge_words' registers)
// Positions below which a head's attention stays one block (stop 54, H100, 1B F16: tg128 1,093-
// 1,096 t/s with one block a head against 1,075 with four; tg256 1,055-1,057 against 1,075).
constexpr int kOneBlockKeys = 128;
// Shared floats besides the ring: the attention's q, new key and value, its scores and its
// per-warp sums; or a K = n_embd product's input shared by its warps.
constexpr int kAttnScratch = (3 * kD + kMaxKeys + kConsumers * kD + 7) / 8 * 8;
constexpr int kScratch = kAttnScratch > kMaxEmbd ? kAttnScratch : kMaxEmbd;

using SmemLayout = RingLayout<kStages, kScratch, kConsumers>;

// The parts of the attention's chain that PersistModel::chain caps apart (Args::chain).
enum ChainPart : int { kChainQkv, kChainAttn, kChainWait, kChainWo, kChainParts };
static_assert(sizeof(PersistModel::chain) == kChainParts * sizeof(int), "PersistModel::chain");

// Tags: tag_of(epoch, phase) is unique to a phase of a launch among the launches of the last
// 2^32 / kTagPhases; every word is stored again each step, so an old tag is never waited for.
constexpr unsigned kTagPhases = 512;
__host__ __device__ inline unsigned tag_of(unsigned epoch, int phase) {
    return epoch * kTagPhases + static_cast<unsigned>(phase) + 1u;
}

struct Phase {
    int kind;
    // Up to three matrices one after another (q/k/v: seg[i] tiles each), or, `paired`
    // (gate/up), w[0] the gate and w[1] the up matrix: a tile holds rows_per_tile / 2 rows of
    // each (two 8 KiB copies), that many values of silu(g) u.
    const unsigned char* w[3];  // F16 or BF16 (the launch's kernel says which)
    int64_t seg[3];
    int paired;
    int K;
    int64_t tiles;
    int group;          // tiles a block's share is a multiple of (whole lines of its stores)
    const float* norm;  // q/k/v, gate/up, output: the RMS norm's weights [n_embd]
    __half* kc;         // q/k/v and the attention: the layer's caches
    __half* vc;
    int last;  // the attention: 1 in the last layer (its mask is Args::mask_last)
    int in;    // the phase whose output this one reads (-1: the step's input row x0)
    int x_in;  // wo and down: the phase that wrote x last (-1: x0)
};

// The launch's arguments (the same every step of one structure: the position, the epoch and
// the mask's values are read from device memory).
struct Args {
    const Phase* phases;
    int n_phases;
    int max_tiles;
    int H, n_head, n_head_kv;
    int n_kv;
    Word* x;     // [H]: the residual
    Word* qkv;   // [H + 2 n_head_kv kD]
    Word* attn;  // [n_head kD]: the attention's output, one split
    Word* h;     // [n_ff]: silu(g) u
    // The attention's blocks a head (1, 2 or 4, n_head splits <= the blocks) and, more than
    // one, each split's unscaled sums [splits][n_head kD] and max score and sum of weights
    // [splits][n_head][2].
    int splits;
    Word* part;
    Word* ml;
    // Copies in flight a block, in each part of the attention's chain (ChainPart: q/k/v, a
    // block's attention split, a block waiting for wo's input, wo) and in the output phase:
    // kInflight, kChainInflight and kInflight unless PersistModel asks for others.
    int inflight;
    int chain[kChainParts];
    int out_inflight;
    const float* x0;
    float* logits;
    // Where the output phase also stores the logits: the device word holding host memory the
    // device maps (OpContext::host_out), or nullptr (also in it). Read at the phase, so that a
    // captured launch keeps up.
    float* const* host_logits;
    const int32_t* pos;
    const int32_t* out_ids;         // or nullptr (persist.h)
    int64_t cache_rows, cache_row;  // rows, and halves from one to the next
    // The attention's masks [n_kv]: every layer's but the last, and the last's (a session's
    // graph gives its last layer the mask rows of the tokens whose logits it reads). Here and
    // not in the phases, so that a table (kept while the backend lives) names no tensor a new
    // graph may place elsewhere.
    const __half* mask;
    const __half* mask_last;
    float eps, kq_scale;
    int n_rot;
    double rope_base, rope_scale;
    const char* rope_ff;
    int64_t rope_ff_nb0;
    // ctl[0]: the launch count (the tags' epoch, bumped by the launch's last block), ctl[1]:
    // blocks done, ctl[2]: nonzero once a wait gave up (every wait of the launch then returns
    // at once; the last block clears it).
    unsigned* ctl;
    DeviceError* err;
    // FERRY_CUDA_PERSIST_STAMPS=1 (a diagnostic), or nullptr: [phase][block][kStampSlots], the
    // consumers' global nanoseconds (start, input read, tiles summed or the attention's sums
    // done, rows stored), then the producer's cycles (from its first wait for the phase's tiles
    // to its last copy's issue, those waiting for a free stage, those waiting under the cap on
    // copies in flight) and the phase's tiles.
    unsigned long long* stamps;
};

// Waits give up after kWaitNs: a wait that long is a bug in this kernel's bookkeeping, and it
// must end the launch with an error (DeviceError code -1), never hang the device. After
// kCheckNs a wait also looks at ctl[2], so that once one gave up the others end too.
constexpr uint64_t kWaitNs = 2000000000ull;
constexpr uint64_t kCheckNs = 1000000ull;

// True when the wait begun at t0 should end (it gave up, or another one did).
__device__ __forceinline__ bool give_up(const Args& a, uint64_t t0, int what) {
    const uint64_t d = now_ns() - t0;
    if (d < kCheckNs) return false;
    if (*reinterpret_cast<volatile unsigned*>(a.ctl + 2) != 0) return true;
    if (d < kWaitNs) return false;
    atomicExch(a.ctl + 2, 1u);
    if (atomicCAS(&a.err->code, 0, -1) == 0) {
        a.err->value = what;
        a.err->limit = blockIdx.x;
        a.err->where = threadIdx.x;
        __threadfence_system();
    }
    return true;
}
__device__ __forceinline__ void mbar_wait(const Args& a, uint64_t* b, unsigned parity, int what) {
    if (mbar_try(b, parity)) return;
    const uint64_t t0 = now_ns();
    while (!mbar_try(b, parity)) {
        if (give_up(a, t0, what)) return;
    }
}
// One value, once its tag is `want`.
__device__ __forceinline__ float wait_word(const Args& a, const Word* p, unsigned want, int what) {
    Word w = ld_word(p);
    if (tag_word(w) == want) return val_word(w);
    const uint64_t t0 = now_ns();
    do {
        if (give_up(a, t0, what)) return 0.0f;
        w = ld_word(p);
    } while (tag_word(w) != want);
    return val_word(w);
}
// A lane's J runs of 8 consecutive values, p[256 j, 256 j + 8) for j < J, into o[8 j, 8 j + 8),
// once all their tags are `want`: every load of a round issued at once.
template <int J>
__device__ __forceinline__ void wait_words(const Args& a, const Word* p, unsigned want, float* o,
                                           int what) {
    Word w[8 * J];
    const uint64_t t0 = now_ns();
    for (;;) {
#pragma unroll
        for (int i = 0; i < 4 * J; i++) {
            ld_words2(p + 256 * (i / 4) + 2 * (i % 4), w[2 * i], w[2 * i + 1]);
        }
        bool ok = true;
#pragma unroll
        for (int i = 0; i < 8 * J; i++) ok = ok && tag_word(w[i]) == want;
        if (ok || give_up(a, t0, what)) break;
    }
#pragma unroll
    for (int i = 0; i < 8 * J; i++) o[i] = val_word(w[i]);
}
// This block's stamps in phase pi (Args::stamps), and its consumer stamp i, by its first thread.
constexpr int kStampSlots = 8;
__device__ __forceinline__ unsigned long long* stamps_of(const Args& a, int pi) {
    return a.stamps + (static_cast<int64_t>(pi) * gridDim.x + blockIdx.x) * kStampSlots;
}
__device__ __forceinline__ void stamp(const Args& a, int pi, int i) {
    if (a.stamps && threadIdx.x == 0) stamps_of(a, pi)[i] = now_ns();
}
// The producer's cap on copies in flight while the consumers start a phase of `kind` (attends:
// this block runs one of its attention's splits). wo's rises to chain[kChainWo] once its input
// is read.
__device__ __forceinline__ int phase_cap(const Args& a, int kind, bool attends) {
    return kind == kQkvK                    ? a.chain[kChainQkv]
           : attends                        ? a.chain[kChainAttn]
           : kind == kAttnK || kind == kWoK ? a.chain[kChainWait]
           : kind == kOutK                  ? a.out_inflight
                                            : a.inflight;
}
// What a wait that gave up was for (DeviceError::value).
enum What : int { kWaitX = 1, kWaitAttn, kWaitH, kWaitQkv, kWaitRow, kWaitStage, kWaitTile };

// The attention's output e .. e + 8 (of one head) from its S splits (attention), once every
// split's words are there (all loads of a round issued at once): with m the largest of the
// splits' max scores, sum_s exp(m_s - m) o_s / sum_s exp(m_s - m) l_s (0 where no key was
// attended). The 8 lanes of a head load its 2 S max and sum words once between them and pass
// them round (a lane has 168 registers: 8 S words each would spill).
template <int S>
__device__ __forceinline__ void merge_words(const Args& a, int e, unsigned want, float* o) {
    static_assert(2 * S <= 8, "a head's max and sum words: one a lane of its 8");
    const int lane = threadIdx.x % 32, i_ml = lane % 8;  // (s, m or l) = (i_ml / 2, i_ml % 2)
    Word w[S][8], ml = 0;
    // (The bases taken here, not hoisted out of the kernel's loop over phases: kept live through
    // it, their registers made the attention spill.)
    const Word* part = a.part;
    const Word* mlp = a.ml;
    asm volatile("" : "+l"(part), "+l"(mlp));
    mlp += 2 * (static_cast<int64_t>(i_ml / 2) * a.n_head + e / kD) + i_ml % 2;
    const uint64_t t0 = now_ns();
    for (;;) {
#pragma unroll
        for (int s = 0; s < S; s++) {
            const Word* p = part + static_cast<int64_t>(s) * a.H + e;
#pragma unroll
            for (int i = 0; i < 4; i++) ld_words2(p + 2 * i, w[s][2 * i], w[s][2 * i + 1]);
        }
        if (i_ml < 2 * S) ml = ld_word(mlp);
        bool ok = i_ml >= 2 * S || tag_word(ml) == want;
#pragma unroll
        for (int s = 0; s < S; s++) {
#pragma unroll
            for (int i = 0; i < 8; i++) ok = ok && tag_word(w[s][i]) == want;
        }
        // (The lanes leave together: a lane gone would leave the others' votes waiting.)
        if (__all_sync(0xffffffffu, ok) || __any_sync(0xffffffffu, give_up(a, t0, kWaitAttn))) {
            break;
        }
    }
    const float mine = val_word(ml);
    const int base = lane & ~7;
    float ms[S], ls[S], m = -INFINITY;
#pragma unroll
    for (int s = 0; s < S; s++) {
        ms[s] = __shfl_sync(0xffffffffu, mine, base + 2 * s);
        ls[s] = __shfl_sync(0xffffffffu, mine, base + 2 * s + 1);
        m = fmaxf(m, ms[s]);
    }
    float l = 0.0f, sum[8] = {};
#pragma unroll
    for (int s = 0; s < S; s++) {
        const float f = ms[s] == -INFINITY ? 0.0f : __expf(ms[s] - m);
        l += f * ls[s];
#pragma unroll
        for (int i = 0; i < 8; i++) sum[i] += f * val_word(w[s][i]);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = l > 0.0f ? sum[i] / l : 0.0f;
}

// A product's input, a warp's slice of it into registers: lane l holds in[k0 + 256 j + 8 l + c]
// as v[8 j + c] (j < 4, c < 8). K = n_embd: the warps wait for 256 values each (those of warp
// w * 256 < H) and share them through shared memory (xs), with the RMS norm's sum of squares
// summed there; down (K = n_ff) reads its own 1024 values. wo merges the attention's `splits`
// blocks a head (merge_words).
__device__ void load_input(const Args& a, const Phase& ph, unsigned epoch, int splits, int k0,
                           float* xs, float* red, float (&v)[32]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned want = tag_of(epoch, ph.in);
    if (ph.kind == kDownK) {
        wait_words<4>(a, a.h + k0 + 8 * lane, want, v, kWaitH);
        return;
    }
    const bool norm = ph.kind != kWoK;
    const bool mine = warp * 256 < a.H;
    float g[8], u[8];
    if (norm && mine) {
        const float4* gp = reinterpret_cast<const float4*>(ph.norm + warp * 256 + 8 * lane);
        const float4 g0 = __ldg(gp), g1 = __ldg(gp + 1);
        g[0] = g0.x, g[1] = g0.y, g[2] = g0.z, g[3] = g0.w;
        g[4] = g1.x, g[5] = g1.y, g[6] = g1.z, g[7] = g1.w;
    }
    float ss = 0.0f;
    if (mine) {
        if (ph.in < 0) {
            // The step's input row, written before this launch began.
            const float4* src = reinterpret_cast<const float4*>(a.x0 + warp * 256 + 8 * lane);
            const float4 lo = src[0], hi = src[1];
            u[0] = lo.x, u[1] = lo.y, u[2] = lo.z, u[3] = lo.w;
            u[4] = hi.x, u[5] = hi.y, u[6] = hi.z, u[7] = hi.w;
        } else if (norm || splits == 1) {
            wait_words<1>(a, (norm ? a.x : a.attn) + warp * 256 + 8 * lane, want, u,
                          norm ? kWaitX : kWaitAttn);
        } else if (splits == 2) {
            merge_words<2>(a, warp * 256 + 8 * lane, want, u);
        } else {
            merge_words<4>(a, warp * 256 + 8 * lane, want, u);
        }
        if (norm) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                ss += u[i] * u[i];
                u[i] *= g[i];  // rmsnorm(x) g = (x g) / rms(x)
            }
        }
        float4* dst = reinterpret_cast<float4*>(xs + warp * 256 + 8 * lane);
        dst[0] = make_float4(u[0], u[1], u[2], u[3]);
        dst[1] = make_float4(u[4], u[5], u[6], u[7]);
    }
    if (norm) {
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
    }
    consumers_sync<kConsumers>();
    float inv = 1.0f;
    if (norm) {
        float s = 0.0f;
        for (int w = 0; w < kConsumers; w++) s += red[w];
        inv = rsqrtf(s / static_cast<float>(a.H) + a.eps);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float4* src = reinterpret_cast<const float4*>(xs + k0 + 256 * j + 8 * lane);
        const float4 lo = src[0], hi = src[1];
        v[8 * j + 0] = lo.x * inv;
        v[8 * j + 1] = lo.y * inv;
        v[8 * j + 2] = lo.z * inv;
        v[8 * j + 3] = lo.w * inv;
        v[8 * j + 4] = hi.x * inv;
        v[8 * j + 5] = hi.y * inv;
        v[8 * j + 6] = hi.z * inv;
        v[8 * j + 7] = hi.w * inv;
    }
}

__device__ __forceinline__ bool masked(const __half m) {
    return __hisinf(m) < 0;
}

// One past the last key of [0, n_kv) the mask lets through (0: none), found by each warp alone
// (the same in every warp): a lane loads 8 mask values at once (up to 1,024 keys in 4 loads).
// A session's attended length is padded (256 keys on a GPU): stop 55 (H100, 1B F16, tg128) the
// masked keys past the position cost the step 2% at 256 keys against 144, though none of
// their rows is loaded.
__device__ __forceinline__ int visible_end(const __half* mask, int n_kv) {
    const int lane = threadIdx.x % 32;
    int last = -1;
    if (n_kv % 8 == 0 && reinterpret_cast<uintptr_t>(mask) % 16 == 0) {
        uint4 w[kMaxKeys / 256];
#pragma unroll
        for (int i = 0; i < kMaxKeys / 256; i++) {
            const int j0 = 8 * (lane + 32 * i);
            w[i] = j0 < n_kv ? __ldg(reinterpret_cast<const uint4*>(mask + j0)) : uint4{};
        }
#pragma unroll
        for (int i = 0; i < kMaxKeys / 256; i++) {
            const int j0 = 8 * (lane + 32 * i);
            const __half* h = reinterpret_cast<const __half*>(&w[i]);
#pragma unroll
            for (int c = 0; c < 8; c++) {
                if (j0 + c < n_kv && !masked(h[c])) last = j0 + c;
            }
        }
    } else {
        for (int j = lane; j < n_kv; j += 32) {
            if (!masked(mask[j])) last = j;
        }
    }
    return __reduce_max_sync(0xffffffffu, last) + 1;
}

// One head's attention, split s of S: the cache rows j = s + S k of [0, n_vis) (n_vis: one past
// the last key the mask lets through; split k-th key: every split sees its share of the visible
// keys whatever the position), each score plus the mask's value; the key and value at the step's
// position are the ones q/k/v just made (as F16, the value the cache holds). A thread a key (its
// 128 bytes in 8 loads at once), then a warp a value at a time (a lane 2 of its dimensions). The
// first kEarlyKeys keys and each warp's first kEarlyValues values load before the wait for q (they
// do not depend on it): with four splits, every key and value of up to 1,024 (stop 54: one block a
// head, the rest loaded after the wait, made tg1024 slower than the kernel plan). One split stores
// the head's output; more store their sums unscaled, with their max score and sum of weights, which
// wo's input read merges (merge_words).
__device__ void attention(const Args& a, const Phase& ph, int pi, int h, int s, int S,
                          unsigned epoch, int pos, float* sm, float* red) {
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const __half* mask = ph.last ? a.mask_last : a.mask;
    const int n_vis = visible_end(mask, a.n_kv);            // keys past it: never attended
    const int n = n_vis > s ? (n_vis - s + S - 1) / S : 0;  // this split's keys
    auto key = [&](int k) { return s + S * k; };
    const int hk = h / (a.n_head / a.n_head_kv);
    float* q = sm;        // [kD]
    float* kn = sm + kD;  // the new key, then the new value
    float* vn = kn + kD;
    float* p = vn + kD;          // [n]
    float* part = p + kMaxKeys;  // [kConsumers][kD]
    const __half* kbase = ph.kc + static_cast<int64_t>(hk) * kD;
    const __half2* vbase =
        reinterpret_cast<const __half2*>(ph.vc + static_cast<int64_t>(hk) * kD) + lane;
    const int64_t row2 = a.cache_row / 2;
    auto visible = [&](int j) { return j != pos && !masked(mask[j]); };  // (and cached)
    // (Selects, not conditional stores: a value kept when not loaded made them spill.)
    uint4 kr[kD / 8];
    __half2 vr[kEarlyValues];
    const bool kt = t < n && t < kEarlyKeys && visible(key(t));
    if (kt) {
        const uint4* k = reinterpret_cast<const uint4*>(kbase + key(t) * a.cache_row);
#pragma unroll
        for (int i = 0; i < kD / 8; i++) kr[i] = __ldg(k + i);
    }
#pragma unroll
    for (int i = 0; i < kEarlyValues; i++) {
        const int k = warp + kConsumers * i;
        vr[i] = k < n && visible(key(k)) ? __ldg(vbase + key(k) * row2) : __half2{};
    }
    const unsigned want = tag_of(epoch, ph.in);
    if (t < kD) {
        const int kvd = a.n_head_kv * kD;
        q[t] = wait_word(a, a.qkv + h * kD + t, want, kWaitQkv);
        kn[t] = __half2float(__float2half(wait_word(a, a.qkv + a.H + hk * kD + t, want, kWaitQkv)));
        vn[t] = __half2float(
            __float2half(wait_word(a, a.qkv + a.H + kvd + hk * kD + t, want, kWaitQkv)));
    }
    consumers_sync<kConsumers>();
    stamp(a, pi, 1);  // (the attention's input read: its hop from q/k/v)
    auto dot_key = [&](const uint4* w) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < kD / 8; i++) {
            const __half2* h2 = reinterpret_cast<const __half2*>(&w[i]);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float2 f = __half22float2(h2[c]);
                d += q[8 * i + 2 * c] * f.x + q[8 * i + 2 * c + 1] * f.y;
            }
        }
        return d;
    };
    float m = -INFINITY;
    for (int k = t; k < n; k += 32 * kConsumers) {
        const int j = key(k);
        float sc = -INFINITY;
        if (!masked(mask[j])) {
            float d = 0.0f;
            if (j == pos) {
                for (int e = 0; e < kD; e++) d += q[e] * kn[e];
            } else if (k == t && kt) {
                d = dot_key(kr);
            } else {
                const uint4* kp = reinterpret_cast<const uint4*>(kbase + j * a.cache_row);
                uint4 w[kD / 8];
#pragma unroll
                for (int i = 0; i < kD / 8; i++) w[i] = __ldg(kp + i);
                d = dot_key(w);
            }
            sc = d * a.kq_scale + __half2float(mask[j]);
        }
        p[k] = sc;
        m = fmaxf(m, sc);
    }
    m = consumers_max<kConsumers>(m, red);
    float l = 0.0f;
    for (int k = t; k < n; k += 32 * kConsumers) {
        const float e = p[k] == -INFINITY ? 0.0f : __expf(p[k] - m);
        p[k] = e;
        l += e;
    }
    l = consumers_sum<kConsumers>(l, red);
    float2 o = make_float2(0.0f, 0.0f);
    auto add_value = [&](int k, float2 v) {
        o.x += p[k] * v.x;
        o.y += p[k] * v.y;
    };
    const float2 vnew = make_float2(vn[2 * lane], vn[2 * lane + 1]);
#pragma unroll
    for (int i = 0; i < kEarlyValues; i++) {
        const int k = warp + kConsumers * i;
        if (k < n && p[k] != 0.0f) add_value(k, key(k) == pos ? vnew : __half22float2(vr[i]));
    }
    // The rest kValueBatch at a time, each round's loads issued together (stop 53: one value
    // at a time made tg512 slower than the kernel plan), summed in the same order as before.
    for (int k0 = warp + kConsumers * kEarlyValues; k0 < n; k0 += kConsumers * kValueBatch) {
        __half2 vb[kValueBatch];
#pragma unroll
        for (int u = 0; u < kValueBatch; u++) {
            const int k = k0 + kConsumers * u;
            vb[u] =
                k < n && key(k) != pos && p[k] != 0.0f ? __ldg(vbase + key(k) * row2) : __half2{};
        }
#pragma unroll
        for (int u = 0; u < kValueBatch; u++) {
            const int k = k0 + kConsumers * u;
            if (k < n && p[k] != 0.0f) add_value(k, key(k) == pos ? vnew : __half22float2(vb[u]));
        }
    }
    part[warp * kD + 2 * lane] = o.x;
    part[warp * kD + 2 * lane + 1] = o.y;
    consumers_sync<kConsumers>();
    stamp(a, pi, 2);  // (its sums done, before its stores)
    const unsigned mine = tag_of(epoch, pi);
    if (t < kD) {
        float sum = 0.0f;
        for (int w = 0; w < kConsumers; w++) sum += part[w * kD + t];
        if (S == 1) {
            st_word(a.attn + h * kD + t, l > 0.0f ? sum / l : 0.0f, mine);
        } else {
            st_word(a.part + static_cast<int64_t>(s) * a.H + h * kD + t, sum, mine);
            if (t == 0) {
                Word* ml = a.ml + 2 * (static_cast<int64_t>(s) * a.n_head + h);
                st_word(ml, m, mine);
                st_word(ml + 1, l, mine);
            }
        }
    }
}

// A q/k/v row's value as stored: q and k rows roped (`other`: the row paired with it, in the
// same tile), k and v rows also written into the layer's caches at the step's position.
// rope: the step's (cos, sin) of each pair (rope_cos_sin, once a launch).
__device__ __forceinline__ float qkv_row(const Args& a, const Phase& ph, int64_t row, float v,
                                         float other, int pos, const float2* rope) {
    const int kvd = a.n_head_kv * kD;
    const int d = static_cast<int>(row % kD);
    if (row < a.H + kvd && d < a.n_rot) {
        const float2 r = rope[d / 2];
        v = d % 2 == 0 ? v * r.x - other * r.y : other * r.y + v * r.x;
    }
    if (row >= a.H) {
        const int64_t r = row - a.H;
        if (pos >= 0 && pos < a.cache_rows) {
            __half* c = r < kvd ? ph.kc + r : ph.vc + (r - kvd);
            c[pos * a.cache_row] = __float2half(v);
        } else if (r == 0) {
            report_error(a.err, Op::SET_ROWS, pos, a.cache_rows, 0);
        }
    }
    return v;
}

// Block b's tiles of a phase: consecutive, in whole groups (Phase::group).
struct Share {
    int64_t first, count;
};
__device__ __forceinline__ Share share_of(const Phase& ph, int b, int nb) {
    const int64_t groups = ph.tiles / ph.group;
    const int64_t lo = groups * b / nb * ph.group, hi = groups * (b + 1) / nb * ph.group;
    return {lo, hi - lo};
}

// Bf16: every weight is BF16, else F16 (the only difference: tile_dot's conversion).
template <bool Bf16>
__global__ void __launch_bounds__(kThreads, 1) k_persist(Args a) {
    extern __shared__ __align__(128) unsigned char smem[];
    const SmemLayout L{a.max_tiles};
    unsigned char* ring = smem;
    float* scratch = reinterpret_cast<float*>(smem + L.scratch());
    float* red = reinterpret_cast<float*>(smem + L.red());
    float* part = reinterpret_cast<float*>(smem + L.part());
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.barriers());
    uint64_t* empty = full + kStages;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nb = gridDim.x, b = blockIdx.x;
    // The consumers' phase sets the producer's cap on copies in flight (Args::inflight, chain).
    __shared__ int cur_cap_word;
    volatile int* cur_cap = &cur_cap_word;
    const unsigned epoch = *reinterpret_cast<volatile unsigned*>(a.ctl);
    if (threadIdx.x == 0) {
        *cur_cap = phase_cap(a, a.phases[0].kind, false);
        for (int s = 0; s < kStages; s++) {
            psync::mbar_init(full + s, 1);
            psync::mbar_init(empty + s, kConsumers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == kConsumers) {
        // The producer: every tile of this block, in the consumers' order, as fast as the ring
        // frees stages and the cap on copies in flight allows.
        if (lane != 0) return;
        const uint64_t policy = evict_first();
        const bool timed = a.stamps != nullptr;
        int64_t it = 0;
        for (int pi = 0; pi < a.n_phases; pi++) {
            const Phase ph = a.phases[pi];
            if (ph.kind == kAttnK) continue;
            const Share sh = share_of(ph, b, nb);
            const long long c0 = timed ? clock64() : 0;
            long long c_free = 0, c_cap = 0, c_last = c0;
            for (int64_t i = 0; i < sh.count; i++, it++) {
                const int64_t tile = sh.first + i;
                const int s = static_cast<int>(it % kStages);
                const long long w0 = timed ? clock64() : 0;
                mbar_wait(a, empty + s, static_cast<unsigned>((it / kStages) & 1) ^ 1u, kWaitStage);
                const long long w1 = timed ? clock64() : 0;
                const int cap = *cur_cap;
                if (it >= cap) {
                    const int64_t o = it - cap;
                    mbar_wait(a, full + o % kStages, static_cast<unsigned>((o / kStages) & 1),
                              kWaitTile);
                }
                if (timed) {
                    c_last = clock64();
                    c_free += w1 - w0;
                    c_cap += c_last - w1;
                }
                psync::copy_tile(ring + s * kStageBytes, ph.w, ph.seg, ph.paired, tile, full + s,
                                 policy);
            }
            if (timed && sh.count > 0) {
                unsigned long long* q = stamps_of(a, pi);
                q[4] = static_cast<unsigned long long>(c_last - c0);
                q[5] = static_cast<unsigned long long>(c_free);
                q[6] = static_cast<unsigned long long>(c_cap);
                q[7] = static_cast<unsigned long long>(sh.count);
            }
        }
        return;
    }
    // The consumers. Rope's angles are the same in every layer: computed once.
    const int pos = *a.pos;
    // The attention's blocks a head this step: one while it attends to fewer than
    // kOneBlockKeys keys (the splits' merge costs more than it saves there), else a.splits.
    const int splits = pos + 1 < kOneBlockKeys ? 1 : a.splits;
    if (a.out_ids && b == 0 && threadIdx.x == 0 && *a.out_ids != 0) {
        report_error(a.err, Op::GET_ROWS, *a.out_ids, 1, 0);
    }
    __shared__ float2 rope[kD / 2];
    if (static_cast<int>(threadIdx.x) < a.n_rot / 2) {
        rope[threadIdx.x] = rope_cos_sin(static_cast<double>(pos), threadIdx.x, a.n_rot,
                                         a.rope_base, a.rope_scale, a.rope_ff, a.rope_ff_nb0);
    }
    consumers_sync<kConsumers>();
    int64_t it = 0;
    for (int pi = 0; pi < a.n_phases; pi++) {
        const Phase ph = a.phases[pi];
        const bool attends = ph.kind == kAttnK && b < a.n_head * splits;
        if (threadIdx.x == 0) *cur_cap = phase_cap(a, ph.kind, attends);
        if (ph.kind == kAttnK) {
            if (attends) {
                stamp(a, pi, 0);
                attention(a, ph, pi, b % a.n_head, b / a.n_head, splits, epoch, pos, scratch, red);
            }
        } else {
            // A block with no tiles of this phase (wo and down share 128 groups among 132
            // blocks of an H100 or H200 for a 1B model) does not read its input. It must not:
            // a word is stored again, with a later phase's tag, once the phases between have
            // their inputs, and that proves only that the blocks that stored those inputs
            // have read it. A block that stores nothing here could still be waiting for a
            // tag that is gone (the 2 s give-up's error).
            const Share sh = share_of(ph, b, nb);
            if (sh.count == 0) continue;
            const int rows_per_tile = kStageBytes / (2 * ph.K);
            const int warps_per_row = kConsumers / rows_per_tile;
            const int e0 = warp * 1024;
            const int k0 = e0 % ph.K;
            float v[32];
            stamp(a, pi, 0);
            load_input(a, ph, epoch, splits, k0, scratch, red, v);
            stamp(a, pi, 1);
            if (ph.kind == kWoK && threadIdx.x == 0) *cur_cap = a.chain[kChainWo];
            const bool residual = ph.kind == kWoK || ph.kind == kDownK;
            const int my_rows = static_cast<int>(sh.count) * rows_per_tile;
            const int64_t row0 = sh.first * rows_per_tile;
            // wo and down add into x: thread i reads its row's x now (there by the time the
            // input is), so that the rows' stores wait on no round trip.
            const unsigned x_want = tag_of(epoch, ph.x_in);
            Word x_old = 0;
            if (residual && ph.x_in >= 0 && static_cast<int>(threadIdx.x) < my_rows) {
                x_old = ld_word(a.x + row0 + threadIdx.x);
            }
            // Tiles two at a time where two are left: both sums reduced across the warp in 5
            // shuffles (lanes 0-15 end with the first's, 16-31 with the second's).
            int lt = 0;
            while (lt < sh.count) {
                const int s0 = static_cast<int>(it % kStages);
                mbar_wait(a, full + s0, static_cast<unsigned>((it / kStages) & 1), kWaitTile);
                const float d0 = tile_dot<Bf16>(ring + s0 * kStageBytes, e0, lane, v);
                if (lt + 1 < sh.count) {
                    const int s1 = static_cast<int>((it + 1) % kStages);
                    mbar_wait(a, full + s1, static_cast<unsigned>(((it + 1) / kStages) & 1),
                              kWaitTile);
                    const float d1 = tile_dot<Bf16>(ring + s1 * kStageBytes, e0, lane, v);
                    const bool hi = lane & 16;
                    float keep = hi ? d1 : d0;
                    keep += __shfl_xor_sync(0xffffffffu, hi ? d0 : d1, 16);
                    for (int o = 8; o > 0; o /= 2) keep += __shfl_xor_sync(0xffffffffu, keep, o);
                    __syncwarp();
                    if (lane == 0) {
                        mbar_arrive(empty + s0);
                        part[lt * kConsumers + warp] = keep;
                    } else if (lane == 16) {
                        mbar_arrive(empty + s1);
                        part[(lt + 1) * kConsumers + warp] = keep;
                    }
                    it += 2;
                    lt += 2;
                } else {
                    const float d = warp_sum(d0);
                    __syncwarp();
                    if (lane == 0) {
                        mbar_arrive(empty + s0);
                        part[lt * kConsumers + warp] = d;
                    }
                    it++;
                    lt++;
                }
            }
            consumers_sync<kConsumers>();
            stamp(a, pi, 2);
            auto row_sum = [&](int t, int r) {
                float s = 0.0f;
                for (int w = r * warps_per_row; w < (r + 1) * warps_per_row; w++) {
                    s += part[t * kConsumers + w];
                }
                return s;
            };
            const unsigned mine = tag_of(epoch, pi);
            float* const host = ph.kind == kOutK && a.host_logits ? *a.host_logits : nullptr;
            if (ph.kind == kGuK) {
                // A tile: rows_per_tile / 2 gate rows, then their up rows.
                const int half = rows_per_tile / 2;
                for (int i = threadIdx.x; i < lt * half; i += 32 * kConsumers) {
                    const int t = i / half, r = i % half;
                    const float g = row_sum(t, r), u = row_sum(t, half + r);
                    st_word(a.h + (sh.first + t) * half + r, g / (1.0f + __expf(-g)) * u, mine);
                }
            } else {
                for (int i = threadIdx.x; i < my_rows; i += 32 * kConsumers) {
                    const float s = row_sum(i / rows_per_tile, i % rows_per_tile);
                    const int64_t row = row0 + i;
                    switch (ph.kind) {
                        case kQkvK:
                            st_word(a.qkv + row,
                                    qkv_row(a, ph, row, s,
                                            row_sum(i / rows_per_tile, (i % rows_per_tile) ^ 1),
                                            pos, rope),
                                    mine);
                            break;
                        case kOutK:
                            a.logits[row] = s;
                            if (host) host[row] = s;
                            break;
                        default: {  // wo, down: into the residual
                            float old;
                            if (ph.x_in < 0) {
                                old = a.x0[row];
                            } else if (i == static_cast<int>(threadIdx.x) &&
                                       tag_word(x_old) == x_want) {
                                old = val_word(x_old);
                            } else {
                                old = wait_word(a, a.x + row, x_want, kWaitRow);
                            }
                            st_word(a.x + row, old + s, mine);
                            break;
                        }
                    }
                }
            }
        }
        // The next phase may reuse part, the input's copy and the attention's scratch.
        stamp(a, pi, 3);
        consumers_sync<kConsumers>();
    }
    // The launch's last block moves the epoch on for the next launch (every block read it at
    // its start, before it came here).
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(a.ctl + 1, 1u) == static_cast<unsigned>(nb) - 1) {
            a.ctl[1] = 0;
            a.ctl[2] = 0;  // a wait that gave up ended this launch only
            a.ctl[0] = epoch + 1;
        }
    }
}

// The launch counters (Args::ctl).
constexpr size_t kCtlBytes = 4 * sizeof(unsigned);

// Tiles of a matrix of `rows` x K weights of 2 bytes, or 0 when its rows do not fill whole tiles.
int64_t tiles_of(int64_t rows, int K) {
    const int64_t bytes = rows * K * 2;
    return bytes % kStageBytes == 0 ? bytes / kStageBytes : 0;
}

}  // namespace

bool persist_shapes_ok(const PersistModel& m, int n_sm, std::string* why, int smem_max) {
    auto no = [why](const char* w) {
        if (why) *why = w;
        return false;
    };
    auto pow2_between = [](int64_t v, int64_t lo, int64_t hi) {
        return v >= lo && v <= hi && (v & (v - 1)) == 0;
    };
    if (m.layers.empty()) return no("no layers");
    if (!pow2_between(m.n_embd, 1024, kMaxEmbd)) return no("n_embd not 1024 or 2048");
    if (!pow2_between(m.n_ff, 1024, 8192)) return no("n_ff not a power of two in [1024, 8192]");
    if (m.head_dim != kD || m.n_rot != kD) return no("head size or rope dimensions not 64");
    if (m.n_head <= 0 || m.n_head_kv <= 0 || m.n_head % m.n_head_kv != 0 || m.n_head > n_sm ||
        m.n_head * kD != m.n_embd) {
        return no("heads");
    }
    if (m.n_kv <= 0 || m.n_kv > kMaxKeys) return no("more than 1024 keys attended");
    if (static_cast<int64_t>(m.n_kv) > m.cache_rows) return no("keys past the caches' rows");
    const int64_t kvd = int64_t{m.n_head_kv} * kD;
    if (m.cache_row_bytes < kvd * 2 || m.cache_row_bytes % 16 != 0) return no("cache rows");
    const int rpt = kStageBytes / (2 * m.n_embd);
    if (kvd % rpt != 0 || m.n_vocab % rpt != 0) return no("rows not whole tiles");
    for (size_t i = 0; i + 1 < m.layers.size(); i++) {
        if (m.layers[i].mask != m.layers.front().mask) return no("masks");
    }
    const int layers_phases = static_cast<int>(m.layers.size()) * 5 + 1;
    if (layers_phases >= static_cast<int>(kTagPhases)) return no("too many layers");
    if (smem_max <= 0) {
        int dev = 0, coop = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
                cudaSuccess ||
            cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess) {
            cudaGetLastError();
            return no("device attributes");
        }
        if (!coop) return no("no cooperative launch");
    }
    // A block's share of the largest phase (the output) must leave its sums room.
    const int64_t most = tiles_of(m.n_vocab, m.n_embd) / n_sm + 16;
    const SmemLayout L{static_cast<int>(std::min<int64_t>(most, 1 << 20))};
    if (L.bytes() > static_cast<size_t>(smem_max)) return no("shared memory");
    return true;
}

struct Persist::Impl {
    struct Table {
        std::vector<Phase> host;
        Args args{};
        Phase* dev = nullptr;
        size_t smem = 0;
        bool bf16 = false;  // which k_persist
    };
    std::vector<Table> tables;
    std::vector<void*> allocs;  // freed with the backend (captured graphs may name any)
    Word* words = nullptr;      // x, qkv, attn, h, the attention splits' words
    size_t words_cap = 0;
    unsigned* ctl = nullptr;      // Args::ctl
    size_t smem_set[2] = {0, 0};  // each k_persist's dynamic shared memory attribute
    // PersistModel::stamps: the last launch's stamps (Args::stamps) of the last table prepared
    // with them, summed up per phase on stderr when the backend goes.
    unsigned long long* stamps = nullptr;
    size_t stamps_n = 0;
    int stamps_blocks = 0;
    double stamps_clock_khz = 0.0;  // the SMs' clock (cudaDevAttrClockRate): cycles to us
    std::vector<int> stamps_kinds;
    void print_stamps() const;
};

// A line a phase: its blocks' first start, median and last input read, tiles summed and rows
// stored, in us from the launch's first start (over the blocks that stamped the phase in that
// launch); then, over the blocks with tiles in it, the median of the producer's span in the
// phase (us at the SMs' rated clock) and of the shares of that span it waited for a free stage
// (the consumers behind) and under the cap on copies in flight (the copies' latency).
// bench/tools/persist-stamps.py sums the lines up per hop and product.
void Persist::Impl::print_stamps() const {
    std::vector<unsigned long long> h(stamps_n);
    if (cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    const int nb = stamps_blocks;
    constexpr size_t S = kStampSlots;
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < nb; b++) {
        if (h[b * S]) t0 = std::min(t0, h[b * S]);
    }
    static const char* kinds[] = {"qkv", "attn", "wo", "gu", "down", "out"};
    for (size_t pi = 0; pi < stamps_kinds.size(); pi++) {
        std::vector<double> v[4], span, free_share, cap_share;
        for (int b = 0; b < nb; b++) {
            const unsigned long long* q = &h[(pi * nb + b) * S];
            if (q[7] && q[4]) {  // the producer's
                span.push_back(static_cast<double>(q[4]) / stamps_clock_khz * 1e3);
                free_share.push_back(100.0 * static_cast<double>(q[5]) / static_cast<double>(q[4]));
                cap_share.push_back(100.0 * static_cast<double>(q[6]) / static_cast<double>(q[4]));
            }
            if (!q[0] || q[0] < t0) continue;  // (not stamped in that launch)
            for (int i = 0; i < 4; i++) {
                if (q[i]) v[i].push_back(static_cast<double>(q[i] - t0) / 1e3);
            }
        }
        for (std::vector<double>& x : v) std::sort(x.begin(), x.end());
        for (std::vector<double>* x : {&span, &free_share, &cap_share}) {
            std::sort(x->begin(), x->end());
        }
        auto med = [](const std::vector<double>& x) { return x.empty() ? -1.0 : x[x.size() / 2]; };
        auto mx = [](const std::vector<double>& x) { return x.empty() ? -1.0 : x.back(); };
        std::fprintf(stderr,
                     "stamps %3zu %-4s blocks %3zu start %8.1f input %8.1f (max %8.1f) tiles %8.1f "
                     "(max %8.1f) end %8.1f (max %8.1f) producer %8.1f free %5.1f%% cap %5.1f%%\n",
                     pi, kinds[stamps_kinds[pi]], v[0].size(), v[0].empty() ? -1.0 : v[0].front(),
                     med(v[1]), mx(v[1]), med(v[2]), mx(v[2]), med(v[3]), mx(v[3]), med(span),
                     med(free_share), med(cap_share));
    }
}

Persist::Persist() : impl_(std::make_unique<Impl>()) {}
Persist::~Persist() {
    if (impl_->stamps) {
        impl_->print_stamps();
        cudaFree(impl_->stamps);
    }
    for (const Impl::Table& t : impl_->tables) cudaFree(t.dev);
    for (void* p : impl_->allocs) cudaFree(p);
    cudaFree(impl_->ctl);
}

Status Persist::prepare(const PersistModel& m, int device, int n_sm, int* id) {
    Impl& I = *impl_;
    const int H = m.n_embd, kvd = m.n_head_kv * kD;
    const int64_t n_qkv = H + 2 * int64_t{kvd};
    // The phases, as bench_cuda_persist builds them.
    std::vector<Phase> ph;
    auto product = [&](int kind, std::initializer_list<const void*> w,
                       std::initializer_list<int64_t> rows, int K, const float* norm, int in,
                       int x_in, bool paired, const PersistLayer* l) {
        Phase p;
        std::memset(&p, 0, sizeof(p));  // (tables are compared as bytes)
        p.kind = kind;
        int i = 0;
        auto r = rows.begin();
        for (const void* wi : w) {
            p.w[i] = static_cast<const unsigned char*>(wi);
            p.seg[i] = tiles_of(*r, K);
            if (p.seg[i] == 0) p.tiles = -1;  // (declined below)
            i++;
            ++r;
        }
        // Paired: a tile holds half a tile's rows of each matrix, so there are as many tiles
        // as the two matrices fill.
        if (p.tiles == 0) p.tiles = p.seg[0] + p.seg[1] + p.seg[2];
        p.paired = paired;
        p.K = K;
        p.norm = norm;
        p.in = in;
        p.x_in = x_in;
        if (l) {
            p.kc = static_cast<__half*>(l->kc);
            p.vc = static_cast<__half*>(l->vc);
        }
        // Whole 128-byte lines of the words a block stores: 16 words.
        const int rpt = kStageBytes / (2 * K);
        const int stored = paired ? rpt / 2 : rpt;
        int g = kind == kQkvK ? std::max(1, 8 / rpt) : kind == kOutK ? 1 : std::max(1, 16 / stored);
        while (g > 1 && p.tiles > 0 && p.tiles % g != 0) g /= 2;
        p.group = g;
        ph.push_back(p);
        return static_cast<int>(ph.size()) - 1;
    };
    int x_last = -1;
    for (const PersistLayer& l : m.layers) {
        const int qkv = product(kQkvK, {l.wq, l.wk, l.wv}, {H, kvd, kvd}, H, l.attn_norm, x_last,
                                -1, false, &l);
        Phase at;
        std::memset(&at, 0, sizeof(at));
        at.kind = kAttnK;
        at.in = qkv;
        at.kc = static_cast<__half*>(l.kc);
        at.vc = static_cast<__half*>(l.vc);
        at.last = &l == &m.layers.back();
        at.group = 1;
        ph.push_back(at);
        const int attn = static_cast<int>(ph.size()) - 1;
        const int wo = product(kWoK, {l.wo}, {H}, H, nullptr, attn, x_last, false, nullptr);
        const int gu =
            product(kGuK, {l.gate, l.up}, {m.n_ff, m.n_ff}, H, l.ffn_norm, wo, -1, true, nullptr);
        x_last = product(kDownK, {l.down}, {H}, m.n_ff, nullptr, gu, wo, false, nullptr);
    }
    product(kOutK, {m.w_out}, {m.n_vocab}, H, m.out_norm, x_last, -1, false, nullptr);
    int max_tiles = 0;
    for (Phase& p : ph) {
        if (p.kind == kAttnK) continue;
        if (p.tiles <= 0) return Status::errorf("persistent decode: a phase of no whole tiles");
        const int64_t groups = p.tiles / p.group;
        max_tiles =
            std::max<int>(max_tiles, static_cast<int>((groups + n_sm - 1) / n_sm * p.group));
    }
    // The attention's blocks a head: as many as the SMs take, up to m.splits (0: kMaxSplits).
    const int most_splits = m.splits > 0 ? std::min(m.splits, kMaxSplits) : kMaxSplits;
    int splits = 1;
    while (splits * 2 <= most_splits && m.n_head * splits * 2 <= n_sm) splits *= 2;
    const size_t split_words =
        splits > 1 ? static_cast<size_t>(splits) * (static_cast<size_t>(H) + 2 * m.n_head) : 0;
    // The words (x, qkv, attn, h, the splits'), grown when a larger model comes; the old ones
    // stay allocated (a captured graph may still name them).
    const size_t words = static_cast<size_t>(H) + static_cast<size_t>(n_qkv) +
                         static_cast<size_t>(m.n_head) * kD + static_cast<size_t>(m.n_ff) +
                         split_words;
    if (cudaSetDevice(device) != cudaSuccess) {
        return Status::errorf("persistent decode: cudaSetDevice(%d) failed", device);
    }
    if (!I.ctl) {
        void* p = nullptr;
        PERSIST_TRY(cudaMalloc(&p, kCtlBytes), "persistent decode: counters");
        PERSIST_TRY(cudaMemset(p, 0, kCtlBytes), "persistent decode: counters");
        I.ctl = static_cast<unsigned*>(p);
        const unsigned one = 1;  // epoch 1 first: no word is left with a tag of epoch 0
        PERSIST_TRY(cudaMemcpy(I.ctl, &one, sizeof(one), cudaMemcpyHostToDevice),
                    "persistent decode: counters");
    }
    if (I.words_cap < words) {
        void* p = nullptr;
        PERSIST_TRY(cudaMalloc(&p, words * sizeof(Word)), "persistent decode: %zu words", words);
        PERSIST_TRY(cudaMemset(p, 0, words * sizeof(Word)), "persistent decode: words");
        if (I.words) I.allocs.push_back(I.words);
        I.words = static_cast<Word*>(p);
        I.words_cap = words;
    }
    Args a{};
    a.n_phases = static_cast<int>(ph.size());
    a.max_tiles = max_tiles;
    a.H = H;
    a.n_head = m.n_head;
    a.n_head_kv = m.n_head_kv;
    a.n_kv = m.n_kv;
    a.x = I.words;
    a.qkv = a.x + H;
    a.attn = a.qkv + n_qkv;
    a.h = a.attn + static_cast<int64_t>(m.n_head) * kD;
    a.splits = splits;
    a.part = a.h + m.n_ff;  // (every offset even: ld_words2's 16 bytes stay aligned)
    a.ml = a.part + static_cast<int64_t>(splits) * H;
    a.x0 = m.x0;
    a.logits = m.logits;
    a.pos = m.pos;
    a.out_ids = m.out_ids;
    a.mask = reinterpret_cast<const __half*>(m.layers.front().mask);
    a.mask_last = reinterpret_cast<const __half*>(m.layers.back().mask);
    a.cache_rows = m.cache_rows;
    a.cache_row = m.cache_row_bytes / 2;
    a.eps = m.eps;
    a.kq_scale = m.kq_scale;
    a.n_rot = m.n_rot;
    a.rope_base = m.rope_base;
    a.rope_scale = m.rope_scale;
    a.rope_ff = m.rope_ff;
    a.rope_ff_nb0 = m.rope_ff_nb0;
    a.ctl = I.ctl;
    a.host_logits = nullptr;  // (the launch's OpContext::host_out)
    a.stamps = nullptr;
    if (m.stamps) {
        const size_t n = ph.size() * static_cast<size_t>(n_sm) * kStampSlots;
        if (I.stamps_n < n) {
            cudaFree(I.stamps);
            I.stamps = nullptr;
            I.stamps_n = 0;
            PERSIST_TRY(cudaMalloc(&I.stamps, n * 8), "persistent decode: stamps");
            I.stamps_n = n;
        }
        PERSIST_TRY(cudaMemset(I.stamps, 0, I.stamps_n * 8), "persistent decode: stamps");
        I.stamps_blocks = n_sm;
        int khz = 0;
        PERSIST_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device),
                    "persistent decode: the SMs' clock");
        I.stamps_clock_khz = khz > 0 ? khz : 1.0;
        I.stamps_kinds.clear();
        for (const Phase& p : ph) I.stamps_kinds.push_back(p.kind);
        a.stamps = I.stamps;
    }
    auto cap = [](int v, int d) { return v > 0 ? std::min(v, kStages - 1) : d; };
    a.inflight = cap(m.inflight, kInflight);
    for (int i = 0; i < kChainParts; i++) a.chain[i] = cap(m.chain[i], kChainInflight);
    a.out_inflight = cap(m.out_inflight, a.inflight);
    const size_t table_bytes = ph.size() * sizeof(Phase);
    for (size_t i = 0; i < I.tables.size(); i++) {
        Impl::Table& t = I.tables[i];
        if (t.bf16 == m.bf16 && t.host.size() == ph.size() &&
            std::memcmp(t.host.data(), ph.data(), table_bytes) == 0) {
            a.phases = t.dev;
            t.args = a;
            *id = static_cast<int>(i);
            return Status::ok();
        }
    }
    void* p = nullptr;
    PERSIST_TRY(cudaMalloc(&p, table_bytes), "persistent decode: phases");
    const cudaError_t ce = cudaMemcpy(p, ph.data(), table_bytes, cudaMemcpyHostToDevice);
    const size_t smem = SmemLayout{max_tiles}.bytes();
    // (The function's attribute: the most any table needs, so that every table's launch fits.)
    auto* const kernel = m.bf16 ? k_persist<true> : k_persist<false>;
    size_t& smem_set = I.smem_set[m.bf16 ? 1 : 0];
    const size_t most = std::max(smem, smem_set);
    const cudaError_t fe =
        ce != cudaSuccess
            ? ce
            : cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(most));
    int per_sm = 0;
    const cudaError_t oe = fe != cudaSuccess ? fe
                                             : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                                   &per_sm, kernel, kThreads, smem);
    if (oe != cudaSuccess || per_sm < 1) {
        cudaGetLastError();
        cudaFree(p);
        return Status::errorf(
            "persistent decode: its table, %zu bytes of shared memory or a block a SM: %s", smem,
            oe != cudaSuccess ? cudaGetErrorString(oe) : "no block fits");
    }
    smem_set = most;
    Impl::Table t;
    t.bf16 = m.bf16;
    t.host = std::move(ph);
    t.dev = static_cast<Phase*>(p);
    t.smem = smem;
    a.phases = t.dev;
    t.args = a;
    I.tables.push_back(std::move(t));
    *id = static_cast<int>(I.tables.size()) - 1;
    return Status::ok();
}

Status Persist::launch(const OpContext& ctx, int id) const {
    const Impl::Table& t = impl_->tables[static_cast<size_t>(id)];
    Args a = t.args;
    a.err = ctx.err;
    a.host_logits = ctx.host_out;
    ctx.host_out_taken = ctx.host_out != nullptr;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(ctx.n_sm));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = t.smem;
    cfg.stream = ctx.stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, t.bf16 ? k_persist<true> : k_persist<false>, a);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return Status::errorf("CUDA: persistent decode step: launch failed: %s",
                              cudaGetErrorString(e));
    }
    return Status::ok();
}

}  // namespace ferry::cuda
