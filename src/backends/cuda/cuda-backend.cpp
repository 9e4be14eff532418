#include "backends/cuda/cuda-backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "backends/cuda/cublas-api.h"
#include "backends/cuda/ops/ops.h"
#include "backends/cuda/ops/persist.h"
#include "core/env.h"
#include "core/spin.h"

namespace ferry::cuda {

namespace {

// Allocation alignment of device buffers: 256 bytes keeps every tensor 16-byte aligned for
// vector loads and suits cuBLAS.
constexpr size_t kDeviceAlign = 256;
// Uploads at least this large go through pinned staging (two chunks in flight).
constexpr size_t kStagingChunk = 16u << 20;
constexpr size_t kCublasWorkspace = 32u << 20;
// Reads at least this large (a row of logits) go through pinned memory: a pageable copy
// runs at a fraction of the bus speed.
constexpr size_t kPinnedRead = 64u << 10;

#define CUDA_TRY(expr, ...)                                                                   \
    do {                                                                                      \
        const cudaError_t cuda_err_ = (expr);                                                 \
        if (cuda_err_ != cudaSuccess) {                                                       \
            return Status::error(strfmt(__VA_ARGS__) + ": " + cudaGetErrorString(cuda_err_)); \
        }                                                                                     \
    } while (0)

std::mutex g_declined_mu;
std::vector<Op> g_declined;
// Bumped whenever a device buffer is freed: a graph keyed by buffer objects and offsets stays
// valid only while no buffer went away (a new one could take a freed one's address).
std::atomic<uint64_t> g_buffer_epoch{1};

class CudaDevice;

class CudaBufferType : public BufferType {
  public:
    explicit CudaBufferType(CudaDevice* dev) : dev_(dev) {}
    const char* name() const override;
    Device* device() const override;
    size_t alignment() const override { return kDeviceAlign; }
    bool is_host() const override { return false; }
    Expected<std::unique_ptr<Buffer>> allocate(size_t size) override;

  private:
    CudaDevice* dev_;
};

class CudaBuffer : public Buffer {
  public:
    CudaBuffer(CudaBufferType* type, CudaDevice* dev, char* ptr, size_t size)
        : type_(type), dev_(dev), ptr_(ptr), size_(size) {}
    ~CudaBuffer() override;
    BufferType* type() const override { return type_; }
    size_t size() const override { return size_; }
    void* base() const override { return nullptr; }  // device memory: not host-addressable
    char* dev_ptr() const { return ptr_; }
    CudaDevice* cuda_device() const { return dev_; }
    Status set_tensor(Tensor* t, const void* src, size_t offset, size_t size) override;
    Status get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) override;
    Status memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) override;
    bool copy_tensor(const Tensor* src, Tensor* dst) override;
    Status clear(uint8_t value) override;
    Status check_range(const Tensor* t, size_t offset, size_t size) const;

  private:
    CudaBufferType* type_;
    CudaDevice* dev_;
    char* ptr_;
    size_t size_;
};

// Page-locked host memory: uploads from it and downloads into it run at full PCIe speed and
// asynchronously. Either allocated (cudaMallocHost) or the caller's memory registered in
// place (cudaHostRegister: buffer_from_host_ptr, e.g. a remote client's shared staging
// buffer). Addressable by the host like any CPU buffer.
class PinnedBuffer : public Buffer {
  public:
    enum class Owner { Allocated, Registered };
    PinnedBuffer(BufferType* type, void* p, size_t size, Owner owner = Owner::Allocated)
        : type_(type), p_(p), size_(size), owner_(owner) {}
    ~PinnedBuffer() override {
        if (owner_ == Owner::Allocated) {
            cudaFreeHost(p_);
        } else {
            cudaHostUnregister(p_);
        }
    }
    BufferType* type() const override { return type_; }
    size_t size() const override { return size_; }
    void* base() const override { return p_; }
    Status set_tensor(Tensor* t, const void* src, size_t offset, size_t size) override {
        FERRY_TRY(check_range(t, offset, size));
        if (size) std::memcpy(static_cast<char*>(p_) + t->offs + offset, src, size);
        return Status::ok();
    }
    Status get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) override {
        FERRY_TRY(check_range(t, offset, size));
        if (size) std::memcpy(dst, static_cast<char*>(p_) + t->offs + offset, size);
        return Status::ok();
    }
    Status memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) override {
        FERRY_TRY(check_range(t, offset, size));
        if (size) std::memset(static_cast<char*>(p_) + t->offs + offset, value, size);
        return Status::ok();
    }
    bool copy_tensor(const Tensor* src, Tensor* dst) override {
        if (!src->data || !dst->data || src->nbytes() != dst->nbytes()) return false;
        std::memcpy(dst->data, src->data, src->nbytes());
        return true;
    }
    Status clear(uint8_t value) override {
        if (size_) std::memset(p_, value, size_);
        return Status::ok();
    }

  private:
    BufferType* type_;
    void* p_;
    size_t size_;
    Owner owner_;
};

// Whether p is page-locked host memory the DMA engine reads and writes directly.
bool is_pinned(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

class PinnedBufferType : public BufferType {
  public:
    explicit PinnedBufferType(CudaDevice* dev) : dev_(dev) {}
    const char* name() const override { return name_.c_str(); }
    Device* device() const override;
    size_t alignment() const override { return 64; }
    bool is_host() const override { return true; }
    Expected<std::unique_ptr<Buffer>> allocate(size_t size) override {
        void* p = nullptr;
        const cudaError_t e = cudaMallocHost(&p, std::max<size_t>(size, 1));
        if (e != cudaSuccess) {
            return Status::errorf("%s: cannot allocate %zu bytes of pinned host memory: %s", name(),
                                  size, cudaGetErrorString(e));
        }
        return std::unique_ptr<Buffer>(new PinnedBuffer(this, p, size));
    }
    std::string name_;

  private:
    CudaDevice* dev_;
};

class CudaEvent : public Event {
  public:
    CudaEvent(CudaDevice* dev, cudaEvent_t e) : dev_(dev), e_(e) {}
    ~CudaEvent() override { cudaEventDestroy(e_); }
    Device* device() const override;
    Status synchronize() override;
    cudaEvent_t get() const { return e_; }

  private:
    CudaDevice* dev_;
    cudaEvent_t e_;
};

class CudaDevice : public Device {
  public:
    CudaDevice(int index, const cudaDeviceProp& prop)
        : index_(index), buffer_type_(this), pinned_type_(this) {
        name_ = "CUDA" + std::to_string(index);
        pinned_type_.name_ = name_ + "_Host";
        n_sm_ = prop.multiProcessorCount;
        // Peak DRAM bandwidth: two transfers a memory clock (kHz) over the bus (bits).
        int mem_khz = 0, bus_bits = 0;
        if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, index) == cudaSuccess &&
            cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index) ==
                cudaSuccess) {
            peak_bw_ = 2.0 * mem_khz * 1e3 * bus_bits / 8.0;
        }
        desc_ = strfmt("%s (sm_%d%d, %d SMs", prop.name, prop.major, prop.minor,
                       prop.multiProcessorCount);
        if (peak_bw_ > 0.0) desc_ += strfmt(", %.2f TB/s peak", peak_bw_ / 1e12);
        desc_ += ")";
    }
    ~CudaDevice() override {
        if (err_host_) cudaFreeHost(err_host_);
        if (read_buf_) cudaFreeHost(read_buf_);
        for (void* p : staging_) {
            if (p) cudaFreeHost(p);
        }
        if (copy_stream_) cudaStreamDestroy(copy_stream_);
    }
    const char* name() const override { return name_.c_str(); }
    std::string description() const override { return desc_; }
    DeviceType type() const override { return DeviceType::GPU; }
    DeviceMemory memory() const override {
        size_t free = 0, total = 0;
        if (cudaSetDevice(index_) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
            return {};
        }
        return {free, total};
    }
    DeviceCaps caps() const override {
        DeviceCaps c;
        c.async = true;
        c.host_buffer = true;
        c.buffer_from_host_ptr = true;
        c.events = true;
        c.graph_replay = true;
        return c;
    }
    BufferType* buffer_type() override { return &buffer_type_; }
    BufferType* host_buffer_type() override { return &pinned_type_; }
    // The caller's memory, page-locked in place: a host buffer of this device (kernels do not
    // read it; copies to and from device memory run at DMA speed).
    Expected<std::unique_ptr<Buffer>> buffer_from_host_ptr(void* ptr, size_t size,
                                                           size_t max_tensor_size) override {
        (void)max_tensor_size;
        FERRY_TRY(activate());
        // Mapped too, so that a kernel may store a result there (CudaBackend::host_read_target:
        // a server's reads into a client's shared memory); page-locked alone where the device
        // cannot map it.
        const size_t n = std::max<size_t>(size, 1);
        if (cudaHostRegister(ptr, n, cudaHostRegisterPortable | cudaHostRegisterMapped) !=
            cudaSuccess) {
            cudaGetLastError();
            CUDA_TRY(cudaHostRegister(ptr, n, cudaHostRegisterPortable),
                     "%s: cannot page-lock %zu bytes of host memory", name(), size);
        }
        return std::unique_ptr<Buffer>(
            new PinnedBuffer(&pinned_type_, ptr, size, PinnedBuffer::Owner::Registered));
    }
    bool supports_op(const Tensor* node) override {
        {
            std::lock_guard<std::mutex> lock(g_declined_mu);
            if (std::find(g_declined.begin(), g_declined.end(), node->op) != g_declined.end()) {
                return false;
            }
        }
        return supports(node);
    }
    bool supports_buffer_type(const BufferType* type) override { return type == &buffer_type_; }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& opts = {}) override;
    Expected<std::unique_ptr<Event>> make_event() override {
        FERRY_TRY(activate());
        cudaEvent_t e;
        CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "%s: event", name());
        return std::unique_ptr<Event>(new CudaEvent(this, e));
    }

    int index() const { return index_; }
    int n_sm() const { return n_sm_; }
    double peak_bandwidth() const { return peak_bw_; }  // bytes/s (0: unknown)
    Status activate() const {
        CUDA_TRY(cudaSetDevice(index_), "%s: cudaSetDevice", name_.c_str());
        return Status::ok();
    }
    // Lets this device read and write `other`'s memory directly (NVLink or PCIe peer to peer),
    // once per pair, before the first copy between them, so that cudaMemcpyPeer(Async) goes
    // straight from one GPU to the other instead of through host memory. Where the pair cannot
    // (no peer path) copies still work, staged by the driver. May change the current device.
    void enable_peer(int other) {
        if (other == index_ || other < 0 || other >= kMaxPeers) return;
        std::lock_guard<std::mutex> lock(mu_);
        if (peer_tried_ & (1ull << other)) return;
        peer_tried_ |= 1ull << other;
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, index_, other) != cudaSuccess || !can) return;
        if (cudaSetDevice(index_) != cudaSuccess) return;
        const cudaError_t e = cudaDeviceEnablePeerAccess(other, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
            std::fprintf(stderr, "ferry: %s: peer access to CUDA%d: %s (copies are staged)\n",
                         name(), other, cudaGetErrorString(e));
        }
        (void)cudaGetLastError();  // AlreadyEnabled is sticky until read
    }
    // Before a copy from another device's memory into this one's (this device current): peer
    // access both ways (once per pair), then this device current again. False when it cannot
    // be made current.
    bool ready_for_copy_from(CudaDevice* src) {
        if (src == this) return true;
        src->enable_peer(index_);
        enable_peer(src->index());
        return activate().is_ok();
    }
    // The error word kernels report data errors through (host-mapped pinned memory).
    Expected<DeviceError*> error_word() {
        std::lock_guard<std::mutex> lock(mu_);
        if (!err_host_) {
            FERRY_TRY(activate());
            void* p = nullptr;
            CUDA_TRY(
                cudaHostAlloc(&p, sizeof(DeviceError), cudaHostAllocMapped | cudaHostAllocPortable),
                "%s: error word", name());
            std::memset(p, 0, sizeof(DeviceError));
            void* d = nullptr;
            CUDA_TRY(cudaHostGetDevicePointer(&d, p, 0), "%s: error word", name());
            err_host_ = static_cast<DeviceError*>(p);
            err_dev_ = static_cast<DeviceError*>(d);
        }
        return err_dev_;
    }
    // Reports (and clears) an error a kernel recorded. Call after the work is done.
    Status take_error() {
        if (!err_host_) return Status::ok();
        volatile DeviceError* e = err_host_;
        const int32_t code = e->code;
        if (code == 0) return Status::ok();
        if (code < 0) {
            // (persist.cu: a wait of the persistent decode step gave up)
            Status st = Status::errorf(
                "%s: the persistent decode step waited 2 s (what %d, block %lld, thread %lld): "
                "a bug in its bookkeeping (FERRY_CUDA_PERSIST=0: without it)",
                name(), e->value, static_cast<long long>(e->limit),
                static_cast<long long>(e->where));
            e->code = 0;
            return st;
        }
        const Op op = static_cast<Op>(code - 1);
        Status st = Status::errorf("%s: %s index %d (at position %lld) out of range [0, %lld)",
                                   name(), op_name(op), e->value, static_cast<long long>(e->where),
                                   static_cast<long long>(e->limit));
        e->code = 0;
        return st;
    }
    // Copies host memory into device memory through two pinned chunks, so the DMA engine
    // runs at full speed and the next chunk's memcpy overlaps the current transfer.
    Status upload(char* dst, const void* src, size_t size) {
        std::lock_guard<std::mutex> lock(mu_);
        FERRY_TRY(activate());
        if (!copy_stream_) {
            CUDA_TRY(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                     "%s: copy stream", name());
            for (int i = 0; i < 2; i++) {
                CUDA_TRY(cudaMallocHost(&staging_[i], kStagingChunk), "%s: staging", name());
                CUDA_TRY(cudaEventCreateWithFlags(&staged_[i], cudaEventDisableTiming),
                         "%s: staging", name());
            }
        }
        const char* s = static_cast<const char*>(src);
        int i = 0;
        for (size_t off = 0; off < size; off += kStagingChunk, i ^= 1) {
            const size_t n = std::min(kStagingChunk, size - off);
            CUDA_TRY(cudaEventSynchronize(staged_[i]), "%s: upload", name());
            std::memcpy(staging_[i], s + off, n);
            CUDA_TRY(
                cudaMemcpyAsync(dst + off, staging_[i], n, cudaMemcpyHostToDevice, copy_stream_),
                "%s: upload of %zu bytes", name(), n);
            CUDA_TRY(cudaEventRecord(staged_[i], copy_stream_), "%s: upload", name());
        }
        CUDA_TRY(cudaStreamSynchronize(copy_stream_), "%s: upload", name());
        return Status::ok();
    }

    // Device to host through a pinned buffer (grown as needed), after all earlier work.
    Status download(void* dst, const char* src, size_t size) {
        std::lock_guard<std::mutex> lock(mu_);
        FERRY_TRY(activate());
        if (size > read_size_) {
            if (read_buf_) cudaFreeHost(read_buf_);
            read_buf_ = nullptr;
            read_size_ = 0;
            const size_t want = std::min(std::max(size, size_t{1} << 20), kStagingChunk);
            CUDA_TRY(cudaMallocHost(&read_buf_, want), "%s: read staging", name());
            read_size_ = want;
        }
        char* d = static_cast<char*>(dst);
        for (size_t off = 0; off < size; off += read_size_) {
            const size_t n = std::min(read_size_, size - off);
            CUDA_TRY(cudaMemcpy(read_buf_, src + off, n, cudaMemcpyDeviceToHost),
                     "%s: read of %zu bytes", name(), n);
            std::memcpy(d + off, read_buf_, n);
        }
        return Status::ok();
    }

  private:
    void* read_buf_ = nullptr;
    size_t read_size_ = 0;
    int index_;
    int n_sm_ = 1;
    double peak_bw_ = 0.0;
    std::string name_, desc_;
    CudaBufferType buffer_type_;
    PinnedBufferType pinned_type_;
    std::mutex mu_;
    DeviceError* err_host_ = nullptr;
    DeviceError* err_dev_ = nullptr;
    cudaStream_t copy_stream_ = nullptr;
    void* staging_[2] = {nullptr, nullptr};
    cudaEvent_t staged_[2] = {nullptr, nullptr};
    static constexpr int kMaxPeers = 64;
    uint64_t peer_tried_ = 0;  // bit i: enable_peer(i) ran
};

