// Host sampling cost per token: Sampler::sample against the way it picked candidates before
// (every logit paired with its id, then std::partial_sort for top-k, std::min_element for
// greedy, std::sort of the row without a top-k), on the same logits, alternating, in one run.
// Medians of each; the ratio is of the medians.
//
//   bench_sampler [reps=400]
//
// Logits: normal(0, 3) over the vocabularies ferry runs (Llama 2 32,000; Llama 3 128,256;
// Qwen3 151,936); one logit nudged per repetition so nothing is cached between calls.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/top-k.h"
#include "ferry/sampler.h"

namespace {

using Cand = std::pair<float, int32_t>;
using ferry::ranks_before;

// The candidate selection of the sampler before the single pass (steps 2-3 only: the steps
// after top-k cost the same in both).
int32_t pairs_then_sort(const float* l, size_t n, int32_t top_k, bool greedy,
                        std::vector<Cand>& c) {  // top_k 0: the whole row sorted
    c.resize(n);
    for (size_t i = 0; i < n; i++) {
        c[i] = {std::isnan(l[i]) ? -std::numeric_limits<float>::infinity() : l[i],
                static_cast<int32_t>(i)};
    }
    if (greedy) return std::min_element(c.begin(), c.end(), ranks_before)->second;
    if (top_k <= 0) {
        std::sort(c.begin(), c.end(), ranks_before);
        return c[0].second;
    }
    const auto keep = static_cast<std::ptrdiff_t>(top_k);
    std::partial_sort(c.begin(), c.begin() + keep, c.end(), ranks_before);
    return c[0].second;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 400;
    if (reps <= 0) {
        std::fprintf(stderr, "bench_sampler: reps must be positive\n");
        return 1;
    }
    std::printf("| vocabulary | sampler | before (pairs + sort) us | now us | ratio |\n");
    std::printf("| ---: | --- | ---: | ---: | ---: |\n");
    for (size_t n : {32000u, 128256u, 151936u}) {
        std::mt19937 rng(1);
        std::normal_distribution<float> d(0.0f, 3.0f);
        std::vector<float> l(n);
        for (float& x : l) x = d(rng);
        for (int mode = 0; mode < 3; mode++) {
            const bool greedy = mode == 1;
            ferry::SamplerParams p;  // llama.cpp's defaults: top-k 40, top-p, min-p, temp 0.8
            if (greedy) p.temp = 0.0f;
            if (mode == 2) p.top_k = 0;
            ferry::Sampler s(p);
            std::vector<Cand> scratch;
            std::vector<double> old_us, new_us;
            volatile int32_t sink = 0;
            for (int r = 0; r < reps; r++) {
                l[static_cast<size_t>(r) * 7919 % n] += 0.01f;
                const auto t0 = std::chrono::steady_clock::now();
                sink = pairs_then_sort(l.data(), n, p.top_k, greedy, scratch);
                const auto t1 = std::chrono::steady_clock::now();
                sink = s.sample(l.data(), static_cast<int32_t>(n));
                const auto t2 = std::chrono::steady_clock::now();
                old_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
                new_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
            }
            (void)sink;
            const double a = median(old_us), b = median(new_us);
            const char* names[] = {"defaults (top-k 40)", "greedy", "no top-k (top-p, min-p)"};
            std::printf("| %zu | %s | %.1f | %.1f | %.1fx |\n", n, names[mode], a, b, a / b);
        }
    }
    return 0;
}
