#include "ferry/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace ferry {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Higher logit first; equal logits: lower id first, so every step is deterministic.
bool before(const Sampler::Cand& a, const Sampler::Cand& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

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

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {}

void Sampler::reset() {
    recent_.clear();
    rng_.seed(p_.seed);
}

void Sampler::accept(int32_t token) {
    if (p_.repeat_last_n == 0) return;
    recent_.push_back(token);
    if (p_.repeat_last_n > 0) {
        while (recent_.size() > static_cast<size_t>(p_.repeat_last_n)) recent_.pop_front();
    }
}

// The k best of n logits (1 <= k <= n) into out, in `before` order, NaN counting as -inf: one
// pass that skips, 16 at a time, the logits that cannot enter (at most the k-th best kept so far:
// it came first, so on a tie it stays ahead), instead of pairing every logit with its id and
// sorting them. The candidates that pass collect in out; when k + max(k, 256) have gathered,
// the best k stay and the bar rises to the k-th.
void Sampler::top(const float* logits, size_t n, size_t k, std::vector<Cand>& out) {
    out.clear();
    const size_t cap = k + std::max<size_t>(k, 256);
    out.reserve(cap);
    size_t i = 0;
    for (; i < k; i++) {
        const float l = logits[i];
        out.emplace_back(std::isnan(l) ? kNegInf : l, static_cast<int32_t>(i));
    }
    float bar = std::max_element(out.begin(), out.end(), before)->first;  // the k-th best
    auto keep_best = [&] {
        std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k - 1), out.end(),
                         before);
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
    std::sort(out.begin(), out.end(), before);
}

int32_t Sampler::sample(const float* logits, int32_t n_vocab) {
    if (n_vocab <= 0) return -1;
    const auto n = static_cast<size_t>(n_vocab);

    // 1. Repetition penalty, once per distinct recent token, on a copy of the logits.
    const float* l = logits;
    if (p_.repeat_penalty != 1.0f && p_.repeat_penalty > 0.0f && !recent_.empty()) {
        penalized_.assign(logits, logits + n);
        std::vector<int32_t> seen(recent_.begin(), recent_.end());
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        for (int32_t t : seen) {
            if (t < 0 || t >= n_vocab) continue;
            float& x = penalized_[static_cast<size_t>(t)];
            x = x > 0.0f ? x / p_.repeat_penalty : x * p_.repeat_penalty;
        }
        l = penalized_.data();
    }

    // 2. Greedy.
    if (p_.temp <= 0.0f) {
        top(l, n, 1, cand_);
        return cand_[0].second;
    }

    // 3. Top-k (the later steps need the order). Past an eighth of the vocabulary, sorting
    // everything costs no more than the pass.
    size_t keep = n;
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) keep = static_cast<size_t>(p_.top_k);
    if (keep <= n / 8) {
        top(l, n, keep, cand_);
    } else {
        cand_.resize(n);
        for (size_t i = 0; i < n; i++) {
            cand_[i] = {std::isnan(l[i]) ? kNegInf : l[i], static_cast<int32_t>(i)};
        }
        if (keep < n) {
            std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep),
                              cand_.end(), before);
        } else {
            std::sort(cand_.begin(), cand_.end(), before);
        }
        cand_.resize(keep);
    }

    const float max_logit = cand_[0].first;
    if (max_logit == kNegInf) return cand_[0].second;  // nothing has any probability

    // 4. Top-p over the temperature-1 distribution of what is left.
    if (p_.top_p < 1.0f) {
        double total = 0.0;
        for (const auto& c : cand_) total += std::exp(static_cast<double>(c.first - max_logit));
        double cum = 0.0;
        size_t i = 0;
        while (i < cand_.size()) {
            cum += std::exp(static_cast<double>(cand_[i].first - max_logit)) / total;
            i++;
            if (cum >= static_cast<double>(p_.top_p)) break;
        }
        cand_.resize(i);
    }

    // 5. Min-p: p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p).
    if (p_.min_p > 0.0f) {
        const double floor =
            static_cast<double>(max_logit) + std::log(static_cast<double>(p_.min_p));
        size_t i = 1;  // the top token always stays
        while (i < cand_.size() && static_cast<double>(cand_[i].first) >= floor) i++;
        cand_.resize(i);
    }

    // 6 and 7. Temperature, softmax, one uniform draw.
    const double inv_temp = 1.0 / static_cast<double>(p_.temp);
    std::vector<double> w(cand_.size());
    double total = 0.0;
    for (size_t i = 0; i < cand_.size(); i++) {
        w[i] = std::exp((static_cast<double>(cand_[i].first) - max_logit) * inv_temp);
        total += w[i];
    }
    // 53 random bits -> [0, 1): the same on every platform, unlike std::*_distribution.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double cum = 0.0;
    for (size_t i = 0; i < cand_.size(); i++) {
        cum += w[i];
        if (u < cum) return cand_[i].second;
    }
    // Rounding left u at or past the sum: the last token with any weight.
    for (size_t i = cand_.size(); i-- > 0;) {
        if (w[i] > 0.0) return cand_[i].second;
    }
    return cand_[0].second;
}

}  // namespace ferry
