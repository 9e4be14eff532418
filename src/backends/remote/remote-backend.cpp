// Client proxies: RemoteRegistry, RemoteDevice, RemoteBufferType, RemoteBuffer, RemoteBackend,
// RemoteEvent. Every call becomes a request on the device's Connection; nothing on the wire is
// a pointer (buffers are handles, tensors are (handle, offset) entries of a table).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "backends/remote/connection.h"
#include "core/copy.h"
#include "core/env.h"
#include "ferry/remote.h"
#include "remote-proto/protocol.h"

namespace ferry {
namespace remote {
namespace {

// Reads of unmapped (device) memory of at least this many bytes come back through a shared
// staging buffer when the connection has shared memory (RemoteDevice::staging_slot); the
// staging buffer starts at kStagingMin and grows to at most kStagingMax (larger reads go as
// reply payloads).
constexpr size_t kStagedReadMin = 64u << 10;
constexpr size_t kStagingMin = 1u << 20;
constexpr size_t kStagingMax = 64u << 20;
bool staged_reads();

class RemoteDevice;

class RemoteBufferType : public BufferType {
  public:
    RemoteBufferType(RemoteDevice* dev, std::string name, size_t align, size_t max_size,
                     uint8_t kind)
        : dev_(dev), name_(std::move(name)), align_(align), max_size_(max_size), kind_(kind) {}
    const char* name() const override { return name_.c_str(); }
    Device* device() const override;
    size_t alignment() const override { return align_; }
    size_t max_size() const override { return max_size_; }
    // The host kind's buffers are the server's shared memory, mapped here (allocate fails
    // when the server cannot share them).
    bool is_host() const override { return kind_ == kBufferHost; }
    // ALLOC_SIZE when the server's device pads some tensors (device caps bit 8); otherwise
    // nbytes, with no request. Answers are cached by type, shape and strides.
    size_t alloc_size(const Tensor* t) const override;
    Expected<std::unique_ptr<Buffer>> allocate(size_t size) override;
    // Weights stay in server memory the client does not map (see kBufferDevicePrivate).
    Expected<std::unique_ptr<Buffer>> allocate_for(size_t size, BufferUsage usage) override {
        Expected<std::unique_ptr<Buffer>> b = allocate_kind(
            size,
            usage == BufferUsage::Weights && kind_ == kBufferDevice ? kBufferDevicePrivate : kind_);
        if (b) (*b)->set_usage(usage);
        return b;
    }

    RemoteDevice* remote_device() const { return dev_; }
    // A host buffer of the server's device (shared memory where the server offers it).
    Expected<std::unique_ptr<Buffer>> allocate_host(size_t size) {
        return allocate_kind(size, kBufferHost);
    }

  private:
    Expected<std::unique_ptr<Buffer>> allocate_kind(size_t size, uint8_t kind);

    RemoteDevice* dev_;
    std::string name_;
    size_t align_;
    size_t max_size_;
    uint8_t kind_;
    mutable std::mutex size_mu_;
    mutable std::unordered_map<uint64_t, size_t> size_cache_;
};

class RemoteBuffer : public Buffer {
  public:
    RemoteBuffer(RemoteBufferType* type, std::shared_ptr<Connection> conn, uint64_t handle,
                 size_t size, void* map, size_t map_len)
        : type_(type),
          conn_(std::move(conn)),
          handle_(handle),
          size_(size),
          map_(map),
          map_len_(map_len) {}
    ~RemoteBuffer() override;
    BufferType* type() const override { return type_; }
    size_t size() const override { return size_; }
    void* base() const override { return map_; }
    // INIT_TENSOR (posted, like a write) when the server's device asks for it (device caps
    // bit 16); nothing otherwise.
    Status init_tensor(Tensor* t) override;

    // A posted write: the data is copied into the request (or written in place to shared
    // memory) before this returns, so the caller may reuse src at once; a server-side failure
    // surfaces at the next wait. This keeps "set inputs, compute, read outputs" one round trip.
    Status set_tensor(Tensor* t, const void* src, size_t offset, size_t size) override {
        return write(t, src, offset, size);
    }
    Status get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) override {
        FERRY_TRY(read(t, dst, offset, size));
        return conn_->drain();
    }
    Status memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) override {
        uint64_t off = 0;
        FERRY_TRY(range(t, offset, size, &off));
        std::lock_guard<std::recursive_mutex> lock(conn_->mutex());
        if (map_) {
            FERRY_TRY(conn_->drain());
            std::memset(static_cast<uint8_t*>(map_) + off, value, size);
            return Status::ok();
        }
        wire::Writer w;
        w.u64(handle_);
        w.u64(off);
        w.u64(size);
        w.u8(value);
        return conn_->call(Cmd::TENSOR_MEMSET, w).status();
    }
    bool copy_tensor(const Tensor* src, Tensor* dst) override {
        auto* sb = dynamic_cast<RemoteBuffer*>(src->buffer);
        if (!sb || sb->conn_ != conn_ || src->nbytes() != dst->nbytes()) return false;
        wire::Writer w;
        w.u64(sb->handle_);
        w.u64(src->offs);
        w.u64(handle_);
        w.u64(dst->offs);
        w.u64(dst->nbytes());
        return conn_->call(Cmd::TENSOR_COPY, w).has_value();
    }
    Status clear(uint8_t value) override {
        std::lock_guard<std::recursive_mutex> lock(conn_->mutex());
        if (map_) {
            FERRY_TRY(conn_->drain());
            std::memset(map_, value, size_);
            return Status::ok();
        }
        wire::Writer w;
        w.u64(handle_);
        w.u8(value);
        return conn_->call(Cmd::BUFFER_CLEAR, w).status();
    }

