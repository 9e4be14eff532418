#include "remote-proto/wire.h"

#include "ferry/graph.h"

namespace ferry::wire {

uint64_t hash64(const void* data, size_t n) {
    // The core's one hash (ferry/graph.h); the wire carries its low half.
    return hash128(data, n).lo;
}

}  // namespace ferry::wire
