#include "backends/cuda/cublas-api.h"

#include <dlfcn.h>

#include <mutex>

namespace ferry::cuda {

const CublasApi* cublas_api(std::string* why) {
    static CublasApi api;
    static std::string error;
    static std::once_flag once;
    std::call_once(once, [] {
        // The soname first (the loader's paths), then where the build found the library.
        void* lib = dlopen("libcublas.so." FERRY_CUBLAS_SOVERSION, RTLD_NOW | RTLD_LOCAL);
        if (!lib) lib = dlopen(FERRY_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char* e = dlerror();
            error = std::string("cannot load cuBLAS (libcublas.so." FERRY_CUBLAS_SOVERSION
                                " or " FERRY_CUBLAS_PATH "): ") +
                    (e ? e : "unknown error");
            return;
        }
        CublasApi a;
        bool ok = true;
        auto get = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            if (!fn && ok) {
                ok = false;
                error = std::string("cuBLAS has no symbol ") + name;
            }
        };
        get(a.create, "cublasCreate_v2");
        get(a.destroy, "cublasDestroy_v2");
        get(a.set_stream, "cublasSetStream_v2");
        get(a.set_workspace, "cublasSetWorkspace_v2");
        get(a.set_math_mode, "cublasSetMathMode");
        get(a.sgemm, "cublasSgemm_v2");
        get(a.gemm_ex, "cublasGemmEx");
        get(a.status_string, "cublasGetStatusString");
        if (ok) api = a;  // the library stays loaded for the process's life
    });
    if (!api.create) {
        if (why) *why = error;
        return nullptr;
    }
    return &api;
}

}  // namespace ferry::cuda