    // Queues a write (copied or written in place before returning).
    Status write(const Tensor* t, const void* src, size_t offset, size_t size) {
        uint64_t off = 0;
        FERRY_TRY(range(t, offset, size, &off));
        std::lock_guard<std::recursive_mutex> lock(conn_->mutex());
        if (map_) {
            // Shared memory: written in place, once no queued work can still read it.
            if (!conn_->idle()) FERRY_TRY(conn_->drain());
            if (size) copy_bytes(static_cast<uint8_t*>(map_) + off, src, size);
            return Status::ok();
        }
        const uint8_t* p = static_cast<const uint8_t*>(src);
        // A small write (a step's input) travels inside the next compute's frame.
        if (size <= kMaxFoldedInput) return conn_->post_input(handle_, off, src, size);
        for (size_t done = 0; done < size || (size == 0 && done == 0);) {
            const size_t n = std::min<size_t>(size - done, kMaxChunk);
            wire::Writer w;
            w.u64(handle_);
            w.u64(off + done);
            w.u64(n);
            FERRY_TRY(conn_->send_async(Cmd::TENSOR_SET, w, p + done, n));
            done += n;
            if (size == 0) break;
        }
        return Status::ok();
    }
    // Queues a read; dst is filled by the time the connection is drained.
    Status read(const Tensor* t, void* dst, size_t offset, size_t size) {
        uint64_t off = 0;
        FERRY_TRY(range(t, offset, size, &off));
        std::lock_guard<std::recursive_mutex> lock(conn_->mutex());
        if (map_) {
            const uint8_t* from = static_cast<const uint8_t*>(map_) + off;
            return conn_->after_pending([=]() {
                if (size) copy_bytes(dst, from, size);
            });
        }
        // Into shared memory of the server's device (the host_buffer_type() of a remote
        // device): the server copies there itself, and nothing is left to do here.
        if (RemoteBuffer* hb = staged_reads() ? mapped_host_buffer(dst, size) : nullptr) {
            return post_copy(off, *hb,
                             static_cast<uint64_t>(static_cast<const uint8_t*>(dst) -
                                                   static_cast<const uint8_t*>(hb->map_)),
                             size);
        }
        // Large reads of memory the client cannot map (a GPU's) come back through shared
        // memory: the server copies into a staging buffer, the client copies out of it.
        if (size >= kStagedReadMin) {
            Expected<bool> staged = read_staged(off, dst, size);
            if (!staged) return staged.status();
            if (*staged) return Status::ok();
        }
        uint8_t* d = static_cast<uint8_t*>(dst);
        for (size_t done = 0; done < size;) {
            const size_t n = std::min<size_t>(size - done, kMaxChunk);
            wire::Writer w;
            w.u64(handle_);
            w.u64(off + done);
            w.u64(n);
            FERRY_TRY(conn_->send_async(Cmd::TENSOR_GET, w, nullptr, 0, d + done, n));
            done += n;
        }
        return Status::ok();
    }

    uint64_t handle() const { return handle_; }
    const std::shared_ptr<Connection>& conn() const { return conn_; }
    RemoteDevice* registered_ = nullptr;  // the device whose list of mapped host buffers has it
    // [p, p + size) within this buffer's mapping.
    bool maps(const void* p, size_t size) const {
        const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(map_);
        return map_ && a >= b && a - b <= size_ && size <= size_ - (a - b);
    }

  private:
    // The mapped host buffer of this buffer's device on this connection that holds
    // [p, p + size), or nullptr. Called with the connection's mutex held.
    RemoteBuffer* mapped_host_buffer(const void* p, size_t size) const;
    // Posts a TENSOR_COPY of this buffer's [off, +size) to `to` at to_off (a server-side copy).
    Status post_copy(uint64_t off, const RemoteBuffer& to, uint64_t to_off, size_t size) {
        wire::Writer w;
        w.u64(handle_);
        w.u64(off);
        w.u64(to.handle_);
        w.u64(to_off);
        w.u64(size);
        return conn_->send_async(Cmd::TENSOR_COPY, w);
    }
    // Queues a TENSOR_COPY of [off, +size) into the device's staging buffer and the copy out
    // of it into dst; false when the device has no staging buffer (no shared memory).
    Expected<bool> read_staged(uint64_t off, void* dst, size_t size);

    Status range(const Tensor* t, size_t offset, size_t size, uint64_t* off) const {
        if (Status st = check_range(t, offset, size); !st) return conn_->error(st.message());
        *off = t->offs + offset;
        return Status::ok();
    }

    RemoteBufferType* type_;
    std::shared_ptr<Connection> conn_;
    uint64_t handle_;
    size_t size_;
    void* map_;
    size_t map_len_;
};

// Serializes tensors into table entries; sources and view sources come first.
class TableBuilder {
  public:
    TableBuilder(Connection* conn, bool with_storage) : conn_(conn), storage_(with_storage) {}

    // Nodes to compute; any other tensor with an op (a result of an earlier split, already in
    // memory) is sent as a leaf so the server does not compute it again.
    void set_compute_set(const std::unordered_set<const Tensor*>* nodes) { nodes_ = nodes; }

    Expected<int32_t> add(const Tensor* t) {
        auto it = index_.find(t);
        if (it != index_.end()) return it->second;
        if (t->op != Op::NONE && nodes_ && !nodes_->count(t)) return add_shape(t);
        if (t->view_src) {
            Expected<int32_t> v = add(t->view_src);
            if (!v) return v.status();
        }
        for (int i = 0; i < kMaxSrc; i++) {
            if (t->src[i]) {
                Expected<int32_t> s = add(t->src[i]);
                if (!s) return s.status();
            }
        }
        Entry e;
        FERRY_TRY(fill(t, &e));
        for (int i = 0; i < kMaxSrc; i++) e.src[i] = t->src[i] ? index_.at(t->src[i]) : -1;
        return push(t, e);
    }
    // A source of a supports_op query: shape only (op NONE, no sources).
    Expected<int32_t> add_shape(const Tensor* t) {
        auto it = index_.find(t);
        if (it != index_.end()) return it->second;
        if (t->view_src) {
            Expected<int32_t> v = nodes_ ? add(t->view_src) : add_shape(t->view_src);
            if (!v) return v.status();
        }
        Entry e;
        FERRY_TRY(fill(t, &e));
        e.op = static_cast<uint32_t>(Op::NONE);
        std::memset(e.op_params, 0, sizeof(e.op_params));
        e.flags = 0;
        return push(t, e);
    }
    uint32_t count() const { return n_; }
    wire::Writer& writer() { return w_; }

