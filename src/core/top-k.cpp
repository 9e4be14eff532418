// The k largest of a float row with their indices: the selection behind top-k sampling and
// the TOP_K op.
#include "core/top-k.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace ferry {

namespace {

// Whether one of 16 logits is above bar (NaN is not).
bool any_above(const float* p, float bar) {
#if defined(__AVX__)
    const __m256 b = _mm256_set1_ps(bar);
    const __m256 m = _mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), b, _CMP_GT_OQ),
                                  _mm256_cmp_ps(_mm256_loadu_ps(p + 8), b, _CMP_GT_OQ));
    return _mm256_testz_ps(m, m) == 0;
#else
    bool any = false;
    for (int j = 0; j < 16; j++) any |= p[j] > bar;
    return any;
#endif
}

}  // namespace

// One pass that skips, 16 at a time, the values that cannot enter (at most the k-th best kept
// so far: it came first, so on a tie it stays ahead), instead of pairing every value with its
// index and sorting them. The candidates that pass collect in out; when top_k_room(k) have
// gathered, the best k stay and the bar rises to the k-th.
void top_k_of(const float* x, size_t n, size_t k, std::pair<float, int32_t>* out) {
    const size_t room = top_k_room(k);
    size_t used = 0;
    for (; used < k; used++) {
        const float v = x[used];
        out[used] = {std::isnan(v) ? -std::numeric_limits<float>::infinity() : v,
                     static_cast<int32_t>(used)};
    }
    float bar = std::max_element(out, out + k, ranks_before)->first;  // the k-th best
    auto keep_best = [&] {
        std::nth_element(out, out + (k - 1), out + used, ranks_before);
        used = k;
        bar = out[k - 1].first;
    };
    constexpr size_t kChunk = 16;
    size_t i = k;
    while (i < n) {
        const size_t end = std::min(n, i + kChunk);
        // NaN compares false: after the first k it never enters (it counts as -inf).
        if (end - i == kChunk && !any_above(x + i, bar)) {
            i = end;
            continue;
        }
        for (; i < end; i++) {
            if (!(x[i] > bar)) continue;
            out[used++] = {x[i], static_cast<int32_t>(i)};
            if (used == room) keep_best();
        }
    }
    if (used > k) keep_best();
    std::sort(out, out + k, ranks_before);
}

void top_k_of(const float* x, size_t n, size_t k, std::vector<std::pair<float, int32_t>>& out) {
    out.resize(top_k_room(k));
    top_k_of(x, n, k, out.data());
    out.resize(k);
}

}  // namespace ferry
