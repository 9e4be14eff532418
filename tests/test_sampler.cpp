// Sampler tests: greedy, top-k/top-p/min-p filters on hand-made logits, repetition penalty,
// seeded reproducibility, and the sampled distribution against the softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "core/top-k.h"
#include "ferry/sampler.h"

namespace ferry {
namespace {

SamplerParams plain(float temp) {
    SamplerParams p;
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    return p;
}

std::vector<float> random_logits(std::mt19937& rng, int n) {
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> l(static_cast<size_t>(n));
    for (float& x : l) x = d(rng);
    return l;
}

int32_t argmax(const std::vector<float>& l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

// Tokens drawn (as a set) over many samples.
std::set<int32_t> support(const SamplerParams& p, const std::vector<float>& logits,
                          int draws = 3000) {
    Sampler s(p);
    std::set<int32_t> seen;
    for (int i = 0; i < draws; i++) seen.insert(s.sample(logits.data(), int32_t(logits.size())));
    return seen;
}

// Logits whose temperature-1 probabilities are exactly these.
std::vector<float> logits_of(const std::vector<double>& probs) {
    std::vector<float> l;
    for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
    return l;
}

TEST(Sampler, DefaultsFollowLlamaCpp) {
    SamplerParams p;
    EXPECT_FLOAT_EQ(p.temp, 0.8f);
    EXPECT_EQ(p.top_k, 40);
    EXPECT_FLOAT_EQ(p.top_p, 0.95f);
    EXPECT_FLOAT_EQ(p.min_p, 0.05f);
    EXPECT_FLOAT_EQ(p.repeat_penalty, 1.0f);
    EXPECT_EQ(p.repeat_last_n, 64);
}

TEST(Sampler, GreedyIsArgmax) {
    std::mt19937 rng(7);
    for (float temp : {0.0f, -1.0f}) {
        SamplerParams p;  // filters on: they must not matter for greedy
        p.temp = temp;
        Sampler s(p);
        for (int i = 0; i < 100; i++) {
            const std::vector<float> l = random_logits(rng, 1 + i * 37);
            EXPECT_EQ(s.sample(l.data(), int32_t(l.size())), argmax(l));
        }
    }
    // Ties go to the lowest id; NaN never wins.
    Sampler s(plain(0.0f));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> tie = {1.0f, 3.0f, 3.0f, nan};
    EXPECT_EQ(s.sample(tie.data(), 4), 1);
    const std::vector<float> with_nan = {nan, -2.0f, 5.0f, nan};
    EXPECT_EQ(s.sample(with_nan.data(), 4), 2);
    EXPECT_EQ(s.sample(with_nan.data(), 0), -1);
}

TEST(Sampler, TopKOneIsArgmaxAtAnyTemperature) {
    std::mt19937 rng(11);
    for (float temp : {0.1f, 0.8f, 1.0f, 5.0f, 1000.0f}) {
        SamplerParams p = plain(temp);
        p.top_k = 1;
        Sampler s(p);
        for (int i = 0; i < 50; i++) {
            const std::vector<float> l = random_logits(rng, 500);
            EXPECT_EQ(s.sample(l.data(), int32_t(l.size())), argmax(l)) << "temp " << temp;
        }
    }
}

TEST(Sampler, TopKKeepsTheKHighest) {
    const std::vector<float> l = {0.0f, 4.0f, 1.0f, 3.0f, 2.0f};
    SamplerParams p = plain(100.0f);  // nearly uniform over what survives
    p.top_k = 3;
    EXPECT_EQ(support(p, l), (std::set<int32_t>{1, 3, 4}));
    p.top_k = 99;  // larger than the vocabulary: no filtering
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2, 3, 4}));
}

TEST(Sampler, SeededReproducibility) {
    SamplerParams p;
    p.temp = 1.5f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    std::mt19937 rng(3);
    std::vector<std::vector<float>> steps;
    for (int i = 0; i < 300; i++) steps.push_back(random_logits(rng, 64));
    auto run = [&](Sampler& s) {
        std::vector<int32_t> out;
        for (const auto& l : steps) out.push_back(s.sample(l.data(), 64));
        return out;
    };
    Sampler a(p), b(p);
    const std::vector<int32_t> ra = run(a);
    EXPECT_EQ(ra, run(b));
    a.reset();
    EXPECT_EQ(ra, run(a));  // reset restarts the generator
    // Not degenerate: the draws vary, and another seed gives another sequence.
    EXPECT_GT(std::set<int32_t>(ra.begin(), ra.end()).size(), 10u);
    p.seed += 1;
    Sampler c(p);
    EXPECT_NE(ra, run(c));
}

