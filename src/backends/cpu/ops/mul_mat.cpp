// MUL_MAT on the CPU: out[i0, i1, i2, i3] = dot(a row i0 of matrix (i2 / r2, i3 / r3), b row
// (i1, i2, i3)), for every weight type.
//
// Phase 1 converts every row of b once into what the weight type's kernels read (Q8_0 / Q8_K
// quants laid out for the direct tiles, or plain int8 columns with block sums for the packed
// path; F32 b is read in place). When b is small (decode) every thread converts all of it into
// its own scratch and no barrier follows; otherwise each thread converts a share, then a
// barrier. Phase 2 splits the output into tasks (batch matrix x chunk of 64 weight rows x chunk
// of columns): claimed from a shared counter after a barrier, or round-robin without one.
// Task boundaries depend only on the shapes, and every output's arithmetic depends only on its
// own row and column (never on the tile it was computed in), so results are bit-identical for
// any thread count.
//
// Direct path (few columns: decode): tiles of 4 weight rows x 4 columns straight from the
// stored blocks, so the weights stream from memory exactly once. Packed path (many columns:
// prefill): each task repacks its 64 weight rows into interleaved int8 groups in per-thread
// scratch and runs the register-tiled int8 GEMM over its columns (see simd/packed.cpp).
//
// Repacked path (weights the CPU device repacked at load, simd.h): for any number of columns,
// tiles of 8 weight rows x 4 columns straight from the repacked groups (no per-call packing);
// the rows past the last full group (rows % 8, GGUF layout) go through the direct tiles.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "backends/cpu/cpu-backend.h"
#include "backends/cpu/ops/ops.h"
#include "backends/cpu/simd/simd.h"
#include "core/env.h"

