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
};

// Known presets ("llama-3.2-1b", "tiny", ...).
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
};

// Writes a GGUF llama model with random weights (normal, std 0.02; norms 1) and a valid
// SentencePiece-style vocabulary of preset.n_vocab tokens (control, 256 byte tokens, pieces).
Status generate_model(const ModelPreset& preset, const GenModelOptions& opts,
                      const std::string& path);

}  // namespace ferry
