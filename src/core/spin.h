// Busy-wait helpers.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ferry {

// One iteration's pause of a spin-wait loop (x86 PAUSE: the core yields its execution
// resources to a sibling hardware thread and leaves the loop without a memory-order
// misspeculation; elsewhere nothing).
inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

}  // namespace ferry
