// The tiny-llama fixture's float64 oracle (../shared/fixtures/tiny-llama: reference.json and
// its logits files), read once per test binary, and the KL divergence the tests measure
// against it. Shared by the llama runner's tests and every device's (device-checks.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/json.h"

namespace ferry::test {

inline const std::string kDir = std::string(FERRY_FIXTURES_DIR) + "/tiny-llama";
constexpr int kVocab = 1024;

struct Case {
    std::vector<int32_t> tokens;
    std::vector<int32_t> greedy;  // the oracle's greedy continuation
    std::vector<float> logits;    // [tokens, kVocab], the oracle's (float64 made float32)
};

// Every oracle case. Without the fixture no test that asks for the cases can check anything,
// and one that indexed them would read past an empty list: the test process ends here with a
// message naming the file instead.
inline const std::vector<Case>& cases() {
    static const std::vector<Case> all = [] {
        auto fail = [](const std::string& what) {
            std::fprintf(stderr, "tiny-llama oracle: %s (the fixtures of %s are needed)\n",
                         what.c_str(), kDir.c_str());
            std::fflush(stderr);
            std::exit(1);
        };
        std::vector<Case> out;
        Expected<json::Value> ref = json::parse_file(kDir + "/reference.json");
        if (!ref) fail(ref.message());
        for (const json::Value& c : (*ref)["cases"].as_array()) {
            Case k;
            for (const json::Value& t : c["tokens"].as_array()) {
                k.tokens.push_back(static_cast<int32_t>(t.as_int()));
            }
            for (const json::Value& t : c["greedy_tokens"].as_array()) {
                k.greedy.push_back(static_cast<int32_t>(t.as_int()));
            }
            const std::string path = kDir + "/" + c["logits_file"].as_string();
            std::ifstream f(path, std::ios::binary);
            k.logits.resize(k.tokens.size() * kVocab);
            f.read(reinterpret_cast<char*>(k.logits.data()),
                   static_cast<std::streamsize>(k.logits.size() * sizeof(float)));
            if (!f.good())
                fail(path + ": cannot read " + std::to_string(k.logits.size()) + " floats");
            out.push_back(std::move(k));
        }
        if (out.empty()) fail(kDir + "/reference.json: no cases");
        return out;
    }();
    return all;
}

// KL(p || q) of two rows of logits, natural log.
inline double kl_row(const float* p_logits, const float* q_logits, int n) {
    auto lsm = [n](const float* x, std::vector<double>& out) {
        double mx = -INFINITY;
        for (int i = 0; i < n; i++) mx = std::max(mx, static_cast<double>(x[i]));
        double s = 0.0;
        for (int i = 0; i < n; i++) s += std::exp(x[i] - mx);
        const double lse = mx + std::log(s);
        out.resize(static_cast<size_t>(n));
        for (int i = 0; i < n; i++) out[static_cast<size_t>(i)] = x[i] - lse;
    };
    std::vector<double> lp, lq;
    lsm(p_logits, lp);
    lsm(q_logits, lq);
    double kl = 0.0;
    for (size_t i = 0; i < lp.size(); i++) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    return kl;
}

}  // namespace ferry::test
