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

// The k best of n logits (1 <= k <= n) into out, in `ranks_before` order, NaN counting as -inf: one
// pass that skips, 16 at a time, the logits that cannot enter (at most the k-th best kept so far:
// it came first, so on a tie it stays ahead), instead of pairing every logit with its id and
// sorting them. The candidates that pass collect in out; when k + max(k, 256) have gathered,
// the best k stay and the bar rises to the k-th.
void top_k_of(const float* logits, size_t n, size_t k,
              std::vector<std::pair<float, int32_t>>& out) {
    out.clear();
    const size_t cap = k + std::max<size_t>(k, 256);
    out.reserve(cap);
    size_t i = 0;
    for (; i < k; i++) {
        const float l = logits[i];
        out.emplace_back(std::isnan(l) ? -std::numeric_limits<float>::infinity() : l,
                         static_cast<int32_t>(i));
    }
    float bar = std::max_element(out.begin(), out.end(), ranks_before)->first;  // the k-th best
    auto keep_best = [&] {
        std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k - 1), out.end(),
                         ranks_before);
        out.resize(k);
        bar = out[k - 1].first;
    };
    constexpr size_t kChunk = 16;
    while (i < n) {
        const size_t end = std::min(n, i + kChunk);
        // NaN compares false: after the first k it never enters (it counts as -inf).
        if (end - i == kChunk && !any_above(logits + i, bar)) {
            i = end;
            continue;
        }
        for (; i < end; i++) {
            if (!(logits[i] > bar)) continue;
            out.emplace_back(logits[i], static_cast<int32_t>(i));
            if (out.size() == cap) keep_best();
        }
    }
    if (out.size() > k) keep_best();
    std::sort(out.begin(), out.end(), ranks_before);
}

}  // namespace ferry
