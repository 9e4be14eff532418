// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded.
// Defaults follow llama.cpp's command line (temp 0.8, top-k 40, top-p 0.95, min-p 0.05,
// repeat penalty 1.0 over the last 64 tokens). temp <= 0 means greedy (argmax).
//
// The steps run in llama.cpp's default order:
//   1. repetition penalty: each distinct token among the last repeat_last_n accepted tokens has
//      its logit divided by repeat_penalty when positive, multiplied by it otherwise;
//   2. greedy (temp <= 0): the highest penalized logit wins (ties: the lowest id); stop here;
//   3. top-k: keep the k highest logits;
//   4. top-p: keep the smallest set of the most likely tokens whose probability (softmax of the
//      logits at temperature 1) sums to at least top_p (the softmax's total summed in id order
//      when no top-k cut the row, in rank order over the top-k otherwise);
//   5. min-p: keep the tokens whose probability is at least min_p times the top one's;
//   6. temperature: divide the remaining logits by temp;
//   7. draw from their softmax with the sampler's own generator.
// Each filter keeps at least one token. NaN logits count as -inf. Greedy and top-k up to an
// eighth of the vocabulary pick their candidates in one pass over the logits (no sort of the
// vocabulary: ~20 us for 128K logits, bench/results/sampler.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <random>
#include <utility>
#include <vector>

namespace ferry {

struct SamplerParams {
    float temp = 0.8f;
    int32_t top_k = 40;           // <= 0: disabled
    float top_p = 0.95f;          // >= 1: disabled
    float min_p = 0.05f;          // <= 0: disabled
    float repeat_penalty = 1.0f;  // 1: disabled
    int32_t repeat_last_n = 64;   // 0: disabled; < 0: every accepted token
    uint64_t seed = 0xFE22F;      // same seed, same logits -> same tokens
};

class Sampler {
  public:
    explicit Sampler(const SamplerParams& p);
    // Picks a token from n_vocab logits (not modified). Returns -1 when n_vocab <= 0.
    int32_t sample(const float* logits, int32_t n_vocab);
    // How many of a row's best logits sample_top needs to pick what sample() would pick from
    // the whole row: 1 for greedy or top_k, plus repeat_last_n with a repetition penalty above
    // 1, when that is at most an eighth of the vocabulary; 0 (the whole row is needed) with
    // no top-k, a penalty below 1 or over every accepted token, or more candidates.
    int32_t candidates_needed(int32_t n_vocab) const;
    // Picks from the k best logits of a row (k >= candidates_needed(n_vocab) > 0), best first
    // with ties by lower id and NaN as -inf (the TOP_K op's values and ids): the token sample()
    // picks from the whole row, drawing the same numbers from the generator.
    int32_t sample_top(const float* values, const int32_t* ids, int32_t k);
    // Records a token (prompt or generated) for the repetition penalty.
    void accept(int32_t token);
    // Forgets accepted tokens and restarts the generator from the seed.
    void reset();
    const SamplerParams& params() const { return p_; }

    using Cand = std::pair<float, int32_t>;  // (logit, id)

  private:
    bool penalizes() const;
    std::vector<int32_t> distinct_recent() const;  // sorted
    float penalized(float logit) const;
    size_t nucleus(double total, float max_logit) const;
    double min_p_floor(float max_logit) const;
    int32_t draw(const double* row_total);
    int32_t sample_untruncated(const float* logits, size_t n);
    void sort_all(const float* logits, size_t n);  // cand_: every logit, unsorted

    SamplerParams p_;
    std::mt19937_64 rng_;
    std::deque<int32_t> recent_;
    std::vector<Cand> cand_;        // scratch: the candidates left
    std::vector<float> penalized_;  // scratch: the logits after the repetition penalty
};

}  // namespace ferry