const char* CudaBufferType::name() const {
    return dev_->name();
}
Device* CudaBufferType::device() const {
    return dev_;
}
Device* PinnedBufferType::device() const {
    return dev_;
}
Device* CudaEvent::device() const {
    return dev_;
}
Status CudaEvent::synchronize() {
    CUDA_TRY(cudaEventSynchronize(e_), "%s: event synchronize", dev_->name());
    return Status::ok();
}

Expected<std::unique_ptr<Buffer>> CudaBufferType::allocate(size_t size) {
    FERRY_TRY(dev_->activate());
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(size, 1));
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear the (non-sticky) allocation error
        const DeviceMemory m = dev_->memory();
        return Status::errorf(
            "%s: cannot allocate %.1f MiB of device memory (%.1f MiB free of %.1f MiB): %s",
            dev_->name(), size / 1048576.0, m.free / 1048576.0, m.total / 1048576.0,
            cudaGetErrorString(e));
    }
    return std::unique_ptr<Buffer>(new CudaBuffer(this, dev_, static_cast<char*>(p), size));
}

CudaBuffer::~CudaBuffer() {
    g_buffer_epoch.fetch_add(1);
    if (dev_->activate()) cudaFree(ptr_);
}

Status CudaBuffer::check_range(const Tensor* t, size_t offset, size_t size) const {
    return Buffer::check_range(t, offset, size).context(dev_->name());
}

Status CudaBuffer::set_tensor(Tensor* t, const void* src, size_t offset, size_t size) {
    FERRY_TRY(check_range(t, offset, size));
    if (size == 0) return Status::ok();
    char* dst = ptr_ + t->offs + offset;
    if (size >= kStagingChunk) {
        // Earlier work of every stream that may read the old bytes finishes first.
        FERRY_TRY(dev_->activate());
        CUDA_TRY(cudaDeviceSynchronize(), "%s: set_tensor", dev_->name());
        return dev_->upload(dst, src, size);
    }
    FERRY_TRY(dev_->activate());
    CUDA_TRY(cudaMemcpy(dst, src, size, cudaMemcpyHostToDevice), "%s: set_tensor '%s'",
             dev_->name(), t->name);
    return Status::ok();
}

Status CudaBuffer::get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) {
    FERRY_TRY(check_range(t, offset, size));
    if (size == 0) return Status::ok();
    FERRY_TRY(dev_->activate());
    // The legacy default stream waits for the work queued on every backend stream.
    if (size >= kPinnedRead && !is_pinned(dst)) {
        FERRY_TRY(dev_->download(dst, ptr_ + t->offs + offset, size));
    } else {
        CUDA_TRY(cudaMemcpy(dst, ptr_ + t->offs + offset, size, cudaMemcpyDeviceToHost),
                 "%s: get_tensor '%s'", dev_->name(), t->name);
    }
    return dev_->take_error();
}

Status CudaBuffer::memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) {
    FERRY_TRY(check_range(t, offset, size));
    if (size == 0) return Status::ok();
    FERRY_TRY(dev_->activate());
    CUDA_TRY(cudaMemset(ptr_ + t->offs + offset, value, size), "%s: memset '%s'", dev_->name(),
             t->name);
    return Status::ok();
}

Status CudaBuffer::clear(uint8_t value) {
    FERRY_TRY(dev_->activate());
    CUDA_TRY(cudaMemset(ptr_, value, size_), "%s: clear", dev_->name());
    return Status::ok();
}

CudaBuffer* cuda_buffer(const Tensor* t) {
    return t->buffer ? dynamic_cast<CudaBuffer*>(t->buffer) : nullptr;
}

bool CudaBuffer::copy_tensor(const Tensor* src, Tensor* dst) {
    const size_t n = src->nbytes();
    if (n != dst->nbytes() || !src->is_contiguous() || !dst->is_contiguous()) return false;
    if (!check_range(dst, 0, n)) return false;
    if (!dev_->activate()) return false;
    char* d = ptr_ + dst->offs;
    if (CudaBuffer* sb = cuda_buffer(src)) {
        if (!dev_->ready_for_copy_from(sb->cuda_device())) return false;
        return cudaMemcpyPeer(d, dev_->index(), sb->dev_ptr() + src->offs,
                              sb->cuda_device()->index(), n) == cudaSuccess;
    }
    if (src->data) return cudaMemcpy(d, src->data, n, cudaMemcpyHostToDevice) == cudaSuccess;
    return false;
}

// ---------------------------------------------------------------------------------------------
// The backend: a stream, the kernels, and CUDA-graph replay of repeated graphs.

// The part of the product after wo that the early decode attention asks for in L2 by default
// (CudaBackend::plan_l2_next): 1 / kL2NextPart of its bytes, on devices whose DRAM peaks
// below kL2NextMaxBandwidth bytes/s. Measured (bench/results/cuda.md, stop 43), 1B tg128
// side by side: an H100 (3.35 TB/s) +0.9-1.1% for F16, BF16 and Q4_0; an H200 (4.8 TB/s)
// F16 -0.3 to -0.5% (4 MiB: within the spread), Q4_0 and BF16 within the spread.
constexpr int64_t kL2NextPart = 8;
constexpr double kL2NextMaxBandwidth = 4.0e12;

std::atomic<uint64_t> g_persist_plans{0};                                      // persist_plans
std::atomic<uint64_t> g_host_reads{0};                                         // host_reads
std::atomic<uint64_t> g_ahead_queued{0}, g_ahead_started{0}, g_ahead_idle{0};  // ahead_counts

class CudaBackend : public Backend {
  public:
    CudaBackend(CudaDevice* dev, cudaStream_t s, DeviceError* err) : dev_(dev), stream_(s) {
        ctx_.stream = s;
        ctx_.device = dev->index();
        ctx_.n_sm = dev->n_sm();
        ctx_.err = err;
        use_graphs_ = !env_off("FERRY_CUDA_GRAPH");
        use_persist_ = !env_off("FERRY_CUDA_PERSIST");
        persist_why_ = env_on("FERRY_CUDA_PERSIST_WHY");
        persist_stamps_ = env_on("FERRY_CUDA_PERSIST_STAMPS");
        use_host_read_ = !env_off("FERRY_CUDA_HOST_READ");
        if (const char* v = std::getenv("FERRY_CUDA_PERSIST_SPLITS")) {
            persist_splits_ = std::clamp(std::atoi(v), 0, 4);
        }
        if (const char* v = std::getenv("FERRY_CUDA_PERSIST_INFLIGHT")) {
            // "A,C" (C in the whole chain) or "A,Q,T,I,W[,O]" (the chain's parts apart, and the
            // output phase).
            int n = 0;
            for (const char* c = v; n < 6; c++) {
                persist_inflight_[n++] = std::max(0, std::atoi(c));
                if (!(c = std::strchr(c, ','))) break;
            }
            if (n == 2)
                std::fill(persist_inflight_ + 2, persist_inflight_ + 5, persist_inflight_[1]);
        }
        use_fusion_ = !env_off("FERRY_CUDA_FUSION");
        use_add_norm_ = !env_off("FERRY_CUDA_FUSE_ADD_NORM");
        use_epilogue_ = !env_off("FERRY_CUDA_FUSE_EPILOGUE");
        use_qkv_ = !env_off("FERRY_CUDA_FUSE_QKV");
        use_norm_mv_ = !env_off("FERRY_CUDA_FUSE_NORM_MV");
        ctx_.mv_ring = !env_off("FERRY_CUDA_MV_RING");
        ctx_.mv_blk = !env_off("FERRY_CUDA_MV_BLK");
        ctx_.mv_raw = !env_off("FERRY_CUDA_MV_FRAW");
        ctx_.mv_next = !env_off("FERRY_CUDA_MV_FNEXT");
        ctx_.mv_nfast = !env_off("FERRY_CUDA_MV_NFAST");
        ctx_.attn_chunks = !env_off("FERRY_CUDA_ATTN_CHUNKS");
        use_attn_early_ = !env_off("FERRY_CUDA_ATTN_EARLY");
        ctx_.attn_early_idx = !env_off("FERRY_CUDA_ATTN_EARLY_IDX");
        ctx_.attn_late_trigger = env_on("FERRY_CUDA_ATTN_LATE_TRIGGER");
        ctx_.attn_early_mask = !env_off("FERRY_CUDA_ATTN_EARLY_MASK");
        if (const char* v = std::getenv("FERRY_CUDA_L2_NEXT")) {
            l2_next_kib_ = std::clamp<int64_t>(std::atoll(v), -1, int64_t{1} << 20);
        } else if (!(dev->peak_bandwidth() > 0.0 && dev->peak_bandwidth() < kL2NextMaxBandwidth)) {
            l2_next_kib_ = 0;
        }
        ctx_.mv_stream = !env_off("FERRY_CUDA_MV_STREAM");
        if (const char* w = std::getenv("FERRY_CUDA_MV_STREAM_WIDE")) {
            ctx_.mv_stream_wide = w[0] == '0' ? 0 : (w[0] == '2' ? 2 : 1);
        }
        if (const char* b = std::getenv("FERRY_CUDA_MV_BULK")) {
            ctx_.mv_bulk = std::clamp(std::atoi(b), 0, 8);
        }
        ctx_.mv_bulk_xglobal = env_on("FERRY_CUDA_MV_BULK_XGLOBAL");
        ctx_.mv_bulk_fit = !env_off("FERRY_CUDA_MV_BULK_FIT");
        if (const char* b = std::getenv("FERRY_CUDA_MV_BULK_Q")) {
            ctx_.mv_bulk_q = std::clamp(std::atoi(b), 0, 16);
        }
        if (const char* b = std::getenv("FERRY_CUDA_MV_BULK_BLOCKS")) {
            ctx_.mv_bulk_blocks = std::clamp(std::atoi(b), 1, 2);
        }
        if (const char* b = std::getenv("FERRY_CUDA_MV_BULK_PRE")) {
            ctx_.mv_bulk_pre = std::clamp(std::atoi(b), 0, 16);
        }
        use_stage_ = !env_off("FERRY_CUDA_STAGE");
        use_compact_key_ = !env_off("FERRY_CUDA_COMPACT_KEY");
        // The norm folded into the float kernel too (F16/BF16/F32 weights): off by default,
        // a wash on the H200 (bench/results/cuda.md, 1B F16 tg128: 611 with it against 627
        // in one run, 659-661 against 640-649 in the next); FERRY_CUDA_MV_FNORM=1 (the first
        // weights loaded before the norm) or 2 (without) turns it on.
        const char* fn = std::getenv("FERRY_CUDA_MV_FNORM");
        use_fnorm_ = fn && (std::strcmp(fn, "1") == 0 || std::strcmp(fn, "2") == 0);
        const char* p = std::getenv("FERRY_CUDA_PROFILE");
        profile_ = p && std::strcmp(p, "1") == 0;
        gstats_.on = env_on("FERRY_CUDA_GRAPH_STATS");
        if (const char* v = std::getenv("FERRY_CUDA_AHEAD_IDLE_US")) {
            ahead_idle_ = std::chrono::microseconds(std::clamp(std::atoi(v), 100, 10000000));
        }
    }
    ~CudaBackend() override {
        if (ahead_watch_.joinable()) {
            {
                std::lock_guard<std::mutex> lock(ahead_mu_);
                watch_stop_ = true;
            }
            ahead_cv_.notify_all();
            ahead_watch_.join();
        }
        if (!dev_->activate()) return;
        if (in_host_) release_ahead();
        cudaStreamSynchronize(stream_);
        if (ctx_.counters) cudaFree(ctx_.counters);
        if (host_out_slot_) cudaFree(host_out_slot_);
        if (profile_) print_profile();
        if (gstats_.on) print_graph_stats();
        for (cudaEvent_t e : prof_ev_) cudaEventDestroy(e);
        if (exec_) cudaGraphExecDestroy(exec_);
        if (cublas_) ctx_.cublas_api->destroy(static_cast<cublasHandle_t>(cublas_));
        if (cublas_ws_) cudaFree(cublas_ws_);
        if (scratch_) cudaFree(scratch_);
        if (in_host_) cudaFreeHost(in_host_);
        if (in_last_) cudaFree(in_last_);
        if (ahead_ev_) cudaEventDestroy(ahead_ev_);
        if (fork_ev_) cudaEventDestroy(fork_ev_);
        if (join_ev_) cudaEventDestroy(join_ev_);
        if (side_) cudaStreamDestroy(side_);
        if (mirror_) cudaFreeHost(mirror_);
        if (hm_flags_) cudaFreeHost(hm_flags_);
        if (hm_count_) cudaFree(hm_count_);
        if (piece_flags_) cudaFreeHost(piece_flags_);
        if (piece_ids_) cudaFree(piece_ids_);
        cudaStreamDestroy(stream_);
    }
    const char* name() const override { return dev_->name(); }
    Device* device() const override { return dev_; }
    void disable_graphs() { use_graphs_ = false; }
    // BackendOptions::progressive_results. FERRY_CUDA_PIECES=N: N pieces (1..kMaxPieces; 0:
    // off), for every backend (without a reader too: what the pieces cost the GPU).
    void enable_pieces(bool asked) {
        pieces_ = asked ? kDefaultPieces : 0;
        if (const char* v = std::getenv("FERRY_CUDA_PIECES")) {
            pieces_ = std::clamp(std::atoi(v), 0, kMaxPieces);
        }
        piece_copies_ = !env_off("FERRY_CUDA_PIECE_COPIES");
        piece_cut_ = env_on("FERRY_CUDA_PIECE_CUT");
    }

