#include "backends/cpu/cpu-backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/ops/ops.h"
#include "backends/cpu/thread-pool.h"
#include "core/env.h"

namespace ferry::cpu {

namespace {
Device* the_cpu_device();
// This backend's own device (not a registry lookup: the CPU code needs no registry).
Device* self_device() {
    return the_cpu_device();
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Errors from kernels

void ErrorSink::fail(std::string msg) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.load()) {
        msg_ = std::move(msg);
        failed_.store(true, std::memory_order_release);
    }
}

std::string ErrorSink::message() {
    std::lock_guard<std::mutex> lock(mu_);
    return msg_;
}

// ---------------------------------------------------------------------------------------------
// Buffers

namespace {
constexpr size_t kHostAlign = 64;
// Buffers at least this large (weights, KV caches, big compute buffers) get their own mapping,
// aligned to and in multiples of 2 MiB and marked for transparent huge pages: a decode step
// streams every weight once, and with 4 KiB pages that is a TLB miss every 4 KiB.
// Measured on llama-3.2-1b Q4_0 tg128 (2 threads, six alternating pairs, recorded in
// bench/results/llama-cpu.md): 32.18 t/s median with weights in huge pages against 29.92 from
// the 4 KiB-paged file mapping.
constexpr size_t kHugePage = 2u << 20;

// An anonymous mapping of at least `size` bytes at a 2 MiB boundary, advised for huge pages;
// *len gets its length. nullptr when the system refuses.
void* map_huge(size_t size, size_t* len) {
    const size_t want = (size + kHugePage - 1) / kHugePage * kHugePage;
    void* p = ::mmap(nullptr, want + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (p == MAP_FAILED) return nullptr;
    const uintptr_t start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (start + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
    // Give back the unaligned head and the tail beyond `want`.
    if (aligned > start) ::munmap(p, aligned - start);
    const size_t tail = (start + want + kHugePage) - (aligned + want);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + want), tail);
#ifdef MADV_HUGEPAGE
    (void)::madvise(reinterpret_cast<void*>(aligned), want, MADV_HUGEPAGE);  // a hint only
#endif
    *len = want;
    return reinterpret_cast<void*>(aligned);
}
}  // namespace

HostBuffer::HostBuffer(BufferType* type, void* base, size_t size, Owner owner, size_t map_len)
    : type_(type), base_(base), size_(size), owner_(owner), map_len_(map_len) {}

HostBuffer::~HostBuffer() {
    if (owner_ == Owner::Malloc) std::free(base_);
    if (owner_ == Owner::Mmap) ::munmap(base_, map_len_);
}

Status HostBuffer::set_tensor(Tensor* t, const void* src, size_t offset, size_t size) {
    FERRY_TRY(check_range(t, offset, size));
    restore(t->offs + offset, t->offs + offset + size);
    if (size) std::memcpy(static_cast<uint8_t*>(base_) + t->offs + offset, src, size);
    return Status::ok();
}

Status HostBuffer::get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) {
    FERRY_TRY(check_range(t, offset, size));
    if (size) std::memcpy(dst, static_cast<uint8_t*>(base_) + t->offs + offset, size);
    unpack_range(t->offs + offset, t->offs + offset + size, static_cast<uint8_t*>(dst));
    return Status::ok();
}

Status HostBuffer::memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) {
    FERRY_TRY(check_range(t, offset, size));
    restore(t->offs + offset, t->offs + offset + size);
    if (size) std::memset(static_cast<uint8_t*>(base_) + t->offs + offset, value, size);
    return Status::ok();
}

bool HostBuffer::copy_tensor(const Tensor* src, Tensor* dst) {
    if (!src->buffer || !src->buffer->base() || !src->data || !dst->data) return false;
    if (src->nbytes() != dst->nbytes()) return false;
    if (dst->buffer == this) restore(dst->offs, dst->offs + dst->nbytes());
    std::memcpy(dst->data, src->data, src->nbytes());
    // A repacked source reads as its GGUF bytes.
    if (const auto* hb = dynamic_cast<const HostBuffer*>(src->buffer)) {
        hb->unpack_range(src->offs, src->offs + src->nbytes(), static_cast<uint8_t*>(dst->data));
    }
    return true;
}