// Pearson's chi-square statistic of observed counts against expected probabilities.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
    double x2 = 0.0;
    for (size_t i = 0; i < counts.size(); i++) {
        const double e = probs[i] * n;
        x2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    return x2;
}

std::vector<double> softmax(const std::vector<float>& l, double temp) {
    const double mx = *std::max_element(l.begin(), l.end());
    std::vector<double> p;
    double sum = 0.0;
    for (float x : l) sum += std::exp((x - mx) / temp);
    for (float x : l) p.push_back(std::exp((x - mx) / temp) / sum);
    return p;
}

TEST(Sampler, FrequenciesMatchSoftmax) {
    const std::vector<float> l = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f};
    const int n = 20000;
    for (float temp : {1.0f, 0.7f, 2.0f}) {
        Sampler s(plain(temp));
        std::vector<int> counts(l.size(), 0);
        for (int i = 0; i < n; i++) counts[static_cast<size_t>(s.sample(l.data(), 6))]++;
        const std::vector<double> p = softmax(l, temp);
        // 5 degrees of freedom: P(chi2 > 20.5) ~ 0.001 for a correct sampler.
        EXPECT_LT(chi_square(counts, p, n), 20.5) << "temp " << temp;
        for (size_t i = 0; i < l.size(); i++) {
            EXPECT_NEAR(counts[i] / double(n), p[i], 0.015) << "token " << i << " temp " << temp;
        }
    }
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
    // Probabilities 0.5, 0.3, 0.15, 0.05 (temperature 1, before the temperature step).
    const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
    SamplerParams p = plain(1.0f);
    p.top_p = 0.4f;
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0}));
    p.top_p = 0.75f;
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1}));
    p.top_p = 0.9f;
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2}));
    p.top_p = 0.99f;
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2, 3}));
    // The filter sees temperature-1 probabilities: a high temperature flattens only the draw.
    p.top_p = 0.75f;
    p.temp = 50.0f;
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1}));
    // Order of ids does not matter, only probability.
    const std::vector<float> shuffled = logits_of({0.05, 0.3, 0.5, 0.15});
    EXPECT_EQ(support(p, shuffled), (std::set<int32_t>{1, 2}));
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
    const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
    SamplerParams p = plain(1.0f);
    p.min_p = 0.25f;  // keeps p >= 0.125
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2}));
    p.min_p = 0.5f;  // keeps p >= 0.25
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1}));
    p.min_p = 0.7f;  // keeps p >= 0.35
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0}));
    p.min_p = 0.05f;  // keeps p >= 0.025: everything
    p.temp = 20.0f;
    EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2, 3}));
    // Kept tokens are drawn in proportion to their probabilities: 0.5 : 0.3.
    p.min_p = 0.5f;
    p.temp = 1.0f;
    Sampler s(p);
    int zeros = 0;
    const int n = 20000;
    for (int i = 0; i < n; i++) zeros += s.sample(l.data(), 4) == 0;
    EXPECT_NEAR(zeros / double(n), 0.5 / 0.8, 0.015);
}

