// CPY (src's elements, in logical order, into dst's logical order, converting types) and CONT
// (a contiguous copy of any layout). Plain types: one thread per element, any strides on either
// side. Block formats (either side): whole rows of equal length, one thread per 32 elements.
#include <algorithm>

#include "backends/cuda/ops/common.cuh"
#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

namespace {

__device__ __forceinline__ const char* elem_addr(const TV& t, int64_t k, size_t ts) {
    const int64_t i0 = k % t.ne[0];
    int64_t r = k / t.ne[0];
    const int64_t i1 = r % t.ne[1];
    r /= t.ne[1];
    const int64_t i2 = r % t.ne[2], i3 = r / t.ne[2];
    return t.p + i0 * static_cast<int64_t>(ts) + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

__global__ void k_copy_plain(TV d, Type dt, TV s, Type st, int64_t n) {
    const size_t sts = st == Type::F32 || st == Type::I32 ? 4 : 2;
    const size_t dts = dt == Type::F32 || dt == Type::I32 ? 4 : 2;
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        // Strides: nb[0] may differ from the type size (transposed views): use it.
        TV ss = s, dd = d;
        const char* sp = elem_addr(ss, k, 0) + (k % s.ne[0]) * s.nb[0];
        char* dp = const_cast<char*>(elem_addr(dd, k, 0)) + (k % d.ne[0]) * d.nb[0];
        if (st == dt) {
            if (sts == 4) {
                *reinterpret_cast<uint32_t*>(dp) = *reinterpret_cast<const uint32_t*>(sp);
            } else {
                *reinterpret_cast<uint16_t*>(dp) = *reinterpret_cast<const uint16_t*>(sp);
            }
        } else {
            store_plain(dt, dp, 0, load_elem(st, sp, 0));
        }
        (void)dts;
    }
}

__device__ __forceinline__ int64_t row_offset(const TV& t, int64_t r) {
    const int64_t i1 = r % t.ne[1], i2 = (r / t.ne[1]) % t.ne[2], i3 = r / (t.ne[1] * t.ne[2]);
    return i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

__host__ __device__ inline int block_bytes(Type t) {
    switch (t) {
        case Type::Q4_0:
            return 18;
        case Type::Q4_1:
            return 20;
        case Type::Q8_0:
            return 34;
        case Type::Q4_K:
            return 144;
        case Type::Q5_K:
            return 176;
        case Type::Q6_K:
            return 210;
        case Type::F32:
        case Type::I32:
            return 4;
        default:
            return 2;
    }
}

// Rows of ne0 elements with a block format on at least one side; one thread per 32 elements
// (a whole block of the source when it is a K format is decoded element by element).
__global__ void k_copy_rows(TV d, Type dt, TV s, Type st, int64_t rows) {
    const int64_t per_row = s.ne[0] / 32;
    const int64_t n = rows * per_row;
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = k / per_row, c = k % per_row;  // row, 32-element chunk
        const char* srow = s.p + row_offset(s, r);
        char* drow = d.p + row_offset(d, r);
        const bool sq = st == Type::Q4_0 || st == Type::Q4_1 || st == Type::Q8_0 ||
                        st == Type::Q4_K || st == Type::Q5_K || st == Type::Q6_K;
        const bool dq = dt == Type::Q4_0 || dt == Type::Q4_1 || dt == Type::Q8_0 ||
                        dt == Type::Q4_K || dt == Type::Q5_K || dt == Type::Q6_K;
        if (st == dt) {
            // Same block format: move bytes. K formats: the thread of chunk c moves its share
            // of the 256-element block (bytes [c8 * bb / 8, (c8 + 1) * bb / 8)).
            const int bb = block_bytes(st);
            const bool kq = st == Type::Q4_K || st == Type::Q5_K || st == Type::Q6_K;
            int64_t from, to;
            if (kq) {
                const int64_t blk = c / 8, part = c % 8;
                from = blk * bb + part * bb / 8;
                to = blk * bb + (part + 1) * bb / 8;
            } else {
                from = c * bb;
                to = from + bb;
            }
            for (int64_t b = from; b < to; b++) drow[b] = srow[b];
            continue;
        }
        float x[32];
        for (int j = 0; j < 32; j++) x[j] = load_elem(st, srow, 32 * c + j);
        if (dq) {
            quantize_block(dt, x, drow + c * block_bytes(dt));
        } else {
            for (int j = 0; j < 32; j++) store_plain(dt, drow, 32 * c + j, x[j]);
        }
        (void)sq;
    }
}

bool is_block(Type t) {
    return t != Type::F32 && t != Type::F16 && t != Type::BF16 && t != Type::I32;
}

Status copy(OpContext& ctx, const Tensor* d, const Tensor* s, const char* name) {
    const int64_t n = s->nelements();
    if (n == 0) return Status::ok();
    if (!is_block(s->type) && !is_block(d->type)) {
        const unsigned grid = std::min(n_blocks(n, 256), 4096u);
        k_copy_plain<<<grid, 256, 0, ctx.stream>>>(tv(d), d->type, tv(s), s->type, n);
        return launch_status(name);
    }
    const int64_t rows = s->nrows();
    const int64_t chunks = rows * (s->ne[0] / 32);
    const unsigned grid = std::min(n_blocks(chunks, 128), 4096u);
    k_copy_rows<<<grid, 128, 0, ctx.stream>>>(tv(d), d->type, tv(s), s->type, rows);
    return launch_status(name);
}

}  // namespace