    Status set_tensor_async(Tensor* t, const void* src, size_t offset, size_t size) override {
        CudaBuffer* b = cuda_buffer(t);
        if (!b || b->cuda_device() != dev_) return Backend::set_tensor_async(t, src, offset, size);
        FERRY_TRY(b->check_range(t, offset, size));
        if (size == 0) return Status::ok();
        FERRY_TRY(dev_->activate());
        FERRY_TRY(issue_inputs());
        CUDA_TRY(cudaMemcpyAsync(b->dev_ptr() + t->offs + offset, src, size, cudaMemcpyHostToDevice,
                                 stream_),
                 "%s: set_tensor_async '%s'", name(), t->name);
        return Status::ok();
    }
    // A step's small inputs are staged, not copied: their bytes go into a pinned staging area
    // that the GPU reads through its host mapping, and one kernel copies them all
    // (launch_stage_inputs). The next compute launches that kernel as its first node, inside
    // a captured CUDA graph when the step replays one, so a decode step's inputs cost a
    // memcpy on the host instead of a cudaMemcpyAsync each (~4 us of host time apiece while
    // the GPU waits: 13.1 us a step in stop 25's session profile). Every other operation on
    // the stream issues staged inputs first (issue_inputs), so the order is the caller's.
    // FERRY_CUDA_STAGE=0: one cudaMemcpyAsync per write.
    Status set_tensors_async(std::span<const TensorWrite> writes) override {
        Expected<uint32_t> bytes = stage_size(writes);
        if (!bytes) return bytes.status();
        // Anything not staged goes one write at a time (set_tensor_async issues what was
        // staged before it first).
        if (*bytes == 0) return Backend::set_tensors_async(writes);
        FERRY_TRY(dev_->activate());
        FERRY_TRY(issue_inputs());  // inputs staged before, and not yet issued
        FERRY_TRY(ensure_staging());
        // The area is free once the kernel that read the last inputs has run (the caller has
        // almost always waited for that step's results); else wait for it.
        if (!area_read()) {
            CUDA_TRY(cudaStreamSynchronize(stream_), "%s: input staging", name());
        }
        stage(writes, false);
        return Status::ok();
    }
    Expected<bool> compute_ahead(Graph& g) override;
    Expected<bool> run_ahead(std::span<const TensorWrite> inputs) override;
    Status settle_ahead() override {
        FERRY_TRY(dev_->activate());
        release_ahead();
        return synchronize();
    }
    Status get_tensor_async(const Tensor* t, void* dst, size_t offset, size_t size) override {
        CudaBuffer* b = cuda_buffer(t);
        if (!b || b->cuda_device() != dev_) return Backend::get_tensor_async(t, dst, offset, size);
        FERRY_TRY(b->check_range(t, offset, size));
        if (size == 0) return Status::ok();
        FERRY_TRY(dev_->activate());
        FERRY_TRY(issue_inputs());
        const HostRead r{b->dev_ptr() + t->offs + offset, dst, size};
        last_read_ = r;
        if (done_read_ == r) {  // the step in flight stores them there
            g_host_reads.fetch_add(1, std::memory_order_relaxed);
            gstats_.host_reads++;
            return Status::ok();
        }
        CUDA_TRY(cudaMemcpyAsync(dst, r.src, size, cudaMemcpyDeviceToHost, stream_),
                 "%s: get_tensor_async '%s'", name(), t->name);
        return Status::ok();
    }
    bool copy_tensor_async(const Tensor* src, Tensor* dst) override {
        CudaBuffer* db = cuda_buffer(dst);
        if (!db || db->cuda_device() != dev_) return false;
        const size_t n = src->nbytes();
        if (n != dst->nbytes() || !src->is_contiguous() || !dst->is_contiguous()) return false;
        if (!db->check_range(dst, 0, n) || !dev_->activate() || !issue_inputs()) return false;
        char* d = db->dev_ptr() + dst->offs;
        if (CudaBuffer* sb = cuda_buffer(src)) {
            if (!dev_->ready_for_copy_from(sb->cuda_device())) return false;
            return cudaMemcpyPeerAsync(d, dev_->index(), sb->dev_ptr() + src->offs,
                                       sb->cuda_device()->index(), n, stream_) == cudaSuccess;
        }
        if (src->data) {
            return cudaMemcpyAsync(d, src->data, n, cudaMemcpyHostToDevice, stream_) == cudaSuccess;
        }
        return false;
    }

    Status compute(Graph& g) override;
    PieceRead read_in_pieces(const Tensor* t, size_t offset, size_t size) override;
    // The pinned copy of a progressive product (a server charges it to the session).
    size_t scratch_bytes() const override {
        return mirror_size_ + (hm_flags_ ? mirror_bytes(hm_stride_) : 0);
    }

    Status synchronize() override {
        FERRY_TRY(dev_->activate());
        if (ahead_) {
            // Everything but the launch queued ahead, which waits for its inputs.
            CUDA_TRY(cudaEventSynchronize(ahead_ev_), "%s: synchronize", name());
            return dev_->take_error();
        }
        FERRY_TRY(issue_inputs());
        CUDA_TRY(cudaStreamSynchronize(stream_), "%s: synchronize", name());
        pieces_pending_ = false;
        return dev_->take_error();
    }
    Status record_event(Event* e) override {
        CudaEvent* ce = dynamic_cast<CudaEvent*>(e);
        if (!ce || ce->device() != dev_) {
            return Status::errorf("%s: record_event: the event belongs to device %s", name(),
                                  e && e->device() ? e->device()->name() : "?");
        }
        FERRY_TRY(dev_->activate());
        FERRY_TRY(issue_inputs());
        CUDA_TRY(cudaEventRecord(ce->get(), stream_), "%s: record_event", name());
        return Status::ok();
    }
    Status wait_event(Event* e) override {
        CudaEvent* ce = dynamic_cast<CudaEvent*>(e);
        if (!ce) {
            // Another device's event: its work is waited for on the host.
            return e ? e->synchronize() : Status::errorf("%s: wait_event: no event", name());
        }
        FERRY_TRY(dev_->activate());
        FERRY_TRY(issue_inputs());
        CUDA_TRY(cudaStreamWaitEvent(stream_, ce->get(), 0), "%s: wait_event", name());
        return Status::ok();
    }