  private:
    Status fill(const Tensor* t, Entry* e) {
        e->type = static_cast<uint32_t>(t->type);
        for (int i = 0; i < kMaxDims; i++) {
            e->ne[i] = t->ne[i];
            e->nb[i] = t->nb[i];
        }
        e->op = static_cast<uint32_t>(t->op);
        std::memcpy(e->op_params, t->op_params, sizeof(e->op_params));
        e->flags = t->flags;
        if (t->view_src) {
            e->view_src = index_.at(t->view_src);
            e->view_offs = t->view_offs;
        } else if (storage_) {
            auto* b = dynamic_cast<RemoteBuffer*>(t->buffer);
            if (!b) {
                return conn_->error(strfmt("tensor %s is not stored in a buffer of this server",
                                           describe(t).c_str()));
            }
            if (b->conn().get() != conn_) {
                return conn_->error(
                    strfmt("tensor %s is stored on another server", describe(t).c_str()));
            }
            e->handle = b->handle();
            e->offs = t->offs;
        }
        return Status::ok();
    }
    int32_t push(const Tensor* t, const Entry& e) {
        write_entry(w_, e);
        const int32_t i = static_cast<int32_t>(n_++);
        index_[t] = i;
        return i;
    }

    Connection* conn_;
    bool storage_;
    const std::unordered_set<const Tensor*>* nodes_ = nullptr;
    wire::Writer w_;
    uint32_t n_ = 0;
    std::unordered_map<const Tensor*, int32_t> index_;
};

// A server-side event (EVENT_NEW). Recording and waiting are requests on the connection,
// pipelined like compute; synchronize() waits for the server to report the recorded point
// passed.
class RemoteEvent : public Event {
  public:
    RemoteEvent(Device* dev, std::shared_ptr<Connection> conn, uint64_t handle)
        : dev_(dev), conn_(std::move(conn)), handle_(handle) {}
    ~RemoteEvent() override {
        // Posted, errors ignored: the connection may be dead (the server then freed the
        // event with the session).
        wire::Writer w;
        w.u64(handle_);
        (void)conn_->send_async(Cmd::EVENT_FREE, w);
    }
    Device* device() const override { return dev_; }
    // Also returns the first error of an earlier asynchronous request, as every wait does.
    Status synchronize() override {
        wire::Writer w;
        w.u64(handle_);
        return conn_->call(Cmd::EVENT_SYNCHRONIZE, w).status();
    }

    uint64_t handle() const { return handle_; }
    const std::shared_ptr<Connection>& conn() const { return conn_; }

  private:
    Device* dev_;
    std::shared_ptr<Connection> conn_;
    uint64_t handle_;
};

class RemoteDevice : public Device {
  public:
    RemoteDevice(std::shared_ptr<Connection> conn, uint32_t index, wire::Reader& r)
        : conn_(std::move(conn)), index_(index) {
        remote_name_ = r.str();
        name_ = conn_->addr() + "/" + remote_name_;
        description_ = r.str(1u << 16);
        remote_type_ = r.u32();
        caps_bits_ = r.u8();
        mem_.free = r.u64();
        mem_.total = r.u64();
        const std::string bt_name = r.str();
        const uint64_t align = r.u64();
        const uint64_t max_size = r.u64();
        buffer_type_ = std::make_unique<RemoteBufferType>(
            this, conn_->addr() + "/" + bt_name, align ? align : 64, static_cast<size_t>(max_size),
            kBufferDevice);
        host_type_ =
            std::make_unique<RemoteBufferType>(this, conn_->addr() + "/" + bt_name + "_host", 64,
                                               static_cast<size_t>(max_size), kBufferHost);
    }
    const char* name() const override { return name_.c_str(); }
    std::string description() const override {
        const char* t = remote_type_ <= static_cast<uint32_t>(DeviceType::REMOTE)
                            ? device_type_name(static_cast<DeviceType>(remote_type_))
                            : "?";
        return strfmt("%s %s on %s: %s", t, remote_name_.c_str(), conn_->addr().c_str(),
                      description_.c_str());
    }
    DeviceType type() const override { return DeviceType::REMOTE; }
    DeviceMemory memory() const override {
        wire::Writer w;
        w.u32(index_);
        Expected<Connection::Result> r = conn_->call(Cmd::DEVICE_MEMORY, w);
        if (!r) return mem_;
        wire::Reader rd(r->payload.data(), r->payload.size());
        DeviceMemory m;
        m.free = rd.u64();
        m.total = rd.u64();
        return rd.done() ? m : mem_;
    }
    DeviceCaps caps() const override {
        DeviceCaps c;
        c.async = true;
        c.host_buffer = (conn_->caps() & kCapSharedMemory) != 0;
        c.events = (caps_bits_ & kDeviceCapEvents) != 0 && (conn_->caps() & kCapEvents) != 0;
        // The server's device replays captured graphs: the client's sessions pad like a local one.
        c.graph_replay = (caps_bits_ & kDeviceCapGraphReplay) != 0;
        return c;
    }
    BufferType* buffer_type() override { return buffer_type_.get(); }
    bool supports_op(const Tensor* node) override;
    bool supports_buffer_type(const BufferType* type) override {
        auto* bt = dynamic_cast<const RemoteBufferType*>(type);
        return bt && bt->remote_device() == this;
    }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& opts = {}) override;
    // PREPARE_WEIGHTS when the server's device prepares weights (device caps bit 64);
    // otherwise nothing, with no request.
    Status prepare_weights(std::span<Tensor* const> weights) override;
    Expected<std::unique_ptr<Event>> make_event() override {
        if (!(caps_bits_ & kDeviceCapEvents)) return Device::make_event();
        wire::Writer w;
        w.u32(index_);
        Expected<Connection::Result> r = conn_->call(Cmd::EVENT_NEW, w);
        if (!r) return r.status();
        wire::Reader rd(r->payload.data(), r->payload.size());
        const uint64_t handle = rd.u64();
        if (!rd.done()) return conn_->error("EVENT_NEW: malformed reply");
        return std::unique_ptr<Event>(new RemoteEvent(this, conn_, handle));
    }

