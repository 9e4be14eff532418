// The CUDA backend: every visible NVIDIA GPU as a device CUDA0, CUDA1, ...
//
// Device buffers (cudaMalloc), a pinned host buffer type, one stream per Backend with
// asynchronous set/get/copy, real events, kernels for every op of the llama graph (ops/), and
// decode steps replayed as CUDA graphs. With no GPU (or no driver) the registry lists nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/backend.h"

namespace ferry {
// The registry of CUDA devices (never fails; zero devices without a GPU or driver).
std::unique_ptr<Registry> make_cuda_registry();
}  // namespace ferry

namespace ferry::cuda {

// Test hook: ops the CUDA devices decline in supports_op (so the scheduler runs them on the
// CPU), e.g. to show the fallback working. Empty by default.
void set_declined_ops(const std::vector<Op>& ops);

// Test hook: graphs lowered to the persistent decode step (persist.h) since the process
// started.
uint64_t persist_plans();
// Test hook: reads of a result that copied nothing since the process started: the step queued
// ahead (the persistent step, or the graph's last product) had stored it into the read's host
// memory itself.
uint64_t host_reads();

// Test hook: decode attention launches queued with their rows loaded before the wait
// (k_attn_row's early form) since the process started.
uint64_t early_attention_launches();
// Of those, the launches that also read the cache rows' indices before the wait.
uint64_t early_index_launches();
// Of those, the launches that read the mask first and loaded no row past its last visible key.
uint64_t early_mask_launches();
// Of those, the launches that asked for weights in L2 (AttnEarly::next).
uint64_t l2_ask_launches();

// Test hook: decode steps queued ahead (CudaBackend::compute_ahead) since the process started;
// of those, the ones started by their inputs (run_ahead; the rest ran again with the inputs of
// the step before), and the ones released because no inputs came in time.
struct AheadCounts {
    uint64_t queued = 0, started = 0, idle = 0;
};
AheadCounts ahead_counts();

// Device address of a tensor's element 0 (the tensor must be in a CUDA buffer), else nullptr.
char* device_ptr(const Tensor* t);

// Errors kernels find in data (an out-of-range row index) are reported through this word in
// host-mapped memory: the first error wins. Read after the stream's work finished.
struct DeviceError {
    int32_t code;   // 0: none; otherwise the Op that failed + 1
    int32_t value;  // the offending value (e.g. the index)
    int64_t limit;  // the valid range's end
    int64_t where;  // the flat position of the offending index
};

// Scratch device memory a kernel may use for one node (reused by the next node: the stream
// orders them). Sized before launching, never grown while a graph is captured.
struct Scratch {
    char* ptr = nullptr;
    size_t size = 0;
};

// Rows of one K or V view of a decode attention that the graph writes before it: SET_ROWS
// into the cache with `n` I32 indices at `idx` (device memory), cache row r holding key
// r - j0 of the view. AttnEarly lists both views' writers.
constexpr int kAttnEarlyMaxRows = 32;  // n at most (CudaBackend::early_rows, k_attn_row)
struct AttnRowsWritten {
    const int32_t* idx = nullptr;
    int n = 0;
    int64_t j0 = 0;
};
// Weights asked for in L2 by a launch (one cp.async.bulk.prefetch.L2 a warp and range; the
// ranges split evenly over the launch's warps): up to three ranges, each 16-byte aligned,
// sizes multiples of 256 bytes (n == 0: none).
struct L2Ask {
    const char* p[3] = {nullptr, nullptr, nullptr};
    uint32_t bytes[3] = {0, 0, 0};
    int n = 0;
};
struct AttnEarly {
    AttnRowsWritten k, v;
    // No kernel of the graph writes the indices (they are its inputs, in place before its
    // first kernel starts): k_attn_row may read them before griddepcontrol.wait too.
    bool idx_ready = false;
    // Nor the mask: k_attn_row reads it first and loads only the rows up to the last key it
    // lets through.
    bool mask_ready = false;
    // The first bytes of the product after the next one (gate and up, after wo), asked for in
    // L2 by the attention at its start (CudaBackend::plan_l2_next; FERRY_CUDA_L2_NEXT=KiB).
    L2Ask next;
};

// Progressive results (CudaBackend::read_in_pieces), the flagged mirror: a one-column
// product's rows also go, as they are summed, into host-mapped memory. The streaming kernel's
// warps then take runs of kMirrorGroup (G) rows (warp gw's k-th run: rows (k W + gw) G ...,
// so step k, every warp's k-th run, is rows [k W G, (k + 1) W G)). After each run a warp writes
// its G rows as one line and counts itself into step k's counter (a gpu-scope release); the
// warp that completes a step resets the counter, fences at system scope and sets the step's
// host flag (one system fence a step: mv-stream.cu's mirror_row says why that is enough). The host
// clears the flags before a run and sends a step once its flag is set: no scan of the rows, no
// copy, no extra launch. Measured on the H200 (bench/results/cuda.md, stop 31): single 4-byte
// stores to host memory cost ~90 us a step for 128K rows, 32-byte writes ~13 us, 64-byte lines
// nothing measurable; a reader that scanned the rows for a sentinel instead of flags lost to the
// cut form served over tcp.
constexpr int kMirrorGroup = 8;
constexpr int kMirrorSteps = 64;  // at most this many steps (W G rows each) a product
struct HostMirror {
    uint32_t* buf = nullptr;    // device address of the rows (host-mapped), stride words
    int64_t stride = 0;         // words (a multiple of kMirrorGroup)
    uint32_t* flags = nullptr;  // device address of kMirrorSteps host-mapped words
    uint32_t* count = nullptr;  // device memory: kMirrorSteps counters, 0 between runs
};

struct OpContext {
    cudaStream_t stream = nullptr;
    int device = 0;
    int n_sm = 1;
    DeviceError* err = nullptr;  // device-visible address of the error word
    Scratch scratch;
    void* cublas = nullptr;  // cublasHandle_t, created on first use by a prefill product
    const struct CublasApi* cublas_api = nullptr;  // loaded with it (cublas-api.h)
    // 65536 zeroed ints kernels may count in (each leaves them zero again): the flash-attention
    // splits of a row count themselves there so the last one merges.
    int32_t* counters = nullptr;
    // Decode products of block-format weights stream their rows through shared memory (the
    // int8 kernel's ring form; FERRY_CUDA_MV_RING=0 when the backend is made turns it off).
    bool mv_ring = true;
    // Q4_0 decode products take whole block pairs per lane (the int8 kernel's block-lane form;
    // FERRY_CUDA_MV_BLK=0 when the backend is made turns it off).
    bool mv_blk = true;
    // Plain-weight (F16/BF16/F32) decode products keep their chunks raw until used, so that
    // more are in flight (the float kernel's raw form; FERRY_CUDA_MV_FRAW=0 turns it off).
    bool mv_raw = true;
    // The float kernel's capped launch asks for each block's next row group in L2 as it starts
    // a group (FERRY_CUDA_MV_FNEXT=0 turns it off).
    bool mv_next = true;
    // The int8 kernel's folded RMS norm loads its row in one round trip and its weight before
    // the wait (norm_prologue_fast; FERRY_CUDA_MV_NFAST=0 turns it off).
    bool mv_nfast = true;
    // Decode attention over more keys than one k_attn_row block takes is split into such
    // blocks and merged (FERRY_CUDA_ATTN_CHUNKS=0: one block per KV head, k_attn_decode).
    bool attn_chunks = true;
    // F16, BF16, Q4_0 and Q6_K decode products run in the streaming form (k_mv_stream: a grid
    // of at most two blocks per SM streaming pieces of rows, b in shared memory, the RMS norm
    // folded in; FERRY_CUDA_MV_STREAM=0 turns it off).
    bool mv_stream = true;
    // Its launches without a folded norm (wo, down) run one block of 16 warps per SM instead
    // of two of 8: 1 for Q4_0/Q6_K weights (the default), 2 for F16/BF16 too, 0 never
    // (FERRY_CUDA_MV_STREAM_WIDE).
    int mv_stream_wide = 1;
    // Products of the streaming form in its bulk form (k_mv_bulk: the pieces in flight in
    // shared memory): mv_bulk slots a warp for F16/BF16 (4 KiB each), mv_bulk_q for Q4_0/Q6_K
    // (one span each), at most mv_bulk_blocks blocks per SM (FERRY_CUDA_MV_BULK=S,
    // FERRY_CUDA_MV_BULK_Q=S, FERRY_CUDA_MV_BULK_BLOCKS=N; S = 0: the register form).
    // Measured on the H200 (bench/results/cuda.md, stop 34): 1B F16 tg128 with S = 2 and two
    // blocks per SM 1,163 t/s (median of 8 rounds) against the register form's 1,110, every
    // other shape slower; 1B Q4_0 slower with every shape (1,462-1,526 at best against
    // 1,701-1,777). So F16/BF16 take the bulk form in two blocks per SM, Q4_0/Q6_K the
    // register form. S = 3 since stop 41 (H100, bench/results/cuda.md): with the slots shrunk
    // until two blocks fit (launch_bulk_t: down, b's 32 KiB, keeps 2), 1B F16 tg128 +0.9% and
    // +1.5% over S = 2 in two runs side by side (S = 3 had put down in one block per SM).
    int mv_bulk = 3;
    int mv_bulk_q = 0;
    bool mv_bulk_xglobal = false;  // FERRY_CUDA_MV_BULK_XGLOBAL=1 (bulk_x_global)
    bool mv_bulk_fit = true;       // FERRY_CUDA_MV_BULK_FIT=0 (launch_bulk_t)
    int mv_bulk_blocks = 2;
    // Slots a warp issues before griddepcontrol.wait where b is computed after it (the rest
    // once b's loads are issued; 0: all S; FERRY_CUDA_MV_BULK_PRE=N; k_mv_bulk). Measured with
    // S = 3 (stop 41, H100, five rounds side by side): 1B F16 tg128 median 931.0 t/s with 2
    // against 925.3 with all 3 (every round higher), 928.9 with 1.
    int mv_bulk_pre = 2;
    // Set by the backend for one FLASH_ATTN_EXT launch of a captured graph whose K and V rows
    // are written in that graph only by the SET_ROWS listed: k_attn_row then loads the rows
    // before griddepcontrol.wait and reloads the listed ones after it (nullptr: after it, all).
    const AttnEarly* attn_early = nullptr;
    // The early form's indices read before the wait where they are the graph's inputs
    // (FERRY_CUDA_ATTN_EARLY_IDX=0: after it), and its dependents' launch allowed once its loads
    // after the wait are issued (FERRY_CUDA_ATTN_LATE_TRIGGER=1; else at the wait).
    bool attn_early_idx = true;
    bool attn_late_trigger = false;
    // The early form's mask read before its loads where it is the graph's input, and no row
    // past the last key it lets through loaded (FERRY_CUDA_ATTN_EARLY_MASK=0: every row).
    bool attn_early_mask = true;
    // Set by the backend for the launch of a progressive product (HostMirror); the product's
    // launcher sets mirror_taken when its kernel stores the rows there (the streaming form
    // does: mirror_product_ok).
    HostMirror mirror;
    mutable bool mirror_taken = false;
    // Set by the backend for the launch of the step whose output a session reads (the
    // persistent step, or the graph's last product): the device word holding the host memory
    // (mapped) that the launch also stores the output into, nullptr in it for none
    // (set_host_out, in stream order). The product's launcher sets host_out_taken when its
    // kernel does (the streaming form).
    float* const* host_out = nullptr;
    mutable bool host_out_taken = false;
    mutable int64_t mirror_step_rows = 0;  // W G of the launch that took it
};

}  // namespace ferry::cuda