TEST(Sampler, RepetitionPenaltyChangesTheChoice) {
    SamplerParams p = plain(0.0f);
    p.repeat_penalty = 1.1f;
    {
        // Positive logit: 2.0 / 1.1 = 1.82 drops below 1.9.
        const std::vector<float> l = {2.0f, 1.9f, -1.0f};
        Sampler s(p);
        EXPECT_EQ(s.sample(l.data(), 3), 0);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data(), 3), 1);
        SamplerParams off = p;
        off.repeat_penalty = 1.0f;
        Sampler s2(off);
        s2.accept(0);
        EXPECT_EQ(s2.sample(l.data(), 3), 0);
    }
    {
        // Negative logit: -1.0 * 1.1 = -1.1 drops below -1.05.
        const std::vector<float> l = {-1.0f, -1.05f};
        Sampler s(p);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data(), 2), 1);
    }
    {
        // Once per distinct token however often it repeats: 2.0 / 1.1 = 1.82 > 1.7 (three
        // applications would give 1.50).
        const std::vector<float> l = {2.0f, 1.7f};
        Sampler s(p);
        for (int i = 0; i < 3; i++) s.accept(0);
        EXPECT_EQ(s.sample(l.data(), 2), 0);
    }
    {
        // Only the last repeat_last_n tokens count.
        const std::vector<float> l = {2.0f, 1.9f, -1.0f, -1.0f};
        p.repeat_last_n = 2;
        Sampler s(p);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data(), 4), 1);
        s.accept(2);
        s.accept(3);
        EXPECT_EQ(s.sample(l.data(), 4), 0);
        s.reset();  // forgets accepted tokens
        s.accept(0);
        s.reset();
        EXPECT_EQ(s.sample(l.data(), 4), 0);
        // Ids outside the vocabulary are ignored.
        s.accept(99);
        s.accept(-3);
        EXPECT_EQ(s.sample(l.data(), 4), 0);
    }
}

// The documented steps done the plain way (every logit paired with its id, one full sort):
// what the sampler's single pass over the logits must reproduce token for token.
class PlainSampler {
  public:
    explicit PlainSampler(const SamplerParams& p) : p_(p), rng_(p.seed) {}
    void accept(int32_t t) { recent_.push_back(t); }
    int32_t sample(const std::vector<float>& logits) {
        const size_t n = logits.size();
        std::vector<std::pair<float, int32_t>> c(n);
        for (size_t i = 0; i < n; i++) {
            const float l = logits[i];
            c[i] = {std::isnan(l) ? -std::numeric_limits<float>::infinity() : l, int32_t(i)};
        }
        if (p_.repeat_penalty != 1.0f) {
            std::set<int32_t> seen(
                recent_.end() - std::min<ptrdiff_t>(p_.repeat_last_n, ptrdiff_t(recent_.size())),
                recent_.end());
            for (int32_t t : seen) {
                if (t < 0 || size_t(t) >= n) continue;
                float& l = c[size_t(t)].first;
                l = l > 0.0f ? l / p_.repeat_penalty : l * p_.repeat_penalty;
            }
        }
        std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
        });
        if (p_.temp <= 0.0f) return c[0].second;
        const bool cut = p_.top_k > 0 && size_t(p_.top_k) < n;
        if (cut) c.resize(size_t(p_.top_k));
        const float mx = c[0].first;
        if (mx == -std::numeric_limits<float>::infinity()) return c[0].second;
        if (p_.top_p < 1.0f) {
            double total = 0.0, cum = 0.0;
            if (cut) {
                for (const auto& x : c) total += std::exp(double(x.first - mx));
            } else {  // the whole row, in id order (the penalty applied)
                std::vector<std::pair<float, int32_t>> by_id = c;
                std::sort(by_id.begin(), by_id.end(),
                          [](const auto& a, const auto& b) { return a.second < b.second; });
                for (const auto& x : by_id) total += std::exp(double(x.first - mx));
            }
            size_t i = 0;
            while (i < c.size()) {
                cum += std::exp(double(c[i].first - mx)) / total;
                i++;
                if (cum >= double(p_.top_p)) break;
            }
            c.resize(i);
        }
        if (p_.min_p > 0.0f) {
            const double floor = double(mx) + std::log(double(p_.min_p));
            size_t i = 1;
            while (i < c.size() && double(c[i].first) >= floor) i++;
            c.resize(i);
        }
        std::vector<double> w(c.size());
        double total = 0.0;
        for (size_t i = 0; i < c.size(); i++) {
            w[i] = std::exp((double(c[i].first) - mx) / double(p_.temp));
            total += w[i];
        }
        const double u = double(rng_() >> 11) * 0x1.0p-53 * total;
        double cum = 0.0;
        for (size_t i = 0; i < c.size(); i++) {
            cum += w[i];
            if (u < cum) return c[i].second;
        }
        for (size_t i = c.size(); i-- > 0;) {
            if (w[i] > 0.0) return c[i].second;
        }
        return c[0].second;
    }

  private:
    SamplerParams p_;
    std::mt19937_64 rng_;
    std::vector<int32_t> recent_;
};