    const std::shared_ptr<Connection>& conn() const { return conn_; }
    uint32_t index() const { return index_; }
    uint8_t caps_bits() const { return caps_bits_; }
    const std::string& remote_name() const { return remote_name_; }

    // Where a read of `size` bytes of this device's memory is staged: a mapped host buffer of
    // the server's device and an offset in it not used by any read still in flight; buffer
    // nullptr when there is none (the connection has no shared memory, the device no host
    // buffers, or size is over kStagingMax). Called with the connection's mutex held.
    struct StagingSlot {
        RemoteBuffer* buffer = nullptr;
        size_t offset = 0;
    };
    Expected<StagingSlot> staging_slot(size_t size);
    void staging_read_done() { staging_reads_--; }

    // Shared memory of the server's device, mapped here (the logits of a session go there,
    // and reads into it are copies on the server); nullptr without shared memory.
    BufferType* host_buffer_type() override {
        return (conn_->caps() & kCapSharedMemory) ? host_type_.get() : nullptr;
    }
    // The mapped host buffers alive, for reads whose destination is one of them. Called with
    // the connection's mutex held.
    void remember_mapped(RemoteBuffer* b) {
        mapped_.push_back(b);
        b->registered_ = this;
    }
    void forget_mapped(RemoteBuffer* b) { std::erase(mapped_, b); }
    RemoteBuffer* mapped_containing(const void* p, size_t size) const {
        for (RemoteBuffer* b : mapped_) {
            if (b->maps(p, size)) return b;
        }
        return nullptr;
    }

  private:
    std::shared_ptr<Connection> conn_;
    uint32_t index_;
    // The staging buffer (see staging_slot): reads in flight take consecutive slots; once
    // every one of them has been copied out (staging_reads_ back to 0), the next starts
    // again at 0.
    std::vector<RemoteBuffer*> mapped_;  // live mapped host buffers (outlives staging_)
    std::unique_ptr<Buffer> staging_;
    size_t staging_used_ = 0;
    size_t staging_reads_ = 0;
    bool no_staging_ = false;
    std::string name_, remote_name_, description_;
    uint32_t remote_type_ = 0;
    uint8_t caps_bits_ = 0;
    DeviceMemory mem_;
    std::unique_ptr<RemoteBufferType> buffer_type_;
    std::unique_ptr<RemoteBufferType> host_type_;  // kBufferHost
    std::mutex support_mu_;
    std::unordered_map<uint64_t, bool> support_cache_;
};

Device* RemoteBufferType::device() const {
    return dev_;
}

// FERRY_REMOTE_STAGING=0: reads of unmapped memory come back as TENSOR_GET replies, never
// through shared memory (for before/after measurements).
bool staged_reads() {
    static const bool on = !env_off("FERRY_REMOTE_STAGING");
    return on;
}

Expected<std::unique_ptr<Buffer>> RemoteBufferType::allocate(size_t size) {
    Expected<std::unique_ptr<Buffer>> b = allocate_kind(size, kind_);
    if (b && kind_ == kBufferHost && !(*b)->base()) {
        return Status::errorf("%s: the server's device %s gives no shared host memory",
                              dev_->name(), dev_->remote_name().c_str());
    }
    return b;
}

RemoteBuffer::~RemoteBuffer() {
    std::lock_guard<std::recursive_mutex> lock(conn_->mutex());
    // Deferred reads into the mapping must land before it goes away.
    if (map_ && !conn_->idle()) (void)conn_->drain();
    // (Through the device itself: the staging buffer outlives its type, see ~RemoteDevice.)
    if (registered_) registered_->forget_mapped(this);
    if (map_) munmap(map_, map_len_);
    conn_->forget_graphs();  // the server drops its cached graphs on a free, too
    wire::Writer w;
    w.u64(handle_);
    (void)conn_->send_async(Cmd::BUFFER_FREE, w);
}

RemoteBuffer* RemoteBuffer::mapped_host_buffer(const void* p, size_t size) const {
    return type_->remote_device()->mapped_containing(p, size);
}

Expected<RemoteDevice::StagingSlot> RemoteDevice::staging_slot(size_t size) {
    if (!staged_reads() || no_staging_ || size > kStagingMax ||
        !(conn_->caps() & kCapSharedMemory)) {
        return StagingSlot{};
    }
    const size_t need = (size + 63) / 64 * 64;
    if (staging_ && need > staging_->size()) {
        // Too small: reads still in flight copy out of it first, then a larger one.
        FERRY_TRY(conn_->drain());
        staging_.reset();
    }
    if (!staging_) {
        size_t cap = kStagingMin;
        while (cap < need) cap *= 2;
        Expected<std::unique_ptr<Buffer>> b = buffer_type_->allocate_host(cap);
        if (!b || !(*b)->base()) {
            // No host buffers on this device, or not shared: reads go as reply payloads. A
            // refusal by the session's budget is not an error either: the plain path remains.
            no_staging_ = true;
            return StagingSlot{};
        }
        staging_ = std::move(*b);
    }
    // Reads in flight hold consecutive slots; one that does not fit after them waits until
    // they have been copied out (a drain runs every copy-out, so staging_reads_ is 0 then).
    if (staging_reads_ > 0 && staging_used_ + need > staging_->size()) {
        FERRY_TRY(conn_->drain());
    }
    if (staging_reads_ == 0) staging_used_ = 0;
    StagingSlot slot{static_cast<RemoteBuffer*>(staging_.get()), staging_used_};
    staging_used_ += need;
    staging_reads_++;
    return slot;
}

