#include "core/env.h"

#include <cstdlib>
#include <cstring>

namespace ferry {

bool env_off(const char* name) {
    const char* v = std::getenv(name);
    return v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0);
}

bool env_on(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && !env_off(name);
}

}  // namespace ferry
