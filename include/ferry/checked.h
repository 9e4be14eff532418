// Overflow-checked size arithmetic: the one place where sizes that may come from outside the
// process (file headers, remote requests) are added and multiplied. Every check of a shape,
// span, range or budget goes through these, so a wrapped product can never pass a check.
#pragma once

#include <cstdint>

namespace ferry {

// a + b into *out; false (and *out unspecified) on overflow.
inline bool checked_add(uint64_t a, uint64_t b, uint64_t* out) {
    return !__builtin_add_overflow(a, b, out);
}
// a * b into *out; false on overflow.
inline bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
    return !__builtin_mul_overflow(a, b, out);
}
// Signed element counts (int64 shapes): false on overflow.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
    return !__builtin_mul_overflow(a, b, out);
}
// True when [off, off + size) lies within [0, limit).
inline bool range_within(uint64_t off, uint64_t size, uint64_t limit) {
    uint64_t end = 0;
    return checked_add(off, size, &end) && end <= limit;
}
// a + b, or UINT64_MAX when that overflows (for cost estimates that only get compared).
inline uint64_t saturating_add(uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return checked_add(a, b, &r) ? r : UINT64_MAX;
}
inline uint64_t saturating_mul(uint64_t a, uint64_t b) {
    uint64_t r = 0;
    return checked_mul(a, b, &r) ? r : UINT64_MAX;
}

}  // namespace ferry