// Logits that stress the single pass: ties (values on a coarse grid), NaN, infinities, rising
// and falling runs (every logit beats the last: the candidates overflow again and again).
std::vector<float> hard_logits(std::mt19937& rng, size_t n, int kind) {
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> l(n);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::uniform_int_distribution<int> pick(0, 99);
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
            case 0:
                l[i] = d(rng);
                break;
            case 1:
                l[i] = std::round(d(rng));
                break;  // many ties
            case 2:
                l[i] = float(i) * 0.01f;
                break;  // rising
            case 3:
                l[i] = -float(i) * 0.01f;
                break;  // falling
            default:
                l[i] = float(pick(rng) % 3);
                break;
        }
        const int r = pick(rng);
        if (kind != 2 && kind != 3) {
            if (r == 0) l[i] = std::numeric_limits<float>::quiet_NaN();
            if (r == 1) l[i] = -inf;
        }
    }
    if (kind == 4 && n > 3) l[n / 2] = inf;
    return l;
}

TEST(Sampler, OnePassSelectionMatchesSortingEverything) {
    std::mt19937 rng(5);
    int cases = 0;
    // 20000: without a top-k, the 512 and 2048 best are tried before sorting the row.
    for (size_t n : {1u, 2u, 15u, 16u, 17u, 33u, 300u, 4000u, 20000u}) {
        for (int32_t k : {0, 1, 2, 5, 40, int32_t(n / 8), int32_t(n / 8) + 1, int32_t(n) - 1,
                          int32_t(n), int32_t(n) + 3}) {
            for (int kind = 0; kind < 5; kind++) {
                SamplerParams p;
                p.top_k = k;
                p.temp = (cases % 3 == 0) ? 0.0f : 0.9f;
                p.top_p = (cases % 2 == 0) ? 0.95f : 1.0f;
                p.min_p = (cases % 4 == 1) ? 0.0f : 0.05f;
                p.repeat_penalty = (cases % 5 == 2) ? 1.3f : (cases % 5 == 4) ? 0.7f : 1.0f;
                p.seed = uint64_t(cases);
                Sampler fast(p);
                PlainSampler plain_s(p);
                for (int step = 0; step < 6; step++) {
                    const std::vector<float> l = hard_logits(rng, n, kind);
                    const int32_t a = fast.sample(l.data(), int32_t(n));
                    const int32_t b = plain_s.sample(l);
                    ASSERT_EQ(a, b)
                        << "n " << n << " top_k " << k << " kind " << kind << " temp " << p.temp
                        << " penalty " << p.repeat_penalty << " step " << step;
                    fast.accept(a);
                    plain_s.accept(a);
                }
                cases++;
            }
        }
    }
    EXPECT_EQ(cases, 9 * 10 * 5);
}

// Without a top-k the sampler looks for the top-p nucleus and the min-p floor among the 512,
// then 2048, ... best before it sorts the whole row: the same tokens as sorting everything, for
// nuclei inside and past those, with and without min-p.
TEST(Sampler, WithoutTopKTheSameTokensAsSortingTheRow) {
    std::mt19937 rng(21);
    const size_t n = 20000;
    int checked = 0;
    for (float top_p : {0.3f, 0.9f, 0.999f, 1.0f}) {
        for (float min_p : {0.0f, 0.05f}) {
            for (float temp : {0.7f, 1.5f}) {
                for (int kind = 0; kind < 5; kind++) {
                    SamplerParams p;
                    p.top_k = 0;
                    p.top_p = top_p;
                    p.min_p = min_p;
                    p.temp = temp;
                    p.seed = uint64_t(checked);
                    Sampler fast(p);
                    PlainSampler plain_s(p);
                    for (int step = 0; step < 4; step++) {
                        // Scaled so that the nucleus spans from a few tokens to most of the row.
                        std::vector<float> l = hard_logits(rng, n, kind);
                        const float scale = 0.05f * float(1 + step * step * 4);
                        for (float& x : l) x *= scale;
                        ASSERT_EQ(fast.sample(l.data(), int32_t(n)), plain_s.sample(l))
                            << "top_p " << top_p << " min_p " << min_p << " temp " << temp
                            << " kind " << kind << " step " << step;
                        checked++;
                    }
                }
            }
        }
    }
    EXPECT_EQ(checked, 4 * 2 * 2 * 5 * 4);
}

