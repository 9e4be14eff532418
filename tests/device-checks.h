// What every device backend's tests check the same way: the whole op suite on one backend, and
// tiny-llama (../shared/fixtures/tiny-llama) against its float64 oracle with the weights on a
// device, next to the llama.cpp figures of the fixture's README.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/json.h"
#include "ferry/backend.h"
#include "ferry/llama.h"
#include "ferry/op-tests.h"
#include "oracle.h"

namespace ferry::test {

struct OpSuiteCounts {
    int passed = 0, failed = 0, declined = 0;
};

// Runs every make_op_tests() case on `be` against the float64 reference: a failed case is a
// test failure, a declined one (the device does not take it; a model runs it on the CPU) is
// listed under `tag`, and the counts are printed.
inline OpSuiteCounts run_op_suite(Backend* be, const char* tag) {
    OpSuiteCounts n;
    for (const ferry::testing::OpTestCase& c : ferry::testing::make_op_tests()) {
        const ferry::testing::OpTestResult r = ferry::testing::run_op_test(c, be);
        if (r.passed) {
            n.passed++;
        } else if (!r.supported) {
            n.declined++;
            std::printf("[ %-8s ] declined: %s (%s)\n", tag, c.name.c_str(), r.message.c_str());
        } else {
            n.failed++;
            ADD_FAILURE() << c.name << ": " << r.message;
        }
    }
    std::printf("[ %-8s ] op cases: %d passed, %d failed, %d declined (run on the CPU)\n", tag,
                n.passed, n.failed, n.declined);
    return n;
}

struct Metrics {
    double kl_mean = 0.0, top1_min = 1.0, nmse_max = 0.0;
    bool ok = false;
};

// tiny-llama in encoding `enc` with its weights on `dev` (nullptr: the default placement).
inline Expected<std::unique_ptr<LlamaModel>> load(const std::string& enc, Device* dev) {
    ModelOptions mo;
    if (dev) mo.devices.push_back(dev);
    return LlamaModel::load(kDir + "/tiny-llama-" + enc + ".gguf", mo);
}

// Every position of every oracle prompt (one decode of the whole prompt) on `dev`: mean KL
// against the oracle, the worst prompt's top-1 agreement and NMSE.
inline Metrics measure(const std::string& enc, Type kv, Device* dev) {
    Metrics r;
    Expected<std::unique_ptr<LlamaModel>> m = load(enc, dev);
    EXPECT_TRUE(m) << m.message();
    if (!m) return r;
    if (dev) {
        EXPECT_EQ((*m)->device(), dev);
    }
    SessionOptions so;
    so.kv_type = kv;
    so.n_threads = 2;
    Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
    EXPECT_TRUE(s) << s.message();
    if (!s) return r;
    size_t rows = 0;
    for (const Case& c : cases()) {
        (*s)->reset();
        Status st = (*s)->decode(c.tokens, true);
        EXPECT_TRUE(st) << st.message();
        if (!st) return r;
        double err = 0.0, ref = 0.0;
        int agree = 0;
        for (size_t i = 0; i < c.tokens.size(); i++) {
            const float* run = (*s)->logits(static_cast<int32_t>(i));
            const float* orc = c.logits.data() + i * kVocab;
            r.kl_mean += kl_row(orc, run, kVocab);
            agree += std::max_element(run, run + kVocab) - run ==
                     std::max_element(orc, orc + kVocab) - orc;
            for (int j = 0; j < kVocab; j++) {
                const double d = static_cast<double>(run[j]) - orc[j];
                err += d * d;
                ref += static_cast<double>(orc[j]) * orc[j];
            }
            rows++;
        }
        r.top1_min = std::min(r.top1_min, static_cast<double>(agree) / c.tokens.size());
        r.nmse_max = std::max(r.nmse_max, err / ref);
    }
    r.kl_mean /= static_cast<double>(rows);
    r.ok = true;
    return r;
}

struct Peer {
    const char* enc;
    double kl_mean;
    double top1_min;
};
// The fixture README's llama.cpp figures (CPU, f16 KV cache).
constexpr Peer kPeers[] = {
    {"f32", 8.32e-07, 1.000},  {"f16", 1.84e-06, 1.000},    {"q8_0", 1.14e-03, 0.846},
    {"q6_k", 6.76e-03, 0.898}, {"q5_k_m", 2.10e-02, 0.692}, {"q4_k_m", 8.24e-02, 0.462},
    {"q4_1", 1.03e-01, 0.615}, {"q4_0", 1.05e-01, 0.692},
};

inline void PrintTo(const Peer& p, std::ostream* os) {
    *os << p.enc;
}

inline std::string peer_name(const ::testing::TestParamInfo<Peer>& i) {
    return i.param.enc;
}

// With RMS_NORM declined by `dev` (through the backend's test hook `set_declined`), every layer
// splits between `dev` and the CPU, and the F32 model with an F32 KV cache still matches the
// oracle to NMSE 1e-8. Printed under `tag`.
inline void expect_declined_rms_norm_runs_on_the_cpu(Device* dev,
                                                     void (*set_declined)(const std::vector<Op>&),
                                                     const char* tag) {
    set_declined({Op::RMS_NORM});
    Tensor probe;
    probe.op = Op::RMS_NORM;
    EXPECT_FALSE(dev->supports_op(&probe));
    const Metrics r = measure("f32", Type::F32, dev);
    set_declined({});
    ASSERT_TRUE(r.ok);
    std::printf("[ %-8s ] f32 kv f32, RMS_NORM on the CPU: nmse max %.2e\n", tag, r.nmse_max);
    EXPECT_LE(r.nmse_max, 1e-8);
}

// tiny-llama in encoding p.enc with its weights on `dev` and an F16 KV cache is at least as
// close to the oracle as the peer: mean KL no larger, top-1 agreement no lower. The figures are
// printed under `tag`.
inline void expect_at_least_as_close_as_peer(const Peer& p, Device* dev, const char* tag) {
    const Metrics r = measure(p.enc, Type::F16, dev);
    ASSERT_TRUE(r.ok);
    std::printf("[ %-8s ] %-7s kv f16: nmse max %.2e  top1 min %.3f  KL mean %.2e (peer %.2e)\n",
                tag, p.enc, r.nmse_max, r.top1_min, r.kl_mean, p.kl_mean);
    EXPECT_LE(r.kl_mean, p.kl_mean) << p.enc;
    EXPECT_GE(r.top1_min, p.top1_min - 1e-3) << p.enc;
}

// Every encoding but q5_k_m, which devices that multiply f32 activations by the exact
// dequantized weights test apart (expect_q5_k_m_one_top1_position_short).
inline std::vector<Peer> peers_but_q5_k_m() {
    std::vector<Peer> v;
    for (const Peer& p : kPeers) {
        if (std::string(p.enc) != "q5_k_m") v.push_back(p);
    }
    return v;
}

// A KNOWN SHORTFALL, pinned rather than hidden, of devices that multiply f32 activations by the
// exact dequantized weights (CUDA's prompt products, OpenVINO's f16 weights): on q5_k_m they are
// closer to the oracle than the peer by mean KL, but their top-1 agreement is one position short
// on the 13-token prompt (0.615 against 0.692). That position is a near-tie of the float64
// oracle (0.007 between the two tokens); exact arithmetic on the q5_k_m weights resolves it the
// other way (Cuda.KQuantLogitsAreExactArithmeticOnTheSameWeights: the GPU's logits are the CPU's
// on the same weights as F32), and llama.cpp and ferry's CPU backend land on the oracle's side
// only through their 8-bit rounding of the activations. This check fails once `dev` meets the
// peer's top-1 (then q5_k_m belongs with the others), if it falls more than one position short,
// and if its mean KL gets worse than the peer's.
inline void expect_q5_k_m_one_top1_position_short(Device* dev, const char* tag) {
    const Peer& p = kPeers[4];
    ASSERT_EQ(std::string(p.enc), "q5_k_m");
    const Metrics r = measure(p.enc, Type::F16, dev);
    ASSERT_TRUE(r.ok);
    std::printf(
        "[ %-8s ] %-7s kv f16: nmse max %.2e  top1 min %.3f  KL mean %.2e (peer %.2e / %.3f)\n",
        tag, p.enc, r.nmse_max, r.top1_min, r.kl_mean, p.kl_mean, p.top1_min);
    EXPECT_LE(r.kl_mean, p.kl_mean);
    EXPECT_LT(r.top1_min, p.top1_min - 1e-3)
        << "q5_k_m now meets the peer's top-1: test it with the others";
    EXPECT_GE(r.top1_min, p.top1_min - 1.0 / 13 - 1e-3) << "more than one position short";
}

}  // namespace ferry::test
