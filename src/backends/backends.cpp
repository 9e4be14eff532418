// The list of built-in registries. Static libraries drop self-registering globals, so every
// backend this build has is named here, once.
#include "ferry/backends.h"

#include <memory>
#include <mutex>

#include "ferry/backend.h"

namespace ferry {

std::unique_ptr<Registry> make_cpu_registry();  // src/backends/cpu/cpu-backend.cpp

void init_backends() {
    static std::once_flag once;
    std::call_once(once, [] { register_registry(make_cpu_registry()); });
}

}  // namespace ferry
