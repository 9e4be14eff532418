// The backend interface: Registry, Device, BufferType, Buffer, Backend (a stream), Event.
//
// Rules that keep every backend remotable:
//  - Nothing here hands out a raw pointer into another address space. A tensor's storage is
//    (buffer, offset); Buffer::base() is nullptr unless the caller's process can address it.
//  - Calls that move data or run work have an async form; synchronize() is the only wait.
//  - supports_op() is honest and cheap; the scheduler relies on it to fall back to the CPU.
//  - Errors are values with messages that name the op and the offending value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/graph.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry {

class Backend;
class Buffer;
class BufferType;
class Device;
class Event;

enum class DeviceType { CPU, GPU, ACCEL, REMOTE };
const char* device_type_name(DeviceType t);

enum class BufferUsage : int { Any, Weights, Compute };

struct DeviceMemory {
    size_t free = 0;
    size_t total = 0;
};

// Options for a new backend (a stream on a device). Devices ignore what they have no use for.
struct BackendOptions {
    int n_threads = 0;             // threads for CPU-side work (0: the device's default)
    int stream_priority = 0;       // stream priority where the device has them (0: default)
    bool blocking_stream = false;  // the stream synchronizes with the device's default stream
    bool graph_capture = true;     // capture and replay repeated graphs (e.g. CUDA graphs)
    std::string cache_dir;         // folder for compiled graphs (graph compilers); empty: none
    // A compute's last product may be handed to the host in pieces while the device still
    // computes the rest (Backend::read_in_pieces): worth its cost where the reader sends the
    // result on (a server answering over tcp), not where it only waits for it.
    bool progressive_results = false;
};

struct DeviceCaps {
    bool async = false;        // set/get/compute may overlap the caller
    bool host_buffer = false;  // host_buffer_type() gives pinned/shared host memory
    bool buffer_from_host_ptr = false;
    bool events = false;
    // What a remote client must forward for this device (each is one more round trip or
    // request, so devices that need none, like the CPU, cost the remote protocol nothing):
    bool padded_alloc = false;     // BufferType::alloc_size may exceed nbytes for some tensor
    bool init_tensor = false;      // Buffer::init_tensor does something
    bool size_dependent = false;   // supports_op may answer differently for other sizes
    bool prepare_weights = false;  // prepare_weights does something (sets Tensor::extra)
    // compute() captures a graph's kernels once and replays them while the structure stays the
    // same (CUDA graphs): every new structure costs a capture, so callers should change it
    // rarely (a session pads its KV length to 256 instead of 32: SessionOptions::kv_pad).
    bool graph_replay = false;
};

// Limits a host puts on one backend's compute (the remote server, for each session).
struct ComputeLimits {
    // Scratch bytes the backend may hold for kernels; a compute that needs more fails (its
    // error names the node and both sizes) instead of allocating.
    size_t max_scratch = SIZE_MAX;
    // Polled by the backend between nodes and inside long kernels (one thread at a time;
    // callers rate-limit it themselves). True stops the compute, which then fails.
    std::function<bool()> should_abort;
};

class BufferType {
  public:
    virtual ~BufferType() = default;
    virtual const char* name() const = 0;
    virtual Device* device() const = 0;
    virtual size_t alignment() const = 0;
    virtual size_t max_size() const { return SIZE_MAX; }
    // Bytes a tensor needs in this buffer type (may exceed nbytes, e.g. for padding).
    virtual size_t alloc_size(const Tensor* t) const { return t->nbytes(); }
    // True when buffers of this type live in the caller's address space.
    virtual bool is_host() const = 0;
    virtual Expected<std::unique_ptr<Buffer>> allocate(size_t size) = 0;
    // Allocation for a known use, which a device may place differently (a remote device keeps
    // weights in server memory the client does not map). The buffer's usage() is set to it.
    virtual Expected<std::unique_ptr<Buffer>> allocate_for(size_t size, BufferUsage usage);
};

