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
};
Stats stats();

// Test hook: ops the OpenVINO devices decline in supports_op (so the scheduler runs them on
// the CPU), e.g. to show a split graph working. Empty by default.
void set_declined_ops(const std::vector<Op>& ops);

}  // namespace openvino
}  // namespace ferry
