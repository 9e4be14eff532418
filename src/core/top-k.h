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

// The k best of x[0, n) (1 <= k <= n, n < 2^31) into out as (value, index) in ranks_before
// order, NaN given as -inf.
void top_k_of(const float* x, size_t n, size_t k, std::vector<std::pair<float, int32_t>>& out);

}  // namespace ferry
