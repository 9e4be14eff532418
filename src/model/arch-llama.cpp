// llama (Llama 1-3, and files in its layout): pre-norm attention and SwiGLU feed-forward.
// Rope rotates adjacent pairs because the converter permutes the Q/K rows into that order;
// Llama 3.1+ files add rope frequency factors (rope_freqs.weight, loaded for every
// architecture by the model loader).
#include "model/arch.h"

namespace ferry {

namespace {

Status take_layer(TensorLoader& t, int il, LlamaLayer& l) {
    FERRY_TRY(t.take_attention(il, l));
    return t.take_ffn(il, l);
}

}  // namespace

const Arch kArchLlama = {"llama", kRopeNormal, take_layer, build_pre_norm_layer};

}  // namespace ferry