// What sample_top picks from a row's best candidates_needed() logits (the TOP_K op's result) is
// what sample() picks from the whole row, with and without a repetition penalty (recent tokens
// are pushed towards the top of the row so that the penalty changes the order).
TEST(Sampler, CandidatesGiveTheSameTokensAsTheRow) {
    std::mt19937 rng(9);
    const size_t n = 4000;
    int checked = 0;
    for (float temp : {0.0f, 0.9f}) {
        for (int32_t top_k : {1, 5, 40}) {
            for (float penalty : {1.0f, 1.05f, 1.3f}) {
                for (int32_t last_n : {8, 64}) {
                    for (int kind = 0; kind < 5; kind++) {
                        SamplerParams p;
                        p.temp = temp;
                        p.top_k = top_k;
                        p.repeat_penalty = penalty;
                        p.repeat_last_n = last_n;
                        p.seed = uint64_t(checked);
                        Sampler row_s(p), cand_s(p);
                        const int32_t k = cand_s.candidates_needed(int32_t(n));
                        ASSERT_EQ(k, (temp <= 0.0f ? 1 : top_k) + (penalty != 1.0f ? last_n : 0));
                        std::vector<std::pair<float, int32_t>> best;
                        std::vector<float> vals(size_t(k), 0.0f);
                        std::vector<int32_t> ids(size_t(k), 0);
                        for (int step = 0; step < 8; step++) {
                            const std::vector<float> l = hard_logits(rng, n, kind);
                            top_k_of(l.data(), n, size_t(k), best);
                            for (int32_t j = 0; j < k; j++) {
                                vals[size_t(j)] = best[size_t(j)].first;
                                ids[size_t(j)] = best[size_t(j)].second;
                            }
                            const int32_t a = row_s.sample(l.data(), int32_t(n));
                            const int32_t b = cand_s.sample_top(vals.data(), ids.data(), k);
                            ASSERT_EQ(a, b)
                                << "temp " << temp << " top_k " << top_k << " penalty " << penalty
                                << " last_n " << last_n << " kind " << kind << " step " << step;
                            // Recent tokens from near the top, where the penalty reorders.
                            const int32_t near = best[size_t(step) % best.size()].second;
                            for (int32_t t : {a, near}) {
                                row_s.accept(t);
                                cand_s.accept(t);
                            }
                            checked++;
                        }
                    }
                }
            }
        }
    }
    EXPECT_EQ(checked, 2 * 3 * 3 * 2 * 5 * 8);
    // A penalty below 1 can lift any token, and one over every accepted token has no bound:
    // the whole row is needed; so it is without a top-k or past an eighth of the vocabulary.
    SamplerParams p;
    p.repeat_penalty = 0.9f;
    EXPECT_EQ(Sampler(p).candidates_needed(int32_t(n)), 0);
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = -1;
    EXPECT_EQ(Sampler(p).candidates_needed(int32_t(n)), 0);
    p.repeat_last_n = 64;
    EXPECT_EQ(Sampler(p).candidates_needed(int32_t(n)), 40 + 64);
    EXPECT_EQ(Sampler(p).candidates_needed(800), 0);  // 104 > 800 / 8
    p.top_k = 0;
    EXPECT_EQ(Sampler(p).candidates_needed(int32_t(n)), 0);
}

TEST(Sampler, DegenerateLogits) {
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> masked = {-inf, -inf, 0.5f, -inf};
    EXPECT_EQ(support(plain(1.0f), masked, 200), (std::set<int32_t>{2}));
    const std::vector<float> all_masked = {-inf, -inf, -inf};
    Sampler s(plain(1.0f));
    const int32_t t = s.sample(all_masked.data(), 3);
    EXPECT_TRUE(t >= 0 && t < 3);
    const std::vector<float> one = {42.0f};
    EXPECT_EQ(s.sample(one.data(), 1), 0);
}

}  // namespace
}  // namespace ferry