  private:
    // One kernel launch: a node, or a fused pair (node, second) whose result is second's.
    struct Step {
        const Tensor* node;
        const Tensor* second;  // nullptr unless fused
        int kind;              // 0 plain, 1 rms_norm+mul, 2 mul_mat+add, 3 gate+up+swiglu,
                               // 4 add+rms_norm+mul (third: the MUL),
                               // 5 products with their rope and/or set_rows (units),
                               // 6 the persistent decode step (node: its first node)
        const Tensor* third;   // kind 3: the SWIGLU (whose result is written)
        // kind 5: the products (each with its ROPE and/or SET_ROWS) of one launch
        std::array<EpilogueUnit, 3> units{};
        int n_units = 0;
        // kinds 0, 3, 5: the [ADD ->] RMS_NORM -> MUL computed in the product's prologue
        NormPrologue pro{};
        // kind 0 FLASH_ATTN_EXT: the rows of its K and V views this graph writes (has_early:
        // early_rows found every writer)
        AttnEarly early{};
        bool has_early = false;
        // kind 6: the persistent decode step (persist.h), its table in persist_, and the
        // bytes of weights it reads (the profile's)
        int persist = -1;
        double persist_bytes = 0.0;
    };
    static bool early_rows(const std::vector<const Tensor*>& kn, size_t a, AttnEarly* e);
    void plan_l2_next();
    bool fold_norm(const Step& s, Step* t) const;
    bool match_epilogue(const std::vector<const Tensor*>& kn, size_t i, EpilogueUnit* u,
                        size_t* len);
    Status plan(Graph& g);
    static bool fusion_is_safe(int kind, const Tensor* n, const Tensor* second,
                               const Tensor* third);
    // set_tensors_async's staging area (kInputAreaBytes of host-mapped pinned memory, then the
    // sequence number the kernel stores once it has read the area), its device address, the
    // bytes staged and not yet issued (0: none) and the sequence number of the last batch.
    static constexpr size_t kInputDescs = 64;
    char* in_host_ = nullptr;
    char* in_dev_ = nullptr;
    uint32_t in_bytes_ = 0;
    uint32_t in_seq_ = 0;
    bool use_stage_ = true;
    bool use_compact_key_ = true;  // FERRY_CUDA_COMPACT_KEY=0: every source described at every read
    uint32_t* consumed_host() const {
        return reinterpret_cast<uint32_t*>(in_host_ + kInputAreaBytes);
    }
    // The kernel has read the last batch staged (the area may be written again).
    bool area_read() const { return __atomic_load_n(consumed_host(), __ATOMIC_ACQUIRE) == in_seq_; }
    // Launches the kernel that copies the staged inputs, if any (on the stream, or into a
    // graph being captured).
    Status issue_inputs() {
        release_ahead();
        if (!in_bytes_) return Status::ok();
        const uint32_t bytes = in_bytes_;
        in_bytes_ = 0;
        return launch_stage_inputs(stream_, in_dev_, bytes,
                                   reinterpret_cast<uint32_t*>(in_dev_ + kInputAreaBytes),
                                   in_last_);
    }
    // The staging area's bytes for these writes (header, descriptors, data), or 0 when they
    // are not staged (staging off, too many or too large, or not all on this device).
    Expected<uint32_t> stage_size(std::span<const TensorWrite> writes) const {
        if (!use_stage_ || writes.empty() || writes.size() > kInputDescs) return 0u;
        size_t total = 16, nz = 0;
        for (const TensorWrite& w : writes) {
            CudaBuffer* b = cuda_buffer(w.t);
            if (!b || b->cuda_device() != dev_) return 0u;
            FERRY_TRY(b->check_range(w.t, w.offset, w.size));
            if (w.size == 0) continue;
            nz++;
            total += sizeof(UploadDesc) + (w.size + 15) / 16 * 16;
        }
        if (nz == 0 || total > kInputAreaBytes) return 0u;
        return static_cast<uint32_t>(total);
    }
    Status ensure_staging() {
        if (in_host_) return Status::ok();
        CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&in_host_), kInputAreaBytes + 16,
                               cudaHostAllocMapped),
                 "%s: input staging memory", name());
        CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&in_dev_), in_host_, 0),
                 "%s: input staging memory", name());
        std::memset(in_host_, 0, kInputAreaBytes + 16);
        CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&in_last_), sizeof(uint32_t)),
                 "%s: input staging memory", name());
        CUDA_TRY(cudaMemset(in_last_, 0, sizeof(uint32_t)), "%s: input staging memory", name());
        return Status::ok();
    }
    // Writes the batch (stage_size's bytes) into the area, its sequence number last;
    // `gated`: a launch may be reading the area now (it then reads it again).
    void stage(std::span<const TensorWrite> writes, bool gated) {
        size_t nz = 0;
        for (const TensorWrite& w : writes) nz += w.size != 0;
        auto* desc = reinterpret_cast<UploadDesc*>(in_host_ + 16);
        uint32_t off = static_cast<uint32_t>(16 + nz * sizeof(UploadDesc));
        uint32_t n = 0;
        for (const TensorWrite& w : writes) {
            if (w.size == 0) continue;
            std::memcpy(in_host_ + off, w.src, w.size);
            desc[n++] = {cuda_buffer(w.t)->dev_ptr() + w.t->offs + w.offset, off,
                         static_cast<uint32_t>(w.size)};
            off += static_cast<uint32_t>((w.size + 15) / 16 * 16);
        }
        publish(n, gated);
        in_bytes_ = off;
    }
    // The header: count and flag, then the sequence number (what a waiting launch polls).
    void publish(uint32_t n, bool gated) {
        auto* head = reinterpret_cast<uint32_t*>(in_host_);
        head[0] = n;
        head[2] = gated ? 1u : 0u;
        __atomic_store_n(&head[1], ++in_seq_, __ATOMIC_RELEASE);
    }
    // A launch queued ahead (compute_ahead) that no inputs came for runs with the last ones:
    // the step before, again.
    void release_ahead() {
        if (!ahead_.load(std::memory_order_acquire)) return;
        std::lock_guard<std::mutex> lock(ahead_mu_);
        release_locked();
    }
    void release_locked() {
        if (!ahead_) return;
        ahead_ = false;
        publish(reinterpret_cast<const uint32_t*>(in_host_)[0], true);
    }
    // A launch queued ahead that no inputs come for within ahead_idle_ is released by a watcher
    // thread (made with the first one), so that an idle session leaves no kernel waiting on the
    // GPU (a block held on an SM, and time slices another process's kernels would have had);
    // the next kAheadSkip launches are then not queued (a caller that slow gains nothing).
    // FERRY_CUDA_AHEAD_IDLE_US=N sets the time.
    // With nothing queued for a second it sleeps until compute_ahead wakes it (watch_parked_).
    void watch_ahead() {
        std::unique_lock<std::mutex> lock(ahead_mu_);
        while (!watch_stop_) {
            const auto now = std::chrono::steady_clock::now();
            if (ahead_ && now - ahead_since_ >= ahead_idle_) {
                release_locked();
                ahead_skip_ = kAheadSkip;
                g_ahead_idle.fetch_add(1, std::memory_order_relaxed);
            }
            if (!ahead_ && now - ahead_since_ >= std::chrono::seconds(1)) {
                watch_parked_ = true;
                ahead_cv_.wait(lock, [this] { return watch_stop_ || !watch_parked_; });
                continue;
            }
            ahead_cv_.wait_for(lock, ahead_idle_ / 2);
        }
    }
    static constexpr int kAheadSkip = 16;
    std::mutex ahead_mu_;  // ahead_'s changes, and the staging area while a launch waits
    std::condition_variable ahead_cv_;
    std::thread ahead_watch_;
    bool watch_stop_ = false;
    bool watch_parked_ = false;
    int ahead_skip_ = 0;
    std::chrono::steady_clock::time_point ahead_since_;
    std::chrono::microseconds ahead_idle_{20000};
    // compute_ahead's launch: queued behind ahead_ev_, waiting for a batch of ahead_bytes_
    // (the size its captured graph copies).
    std::atomic<bool> ahead_{false};
    uint32_t ahead_bytes_ = 0;
    cudaEvent_t ahead_ev_ = nullptr;
    uint32_t* in_last_ = nullptr;  // device memory: the sequence number the kernel read last
    // The words that describe a graph's structure (quick_key), in a buffer that keeps its
    // capacity: building one is plain stores, comparing one a memcmp.
    class Key {
      public:
        uint64_t* begin(size_t most) {
            if (w_.size() < most) w_.resize(most);
            return w_.data();
        }
        void end(const uint64_t* e) { n_ = static_cast<size_t>(e - w_.data()); }
        void clear() { n_ = 0; }
        bool operator==(const Key& o) const {
            return n_ == o.n_ && (n_ == 0 || std::memcmp(w_.data(), o.w_.data(), n_ * 8) == 0);
        }
        void assign(const Key& o) {
            if (w_.size() < o.n_) w_.resize(o.n_);
            if (o.n_) std::memcpy(w_.data(), o.w_.data(), o.n_ * 8);
            n_ = o.n_;
        }
        void swap(Key& o) {
            w_.swap(o.w_);
            std::swap(n_, o.n_);
        }

      private:
        std::vector<uint64_t> w_;
        size_t n_ = 0;
    };
    void quick_key(const Graph& g, Key& k, bool compact) const;
    static bool sources_listed(const Graph& g);
    Status run_steps();
    Status run_profiled();
    Status run_step(const Step& s);
    // Progressive results (BackendOptions::progressive_results, read_in_pieces): when a
    // graph's last step is a one-column product of many rows (a decode step's logits), its
    // rows reach host memory while the GPU still computes the rest, so that a server sends the
    // first logits over its socket while the GPU computes the last. Two forms: the host
    // mirror below (the streaming kernel's products, the default), and the cut form: the
    // product as pieces_ launches over its rows; after each, a second stream copies that
    // piece's rows into pinned host memory (mirror_) and sets the piece's flag there (an
    // 8-byte copy: copy engines only). Each cut costs the GPU a few microseconds
    // (bench/results/cuda.md, stop 30); the mirror about nothing (stop 32).
    static constexpr int kMaxPieces = 16, kDefaultPieces = 8;
    // From a decode step's logits (a 32,000-token vocabulary: 125 KiB) to 64 MiB of pinned
    // memory at most (a client's product may be far larger than any vocabulary).
    static constexpr int64_t kPieceMinRows = 16384, kPieceMaxRows = int64_t{16} << 20;
    Status plan_pieces();
    Status run_pieces(const Step& s);
    struct PieceLayout {
        bool on = false;      // the run copies and flags its pieces, or mirrors its rows
        bool mirror = false;  // the kernel stored its rows into the host mirror (hm_*)
        int n = 0;
        int64_t rows = 0;  // rows of each piece or step (the last may have fewer)
    };
    void pieces_issued(const PieceLayout& layout);
    Expected<size_t> wait_piece(size_t lo, size_t size, size_t have);
    Expected<size_t> wait_mirror(size_t lo, size_t size, size_t have);
    Status first_piece_error();
    Status ensure_mirror(int64_t rows);
    // The host mirror (HostMirror, the default form for products of the streaming kernel;
    // the cut form above for others, or with FERRY_CUDA_PIECE_CUT=1): the product's kernel
    // stores its rows into host-mapped memory as it sums them and sets a host flag for each
    // step of W G rows once they are all there (no extra launch or copy); the reader sends
    // a step once its flag is set. compute() clears the flags before each run (the run before
    // is over by then: pieces_pending_), and resets the device's step counters when a run may
    // have stopped short (hm_reset_).
    bool piece_cut_ = false;
    bool piece_mirror_ = false;     // the plan's progressive product is mirrored
    uint32_t* hm_flags_ = nullptr;  // host-mapped: kMirrorSteps flags, then the rows
    uint32_t* hm_dev_ = nullptr;    // its device address
    // Host memory of a mirror of `stride` words of rows: the flags, then the rows.
    static size_t mirror_bytes(int64_t stride) {
        return (kMirrorSteps + static_cast<size_t>(stride)) * sizeof(uint32_t);
    }
    int64_t hm_stride_ = 0;         // words of rows
    uint32_t* hm_count_ = nullptr;  // device memory: kMirrorSteps step counters
    bool hm_reset_ = false;         // a run may have stopped short: zero the counters
    void pieces_failed();
    Status clear_pieces();
    Status launch_exec();
    int pieces_ = 0;            // pieces a progressive result is cut into (0: off)
    bool piece_copies_ = true;  // FERRY_CUDA_PIECE_COPIES=0: cut, not copied (what a cut costs)
    int piece_step_ = -1;       // steps_ index of the plan's progressive product, or -1
    // The pieces of the last run_steps (a direct run or a capture) and of the captured graph.
    PieceLayout run_layout_, exec_layout_;
    cudaStream_t side_ = nullptr;
    cudaEvent_t fork_ev_ = nullptr;
    cudaEvent_t join_ev_ = nullptr;
    char* mirror_ = nullptr;  // pinned host memory for the product's bytes
    size_t mirror_size_ = 0;
    // Pinned host memory: piece c's flag (0 until the piece is in mirror_, then c + 1, copied
    // from piece_ids_ in device memory). Cleared by compute() once no copy of an earlier
    // compute can still be on its way (pieces_pending_: a compute ran the product and was not
    // waited for since).
    uint64_t* piece_flags_ = nullptr;
    uint64_t* piece_ids_ = nullptr;
    bool pieces_pending_ = false;
    struct LivePieces {  // the last compute's progressive product
        bool on = false;
        const char* dev = nullptr;
        size_t bytes = 0;
        int n = 0;
        size_t ends[kMirrorSteps] = {};  // each piece's (step's) end in bytes from dev
        bool mirror = false;             // read from the host mirror (flags hm_flags_)
    } live_;
    Status ensure_scratch(size_t size);
    Status ensure_cublas();

    CudaDevice* dev_;
    cudaStream_t stream_;
    OpContext ctx_;
    // The persistent decode step (persist.h), on for every graph the kernel takes
    // (persist_shapes_ok: up to 1,024 keys). Stop 54, H100, 1B F16, plan | step: tg128 978 |
    // 1,094, tg512 951 | 1,059, tg1024 927 | 1,012 t/s (a head's attention split over four
    // blocks past 128 keys; with one block a head, tg1024 was 884, below the plan).
    // FERRY_CUDA_PERSIST=0: never. FERRY_CUDA_PERSIST_WHY=1 says why a one-token graph was not
    // lowered to it.
    bool use_persist_ = true, persist_why_ = false, persist_stamps_ = false;
    // Its attention's blocks a head at most (FERRY_CUDA_PERSIST_SPLITS=1, 2 or 4; 0: as many
    // as the SMs take, up to 4).
    int persist_splits_ = 0;
    // Its weight copies in flight a block, in the attention's chain's parts (PersistModel::chain)
    // and in the output phase (FERRY_CUDA_PERSIST_INFLIGHT=3,1 or 3,1,1,1,1,3; 0: the kernel's).
    int persist_inflight_[6] = {0, 0, 0, 0, 0, 0};
    std::unique_ptr<Persist> persist_;
    // The step whose output a session reads (the persistent step, or the graph's last product),
    // or -1: its launch gets OpContext::host_out. direct_out_: that output (device memory) when
    // its kernel also stores it into the host memory the word names (the persistent step; the
    // streaming form), else nullptr. The word (device memory; host_out_set_: its value, set in
    // stream order by set_host_out) is the same while the backend lives, so captured graphs
    // keep it.
    int out_step_ = -1;
    const char* direct_out_ = nullptr;
    size_t direct_out_bytes_ = 0;
    float** host_out_slot_ = nullptr;
    float* host_out_set_ = nullptr;
    Status set_host_out(float* p);
    // A read of a result into host memory (get_tensor_async).
    // (By the device address read, not the tensor: a caller may read through a temporary
    // Tensor, as a server does for a client's copy into its shared memory; stop 55's first
    // run kept its address and crashed the server when the next queued launch looked at it.)
    struct HostRead {
        const char* src = nullptr;
        void* dst = nullptr;
        size_t size = 0;
        bool operator==(const HostRead&) const = default;
    };
    // The read before a launch queued ahead (Scheduler::get_tensor_then: the session's read
    // of a decode step's logits, then the next step queued) is the one that step's logits
    // will get: when it is direct_out_ whole and the destination host memory the device maps,
    // the queued launch stores its output there too (set_host_out), and that read then copies
    // nothing (1B: 513 KB, ~9 us a token on the copy engine, stop 28; +1.7% for the
    // persistent step, stop 54). last_read_: the last read; ahead_read_: the one the queued launch
    // stores; done_read_: the one the launch in flight stores (run_ahead started it; any other
    // compute clears it). FERRY_CUDA_HOST_READ=0: never.
    HostRead last_read_, ahead_read_, done_read_;
    bool use_host_read_ = true;
    // Where the queued launch stores its output besides device memory: the device's address
    // of last_read_'s host memory when it is direct_out_ whole, else nullptr.
    float* host_read_target() const;
    bool use_graphs_ = true, use_fusion_ = true, use_add_norm_ = true, use_epilogue_ = true,
         use_qkv_ = true, use_norm_mv_ = true, use_fnorm_ = false;
    // FERRY_CUDA_ATTN_EARLY=0: decode attention loads its keys and values after the wait.
    bool use_attn_early_ = true;
    // How much of the product after wo (gate and up) the early decode attention asks for in L2
    // at its start (AttnEarly::next): FERRY_CUDA_L2_NEXT=KiB (0: none; -1: an eighth of its
    // weights on any device); by default an eighth where the DRAM peaks below
    // kL2NextMaxBandwidth, else none.
    int64_t l2_next_kib_ = -1;
    bool capturing_ = false;  // run_steps is recording a CUDA graph
    std::vector<Step> steps_;
    std::unordered_map<const Tensor*, int> consumers_;
    std::unordered_map<const Tensor*, int> kconsumers_;  // readers that are not views, by storage
    char* scratch_ = nullptr;
    size_t scratch_size_ = 0;
    void* cublas_ = nullptr;
    void* cublas_ws_ = nullptr;
    // CUDA graphs. planned_key_ is the structure (ops, shapes, addresses) the steps were
    // planned for, and plan_gen_ counts its changes, so that the last graph computed and the
    // one captured in exec_ are known by a generation and the scratch and cuBLAS workspace
    // addresses a capture bakes in; exec_key_ is kept to recognise a structure that comes back
    // (a decode step after a prompt) without a new capture.
    Key key_, planned_key_, exec_key_;
    bool planned_compact_ = false;  // planned_key_'s form (quick_key)
    uint64_t plan_gen_ = 0;
    struct Seen {
        uint64_t gen = 0;  // 0: none
        const void* scratch = nullptr;
        const void* ws = nullptr;
        const void* mirror = nullptr;  // the progressive product's host copy (mirror_)
        uint32_t inputs = 0;           // bytes of staged inputs its first node copies (0: none)
        bool operator==(const Seen&) const = default;
    };
    Seen last_, exec_seen_;
    // The planned graph as a run with `inputs` bytes of staged inputs would see it.
    Seen seen(uint32_t inputs) const {
        return {plan_gen_, scratch_, cublas_ws_,
                piece_step_ < 0 ? nullptr
                : piece_mirror_ ? static_cast<const void*>(hm_flags_)
                                : static_cast<const void*>(mirror_),
                inputs};
    }
    cudaGraphExec_t exec_ = nullptr;
    // FERRY_CUDA_PROFILE=1: every step timed with events (no graphs), a table at the end.
    bool profile_ = false;
    struct ProfileRow {
        double ms = 0.0;
        int64_t calls = 0;
        double bytes = 0.0;
    };
    std::unordered_map<std::string, ProfileRow> prof_;
    std::vector<cudaEvent_t> prof_ev_;
    double prof_total_ms_ = 0.0;
    int64_t prof_graphs_ = 0;
    void print_profile();
    // FERRY_CUDA_GRAPH_STATS=1: how compute() ran each graph (replayed, run kernel by kernel,
    // captured and updated in place, or captured and instantiated anew) and the host time of
    // each way, and the reads the step had stored itself (no copy), printed when the backend
    // goes away.
    struct GraphStats {
        bool on = false;
        int64_t n[4] = {0, 0, 0, 0};
        double us[4] = {0, 0, 0, 0};
        double key_us = 0, plan_us = 0;
        int64_t plans = 0, host_reads = 0;
    } gstats_;
    enum { kReplay, kDirect, kUpdate, kInstantiate };
    void print_graph_stats() const;
};

void CudaBackend::print_graph_stats() const {
    static const char* const kWay[4] = {"replayed", "run kernel by kernel",
                                        "captured, updated in place", "captured, instantiated"};
    int64_t total = 0;
    for (int64_t v : gstats_.n) total += v;
    if (total == 0) return;
    std::fprintf(stderr,
                 "%s graph stats: %lld computes; key %.1f us each; %lld plans, %.1f us each",
                 dev_->name(), static_cast<long long>(total),
                 gstats_.key_us / static_cast<double>(total), static_cast<long long>(gstats_.plans),
                 gstats_.plans ? gstats_.plan_us / static_cast<double>(gstats_.plans) : 0.0);
    for (int w = 0; w < 4; w++) {
        if (gstats_.n[w] == 0) continue;
        std::fprintf(stderr, "; %s %lld, %.1f us each", kWay[w],
                     static_cast<long long>(gstats_.n[w]),
                     gstats_.us[w] / static_cast<double>(gstats_.n[w]));
    }
    std::fprintf(stderr, "; %lld reads stored by the step\n",
                 static_cast<long long>(gstats_.host_reads));
}

bool is_view_op(Op op) {
    return op == Op::NONE || (op_info(op).flags & kOpView) != 0;
}

Status run_node(OpContext& ctx, const Tensor* n) {
    switch (n->op) {
        case Op::CPY:
            return op_cpy(ctx, n);
        case Op::CONT:
            return op_cont(ctx, n);
        case Op::GET_ROWS:
            return op_get_rows(ctx, n);
        case Op::SET_ROWS:
            return op_set_rows(ctx, n);
        case Op::ADD:
            return op_add(ctx, n);
        case Op::MUL:
            return op_mul(ctx, n);
        case Op::SCALE:
            return op_scale(ctx, n);
        case Op::RMS_NORM:
            return op_rms_norm(ctx, n);
        case Op::NORM:
            return op_norm(ctx, n);
        case Op::MUL_MAT:
            return op_mul_mat(ctx, n);
        case Op::SOFT_MAX:
            return op_soft_max(ctx, n);
        case Op::ROPE:
            return op_rope(ctx, n);
        case Op::FLASH_ATTN_EXT:
            return op_flash_attn_ext(ctx, n);
        case Op::SILU:
            return op_silu(ctx, n);
        case Op::GELU:
            return op_gelu(ctx, n);
        case Op::SWIGLU:
            return op_swiglu(ctx, n);
        case Op::GEGLU:
            return op_geglu(ctx, n);
        case Op::ARGMAX:
            return op_argmax(ctx, n);
        case Op::SUM_ROWS:
            return op_sum_rows(ctx, n);
        case Op::NONE:
        case Op::RESHAPE:
        case Op::VIEW:
        case Op::PERMUTE:
        case Op::TRANSPOSE:
            return Status::ok();
        case Op::TOP_K:
            return op_top_k(ctx, n);
        case Op::COUNT:
            break;
    }
    return Status::errorf("CUDA: op %s has no kernel", op_name(n->op));
}

