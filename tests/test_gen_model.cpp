// gen-model's weight types: the Q4_K_M / Q5_K_M mixtures against files llama.cpp's quantizer
// made (the tiny-llama fixtures), the fallbacks for rows the K blocks do not divide, and
// models of every new type that load and run close to their F32 twin.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ferry/gen-model.h"
#include "ferry/gguf.h"
#include "ferry/llama.h"

namespace ferry {
namespace {

const std::string kTiny = std::string(FERRY_FIXTURES_DIR) + "/tiny-llama";

// Role and layer of a 2-D weight name ("blk.3.attn_v.weight"); false for other tensors.
bool role_of(const std::string& name, WeightRole* role, int* layer) {
    *layer = -1;
    if (name == "token_embd.weight") {
        *role = WeightRole::TokenEmbd;
        return true;
    }
    if (name == "output.weight") {
        *role = WeightRole::Output;
        return true;
    }
    if (name.rfind("blk.", 0) != 0) return false;
    const size_t dot = name.find('.', 4);
    *layer = std::stoi(name.substr(4, dot - 4));
    const std::string rest = name.substr(dot + 1);
    const struct {
        const char* n;
        WeightRole r;
    } roles[] = {
        {"attn_q.weight", WeightRole::AttnQ},     {"attn_k.weight", WeightRole::AttnK},
        {"attn_v.weight", WeightRole::AttnV},     {"attn_output.weight", WeightRole::AttnOutput},
        {"ffn_gate.weight", WeightRole::FfnGate}, {"ffn_up.weight", WeightRole::FfnUp},
        {"ffn_down.weight", WeightRole::FfnDown}};
    for (const auto& r : roles) {
        if (rest == r.n) {
            *role = r.r;
            return true;
        }
    }
    return false;
}

// Every 2-D weight of a llama.cpp Q4_K_M / Q5_K_M file has the type gen-model's rules give.
TEST(GenModelMixture, MatchesLlamaCppFiles) {
    for (const char* mix : {"q4_k_m", "q5_k_m"}) {
        SCOPED_TRACE(mix);
        Expected<std::unique_ptr<GgufFile>> f =
            GgufFile::open(kTiny + "/tiny-llama-" + std::string(mix) + ".gguf");
        ASSERT_TRUE(f) << f.message();
        GenModelOptions opts;
        ASSERT_TRUE(set_weight_type(opts, mix));
        const int n_layer = static_cast<int>((*f)->get_int("llama.block_count").value());
        const bool tied = (*f)->find_tensor("output.weight") == nullptr;
        int checked = 0, q6 = 0;
        for (const GgufTensorInfo& t : (*f)->tensors()) {
            WeightRole role;
            int layer;
            if (!role_of(t.name, &role, &layer)) continue;
            const Type want = weight_type_for(opts, role, layer, n_layer, tied, t.ne[0]);
            EXPECT_EQ(type_name(t.type), std::string(type_name(want))) << t.name;
            checked++;
            q6 += t.type == Type::Q6_K;
        }
        EXPECT_EQ(checked, 2 + 7 * n_layer);
        EXPECT_GT(q6, 1);  // the file mixes types: the comparison is not trivial
    }
}

TEST(GenModelMixture, FallbacksForRowsNotMultipleOf256) {
    GenModelOptions m;
    ASSERT_TRUE(set_weight_type(m, "Q4_K_M"));
    EXPECT_EQ(m.mixture, Mixture::Q4_K_M);
    // 896 (Qwen2.5-0.5B's width) is 3.5 super-blocks.
    EXPECT_EQ(weight_type_for(m, WeightRole::AttnQ, 0, 24, true, 896), Type::Q5_0);
    EXPECT_EQ(weight_type_for(m, WeightRole::AttnQ, 0, 24, true, 1024), Type::Q4_K);
    EXPECT_EQ(weight_type_for(m, WeightRole::TokenEmbd, -1, 24, true, 896), Type::Q8_0);  // tied
    EXPECT_EQ(weight_type_for(m, WeightRole::TokenEmbd, -1, 24, false, 896), Type::Q5_0);
    EXPECT_EQ(weight_type_for(m, WeightRole::AttnV, 0, 24, true, 896), Type::Q8_0);  // Q6_K layer
    EXPECT_EQ(weight_type_for(m, WeightRole::AttnV, 3, 24, true, 896), Type::Q5_0);
    ASSERT_TRUE(set_weight_type(m, "q5_k_m"));
    EXPECT_EQ(weight_type_for(m, WeightRole::FfnUp, 5, 24, true, 896), Type::Q5_1);
    EXPECT_EQ(weight_type_for(m, WeightRole::FfnDown, 23, 24, true, 4896), Type::Q8_0);
    for (const char* t : {"q2_k", "q3_k", "iq4_xs"}) {
        ASSERT_TRUE(set_weight_type(m, t));
        EXPECT_EQ(weight_type_for(m, WeightRole::AttnQ, 0, 24, true, 896), Type::IQ4_NL) << t;
    }
    ASSERT_TRUE(set_weight_type(m, "q5_0"));
    EXPECT_EQ(weight_type_for(m, WeightRole::AttnQ, 0, 24, true, 48), Type::F16);
    EXPECT_FALSE(set_weight_type(m, "q4_k_l"));
}

// Logits of the first prompt positions of a generated model.
std::vector<float> run_logits(const std::string& path, int32_t n_vocab) {
    Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(path, {});
    EXPECT_TRUE(m) << m.message();
    if (!m) return {};
    SessionOptions so;
    so.n_threads = 2;
    so.kv_type = Type::F32;
    Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
    EXPECT_TRUE(s) << s.message();
    if (!s) return {};
    const std::vector<int32_t> tokens = {1, 300, 301, 302, 17, 99, 250, 3};
    Status st = (*s)->decode(tokens, true);
    EXPECT_TRUE(st) << st.message();
    if (!st) return {};
    std::vector<float> out;
    for (int32_t i = 0; i < static_cast<int32_t>(tokens.size()); i++) {
        const float* l = (*s)->logits(i);
        out.insert(out.end(), l, l + n_vocab);
    }
    return out;
}

double nmse(const std::vector<float>& ref, const std::vector<float>& got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double d = static_cast<double>(got[i]) - ref[i];
        num += d * d;
        den += static_cast<double>(ref[i]) * ref[i];
    }
    return num / den;
}

std::string temp_path(const std::string& tag) {
    return (::testing::TempDir().empty() ? std::string("/tmp/") : ::testing::TempDir()) +
           "ferry-gen-" + std::to_string(getpid()) + "-" + tag + ".gguf";
}

// A model of each new type (and each mixture, on rows of 320 / 864 elements that force the
// fallbacks) loads and runs; its logits stay near those of the same random weights in F32.
// Measured (AVX2): q5_0 3.5e-3, q5_1 3.6e-3, q2_k 1.7e-1, q3_k 5.1e-2, iq4_nl 1.7e-2, iq4_xs
// 1.8e-2, mxfp4 3.1e-2, q4_k_m 7.1e-3, q5_k_m 5.1e-3: about twice each type's weight round-trip
// NMSE (test_types' Quantize.RoundTripNmse). The bounds are about 2x the measured values (the
// weights are the same on every machine; only the kernels' float rounding differs).
TEST(GenModelTypes, ModelsLoadAndRunNearF32) {
    const ModelPreset small = {"test-256", 384, 256, 256, 2, 4, 2, 256, 10000.0f, 1e-5f, false};
    const ModelPreset odd = *find_preset("tiny-320");
    struct Case {
        const char* type;
        const ModelPreset* p;
        double max_nmse;
    };
    const Case cases[] = {
        {"q5_0", &small, 1e-2},  {"q5_1", &small, 1e-2},   {"q2_k", &small, 3e-1},
        {"q3_k", &small, 1e-1},  {"iq4_nl", &small, 3e-2}, {"iq4_xs", &small, 3e-2},
        {"mxfp4", &small, 6e-2}, {"q4_k_m", &odd, 3e-2},   {"q5_k_m", &odd, 1e-2},
    };
    std::vector<float> f32_small, f32_odd;
    for (const ModelPreset* p : {&small, &odd}) {
        GenModelOptions o;
        o.type = Type::F32;
        o.n_threads = 2;
        const std::string path = temp_path(std::string(p->name) + "-f32");
        ASSERT_TRUE(generate_model(*p, o, path));
        (p == &small ? f32_small : f32_odd) = run_logits(path, p->n_vocab);
        std::remove(path.c_str());
    }
    for (const Case& c : cases) {
        SCOPED_TRACE(c.type);
        GenModelOptions o;
        ASSERT_TRUE(set_weight_type(o, c.type));
        o.n_threads = 2;
        const std::string path = temp_path(c.type);
        ASSERT_TRUE(generate_model(*c.p, o, path));
        if (c.p == &odd) {  // the fallbacks are in the file
            Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(path);
            ASSERT_TRUE(f) << f.message();
            const bool q4 = std::string(c.type) == "q4_k_m";
            EXPECT_EQ((*f)->find_tensor("blk.0.attn_q.weight")->type, q4 ? Type::Q5_0 : Type::Q5_1);
            EXPECT_EQ((*f)->find_tensor("output.weight")->type, Type::Q8_0);
            EXPECT_EQ((*f)->find_tensor("blk.3.ffn_down.weight")->type, Type::Q8_0);
            EXPECT_EQ((*f)->get_int("general.file_type").value(), q4 ? 15 : 17);
        }
        const std::vector<float> got = run_logits(path, c.p->n_vocab);
        std::remove(path.c_str());
        const std::vector<float>& ref = c.p == &small ? f32_small : f32_odd;
        ASSERT_EQ(got.size(), ref.size());
        for (float v : got) ASSERT_TRUE(std::isfinite(v));
        const double e = nmse(ref, got);
        std::printf("  %-7s logits nmse vs f32 %.3e (bound %.1e)\n", c.type, e, c.max_nmse);
        EXPECT_LE(e, c.max_nmse);
        EXPECT_GT(e, 0.0);
    }
}

}  // namespace
}  // namespace ferry