class Buffer {
  public:
    virtual ~Buffer() = default;
    virtual BufferType* type() const = 0;
    virtual size_t size() const = 0;
    // Host address of byte 0, or nullptr when this process cannot address the memory.
    virtual void* base() const = 0;
    // Called when a tensor is placed in this buffer (at t->offs).
    virtual Status init_tensor(Tensor* t) {
        (void)t;
        return Status::ok();
    }
    // Byte ranges are relative to the tensor's first element; the tensor must be contiguous
    // over [offset, offset + size).
    virtual Status set_tensor(Tensor* t, const void* src, size_t offset, size_t size) = 0;
    virtual Status get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) = 0;
    virtual Status memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) = 0;
    // Copies src into dst (same byte size) when this buffer (dst's) can reach src's buffer
    // directly; returns false (and copies nothing) otherwise.
    virtual bool copy_tensor(const Tensor* src, Tensor* dst) {
        (void)src;
        (void)dst;
        return false;
    }
    virtual Status clear(uint8_t value) = 0;

    // Whether t is placed in this buffer and [offset, offset + size) from its first byte lies
    // within it; the error names the tensor, the range and the buffer's size.
    Status check_range(const Tensor* t, size_t offset, size_t size) const;

    BufferUsage usage() const { return usage_; }
    void set_usage(BufferUsage u) { usage_ = u; }

  private:
    BufferUsage usage_ = BufferUsage::Any;
};

inline Expected<std::unique_ptr<Buffer>> BufferType::allocate_for(size_t size, BufferUsage usage) {
    Expected<std::unique_ptr<Buffer>> b = allocate(size);
    if (b) (*b)->set_usage(usage);
    return b;
}

class Event {
  public:
    virtual ~Event() = default;
    virtual Device* device() const = 0;
    virtual Status synchronize() = 0;  // waits until the recorded point has passed
};

// One write of host bytes into a tensor (Backend::set_tensors_async).
struct TensorWrite {
    Tensor* t;
    const void* src;
    size_t offset, size;
};

// A result read while the compute that writes it still runs (Backend::read_in_pieces): the
// bytes land in host memory the backend owns, front to back.
struct PieceRead {
    const uint8_t* data = nullptr;  // nullptr: not offered (read the usual way)
    size_t size = 0;
    // Blocks until more than `have` leading bytes are in place and returns how many are
    // (`size` once all are: the compute has then finished); an error when it failed. Valid
    // until the backend's next call.
    std::function<Expected<size_t>(size_t have)> wait;
};

// A stream of work on one device.
class Backend {
  public:
    virtual ~Backend() = default;
    virtual const char* name() const = 0;
    virtual Device* device() const = 0;
    virtual Status set_tensor_async(Tensor* t, const void* src, size_t offset, size_t size);
    // Several set_tensor_async at once (a decode step's inputs), in order; a device may move
    // them in one transfer. The sources may be reused on return. A device may also hold them
    // until the next operation on this backend (CUDA copies them in the first node of the
    // next compute's graph): like any asynchronous write they are visible to a read through
    // the buffer only after synchronize(). Default: one by one.
    virtual Status set_tensors_async(std::span<const TensorWrite> writes);
    virtual Status get_tensor_async(const Tensor* t, void* dst, size_t offset, size_t size);
    // Copies src (on any device this backend can reach) into dst (on this backend's device);
    // returns false when it cannot, and the caller falls back to a host round trip.
    virtual bool copy_tensor_async(const Tensor* src, Tensor* dst) {
        (void)src;
        (void)dst;
        return false;
    }
    // Runs every node of the graph (view nodes are no-ops). All tensors must have storage
    // on buffers this device can use.
    virtual Status compute(Graph& g) = 0;
    // Launch ahead: queues g, the graph this backend computed last (same structure, same
    // storage), to run again once run_ahead gives it its inputs, so that a decode step is
    // launched while the device still computes the one before and starts the moment its token
    // is known (no graph check, launch or launch latency in between). false: not offered
    // (nothing queued; compute as usual). While it waits, synchronize() waits for everything
    // queued before it, and every other call on this backend first releases it with the
    // inputs it last had (the step before, repeated: the same writes land again). A caller
    // that is about to change what g reads by any other path (a buffer's own calls) calls
    // settle_ahead first. The read issued just before (get_tensor_async of g's result into
    // host memory) is taken as the one the queued run's result will get: a backend may store
    // it there as that run computes it (then the same read after it copies nothing), so the
    // caller keeps that memory allocated, and writes nothing there, until the queued run has
    // run or been settled. (A read is the same read by the bytes it reads and the memory it
    // writes: the Tensor it names may be the caller's temporary, and a backend keeps no
    // pointer to it past the call.)
    virtual Expected<bool> compute_ahead(Graph& g) {
        (void)g;
        return false;
    }
    // Starts the graph queued by compute_ahead with these inputs (set_tensors_async then
    // compute, in one). false: nothing was queued, or the inputs did not fit what it was
    // queued with (then it was released with its last inputs); the writes are set as by
    // set_tensors_async either way, and the caller computes as usual.
    virtual Expected<bool> run_ahead(std::span<const TensorWrite> inputs) {
        FERRY_TRY(set_tensors_async(inputs));
        return false;
    }
    // Releases a graph queued by compute_ahead with the inputs it last had, and waits for the
    // backend's work.
    virtual Status settle_ahead() { return synchronize(); }
    virtual Status synchronize() { return Status::ok(); }
    virtual Status record_event(Event* e) {
        (void)e;
        return Status::error("events not supported");
    }
    virtual Status wait_event(Event* e) {
        (void)e;
        return Status::error("events not supported");
    }
    // Bytes [offset, offset + size) of t, right after the compute() that writes them, as
    // they are produced (BackendOptions::progressive_results). Nothing is queued when it
    // returns an empty PieceRead: the caller then reads as usual.
    virtual PieceRead read_in_pieces(const Tensor* t, size_t offset, size_t size) {
        (void)t;
        (void)offset;
        (void)size;
        return {};
    }
    // Threads for CPU-side work (ignored by devices that have none).
    virtual void set_n_threads(int n) { (void)n; }
    // Limits for the computes that follow (see ComputeLimits); ignored by backends that hold
    // no scratch and cannot stop early.
    virtual void set_compute_limits(ComputeLimits limits) { (void)limits; }
    // Host memory the backend holds between computes for kernel scratch (charged by hosts).
    virtual size_t scratch_bytes() const { return 0; }
};