Status CudaBackend::ensure_scratch(size_t size) {
    if (size <= scratch_size_) return Status::ok();
    CUDA_TRY(cudaStreamSynchronize(stream_), "%s: scratch", name());
    if (scratch_) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_size_ = 0;
    const size_t want = size + size / 4;
    CUDA_TRY(cudaMalloc(&scratch_, want), "%s: %.1f MiB of scratch", name(), want / 1048576.0);
    scratch_size_ = want;
    ctx_.scratch = {scratch_, scratch_size_};
    return Status::ok();
}

Status CudaBackend::ensure_cublas() {
    if (cublas_) return Status::ok();
    std::string why;
    const CublasApi* api = cublas_api(&why);
    if (!api) return Status::errorf(ErrorCode::Unsupported, "%s: %s", name(), why.c_str());
    cublasHandle_t h;
    if (api->create(&h) != CUBLAS_STATUS_SUCCESS) {
        return Status::errorf("%s: cannot create a cuBLAS handle", name());
    }
    cublas_ = h;
    ctx_.cublas_api = api;
    // An explicit workspace keeps cuBLAS from allocating while a CUDA graph is captured.
    CUDA_TRY(cudaMalloc(&cublas_ws_, kCublasWorkspace), "%s: cuBLAS workspace", name());
    if (api->set_workspace(h, cublas_ws_, kCublasWorkspace) != CUBLAS_STATUS_SUCCESS) {
        return Status::errorf("%s: cuBLAS workspace", name());
    }
    ctx_.cublas = cublas_;
    return Status::ok();
}

namespace {

// Whether two tensors' device storage shares a byte.
bool overlaps(const Tensor* a, const Tensor* b) {
    const char* pa = device_ptr(a);
    const char* pb = device_ptr(b);
    return pa < pb + b->nbytes() && pb < pa + a->nbytes();
}

// Whether two tensors are the same elements at the same place (an element read and written
// by the same thread).
bool same_place(const Tensor* a, const Tensor* b) {
    if (device_ptr(a) != device_ptr(b) || !same_shape(a, b)) return false;
    for (int d = 0; d < kMaxDims; d++) {
        if (a->nb[d] != b->nb[d]) return false;
    }
    return true;
}

}  // namespace

// The graph allocator frees a tensor's storage once its last reader ran, so the node after
// that reader may be placed over it: unfused, harmless; fused into one kernel with that reader,
// the kernel would write over what its other blocks are still reading (seen: the attention
// output projection + residual ADD of every llama layer wrote its result over the attention
// output it multiplies, and the logits changed from run to run). Each fusion is taken only
// when its result cannot be read by another block of the same kernel.
bool CudaBackend::fusion_is_safe(int kind, const Tensor* n, const Tensor* second,
                                 const Tensor* third) {
    switch (kind) {
        case 1:  // rms_norm+mul: a block normalises one row and each thread writes only the
                 // elements it read itself, so the output may be the input, exactly
            return (!overlaps(second, n->src[0]) || same_place(second, n->src[0])) &&
                   !overlaps(second, second->src[1]);
        case 2:  // mul_mat+add: every block reads all of b; the residual is read per element
            return !overlaps(second, n->src[1]) &&
                   (!overlaps(second, second->src[1]) || same_place(second, second->src[1]));
        case 3:  // gate+up+swiglu: every block reads all of b
            return !overlaps(third, n->src[1]);
        case 5: {  // mul_mat epilogue: every block reads all of b; writes rows of its own
            const Tensor* b = n->src[1];
            if (second && overlaps(second, b)) return false;
            if (third && overlaps(third->src[0], b)) return false;
            return !(!second && !third);
        }
        case 4: {  // add+rms_norm+mul: per row and per element, as kind 1; the sum is kept
            const Tensor* add = n;
            const Tensor* mul = third;
            for (const Tensor* src : {add->src[0], add->src[1]}) {
                for (const Tensor* out : {add, mul}) {
                    if (overlaps(out, src) && !same_place(out, src)) return false;
                }
            }
            return !overlaps(mul, add) && !overlaps(mul, mul->src[1]) &&
                   !overlaps(add, mul->src[1]);
        }
        default:
            return true;
    }
}

// A product at kn[i] whose epilogue can take the ROPE and/or SET_ROWS after it: fills the
// unit and the number of kernel nodes it covers.
bool CudaBackend::match_epilogue(const std::vector<const Tensor*>& kn, size_t i, EpilogueUnit* u,
                                 size_t* len) {
    const Tensor* n = kn[i];
    const Tensor* next = i + 1 < kn.size() ? kn[i + 1] : nullptr;
    const Tensor* next2 = i + 2 < kn.size() ? kn[i + 2] : nullptr;
    if (n->op != Op::MUL_MAT || !next || (n->flags & kTensorOutput) != 0 || kconsumers_[n] != 1) {
        return false;
    }
    const Tensor* rope = next->op == Op::ROPE ? next : nullptr;
    const Tensor* sr = rope ? (next2 && next2->op == Op::SET_ROWS ? next2 : nullptr)
                            : (next->op == Op::SET_ROWS ? next : nullptr);
    if (rope && sr && (sr->src[1]->storage() != rope || kconsumers_[rope] != 1)) {
        sr = nullptr;  // the rope alone
    }
    if ((!rope && !sr) || !can_fuse_mul_mat_epilogue(n, rope, sr) ||
        !fusion_is_safe(5, n, rope, sr)) {
        return false;
    }
    u->mm = n;
    u->rope = rope;
    u->set_rows = sr;
    // The rope's result is written unless the fused store is its only reader.
    u->write_out = rope && (!sr || (rope->flags & kTensorOutput) != 0);
    *len = 1 + static_cast<size_t>(rope != nullptr) + static_cast<size_t>(sr != nullptr);
    return true;
}

// A norm step s (kind 1: RMS_NORM+MUL, 4: ADD+RMS_NORM+MUL) whose MUL only the product
// launch t that follows reads (kinds 0, 3, 5: the int8 kernel, or the float kernel's fused
// form for F16/BF16/F32 weights) is computed in t's prologue
// instead (FERRY_CUDA_FUSE_NORM_MV=0 turns it off). Every block of t reads the norm's inputs
// while other blocks write t's results, and block 0 writes the ADD's sum: none of these may
// share a byte.
bool CudaBackend::fold_norm(const Step& s, Step* t) const {
    NormPrologue p;
    if (s.kind == 1) {
        p = {nullptr, s.node, s.second};
    } else if (s.kind == 4) {
        p = {s.node, s.second, s.third};
    } else {
        return false;
    }
    const Tensor* mul = p.mul;
    if ((mul->flags & kTensorOutput) != 0) return false;
    std::vector<const Tensor*> mms, outs;
    if (t->kind == 0 && t->node->op == Op::MUL_MAT) {
        mms = {t->node};
        outs = {t->node};
    } else if (t->kind == 3) {
        mms = {t->node, t->second};
        outs = {t->third};
    } else if (t->kind == 5) {
        for (int u = 0; u < t->n_units; u++) {
            const EpilogueUnit& e = t->units[static_cast<size_t>(u)];
            mms.push_back(e.mm);
            for (const Tensor* o : {e.mm, e.rope, e.set_rows}) {
                if (o) outs.push_back(o);
            }
        }
    } else {
        return false;
    }
    const auto it = consumers_.find(mul);
    if (it == consumers_.end() || it->second != static_cast<int>(mms.size())) return false;
    for (const Tensor* mm : mms) {
        if (!can_fold_norm(p, mm, use_fnorm_, ctx_.mv_stream)) return false;
    }
    std::vector<const Tensor*> ins = {p.norm->src[0], mul->src[1]};
    if (p.add) ins = {p.add->src[0], p.add->src[1], mul->src[1]};
    for (const Tensor* o : outs) {
        for (const Tensor* in : ins) {
            if (overlaps(o, in)) return false;
        }
        if (p.add && overlaps(o, p.add)) return false;
    }
    if (p.add) {
        for (const Tensor* in : ins) {
            if (overlaps(p.add, in)) return false;
        }
    }
    t->pro = p;
    return true;
}

Status CudaBackend::plan(Graph& g) {
    steps_.clear();
    consumers_.clear();
    kconsumers_.clear();
    for (const Tensor* n : g.nodes) {
        for (int s = 0; s < kMaxSrc; s++) {
            if (n->src[s]) consumers_[n->src[s]->storage()]++;
            if (n->src[s] && !is_view_op(n->op)) kconsumers_[n->src[s]->storage()]++;
        }
        if (n->view_src) consumers_[n->view_src]++;
    }
    // Non-view nodes in order; a node is fused with the next kernel node when that one is its
    // only reader (and it is no output), so its own result is never needed.
    std::vector<const Tensor*> kn;
    kn.reserve(g.nodes.size());
    for (const Tensor* n : g.nodes) {
        if (is_view_op(n->op)) continue;
        if (!device_ptr(n) || (n->view_src && !device_ptr(n->view_src))) {
            return Status::errorf("%s: node %s is not in this device's memory", name(),
                                  describe(n).c_str());
        }
        for (int s = 0; s < kMaxSrc; s++) {
            if (n->src[s] && !device_ptr(n->src[s])) {
                return Status::errorf("%s: source %d of %s is not in this device's memory", name(),
                                      s, describe(n).c_str());
            }
        }
        kn.push_back(n);
    }
    // A one-token decode step of the layers' pattern: one persistent launch for its nodes
    // kn[p_lo .. p_hi].
    size_t p_lo = kn.size(), p_hi = 0;
    out_step_ = -1;
    direct_out_ = nullptr;
    direct_out_bytes_ = 0;
    int p_id = -1;
    double p_bytes = 0.0;
    if (use_persist_ && use_fusion_) {
        PersistModel pm;
        std::string why;
        bool lowered = false;
        if (match_persist(g, kn, &p_lo, &p_hi, &pm, &why) &&
            persist_shapes_ok(pm, ctx_.n_sm, &why)) {
            if (!persist_) persist_ = std::make_unique<Persist>();
            // (A device that cannot take it, e.g. a block a SM not fitting, keeps the plan.)
            pm.splits = persist_splits_;
            pm.inflight = persist_inflight_[0];
            pm.stamps = persist_stamps_;
            std::copy(persist_inflight_ + 1, persist_inflight_ + 5, pm.chain);
            pm.out_inflight = persist_inflight_[5];
            const Status ps = persist_->prepare(pm, ctx_.device, ctx_.n_sm, &p_id);
            lowered = ps.is_ok();
            if (!lowered) why = ps.message();
        }
        if (lowered) {
            g_persist_plans.fetch_add(1, std::memory_order_relaxed);
            direct_out_ = reinterpret_cast<const char*>(pm.logits);
            direct_out_bytes_ = static_cast<size_t>(pm.n_vocab) * sizeof(float);
            for (size_t i = p_lo; i <= p_hi; i++) {
                if (kn[i]->op == Op::MUL_MAT) {
                    p_bytes += static_cast<double>(kn[i]->src[0]->nbytes());
                }
            }
        } else {
            p_lo = kn.size();
            if (persist_why_) {
                std::fprintf(stderr, "%s: not one persistent launch: %s\n", name(), why.c_str());
            }
        }
    }
    size_t scratch = 0;
    bool cublas = false;
    for (size_t i = 0; i < kn.size(); i++) {
        const Tensor* n = kn[i];
        if (i == p_lo) {
            Step st{n, nullptr, 6, nullptr};
            st.persist = p_id;
            st.persist_bytes = p_bytes;
            out_step_ = static_cast<int>(steps_.size());  // its logits are the graph's output
            steps_.push_back(st);
            i = p_hi;
            continue;
        }
        const Tensor* next = i + 1 < kn.size() ? kn[i + 1] : nullptr;
        const bool single = (n->flags & kTensorOutput) == 0 && consumers_[n] == 1;
        const Tensor* next2 = i + 2 < kn.size() ? kn[i + 2] : nullptr;
        if (use_fusion_ && use_epilogue_ && n->op == Op::MUL_MAT) {
            // MUL_MAT -> ROPE [-> SET_ROWS] or MUL_MAT -> SET_ROWS, each the only reader of the
            // one before (views aside); up to three such products of one b in a row (q, k, v)
            // run as one launch.
            Step st{n, nullptr, 5, nullptr};
            size_t j = i;
            while (st.n_units < static_cast<int>(st.units.size()) && j < kn.size()) {
                EpilogueUnit u;
                size_t len = 0;
                if (!match_epilogue(kn, j, &u, &len)) break;
                if (st.n_units > 0 && (!use_qkv_ || !can_join_mul_mat_epilogues(st.units[0], u))) {
                    break;
                }
                st.units[static_cast<size_t>(st.n_units++)] = u;
                j += len;
            }
            if (st.n_units > 0) {
                steps_.push_back(st);
                i = j - 1;
                continue;
            }
        }
        if (use_fusion_ && use_add_norm_ && next2 && (next->flags & kTensorOutput) == 0 &&
            consumers_[next] == 1 && can_fuse_add_rms_norm_mul(n, next, next2) &&
            fusion_is_safe(4, n, next, next2)) {
            steps_.push_back({n, next, 4, next2});
            i += 2;
            continue;
        }
        if (use_fusion_ && next2 && single && (next->flags & kTensorOutput) == 0 &&
            consumers_[next] == 1 && can_fuse_swiglu(n, next, next2) &&
            fusion_is_safe(3, n, next, next2)) {
            steps_.push_back({n, next, 3, next2});
            i += 2;
            continue;
        }
        if (use_fusion_ && next && single && can_fuse_rms_norm_mul(n, next) &&
            fusion_is_safe(1, n, next, nullptr)) {
            steps_.push_back({n, next, 1, nullptr});
            i++;
            continue;
        }
        if (use_fusion_ && next && single && can_fuse_mul_mat_add(n, next) &&
            fusion_is_safe(2, n, next, nullptr)) {
            steps_.push_back({n, next, 2, nullptr});
            i++;
            continue;
        }
        steps_.push_back({n, nullptr, 0, nullptr});
        scratch = std::max(scratch, n->op == Op::MUL_MAT          ? mul_mat_scratch_size(n)
                                    : n->op == Op::FLASH_ATTN_EXT ? attn_scratch_size(ctx_, n)
                                    : n->op == Op::TOP_K          ? top_k_scratch_size(n)
                                                                  : size_t{0});
        cublas |= needs_cublas(n);
    }
    if (use_fusion_ && use_norm_mv_) {
        std::vector<Step> kept;
        kept.reserve(steps_.size());
        for (size_t i = 0; i < steps_.size(); i++) {
            if (i + 1 < steps_.size() && fold_norm(steps_[i], &steps_[i + 1])) continue;
            kept.push_back(steps_[i]);
        }
        steps_ = std::move(kept);
    }
    if (use_attn_early_) {
        size_t a = 0;
        for (Step& st : steps_) {
            if (st.kind != 0 || st.node->op != Op::FLASH_ATTN_EXT) continue;
            while (a < kn.size() && kn[a] != st.node) a++;
            st.has_early = a < kn.size() && early_rows(kn, a, &st.early);
        }
        if (l2_next_kib_ != 0) plan_l2_next();
    }
    FERRY_TRY(ensure_scratch(scratch));
    if (cublas) FERRY_TRY(ensure_cublas());
    piece_step_ = -1;
    if (pieces_ > 0) FERRY_TRY(plan_pieces());
    // The step whose output a session reads: the persistent step (set where it was pushed), or
    // the graph's last product of one F32 column (not a progressive one: its pieces go their
    // own way).
    if (out_step_ < 0 && !steps_.empty() && piece_step_ != static_cast<int>(steps_.size()) - 1) {
        const Tensor* mm = steps_.back().node;
        if (steps_.back().kind == 0 && mm->op == Op::MUL_MAT && mm->type == Type::F32 &&
            mm->is_contiguous() && mm->ne[1] == 1 && mm->ne[2] == 1 && mm->ne[3] == 1) {
            out_step_ = static_cast<int>(steps_.size()) - 1;
        }
    }
    return Status::ok();
}

