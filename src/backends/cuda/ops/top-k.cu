// TOP_K: the k largest values of each row with their indices (ops.def), in two launches.
//
// A row is cut into parts of kTopKPart values. Stage 1 (one block per part) selects each
// part's k best into scratch, in index order; stage 2 (one block per row) selects the k best
// of those, sorts them and writes values then indices. Both stages run one block routine:
//   - values become order keys (uint32, larger key = larger value; NaN as -inf, -0 as +0);
//   - a radix select (four passes of 8 bits, histograms in shared memory) finds T, the k-th
//     largest key, and how many of the keys equal to T are taken (the lowest indices);
//   - one ordered pass writes the keys above T and those first keys equal to T, in index
//     order: each thread takes a contiguous run of positions, and two block scans give each
//     thread its first output slot.
// A part's k best hold every one of the row's k best that lies in it (ties by lower index:
// within a part, indices order as positions), so stage 2 sees them all; its positions are in
// index order too (parts in order, each in index order), so its ties resolve the same way.
#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

constexpr int kTopKThreads = 256;
constexpr int64_t kTopKPart = 4096;  // values a stage-1 block takes

__device__ __forceinline__ uint32_t order_key(float v) {
    if (isnan(v)) v = -INFINITY;
    const uint32_t u = __float_as_uint(v + 0.0f);  // -0 + 0 = +0: zeros tie as on the host
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Exclusive prefix sum over the block (kTopKThreads threads); *total gets the sum.
__device__ uint32_t block_scan(uint32_t v, uint32_t* sh /* >= 32 */, uint32_t* total) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    uint32_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (l >= o) x += y;
    }
    __syncthreads();
    if (l == 31) sh[w] = x;
    __syncthreads();
    if (w == 0) {
        uint32_t s = l < kTopKThreads / 32 ? sh[l] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
            if (l >= o) s += y;
        }
        if (l < kTopKThreads / 32) sh[l] = s;  // inclusive sums of the warps
    }
    __syncthreads();
    const uint32_t before = (w > 0 ? sh[w - 1] : 0) + x - v;
    *total = sh[kTopKThreads / 32 - 1];
    __syncthreads();
    return before;
}

// The k best (key, index) of m positions (k <= m) into out_key / out_idx, in position order.
// key(i) gives position i's order key, idx(i) its index in the row.
template <class Key, class Idx>
__device__ void block_select(Key key, Idx idx, int64_t m, int k, uint32_t* out_key,
                             int32_t* out_idx) {
    __shared__ uint32_t hist[256];
    __shared__ uint32_t sh[32];
    __shared__ uint32_t s_prefix, s_mask, s_left;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_left = static_cast<uint32_t>(k);
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += kTopKThreads) hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for (int64_t i = threadIdx.x; i < m; i += kTopKThreads) {
            const uint32_t q = key(i);
            if ((q & mask) == prefix) atomicAdd(&hist[(q >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // The bin holding the s_left-th largest of the keys that match so far.
            uint32_t above = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (above + hist[b] >= s_left) break;
                above += hist[b];
            }
            s_left -= above;
            s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
            s_mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    const uint32_t t = s_prefix;      // the k-th largest key
    const uint32_t take_eq = s_left;  // of the keys equal to t, the first take_eq are taken

    // Each thread's contiguous run of positions.
    const int64_t run = (m + kTopKThreads - 1) / kTopKThreads;
    const int64_t i0 = static_cast<int64_t>(threadIdx.x) * run;
    const int64_t i1 = i0 + run < m ? i0 + run : m;
    uint32_t gt = 0, eq = 0;
    for (int64_t i = i0; i < i1; i++) {
        const uint32_t q = key(i);
        gt += q > t;
        eq += q == t;
    }
    uint32_t total;
    const uint32_t eq_before = block_scan(eq, sh, &total);
    const uint32_t eq_mine =
        eq_before >= take_eq ? 0 : (take_eq - eq_before < eq ? take_eq - eq_before : eq);
    uint32_t slot = block_scan(gt + eq_mine, sh, &total);
    uint32_t eq_seen = 0;
    for (int64_t i = i0; i < i1; i++) {
        const uint32_t q = key(i);
        if (q > t || (q == t && eq_seen++ < eq_mine)) {
            out_key[slot] = q;
            out_idx[slot] = idx(i);
            slot++;
        }
    }
}

// Stage 1: part blockIdx.x of row blockIdx.y.
__global__ void k_top_k_parts(TV a, int k, int64_t part, int n_parts, uint32_t* cand_key,
                              int32_t* cand_idx) {
    const int64_t r = blockIdx.y;
    const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
    const int64_t first = static_cast<int64_t>(blockIdx.x) * part;
    const int64_t m = a.ne[0] - first < part ? a.ne[0] - first : part;
    const float* x =
        reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]) + first;
    const size_t base = (static_cast<size_t>(r) * n_parts + blockIdx.x) * k;
    uint32_t* ok = cand_key + base;
    int32_t* oi = cand_idx + base;
    if (m < k) {  // a short last part: all of it, then keys below every value's
        for (int64_t i = threadIdx.x; i < k; i += kTopKThreads) {
            ok[i] = i < m ? order_key(x[i]) : 0u;
            oi[i] = i < m ? static_cast<int32_t>(first + i) : 0x7fffffff;
        }
        return;
    }
    block_select([&](int64_t i) { return order_key(x[i]); },
                 [&](int64_t i) { return static_cast<int32_t>(first + i); }, m, k, ok, oi);
}

