// The list of built-in registries. Static libraries drop self-registering globals, so every
// backend this build has is named here, once.
#include "ferry/backends.h"

#include <memory>
#include <mutex>

#include "ferry/backend.h"

namespace ferry {

std::unique_ptr<Registry> make_cpu_registry();  // src/backends/cpu/cpu-backend.cpp
#ifdef FERRY_HAVE_CUDA
std::unique_ptr<Registry> make_cuda_registry();  // src/backends/cuda/cuda-backend.cpp
#endif
#ifdef FERRY_HAVE_OPENVINO
std::unique_ptr<Registry> make_openvino_registry();  // src/backends/openvino/openvino-backend.cpp
#endif

void init_backends() {
    static std::once_flag once;
    std::call_once(once, [] {
        register_registry(make_cpu_registry());
#ifdef FERRY_HAVE_CUDA
        register_registry(make_cuda_registry());  // lists no device when there is no GPU
#endif
#ifdef FERRY_HAVE_OPENVINO
        register_registry(make_openvino_registry());  // one device per OpenVINO device
#endif
    });
}

}  // namespace ferry