Status HostBuffer::clear(uint8_t value) {
    repacked_.clear();
    if (size_) std::memset(base_, value, size_);
    return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Repacked weights

Status HostBuffer::repack(Tensor* t, const simd::RepackedKernels* rk, bool* done) {
    *done = false;
    const int64_t n = t->ne[0], rows = t->ne[1];
    const size_t rs = row_size(rk->type, n);
    if (t->type != rk->type || t->is_view() || t->ne[2] != 1 || t->ne[3] != 1 ||
        t->nb[0] != type_size(t->type) || t->nb[1] != rs || rows < simd::kRepackRows ||
        n % block_size(t->type) != 0) {
        return Status::errorf("CPU: cannot repack %s: not a contiguous %s matrix of >= %d rows",
                              describe(t).c_str(), type_name(rk->type), simd::kRepackRows);
    }
    const size_t groups = static_cast<size_t>(rows / simd::kRepackRows);
    const size_t gb = rk->group_bytes(n);
    const size_t bytes = groups * gb;
    FERRY_TRY(check_range(t, 0, bytes));
    bool partial = false;
    if (repacked(t, &partial)) {
        *done = true;  // already
        return Status::ok();
    }
    if (partial) {
        return Status::errorf("CPU: cannot repack %s: it overlaps a repacked tensor",
                              describe(t).c_str());
    }
    uint8_t* p = static_cast<uint8_t*>(base_) + t->offs;
    if (owner_ == Owner::None) {
        // Caller memory, e.g. the model file mapped read-only and private (--mmap): ask for
        // write access (a private mapping then copies the pages it writes; the file is never
        // touched). Memory that cannot be made writable keeps its layout.
        const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
        const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
        const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
        if (::mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_READ | PROT_WRITE) != 0) {
            return Status::ok();
        }
    }
    std::vector<uint8_t> tmp(gb);
    for (size_t g = 0; g < groups; g++) rk->repack(p + g * gb, n, tmp.data());
    repacked_[t->offs] = {rk, n, rows, bytes};
    *done = true;
    return Status::ok();
}

const HostBuffer::Repacked* HostBuffer::repacked(const Tensor* t, bool* partial) const {
    if (repacked_.empty()) return nullptr;
    const size_t begin = t->offs, end = t->offs + std::max<size_t>(t->nbytes(), 1);
    auto it = repacked_.lower_bound(begin);
    if (it != repacked_.end() && it->first == begin) {
        const Repacked& r = it->second;
        if (t->type == r.rk->type && t->ne[0] == r.n && t->ne[1] == r.rows && t->ne[2] == 1 &&
            t->ne[3] == 1 && t->nb[0] == type_size(t->type) && t->nb[1] == row_size(t->type, r.n)) {
            return &r;
        }
        if (partial) *partial = true;
        return nullptr;
    }
    bool overlap = it != repacked_.end() && it->first < end;
    if (it != repacked_.begin()) {
        const auto prev = std::prev(it);
        overlap = overlap || prev->first + prev->second.bytes > begin;
    }
    if (partial && overlap) *partial = true;
    return nullptr;
}

void HostBuffer::restore(size_t begin, size_t end) {
    if (repacked_.empty() || end <= begin) return;
    auto it = repacked_.lower_bound(begin);
    if (it != repacked_.begin() && std::prev(it)->first + std::prev(it)->second.bytes > begin) {
        --it;
    }
    while (it != repacked_.end() && it->first < end) {
        const Repacked& r = it->second;
        const size_t rs = row_size(r.rk->type, r.n);
        const size_t gb = r.rk->group_bytes(r.n);
        std::vector<uint8_t> tmp(gb);
        uint8_t* p = static_cast<uint8_t*>(base_) + it->first;
        for (size_t g = 0; g < r.bytes / gb; g++) {
            std::memcpy(tmp.data(), p + g * gb, gb);
            for (int row = 0; row < simd::kRepackRows; row++) {
                r.rk->unpack_row(tmp.data(), r.n, row, p + g * gb + row * rs);
            }
        }
        it = repacked_.erase(it);
    }
}