namespace ferry::cpu {
namespace {

constexpr size_t kHeader = 64;          // task counter, on its own cache line
constexpr int64_t kRowChunk = 64;       // weight rows per task (multiple of 4 and of 32)
constexpr int64_t kFloatColChunk = 64;  // columns per task for float weights
constexpr int64_t kColChunk = 64;       // columns per task when splitting columns for balance
// FERRY_CPU_DYNAMIC=0: direct products take their chunks round-robin (for measurements).
const bool kDynamicDirect = !env_off("FERRY_CPU_DYNAMIC");
constexpr int64_t kMinTasks = 16;  // split columns when rows alone give fewer tasks
// Up to this many converted elements of b, every thread converts all of b for itself: cheaper
// than a barrier (decode: one column), and a descheduled thread never holds the others up.
constexpr int64_t kPrivateConvElems = 16384;

constexpr size_t align64(size_t n) {
    return (n + 63) / 64 * 64;
}

struct Plan {
    const simd::MatKernels* mk = nullptr;
    const simd::PackedKernels* pk = nullptr;    // packed path when non-null
    const simd::RepackedKernels* rk = nullptr;  // repacked path when non-null
    // Packed path over a repacked weight (builds whose packed GEMM beats the repacked tiles
    // for prefill): each task first unpacks its rows into GGUF rows (in per-thread scratch
    // after the packed groups).
    const HostBuffer::Repacked* unpack = nullptr;
    bool partial = false;  // a is a view into a repacked weight: no kernel reads it
    int64_t K = 0, M = 0, N = 0, ne2 = 0, ne3 = 0, r2 = 1, r3 = 1;
    size_t col_bytes = 0;   // converted column stride; 0: b read in place
    size_t conv_bytes = 0;  // all converted columns (one copy)
    bool shared = false;    // one shared conversion + barrier + dynamic tasks (else: private
                            // conversion per thread, static tasks, no barrier)
    size_t group_bytes = 0;
    size_t per_thread = 0;  // packed scratch per thread
    int64_t row_chunks = 0, col_chunk = 0, col_chunks = 0, tasks = 0;
};

Plan make_plan(const Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    Plan p;
    p.mk = &simd::mat_kernels(a->type);
    p.K = a->ne[0];
    p.M = a->ne[1];
    p.N = b->ne[1];
    p.ne2 = b->ne[2];
    p.ne3 = b->ne[3];
    p.r2 = b->ne[2] / a->ne[2];
    p.r3 = b->ne[3] / a->ne[3];
    const int64_t ncols = p.N * p.ne2 * p.ne3;
    const HostBuffer::Repacked* rp = repacked_weight(a, &p.partial);
    const bool packed = p.mk->packed && p.N >= p.mk->packed_min_cols;
    if (rp && !(packed && simd::packed_over_repacked())) {
        p.rk = rp->rk;
        p.col_bytes = align64(p.rk->b_bytes(p.K));
    } else if (packed) {
        p.pk = p.mk->packed;
        p.col_bytes = p.pk->column_bytes(p.K);
        p.group_bytes = align64(p.pk->group_bytes(p.K));
        p.per_thread = p.group_bytes * (kRowChunk / simd::kPackRows);
        if (rp) {
            p.unpack = rp;
            p.per_thread += align64(row_size(a->type, p.K) * static_cast<size_t>(kRowChunk));
        }
    } else if (p.mk->quantize_b) {
        p.col_bytes = align64(p.mk->b_bytes(p.K));
    }
    p.conv_bytes = align64(p.col_bytes * static_cast<size_t>(ncols));
    p.shared = p.pk != nullptr || (p.col_bytes != 0 && ncols * p.K > kPrivateConvElems);
    p.row_chunks = (p.M + kRowChunk - 1) / kRowChunk;
    const int64_t batches = p.ne2 * p.ne3;
    if (!p.pk && !p.mk->quantize_b) {
        p.col_chunk = kFloatColChunk;
    } else if (p.row_chunks * batches < kMinTasks) {
        p.col_chunk = kColChunk;
    } else {
        p.col_chunk = std::max<int64_t>(p.N, 1);
    }
    p.col_chunks = (p.N + p.col_chunk - 1) / p.col_chunk;
    p.tasks = batches * p.row_chunks * p.col_chunks;
    return p;
}

size_t plan_bytes(const Plan& p, int n_threads) {
    const size_t nth = static_cast<size_t>(std::max(n_threads, 1));
    return kHeader + p.conv_bytes * (p.shared ? 1 : nth) + p.per_thread * nth;
}

const uint8_t* b_row(const Tensor* b, int64_t i1, int64_t i2, int64_t i3) {
    return static_cast<const uint8_t*>(b->data) + i1 * b->nb[1] + i2 * b->nb[2] + i3 * b->nb[3];
}

}  // namespace

size_t mul_mat_work_size(const Tensor* node, int n_threads) {
    return plan_bytes(make_plan(node), n_threads);
}

void op_mul_mat(const ComputeParams& cp, Tensor* dst) {
    const Tensor* a = dst->src[0];
    const Tensor* b = dst->src[1];
    const Plan p = make_plan(dst);
    if (p.partial) {
        if (cp.ith == 0 && cp.errors) {
            cp.errors->fail(
                strfmt("MUL_MAT %s: weight %s is a view into a repacked weight "
                       "(FERRY_CPU_REPACK=0 keeps the GGUF layout)",
                       describe(dst).c_str(), describe(a).c_str()));
        }
        return;
    }
    if (cp.wsize < plan_bytes(p, cp.nth) || dst->nb[0] != sizeof(float) ||
        dst->nb[1] % sizeof(float) != 0) {
        // Same decision on every thread, so all of them leave before any barrier.
        if (cp.ith == 0 && cp.errors) {
            cp.errors->fail(
                strfmt("MUL_MAT %s: scratch of %zu bytes, need %zu (or result rows "
                       "not contiguous floats)",
                       describe(dst).c_str(), cp.wsize, plan_bytes(p, cp.nth)));
        }
        return;
    }
    auto* wbase = static_cast<uint8_t*>(cp.wdata);
    std::atomic_ref<int64_t> next_task(*reinterpret_cast<int64_t*>(wbase));
    const size_t nth = static_cast<size_t>(cp.nth), ith = static_cast<size_t>(cp.ith);
    uint8_t* conv = wbase + kHeader + (p.shared ? 0 : p.conv_bytes * ith);
    uint8_t* scratch = wbase + kHeader + p.conv_bytes * (p.shared ? 1 : nth) + p.per_thread * ith;

    // Phase 1: convert b (shared: each thread a share, then a barrier; private: all of it).
    if (p.col_bytes) {
        const int64_t ncols = p.N * p.ne2 * p.ne3;
        int64_t first = 0, last = ncols;
        if (p.shared) split_rows(ncols, cp.ith, cp.nth, &first, &last);
        for (int64_t j = first; j < last; j++) {
            const int64_t i1 = j % p.N, i2 = (j / p.N) % p.ne2, i3 = j / (p.N * p.ne2);
            const float* src = reinterpret_cast<const float*>(b_row(b, i1, i2, i3));
            uint8_t* out = conv + static_cast<size_t>(j) * p.col_bytes;
            if (p.rk) {
                p.rk->quantize_b(src, out, p.K);
            } else if (p.pk) {
                p.pk->convert_column(src, p.K, out);
            } else {
                p.mk->quantize_b(src, out, p.K);
            }
        }
    }
    if (p.shared) {
        if (cp.ith == 0) next_task.store(0, std::memory_order_relaxed);
        cp.barrier();
    }

    // Phase 2: tasks, claimed from the shared counter or taken round-robin.
    int64_t static_next = cp.ith;
    auto claim = [&]() -> int64_t {
        if (p.shared) return next_task.fetch_add(1, std::memory_order_relaxed);
        // Without a phase barrier (each thread converted b itself): the node's shared counter
        // when there is one, so a thread that falls behind (a preempted vCPU) leaves its chunks
        // to the other threads instead of holding them up at the next barrier.
        if (cp.claims && kDynamicDirect) return cp.claims->fetch_add(1, std::memory_order_relaxed);
        const int64_t t = static_next;
        static_next += cp.nth;
        return t;
    };
    const size_t ldo = dst->nb[1] / sizeof(float);
    for (;;) {
        const int64_t t = claim();
        if (t >= p.tasks || cp.aborted()) break;
        const int64_t cc = t % p.col_chunks;
        const int64_t rc = (t / p.col_chunks) % p.row_chunks;
        const int64_t bi = t / (p.col_chunks * p.row_chunks);
        const int64_t i2 = bi % p.ne2, i3 = bi / p.ne2;
        const int64_t r0 = rc * kRowChunk, r1 = std::min(p.M, r0 + kRowChunk);
        const int64_t c0 = cc * p.col_chunk, c1 = std::min(p.N, c0 + p.col_chunk);

        const uint8_t* amat =
            static_cast<const uint8_t*>(a->data) + (i2 / p.r2) * a->nb[2] + (i3 / p.r3) * a->nb[3];
        float* omat = reinterpret_cast<float*>(static_cast<uint8_t*>(dst->data) + i2 * dst->nb[2] +
                                               i3 * dst->nb[3]);
        const uint8_t* ymat;
        size_t by;
        if (p.col_bytes) {
            by = p.col_bytes;
            ymat = conv + static_cast<size_t>((i3 * p.ne2 + i2) * p.N) * by;
        } else {
            by = b->nb[1];
            ymat = b_row(b, 0, i2, i3);
        }

        if (p.rk) {
            // Full groups of 8 rows from the repacked bytes (a group starts at its first row's
            // GGUF offset), the rest from the GGUF rows, 4 columns at a time.
            constexpr int64_t kG = simd::kRepackRows;
            const int64_t gend = std::max(r0, std::min(r1, p.M / kG * kG));
            const size_t yoff = p.rk->direct_b_offset(p.K);
            for (int64_t c = c0; c < c1; c += 4) {
                if (cp.aborted()) return;
                const int nc = static_cast<int>(std::min<int64_t>(4, c1 - c));
                for (int64_t r = r0; r < gend; r += kG) {
                    p.rk->tile(p.K, amat + r * a->nb[1], ymat + c * by, by, nc, omat + c * ldo + r,
                               ldo);
                }
                for (int64_t r = gend; r < r1; r += simd::kDirectRows) {
                    const int nr = static_cast<int>(std::min<int64_t>(simd::kDirectRows, r1 - r));
                    p.rk->direct(p.K, amat + r * a->nb[1], a->nb[1], nr, ymat + c * by + yoff, by,
                                 nc, omat + c * ldo + r, ldo);
                }
            }
        } else if (p.pk) {
            // Repack this task's rows: groups of 16, in pairs for the kernel.
            const int64_t nrows = r1 - r0;
            const int ngroups = static_cast<int>((nrows + simd::kPackRows - 1) / simd::kPackRows);
            const uint8_t* rows = amat + r0 * a->nb[1];
            size_t bx = a->nb[1];
            if (p.unpack) {
                // A repacked weight: this task's rows back in the GGUF layout first (the last
                // rows % 8 are GGUF rows already).
                const size_t rb = row_size(a->type, p.K);
                uint8_t* tmp = scratch + p.group_bytes * (kRowChunk / simd::kPackRows);
                const int64_t grouped = p.unpack->grouped_rows();
                for (int64_t r = r0; r < r1; r++) {
                    uint8_t* out = tmp + static_cast<size_t>(r - r0) * rb;
                    if (r < grouped) {
                        p.unpack->unpack_row(amat, a->nb[1], r, out);
                    } else {
                        std::memcpy(out, amat + r * a->nb[1], rb);
                    }
                }
                rows = tmp;
                bx = rb;
            }
            for (int g = 0; g < ngroups; g++) {
                const int nr = static_cast<int>(
                    std::min<int64_t>(simd::kPackRows, r1 - (r0 + g * simd::kPackRows)));
                p.pk->pack(rows + static_cast<size_t>(g * simd::kPackRows) * bx, bx, nr, p.K,
                           scratch + g * p.group_bytes);
            }
            for (int64_t c = c0; c < c1; c += 4) {
                if (cp.aborted()) return;
                const int nc = static_cast<int>(std::min<int64_t>(4, c1 - c));
                for (int g = 0; g < ngroups; g += 2) {
                    const int64_t gr0 = r0 + g * simd::kPackRows;
                    const int nr =
                        static_cast<int>(std::min<int64_t>(2 * simd::kPackRows, r1 - gr0));
                    const uint8_t* g1 =
                        g + 1 < ngroups ? scratch + (g + 1) * p.group_bytes : nullptr;
                    p.pk->gemm(p.K, scratch + g * p.group_bytes, g1, nr, ymat + c * by, by, nc,
                               omat + c * ldo + gr0, ldo);
                }
            }
        } else {
            for (int64_t r = r0; r < r1; r += simd::kDirectRows) {
                if (cp.aborted()) return;
                const int nr = static_cast<int>(std::min<int64_t>(simd::kDirectRows, r1 - r));
                for (int64_t c = c0; c < c1; c += simd::kDirectCols) {
                    const int nc = static_cast<int>(std::min<int64_t>(simd::kDirectCols, c1 - c));
                    p.mk->direct(p.K, amat + r * a->nb[1], a->nb[1], nr, ymat + c * by, by, nc,
                                 omat + c * ldo + r, ldo);
                }
            }
        }
    }
}

}  // namespace ferry::cpu
