// Internals shared by the llama loader (llama.cpp) and the inference session
// (llama-session.cpp): the weight tensors and where they live.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/backend.h"
#include "ferry/gguf.h"
#include "ferry/llama.h"
#include "ferry/tensor.h"
#include "ferry/vocab.h"

namespace ferry {

struct LlamaLayer {
    Tensor* attn_norm = nullptr;  // [n_embd] f32
    Tensor* wq = nullptr;         // [n_embd, n_head * head_dim]
    Tensor* wk = nullptr;         // [n_embd, n_head_kv * head_dim]
    Tensor* wv = nullptr;         // [n_embd, n_head_kv * head_dim]
    Tensor* wo = nullptr;         // [n_head * head_dim, n_embd]
    Tensor* ffn_norm = nullptr;   // [n_embd] f32
    Tensor* ffn_gate = nullptr;   // [n_embd, n_ff]
    Tensor* ffn_up = nullptr;     // [n_embd, n_ff]
    Tensor* ffn_down = nullptr;   // [n_ff, n_embd]
};

struct LlamaModel::Impl {
    std::string path;
    std::unique_ptr<GgufFile> gguf;
    LlamaHParams hp;
    Vocab vocab;
    Device* device = nullptr;           // the main device (the output's)
    std::vector<Device*> layer_device;  // per layer: weights and KV cache
    Device* input_device = nullptr;     // the token embeddings'

    Context weights;  // metadata of every weight tensor (leaves flagged kTensorParam)
    std::vector<std::unique_ptr<Buffer>> buffers;  // one per device holding weights
    Tensor* tok_embd = nullptr;                    // [n_embd, n_vocab]
    Tensor* output_norm = nullptr;                 // [n_embd] f32
    Tensor* output = nullptr;                      // [n_embd, n_vocab] (tok_embd when tied)
    std::vector<LlamaLayer> layers;

    uint64_t n_params = 0;
    uint64_t size_bytes = 0;
    std::string type_desc;
};

}  // namespace ferry