void HostBuffer::unpack_range(size_t begin, size_t end, uint8_t* dst) const {
    if (repacked_.empty() || end <= begin) return;
    auto it = repacked_.lower_bound(begin);
    if (it != repacked_.begin() && std::prev(it)->first + std::prev(it)->second.bytes > begin) {
        --it;
    }
    for (; it != repacked_.end() && it->first < end; ++it) {
        const Repacked& r = it->second;
        const size_t rs = row_size(r.rk->type, r.n);
        const size_t gb = r.rk->group_bytes(r.n);
        std::vector<uint8_t> rows(gb);
        const size_t lo = std::max(begin, it->first);
        const size_t hi = std::min(end, it->first + r.bytes);
        for (size_t g = (lo - it->first) / gb; g * gb + it->first < hi; g++) {
            const size_t gstart = it->first + g * gb;
            const uint8_t* src = static_cast<const uint8_t*>(base_) + gstart;
            for (int row = 0; row < simd::kRepackRows; row++) {
                r.rk->unpack_row(src, r.n, row, rows.data() + row * rs);
            }
            const size_t a = std::max(lo, gstart), b = std::min(hi, gstart + gb);
            std::memcpy(dst + (a - begin), rows.data() + (a - gstart), b - a);
        }
    }
}

const HostBuffer::Repacked* repacked_weight(const Tensor* t, bool* partial) {
    if (!simd::repacked_kernels(t->type) || !t->buffer) return nullptr;
    const auto* hb = dynamic_cast<const HostBuffer*>(t->buffer);
    return hb ? hb->repacked(t, partial) : nullptr;
}

namespace {

class HostBufferType : public BufferType {
  public:
    const char* name() const override { return "CPU"; }
    Device* device() const override { return self_device(); }
    size_t alignment() const override { return kHostAlign; }
    bool is_host() const override { return true; }
    Expected<std::unique_ptr<Buffer>> allocate(size_t size) override {
        if (size >= kHugePage) {
            size_t len = 0;
            if (void* p = map_huge(size, &len)) {
                return std::unique_ptr<Buffer>(
                    new HostBuffer(this, p, size, HostBuffer::Owner::Mmap, len));
            }
        }
        const size_t rounded =
            (std::max<size_t>(size, 1) + kHostAlign - 1) / kHostAlign * kHostAlign;
        void* p = std::aligned_alloc(kHostAlign, rounded);
        if (!p) return Status::errorf("CPU: cannot allocate %zu bytes", size);
        return std::unique_ptr<Buffer>(new HostBuffer(this, p, size, HostBuffer::Owner::Malloc));
    }
};

}  // namespace

BufferType* host_buffer_type() {
    static HostBufferType t;
    return &t;
}

// ---------------------------------------------------------------------------------------------
// Dispatch

namespace {

using KernelFn = void (*)(const ComputeParams&, Tensor*);

KernelFn kernel_for(Op op) {
    switch (op) {
        case Op::NONE:
        case Op::RESHAPE:
        case Op::VIEW:
        case Op::PERMUTE:
        case Op::TRANSPOSE:
        case Op::COUNT:
            return nullptr;
        case Op::CPY:
            return op_cpy;
        case Op::CONT:
            return op_cont;
        case Op::GET_ROWS:
            return op_get_rows;
        case Op::SET_ROWS:
            return op_set_rows;
        case Op::ADD:
            return op_add;
        case Op::MUL:
            return op_mul;
        case Op::SCALE:
            return op_scale;
        case Op::RMS_NORM:
            return op_rms_norm;
        case Op::NORM:
            return op_norm;
        case Op::MUL_MAT:
            return op_mul_mat;
        case Op::SOFT_MAX:
            return op_soft_max;
        case Op::ROPE:
            return op_rope;
        case Op::FLASH_ATTN_EXT:
            return op_flash_attn_ext;
        case Op::SILU:
            return op_silu;
        case Op::GELU:
            return op_gelu;
        case Op::SWIGLU:
            return op_swiglu;
        case Op::GEGLU:
            return op_geglu;
        case Op::ARGMAX:
            return op_argmax;
        case Op::SUM_ROWS:
            return op_sum_rows;
        case Op::TOP_K:
            return op_top_k;
    }
    return nullptr;
}

bool is_view_op(Op op) {
    return (op_info(op).flags & kOpView) != 0 || op == Op::NONE;
}

int default_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
}

// CPU events are trivial, and that is correct, not a shortcut: CpuBackend::compute() (and
// every buffer call) returns only after the work is done, so by the time a caller records an
// event every earlier piece of work of that stream has already completed. A recorded point has
// therefore always passed: synchronize() has nothing to wait for, and a backend that waits on
// a CPU event can go ahead at once.
class CpuEvent : public Event {
  public:
    Device* device() const override { return self_device(); }
    Status synchronize() override { return Status::ok(); }
};

