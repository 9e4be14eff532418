// cuBLAS, loaded when a backend first needs it (dlopen), not linked: its shared library's
// start-up work (static initialisers touching ~100 MB) cost every ferry process about 0.35 s
// before the first line of main(), GPU or not, and the CUDA backend needs cuBLAS only for
// prefill products of F16/BF16 and dequantized weights.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace ferry::cuda {

struct CublasApi {
    decltype(&cublasCreate_v2) create = nullptr;
    decltype(&cublasDestroy_v2) destroy = nullptr;
    decltype(&cublasSetStream_v2) set_stream = nullptr;
    decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
    decltype(&cublasSetMathMode) set_math_mode = nullptr;
    decltype(&cublasSgemm_v2) sgemm = nullptr;
    // The C entry point (C++ sees cublasGemmEx overloaded).
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void*, const void*, cudaDataType, int, const void*,
                              cudaDataType, int, const void*, void*, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
    decltype(&cublasGetStatusString) status_string = nullptr;
};

// The library's entry points, loaded once (thread-safe); nullptr, with *why naming the library
// or symbol that is missing, when it cannot be loaded.
const CublasApi* cublas_api(std::string* why);

}  // namespace ferry::cuda