Expected<bool> RemoteBuffer::read_staged(uint64_t off, void* dst, size_t size) {
    RemoteDevice* dev = type_->remote_device();
    Expected<RemoteDevice::StagingSlot> slot = dev->staging_slot(size);
    if (!slot) return slot.status();
    if (!slot->buffer) return false;
    const uint8_t* from = static_cast<const uint8_t*>(slot->buffer->map_) + slot->offset;
    if (Status st = post_copy(off, *slot->buffer, slot->offset, size); !st) {
        dev->staging_read_done();  // nothing will copy out of the slot: give it back
        return st;
    }
    FERRY_TRY(conn_->after_pending([=]() {
        copy_bytes(dst, from, size);
        dev->staging_read_done();
    }));
    return true;
}

Expected<std::unique_ptr<Buffer>> RemoteBufferType::allocate_kind(size_t size, uint8_t kind) {
    const std::shared_ptr<Connection>& conn = dev_->conn();
    wire::Writer w;
    w.u32(dev_->index());
    w.u8(kind);
    w.u64(size);
    Expected<Connection::Result> r = conn->call(Cmd::BUFFER_ALLOC, w);
    if (!r) return r.status();
    wire::Reader rd(r->payload.data(), r->payload.size());
    const uint64_t handle = rd.u64();
    const uint64_t got = rd.u64();
    const uint8_t mappable = rd.u8();
    void* map = nullptr;
    size_t map_len = 0;
    Status st;
    if (!rd.done() || got != size) {
        st = conn->error("BUFFER_ALLOC: malformed reply");
    } else if (mappable) {
        if (r->fds.size() != 1) {
            st = conn->error("BUFFER_ALLOC: shared memory reply without a descriptor");
        } else {
            const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
            map_len = (std::max<size_t>(size, 1) + page - 1) / page * page;
            map = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fds[0], 0);
            if (map == MAP_FAILED) {
                map = nullptr;
                st = conn->error(strfmt("cannot map shared buffer of %zu bytes", size));
            }
        }
    }
    for (int fd : r->fds) close(fd);
    if (!st) {
        wire::Writer f;
        f.u64(handle);
        (void)conn->send_async(Cmd::BUFFER_FREE, f);
        return st;
    }
    auto* buf = new RemoteBuffer(this, conn, handle, size, map, map_len);
    if (map && kind == kBufferHost) {
        std::lock_guard<std::recursive_mutex> lock(conn->mutex());
        dev_->remember_mapped(buf);
    }
    return std::unique_ptr<Buffer>(buf);
}

Entry shape_entry(const Tensor* t) {
    Entry e;
    e.type = static_cast<uint32_t>(t->type);
    for (int i = 0; i < kMaxDims; i++) {
        e.ne[i] = t->ne[i];
        e.nb[i] = t->nb[i];
    }
    return e;
}

size_t RemoteBufferType::alloc_size(const Tensor* t) const {
    if (!(dev_->caps_bits() & kDeviceCapPaddedAlloc)) return t->nbytes();
    const Entry e = shape_entry(t);
    wire::Writer key;
    write_entry(key, e);
    const uint64_t k = wire::hash64(key.data(), key.size());
    {
        std::lock_guard<std::mutex> lock(size_mu_);
        auto it = size_cache_.find(k);
        if (it != size_cache_.end()) return it->second;
    }
    wire::Writer w;
    w.u32(dev_->index());
    w.u8(kind_);
    write_entry(w, e);
    Expected<Connection::Result> r = dev_->conn()->call(Cmd::ALLOC_SIZE, w);
    if (!r) return t->nbytes();  // the error surfaces again at the allocation or compute
    wire::Reader rd(r->payload.data(), r->payload.size());
    const uint64_t n = rd.u64();
    if (!rd.done() || n < t->nbytes()) return t->nbytes();
    std::lock_guard<std::mutex> lock(size_mu_);
    if (size_cache_.size() > 65536) size_cache_.clear();  // bounded
    size_cache_[k] = static_cast<size_t>(n);
    return static_cast<size_t>(n);
}

Status RemoteDevice::prepare_weights(std::span<Tensor* const> weights) {
    if (!(caps_bits_ & kDeviceCapPrepareWeights)) return Status::ok();
    // In requests of at most kChunk entries (a few MiB), each answered before the next.
    constexpr size_t kChunk = 16384;
    std::vector<const Tensor*> list;
    for (const Tensor* t : weights) {
        if (t->view_src || !t->buffer || !supports_buffer_type(t->buffer->type())) {
            return Status::errorf(ErrorCode::InvalidArgument,
                                  "prepare_weights on %s: '%s' is not a tensor in its buffers",
                                  name_.c_str(), t->name);
        }
        list.push_back(t);
    }
    if (list.size() > kMaxPreparedWeights) {
        return Status::errorf(ErrorCode::InvalidArgument,
                              "prepare_weights on %s: %zu weights, over the protocol's %u",
                              name_.c_str(), list.size(), kMaxPreparedWeights);
    }
    for (size_t at = 0; at < list.size(); at += kChunk) {
        const size_t n = std::min(kChunk, list.size() - at);
        wire::Writer w;
        w.u32(index_);
        w.u32(static_cast<uint32_t>(n));
        for (size_t i = at; i < at + n; i++) {
            const Tensor* t = list[i];
            Entry e = shape_entry(t);
            e.handle = static_cast<const RemoteBuffer*>(t->buffer)->handle();
            e.offs = t->offs;
            write_entry(w, e);
        }
        FERRY_TRY(conn_->call(Cmd::PREPARE_WEIGHTS, w).status());
    }
    return Status::ok();
}

Status RemoteBuffer::init_tensor(Tensor* t) {
    auto* rt = static_cast<RemoteBufferType*>(type_);
    if (!(rt->remote_device()->caps_bits() & kDeviceCapInitTensor)) return Status::ok();
    if (t->view_src) return Status::ok();  // views share their owner's storage
    Entry e = shape_entry(t);
    e.handle = handle_;
    e.offs = t->offs;
    wire::Writer w;
    w.u64(handle_);
    write_entry(w, e);
    return conn_->send_async(Cmd::INIT_TENSOR, w);
}

