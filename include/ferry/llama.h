// Decoder-only LLMs (llama, qwen2, qwen3; src/model/arch*.{h,cpp}): model loading and inference
// sessions with a KV cache.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/backend.h"
#include "ferry/gguf.h"
#include "ferry/status.h"
#include "ferry/vocab.h"

namespace ferry {

// Hyperparameters of the decoder architectures ferry runs (llama, qwen2, qwen3), read from the
// GGUF keys "<arch>.*".
struct LlamaHParams {
    std::string arch = "llama";  // general.architecture
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_embd = 0;
    int32_t n_layer = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;  // n_embd / n_head unless the file says otherwise
    int32_t n_ff = 0;
    int32_t n_rot = 0;  // rotated dims per head
    float rope_freq_base = 10000.0f;
    float rope_freq_scale = 1.0f;  // 1 / linear scaling factor
    int rope_mode = 0;             // kRopeNormal (llama) or kRopeNeox (qwen)
    float norm_eps = 1e-5f;
    bool tied_output = false;
};

struct ModelOptions {
    // Devices to offload layers to (empty: everything on the CPU). A layer's weights and its
    // KV cache live on one device; the scheduler runs each layer where its weights are.
    std::vector<Device*> devices;
    // How many layers go to `devices` (llama.cpp's -ngl), the last ones: layers
    // [0, n_layer - n_gpu_layers) stay on the CPU. -1 (or more than n_layer): every layer,
    // with the token embeddings on the first offloaded layer's device and the output on the
    // last one's. With fewer, the token embeddings stay on the CPU.
    int32_t n_gpu_layers = -1;
    // Share of the offloaded layers per device of `devices` (llama.cpp's --tensor-split),
    // as contiguous runs in order; empty: equal shares.
    std::vector<float> tensor_split;
    // CPU only: compute straight from the memory-mapped file (no copy, page cache shared with
    // other processes, fastest start). Otherwise the weights are read into the CPU's own
    // memory, in huge pages where the system allows: decode is faster (fewer TLB misses).
    // The model compiled into the binary is always used in place.
    bool mmap = false;
    // Called with progress in [0, 1] while weights load.
    std::function<void(float)> progress;
};

class LlamaModel {
  public:
    // Loads a GGUF file.
    static Expected<std::unique_ptr<LlamaModel>> load(const std::string& path,
                                                      const ModelOptions& opts);
    // Loads an opened GGUF (e.g. one in memory: GgufFile::from_memory); path() is its name.
    static Expected<std::unique_ptr<LlamaModel>> load(std::unique_ptr<GgufFile> file,
                                                      const ModelOptions& opts);
    ~LlamaModel();

    const LlamaHParams& hparams() const;
    const Vocab& vocab() const;
    const GgufFile& gguf() const;
    const std::string& path() const;
    uint64_t n_params() const;
    uint64_t size_bytes() const;  // bytes of weights
    // Bytes of weights a one-token step reads: every weight whole but the token embeddings,
    // of which it reads one row (all of them where the output shares that matrix).
    uint64_t step_weight_bytes() const;
    std::string type_desc()
        const;  // dominant weight type, e.g. "Q4_0" (from general.file_type or tensors)
    Device* device() const;  // where the last layer (and the output) lives: the main device
    // Where each layer's weights and KV cache live.
    Device* layer_device(int32_t il) const;

    struct Impl;
    Impl* impl() const { return impl_.get(); }

  private:
    LlamaModel() = default;
    std::unique_ptr<Impl> impl_;
};

struct SessionOptions {
    int32_t n_ctx = 0;      // 0: the model's training context, capped at 4096
    int32_t n_batch = 512;  // tokens per forward pass when decoding long prompts
    Type kv_type = Type::F16;
    // The attended KV length is rounded up to a multiple of this (the positions past the end
    // masked), so that kv_pad consecutive one-token steps share one graph (and one captured
    // CUDA graph); a larger pad rebuilds less often and attends over more masked positions.
    // 0: 256 when a device of the model replays captured graphs (DeviceCaps::graph_replay:
    // CUDA, also served), 32 otherwise.
    int32_t kv_pad = 0;
    int n_threads = 0;  // CPU threads (0: all cores)
    // Folder where graph-compiling devices (OPENVINO:*) keep their compiled models, so a second
    // start loads instead of compiling (BackendOptions::cache_dir). Empty: none.
    std::string cache_dir;
};

class LlamaSession {
  public:
    static Expected<std::unique_ptr<LlamaSession>> create(LlamaModel& model,
                                                          const SessionOptions& opts);
    ~LlamaSession();

    // Runs tokens at positions [n_past, n_past + tokens.size()), appending to the KV cache.
    // Logits for every position when all_logits, else only for the last. Fails (leaving the
    // cache as it was) when a token id is outside the vocabulary or the context would overflow.
    Status decode(std::span<const int32_t> tokens, bool all_logits);
    // Logits of row i of the last decode ([n_vocab] floats); with all_logits=false, row 0 is
    // the last token. nullptr after a decode that read only the best k (set_top_k).
    const float* logits(int32_t i) const;
    // With k > 0, a decode without all_logits reads back only the k best logits of the last
    // row and their ids (the TOP_K op on the output's device, scheduled like any op), which is
    // what a greedy or top-k sampler needs (Sampler::candidates_needed): 8k bytes instead of
    // 4 n_vocab, which counts when the device is remote. 0 (the default): the whole row.
    // Clamped to n_vocab; 0 where the logits' device does not run TOP_K (top_k() tells) or
    // with FERRY_DEVICE_TOPK=0.
    void set_top_k(int32_t k);
    int32_t top_k() const;
    // The k of the last decode's candidates (0 when it read logits), their logits (best first;
    // ties: lower id first; NaN as -inf) and their ids.
    int32_t n_top() const;
    const float* top_logits() const;
    const int32_t* top_ids() const;
    int32_t n_logit_rows() const;
    int32_t n_past() const;
    int32_t n_ctx() const;
    int32_t kv_pad() const;  // SessionOptions::kv_pad, or the device's choice for 0
    void reset();            // empties the KV cache
    // Keeps the first n_past positions of the KV cache (no-op when n_past >= n_past()), so a
    // chat can reuse the cached prefix of a conversation that was re-tokenized differently.
    void truncate(int32_t n_past);
    size_t kv_bytes() const;

    struct Impl;

  private:
    LlamaSession() = default;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
