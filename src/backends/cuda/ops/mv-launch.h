// Internal to MUL_MAT: the host entry points of its matrix-vector kernel families, for the
// dispatch in mul_mat.cu. Each switches on the weight type in the file that holds the family's
// kernel templates, and instantiates the forms mul_mat.cu launched before the files were split
// (one translation unit each, so that they compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/ops/ops.h"

namespace ferry::cuda {

struct MvArgs;  // mv-common.cuh

// mv-float.cu: the float matrix-vector kernel (k_mul_mat_vec), the generic one and the
// prefill's conversion kernels.
// Warps per row of the float kernel for M rows of K elements on n_sm SMs.
int choose_split(int64_t M, int64_t K, int n_sm);
// Any layout: the generic kernel (grid: rows in kRowsPerBlock groups, matrices).
Status launch_vec_generic(OpContext& ctx, const MvArgs& g, Type t, dim3 grid);
// The float kernel, unfused (glu: the gate/up pair), split warps per row.
Status launch_vec_product(OpContext& ctx, const MvArgs& g, Type t, dim3 grid, int split, bool glu);
// The float kernel's fused forms (folded norm, decode epilogue) with the split of M rows.
Status launch_vec_fused_product(OpContext& ctx, const MvArgs& g, Type t, int64_t M, bool glu);
// Prefill (cuBLAS): b's N columns as F16/BF16, and a's M rows of type t dequantized to F16.
void launch_to_half(const char* bm, int64_t bnb1, int64_t K, int64_t N, uint16_t* bh, bool bf16,
                    cudaStream_t st);
Status dequant_f16(Type t, unsigned blocks, cudaStream_t st, const char* am, int64_t nb1, int64_t K,
                   int64_t M, uint16_t* ah);

// mv-int8.cu: the int8 kernel (k_mul_mat_vec_q8): plain, GLU (glu) or with the decode
// epilogue (epi); never both.
Status launch_q8_product(OpContext& ctx, const MvArgs& g, Type t, bool glu, bool epi);

// mv-stream.cu: the streaming and bulk forms.
bool stream_ok(const MvArgs& g, Type t, bool glu);
Status launch_stream(const OpContext& ctx, const MvArgs& g, Type t, bool glu);

}  // namespace ferry::cuda