// Op signature for the supports_op cache: op, params, and per tensor its type and layout
// class (contiguous rows, fully contiguous); not exact sizes, so a decode step with a longer
// KV cache does not ask again. See docs/remote-protocol.md.
// With sizes (the device's supports_op may depend on them, device caps bit 32) every tensor's
// shape and strides are part of it too.
uint64_t op_signature(const Tensor* node, bool with_sizes) {
    wire::Writer w;
    auto add = [&](const Tensor* t) {
        w.u32(static_cast<uint32_t>(t->type));
        w.u8(static_cast<uint8_t>((t->nb[0] == type_size(t->type) ? 1 : 0) |
                                  (t->is_contiguous() ? 2 : 0) | (t->view_src ? 4 : 0)));
        if (with_sizes) {
            for (int i = 0; i < kMaxDims; i++) {
                w.i64(t->ne[i]);
                w.u64(t->nb[i]);
            }
        }
    };
    w.u32(static_cast<uint32_t>(node->op));
    w.bytes(node->op_params, sizeof(node->op_params));
    add(node);
    for (int i = 0; i < kMaxSrc; i++) {
        if (node->src[i]) {
            w.u8(1);
            add(node->src[i]);
        } else {
            w.u8(0);
        }
    }
    return wire::hash64(w.data(), w.size());
}

bool RemoteDevice::supports_op(const Tensor* node) {
    const uint64_t sig = op_signature(node, (caps_bits_ & kDeviceCapSizeDependent) != 0);
    {
        std::lock_guard<std::mutex> lock(support_mu_);
        auto it = support_cache_.find(sig);
        if (it != support_cache_.end()) return it->second;
    }
    TableBuilder tb(conn_.get(), false);
    bool ok = true;
    if (node->view_src && !tb.add_shape(node->view_src)) ok = false;
    for (int i = 0; ok && i < kMaxSrc; i++) {
        if (node->src[i] && !tb.add_shape(node->src[i])) ok = false;
    }
    // The node itself, with its real op and sources.
    Entry e;
    e.type = static_cast<uint32_t>(node->type);
    for (int i = 0; i < kMaxDims; i++) {
        e.ne[i] = node->ne[i];
        e.nb[i] = node->nb[i];
    }
    e.op = static_cast<uint32_t>(node->op);
    std::memcpy(e.op_params, node->op_params, sizeof(e.op_params));
    if (ok) {
        for (int i = 0; i < kMaxSrc; i++) {
            e.src[i] = node->src[i] ? tb.add_shape(node->src[i]).value() : -1;
        }
        if (node->view_src) {
            e.view_src = tb.add_shape(node->view_src).value();
            e.view_offs = node->view_offs;
        }
    }
    bool supported = false;
    if (ok) {
        wire::Writer w;
        w.u32(index_);
        w.u32(tb.count() + 1);
        w.bytes(tb.writer().data(), tb.writer().size());
        write_entry(w, e);
        Expected<Connection::Result> r = conn_->call(Cmd::SUPPORTS_OP, w);
        if (!r) {
            // A dead connection supports nothing; do not cache transport failures.
            if (r.status().code() == ErrorCode::ConnectionLost) return false;
        } else {
            supported = r->payload.size() == 1 && r->payload[0] == 1;
        }
    }
    std::lock_guard<std::mutex> lock(support_mu_);
    support_cache_[sig] = supported;
    return supported;
}

class RemoteBackend : public Backend {
  public:
    explicit RemoteBackend(RemoteDevice* dev) : dev_(dev), conn_(dev->conn()) {
        name_ = dev->name();
    }
    const char* name() const override { return name_.c_str(); }
    Device* device() const override { return dev_; }

    Status set_tensor_async(Tensor* t, const void* src, size_t offset, size_t size) override {
        ahead_ = nullptr;
        auto* b = dynamic_cast<RemoteBuffer*>(t->buffer);
        if (!b || b->conn() != conn_) return Backend::set_tensor_async(t, src, offset, size);
        return b->write(t, src, offset, size);
    }
    Status get_tensor_async(const Tensor* t, void* dst, size_t offset, size_t size) override {
        ahead_ = nullptr;
        auto* b = dynamic_cast<RemoteBuffer*>(t->buffer);
        if (!b || b->conn() != conn_) return Backend::get_tensor_async(t, dst, offset, size);
        return b->read(t, dst, offset, size);
    }
    bool copy_tensor_async(const Tensor* src, Tensor* dst) override {
        return dst->buffer && src->buffer && dst->buffer->copy_tensor(src, dst);
    }

    Status compute(Graph& g) override {
        ahead_ = nullptr;
        // A decode step recomputes the graph it computed last time, unchanged: then the
        // server still holds its table (the newest one sent) and only "same as before" goes
        // out, without serializing and hashing the table again (measured: that work was a
        // third of the client's time per tiny-llama token).
        if (unchanged_since_last(g)) {
            Expected<bool> sent = send_same();
            if (!sent) return sent.status();
            if (*sent) return Status::ok();
        }
        Status st = compute_full(g);
        remember(g, st.is_ok());
        return st;
    }
    // Launch ahead, on the client: nothing can go to the server before the step's inputs (a
    // server queues the step ahead on its own once it has sent the step before's result), so
    // what is done ahead is compute()'s check that the graph is the one computed last (a
    // compare of every tensor's image), while the server still computes the step before.
    // Nothing is queued, so releasing it is forgetting it. The step's compute and its read
    // are held to go out in one send (Connection::send_frame); they go now, before the
    // compare: held until the wait after it, they went out only after it (1B: ~700 tensor
    // images, the 5-6 us a served step spent between its result and the next send, stop 56).
    // FERRY_REMOTE_SEND_EARLY=0: at the wait, as before (for before/after measurements).
    Expected<bool> compute_ahead(Graph& g) override {
        static const bool early = !env_off("FERRY_REMOTE_SEND_EARLY");
        if (early) FERRY_TRY(conn_->send_held());
        ahead_ = unchanged_since_last(g) ? &g : nullptr;
        return ahead_ != nullptr;
    }
    Expected<bool> run_ahead(std::span<const TensorWrite> inputs) override {
        const bool checked = ahead_ != nullptr;
        FERRY_TRY(Backend::set_tensors_async(inputs));
        if (!checked) return false;
        return send_same();
    }
    Status settle_ahead() override {
        ahead_ = nullptr;
        return synchronize();
    }