// The event must belong to the CPU device: an event of another device records a point on that
// device's streams, which a CPU stream can neither record nor wait for.
Status check_cpu_event(const Event* e, const char* what) {
    if (!e) return Status::errorf("CPU: %s: no event", what);
    Device* d = e->device();
    if (d != self_device() || !dynamic_cast<const CpuEvent*>(e)) {
        return Status::errorf("CPU: %s: the event belongs to device %s, not to device %s", what,
                              d ? d->name() : "?", self_device()->name());
    }
    return Status::ok();
}

class CpuBackend : public Backend {
  public:
    explicit CpuBackend(int n_threads) : pool_(std::make_unique<ThreadPool>(n_threads)) {}
    const char* name() const override { return "CPU"; }
    Device* device() const override { return self_device(); }
    void set_n_threads(int n) override {
        if (n <= 0) n = default_threads();
        if (n != pool_->n_threads()) pool_ = std::make_unique<ThreadPool>(n);
    }

    Status compute(Graph& g) override {
        const int nth = pool_->n_threads();
        size_t wsize = 0;
        steps_.clear();
        for (Tensor* n : g.nodes) {
            if (is_view_op(n->op)) continue;
            if (!n->data)
                return Status::errorf("CPU: node %s has no host storage", describe(n).c_str());
            const KernelFn fn = kernel_for(n->op);
            if (!fn) return Status::errorf("CPU: op %s has no kernel", op_name(n->op));
            for (int s = 0; s < kMaxSrc; s++) {
                if (n->src[s] && !n->src[s]->data) {
                    return Status::errorf("CPU: source %d of %s is not in host memory", s,
                                          describe(n).c_str());
                }
                // Only MUL_MAT and GET_ROWS read the repacked layout (as their weight).
                if (n->src[s] && !(s == 0 && (n->op == Op::MUL_MAT || n->op == Op::GET_ROWS))) {
                    bool partial = false;
                    if (repacked_weight(n->src[s], &partial) || partial) {
                        return Status::errorf(
                            "CPU: source %d of %s is a repacked weight, which only MUL_MAT and "
                            "GET_ROWS read (FERRY_CPU_REPACK=0 keeps the GGUF layout)",
                            s, describe(n).c_str());
                    }
                }
            }
            const size_t ws = work_size(n, nth);
            if (ws > limits_.max_scratch) {
                return Status::errorf(
                    "CPU: node %s needs %zu bytes of scratch, over the limit of %zu bytes",
                    describe(n).c_str(), ws, limits_.max_scratch);
            }
            wsize = std::max(wsize, ws);
            steps_.push_back({fn, n});
        }
        if (steps_.empty()) return Status::ok();
        if (wsize > work_.size()) {
            // Out of memory is an error for this compute, not for the process.
            try {
                work_.resize(wsize);
            } catch (const std::bad_alloc&) {
                return Status::errorf("CPU: cannot allocate %zu bytes of scratch", wsize);
            }
        }
        ErrorSink errors;
        std::atomic<bool> stop{false};
        // ComputeParams::claims: node i uses claims[i % 2]. Thread 0 zeroes the other one while
        // node i runs; no thread can still be using it (it was node i - 1's, and every thread
        // passed the barrier after that node), and the barrier after node i publishes the 0.
        std::atomic<int64_t> claims[2] = {0, 0};
        const Step* steps = steps_.data();
        const size_t n_steps = steps_.size();
        pool_->run([&](int ith, int n_threads) {
            ComputeParams p;
            p.ith = ith;
            p.nth = n_threads;
            p.wdata = work_.data();
            p.wsize = work_.size();
            p.pool = pool_.get();
            p.errors = &errors;
            if (limits_.should_abort) {
                p.stop = &stop;
                p.poll = &limits_.should_abort;
            }
            for (size_t i = 0;; i++) {
                p.claims = &claims[i % 2];
                if (ith == 0) claims[(i + 1) % 2].store(0, std::memory_order_relaxed);
                steps[i].fn(p, steps[i].node);
                // The end of run() waits for every thread: no barrier after the last node.
                if (i + 1 == n_steps) break;
                // Every thread gets the same answer, so all of them stop at the same node.
                if (pool_->barrier_any(errors.failed() || p.aborted())) {
                    stop.store(true, std::memory_order_relaxed);
                    break;
                }
            }
        });
        if (errors.failed()) return Status::error("CPU: " + errors.message());
        if (stop.load()) return Status::error("CPU: compute aborted (its client went away)");
        return Status::ok();
    }
    void set_compute_limits(ComputeLimits limits) override { limits_ = std::move(limits); }
    size_t scratch_bytes() const override { return work_.capacity(); }
    // Immediate: compute() has finished all earlier work (see CpuEvent).
    Status record_event(Event* e) override { return check_cpu_event(e, "record_event"); }
    Status wait_event(Event* e) override { return check_cpu_event(e, "wait_event"); }

