#include "ferry/gen-model.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "ferry/gguf.h"

namespace ferry {

const std::vector<ModelPreset>& model_presets() {
    // Shapes from the models' published configurations.
    static const std::vector<ModelPreset> presets = {
        {"llama-3.2-1b", 128256, 131072, 2048, 16, 32, 8, 8192, 500000.0f, 1e-5f, true},
        {"llama-3.2-3b", 128256, 131072, 3072, 28, 24, 8, 8192, 500000.0f, 1e-5f, true},
        {"llama-2-7b", 32000, 4096, 4096, 32, 32, 32, 11008, 10000.0f, 1e-5f, false},
        // The shapes of ../shared/fixtures/tiny-llama, for quick tests.
        {"tiny", 1024, 2048, 256, 4, 8, 4, 768, 10000.0f, 1e-5f, false},
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

Status add_random_tensor(GgufWriter& w, const std::string& name, Type type, int64_t ne0,
                         int64_t ne1, uint64_t seed, int n_threads) {
    Expected<size_t> rs = row_size_checked(type, ne0);
    if (!rs) return rs.status().context(name);
    std::vector<uint8_t> data(*rs * static_cast<size_t>(ne1));
    const int nth = std::max(1, std::min<int>(n_threads, static_cast<int>(ne1)));
    std::vector<std::thread> threads;
    std::vector<Status> results(static_cast<size_t>(nth));
    for (int t = 0; t < nth; t++) {
        threads.emplace_back([&, t] {
            std::vector<float> row(static_cast<size_t>(ne0));
            for (int64_t r = t; r < ne1; r += nth) {
                fill_row(row.data(), ne0, mix(seed ^ mix(static_cast<uint64_t>(r))), 0.02f);
                Status st = from_float_row(type, row.data(),
                                           data.data() + static_cast<size_t>(r) * *rs, ne0);
                if (!st) {
                    results[static_cast<size_t>(t)] = st;
                    return;
                }
            }
        });
    }
    for (auto& th : threads) th.join();
    for (const Status& st : results) FERRY_TRY(st.context(name));
    const int64_t ne[2] = {ne0, ne1};
    return w.add_tensor(name, type, ne1 == 1 ? 1 : 2, ne, data.data(), data.size());
}

Status add_ones(GgufWriter& w, const std::string& name, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
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

// GGUF general.file_type values (the llama file-type enum) for the weight types.
uint32_t file_type_of(Type t) {
    switch (t) {
        case Type::F32:
            return 0;
        case Type::F16:
            return 1;
        case Type::Q4_0:
            return 2;
        case Type::Q4_1:
            return 3;
        case Type::Q8_0:
            return 7;
        case Type::Q4_K:
            return 15;  // Q4_K_M
        case Type::Q5_K:
            return 17;  // Q5_K_M
        case Type::Q6_K:
            return 18;
        case Type::BF16:
            return 32;
        default:
            return 0;
    }
}

}  // namespace

Status generate_model(const ModelPreset& p, const GenModelOptions& opts, const std::string& path) {
    const Type wt = opts.type;
    if (wt == Type::I32 || wt == Type::Q8_K) {
        return Status::errorf("gen-model: %s is not a weight type", type_name(wt));
    }
    Type et = opts.embd_type;
    if (!opts.embd_type_set) {
        const bool low_bit =
            wt == Type::Q4_0 || wt == Type::Q4_1 || wt == Type::Q4_K || wt == Type::Q5_K;
        et = low_bit ? Type::Q6_K : wt;
    }
    const int nth =
        opts.n_threads > 0 ? opts.n_threads : std::max(1u, std::thread::hardware_concurrency());
    const int64_t hd = p.n_embd / p.n_head;
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("general.name", std::string(p.name) + " (random weights, ferry gen-model)");
    w.add_u32("general.file_type", file_type_of(wt));
    w.add_u32("llama.context_length", static_cast<uint32_t>(p.n_ctx));
    w.add_u32("llama.embedding_length", static_cast<uint32_t>(p.n_embd));
    w.add_u32("llama.block_count", static_cast<uint32_t>(p.n_layer));
    w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(p.n_ff));
    w.add_u32("llama.attention.head_count", static_cast<uint32_t>(p.n_head));
    w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(p.n_head_kv));
    w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(hd));
    w.add_f32("llama.rope.freq_base", p.rope_base);
    w.add_f32("llama.attention.layer_norm_rms_epsilon", p.norm_eps);
    w.add_u32("llama.vocab_size", static_cast<uint32_t>(p.n_vocab));
    add_vocab(w, p.n_vocab);

    uint64_t seed = mix(opts.seed);
    auto next_seed = [&] { return seed = mix(seed); };
    FERRY_TRY(add_random_tensor(w, "token_embd.weight", et, p.n_embd, p.n_vocab, next_seed(), nth));
    for (int l = 0; l < p.n_layer; l++) {
        const std::string b = "blk." + std::to_string(l) + ".";
        FERRY_TRY(add_ones(w, b + "attn_norm.weight", p.n_embd));
        FERRY_TRY(add_random_tensor(w, b + "attn_q.weight", wt, p.n_embd, hd * p.n_head,
                                    next_seed(), nth));
        FERRY_TRY(add_random_tensor(w, b + "attn_k.weight", wt, p.n_embd, hd * p.n_head_kv,
                                    next_seed(), nth));
        FERRY_TRY(add_random_tensor(w, b + "attn_v.weight", wt, p.n_embd, hd * p.n_head_kv,
                                    next_seed(), nth));
        FERRY_TRY(add_random_tensor(w, b + "attn_output.weight", wt, hd * p.n_head, p.n_embd,
                                    next_seed(), nth));
        FERRY_TRY(add_ones(w, b + "ffn_norm.weight", p.n_embd));
        FERRY_TRY(
            add_random_tensor(w, b + "ffn_gate.weight", wt, p.n_embd, p.n_ff, next_seed(), nth));
        FERRY_TRY(
            add_random_tensor(w, b + "ffn_up.weight", wt, p.n_embd, p.n_ff, next_seed(), nth));
        FERRY_TRY(
            add_random_tensor(w, b + "ffn_down.weight", wt, p.n_ff, p.n_embd, next_seed(), nth));
    }
    FERRY_TRY(add_ones(w, "output_norm.weight", p.n_embd));
    if (!p.tied_output) {
        FERRY_TRY(add_random_tensor(w, "output.weight", et, p.n_embd, p.n_vocab, next_seed(), nth));
    }
    return w.write(path);
}

}  // namespace ferry
