// Scratch bytes per node for the CPU kernels (the backend allocates the maximum over a graph
// once and shares it: each kernel slices it per thread).
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

// Defined next to their kernels.
size_t copy_work_size(const Tensor* node, int n_threads);
size_t rope_work_size(const Tensor* node, int n_threads);
size_t flash_attn_work_size(const Tensor* node, int n_threads);
size_t top_k_work_size(const Tensor* node, int n_threads);

size_t work_size(const Tensor* node, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    // Sized from what will actually be computed: a node with no elements, or with an empty
    // source, runs no kernel work and needs no scratch whatever its other extents declare.
    if (node->nelements() == 0) return 0;
    for (int i = 0; i < kMaxSrc; i++) {
        if (node->src[i] && node->src[i]->nelements() == 0) return 0;
    }
    switch (node->op) {
        case Op::CPY:
        case Op::CONT:
            return copy_work_size(node, n_threads);
        case Op::ROPE:
            return rope_work_size(node, n_threads);
        case Op::FLASH_ATTN_EXT:
            return flash_attn_work_size(node, n_threads);
        case Op::MUL_MAT:
            return mul_mat_work_size(node, n_threads);
        case Op::TOP_K:
            return top_k_work_size(node, n_threads);
        default:
            return 0;
    }
}

}  // namespace ferry::cpu
