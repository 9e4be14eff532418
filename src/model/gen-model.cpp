#include "ferry/gen-model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <thread>

#include "core/parallel.h"
#include "ferry/convert.h"
#include "ferry/gguf.h"
#include "model/tokenizer-json.h"

namespace ferry {

const std::vector<ModelPreset>& model_presets() {
    // Shapes from the models' published configurations.
    static const std::vector<ModelPreset> presets = {
        {"llama-3.2-1b", 128256, 131072, 2048, 16, 32, 8, 8192, 500000.0f, 1e-5f, true, "llama", 0,
         32.0f},
        {"llama-3.2-3b", 128256, 131072, 3072, 28, 24, 8, 8192, 500000.0f, 1e-5f, true, "llama", 0,
         32.0f},
        {"qwen2.5-0.5b", 151936, 32768, 896, 24, 14, 2, 4864, 1000000.0f, 1e-6f, true, "qwen2"},
        {"qwen3-0.6b", 151936, 40960, 1024, 28, 16, 8, 3072, 1000000.0f, 1e-6f, true, "qwen3", 128},
        {"llama-2-7b", 32000, 4096, 4096, 32, 32, 32, 11008, 10000.0f, 1e-5f, false},
        // The shapes of ../shared/fixtures/tiny-llama, for quick tests.
        {"tiny", 1024, 2048, 256, 4, 8, 4, 768, 10000.0f, 1e-5f, false},
        // Rows of 320 and 864 elements (not multiples of 256): the K mixtures fall back to
        // Q5_0 / Q5_1 / Q8_0, as in llama.cpp's files of such models (e.g. Qwen2.5-0.5B, 896).
        {"tiny-320", 1024, 2048, 320, 4, 5, 1, 864, 10000.0f, 1e-5f, false},
    };
    return presets;
}

Expected<ModelPreset> find_preset(const std::string& name) {
    std::string known;
    for (const ModelPreset& p : model_presets()) {
        if (name == p.name) return p;
        known += known.empty() ? "" : ", ";
        known += p.name;
    }
    return Status::errorf("unknown preset '%s' (known: %s)", name.c_str(), known.c_str());
}

namespace {

// splitmix64: a small, fast, well-mixed generator; one stream per (tensor, row).
uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Uniform values with standard deviation `stddev` (speed does not depend on the distribution).
void fill_row(float* dst, int64_t n, uint64_t seed, float stddev) {
    const float a = stddev * std::sqrt(3.0f);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = mix(s);
        const float u = static_cast<float>(s >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        dst[i] = (2.0f * u - 1.0f) * a;
    }
}

Status add_random_tensor(GgufWriter& w, const std::string& name, Type want, int64_t ne0,
                         int64_t ne1, uint64_t seed, int n_threads) {
    // Rows the type's blocks do not divide (Qwen 2.5 0.5B's 896) take the fallback type, as
    // quantizers do.
    const Type type = convert_fallback_type(want, ne0);
    Expected<size_t> rs = row_size_checked(type, ne0);
    if (!rs) return rs.status().context(name);
    std::vector<uint8_t> data(*rs * static_cast<size_t>(ne1));
    FERRY_TRY(parallel_items(ne1, n_threads, [&](int64_t r) {
                  thread_local std::vector<float> row;
                  row.resize(static_cast<size_t>(ne0));
                  fill_row(row.data(), ne0, mix(seed ^ mix(static_cast<uint64_t>(r))), 0.02f);
                  return from_float_row(type, row.data(),
                                        data.data() + static_cast<size_t>(r) * *rs, ne0);
              }).context(name));
    const int64_t ne[2] = {ne0, ne1};
    return w.add_tensor(name, type, ne1 == 1 ? 1 : 2, ne, data.data(), data.size());
}

Status add_const(GgufWriter& w, const std::string& name, int64_t n, float value) {
    std::vector<float> v(static_cast<size_t>(n), value);
    const int64_t ne[1] = {n};
    return w.add_tensor(name, Type::F32, 1, ne, v.data(), v.size() * 4);
}

void add_vocab(GgufWriter& w, int32_t n_vocab) {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    auto add = [&](const std::string& t, int32_t type) {
        scores.push_back(-static_cast<float>(tokens.size()));
        tokens.push_back(t);
        types.push_back(type);
    };
    add("<unk>", 2);
    add("<s>", 3);
    add("</s>", 3);
    for (int b = 0; b < 256; b++) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
        add(buf, 6);
    }
    const std::string space = "\xe2\x96\x81";  // U+2581, SentencePiece's space
    add(space, 1);
    for (int c = 33; c < 127; c++) add(std::string(1, static_cast<char>(c)), 1);
    for (char a = 'a'; a <= 'z' && static_cast<int32_t>(tokens.size()) < n_vocab; a++) {
        add(space + a, 1);
        for (char b = 'a'; b <= 'z' && static_cast<int32_t>(tokens.size()) < n_vocab; b++) {
            add(std::string(1, a) + b, 1);
        }
    }
    for (int i = 0; static_cast<int32_t>(tokens.size()) < n_vocab; i++) {
        add(space + "w" + std::to_string(i), 1);
    }
    tokens.resize(static_cast<size_t>(n_vocab));
    scores.resize(static_cast<size_t>(n_vocab));
    types.resize(static_cast<size_t>(n_vocab));
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 2);
    w.add_u32("tokenizer.ggml.unknown_token_id", 0);
    w.add_bool("tokenizer.ggml.add_bos_token", true);
    w.add_bool("tokenizer.ggml.add_eos_token", false);
}

