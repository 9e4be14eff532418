// Random-weight GGUF models with the shapes of real architectures, for benchmarks and tests
// without downloads. Speed does not depend on the weights' values, so a generated model
// measures the same work as the real one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/gguf.h"
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

// llama.cpp-like mixtures of K formats, per its public preset descriptions (see
// weight_type_for).
enum class Mixture { None, Q4_K_M, Q5_K_M };

struct GenModelOptions {
    Type type = Type::Q4_0;  // 2-D weights (the base type of a mixture)
    Mixture mixture = Mixture::None;
    // Token embedding (also the output matrix when tied). Default: Q6_K for 4- and 5-bit types
    // (the mixture llama.cpp's quantizer makes), the weight type otherwise.
    bool embd_type_set = false;
    Type embd_type = Type::Q6_K;
    uint64_t seed = 1;
    int n_threads = 0;  // quantization threads (0: all cores)
    // A Hugging Face tokenizer.json (byte-level BPE), or a folder holding one, whose vocabulary
    // the model gets instead of the generated SentencePiece one, with special token ids and
    // chat template from the tokenizer_config.json beside it (when present). The model has
    // max(preset.n_vocab, the tokenizer's tokens) token rows; ids the tokenizer lacks are
    // unused padding, as in the public models (Qwen3: 151669 tokens, 151936 rows). Empty: the
    // generated vocabulary of preset.n_vocab tokens.
    std::string tokenizer;
};

// Sets opts.type / opts.mixture from a --type value: a storage type name ("q4_k", "mxfp4", ...)
// or a mixture ("q4_k_m", "q5_k_m"; case-insensitive).
Status set_weight_type(GenModelOptions& opts, const std::string& name);

// The 2-D weight tensors of a llama model, for weight_type_for.
enum class WeightRole {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown
};

// Storage type of one 2-D weight: role, layer (-1 for token_embd / output), row length ne0.
//   Uniform types: every weight is opts.type; token_embd and output are opts.embd_type when
//   set, else Q6_K for the types of 5 bits or fewer (as llama.cpp's quantizer makes them), else
//   opts.type.
//   Q4_K_M / Q5_K_M (base Q4_K / Q5_K): output.weight (token_embd.weight when the output is
//   tied) is Q6_K; attn_v and ffn_down are Q6_K in the first and last eighth of the layers and
//   every third layer in between (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2), "half of
//   attn_v and ffn_down" in llama.cpp's description; every other weight is the base type.
// Rows that the chosen type's block does not divide take llama.cpp's fallback: Q4_K -> Q5_0,
// Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K / IQ4_XS -> IQ4_NL; a row that no 32-element block
// divides is stored as F16.
Type weight_type_for(const GenModelOptions& opts, WeightRole role, int layer, int n_layer,
                     bool tied_output, int64_t ne0);

// Writes a GGUF model of the preset's architecture with random weights (uniform, std 0.02;
// norms 1, biases 0) and a valid SentencePiece-style vocabulary of preset.n_vocab tokens
// (control, 256 byte tokens, pieces), or the tokenizer of opts.tokenizer_dir.
Status generate_model(const ModelPreset& preset, const GenModelOptions& opts,
                      const std::string& path);

}  // namespace ferry
