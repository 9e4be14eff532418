// The OpenVINO backend: a ferry device per OpenVINO device ("OPENVINO:CPU", ...). It never runs
// an op itself: each graph it receives is translated into an ov::Model (translate.h), compiled
// once per structural graph key (graph_signature, dynamic dims left open) and run with the live
// tensors bound in place. Weights are converted once, in prepare_weights (weights.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/backend.h"

namespace ferry {

std::unique_ptr<Registry> make_openvino_registry();

namespace openvino {

// Counters over the process, for tests and benchmarks.
struct Stats {
    uint64_t compiles = 0;    // models compiled (cache misses)
    uint64_t cache_hits = 0;  // computes served by an already compiled model
    double compile_ms = 0.0;  // time spent translating and compiling
    uint64_t runs = 0;        // inferences
    // Bytes the backend copies on the host per run, summed: results into ferry's tensors,
    // the elements written into ferry's storages (the new KV rows), quantized leaves that
    // were not prepared, dequantized for the run. Everything else is bound in place.
    uint64_t bytes_copied = 0;
    // Bytes of KV cache leaves bound in place by their attended rows (translate.h, window),
    // summed over runs: the part of each cache the plugin is shown.
    uint64_t bytes_bound_window = 0;
    // FLASH_ATTN_EXT nodes of the compiled models that read their KV cache in place (no copy
    // of the window with the step's rows scattered in; translate.cpp, attend_in_place).
    uint64_t attention_in_place = 0;
};
Stats stats();

// Test hook: ops the OpenVINO devices decline in supports_op (so the scheduler runs them on
// the CPU), e.g. to show a split graph working. Empty by default.
void set_declined_ops(const std::vector<Op>& ops);

// Test hook: attention over a KV cache reads it in place (true, the default) or through a
// copy of the attended rows with the step's rows scattered in (false: the translation before
// 2026-12-02), for comparing the two. Applies to models compiled afterwards (defined in
// translate.cpp).
void set_attention_in_place(bool on);

}  // namespace openvino
}  // namespace ferry
