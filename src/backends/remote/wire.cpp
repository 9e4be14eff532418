#include "backends/remote/wire.h"

namespace ferry::wire {

uint64_t hash64(const void* data, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(data);
    uint64_t h = 1469598103934665603ull;
    // Eight bytes at a time (little-endian words), then the tail: fast enough for tables of a
    // few hundred KiB per decode step.
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = 0;
        for (int k = 0; k < 8; k++) w |= static_cast<uint64_t>(b[i + k]) << (8 * k);
        h ^= w;
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    h ^= static_cast<uint64_t>(n);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

}  // namespace ferry::wire
