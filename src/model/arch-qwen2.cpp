// qwen2 (Qwen 1.5, Qwen 2, Qwen 2.5): the llama layer with biases on the Q, K and V projections
// and NeoX rope (Hugging Face's rotate-half order, which its converter keeps).
#include "model/arch.h"

namespace ferry {

namespace {

Status take_layer(TensorLoader& t, int il, LlamaLayer& l) {
    FERRY_TRY(t.take_attention(il, l));
    FERRY_TRY(t.take_qkv_bias(il, l));
    return t.take_ffn(il, l);
}

}  // namespace

const Arch kArchQwen2 = {"qwen2", kRopeNeox, take_layer, build_pre_norm_layer};

}  // namespace ferry