  private:
    // The compute of the graph the server holds as its newest table ("same as before"); false
    // when that is not the remembered one (then nothing was sent).
    Expected<bool> send_same() {
        std::lock_guard<std::recursive_mutex> lock(conn_->mutex());
        std::list<Connection::SentGraph>& sent = conn_->sent_graphs();
        if (sent.empty() || sent.front().hash != last_hash_) return false;
        wire::Writer w;
        w.u64(last_hash_);
        w.u32(last_count_);
        w.u32(0);
        FERRY_TRY(conn_->send_compute(dev_->index(), kGraphDelta, w));
        return true;
    }
    const Graph* ahead_ = nullptr;  // compute_ahead found it unchanged since the last compute
    // Byte images of the last computed graph's tensors (leaves, then nodes) and their
    // addresses: equal images mean an identical table (it is made from these fields alone).
    // An image ends before the name: the table never carries a name, its dynamic-dimension
    // symbols or a device's private data, and a quarter fewer bytes are compared per step.
    static constexpr size_t kImage = offsetof(Tensor, name);
    bool unchanged_since_last(const Graph& g) const {
        if (last_graph_ != &g || last_ptrs_.size() != g.leafs.size() + g.nodes.size()) {
            return false;
        }
        size_t i = 0;
        for (const std::vector<Tensor*>* list : {&g.leafs, &g.nodes}) {
            for (const Tensor* t : *list) {
                if (last_ptrs_[i] != t ||
                    std::memcmp(last_bytes_.data() + i * kImage, t, kImage) != 0) {
                    return false;
                }
                i++;
            }
        }
        return true;
    }
    void remember(const Graph& g, bool ok) {
        last_graph_ = nullptr;
        if (!ok) return;
        const std::list<Connection::SentGraph>& sent = conn_->sent_graphs();
        if (sent.empty()) return;
        last_hash_ = sent.front().hash;
        last_count_ = last_table_count_;
        last_ptrs_.clear();
        last_bytes_.resize((g.leafs.size() + g.nodes.size()) * kImage);
        size_t i = 0;
        for (const std::vector<Tensor*>* list : {&g.leafs, &g.nodes}) {
            for (const Tensor* t : *list) {
                last_ptrs_.push_back(t);
                std::memcpy(last_bytes_.data() + i * kImage, t, kImage);
                i++;
            }
        }
        last_graph_ = &g;
    }
    const Graph* last_graph_ = nullptr;
    std::vector<const Tensor*> last_ptrs_;
    std::vector<uint8_t> last_bytes_;
    uint64_t last_hash_ = 0;
    uint32_t last_count_ = 0;        // table entries of the remembered graph
    uint32_t last_table_count_ = 0;  // table entries compute_full() sent last

  public:
    Status compute_full(Graph& g) {
        TableBuilder tb(conn_.get(), true);
        const std::unordered_set<const Tensor*> nodes(g.nodes.begin(), g.nodes.end());
        tb.set_compute_set(&nodes);
        for (const Tensor* t : g.leafs) FERRY_TRY(tb.add(t).status());
        for (const Tensor* t : g.nodes) FERRY_TRY(tb.add(t).status());
        std::vector<uint8_t>& table = tb.writer().buf();
        const uint32_t n = tb.count();
        last_table_count_ = n;
        const uint64_t hash = wire::hash64(table.data(), table.size());
        std::lock_guard<std::recursive_mutex> lock(conn_->mutex());
        wire::Writer w;  // the table part of the request
        const bool cache = (conn_->caps() & kCapGraphCache) != 0;
        // Delta against the most recent table of the same size the server still holds.
        std::list<Connection::SentGraph>& sent = conn_->sent_graphs();
        const Connection::SentGraph* base = nullptr;
        if (cache) {
            for (const Connection::SentGraph& s : sent) {
                if (s.bytes.size() == table.size()) {
                    base = &s;
                    break;
                }
            }
        }
        std::vector<uint32_t> changed;
        if (base) {
            for (uint32_t i = 0; i < n; i++) {
                const size_t at = static_cast<size_t>(i) * kEntrySize;
                if (std::memcmp(base->bytes.data() + at, table.data() + at, kEntrySize) != 0) {
                    changed.push_back(i);
                }
            }
            if (changed.size() * 2 > n) base = nullptr;
        }
        uint8_t mode = kGraphFull;
        if (base) {
            mode = kGraphDelta;
            w.u64(base->hash);
            w.u32(n);
            w.u32(static_cast<uint32_t>(changed.size()));
            for (uint32_t i : changed) {
                w.u32(i);
                w.bytes(table.data() + static_cast<size_t>(i) * kEntrySize, kEntrySize);
            }
        } else {
            w.u32(n);
            w.bytes(table.data(), table.size());
        }
        FERRY_TRY(conn_->send_compute(dev_->index(), mode, w));
        if (cache) {
            sent.remove_if([&](const Connection::SentGraph& s) { return s.hash == hash; });
            sent.push_front({hash, std::move(table)});
            while (sent.size() > kClientGraphCache) sent.pop_back();
        }
        return Status::ok();
    }
    Status synchronize() override { return conn_->drain(); }
    // Posted (pipelined): the server records the event on this device's stream of the session,
    // after every request sent before it.
    Status record_event(Event* e) override {
        ahead_ = nullptr;
        auto* re = dynamic_cast<RemoteEvent*>(e);
        if (!re || re->device() != dev_) {
            return conn_->error(
                strfmt("record_event: an event of device %s cannot be recorded "
                       "on device %s",
                       e && e->device() ? e->device()->name() : "(none)", dev_->name()));
        }
        wire::Writer w;
        w.u64(re->handle());
        w.u32(dev_->index());
        return conn_->send_async(Cmd::EVENT_RECORD, w);
    }
    // An event of this device (same connection): the server's stream waits for it, the client
    // does not. Any other event (another device, session or server, or a local one): a host
    // wait for its recorded point.
    Status wait_event(Event* e) override {
        ahead_ = nullptr;
        if (!e) return Status::ok();
        auto* re = dynamic_cast<RemoteEvent*>(e);
        if (re && re->conn() == conn_ && re->device() == dev_) {
            wire::Writer w;
            w.u32(dev_->index());
            w.u64(re->handle());
            return conn_->send_async(Cmd::EVENT_WAIT, w);
        }
        return e->synchronize();
    }