// Each early decode attention asks at its start for the first part of the product after the
// one that follows it: gate and up after wo, an eighth of their bytes by default where the DRAM
// peaks below kL2NextMaxBandwidth (FERRY_CUDA_L2_NEXT=KiB: that much), the same first fraction
// of each matrix, since a product's warps take their rows in order. The attention starts during
// q/k/v, and from then until gate/up's copies go out DRAM idles for much of the attention (wo's 8
// MiB are all in flight at its wait); gate/up's first copies then come from L2. Measured on an H100
// (bench/results/cuda.md, stop 43): 1B F16 tg128 +1.0-1.5% at 8 MiB (an H200: nothing, the eighth
// -0.3 to -0.5%); asked for after the attention's wait (its SMs' own loads then came back behind
// the prefetch: the attention 1.7 -> 4.6 us) or by wo's blocks once their copies were out, it lost
// or gained less; 16 MiB gained less, and Q4_0 lost 2.5% at 8 MiB of its 19 MB. Stop 35 measured
// every such prefetch slower on the H200, when the latency-bound loads beside it missed L2; with
// the weights evict-first (stop 42) they hit it, and this one pays on the H100 only.
void CudaBackend::plan_l2_next() {
    // A decode product's weight matrices (q, k, v; gate and up), 16-byte aligned: how many.
    auto weights = [](const Step& s, const Tensor* m[3]) {
        int n = 0;
        if (s.kind == 5) {
            for (int u = 0; u < s.n_units; u++) m[n++] = s.units[static_cast<size_t>(u)].mm;
        } else if ((s.kind == 0 || s.kind == 2 || s.kind == 3) && s.node->op == Op::MUL_MAT) {
            m[n++] = s.node;
            if (s.kind == 3) m[n++] = s.second;
        }
        for (int j = 0; j < n; j++) {
            const char* p = m[j] ? device_ptr(m[j]->src[0]) : nullptr;
            if (!p || reinterpret_cast<uintptr_t>(p) % 16 != 0 || m[j]->src[1]->ne[1] != 1) {
                return 0;
            }
        }
        return n;
    };
    for (size_t i = 0; i < steps_.size(); i++) {
        if (!steps_[i].has_early) continue;
        const Tensor* m[3] = {};
        int n = 0, seen = 0;
        for (size_t k = i + 1; k < steps_.size() && seen < 2; k++) {
            n = weights(steps_[k], m);
            seen += n > 0;
        }
        if (seen < 2) continue;
        int64_t total = 0;
        for (int j = 0; j < n; j++) total += static_cast<int64_t>(m[j]->src[0]->nbytes());
        const int64_t ask = l2_next_kib_ < 0 ? total / kL2NextPart : l2_next_kib_ << 10;
        const double f = std::min(
            1.0, static_cast<double>(ask) / static_cast<double>(std::max<int64_t>(total, 1)));
        L2Ask w;
        for (int j = 0; j < n; j++) {
            const int64_t b = static_cast<int64_t>(f * static_cast<double>(m[j]->src[0]->nbytes()));
            w.p[j] = device_ptr(m[j]->src[0]);
            w.bytes[j] = static_cast<uint32_t>(std::min<int64_t>(b / 256 * 256, int64_t{1} << 30));
        }
        w.n = n;
        steps_[i].early.next = w;
    }
}

Status CudaBackend::plan_pieces() {
    const Step& s = steps_.back();
    if (s.kind != 0 || s.node->op != Op::MUL_MAT) return Status::ok();
    const Tensor* mm = s.node;
    const Tensor* w = mm->src[0];
    CudaBuffer* ob = cuda_buffer(mm);
    if (!ob || ob->cuda_device() != dev_ || mm->type != Type::F32 || mm->nb[0] != sizeof(float) ||
        mm->ne[1] != 1 || mm->ne[2] != 1 || mm->ne[3] != 1 || w->ne[2] != 1 || w->ne[3] != 1 ||
        mm->ne[0] < kPieceMinRows || mm->ne[0] > kPieceMaxRows) {
        return Status::ok();
    }
    const size_t bytes = static_cast<size_t>(mm->ne[0]) * sizeof(float);
    piece_mirror_ = !piece_cut_ && mirror_product_ok(ctx_, mm, s.pro.norm != nullptr);
    if (piece_mirror_) {
        FERRY_TRY(ensure_mirror(mm->ne[0]));
        piece_step_ = static_cast<int>(steps_.size()) - 1;
        return Status::ok();
    }
    if (!side_) {
        CUDA_TRY(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "%s: piece stream",
                 name());
        CUDA_TRY(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming), "%s: piece events",
                 name());
        CUDA_TRY(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming), "%s: piece events",
                 name());
        void* p = nullptr;
        CUDA_TRY(cudaHostAlloc(&p, kMaxPieces * sizeof(uint64_t), cudaHostAllocDefault),
                 "%s: piece flags", name());
        piece_flags_ = static_cast<uint64_t*>(p);
        std::memset(piece_flags_, 0, kMaxPieces * sizeof(uint64_t));
        uint64_t ids[kMaxPieces];
        for (int c = 0; c < kMaxPieces; c++) ids[c] = static_cast<uint64_t>(c) + 1;
        CUDA_TRY(cudaMalloc(&p, sizeof(ids)), "%s: piece ids", name());
        piece_ids_ = static_cast<uint64_t*>(p);
        CUDA_TRY(cudaMemcpy(piece_ids_, ids, sizeof(ids), cudaMemcpyHostToDevice), "%s: piece ids",
                 name());
    }
    if (mirror_size_ < bytes) {
        // A captured graph may copy into the old one (Seen::mirror keeps it from replaying).
        CUDA_TRY(cudaStreamSynchronize(stream_), "%s: piece memory", name());
        if (mirror_) cudaFreeHost(mirror_);
        mirror_ = nullptr;
        mirror_size_ = 0;
        CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&mirror_), bytes, cudaHostAllocDefault),
                 "%s: piece memory of %zu bytes", name(), bytes);
        mirror_size_ = bytes;
    }
    piece_step_ = static_cast<int>(steps_.size()) - 1;
    return Status::ok();
}

// Before a run: no progressive product's pieces are handed out. An earlier one may still be
// running when it was not waited for (a prompt chunk whose logits nobody read, or a mirrored
// read, which does not wait): then wait, so that its copies are done and no late flag or row
// of it lands after the clear. Then the flags are cleared (and the mirror's step counters
// zeroed, on the stream, when a run may have stopped short).
Status CudaBackend::clear_pieces() {
    live_.on = false;
    if (pieces_pending_) {
        CUDA_TRY(cudaStreamSynchronize(stream_), "%s: pieces", name());
        pieces_pending_ = false;
    }
    if (piece_flags_) std::memset(piece_flags_, 0, kMaxPieces * sizeof(uint64_t));
    if (hm_flags_) std::memset(hm_flags_, 0, kMirrorSteps * sizeof(uint32_t));
    if (hm_reset_) {
        CUDA_TRY(cudaMemsetAsync(hm_count_, 0, kMirrorSteps * sizeof(uint32_t), stream_),
                 "%s: mirror counters", name());
        hm_reset_ = false;
    }
    return Status::ok();
}

// Launches the captured graph (a failed launch may have run in part).
Status CudaBackend::launch_exec() {
    const cudaError_t e = cudaGraphLaunch(exec_, stream_);
    if (e == cudaSuccess) return Status::ok();
    cudaGetLastError();
    pieces_failed();
    return Status::errorf("%s: graph launch: %s", name(), cudaGetErrorString(e));
}

// A compute failed after it may have started a progressive product: the next compute waits,
// and zeroes the mirror's step counters before it runs.
void CudaBackend::pieces_failed() {
    if (piece_step_ < 0) return;
    pieces_pending_ = true;
    if (hm_count_) hm_reset_ = true;
}

// The host mirror for a product of `rows` rows.
Status CudaBackend::ensure_mirror(int64_t rows) {
    const int64_t stride = (rows + kMirrorGroup - 1) / kMirrorGroup * kMirrorGroup;
    if (hm_stride_ >= stride) return Status::ok();
    // A captured graph may store into the old one (Seen::mirror keeps it from replaying).
    CUDA_TRY(cudaStreamSynchronize(stream_), "%s: mirror memory", name());
    if (hm_flags_) cudaFreeHost(hm_flags_);
    hm_flags_ = hm_dev_ = nullptr;
    hm_stride_ = 0;
    if (!hm_count_) {
        void* p = nullptr;
        CUDA_TRY(cudaMalloc(&p, kMirrorSteps * sizeof(uint32_t)), "%s: mirror counters", name());
        hm_count_ = static_cast<uint32_t*>(p);
        CUDA_TRY(cudaMemset(hm_count_, 0, kMirrorSteps * sizeof(uint32_t)), "%s: mirror counters",
                 name());
    }
    const size_t bytes = mirror_bytes(stride);
    void* p = nullptr;
    CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocMapped), "%s: mirror memory of %zu bytes",
             name(), bytes);
    hm_flags_ = static_cast<uint32_t*>(p);
    std::memset(hm_flags_, 0, bytes);
    CUDA_TRY(cudaHostGetDevicePointer(&p, hm_flags_, 0), "%s: mirror memory", name());
    hm_dev_ = static_cast<uint32_t*>(p);
    hm_stride_ = stride;
    return Status::ok();
}

// The product as one launch per piece (views of the weight's and the result's rows), each
// followed on side_ by the piece's copy and flag; the stream waits for side_ at the end (a
// fork per piece and a join, so a captured graph holds the copies as branches beside the
// launches that follow).
Status CudaBackend::run_pieces(const Step& s) {
    const Tensor* mm = s.node;
    const Tensor* w = mm->src[0];
    char* out = device_ptr(mm);
    const int64_t M = mm->ne[0];
    PieceLayout lay;
    if (piece_mirror_) {
        // One launch that also stores its rows into the host mirror (when its kernel does).
        ctx_.mirror = HostMirror{hm_dev_ + kMirrorSteps, hm_stride_, hm_dev_, hm_count_};
        ctx_.mirror_taken = false;
        const Status st = s.pro.norm ? op_mul_mat_norm(ctx_, mm, s.pro) : run_node(ctx_, mm);
        lay.on = lay.mirror = ctx_.mirror_taken;
        lay.rows = ctx_.mirror_step_rows;
        lay.n = lay.mirror ? static_cast<int>((M + lay.rows - 1) / lay.rows) : 0;
        ctx_.mirror = HostMirror{};
        ctx_.mirror_taken = false;
        FERRY_TRY(st);
        run_layout_ = lay;
        return Status::ok();
    }
    lay.rows = ((M + pieces_ - 1) / pieces_ + 255) / 256 * 256;
    lay.n = static_cast<int>((M + lay.rows - 1) / lay.rows);
    for (int c = 0; c < lay.n; c++) {
        const int64_t r0 = c * lay.rows, rows = std::min(lay.rows, M - r0);
        Tensor wc = *w;
        wc.ne[1] = rows;
        wc.offs += static_cast<size_t>(r0) * w->nb[1];
        Tensor mc = *mm;
        mc.ne[0] = rows;
        mc.nb[1] = static_cast<size_t>(rows) * sizeof(float);
        mc.nb[2] = mc.nb[1];
        mc.nb[3] = mc.nb[1];
        mc.offs += static_cast<size_t>(r0) * sizeof(float);
        mc.src[0] = &wc;
        FERRY_TRY(s.pro.norm ? op_mul_mat_norm(ctx_, &mc, s.pro) : run_node(ctx_, &mc));
        if (!piece_copies_) continue;
        CUDA_TRY(cudaEventRecord(fork_ev_, stream_), "%s: piece %d", name(), c);
        CUDA_TRY(cudaStreamWaitEvent(side_, fork_ev_, 0), "%s: piece %d", name(), c);
        const size_t off = static_cast<size_t>(r0) * sizeof(float);
        CUDA_TRY(
            cudaMemcpyAsync(mirror_ + off, out + off, static_cast<size_t>(rows) * sizeof(float),
                            cudaMemcpyDeviceToHost, side_),
            "%s: piece %d", name(), c);
        CUDA_TRY(cudaMemcpyAsync(piece_flags_ + c, piece_ids_ + c, sizeof(uint64_t),
                                 cudaMemcpyDeviceToHost, side_),
                 "%s: piece %d", name(), c);
    }
    if (!piece_copies_) return Status::ok();
    CUDA_TRY(cudaEventRecord(join_ev_, side_), "%s: pieces", name());
    CUDA_TRY(cudaStreamWaitEvent(stream_, join_ev_, 0), "%s: pieces", name());
    lay.on = true;
    run_layout_ = lay;
    return Status::ok();
}

// The compute just issued runs the progressive product in `layout`'s pieces (or mirrored):
// read_in_pieces may hand it out.
void CudaBackend::pieces_issued(const PieceLayout& layout) {
    if (piece_step_ < 0 || !layout.on) return;
    const Tensor* mm = steps_[static_cast<size_t>(piece_step_)].node;
    pieces_pending_ = true;
    live_.dev = device_ptr(mm);
    live_.bytes = static_cast<size_t>(mm->ne[0]) * sizeof(float);
    live_.mirror = layout.mirror;
    live_.on = true;
    live_.n = layout.n;
    for (int c = 0; c < layout.n; c++) {
        live_.ends[c] =
            std::min(static_cast<size_t>((c + 1) * layout.rows) * sizeof(float), live_.bytes);
    }
}