// GGUF general.file_type: the _M mixtures' own values, else the weight type's.
uint32_t file_type_of(Type t, Mixture mix) {
    if (mix == Mixture::Q4_K_M) return 15;
    if (mix == Mixture::Q5_K_M) return 17;
    return gguf_file_type(t);
}

// llama.cpp's rule for the layers whose attn_v / ffn_down get more bits in the _M mixtures.
bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The substitute llama.cpp's quantizer uses when t's block does not divide the row.
Type fallback_for_row(Type t, int64_t ne0) {
    return convert_fallback_type(t, ne0);
}

bool five_bits_or_fewer(Type t) {
    switch (t) {
        case Type::Q4_0:
        case Type::Q4_1:
        case Type::Q5_0:
        case Type::Q5_1:
        case Type::Q2_K:
        case Type::Q3_K:
        case Type::Q4_K:
        case Type::Q5_K:
        case Type::IQ4_NL:
        case Type::IQ4_XS:
        case Type::MXFP4:
            return true;
        default:
            return false;
    }
}

}  // namespace

Status set_weight_type(GenModelOptions& opts, const std::string& name) {
    std::string n;
    for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (n == "q4_k_m" || n == "q5_k_m") {
        opts.mixture = n == "q4_k_m" ? Mixture::Q4_K_M : Mixture::Q5_K_M;
        opts.type = n == "q4_k_m" ? Type::Q4_K : Type::Q5_K;
        return Status::ok();
    }
    Expected<Type> t = type_from_name(name.c_str());
    if (!t) return Status::error(t.message() + ", or a mixture: q4_k_m, q5_k_m");
    opts.type = *t;
    opts.mixture = Mixture::None;
    return Status::ok();
}

Type weight_type_for(const GenModelOptions& opts, WeightRole role, int layer, int n_layer,
                     bool tied_output, int64_t ne0) {
    const bool embd = role == WeightRole::TokenEmbd || role == WeightRole::Output;
    Type t = opts.type;
    if (opts.mixture == Mixture::None) {
        if (embd) {
            t = opts.embd_type_set ? opts.embd_type : five_bits_or_fewer(t) ? Type::Q6_K : t;
        }
    } else if (embd) {
        const bool is_output = role == WeightRole::Output || tied_output;
        t = opts.embd_type_set ? opts.embd_type : is_output ? Type::Q6_K : opts.type;
    } else if ((role == WeightRole::AttnV || role == WeightRole::FfnDown) &&
               use_more_bits(layer, n_layer)) {
        t = Type::Q6_K;
    }
    return fallback_for_row(t, ne0);
}