  private:
    RemoteDevice* dev_;
    std::shared_ptr<Connection> conn_;
    std::string name_;
};

Expected<std::unique_ptr<Backend>> RemoteDevice::make_backend(const BackendOptions& opts) {
    return std::unique_ptr<Backend>(new RemoteBackend(this));
}

class RemoteRegistry : public Registry {
  public:
    static Expected<std::unique_ptr<RemoteRegistry>> open(const std::string& addr,
                                                          const std::string& token) {
        Expected<std::shared_ptr<Connection>> c = Connection::open(addr, token);
        if (!c) return c.status();
        std::unique_ptr<RemoteRegistry> reg(new RemoteRegistry());
        reg->conn_ = *c;
        Expected<Connection::Result> r = reg->conn_->call(Cmd::LIST_DEVICES, wire::Writer());
        if (!r) return r.status();
        wire::Reader rd(r->payload.data(), r->payload.size());
        const uint32_t n = rd.u32();
        if (!rd.ok() || n > 4096) return reg->conn_->error("LIST_DEVICES: malformed reply");
        for (uint32_t i = 0; i < n; i++) {
            reg->devices_.push_back(std::make_unique<RemoteDevice>(reg->conn_, i, rd));
            if (!rd.ok()) return reg->conn_->error("LIST_DEVICES: malformed reply");
        }
        return reg;
    }
    const char* name() const override { return conn_->addr().c_str(); }
    std::vector<Device*> devices() override {
        std::vector<Device*> out;
        for (auto& d : devices_) out.push_back(d.get());
        return out;
    }
    const std::shared_ptr<Connection>& conn() const { return conn_; }

  private:
    std::shared_ptr<Connection> conn_;
    std::vector<std::unique_ptr<RemoteDevice>> devices_;
};

std::mutex g_connect_mu;
std::set<std::string>& connected() {
    static std::set<std::string> s;
    return s;
}

}  // namespace
}  // namespace remote

Expected<std::unique_ptr<Registry>> remote_open(const std::string& addr, const std::string& token) {
    Expected<std::unique_ptr<remote::RemoteRegistry>> r = remote::RemoteRegistry::open(addr, token);
    if (!r) return r.status();
    return std::unique_ptr<Registry>(std::move(*r));
}

Status remote_connect(const std::string& addr, const std::string& token) {
    std::lock_guard<std::mutex> lock(remote::g_connect_mu);
    if (remote::connected().count(addr)) return Status::ok();
    Expected<std::unique_ptr<Registry>> r = remote_open(addr, token);
    if (!r) return r.status();
    register_registry(std::move(*r));
    remote::connected().insert(addr);
    return Status::ok();
}

Status remote_connect(const std::string& addr) {
    return remote_connect(addr, "");
}

Expected<RemoteStats> remote_stats(Registry* reg) {
    auto* rr = dynamic_cast<remote::RemoteRegistry*>(reg);
    if (!rr) return Status::error("not a remote registry");
    RemoteStats s;
    {
        std::lock_guard<std::recursive_mutex> lock(rr->conn()->mutex());
        s.client_waits = rr->conn()->waits();
        s.client_bytes_in = rr->conn()->bytes_in();
        s.client_sends = rr->conn()->sends();
        s.client_stripes = static_cast<uint32_t>(rr->conn()->stripes());
        s.client_striped_replies = rr->conn()->striped_replies();
    }
    Expected<remote::Connection::Result> r =
        rr->conn()->call(remote::Cmd::SESSION_STATS, wire::Writer());
    if (!r) return r.status();
    wire::Reader rd(r->payload.data(), r->payload.size());
    s.session_id = rd.u64();
    s.session_bytes = rd.u64();
    s.session_buffers = rd.u64();
    s.requests = rd.u64();
    s.errors = rd.u64();
    s.graph_cache_hits = rd.u64();
    s.graph_cache_misses = rd.u64();
    s.graph_delta_hits = rd.u64();
    s.server_sessions = rd.u64();
    s.server_bytes = rd.u64();
    s.server_buffers = rd.u64();
    s.charged = rd.u64();
    s.buffer_charge = rd.u64();
    s.scratch_bytes = rd.u64();
    s.graph_cache_bytes = rd.u64();
    s.graph_cache_entries = rd.u64();
    s.events = rd.u64();
    s.max_memory = rd.u64();
    s.max_work = rd.u64();
    if (!rd.done()) return rr->conn()->error("SESSION_STATS: malformed reply");
    return s;
}

Expected<RemoteStats> remote_stats(const std::string& addr) {
    for (Registry* r : registries()) {
        if (addr == r->name() && dynamic_cast<remote::RemoteRegistry*>(r)) return remote_stats(r);
    }
    return Status::errorf("not connected to remote server %s", addr.c_str());
}

Status remote_ping(Registry* reg) {
    auto* rr = dynamic_cast<remote::RemoteRegistry*>(reg);
    if (!rr) return Status::error("not a remote registry");
    return rr->conn()->call(remote::Cmd::PING, wire::Writer()).status();
}

}  // namespace ferry