PieceRead CudaBackend::read_in_pieces(const Tensor* t, size_t offset, size_t size) {
    CudaBuffer* b = cuda_buffer(t);
    if (!live_.on || size == 0 || !b || b->cuda_device() != dev_ ||
        !b->check_range(t, offset, size))
        return {};
    const char* p = b->dev_ptr() + t->offs + offset;
    if (p < live_.dev || p + size > live_.dev + live_.bytes) return {};
    const size_t lo = static_cast<size_t>(p - live_.dev);
    PieceRead r;
    r.size = size;
    if (live_.mirror) {
        r.data = reinterpret_cast<const uint8_t*>(hm_flags_ + kMirrorSteps) + lo;
        r.wait = [this, lo, size](size_t have) { return wait_mirror(lo, size, have); };
        return r;
    }
    r.data = reinterpret_cast<const uint8_t*>(mirror_) + lo;
    r.wait = [this, lo, size](size_t have) { return wait_piece(lo, size, have); };
    return r;
}

// Spins until set() (pausing between polls); every few thousand turns asks `stream` whether
// it failed, or ended with set() still false (the flag of `what` c was never set).
template <class Set>
static Status spin_for_flag(Set set, cudaStream_t stream, const char* dev, const char* what,
                            int c) {
    for (uint32_t spins = 1; !set(); spins++) {
        cpu_pause();
        if (spins % 4096 != 0) continue;
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaErrorNotReady) continue;
        if (q != cudaSuccess) {
            cudaGetLastError();
            return Status::errorf("%s: progressive read: %s", dev, cudaGetErrorString(q));
        }
        if (!set()) {
            return Status::errorf("%s: progressive read: %s %d's flag was never set", dev, what, c);
        }
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    return Status::ok();
}

// Once the first piece is in: every kernel before the product has finished, so any data error
// is known now (and ends the read).
Status CudaBackend::first_piece_error() {
    Status st = dev_->take_error();
    if (!st) {
        live_.on = false;
        (void)synchronize();
    }
    return st;
}

// Spins on the flag of the step after `have` bytes (from lo) until its rows are in host
// memory, then hands out every step in order whose flag is set. The compute is not waited for
// at the end (its kernel has stored every row): the next compute waits (pieces_pending_).
Expected<size_t> CudaBackend::wait_mirror(size_t lo, size_t size, size_t have) {
    if (!live_.on || !live_.mirror) {
        return Status::errorf("%s: progressive read after another call", name());
    }
    FERRY_TRY(dev_->activate());
    int c = 0;
    while (c < live_.n && live_.ends[c] <= lo + have) c++;
    if (c == live_.n) return Status::errorf("%s: progressive read past the product", name());
    const volatile uint32_t* flags = hm_flags_;
    if (Status st = spin_for_flag([&] { return flags[c] != 0; }, stream_, name(), "step", c); !st) {
        live_.on = false;
        return st;
    }
    if (have == 0) FERRY_TRY(first_piece_error());
    while (c + 1 < live_.n && live_.ends[c] < lo + size && flags[c + 1] != 0) c++;
    std::atomic_thread_fence(std::memory_order_acquire);
    const size_t ready = std::min(live_.ends[c], lo + size) - lo;
    if (ready == size) live_.on = false;
    return ready;
}

// Spins on the flag of the piece after `have` bytes (from lo) until it is in host memory.
Expected<size_t> CudaBackend::wait_piece(size_t lo, size_t size, size_t have) {
    if (!live_.on) return Status::errorf("%s: progressive read after another call", name());
    FERRY_TRY(dev_->activate());
    for (int c = 0; c < live_.n; c++) {
        if (live_.ends[c] <= lo + have) continue;
        const uint64_t id = static_cast<uint64_t>(c) + 1;
        const volatile uint64_t* word = piece_flags_ + c;
        if (Status st = spin_for_flag([&] { return *word == id; }, stream_, name(), "piece", c);
            !st) {
            live_.on = false;
            return st;
        }
        FERRY_TRY(first_piece_error());
        const size_t ready = std::min(live_.ends[c], lo + size) - lo;
        if (ready < size) return ready;
        break;
    }
    live_.on = false;
    FERRY_TRY(synchronize());  // the join: the compute is over
    return size;
}

// Whether every write this graph makes into the K and V views of the attention kn[a] before
// it is one SET_ROWS per view, of at most kAttnEarlyMaxRows I32 indices into rows that hold the
// view's keys whole (so the attention may load the other rows before griddepcontrol.wait);
// if so, their indices and offsets. Any other overlapping writer (or a layout that does not
// map a cache row to one key) says no.
bool CudaBackend::early_rows(const std::vector<const Tensor*>& kn, size_t a, AttnEarly* e) {
    const Tensor* att = kn[a];
    // No node before the attention writes t: t is the graph's input. (Written by a node, it
    // could still be in the making when the attention starts: a launch may start before the
    // one two places before it has ended.)
    auto unwritten = [&](const Tensor* t) {
        for (size_t i = 0; i < a; i++) {
            if (overlaps(kn[i], t)) return false;
        }
        return true;
    };
    bool ready = true;
    for (int which = 0; which < 2; which++) {
        const Tensor* view = att->src[1 + which];
        if (!view || view->ne[3] != 1) return false;
        const Tensor* writer = nullptr;
        for (size_t i = 0; i < a; i++) {
            if (!overlaps(kn[i], view)) continue;
            if (writer || kn[i]->op != Op::SET_ROWS) return false;
            writer = kn[i];
        }
        AttnRowsWritten& w = which == 0 ? e->k : e->v;
        w = AttnRowsWritten{};
        if (!writer) continue;
        const Tensor* dst = writer->src[0];
        const Tensor* src = writer->src[1];
        const Tensor* idx = writer->src[2];
        const int64_t nb1 = static_cast<int64_t>(dst->nb[1]);
        const int64_t delta = device_ptr(view) - device_ptr(dst);
        if (idx->type != Type::I32 || !idx->is_contiguous() || idx->ne[0] != src->ne[1] ||
            src->ne[2] != 1 || src->ne[3] != 1 || src->ne[1] > kAttnEarlyMaxRows ||
            static_cast<int64_t>(view->nb[1]) != nb1 || nb1 <= 0 || delta < 0) {
            return false;
        }
        // A key's bytes (all heads) inside one cache row.
        const int64_t in_row = delta % nb1;
        const int64_t key_bytes = static_cast<int64_t>(row_size(view->type, view->ne[0])) +
                                  (view->ne[2] - 1) * static_cast<int64_t>(view->nb[2]);
        if (in_row + key_bytes > nb1) return false;
        w.idx = reinterpret_cast<const int32_t*>(device_ptr(idx));
        w.n = static_cast<int>(src->ne[1]);
        w.j0 = delta / nb1;
        ready = ready && unwritten(idx);
    }
    e->idx_ready = ready;
    e->mask_ready = att->src[3] && unwritten(att->src[3]);
    return true;
}

Status CudaBackend::run_step(const Step& s) {
    switch (s.kind) {
        case 1:
            return op_rms_norm_mul(ctx_, s.node, s.second);
        case 2:
            return op_mul_mat_add(ctx_, s.node, s.second);
        case 3:
            return op_mul_mat_swiglu(ctx_, s.node, s.second, s.third, &s.pro);
        case 4:
            return op_add_rms_norm_mul(ctx_, s.node, s.second, s.third);
        case 5:
            return op_mul_mat_epilogue(ctx_, s.units.data(), s.n_units, &s.pro);
        case 6:
            return persist_->launch(ctx_, s.persist);
        default: {
            if (s.pro.norm) return op_mul_mat_norm(ctx_, s.node, s.pro);
            // Rows loaded before the wait only inside a captured graph, which starts after
            // all earlier work: a direct launch may overlap an earlier compute's kernels.
            ctx_.attn_early = s.has_early && capturing_ ? &s.early : nullptr;
            const Status st = run_node(ctx_, s.node);
            ctx_.attn_early = nullptr;
            return st;
        }
    }
}

Status CudaBackend::run_steps() {
    run_layout_ = PieceLayout{};
    for (size_t i = 0; i < steps_.size(); i++) {
        const Step& s = steps_[i];
        const bool out = static_cast<int>(i) == out_step_;
        if (out) {
            ctx_.host_out = host_out_slot_;
            ctx_.host_out_taken = false;
        }
        Status st = static_cast<int>(i) == piece_step_ ? run_pieces(s) : run_step(s);
        if (out) {
            // (The persistent step's logits were known when it was planned.)
            if (s.kind != 6) {
                direct_out_ = ctx_.host_out_taken ? device_ptr(s.node) : nullptr;
                direct_out_bytes_ = ctx_.host_out_taken ? s.node->nbytes() : 0;
            }
            ctx_.host_out = nullptr;
            ctx_.host_out_taken = false;
        }
        if (!st) return st.context(strfmt("%s: %s", name(), describe(s.node).c_str()));
    }
    return Status::ok();
}

Status CudaBackend::set_host_out(float* p) {
    if (!host_out_slot_) {
        void* q = nullptr;
        CUDA_TRY(cudaMalloc(&q, sizeof(float*)), "%s: the host output's word", name());
        CUDA_TRY(cudaMemset(q, 0, sizeof(float*)), "%s: the host output's word", name());
        host_out_slot_ = static_cast<float**>(q);
    }
    if (p == host_out_set_) return Status::ok();
    FERRY_TRY(cuda::set_host_out(stream_, host_out_slot_, p));
    host_out_set_ = p;
    return Status::ok();
}

// The structure of a graph: for every kernel node and its sources, the tensor, op, type,
// shape, strides, op parameters and storage (buffer, offset). Equal keys mean the same kernels
// with the same arguments, so the last plan (and a captured CUDA graph) can be reused. Buffers
// are compared by object; g_buffer_epoch tells when one went away.
// Compact form (when every source of every node is itself a node or a leaf of the graph,
// sources_listed: graphs built by build_forward and the scheduler's splits): each leaf and
// each node (views too) described once, and a node's sources by address only, so a weight
// or an activation read by several nodes is not described again at every read (a decode
// step's key about half the words). Otherwise every source is described at every read.
void CudaBackend::quick_key(const Graph& g, Key& k, bool compact) const {
    constexpr size_t kTensorWords = 5 + 2 * kMaxDims;
    constexpr size_t kNodeWords = kTensorWords + kMaxOpParams / 2 + kMaxSrc * kTensorWords;
    const size_t most = compact ? 3 + (g.leafs.size() + g.nodes.size()) *
                                          (kTensorWords + kMaxOpParams / 2 + kMaxSrc)
                                : 2 + g.nodes.size() * kNodeWords;
    uint64_t* w = k.begin(most);
    *w++ = g_buffer_epoch.load();
    *w++ = static_cast<uint64_t>(use_fusion_) | (static_cast<uint64_t>(compact) << 1);
    auto tensor = [&w](const Tensor* t) {
        w[0] = reinterpret_cast<uintptr_t>(t);
        w[1] = static_cast<uint64_t>(t->op) | (static_cast<uint64_t>(t->type) << 32);
        for (int d = 0; d < kMaxDims; d++) {
            w[2 + 2 * d] = static_cast<uint64_t>(t->ne[d]);
            w[3 + 2 * d] = t->nb[d];
        }
        w[2 + 2 * kMaxDims] = reinterpret_cast<uintptr_t>(t->buffer);
        w[3 + 2 * kMaxDims] = t->offs;
        w[4 + 2 * kMaxDims] = t->flags;
        w += kTensorWords;
    };
    auto params = [&w](const Tensor* n) {
        for (int p = 0; p < kMaxOpParams; p += 2) {
            *w++ = static_cast<uint32_t>(n->op_params[p]) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(n->op_params[p + 1])) << 32);
        }
    };
    if (compact) {
        *w++ = g.leafs.size();
        for (const Tensor* l : g.leafs) tensor(l);
        for (const Tensor* n : g.nodes) {
            tensor(n);
            params(n);
            for (int s = 0; s < kMaxSrc; s++) *w++ = reinterpret_cast<uintptr_t>(n->src[s]);
        }
        k.end(w);
        return;
    }
    for (const Tensor* n : g.nodes) {
        if (is_view_op(n->op)) continue;
        tensor(n);
        params(n);
        for (int s = 0; s < kMaxSrc; s++) {
            if (n->src[s]) {
                tensor(n->src[s]);
            } else {
                *w++ = 0;
            }
        }
    }
    k.end(w);
}

// Whether every source of every node is a node or a leaf of g (quick_key's compact form).
// The key holds the node and leaf lists and every source's address, so while a graph's key
// is unchanged this stays true.
bool CudaBackend::sources_listed(const Graph& g) {
    std::unordered_set<const Tensor*> listed(g.nodes.begin(), g.nodes.end());
    listed.insert(g.leafs.begin(), g.leafs.end());
    for (const Tensor* n : g.nodes) {
        for (const Tensor* src : n->src) {
            if (src && !listed.count(src)) return false;
        }
    }
    return true;
}