Status generate_model(const ModelPreset& preset, const GenModelOptions& opts,
                      const std::string& path) {
    ModelPreset p = preset;
    std::vector<GgufKV> vocab_kv;
    if (!opts.tokenizer.empty()) {
        TokenizerJsonOptions o;
        o.min_vocab_size = p.n_vocab;  // padded up to the preset's embedding rows
        Expected<std::vector<GgufKV>> kv = tokenizer_to_gguf_kv(opts.tokenizer, o);
        if (!kv) return kv.status();
        for (const GgufKV& e : *kv) {
            if (e.key == "tokenizer.ggml.tokens")
                p.n_vocab = static_cast<int32_t>(e.value.arr.size());
        }
        vocab_kv = std::move(*kv);
    }
    const Type wt = opts.type;
    if (wt == Type::I32 || wt == Type::Q8_K ||
        (opts.embd_type_set && (opts.embd_type == Type::I32 || opts.embd_type == Type::Q8_K))) {
        return Status::errorf("gen-model: %s is not a weight type",
                              type_name(wt == Type::I32 || wt == Type::Q8_K ? wt : opts.embd_type));
    }
    auto type_of = [&](WeightRole role, int layer, int64_t ne0) {
        return weight_type_for(opts, role, layer, p.n_layer, p.tied_output, ne0);
    };
    const int nth =
        opts.n_threads > 0 ? opts.n_threads : std::max(1u, std::thread::hardware_concurrency());
    const int64_t hd = p.head_dim > 0 ? p.head_dim : p.n_embd / p.n_head;
    const std::string a = p.arch;
    GgufWriter w;
    w.add_string("general.architecture", a);
    w.add_string("general.name", std::string(p.name) + " (random weights, ferry gen-model)");
    w.add_u32("general.file_type", file_type_of(wt, opts.mixture));
    w.add_u32(a + ".context_length", static_cast<uint32_t>(p.n_ctx));
    w.add_u32(a + ".embedding_length", static_cast<uint32_t>(p.n_embd));
    w.add_u32(a + ".block_count", static_cast<uint32_t>(p.n_layer));
    w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(p.n_ff));
    w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(p.n_head));
    w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(p.n_head_kv));
    if (p.head_dim > 0) {
        w.add_u32(a + ".attention.key_length", static_cast<uint32_t>(hd));
        w.add_u32(a + ".attention.value_length", static_cast<uint32_t>(hd));
    }
    w.add_f32(a + ".rope.freq_base", p.rope_base);
    w.add_f32(a + ".attention.layer_norm_rms_epsilon", p.norm_eps);
    if (a == "llama") {
        w.add_u32(a + ".rope.dimension_count", static_cast<uint32_t>(hd));
        w.add_u32(a + ".vocab_size", static_cast<uint32_t>(p.n_vocab));
    }
    if (!vocab_kv.empty()) {
        for (GgufKV& kv : vocab_kv) w.add_kv(kv.key, std::move(kv.value));
    } else {
        add_vocab(w, p.n_vocab);
    }
    if (p.llama3_rope_factor > 0.0f) {
        // Llama 3.1/3.2's published rope scaling (low 1, high 4, original context 8192).
        const std::vector<float> f =
            llama3_rope_factors(hd, p.rope_base, p.llama3_rope_factor, 1.0, 4.0, 8192);
        const int64_t ne[1] = {static_cast<int64_t>(f.size())};
        FERRY_TRY(w.add_tensor("rope_freqs.weight", Type::F32, 1, ne, f.data(), f.size() * 4));
    }

    uint64_t seed = mix(opts.seed);
    auto next_seed = [&] { return seed = mix(seed); };
    using R = WeightRole;
    auto add = [&](const std::string& name, R role, int layer, int64_t ne0, int64_t ne1) {
        return add_random_tensor(w, name, type_of(role, layer, ne0), ne0, ne1, next_seed(), nth);
    };
    FERRY_TRY(add("token_embd.weight", R::TokenEmbd, -1, p.n_embd, p.n_vocab));
    for (int l = 0; l < p.n_layer; l++) {
        const std::string b = "blk." + std::to_string(l) + ".";
        FERRY_TRY(add_const(w, b + "attn_norm.weight", p.n_embd, 1.0f));
        FERRY_TRY(add(b + "attn_q.weight", R::AttnQ, l, p.n_embd, hd * p.n_head));
        FERRY_TRY(add(b + "attn_k.weight", R::AttnK, l, p.n_embd, hd * p.n_head_kv));
        FERRY_TRY(add(b + "attn_v.weight", R::AttnV, l, p.n_embd, hd * p.n_head_kv));
        FERRY_TRY(add(b + "attn_output.weight", R::AttnOutput, l, hd * p.n_head, p.n_embd));
        if (a == "qwen2") {
            FERRY_TRY(add_const(w, b + "attn_q.bias", hd * p.n_head, 0.0f));
            FERRY_TRY(add_const(w, b + "attn_k.bias", hd * p.n_head_kv, 0.0f));
            FERRY_TRY(add_const(w, b + "attn_v.bias", hd * p.n_head_kv, 0.0f));
        }
        if (a == "qwen3") {
            FERRY_TRY(add_const(w, b + "attn_q_norm.weight", hd, 1.0f));
            FERRY_TRY(add_const(w, b + "attn_k_norm.weight", hd, 1.0f));
        }
        FERRY_TRY(add_const(w, b + "ffn_norm.weight", p.n_embd, 1.0f));
        FERRY_TRY(add(b + "ffn_gate.weight", R::FfnGate, l, p.n_embd, p.n_ff));
        FERRY_TRY(add(b + "ffn_up.weight", R::FfnUp, l, p.n_embd, p.n_ff));
        FERRY_TRY(add(b + "ffn_down.weight", R::FfnDown, l, p.n_ff, p.n_embd));
    }
    FERRY_TRY(add_const(w, "output_norm.weight", p.n_embd, 1.0f));
    if (!p.tied_output) {
        FERRY_TRY(add("output.weight", R::Output, -1, p.n_embd, p.n_vocab));
    }
    return w.write(path);
}

}  // namespace ferry
