// What the standalone CUDA benchmarks share. CK(call): the check of a runtime call (on an
// error, the file, line, call and the runtime's message, then exit 1). PdlLaunch: a launch
// configuration that allows programmatic dependent launch or not.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                               \
    do {                                                                    \
        cudaError_t e_ = (x);                                               \
        if (e_ != cudaSuccess) {                                            \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, \
                         cudaGetErrorString(e_));                           \
            std::exit(1);                                                   \
        }                                                                   \
    } while (0)

// cudaLaunchKernelEx's configuration for grid x block threads with smem bytes of dynamic shared
// memory on st, the next launch allowed to start early (programmatic stream serialization)
// when pdl. Keeps its attribute, so it must outlive the launch call.
struct PdlLaunch {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1] = {};
    PdlLaunch(unsigned grid, unsigned block, size_t smem, cudaStream_t st, bool pdl) {
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(block);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = st;
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = pdl;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    PdlLaunch(const PdlLaunch&) = delete;
    PdlLaunch& operator=(const PdlLaunch&) = delete;
};
