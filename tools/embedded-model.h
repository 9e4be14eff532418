// The demo model compiled into the binary (models/tiny-llama-q8_0.gguf).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

struct EmbeddedModel {
    const uint8_t* data;
    size_t size;
    const char* name;  // for messages, e.g. "embedded:tiny-llama-q8_0.gguf"
};

EmbeddedModel embedded_demo_model();

}  // namespace ferry
