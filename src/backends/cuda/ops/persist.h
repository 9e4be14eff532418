// The persistent decode step (persist.cu): a batch-1 decode step of a Llama-style model, from
// the first layer's RMS norm to the logits, as one cooperative launch of one block per SM. A
// producer warp a block copies every weight tile the block will use, product after product and
// layer after layer, into a ring of shared-memory stages without waiting for any activation;
// eight consumer warps wait for each phase's input and sum the tiles as they land.
// Activations cross blocks as tagged words (a value and the phase and launch that wrote it),
// so a reader waits on the values themselves (docs/design-notes.md, CUDA; the prototype and
// its measurements: bench/bench_cuda_persist.cu, bench/results/cuda.md stops 48-51).
//
// The backend lowers a decode graph to it (CudaBackend::plan_persist) when every node between
// the first norm and the logits is the pattern arch-common.cpp builds and the shapes fit
// (persist_shapes_ok); any other graph keeps the kernel-per-node plan.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda-backend.h"
#include "ferry/graph.h"

namespace ferry::cuda {

// One layer's tensors, as the graph holds them (device addresses). Weights F16 or BF16
// (PersistModel::bf16), row-major (rows x K); the caches F16, a row a position of n_head_kv
// heads of head_dim.
struct PersistLayer {
    const void* wq = nullptr;
    const void* wk = nullptr;
    const void* wv = nullptr;
    const void* wo = nullptr;
    const void* gate = nullptr;
    const void* up = nullptr;
    const void* down = nullptr;
    const float* attn_norm = nullptr;  // [n_embd]
    const float* ffn_norm = nullptr;   // [n_embd]
    void* kc = nullptr;
    void* vc = nullptr;
    const uint16_t* mask = nullptr;  // F16 [n_kv]: added to the scores (-inf: not attended)
};

// A decode step as the persistent kernel runs it.
struct PersistModel {
    int n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    int64_t n_vocab = 0;
    float eps = 0.0f;       // every RMS norm's
    float kq_scale = 0.0f;  // the attention's
    // Rope (normal mode: adjacent pairs) of the first n_rot dimensions of each q and k head.
    int n_rot = 0;
    double rope_base = 0.0, rope_scale = 1.0;
    const char* rope_ff = nullptr;  // frequency factors (F32) or nullptr
    int64_t rope_ff_nb0 = 0;
    const float* x0 = nullptr;  // the step's input row (F32 [n_embd]), written before the launch
    const float* out_norm = nullptr;
    const void* w_out = nullptr;   // [n_vocab, n_embd], of the layers' weight type
    bool bf16 = false;             // every weight BF16 (else every one F16)
    float* logits = nullptr;       // [n_vocab] F32
    const int32_t* pos = nullptr;  // the position: rope's and the caches' row (device memory)
    // The index picking the last layer's one row (GET_ROWS by the step's out_ids), or nullptr:
    // anything but 0 is GET_ROWS's out-of-range error.
    const int32_t* out_ids = nullptr;
    int n_kv = 0;  // keys attended: cache rows [0, n_kv)
    // The attention's blocks a head at most (1, 2 or 4; 0: 4): as many as the SMs take.
    int splits = 0;
    // Weight copies in flight a block (0: the kernel's own, 3), in the attention's chain: in
    // q/k/v, in a block's attention split, while a block waits for wo's input (a block with no
    // split waits from the attention's start), in wo (each 0: the kernel's own, 1), and in the
    // output phase (0: as `inflight`). Each at most the kernel's stages less one.
    int inflight = 0;
    int chain[4] = {0, 0, 0, 0};
    int out_inflight = 0;
    // Per-phase stamps of each block (a diagnostic, FERRY_CUDA_PERSIST_STAMPS=1): the last
    // launch's, summed up per phase on stderr when the Persist goes.
    bool stamps = false;
    int64_t cache_rows = 0;       // rows of each cache (the position's range)
    int64_t cache_row_bytes = 0;  // bytes from a cache row to the next
    std::vector<PersistLayer> layers;
};

// Whether the kernel nodes of g (kn: in order, views left out) hold a decode step's layers
// and logits as arch-common.cpp builds them: then kn[*lo .. *hi] are the nodes the persistent
// step replaces and *m describes it, its addresses from `addr` (device_ptr: a tensor's
// element 0 in this device's memory, nullptr elsewhere; a test may pass host addresses to
// match a graph the CPU runs); else why names the first thing that did not match.
using PersistAddr = char* (*)(const Tensor*);
bool match_persist(const Graph& g, const std::vector<const Tensor*>& kn, size_t* lo, size_t* hi,
                   PersistModel* m, std::string* why, PersistAddr addr = device_ptr);

// Whether the kernel takes these shapes; why not (for FERRY_CUDA_PERSIST_WHY) otherwise.
// smem_max > 0: a device of n_sm SMs with that much shared memory a block and cooperative
// launch (a test's stand-in; 0: the current device's own).
bool persist_shapes_ok(const PersistModel& m, int n_sm, std::string* why, int smem_max = 0);

// The device side of the lowering: each distinct model's table of phases (kept until the
// backend goes, since a captured graph may replay any of them), the activation words and the
// launch counter. One per backend; its launches run in stream order.
class Persist {
  public:
    Persist();
    ~Persist();
    Persist(const Persist&) = delete;
    Persist& operator=(const Persist&) = delete;
    // Builds (or finds) m's table; `*id` then names it for launch.
    Status prepare(const PersistModel& m, int device, int n_sm, int* id);
    // With ctx.host_out, the launch also stores the logits into the host memory it names.
    Status launch(const OpContext& ctx, int id) const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::cuda
