// Architectures: the shared pieces (weights loader, norms, attention, feed-forward) and one
// short descriptor per architecture (arch-llama.cpp, arch-qwen2.cpp, arch-qwen3.cpp) that says
// which weights a layer has and how a layer is put together from the pieces.
//
// Every architecture here is a pre-norm decoder: x += attention(norm(x)); x += ffn(norm(x)).
// They differ in the details the pieces take as options: rope mode (llama: adjacent pairs, as
// the converter permutes Q/K rows; qwen: NeoX halves), Q/K/V biases (qwen2), per-head RMS norm
// of Q and K before rope (qwen3), and rope frequency factors (Llama 3.1+).
#pragma once

#include <string>
#include <vector>

#include "ferry/gguf.h"
#include "ferry/tensor.h"
#include "model/llama-impl.h"

namespace ferry {

// Reads and checks weight tensors of a GGUF file into a model's metadata context.
class TensorLoader {
  public:
    explicit TensorLoader(LlamaModel::Impl& m) : m_(m), f_(*m.gguf) {}

    // Creates the tensor `name`, checking presence, shape and type; `f32_only` for norms and
    // biases (which every converter stores as F32).
    Status take(const std::string& name, std::initializer_list<int64_t> shape, bool f32_only,
                Tensor** out);
    // As take, but a missing tensor leaves *out null.
    Status take_optional(const std::string& name, std::initializer_list<int64_t> shape,
                         bool f32_only, Tensor** out);
    // F32 tensor values straight from the file (for checks at load, e.g. rope factors).
    const float* f32_data(const Tensor* t) const;

    // The pieces every architecture here has.
    Status take_attention(int il, LlamaLayer& l);  // attn_norm, Q, K, V, output
    Status take_qkv_bias(int il, LlamaLayer& l);   // attn_{q,k,v}.bias
    Status take_qk_norm(int il, LlamaLayer& l);    // attn_{q,k}_norm.weight [head_dim]
    Status take_ffn(int il, LlamaLayer& l);        // ffn_norm, gate, up, down
    Status take_rope_freqs();                      // rope_freqs.weight [n_rot / 2], optional

    const std::vector<const GgufTensorInfo*>& infos() const { return infos_; }
    const std::vector<Tensor*>& tensors() const { return tensors_; }

  private:
    LlamaModel::Impl& m_;
    const GgufFile& f_;
    std::vector<const GgufTensorInfo*> infos_;
    std::vector<Tensor*> tensors_;
};

// What one forward pass needs besides the weights: inputs, KV cache and shape parameters.
struct ForwardContext {
    Context& c;
    const LlamaModel::Impl& m;
    Tensor* pos;       // [n_tokens] i32
    Tensor* mask;      // [n_kv, n_tokens] f16, or nullptr
    Tensor* k_cache;   // this layer's [hd * n_head_kv, n_ctx]
    Tensor* v_cache;   // this layer's [hd * n_head_kv, n_ctx]
    int64_t n_tokens;  // new tokens
    int64_t n_kv;      // attended positions (padded)
    int64_t n_out;     // rows kept after this layer's attention (n_tokens but last layer)
    Type kv_type;
    // The rows kept (last layer, when the graph selects them): [n_out] i32 token rows, and the
    // mask rows of those tokens [n_kv, n_out] f16. nullptr: every row is kept (n_out ==
    // n_tokens). Selecting by index rather than by a view at an offset keeps the graph's
    // structure the same for every token count, so prefill and decode share one compilation.
    Tensor* out_ids = nullptr;
    Tensor* mask_out = nullptr;
};

// x * rsqrt(mean(x^2) + eps) * w over dim 0.
Tensor* build_rms_norm(ForwardContext& f, Tensor* x, Tensor* w);
// Self-attention of layer l over the cache for cur = norm(x) [n_embd, n_tokens]: projections
// (+ biases when the layer has them), per-head Q/K norms (when it has them), rope (with the
// model's frequency factors), KV store, attention, output projection. Returns [n_embd, n_out]:
// the last n_out token rows only.
Tensor* build_attention(ForwardContext& f, const LlamaLayer& l, Tensor* cur);
// The kept token rows of x [n_embd, n_tokens] (x itself when all are kept).
Tensor* keep_out_rows(ForwardContext& f, Tensor* x);
// down(silu(gate(cur)) * up(cur)): [n_embd, n] -> [n_embd, n].
Tensor* build_ffn_swiglu(ForwardContext& f, const LlamaLayer& l, Tensor* cur);

// The pre-norm decoder layer of every architecture here (their differences are weights the
// pieces use when a layer has them): x += attention(norm(x)); x += ffn_swiglu(norm(x)).
// x [n_embd, n_tokens] -> [n_embd, n_out].
Tensor* build_pre_norm_layer(ForwardContext& f, const LlamaLayer& l, Tensor* x);

struct Arch {
    const char* name;  // general.architecture, also the metadata key prefix
    int rope_mode;     // kRopeNormal or kRopeNeox
    // Loads layer il's weights.
    Status (*take_layer)(TensorLoader& t, int il, LlamaLayer& l);
    // Layer il on x [n_embd, n_tokens] -> [n_embd, n_out].
    Tensor* (*build_layer)(ForwardContext& f, const LlamaLayer& l, Tensor* x);
};

extern const Arch kArchLlama;
extern const Arch kArchQwen2;
extern const Arch kArchQwen3;

// The architecture named by general.architecture, or nullptr.
const Arch* find_arch(const std::string& name);
// "llama, qwen2, qwen3".
std::string known_arch_names();

}  // namespace ferry