Status CudaBackend::compute(Graph& g) {
    FERRY_TRY(dev_->activate());
    release_ahead();  // runs before this one, with the inputs it last had
    done_read_ = {};
    FERRY_TRY(set_host_out(nullptr));
    if (!ctx_.counters) {
        // The attention splits' counters.
        constexpr size_t kCounterBytes = sizeof(int32_t) << 16;
        void* p = nullptr;
        CUDA_TRY(cudaMalloc(&p, kCounterBytes), "%s: counters", name());
        CUDA_TRY(cudaMemset(p, 0, kCounterBytes), "%s: counters", name());
        ctx_.counters = static_cast<int32_t*>(p);
    }
    Expected<DeviceError*> err = dev_->error_word();
    if (!err) return err.status();
    ctx_.err = *err;
    FERRY_TRY(clear_pieces());
    using clock = std::chrono::steady_clock;
    auto since = [](clock::time_point a) {
        return std::chrono::duration<double, std::micro>(clock::now() - a).count();
    };
    const bool stats = gstats_.on;
    clock::time_point t0 = stats ? clock::now() : clock::time_point{};
    quick_key(g, key_, planned_compact_);
    if (stats) gstats_.key_us += since(t0);
    if (!(key_ == planned_key_)) {
        planned_key_.clear();
        plan_gen_++;
        const clock::time_point tp = stats ? clock::now() : clock::time_point{};
        FERRY_TRY(plan(g));
        // The key in the form this graph allows, compared against from now on.
        const bool compact = use_compact_key_ && sources_listed(g);
        if (compact != planned_compact_) {
            planned_compact_ = compact;
            quick_key(g, key_, compact);
        }
        if (stats) {
            gstats_.plan_us += since(tp);
            gstats_.plans++;
        }
        planned_key_.swap(key_);
    }
    // The way this compute ran, and the host time it took from here (stats only).
    auto count = [&](int way) {
        if (!stats) return;
        gstats_.n[way]++;
        gstats_.us[way] += since(t0);
    };
    if (stats) t0 = clock::now();
    if (steps_.empty()) return Status::ok();
    // This graph: its structure's generation, and what a captured graph also bakes in, the
    // scratch and cuBLAS workspace addresses and the size of the staged inputs it copies first.
    const Seen now = seen(in_bytes_);
    if (profile_) {
        FERRY_TRY(issue_inputs());
        return run_profiled();
    }
    if (use_graphs_ && exec_ && exec_seen_.gen != now.gen && exec_seen_.scratch == now.scratch &&
        exec_seen_.ws == now.ws && exec_seen_.mirror == now.mirror && exec_key_ == planned_key_) {
        exec_seen_.gen = now.gen;  // the captured structure is back
    }
    if (use_graphs_ && exec_ && exec_seen_ == now) {
        FERRY_TRY(launch_exec());
        in_bytes_ = 0;  // copied by the graph's first node
        pieces_issued(exec_layout_);
        last_ = now;
        count(kReplay);
        return Status::ok();
    }
    // A structure seen twice in a row is captured and replayed from then on (decode steps);
    // one-off graphs (prefill chunks) run directly.
    if (!use_graphs_ || !(last_ == now)) {
        last_ = now;
        FERRY_TRY(issue_inputs());
        Status rs = run_steps();
        if (rs) {
            pieces_issued(run_layout_);
        } else if (piece_step_ >= 0) {
            pieces_failed();  // some copies (or mirrored rows) may have been queued
        }
        count(kDirect);
        return rs;
    }
    CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "%s: capture",
             name());
    const uint32_t staged = in_bytes_;
    Status st = issue_inputs();  // the graph's first node
    capturing_ = true;
    if (st) st = run_steps();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t ce = cudaStreamEndCapture(stream_, &graph);
    if (!st || ce != cudaSuccess) {
        in_bytes_ = staged;  // still to be issued
        if (graph) cudaGraphDestroy(graph);
        if (!st) return st;
        return Status::errorf("%s: graph capture: %s", name(), cudaGetErrorString(ce));
    }
    bool updated = false;
    if (exec_) {
        cudaGraphExecUpdateResultInfo info;
        updated = cudaGraphExecUpdate(exec_, graph, &info) == cudaSuccess;
        if (!updated) {
            cudaGetLastError();
            cudaGraphExecDestroy(exec_);
            exec_ = nullptr;
        }
    }
    if (!updated) {
        const cudaError_t ie = cudaGraphInstantiate(&exec_, graph, 0);
        if (ie != cudaSuccess) {
            cudaGraphDestroy(graph);
            exec_ = nullptr;
            in_bytes_ = staged;
            return Status::errorf("%s: graph instantiate: %s", name(), cudaGetErrorString(ie));
        }
    }
    cudaGraphDestroy(graph);
    exec_key_.assign(planned_key_);
    exec_seen_ = now;
    FERRY_TRY(launch_exec());
    in_bytes_ = 0;
    exec_layout_ = run_layout_;
    pieces_issued(exec_layout_);
    count(updated ? kUpdate : kInstantiate);
    return Status::ok();
}

// Queues a replay of the captured graph when g is the graph it was captured from and the last
// one computed (its structure key unchanged, every address it bakes in the same), its inputs
// staged: the replay's first node, the staged-input kernel, then waits for the next batch
// (k_stage_inputs), which run_ahead writes. A progressive product's flags are cleared and its
// pieces handed out for this run, as compute() does (read_in_pieces reads them once it runs).
// Not with a profile or graphs off.
Expected<bool> CudaBackend::compute_ahead(Graph& g) {
    if (ahead_ || !use_graphs_ || profile_ || !exec_ || in_bytes_ != 0 || !in_host_ ||
        exec_seen_.inputs == 0) {
        return false;
    }
    FERRY_TRY(dev_->activate());
    quick_key(g, key_, planned_compact_);
    if (!(key_ == planned_key_)) return false;
    const Seen now = seen(exec_seen_.inputs);
    if (!(exec_seen_ == now) || !(last_ == now)) return false;
    {
        std::lock_guard<std::mutex> lock(ahead_mu_);
        if (ahead_skip_ > 0) {
            ahead_skip_--;
            return false;
        }
    }
    FERRY_TRY(clear_pieces());
    if (!ahead_ev_) {
        CUDA_TRY(cudaEventCreateWithFlags(&ahead_ev_, cudaEventDisableTiming), "%s: ahead event",
                 name());
    }
    CUDA_TRY(cudaEventRecord(ahead_ev_, stream_), "%s: ahead event", name());
    {
        float* host = host_read_target();
        FERRY_TRY(set_host_out(host));
        ahead_read_ = host ? last_read_ : HostRead{};
    }
    FERRY_TRY(launch_exec());
    pieces_issued(exec_layout_);
    {
        std::lock_guard<std::mutex> lock(ahead_mu_);
        ahead_ = true;
        ahead_bytes_ = now.inputs;
        ahead_since_ = std::chrono::steady_clock::now();
        if (watch_parked_) {
            watch_parked_ = false;
            ahead_cv_.notify_all();
        }
    }
    if (!ahead_watch_.joinable()) ahead_watch_ = std::thread([this] { watch_ahead(); });
    if (gstats_.on) gstats_.n[kReplay]++;
    g_ahead_queued.fetch_add(1, std::memory_order_relaxed);
    return true;
}

float* CudaBackend::host_read_target() const {
    const HostRead& r = last_read_;
    if (!use_host_read_ || !direct_out_ || r.src != direct_out_ || r.size != direct_out_bytes_) {
        return nullptr;
    }
    // Host memory the device maps: page-locked and mapped (cudaHostAlloc, or registered with
    // cudaHostRegisterMapped). Memory registered without that flag is page-locked, but not
    // the kernels' to store into.
    cudaPointerAttributes pa{};
    void* mapped = nullptr;
    if (cudaPointerGetAttributes(&pa, r.dst) != cudaSuccess || pa.type != cudaMemoryTypeHost ||
        !pa.devicePointer || cudaHostGetDevicePointer(&mapped, r.dst, 0) != cudaSuccess ||
        mapped != pa.devicePointer) {
        cudaGetLastError();
        return nullptr;
    }
    return static_cast<float*>(mapped);
}

Expected<bool> CudaBackend::run_ahead(std::span<const TensorWrite> inputs) {
    Expected<uint32_t> bytes = stage_size(inputs);
    if (!bytes) return bytes.status();
    FERRY_TRY(dev_->activate());
    {
        std::lock_guard<std::mutex> lock(ahead_mu_);
        // The kernel of the step before has read the area (its results were waited for).
        if (ahead_ && *bytes == ahead_bytes_ && area_read()) {
            ahead_ = false;
            stage(inputs, true);
            in_bytes_ = 0;  // copied by the queued graph's first node
            done_read_ = ahead_read_;
            g_ahead_started.fetch_add(1, std::memory_order_relaxed);
            return true;
        }
    }
    // Nothing queued (or released while idle), or not the batch the queued graph copies: it
    // runs with its last inputs first, and these are set as usual.
    FERRY_TRY(set_tensors_async(inputs));
    return false;
}

Status CudaBackend::run_profiled() {
    while (prof_ev_.size() < steps_.size() + 1) {
        cudaEvent_t e;
        CUDA_TRY(cudaEventCreate(&e), "%s: profile event", name());
        prof_ev_.push_back(e);
    }
    CUDA_TRY(cudaEventRecord(prof_ev_[0], stream_), "%s: profile", name());
    for (size_t i = 0; i < steps_.size(); i++) {
        Status st = run_step(steps_[i]);
        if (!st) return st;
        CUDA_TRY(cudaEventRecord(prof_ev_[i + 1], stream_), "%s: profile", name());
    }
    CUDA_TRY(cudaStreamSynchronize(stream_), "%s: profile", name());
    prof_graphs_++;
    for (size_t i = 0; i < steps_.size(); i++) {
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, prof_ev_[i], prof_ev_[i + 1]);
        const Step& s = steps_[i];
        if (s.kind == 6) {
            ProfileRow& r = prof_["persistent decode step"];
            r.ms += ms;
            r.calls++;
            r.bytes += s.persist_bytes;
            prof_total_ms_ += ms;
            continue;
        }
        const Tensor* n = s.third ? s.third : (s.second ? s.second : s.node);
        std::string k = s.pro.norm ? (s.pro.add ? "ADD+RMS_NORM+MUL+" : "RMS_NORM+MUL+") : "";
        k += op_name(s.node->op);
        if (s.second) k += std::string("+") + op_name(s.second->op);
        if (s.third) k += std::string("+") + op_name(s.third->op);
        double bytes = static_cast<double>(n->nbytes());
        for (const Tensor* t : {s.node, s.second, s.third}) {
            if (!t) continue;
            for (int j = 0; j < kMaxSrc; j++) {
                if (t->src[j] && t->src[j] != s.node && t->src[j] != s.second)
                    bytes += static_cast<double>(t->src[j]->nbytes());
            }
        }
        if (s.node->op == Op::MUL_MAT || s.node->op == Op::GET_ROWS) {
            k += strfmt(" %s", type_name(s.node->src[0]->type));
        }
        k +=
            strfmt(" [%lld,%lld]x%lld", static_cast<long long>(s.node->src[0]->ne[0]),
                   static_cast<long long>(s.node->src[0]->ne[1]), static_cast<long long>(n->ne[1]));
        ProfileRow& r = prof_[k];
        r.ms += ms;
        r.calls++;
        r.bytes += bytes;
        prof_total_ms_ += ms;
    }
    return Status::ok();
}

void CudaBackend::print_profile() {
    std::vector<std::pair<std::string, ProfileRow>> rows(prof_.begin(), prof_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    std::fprintf(stderr, "%s profile: %lld graphs, %.3f ms of kernels (%.4f ms per graph)\n",
                 name(), static_cast<long long>(prof_graphs_), prof_total_ms_,
                 prof_graphs_ ? prof_total_ms_ / static_cast<double>(prof_graphs_) : 0.0);
    for (const auto& [k, r] : rows) {
        std::fprintf(stderr, "  %8.3f ms %5.1f%% %7lld calls %8.2f us/call %7.0f GB/s  %s\n", r.ms,
                     100.0 * r.ms / std::max(prof_total_ms_, 1e-9), static_cast<long long>(r.calls),
                     1000.0 * r.ms / static_cast<double>(r.calls), r.bytes / (r.ms * 1e-3) / 1e9,
                     k.c_str());
    }
}

Expected<std::unique_ptr<Backend>> CudaDevice::make_backend(const BackendOptions& opts) {
    FERRY_TRY(activate());
    Expected<DeviceError*> err = error_word();
    if (!err) return err.status();
    cudaStream_t s;
    // Always a blocking stream (whatever opts.blocking_stream says): Buffer::get_tensor's
    // synchronous copy on the legacy default stream relies on waiting for this stream's work.
    CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamDefault, opts.stream_priority),
             "%s: stream", name());
    auto* be = new CudaBackend(this, s, *err);
    if (!opts.graph_capture) be->disable_graphs();
    be->enable_pieces(opts.progressive_results);
    return std::unique_ptr<Backend>(be);
}

class CudaRegistry : public Registry {
  public:
    CudaRegistry() {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
            cudaGetLastError();
            n = 0;  // no driver or no GPU: no devices
        }
        for (int i = 0; i < n; i++) {
            cudaDeviceProp prop;
            if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
            devices_.push_back(std::make_unique<CudaDevice>(i, prop));
        }
    }
    const char* name() const override { return "CUDA"; }
    std::vector<Device*> devices() override {
        std::vector<Device*> out;
        for (auto& d : devices_) out.push_back(d.get());
        return out;
    }

  private:
    std::vector<std::unique_ptr<CudaDevice>> devices_;
};

}  // namespace

uint64_t persist_plans() {
    return g_persist_plans.load(std::memory_order_relaxed);
}

uint64_t host_reads() {
    return g_host_reads.load(std::memory_order_relaxed);
}

AheadCounts ahead_counts() {
    return {g_ahead_queued.load(std::memory_order_relaxed),
            g_ahead_started.load(std::memory_order_relaxed),
            g_ahead_idle.load(std::memory_order_relaxed)};
}

void set_declined_ops(const std::vector<Op>& ops) {
    std::lock_guard<std::mutex> lock(g_declined_mu);
    g_declined = ops;
}

char* device_ptr(const Tensor* t) {
    CudaBuffer* b = cuda_buffer(t);
    return b ? b->dev_ptr() + t->offs : nullptr;
}

// ---------------------------------------------------------------------------------------------
// What the kernels handle (see ops/ for each).

namespace {
bool plain(Type t) {
    return t == Type::F32 || t == Type::F16 || t == Type::BF16 || t == Type::I32;
}
bool quant_store(Type t) {
    return t == Type::Q4_0 || t == Type::Q4_1 || t == Type::Q8_0;
}

// Storage types the kernels decode (load_elem, the matrix-vector decoders): the block formats
// added since (Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4) are not among them yet and go to
// the CPU.
bool decodable(Type t) {
    return plain(t) || t == Type::Q4_0 || t == Type::Q4_1 || t == Type::Q8_0 || t == Type::Q4_K ||
           t == Type::Q5_K || t == Type::Q6_K;
}
}  // namespace

bool supports(const Tensor* n) {
    if (is_view_op(n->op)) return true;
    switch (n->op) {
        case Op::MUL_MAT:
        case Op::GET_ROWS:
            return decodable(n->src[0]->type) || elem_type(n->src[0]->type);
        case Op::ROPE:
            return !n->src[2] || n->src[2]->type == Type::F32;
        case Op::CPY:
        case Op::CONT: {
            const Tensor* s = n->src[0];
            const Tensor* d = n->op == Op::CPY ? n->src[1] : n;
            if (plain(s->type) && plain(d->type)) {
                return s->type == d->type || (s->type != Type::I32 && d->type != Type::I32);
            }
            if (d->type == Type::I32 || s->type == Type::I32) return false;
            if (!decodable(s->type)) return false;
            // Block formats: whole rows, stored into a format the kernels can quantize to.
            return s->ne[0] % 32 == 0 &&
                   (s->type == d->type || plain(d->type) || quant_store(d->type));
        }
        case Op::SET_ROWS: {
            const Type t = n->src[0]->type;
            return t == Type::F32 || t == Type::F16 || t == Type::BF16 ||
                   (quant_store(t) && n->src[0]->ne[0] % 32 == 0);
        }
        case Op::FLASH_ATTN_EXT:
            return std::max(n->src[0]->ne[0], n->src[2]->ne[0]) <= 256;
        case Op::TOP_K: {
            // FERRY_CUDA_TOPK=0: declined (sessions then read whole rows of logits).
            static const bool on = !env_off("FERRY_CUDA_TOPK");
            return on && n->op_params[0] <= kTopKMaxK && n->src[0]->nrows() <= kTopKMaxRows;
        }
        case Op::COUNT:
            return false;
        default:
            return true;
    }
}

}  // namespace ferry::cuda

namespace ferry {
std::unique_ptr<Registry> make_cuda_registry() {
    return std::make_unique<cuda::CudaRegistry>();
}
}  // namespace ferry