class Device {
  public:
    virtual ~Device() = default;
    virtual const char* name() const = 0;
    virtual std::string description() const = 0;
    virtual DeviceType type() const = 0;
    virtual DeviceMemory memory() const = 0;
    virtual DeviceCaps caps() const = 0;
    virtual BufferType* buffer_type() = 0;
    // Host memory the device reads fast (pinned/shared); nullptr if none.
    virtual BufferType* host_buffer_type() { return nullptr; }
    // Wraps caller memory as a buffer without copying (e.g. a memory-mapped file, or a remote
    // client's shared staging buffer); fails where the device cannot. For a device whose
    // buffer_type() is host memory (the CPU) the result is one of its buffers, which kernels
    // read; otherwise it is a host buffer like host_buffer_type()'s (a GPU page-locks it for
    // DMA copies). The memory must outlive the buffer.
    virtual Expected<std::unique_ptr<Buffer>> buffer_from_host_ptr(void* ptr, size_t size,
                                                                   size_t max_tensor_size) {
        (void)ptr;
        (void)size;
        (void)max_tensor_size;
        return Status::errorf("device %s cannot use host memory directly", name());
    }
    // Whether this device can run `node` with its sources where they are. Cheap and honest.
    virtual bool supports_op(const Tensor* node) = 0;
    // Whether this device's backends can use tensors stored in buffers of `type`.
    virtual bool supports_buffer_type(const BufferType* type) = 0;
    // Called once every weight of a model is in this device's buffers (after set_tensor), so
    // the device can convert or repack them once (into its own memory or Tensor::extra)
    // instead of on every compute. Weights keep their contents and layout as far as every
    // other reader is concerned. A device that does something here says so in
    // caps().prepare_weights, so that a remote client forwards the call (PREPARE_WEIGHTS): the
    // server keeps the tensors it passed and gives each graph leaf that is the same weight
    // (buffer, offset, type, shape, strides) that tensor's `extra`. Default: nothing to do.
    virtual Status prepare_weights(std::span<Tensor* const> weights) {
        (void)weights;
        return Status::ok();
    }
    virtual Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& opts = {}) = 0;
    virtual Expected<std::unique_ptr<Event>> make_event() {
        return Status::errorf("device %s has no events", name());
    }
};

class Registry {
  public:
    virtual ~Registry() = default;
    virtual const char* name() const = 0;
    virtual std::vector<Device*> devices() = 0;
};

// --- the process's registries ---
// Registries are added explicitly: the built-in ones by ferry::init_backends()
// (ferry/backends.h, which lists them), remote ones when a connection is made. Nothing
// registers itself from a static initializer (static libraries drop such globals).
void register_registry(std::unique_ptr<Registry> reg);
std::vector<Registry*> registries();
std::vector<Device*> all_devices();
Device* find_device(const std::string& name);  // nullptr if none
// The first device of type CPU (the CPU backend's); nullptr before init_backends().
Device* cpu_device();
// The host's memory (/proc/meminfo: MemAvailable as free, MemTotal as total; 0 where
// unknown), for every device whose memory is the host's.
DeviceMemory host_memory();

// Convenience for whole tensors.
Status tensor_set(Tensor* t, const void* src, size_t size);
Status tensor_get(const Tensor* t, void* dst, size_t size);

}  // namespace ferry