  private:
    struct Step {
        KernelFn fn;
        Tensor* node;
    };
    std::unique_ptr<ThreadPool> pool_;
    std::vector<uint8_t> work_;
    std::vector<Step> steps_;
    ComputeLimits limits_;  // the nodes to run, with their kernels (reused across calls)
};

class CpuDevice : public Device {
  public:
    const char* name() const override { return "CPU"; }
    std::string description() const override {
        std::ifstream f("/proc/cpuinfo");
        std::string line;
        while (std::getline(f, line)) {
            if (line.rfind("model name", 0) == 0) {
                auto pos = line.find(':');
                if (pos != std::string::npos) return line.substr(pos + 2);
            }
        }
        return "CPU";
    }
    DeviceType type() const override { return DeviceType::CPU; }
    DeviceMemory memory() const override { return host_memory(); }
    DeviceCaps caps() const override {
        DeviceCaps c;
        c.buffer_from_host_ptr = true;
        c.events = true;           // trivial events (see CpuEvent)
        c.prepare_weights = true;  // repacks weights (see prepare_weights)
        return c;
    }
    // Repacks the weights whose type has a repacked layout this build uses (simd.h: Q4_0 on
    // AVX2) in place, into the same bytes, unless FERRY_CPU_REPACK=0. Weights that are no
    // contiguous matrix of >= 8 rows in a host buffer keep their layout.
    Status prepare_weights(std::span<Tensor* const> weights) override {
        if (env_off("FERRY_CPU_REPACK")) return Status::ok();
        for (Tensor* t : weights) {
            if (!t || !simd::repack_by_default(t->type) || t->is_view() || !t->data) continue;
            auto* hb = dynamic_cast<HostBuffer*>(t->buffer);
            if (!hb) continue;
            if (t->ne[2] != 1 || t->ne[3] != 1 || t->ne[1] < simd::kRepackRows ||
                t->nb[0] != type_size(t->type) || t->nb[1] != row_size(t->type, t->ne[0])) {
                continue;
            }
            bool done = false;
            FERRY_TRY(hb->repack(t, simd::repacked_kernels(t->type), &done));
        }
        return Status::ok();
    }
    BufferType* buffer_type() override { return host_buffer_type(); }
    BufferType* host_buffer_type() override { return cpu::host_buffer_type(); }
    Expected<std::unique_ptr<Buffer>> buffer_from_host_ptr(void* ptr, size_t size,
                                                           size_t max_tensor_size) override {
        (void)max_tensor_size;
        return std::unique_ptr<Buffer>(
            new HostBuffer(host_buffer_type(), ptr, size, HostBuffer::Owner::None));
    }
    bool supports_op(const Tensor* node) override {
        if (is_view_op(node->op)) return true;
        // The CPU runs every node that passes validate_node, and nodes are validated where
        // they are made (Context builders) or received (the remote server): no need to
        // validate again on this hot path.
        return kernel_for(node->op) != nullptr;
    }
    bool supports_buffer_type(const BufferType* type) override { return type->is_host(); }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& opts = {}) override {
        return std::unique_ptr<Backend>(
            new CpuBackend(opts.n_threads > 0 ? opts.n_threads : default_threads()));
    }
    Expected<std::unique_ptr<Event>> make_event() override {
        return std::unique_ptr<Event>(new CpuEvent());
    }
};

Device* the_cpu_device() {
    static CpuDevice device;
    return &device;
}

class CpuRegistry : public Registry {
  public:
    const char* name() const override { return "CPU"; }
    std::vector<Device*> devices() override { return {the_cpu_device()}; }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
    if (n_threads <= 0) n_threads = default_threads();
    return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace ferry::cpu

namespace ferry {
std::unique_ptr<Registry> make_cpu_registry() {
    return std::make_unique<cpu::CpuRegistry>();
}
}  // namespace ferry
