#include "embedded-model.h"

extern "C" const uint8_t ferry_demo_model_start[];
extern "C" const uint8_t ferry_demo_model_end[];

namespace ferry {

EmbeddedModel embedded_demo_model() {
    return {ferry_demo_model_start,
            static_cast<size_t>(ferry_demo_model_end - ferry_demo_model_start),
            "embedded:tiny-llama-q8_0.gguf"};
}

}  // namespace ferry
