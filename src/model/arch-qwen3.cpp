// qwen3 (dense Qwen 3): the llama layer with an RMS norm over each head of Q and of K before
// rope (weights [head_dim] shared by the heads), no biases, NeoX rope, and a head size that
// the file gives (attention.key_length), not n_embd / n_head.
#include "model/arch.h"

namespace ferry {

namespace {

Status take_layer(TensorLoader& t, int il, LlamaLayer& l) {
    FERRY_TRY(t.take_attention(il, l));
    FERRY_TRY(t.take_qk_norm(il, l));
    return t.take_ffn(il, l);
}

}  // namespace

const Arch kArchQwen3 = {"qwen3", kRopeNeox, take_layer, build_pre_norm_layer};

}  // namespace ferry
