// Random-weight GGUF models with the shapes of real architectures, for benchmarks and tests
// without downloads. Speed does not depend on the weights' values, so a generated model
// measures the same work as the real one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry {

struct ModelPreset {
    const char* name;
    int32_t n_vocab, n_ctx, n_embd, n_layer, n_head, n_head_kv, n_ff;
    float rope_base, norm_eps;
    bool tied_output;
    const char* arch = "llama";       // llama, qwen2 (Q/K/V biases), qwen3 (Q/K norms)
    int32_t head_dim = 0;             // 0: n_embd / n_head
    float llama3_rope_factor = 0.0f;  // > 0: Llama 3.1 rope scaling (rope_freqs.weight)
};

// Known presets ("llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "tiny", ...).
const std::vector<ModelPreset>& model_presets();
Expected<ModelPreset> find_preset(const std::string& name);

struct GenModelOptions {
    Type type = Type::Q4_0;  // 2-D weights
    // Token embedding (also the output matrix when tied). Default: Q6_K for 4- and 5-bit types
    // (the mixture llama.cpp's quantizer makes), the weight type otherwise.
    bool embd_type_set = false;
    Type embd_type = Type::Q6_K;
    uint64_t seed = 1;
    int n_threads = 0;  // quantization threads (0: all cores)
    // A Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json) whose
    // vocabulary the file carries instead of the synthetic one (its size must not exceed the
    // preset's n_vocab); empty: the synthetic SentencePiece vocabulary.
    std::string tokenizer_dir;
};

// Writes a GGUF model of the preset's architecture with random weights (uniform, std 0.02;
// norms 1, biases 0) and a valid SentencePiece-style vocabulary of preset.n_vocab tokens
// (control, 256 byte tokens, pieces), or the tokenizer of opts.tokenizer_dir.
Status generate_model(const ModelPreset& preset, const GenModelOptions& opts,
                      const std::string& path);

}  // namespace ferry