// Stage 2 (or the only stage, when cand_key is null: the row itself): row blockIdx.x.
__global__ void k_top_k_final(TV d, TV a, int k, int n_parts, const uint32_t* cand_key,
                              const int32_t* cand_idx) {
    extern __shared__ uint32_t top_sh[];  // k keys, then k indices
    uint32_t* tk = top_sh;
    int32_t* ti = reinterpret_cast<int32_t*>(top_sh + k);
    const int64_t r = blockIdx.x;
    if (cand_key) {
        const size_t base = static_cast<size_t>(r) * n_parts * k;
        const uint32_t* ck = cand_key + base;
        const int32_t* ci = cand_idx + base;
        block_select([&](int64_t i) { return ck[i]; }, [&](int64_t i) { return ci[i]; },
                     static_cast<int64_t>(n_parts) * k, k, tk, ti);
    } else {
        const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
        const float* x =
            reinterpret_cast<const float*>(a.p + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
        block_select([&](int64_t i) { return order_key(x[i]); },
                     [&](int64_t i) { return static_cast<int32_t>(i); }, a.ne[0], k, tk, ti);
    }
    __syncthreads();
    // Sorted by rank: larger key first, then lower index (distinct indices: ranks are distinct).
    float* out = reinterpret_cast<float*>(d.p) + static_cast<size_t>(r) * 2 * k;
    for (int j = threadIdx.x; j < k; j += kTopKThreads) {
        const uint32_t q = tk[j];
        const int32_t ix = ti[j];
        int rank = 0;
        for (int o = 0; o < k; o++) rank += tk[o] > q || (tk[o] == q && ti[o] < ix);
        out[rank] = key_value(q);
        out[k + rank] = static_cast<float>(ix);
    }
}

int parts_of(const Tensor* n) {
    const int64_t ne0 = n->src[0]->ne[0];
    return static_cast<int>((ne0 + kTopKPart - 1) / kTopKPart);
}

}  // namespace

size_t top_k_scratch_size(const Tensor* node) {
    if (parts_of(node) <= 1) return 0;
    const size_t k = static_cast<size_t>(node->op_params[0]);
    return static_cast<size_t>(node->src[0]->nrows()) * parts_of(node) * k * 8;
}

Status op_top_k(OpContext& ctx, const Tensor* dst) {
    const Tensor* a = dst->src[0];
    const int64_t rows = a->nrows();
    if (rows == 0) return Status::ok();
    const int k = dst->op_params[0];
    const int n_parts = parts_of(dst);
    const size_t sh = static_cast<size_t>(k) * 8;
    if (n_parts <= 1) {
        k_top_k_final<<<static_cast<unsigned>(rows), kTopKThreads, sh, ctx.stream>>>(
            tv(dst), tv(a), k, 0, nullptr, nullptr);
        return launch_status("TOP_K");
    }
    const size_t need = top_k_scratch_size(dst);
    if (ctx.scratch.size < need) {
        return Status::errorf("CUDA: TOP_K needs %zu bytes of scratch, has %zu", need,
                              ctx.scratch.size);
    }
    const size_t n_cand = static_cast<size_t>(rows) * n_parts * k;
    uint32_t* ck = reinterpret_cast<uint32_t*>(ctx.scratch.ptr);
    int32_t* ci = reinterpret_cast<int32_t*>(ck + n_cand);
    k_top_k_parts<<<dim3(static_cast<unsigned>(n_parts), static_cast<unsigned>(rows)), kTopKThreads,
                    0, ctx.stream>>>(tv(a), k, kTopKPart, n_parts, ck, ci);
    FERRY_TRY(launch_status("TOP_K parts"));
    k_top_k_final<<<static_cast<unsigned>(rows), kTopKThreads, sh, ctx.stream>>>(tv(dst), tv(a), k,
                                                                                 n_parts, ck, ci);
    return launch_status("TOP_K");
}

}  // namespace ferry::cuda
