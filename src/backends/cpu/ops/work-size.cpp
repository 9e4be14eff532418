// Scratch bytes per node for the CPU kernels (the backend allocates the maximum over a graph
// once and shares it: each kernel slices it per thread).
#include "backends/cpu/ops/ops.h"

namespace ferry::cpu {

// Defined next to their kernels.
size_t copy_work_size(const Tensor* node, int n_threads);
size_t rope_work_size(const Tensor* node, int n_threads);
size_t flash_attn_work_size(const Tensor* node, int n_threads);

size_t work_size(const Tensor* node, int n_threads) {
    if (n_threads < 1) n_threads = 1;
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
        default:
            return 0;
    }
}

}  // namespace ferry::cpu
