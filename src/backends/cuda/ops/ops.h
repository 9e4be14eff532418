// CUDA kernels: one launcher per op (one file per op or op family in this folder), queued on
// the context's stream. Launchers return an error (never abort) for a layout they do not
// handle; supports() is the honest answer the device gives the scheduler before that.
#pragma once

#include "backends/cuda/cuda-backend.h"
#include "ferry/tensor.h"

namespace ferry::cuda {

#define FERRY_CUDA_KERNELS(X) \
    X(cpy)                    \
    X(cont)                   \
    X(get_rows)               \
    X(set_rows)               \
    X(add)                    \
    X(mul)                    \
    X(scale)                  \
    X(rms_norm)               \
    X(norm)                   \
    X(mul_mat)                \
    X(soft_max)               \
    X(rope)                   \
    X(flash_attn_ext)         \
    X(silu)                   \
    X(gelu)                   \
    X(swiglu)                 \
    X(geglu)                  \
    X(argmax)                 \
    X(sum_rows)               \
    X(top_k)

#define X(name) Status op_##name(OpContext& ctx, const Tensor* dst);
FERRY_CUDA_KERNELS(X)
#undef X

// Whether the kernels handle this node (types, layout, sizes). View ops are always fine.
bool supports(const Tensor* node);

// Weight formats without the int8 or streaming kernels, read with the CPU dequantizers'
// formulas: GET_ROWS element by element, decode products through the float kernel's
// decoders (Dec<T>) in column groups of 8, prefill past kMaxVecCols columns dequantized to F16
// by the same decoders for cuBLAS (FERRY_CUDA_ELEM_GEMM=0: column groups at any width). Decode
// slower than the other formats' kernels (bench/results/cuda.md, stops 35 and 39).
inline bool elem_type(Type t) {
    return t == Type::Q5_0 || t == Type::Q5_1 || t == Type::Q2_K || t == Type::Q3_K ||
           t == Type::IQ4_NL || t == Type::IQ4_XS || t == Type::MXFP4;
}

// Scratch bytes a node needs (0 for most ops).
size_t scratch_size(const Tensor* node, int n_sm);
size_t mul_mat_scratch_size(const Tensor* node);
size_t attn_scratch_size(const OpContext& ctx, const Tensor* node);
size_t top_k_scratch_size(const Tensor* node);
// TOP_K's largest k (its sort in shared memory) and rows (one grid dimension).
constexpr int kTopKMaxK = 1024;
constexpr int64_t kTopKMaxRows = 65535;
// A step's small host-to-device writes in one launch (CudaBackend::set_tensors_async). The
// staging area (host-mapped pinned memory, 16-byte aligned, `bytes` of at most
// kInputAreaBytes) holds a header (u32 count, u32 sequence number, u32 "written while a
// launch may read" (nonzero: the kernel reads the area again), 4 unused bytes), `count`
// descriptors, then the data (each write at a 16-byte aligned `off` from the area's start);
// after the copies the kernel stores the sequence number into *consumed (host-mapped) and
// *last (device memory). A launch that finds the area's number equal to *last waits until the
// host writes a new one (a launch queued ahead of its inputs: CudaBackend::compute_ahead).
constexpr size_t kInputAreaBytes = 16 << 10;
struct UploadDesc {
    char* dst;
    uint32_t off, size;
};
static_assert(sizeof(UploadDesc) == 16);
Status launch_stage_inputs(cudaStream_t st, const void* area, uint32_t bytes, uint32_t* consumed,
                           uint32_t* last);
// *slot = p in stream order (one thread): the host memory the launches queued after it store
// the graph's output into (OpContext::host_out), or nullptr.
Status set_host_out(cudaStream_t st, float** slot, float* p);

// Whether a node calls cuBLAS (the backend creates its handle before running it).
bool needs_cublas(const Tensor* node);

// Fusions (fusion.cu): a node sequence the backend runs as one kernel.
//   RMS_NORM(x) -> MUL(., w)          : rms_norm_mul
//   MUL_MAT(a, x) -> ADD(., r)        : mul_mat with a residual added in its epilogue
Status op_rms_norm_mul(OpContext& ctx, const Tensor* norm, const Tensor* mul);
Status op_mul_mat_add(OpContext& ctx, const Tensor* mm, const Tensor* add);
bool can_fuse_rms_norm_mul(const Tensor* norm, const Tensor* mul);
bool can_fuse_mul_mat_add(const Tensor* mm, const Tensor* add);
//   ADD(a, b) -> RMS_NORM -> MUL(., w)  : the residual add, written, then rms_norm_mul of it
Status op_add_rms_norm_mul(OpContext& ctx, const Tensor* add, const Tensor* norm,
                           const Tensor* mul);
bool can_fuse_add_rms_norm_mul(const Tensor* add, const Tensor* norm, const Tensor* mul);
//   MUL_MAT(a, x) -> ROPE and/or SET_ROWS (decode; the int8 kernel for block formats, the
//   float kernel for F16/BF16/F32 weights, sharing the epilogue code): the product's epilogue
//   rotates row pairs and/or stores the row into the KV cache; write_out: the ROPE's (or the
//   product's) own result is written too. Up to 3 such products of one b (q, k, v) run as
//   one launch.
struct EpilogueUnit {
    const Tensor* mm = nullptr;
    const Tensor* rope = nullptr;      // or nullptr
    const Tensor* set_rows = nullptr;  // or nullptr
    bool write_out = false;
};
//   [ADD(a, b) ->] RMS_NORM -> MUL(., w) -> the product(s) reading the MUL (decode, int8 or
//   float kernel): the
//   norm computed in the product kernel's prologue, by every block, in the RMS_NORM kernel's
//   order of operations (bit-identical); the MUL's result is not written, the ADD's is.
struct NormPrologue {
    const Tensor* add = nullptr;  // or nullptr
    const Tensor* norm = nullptr;
    const Tensor* mul = nullptr;
};
// float_kernel: into the float kernel's fused form too (F16/BF16/F32 weights), not only
// the int8 kernel; stream: into the streaming form (F16/BF16 weights, OpContext::mv_stream).
bool can_fold_norm(const NormPrologue& p, const Tensor* mm, bool float_kernel, bool stream);
Status op_mul_mat_norm(OpContext& ctx, const Tensor* mm, const NormPrologue& p);
// Whether a launch of this product (op_mul_mat, or op_mul_mat_norm when folded_norm) stores
// its rows into OpContext::mirror (the streaming form, one column of one matrix).
bool mirror_product_ok(const OpContext& ctx, const Tensor* mm, bool folded_norm);
// The RMS_NORM kernel's block size for rows of n elements.
int norm_threads(int64_t n);
bool can_fuse_mul_mat_epilogue(const Tensor* mm, const Tensor* rope, const Tensor* set_rows);
bool can_join_mul_mat_epilogues(const EpilogueUnit& a, const EpilogueUnit& b);
Status op_mul_mat_epilogue(OpContext& ctx, const EpilogueUnit* units, int n_units,
                           const NormPrologue* pro = nullptr);
//   MUL_MAT(g, x), MUL_MAT(u, x) -> SWIGLU : both products and silu(g x) * (u x) in one pass
Status op_mul_mat_swiglu(OpContext& ctx, const Tensor* gate, const Tensor* up, const Tensor* glu,
                         const NormPrologue* pro = nullptr);
bool can_fuse_swiglu(const Tensor* gate, const Tensor* up, const Tensor* glu);

}  // namespace ferry::cuda
