// The k largest of a float row with their indices: the selection behind top-k sampling (the
// sampler) and the TOP_K op (the CPU backend).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ferry {

// Higher value first; equal values: lower index first. NaN counts as -inf.
inline bool ranks_before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Pairs top_k_of works in for k: the k kept, and as many (at least 256) gathered before each
// cut back to the best k.
inline size_t top_k_room(size_t k) {
    return k + (k > 256 ? k : 256);
}

// The k best of x[0, n) (1 <= k <= n, n < 2^31) into out[0, k) as (value, index) in
// ranks_before order, NaN given as -inf; out has room for top_k_room(k) pairs.
void top_k_of(const float* x, size_t n, size_t k, std::pair<float, int32_t>* out);
// The same into a vector (left with the k).
void top_k_of(const float* x, size_t n, size_t k, std::vector<std::pair<float, int32_t>>& out);

}  // namespace ferry
