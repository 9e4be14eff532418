#include "ferry/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/top-k.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace ferry {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Before a loop of std::exp calls. glibc's exp is SSE code, and called while the upper halves
// of the YMM registers are marked in use it pays a state transition on every call: measured on
// the development VM, 128K calls took 14 ms instead of 0.9 ms when the caller (here a
// benchmark's loop; any AVX code before us could) left them so. One vzeroupper clears them.
inline void clean_upper_state() {
#if defined(__AVX__)
    _mm256_zeroupper();
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

int32_t Sampler::sample(const float* logits, int32_t n_vocab) {
    if (n_vocab <= 0) return -1;
    const auto n = static_cast<size_t>(n_vocab);

    // 1. Repetition penalty, once per distinct recent token, on a copy of the logits.
    const float* l = logits;
    if (penalizes() && !recent_.empty()) {
        penalized_.assign(logits, logits + n);
        for (int32_t t : distinct_recent()) {
            if (t < 0 || t >= n_vocab) continue;
            float& x = penalized_[static_cast<size_t>(t)];
            x = penalized(x);
        }
        l = penalized_.data();
    }

    // 2. Greedy.
    if (p_.temp <= 0.0f) {
        top_k_of(l, n, 1, cand_);
        return cand_[0].second;
    }

    // 3. Top-k (the later steps need the order). Past an eighth of the vocabulary, sorting
    // everything costs no more than the pass.
    size_t keep = n;
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) keep = static_cast<size_t>(p_.top_k);
    if (keep <= n / 8) {
        top_k_of(l, n, keep, cand_);
        return draw(nullptr);
    }
    if (keep == n) return sample_untruncated(l, n);
    sort_all(l, n);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep), cand_.end(),
                      ranks_before);
    cand_.resize(keep);
    return draw(nullptr);
}

void Sampler::sort_all(const float* l, size_t n) {
    cand_.resize(n);
    for (size_t i = 0; i < n; i++) {
        cand_[i] = {std::isnan(l[i]) ? kNegInf : l[i], static_cast<int32_t>(i)};
    }
}

// No top-k: top-p and min-p decide how far down the order the candidates reach, and that is
// usually a few hundred tokens, not the vocabulary (sorting 128K logits took 14 ms). The m
// best, sorted, for m = 512, 2048, ... until the top-p walk or the min-p floor ends inside
// them; top-p's total over the whole row is summed once, in id order.
int32_t Sampler::sample_untruncated(const float* l, size_t n) {
    float max_logit = kNegInf;
    for (size_t i = 0; i < n; i++) max_logit = l[i] > max_logit ? l[i] : max_logit;
    double total = 0.0;
    const bool top_p = p_.top_p < 1.0f && max_logit != kNegInf;
    clean_upper_state();
    if (top_p) {
        for (size_t i = 0; i < n; i++) {
            if (!std::isnan(l[i])) total += std::exp(static_cast<double>(l[i] - max_logit));
        }
    }
    if (top_p || p_.min_p > 0.0f) {
        for (size_t m = 512; m <= n / 8; m *= 4) {
            top_k_of(l, n, m, cand_);
            if (p_.min_p > 0.0f &&
                static_cast<double>(cand_.back().first) < min_p_floor(max_logit)) {
                return draw(&total);
            }
            if (top_p && nucleus(total, max_logit) > 0) return draw(&total);
        }
    }
    sort_all(l, n);
    std::sort(cand_.begin(), cand_.end(), ranks_before);
    return draw(&total);
}

bool Sampler::penalizes() const {
    return p_.repeat_penalty != 1.0f && p_.repeat_penalty > 0.0f && p_.repeat_last_n != 0;
}

int32_t Sampler::candidates_needed(int32_t n_vocab) const {
    if (n_vocab <= 0) return 0;
    int64_t k = 0;
    if (p_.temp <= 0.0f) {
        k = 1;
    } else if (p_.top_k > 0) {
        k = p_.top_k;
    } else {
        return 0;
    }
    if (penalizes()) {
        // A penalty of at least 1 only moves a recent token down, so a token among the k best
        // after it has at most k - 1 tokens ahead of it that were not moved, and at most
        // repeat_last_n that were: it is among the k + repeat_last_n best before. A penalty
        // below 1 can lift any token, and "every accepted token" has no bound.
        if (p_.repeat_penalty < 1.0f || p_.repeat_last_n < 0) return 0;
        k += p_.repeat_last_n;
    }
    return k <= n_vocab / 8 ? static_cast<int32_t>(k) : 0;
}

int32_t Sampler::sample_top(const float* values, const int32_t* ids, int32_t k) {
    if (k <= 0) return -1;
    cand_.resize(static_cast<size_t>(k));
    for (int32_t i = 0; i < k; i++) cand_[static_cast<size_t>(i)] = {values[i], ids[i]};
    // 1. The penalty on the candidates that are recent tokens, then their order again.
    if (penalizes() && !recent_.empty()) {
        const std::vector<int32_t> seen = distinct_recent();
        for (Cand& c : cand_) {
            if (std::binary_search(seen.begin(), seen.end(), c.second))
                c.first = penalized(c.first);
        }
        std::sort(cand_.begin(), cand_.end(), ranks_before);
    }
    // 2 and 3: the first candidate is the greedy pick, the first top_k are the top-k.
    if (p_.temp <= 0.0f) return cand_[0].second;
    if (p_.top_k > 0 && p_.top_k < k) cand_.resize(static_cast<size_t>(p_.top_k));
    return draw(nullptr);
}

std::vector<int32_t> Sampler::distinct_recent() const {
    std::vector<int32_t> seen(recent_.begin(), recent_.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    return seen;
}

float Sampler::penalized(float l) const {
    return l > 0.0f ? l / p_.repeat_penalty : l * p_.repeat_penalty;
}

// Step 4's walk down cand_: how many candidates it keeps, or 0 when their probability (of
// `total`, at temperature 1) never reaches top_p.
size_t Sampler::nucleus(double total, float max_logit) const {
    double cum = 0.0;
    for (size_t i = 0; i < cand_.size(); i++) {
        cum += std::exp(static_cast<double>(cand_[i].first - max_logit)) / total;
        if (cum >= static_cast<double>(p_.top_p)) return i + 1;
    }
    return 0;
}

// Step 5: p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p).
double Sampler::min_p_floor(float max_logit) const {
    return static_cast<double>(max_logit) + std::log(static_cast<double>(p_.min_p));
}

// Steps 4 to 7 on cand_ (in ranks_before order, at least one). row_total: top-p's total when
// no top-k cut the row (summed over the row in id order); nullptr: summed over cand_.
int32_t Sampler::draw(const double* row_total) {
    clean_upper_state();
    const float max_logit = cand_[0].first;
    if (max_logit == kNegInf) return cand_[0].second;  // nothing has any probability

    // 4. Top-p over the temperature-1 distribution of what is left.
    if (p_.top_p < 1.0f) {
        double total = 0.0;
        if (row_total) {
            total = *row_total;
        } else {
            for (const auto& c : cand_) total += std::exp(static_cast<double>(c.first - max_logit));
        }
        const size_t kept = nucleus(total, max_logit);
        if (kept > 0) cand_.resize(kept);
    }

    // 5. Min-p.
    if (p_.min_p > 0.0f) {
        const double floor = min_p_floor(max_logit);
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
