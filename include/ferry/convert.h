// Conversion of a Hugging Face model folder into a GGUF file, with the metadata keys, tensor
// names and layouts of the public GGUF converter (convert_hf_to_gguf.py conventions):
//
//   config.json                 architecture and hyperparameters
//   *.safetensors               weights (F32/F16/BF16); sharded through
//                               model.safetensors.index.json's weight_map
//   tokenizer.json              vocabulary and merges  } -> tokenizer.ggml.* keys
//   tokenizer_config.json       special tokens, template }
//
// Architectures: LlamaForCausalLM -> llama (Q/K rows permuted from Hugging Face's rotate-half
// order into adjacent pairs; Llama 3 "llama3" rope scaling becomes rope_freqs.weight),
// Qwen2ForCausalLM -> qwen2, Qwen3ForCausalLM -> qwen3. Weights are stored as HF stores them
// ([out, in] row-major is GGUF's ne = [in, out]); 1-D tensors (norms, biases) stay F32.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ferry/gguf.h"
#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry {

struct ConvertOptions {
    std::string hf_dir;
    std::string out_path;
    // Type of the 2-D weights. A row length the type's blocks do not divide falls back to a
    // type they do (see convert_fallback_type).
    Type type = Type::F16;
    bool force = false;  // overwrite an existing out_path
    int n_threads = 0;   // quantization threads (0: all cores)
    // Called after each tensor: bytes of input done, bytes in all, the GGUF tensor name.
    std::function<void(uint64_t done, uint64_t total, const std::string& name)> progress;
};

Status convert_hf_to_gguf(const ConvertOptions& opts);

// Llama 3.1's rope frequency divisors (rope_freqs.weight, [head_dim / 2]) for Hugging Face's
// "llama3" rope scaling: factor, low_freq_factor, high_freq_factor and
// original_max_position_embeddings.
std::vector<float> llama3_rope_factors(int64_t head_dim, double rope_theta, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       int64_t original_ctx);

// The type a 2-D weight of rows of ne0 elements gets when `want` was asked for: `want` when
// its block size divides ne0, else the nearest type whose blocks do (Q8_0 when 32 divides
// ne0, F16 otherwise).
// TODO(types): once Q5_0/Q5_1 land, fall back as llama.cpp's quantizer does (Q4_K -> Q5_0,
// Q5_K -> Q5_1, Q6_K -> Q8_0) and enable ConvertOracle.NotMultipleOf256FallsBackToQ5 in
// tests/test_convert.cpp.
Type convert_fallback_type(Type want, int64_t ne0);

// Adds the tokenizer.* keys the public converter writes for dir/tokenizer.json (byte-level BPE:
// tokenizer.ggml.model "gpt2", the pre-tokenizer recognised from its regex, tokens padded to
// n_vocab with [PADi]) and dir/tokenizer_config.json when present (special ids, add_bos,
// chat template). Errors name the file and the field.
Status convert_tokenizer(const std::string& dir, int64_t n_vocab, GgufWriter& w);

}  // namespace ferry