Status op_cpy(OpContext& ctx, const Tensor* dst) {
    return copy(ctx, dst->src[1], dst->src[0], "CPY");
}

Status op_cont(OpContext& ctx, const Tensor* dst) {
    return copy(ctx, dst, dst->src[0], "CONT");
}

namespace {

// A step's staged inputs (CudaBackend::set_tensors_async): one block reads the whole staging
// area from host-mapped pinned memory in 16-byte loads that bypass the caches (one PCIe round
// trip, and never a line left over from the last replay of a captured graph), then copies each
// write from shared memory to its place, and stores the area's sequence number where the host
// looks for it (the area may then be written again). A launch queued ahead of its inputs
// (CudaBackend::compute_ahead) finds the number it copied last (*last, device memory) still in
// the area: it waits until the host writes the next batch (its number last), then reads again.
__global__ void __launch_bounds__(256)
    k_stage_inputs(const uint4* area, uint32_t n16, uint32_t* consumed, uint32_t* last) {
    __shared__ uint4 sm[kInputAreaBytes / 16];
    const uint32_t before = *reinterpret_cast<volatile uint32_t*>(last);
    for (uint32_t i = threadIdx.x; i < n16; i += blockDim.x) sm[i] = __ldcv(area + i);
    __syncthreads();
    // The header's third word is set on a batch written while a launch may already be
    // reading the area (one queued ahead): this read may have caught it half written, so it
    // reads again once the number, written last, has been seen.
    const uint4 head = sm[0];
    __syncthreads();
    if (head.y == before || head.z != 0) {
        if (threadIdx.x == 0 && head.y == before) {
            const unsigned int* seq = reinterpret_cast<const unsigned int*>(area) + 1;
            while (__ldcv(seq) == before) __nanosleep(256);
        }
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < n16; i += blockDim.x) sm[i] = __ldcv(area + i);
        __syncthreads();
    }
    const uint32_t n = sm[0].x, seq = sm[0].y;
    const char* bytes = reinterpret_cast<const char*>(sm);
    const uint32_t limit = n16 * 16;
    for (uint32_t k = 0; k < n && 16 * (k + 2) <= limit; k++) {
        const UploadDesc u = reinterpret_cast<const UploadDesc*>(bytes + 16)[k];
        if (u.off > limit || u.size > limit - u.off) continue;  // never outside the area
        const char* s = bytes + u.off;
        if ((reinterpret_cast<uintptr_t>(u.dst) | u.off | u.size) % 4 == 0) {
            const uint32_t* s4 = reinterpret_cast<const uint32_t*>(s);
            uint32_t* d4 = reinterpret_cast<uint32_t*>(u.dst);
            for (uint32_t i = threadIdx.x; i < u.size / 4; i += blockDim.x) d4[i] = s4[i];
        } else {
            for (uint32_t i = threadIdx.x; i < u.size; i += blockDim.x) u.dst[i] = s[i];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        *last = seq;
        __threadfence_system();
        *reinterpret_cast<volatile uint32_t*>(consumed) = seq;
    }
}

__global__ void k_set_host_out(float** slot, float* p) {
    *slot = p;
}

}  // namespace

Status set_host_out(cudaStream_t st, float** slot, float* p) {
    k_set_host_out<<<1, 1, 0, st>>>(slot, p);
    return launch_status("the host output's address");
}

Status launch_stage_inputs(cudaStream_t st, const void* area, uint32_t bytes, uint32_t* consumed,
                           uint32_t* last) {
    if (bytes < 16 || bytes % 16 != 0 || bytes > kInputAreaBytes) {
        return Status::errorf("staged inputs of %u bytes (16..%zu, a multiple of 16)", bytes,
                              kInputAreaBytes);
    }
    k_stage_inputs<<<1, 256, 0, st>>>(static_cast<const uint4*>(area), bytes / 16, consumed, last);
    return launch_status("stage inputs");
}

}  // namespace ferry::cuda
