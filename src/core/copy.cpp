#include "core/copy.h"

#include <cstdint>
#include <cstring>

namespace ferry {

namespace {

// The empty asm keeps the compiler from turning the loop back into one memcpy call (loop
// idiom recognition); each fixed-size memcpy becomes vector moves.
void copy_by_64(unsigned char* d, const unsigned char* s, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        std::memcpy(d + i, s + i, 64);
        asm volatile("" ::: "memory");
    }
    std::memcpy(d + i, s + i, n - i);
}

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n) {
    const uintptr_t gap =
        (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
    if (n >= (64u << 10) && gap != 0 && gap < 64) {
        copy_by_64(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), n);
        return;
    }
    std::memcpy(dst, src, n);
}

}  // namespace ferry
