#include "server/session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/copy.h"
#include "core/env.h"
#include "ferry/checked.h"
#include "remote-proto/protocol.h"
#include "remote-proto/wire.h"

namespace ferry::server {

using remote::Cmd;
using wire::Reader;
using wire::Writer;

bool tokens_equal(const std::string& a, const std::string& b) {
    // Constant time in the length of the expected token.
    unsigned diff = a.size() == b.size() ? 0u : 1u;
    for (size_t i = 0; i < a.size(); i++) {
        diff |= static_cast<unsigned>(a[i]) ^ static_cast<unsigned>(i < b.size() ? b[i] : 0);
    }
    return diff == 0;
}

Status check_client(const ServerOptions& opts, uint32_t version, const std::string& token) {
    if (version < remote::kMinProtocolVersion || version > remote::kProtocolVersion) {
        return Status::errorf("protocol version %u is not supported (this server speaks %u to %u)",
                              version, remote::kMinProtocolVersion, remote::kProtocolVersion);
    }
    if (!opts.token.empty() && !tokens_equal(opts.token, token)) {
        return Status::error("authentication failed: wrong or missing token");
    }
    return Status::ok();
}

namespace {

// "entry N" (what errors of a node's kernel name it by), without snprintf: a table is named
// entry by entry each time one is validated.
void entry_name(char* out, uint32_t i) {
    char digits[10];
    int n = 0;
    do {
        digits[n++] = static_cast<char>('0' + i % 10);
        i /= 10;
    } while (i);
    std::memcpy(out, "entry ", 6);
    for (int k = 0; k < n; k++) out[6 + k] = digits[n - 1 - k];
    out[6 + n] = '\0';
}

// FERRY_SERVE_REVALIDATE_ALL=1: every table that is not cached is validated entry by entry,
// none against a cached base (for before/after measurements).
bool revalidate_all() {
    static const bool on = env_on("FERRY_SERVE_REVALIDATE_ALL");
    return on;
}

// FERRY_SERVE_DEFER_SYNC=0: every GRAPH_COMPUTE is waited for before its reply, also when
// the next request has already arrived (for before/after measurements).
bool defer_off() {
    static const bool off = env_off("FERRY_SERVE_DEFER_SYNC");
    return off;
}

uint64_t elems(const Tensor* t) {
    return t ? static_cast<uint64_t>(t->nelements()) : 0;
}

}  // namespace

uint64_t node_work(const Tensor* n) {
    uint64_t w = 1;
    switch (n->op) {
        case Op::NONE:
        case Op::VIEW:
        case Op::RESHAPE:
        case Op::PERMUTE:
        case Op::TRANSPOSE:
            break;
        case Op::MUL_MAT: {
            // K x M multiply-adds for each of b's columns (rows of b, over every batch).
            const Tensor* a = n->src[0];
            const Tensor* b = n->src[1];
            const uint64_t km =
                saturating_mul(static_cast<uint64_t>(a->ne[0]), static_cast<uint64_t>(a->ne[1]));
            w = saturating_add(w, saturating_mul(km, static_cast<uint64_t>(b->nrows())));
            break;
        }
        case Op::FLASH_ATTN_EXT: {
            const Tensor* q = n->src[0];
            const Tensor* k = n->src[1];
            const Tensor* v = n->src[2];
            const uint64_t per_pos =
                saturating_add(static_cast<uint64_t>(q->ne[0]), static_cast<uint64_t>(v->ne[0]));
            const uint64_t rows_pos =
                saturating_mul(static_cast<uint64_t>(q->nrows()), static_cast<uint64_t>(k->ne[1]));
            w = saturating_add(w, saturating_mul(rows_pos, per_pos));
            break;
        }
        default:
            w = saturating_add(w, elems(n));
            for (int i = 0; i < kMaxSrc; i++) w = saturating_add(w, elems(n->src[i]));
            break;
    }
    return w;
}

uint64_t estimate_work(const Graph& g) {
    uint64_t total = 0;
    for (const Tensor* n : g.nodes) total = saturating_add(total, node_work(n));
    return total;
}

Session::Session(const ServerOptions& opts, ServerCounters* counters, bool shared_memory)
    : opts_(opts),
      counters_(counters),
      shared_memory_(shared_memory),
      id_(counters->next_session.fetch_add(1)),
      // Handles carry the session id in the high bits: a handle from another session can
      // never name one of ours, and a freed handle is never handed out again.
      next_handle_((id_ << 32) | 1u) {
    counters_->sessions.fetch_add(1);
    backends_.resize(opts_.devices.size());
    ahead_on_ = !env_off("FERRY_SERVE_AHEAD");
    ahead_early_ = !env_off("FERRY_SERVE_AHEAD_EARLY");
}

Session::~Session() {
    settle_ahead();
    settle_now();     // a deferred compute may still use the buffers freed below
    events_.clear();  // before the backends and buffers they may refer to
    cache_.clear();   // holds pointers to buffers
    prepared_.clear();
    cache_charge_ = 0;
    for (auto& [h, b] : buffers_) free_buffer(b);
    buffers_.clear();
    counters_->sessions.fetch_sub(1);
}

void Session::free_buffer(SrvBuffer& b) {
    b.buf.reset();
    if (b.map) munmap(b.map, b.map_len);
    b.map = nullptr;
    bytes_ -= b.size;
    buffer_charge_ -= b.charge;
    counters_->bytes.fetch_sub(b.size);
    counters_->buffers.fetch_sub(1);
}

Expected<uint8_t*> Session::read_stage(uint32_t dev, uint64_t size) {
    if (stage_base_ && stage_dev_ == dev && stage_cap_ >= size) return stage_base_;
    stage_buf_.reset();
    stage_plain_.reset();
    stage_base_ = nullptr;
    stage_cap_ = 0;
    const uint64_t cap = std::max<uint64_t>(size, 64u << 10);
    // Page-locked memory only for reads the stage keeps (a decode step's logits); a larger
    // read does not make the server pin memory for a client.
    BufferType* hbt = cap <= kKeepReadStage ? opts_.devices[dev]->host_buffer_type() : nullptr;
    if (hbt && hbt->is_host()) {
        Expected<std::unique_ptr<Buffer>> b = hbt->allocate(static_cast<size_t>(cap));
        if (b && (*b)->base()) {
            stage_buf_ = std::move(*b);
            stage_base_ = static_cast<uint8_t*>(stage_buf_->base());
        }
    }
    if (!stage_base_) {
        stage_plain_.reset(new (std::nothrow) uint8_t[cap]);  // uninitialized
        if (!stage_plain_) {
            return Status::errorf("no memory for a read of %llu bytes",
                                  static_cast<unsigned long long>(size));
        }
        stage_base_ = stage_plain_.get();
    }
    stage_dev_ = dev;
    stage_cap_ = cap;
    return stage_base_;
}

void Session::handle(uint16_t cmd, const uint8_t* payload, size_t len, Reply* out) {
    // The last reply has been sent (or copied): a large read stage is not kept.
    if (stage_cap_ > kKeepReadStage) {
        stage_buf_.reset();
        stage_plain_.reset();
        stage_base_ = nullptr;
        stage_cap_ = 0;
    }
    out->payload.clear();
    out->data = nullptr;
    out->data_len = 0;
    out->data_ready = 0;
    out->more = nullptr;
    out->error = false;
    out->pass_fd = -1;
    requests_++;
    // A deferred compute is waited for before anything else runs, except for a read that can
    // be queued behind it (cmd_tensor_io), which waits in any case (this request may leave a
    // compute of its own running: see sync_pending).
    const bool read = cmd == static_cast<uint16_t>(Cmd::TENSOR_COPY) ||
                      cmd == static_cast<uint16_t>(Cmd::TENSOR_GET);
    // A step queued ahead waits for a GRAPH_COMPUTE of its graph (run_cached); anything else
    // releases it first, and waits for it.
    if (cmd != static_cast<uint16_t>(Cmd::GRAPH_COMPUTE)) settle_ahead();
    if (!read) settle_now();
    Status st = dispatch(cmd, payload, len, out);
    if (read) settle_now();
    // A step's result read: once its reply is sent, its graph may be queued (replied()).
    ahead_due_ = read && st && settled_ && last_step_;
    if (cmd != static_cast<uint16_t>(Cmd::GRAPH_COMPUTE) && !ahead_due_) last_step_ = nullptr;
    more_input_ = false;
    if (!st) {
        errors_++;
        if (out->pass_fd >= 0) {
            close(out->pass_fd);
            out->pass_fd = -1;
        }
        out->payload.clear();
        out->data = nullptr;
        out->data_len = 0;
        Writer w(&out->payload);
        w.str(strfmt("%s: %s", remote::cmd_name(cmd), st.message().c_str()));
        out->error = true;
    }
}

void Session::settle_now() {
    if (!unsynced_) return;
    const uint32_t dev = unsynced_ - 1;
    unsynced_ = 0;
    settled_ = backends_[dev]->synchronize();
}

Status Session::take_settled() {
    Status st = std::move(settled_);
    settled_ = Status::ok();
    if (!st) errors_++;  // the compute was counted as answered without error
    return st;
}

Status Session::settle() {
    settle_now();
    return take_settled();
}

void Session::settle_ahead() {
    if (!ahead_graph_) return;
    ahead_graph_ = nullptr;
    const Status st = backends_[ahead_dev_]->settle_ahead();
    if (!st && settled_) settled_ = st;  // reported by the next wait, as a deferred compute's
}

void Session::replied(bool next_waiting) {
    if (!ahead_due_) return;
    ahead_due_ = false;
    // No request has followed yet: the step's graph is queued to run again as soon as the
    // next step's inputs come (while the client reads this one's result).
    if (!next_waiting) {
        queue_ahead();
    } else {
        last_step_ = nullptr;
    }
}

void Session::queue_ahead() {
    const Graph* g = last_step_;
    last_step_ = nullptr;
    if (!ahead_on_ || !g || ahead_graph_ || cache_.empty() || &cache_.front().graph != g) return;
    Expected<bool> q = backends_[last_step_dev_]->compute_ahead(cache_.front().graph);
    if (!q) {
        (void)backends_[last_step_dev_]->settle_ahead();
        settled_ = q.status();
        return;
    }
    if (*q) {
        ahead_graph_ = g;
        ahead_dev_ = last_step_dev_;
    }
}

Backend* Session::pending_reader(const SrvBuffer& b) const {
    if (!unsynced_ || b.dev != unsynced_ - 1 || b.buf->base()) return nullptr;
    return backends_[b.dev].get();
}

uint64_t Session::scratch() const {
    uint64_t n = 0;
    for (const auto& b : backends_) {
        if (b) n = saturating_add(n, b->scratch_bytes());
    }
    return n;
}

uint64_t Session::charged() const {
    uint64_t n = saturating_add(buffer_charge_, cache_charge_);
    n = saturating_add(n, prepared_.size() * remote::kTensorCharge);
    n = saturating_add(n, events_.size() * remote::kEventCharge);
    return saturating_add(n, scratch());
}

Status Session::charge_ok(uint64_t more, const char* what) const {
    if (!opts_.max_memory) return Status::ok();
    const uint64_t now = charged();
    if (saturating_add(now, more) > opts_.max_memory) {
        return Status::errorf(
            "%s of %llu bytes would exceed the session memory limit (%llu of %llu bytes "
            "charged: buffers, scratch, cached graphs, events, prepared weights)",
            what, static_cast<unsigned long long>(more), static_cast<unsigned long long>(now),
            static_cast<unsigned long long>(opts_.max_memory));
    }
    return Status::ok();
}

Status Session::dispatch(uint16_t cmd, const uint8_t* p, size_t n, Reply* out) {
    if (cmd == 0 || cmd > remote::kCmdMax) return Status::errorf("unknown command %u", cmd);
    const Cmd c = static_cast<Cmd>(cmd);
    if (c == Cmd::HELLO) return cmd_hello(p, n, out);
    if (!hello_) return Status::error("HELLO must be the first request of a connection");
    Reader r(p, n);
    Writer w(&out->payload);
    switch (c) {
        case Cmd::HELLO:
            break;
        case Cmd::LIST_DEVICES:
            if (n != 0) return Status::error("unexpected payload");
            return cmd_list_devices(out);
        case Cmd::DEVICE_MEMORY: {
            const uint32_t dev = r.u32();
            if (!r.done()) return Status::error("malformed request");
            Expected<Device*> d = device(dev);
            if (!d) return d.status();
            const DeviceMemory m = (*d)->memory();
            w.u64(m.free);
            w.u64(m.total);
            return Status::ok();
        }
        case Cmd::SUPPORTS_OP:
            return cmd_supports_op(p, n, out);
        case Cmd::BUFFER_ALLOC:
            return cmd_buffer_alloc(p, n, out);
        case Cmd::BUFFER_FREE:
            return cmd_buffer_free(p, n);
        case Cmd::BUFFER_CLEAR: {
            const uint64_t h = r.u64();
            const uint8_t v = r.u8();
            if (!r.done()) return Status::error("malformed request");
            Expected<SrvBuffer*> b = lookup(h);
            if (!b) return b.status();
            return (*b)->buf->clear(v);
        }
        case Cmd::TENSOR_SET:
        case Cmd::TENSOR_GET:
        case Cmd::TENSOR_MEMSET:
        case Cmd::TENSOR_COPY:
            return cmd_tensor_io(cmd, p, n, out);
        case Cmd::GRAPH_COMPUTE:
            return cmd_graph_compute(p, n, out);
        case Cmd::STRIPES: {
            const uint8_t k = r.u8();
            if (!r.done()) return Status::error("malformed request");
            if (!(caps_ & remote::kCapStripes)) {
                return Status::error("STRIPES: striped replies were not agreed in HELLO");
            }
            if (stripes_enabled_) return Status::error("STRIPES sent twice");
            if (k < 2 || k > remote::kMaxStripes) {
                return Status::errorf("STRIPES: %u stripes (2..%d)", k, remote::kMaxStripes);
            }
            FERRY_TRY(stripes_.enable(k));
            stripes_enabled_ = true;
            return Status::ok();
        }
        case Cmd::STRIPE_JOIN:
            return Status::error("STRIPE_JOIN is the first request of a connection of its own");
        case Cmd::SYNCHRONIZE: {
            const uint32_t dev = r.u32();
            if (!r.done()) return Status::error("malformed request");
            FERRY_TRY(device(dev).status());
            if (backends_[dev]) return backends_[dev]->synchronize();
            return Status::ok();
        }
        case Cmd::SESSION_STATS:
            if (n != 0) return Status::error("unexpected payload");
            return cmd_stats(out);
        case Cmd::PING:
            if (n != 0) return Status::error("unexpected payload");
            return Status::ok();
        case Cmd::EVENT_NEW:
        case Cmd::EVENT_FREE:
        case Cmd::EVENT_RECORD:
        case Cmd::EVENT_WAIT:
        case Cmd::EVENT_SYNCHRONIZE:
            return cmd_event(cmd, p, n, out);
        case Cmd::ALLOC_SIZE:
            return cmd_alloc_size(p, n, out);
        case Cmd::INIT_TENSOR:
            return cmd_init_tensor(p, n);
        case Cmd::PREPARE_WEIGHTS:
            if (version_ < 3) break;
            return cmd_prepare_weights(p, n);
    }
    return Status::errorf("unknown command %u", cmd);
}

uint8_t* Session::direct_set_target(const uint8_t* prefix, uint64_t frame_len) {
    if (!hello_ || frame_len < 24) return nullptr;
    Reader r(prefix, 24);
    const uint64_t h = r.u64();
    const uint64_t off = r.u64();
    const uint64_t size = r.u64();
    if (!r.done() || size != frame_len - 24) return nullptr;
    auto it = buffers_.find(h);
    if (it == buffers_.end() || !range_within(off, size, it->second.size)) return nullptr;
    uint8_t* base = static_cast<uint8_t*>(it->second.buf->base());
    if (!base) return nullptr;
    requests_++;
    return base + off;
}

Status Session::cmd_hello(const uint8_t* p, size_t n, Reply* out) {
    if (hello_) return Status::error("HELLO sent twice");
    Reader r(p, n);
    const uint32_t version = r.u32();
    const uint64_t caps = r.u64();
    const std::string token = r.str(1024);
    if (!r.done()) {
        out->close = true;
        return Status::error("malformed HELLO");
    }
    if (Status st = check_client(opts_, version, token); !st) {
        out->close = true;
        return st;
    }
    uint64_t offered = remote::kCapGraphCache | remote::kCapEvents;
    if (shared_memory_) offered |= remote::kCapSharedMemory;
    if (stripes_.enable) offered |= remote::kCapStripes;
    caps_ = offered & caps;
    hello_ = true;
    version_ = version;
    Writer w(&out->payload);
    w.u32(version);
    w.u64(caps_);
    w.u64(id_);
    w.str("ferry serve");
    if (caps_ & remote::kCapStripes) w.bytes(stripes_.key, sizeof(stripes_.key));
    return Status::ok();
}

Status Session::cmd_list_devices(Reply* out) {
    Writer w(&out->payload);
    w.u32(static_cast<uint32_t>(opts_.devices.size()));
    for (Device* d : opts_.devices) {
        w.str(d->name());
        w.str(d->description());
        w.u32(static_cast<uint32_t>(d->type()));
        const DeviceCaps c = d->caps();
        const bool host_shm = shared_memory_ && (caps_ & remote::kCapSharedMemory) &&
                              d->buffer_type()->is_host() && c.buffer_from_host_ptr;
        uint8_t bits = static_cast<uint8_t>((c.async ? remote::kDeviceCapAsync : 0) |
                                            (c.events ? remote::kDeviceCapEvents : 0) |
                                            (host_shm ? remote::kDeviceCapSharedMemory : 0));
        if (version_ >= 2) {
            bits |= static_cast<uint8_t>((c.padded_alloc ? remote::kDeviceCapPaddedAlloc : 0) |
                                         (c.init_tensor ? remote::kDeviceCapInitTensor : 0) |
                                         (c.size_dependent ? remote::kDeviceCapSizeDependent : 0));
        }
        if (version_ >= 3 && c.prepare_weights) bits |= remote::kDeviceCapPrepareWeights;
        if (version_ >= 3 && c.graph_replay) bits |= remote::kDeviceCapGraphReplay;
        w.u8(bits);
        const DeviceMemory m = d->memory();
        w.u64(m.free);
        w.u64(m.total);
        BufferType* bt = d->buffer_type();
        w.str(bt->name());
        w.u64(bt->alignment());
        w.u64(bt->max_size());
    }
    return Status::ok();
}

Expected<Device*> Session::device(uint32_t dev) {
    if (dev >= opts_.devices.size()) {
        return Status::errorf("device index %u out of range (%zu devices)", dev,
                              opts_.devices.size());
    }
    return opts_.devices[dev];
}

Expected<Backend*> Session::backend(uint32_t dev) {
    Expected<Device*> d = device(dev);
    if (!d) return d.status();
    if (!backends_[dev]) {
        BackendOptions bo;
        bo.progressive_results = progressive_;
        Expected<std::unique_ptr<Backend>> b = (*d)->make_backend(bo);
        if (!b) return b.status();
        backends_[dev] = std::move(*b);
        if (opts_.n_threads > 0) backends_[dev]->set_n_threads(opts_.n_threads);
    }
    return backends_[dev].get();
}

Expected<Session::SrvBuffer*> Session::lookup(uint64_t handle) {
    auto it = buffers_.find(handle);
    if (it == buffers_.end()) {
        return Status::errorf("unknown buffer handle 0x%llx (freed, or not this session's)",
                              static_cast<unsigned long long>(handle));
    }
    return &it->second;
}

Expected<Session::SrvEvent*> Session::lookup_event(uint64_t handle) {
    auto it = events_.find(handle);
    if (it == events_.end()) {
        return Status::errorf("unknown event handle 0x%llx (freed, or not this session's)",
                              static_cast<unsigned long long>(handle));
    }
    return &it->second;
}

// EVENT_NEW / EVENT_FREE / EVENT_RECORD / EVENT_WAIT / EVENT_SYNCHRONIZE. The session's
// requests run in order on its one thread, so "record" marks the point after every request
// of this session before it on that device's backend (stream).
Status Session::cmd_event(uint16_t cmd, const uint8_t* p, size_t n, Reply* out) {
    if (!(caps_ & remote::kCapEvents)) return Status::error("events not negotiated in HELLO");
    Reader r(p, n);
    const Cmd c = static_cast<Cmd>(cmd);
    if (c == Cmd::EVENT_NEW) {
        const uint32_t dev = r.u32();
        if (!r.done()) return Status::error("malformed request");
        Expected<Device*> d = device(dev);
        if (!d) return d.status();
        if (!(*d)->caps().events) return Status::errorf("device %s has no events", (*d)->name());
        if (events_.size() >= remote::kMaxSessionEvents) {
            return Status::errorf("too many live events (limit %zu per session)",
                                  remote::kMaxSessionEvents);
        }
        FERRY_TRY(charge_ok(remote::kEventCharge, "an event"));
        Expected<std::unique_ptr<Event>> e = (*d)->make_event();
        if (!e) return e.status();
        const uint64_t handle = next_handle_++;
        SrvEvent se;
        se.ev = std::move(*e);
        se.dev = dev;
        events_.emplace(handle, std::move(se));
        Writer w(&out->payload);
        w.u64(handle);
        return Status::ok();
    }
    uint64_t h = 0;
    uint32_t dev = 0;
    if (c == Cmd::EVENT_WAIT) {
        dev = r.u32();
        h = r.u64();
    } else {
        h = r.u64();
        if (c == Cmd::EVENT_RECORD) dev = r.u32();
    }
    if (!r.done()) return Status::error("malformed request");
    Expected<SrvEvent*> e = lookup_event(h);
    if (!e) return e.status();
    switch (c) {
        case Cmd::EVENT_FREE:
            events_.erase(h);
            return Status::ok();
        case Cmd::EVENT_SYNCHRONIZE:
            return (*e)->ev->synchronize();
        default:
            break;
    }
    // EVENT_RECORD / EVENT_WAIT: on the session's backend of device dev, which must be the
    // event's device.
    Expected<Device*> d = device(dev);
    if (!d) return d.status();
    if ((*e)->dev != dev) {
        return Status::errorf("event 0x%llx belongs to device %u (%s), not to device %u (%s)",
                              static_cast<unsigned long long>(h), (*e)->dev,
                              opts_.devices[(*e)->dev]->name(), dev, (*d)->name());
    }
    Expected<Backend*> b = backend(dev);
    if (!b) return b.status();
    return c == Cmd::EVENT_RECORD ? (*b)->record_event((*e)->ev.get())
                                  : (*b)->wait_event((*e)->ev.get());
}

Status Session::cmd_buffer_alloc(const uint8_t* p, size_t n, Reply* out) {
    Reader r(p, n);
    const uint32_t dev = r.u32();
    const uint8_t kind = r.u8();
    const uint64_t size = r.u64();
    if (!r.done()) return Status::error("malformed request");
    Expected<Device*> d = device(dev);
    if (!d) return d.status();
    BufferType* bt = nullptr;
    if (kind == remote::kBufferDevice || kind == remote::kBufferDevicePrivate) {
        bt = (*d)->buffer_type();
    } else if (kind == remote::kBufferHost) {
        bt = (*d)->host_buffer_type();
        if (!bt) return Status::errorf("device %s has no host buffer type", (*d)->name());
    } else {
        return Status::errorf("unknown buffer kind %u", kind);
    }
    if (size > bt->max_size()) {
        return Status::errorf("size %llu exceeds the buffer type's maximum %zu",
                              static_cast<unsigned long long>(size), bt->max_size());
    }
    if (buffers_.size() >= remote::kMaxSessionBuffers) {
        return Status::errorf("too many live buffers (limit %zu per session)",
                              remote::kMaxSessionBuffers);
    }
    // Charged in whole pages, at least one: a zero-byte buffer still costs a mapping or an
    // allocation, and a one-byte shared buffer hands the client a whole writable page.
    uint64_t charge = 0;
    if (!checked_add(std::max<uint64_t>(size, 1), remote::kPageCharge - 1, &charge)) {
        return Status::errorf("size %llu overflows", static_cast<unsigned long long>(size));
    }
    charge = charge / remote::kPageCharge * remote::kPageCharge;
    {
        Status st = charge_ok(charge, "a buffer");
        if (!st)
            return Status::errorf("allocating %llu bytes: %s",
                                  static_cast<unsigned long long>(size), st.message().c_str());
    }
    SrvBuffer sb;
    sb.size = size;
    sb.charge = charge;
    sb.dev = dev;
    int fd = -1;
    const bool shm = shared_memory_ && (caps_ & remote::kCapSharedMemory) &&
                     kind != remote::kBufferDevicePrivate && bt->is_host() &&
                     (*d)->caps().buffer_from_host_ptr;
    if (shm) {
        const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
        uint64_t len = 0;
        if (!checked_add(std::max<uint64_t>(size, 1), page - 1, &len)) {
            return Status::errorf("size %llu overflows", static_cast<unsigned long long>(size));
        }
        len = len / page * page;
        fd = memfd_create("ferry-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0) return Status::errorf("memfd_create: %s", std::strerror(errno));
        if (ftruncate(fd, static_cast<off_t>(len)) != 0) {
            const int e = errno;
            close(fd);
            return Status::errorf("cannot allocate %llu bytes of shared memory: %s",
                                  static_cast<unsigned long long>(size), std::strerror(e));
        }
        // The client must not be able to shrink the file under our mapping (SIGBUS).
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
            const int e = errno;
            close(fd);
            return Status::errorf("cannot seal shared memory: %s", std::strerror(e));
        }
        void* map = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            const int e = errno;
            close(fd);
            return Status::errorf("cannot map %llu bytes of shared memory: %s",
                                  static_cast<unsigned long long>(size), std::strerror(e));
        }
        Expected<std::unique_ptr<Buffer>> b = (*d)->buffer_from_host_ptr(map, size, size);
        if (!b) {
            munmap(map, len);
            close(fd);
            return b.status();
        }
        sb.buf = std::move(*b);
        sb.map = map;
        sb.map_len = len;
    } else {
        Expected<std::unique_ptr<Buffer>> b = bt->allocate(size);
        if (!b) return b.status();
        sb.buf = std::move(*b);
    }
    const uint64_t handle = next_handle_++;
    bytes_ += size;
    buffer_charge_ += charge;
    counters_->bytes.fetch_add(size);
    counters_->buffers.fetch_add(1);
    buffers_.emplace(handle, std::move(sb));
    Writer w(&out->payload);
    w.u64(handle);
    w.u64(size);
    w.u8(fd >= 0 ? 1 : 0);
    out->pass_fd = fd;
    return Status::ok();
}

Status Session::cmd_buffer_free(const uint8_t* p, size_t n) {
    Reader r(p, n);
    const uint64_t h = r.u64();
    if (!r.done()) return Status::error("malformed request");
    FERRY_TRY(lookup(h).status());
    // Cached graphs point at buffers; the client forgets its cache on a free as well.
    cache_.clear();
    cache_charge_ = 0;
    auto it = buffers_.find(h);
    const Buffer* gone = it->second.buf.get();
    std::erase_if(prepared_, [&](const auto& kv) { return kv.first.first == gone; });
    free_buffer(it->second);
    buffers_.erase(it);
    return Status::ok();
}

Status Session::cmd_tensor_io(uint16_t cmd, const uint8_t* p, size_t n, Reply* out) {
    Reader r(p, n);
    const Cmd c = static_cast<Cmd>(cmd);
    if (c == Cmd::TENSOR_COPY) {
        const uint64_t sh = r.u64(), so = r.u64(), dh = r.u64(), doff = r.u64(), size = r.u64();
        if (!r.done()) return Status::error("malformed request");
        Expected<SrvBuffer*> s = lookup(sh);
        if (!s) return s.status();
        Expected<SrvBuffer*> d = lookup(dh);
        if (!d) return d.status();
        if (!range_within(so, size, (*s)->size) || !range_within(doff, size, (*d)->size)) {
            return Status::errorf(
                "copy of %llu bytes from offset %llu (buffer of %llu) to offset "
                "%llu (buffer of %llu) is out of range",
                static_cast<unsigned long long>(size), static_cast<unsigned long long>(so),
                static_cast<unsigned long long>((*s)->size), static_cast<unsigned long long>(doff),
                static_cast<unsigned long long>((*d)->size));
        }
        if (size == 0) return Status::ok();
        uint8_t* sbase = static_cast<uint8_t*>((*s)->buf->base());
        uint8_t* dbase = static_cast<uint8_t*>((*d)->buf->base());
        Tensor ts, td;
        ts.buffer = (*s)->buf.get();
        ts.offs = so;
        td.buffer = (*d)->buf.get();
        td.offs = doff;
        if (Backend* be = dbase ? pending_reader(**s) : nullptr) {
            // Device memory into host memory (a decode step's logits into the client's
            // shared buffer) right behind the compute that wrote it: queued on its stream,
            // one wait for both.
            unsynced_ = 0;
            const Status st = be->get_tensor_async(&ts, dbase + doff, 0, size);
            // The step's graph is queued now, behind the step (a local session's order:
            // the scheduler's get_tensor_then), so that its launch overlaps the step. After
            // the reply (replied()) the launch was on the way of the next request, which the
            // client sends within microseconds of the reply (stop 56).
            if (st && ahead_early_ && !next_waiting_ && last_step_ &&
                backends_[last_step_dev_].get() == be) {
                queue_ahead();
                if (trace_ && ahead_graph_) trace_->ev('Q', cmd);
            }
            settled_ = be->synchronize();
            if (!settled_ && ahead_graph_) settle_ahead();  // the step failed: none queued
            return st ? settled_ : st;
        }
        settle_now();
        if (sbase && dbase) {
            if (dbase == sbase) {
                std::memmove(dbase + doff, sbase + so, size);  // may overlap
            } else {
                copy_bytes(dbase + doff, sbase + so, size);
            }
            return Status::ok();
        }
        // One side in host memory (a client's staging buffer for reads and writes of device
        // memory): the device copies straight to or from it.
        if (dbase) return (*s)->buf->get_tensor(&ts, dbase + doff, 0, size);
        if (sbase) return (*d)->buf->set_tensor(&td, sbase + so, 0, size);
        std::vector<uint8_t> tmp(size);
        FERRY_TRY((*s)->buf->get_tensor(&ts, tmp.data(), 0, size));
        return (*d)->buf->set_tensor(&td, tmp.data(), 0, size);
    }
    const uint64_t h = r.u64();
    const uint64_t off = r.u64();
    const uint64_t size = r.u64();
    uint8_t value = 0;
    const uint8_t* data = nullptr;
    if (c == Cmd::TENSOR_SET) {
        data = r.bytes(size);
        if (!data)
            return Status::errorf("payload holds fewer than the %llu data bytes announced",
                                  static_cast<unsigned long long>(size));
    } else if (c == Cmd::TENSOR_MEMSET) {
        value = r.u8();
    }
    if (!r.done()) return Status::error("malformed request");
    Expected<SrvBuffer*> b = lookup(h);
    if (!b) return b.status();
    if (!range_within(off, size, (*b)->size)) {
        return Status::errorf("range [%llu, +%llu) is outside the buffer of %llu bytes",
                              static_cast<unsigned long long>(off),
                              static_cast<unsigned long long>(size),
                              static_cast<unsigned long long>((*b)->size));
    }
    if (c == Cmd::TENSOR_GET && size > remote::kMaxPayload) {
        return Status::errorf("read of %llu bytes exceeds the frame limit",
                              static_cast<unsigned long long>(size));
    }
    Tensor t;
    t.buffer = (*b)->buf.get();
    t.offs = off;
    switch (c) {
        case Cmd::TENSOR_SET:
            return (*b)->buf->set_tensor(&t, data, 0, size);
        case Cmd::TENSOR_MEMSET:
            return (*b)->buf->memset_tensor(&t, value, 0, size);
        default: {
            if (stripes_enabled_ && size >= remote::kStripeMin) stripes_.wake();
            Backend* be = pending_reader(**b);
            if (!be) settle_now();
            if (const uint8_t* base = static_cast<const uint8_t*>((*b)->buf->base())) {
                out->data = base + off;  // host memory: sent from the buffer, no staging copy
                out->data_len = size;
                return Status::ok();
            }
            // The compute that writes it hands it over in pieces (a decode step's logits): the
            // reply goes out from the first piece on, while the device computes the rest.
            if (be && progressive_) {
                if (PieceRead pr = be->read_in_pieces(&t, 0, size); pr.data) {
                    unsynced_ = 0;
                    Expected<size_t> first = pr.wait(0);
                    if (!first) {
                        settled_ = first.status();
                        (void)be->synchronize();
                        return first.status();
                    }
                    settled_ = Status::ok();
                    out->data = pr.data;
                    out->data_len = size;
                    out->data_ready = *first;
                    if (*first < size) out->more = std::move(pr.wait);
                    return Status::ok();
                }
            }
            // Device memory: copied into the session's read stage (host memory of the
            // device: pinned for CUDA, so the copy is one DMA; not zero-filled first) and
            // sent from there.
            Expected<uint8_t*> dst = read_stage((*b)->dev, size);
            if (!dst) return dst.status();
            if (be) {
                // Queued behind the compute that wrote it: one wait for both.
                unsynced_ = 0;
                const Status st = be->get_tensor_async(&t, *dst, 0, size);
                settled_ = be->synchronize();
                FERRY_TRY(st);
                FERRY_TRY(settled_);
                out->data = *dst;
                out->data_len = size;
                return Status::ok();
            }
            FERRY_TRY((*b)->buf->get_tensor(&t, *dst, 0, size));
            out->data = *dst;
            out->data_len = size;
            return Status::ok();
        }
    }
}

// An entry's first 16 bytes are its storage (u64 handle, u64 offset); the rest is its shape
// part (type, shape, strides, op, parameters, source indices, view, flags): everything
// validate_node() reads.
constexpr size_t kStorageBytes = 16;

Status Session::decode_entry(const remote::Entry& e, uint32_t i, Tensor* ts) {
    Tensor& t = ts[i];
    t = Tensor();
    entry_name(t.name, i);
    const TypeTraits* tr = type_traits_or_null(e.type);
    if (!tr || !tr->is_storage) return Status::errorf("unknown type id %u", e.type);
    if (!op_info_or_null(e.op)) return Status::errorf("unknown op id %u", e.op);
    t.type = static_cast<Type>(e.type);
    t.op = static_cast<Op>(e.op);
    for (int k = 0; k < kMaxDims; k++) {
        t.ne[k] = e.ne[k];
        t.nb[k] = e.nb[k];
    }
    std::memcpy(t.op_params, e.op_params, sizeof(t.op_params));
    for (int k = 0; k < kMaxSrc; k++) {
        const int32_t s = e.src[k];
        if (s == -1) continue;
        if (s < 0 || static_cast<uint32_t>(s) >= i) {
            return Status::errorf(
                "source %d refers to entry %d: sources must be earlier entries (forward "
                "reference or cycle)",
                k, s);
        }
        t.src[k] = &ts[static_cast<uint32_t>(s)];
    }
    if (e.view_src != -1) {
        if (e.view_src < 0 || static_cast<uint32_t>(e.view_src) >= i) {
            return Status::errorf(
                "view source refers to entry %d: must be an earlier entry (forward reference "
                "or cycle)",
                e.view_src);
        }
        t.view_src = &ts[static_cast<uint32_t>(e.view_src)];
        t.view_offs = e.view_offs;
    } else if (e.view_offs != 0) {
        return Status::error("view offset without a view source");
    }
    if (e.flags & ~static_cast<uint32_t>(kTensorInput | kTensorOutput | kTensorParam)) {
        return Status::errorf("unknown flags 0x%x", e.flags);
    }
    t.flags = e.flags;
    return Status::ok();
}

Status Session::place_entry(uint64_t handle, uint64_t offs, Device* d, Tensor& t) {
    size_t span = 0;
    if (!tensor_span(&t, &span)) return Status::error("shape or strides overflow");
    if (t.view_src) {
        const Tensor* vs = t.view_src;
        uint64_t o = 0;
        if (!vs->buffer || !checked_add(vs->offs, t.view_offs, &o)) {
            return Status::error("view source has no storage");
        }
        t.buffer = vs->buffer;
        t.offs = o;
    } else {
        Expected<SrvBuffer*> b = lookup(handle);
        if (!b) return b.status();
        t.buffer = (*b)->buf.get();
        t.offs = offs;
    }
    if (!range_within(t.offs, span, t.buffer->size())) {
        return Status::errorf("[offset %llu, %llu bytes] reaches past its buffer of %zu bytes",
                              static_cast<unsigned long long>(t.offs),
                              static_cast<unsigned long long>(span), t.buffer->size());
    }
    if (!d->supports_buffer_type(t.buffer->type())) {
        return Status::errorf("device %s cannot use buffers of type %s", d->name(),
                              t.buffer->type()->name());
    }
    // Kernels access elements (and the half-precision fields of blocks) as typed values: the
    // offset and every stride that is used must keep them naturally aligned.
    const uint64_t align = element_alignment(t.type);
    bool aligned = t.offs % align == 0;
    for (int k = 0; k < kMaxDims; k++) {
        if (t.ne[k] > 1 && t.nb[k] % align != 0) aligned = false;
    }
    if (!aligned) {
        return Status::errorf("offset %llu or strides are not aligned to %llu bytes for type %s",
                              static_cast<unsigned long long>(t.offs),
                              static_cast<unsigned long long>(align), type_name(t.type));
    }
    uint8_t* base = static_cast<uint8_t*>(t.buffer->base());
    t.data = base ? base + t.offs : nullptr;
    t.extra = nullptr;
    if (t.op == Op::NONE && !t.view_src) attach_prepared(&t);
    return Status::ok();
}

Status Session::build_table(const uint8_t* bytes, uint32_t n, bool with_storage, uint32_t dev,
                            std::vector<Tensor>* out, const CachedGraph* base) {
    Device* d = nullptr;
    if (with_storage) {
        Expected<Device*> dd = device(dev);
        if (!dd) return dd.status();
        d = *dd;
    }
    uint64_t table_bytes = 0;
    if (!checked_mul(n, remote::kEntrySize, &table_bytes)) return Status::error("table too large");
    if (base && (!with_storage || base->dev != dev || base->tensors.size() != n ||
                 base->bytes.size() != table_bytes)) {
        base = nullptr;
    }
    std::vector<Tensor>& ts = *out;
    ts.clear();
    checked_ = 0;
    if (!base) {
        ts.resize(n);  // never reallocated below: tensors point at each other
    } else {
        // Starts from the base's validated tensors, their pointers moved to this table.
        ts.assign(base->tensors.begin(), base->tensors.end());
        const Tensor* from = base->tensors.data();
        Tensor* to = ts.data();
        for (Tensor& t : ts) {
            for (Tensor*& s : t.src) {
                if (s) s = to + (s - from);
            }
            if (t.view_src) t.view_src = to + (t.view_src - from);
        }
        redo_.assign(n, 0);
    }
    // With a base, an entry is decoded and validated again when its shape part differs from
    // the base's or a source's or its view source's does (validate_node() reads those and
    // nothing else), and placed again when its storage bytes or shape differ or its view
    // source was placed again. Everything else is what the base's validation found for the
    // same bytes.
    constexpr uint8_t kShape = 1, kPlaced = 2;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t* eb = bytes + static_cast<size_t>(i) * remote::kEntrySize;
        Tensor& t = ts[i];
        auto fail = [&](const Status& st) { return st.context(strfmt("entry %u", i)); };
        bool decode = true, check = true, place = with_storage;
        if (base) {
            const uint8_t* bb = base->bytes.data() + static_cast<size_t>(i) * remote::kEntrySize;
            decode = std::memcmp(eb + kStorageBytes, bb + kStorageBytes,
                                 remote::kEntrySize - kStorageBytes) != 0;
            check = decode;
            place = decode || std::memcmp(eb, bb, kStorageBytes) != 0;
            if (!decode) {
                const Tensor* first = ts.data();
                for (const Tensor* s : t.src) {
                    if (s && (redo_[static_cast<size_t>(s - first)] & kShape)) check = true;
                }
                if (t.view_src) {
                    const uint8_t vs = redo_[static_cast<size_t>(t.view_src - first)];
                    if (vs & kShape) check = true;
                    if (vs & kPlaced) place = true;
                }
            }
            redo_[i] = static_cast<uint8_t>((decode ? kShape : 0) | (place ? kPlaced : 0));
        }
        uint64_t handle = 0, offs = 0;
        if (decode) {
            Reader r(eb, remote::kEntrySize);
            const remote::Entry e = remote::read_entry(r);
            if (!r.ok()) return Status::errorf("entry %u: truncated", i);
            handle = e.handle;
            offs = e.offs;
            if (Status st = decode_entry(e, i, ts.data()); !st) return fail(st);
        } else if (place) {
            Reader r(eb, kStorageBytes);
            handle = r.u64();
            offs = r.u64();
        }
        if (check) {
            if (Status st = validate_node(&t); !st) return fail(st);
            checked_++;
        }
        if (place) {
            if (Status st = place_entry(handle, offs, d, t); !st) return fail(st);
        }
    }
    return Status::ok();
}

void Session::attach_prepared(Tensor* leaf) const {
    if (prepared_.empty()) return;
    auto it = prepared_.find({leaf->buffer, leaf->offs});
    if (it == prepared_.end()) return;
    const Tensor& w = it->second;
    if (w.type != leaf->type || std::memcmp(w.ne, leaf->ne, sizeof(w.ne)) != 0 ||
        std::memcmp(w.nb, leaf->nb, sizeof(w.nb)) != 0) {
        return;  // other bytes at the same place: not the weight the device prepared
    }
    leaf->extra = w.extra;
}

Status Session::cmd_supports_op(const uint8_t* p, size_t n, Reply* out) {
    Reader r(p, n);
    const uint32_t dev = r.u32();
    const uint32_t count = r.u32();
    if (!r.ok()) return Status::error("malformed request");
    Expected<Device*> d = device(dev);
    if (!d) return d.status();
    if (count == 0 || count > 16) return Status::errorf("op table of %u entries (1..16)", count);
    const uint8_t* table = r.bytes(static_cast<uint64_t>(count) * remote::kEntrySize);
    if (!table || !r.done()) return Status::error("op table size does not match its count");
    std::vector<Tensor> ts;
    FERRY_TRY(build_table(table, count, false, dev, &ts));
    Writer w(&out->payload);
    w.u8((*d)->supports_op(&ts.back()) ? 1 : 0);
    return Status::ok();
}

Status Session::cmd_graph_compute(const uint8_t* p, size_t n, Reply* out) {
    Reader r(p, n);
    const uint32_t dev = r.u32();
    const uint8_t mode = r.u8();
    if (!r.ok()) return Status::error("malformed request");
    FERRY_TRY(device(dev).status());
    if (!(mode & remote::kGraphInputs)) return compute_table(dev, mode, r, out);
    if (version_ < 4) return Status::errorf("unknown graph mode %u", mode);
    // The step's input writes (version 4). Every one is checked (a handle of this session,
    // its range inside that buffer) before any is applied, so a bad one changes nothing.
    const uint32_t count = r.u32();
    if (!r.ok() || count == 0 || count > remote::kMaxComputeInputs) {
        return Status::errorf("%u inputs (1..%u)", count, remote::kMaxComputeInputs);
    }
    inputs_.clear();
    for (uint32_t i = 0; i < count; i++) {
        InputWrite in;
        const uint64_t h = r.u64();
        in.off = r.u64();
        in.size = r.u64();
        in.data = r.ok() ? r.bytes(in.size) : nullptr;
        if (!in.data) return Status::errorf("input %u: truncated", i);
        Expected<SrvBuffer*> b = lookup(h);
        if (!b) return b.status().context(strfmt("input %u", i));
        if (!range_within(in.off, in.size, (*b)->size)) {
            return Status::errorf(
                "input %u: range [%llu, +%llu) is outside the buffer of %llu bytes", i,
                static_cast<unsigned long long>(in.off), static_cast<unsigned long long>(in.size),
                static_cast<unsigned long long>((*b)->size));
        }
        in.b = *b;
        inputs_.push_back(in);
    }
    // Writes into device memory of the compute's device go on its stream, in order before the
    // compute (as a local run's inputs do), instead of one synchronous copy each; they read
    // this frame's bytes and these tensors until the backend is synchronized, which every
    // path below does before returning (run_cached on success).
    Expected<Backend*> be = backend(dev);
    if (!be) return be.status();
    // They go to the backend together (set_tensors_async: one transfer where the device can).
    input_tensors_.assign(inputs_.size(), Tensor());
    input_writes_.clear();
    Status st;
    for (size_t i = 0; i < inputs_.size() && st; i++) {
        const InputWrite& in = inputs_[i];
        Tensor& t = input_tensors_[i];
        t.buffer = in.b->buf.get();
        t.offs = in.off;
        std::snprintf(t.name, sizeof(t.name), "input %zu", i);  // named in the backend's errors
        if (in.b->dev == dev && !t.buffer->base()) {
            input_writes_.push_back({&t, in.data, 0, static_cast<size_t>(in.size)});
        } else {
            st = t.buffer->set_tensor(&t, in.data, 0, in.size);
            if (!st) st = st.context(strfmt("input %zu", i));
        }
    }
    // run_cached gives them to the backend (starting the graph queued ahead with them when it
    // is that graph); a table that fails before it still gets them written.
    const bool queued = !input_writes_.empty();
    pending_inputs_ = st && queued;
    if (st) st = compute_table(dev, static_cast<uint8_t>(mode & ~remote::kGraphInputs), r, out);
    if (pending_inputs_) {
        pending_inputs_ = false;
        settle_ahead();
        const Status in = (*be)->set_tensors_async(input_writes_);
        if (st) st = in;
    }
    if (!st && queued) (void)(*be)->synchronize();
    return st;
}

Status Session::compute_table(uint32_t dev, uint8_t mode, wire::Reader& r, Reply* out) {
    std::vector<uint8_t> bytes;
    uint32_t count = 0;
    bool delta = false;
    uint64_t base_hash = 0;  // delta: the base it names
    if (mode == remote::kGraphFull) {
        count = r.u32();
        if (!r.ok() || count > remote::kMaxTableEntries) {
            return Status::errorf("table of %u entries (limit %u)", count,
                                  remote::kMaxTableEntries);
        }
        const uint8_t* table = r.bytes(static_cast<uint64_t>(count) * remote::kEntrySize);
        if (!table || !r.done()) return Status::error("table size does not match its count");
        bytes.assign(table, table + static_cast<size_t>(count) * remote::kEntrySize);
    } else if (mode == remote::kGraphDelta) {
        if (!(caps_ & remote::kCapGraphCache)) return Status::error("graph cache not negotiated");
        const uint64_t base = r.u64();
        count = r.u32();
        const uint32_t changed = r.u32();
        if (!r.ok()) return Status::error("malformed request");
        auto it = std::find_if(cache_.begin(), cache_.end(),
                               [&](const CachedGraph& g) { return g.hash == base; });
        if (it == cache_.end()) {
            return Status::errorf("base graph %016llx is not cached",
                                  static_cast<unsigned long long>(base));
        }
        if (count != it->bytes.size() / remote::kEntrySize) {
            return Status::errorf("table of %u entries does not match the cached base of %zu",
                                  count, it->bytes.size() / remote::kEntrySize);
        }
        if (changed > count) return Status::errorf("%u changed entries of %u", changed, count);
        if (changed == 0 && it->dev == dev) {
            // Nothing to patch: run the cached graph as it is.
            if (!r.done()) return Status::error("trailing bytes after the changed entries");
            cache_hits_++;
            cache_.splice(cache_.begin(), cache_, it);
            return run_cached(dev, out);
        }
        bytes = it->bytes;
        base_hash = it->hash;
        for (uint32_t k = 0; k < changed; k++) {
            const uint32_t idx = r.u32();
            const uint8_t* e = r.bytes(remote::kEntrySize);
            if (!e) return Status::error("truncated changed entry");
            if (idx >= count) return Status::errorf("changed entry index %u of %u", idx, count);
            std::memcpy(bytes.data() + static_cast<size_t>(idx) * remote::kEntrySize, e,
                        remote::kEntrySize);
        }
        if (!r.done()) return Status::error("trailing bytes after the changed entries");
        delta = true;
    } else {
        return Status::errorf("unknown graph mode %u", mode);
    }
    const uint64_t hash = wire::hash64(bytes.data(), bytes.size());
    auto it = std::find_if(cache_.begin(), cache_.end(), [&](const CachedGraph& g) {
        return g.hash == hash && g.dev == dev && g.bytes == bytes;
    });
    if (it != cache_.end()) {
        cache_hits_++;
        cache_.splice(cache_.begin(), cache_, it);
    } else {
        // Charged before anything is built: its table bytes and its deserialized tensors.
        // Older cached graphs make room first (least recently used); a graph that does not
        // fit even then is refused.
        const uint64_t charge =
            saturating_add(bytes.size(), saturating_mul(count, remote::kTensorCharge));
        auto drop_last = [&] {
            cache_charge_ -= cache_.back().charge;
            cache_.pop_back();
        };
        while (!cache_.empty() && opts_.max_memory &&
               saturating_add(charged(), charge) > opts_.max_memory) {
            drop_last();
        }
        FERRY_TRY(charge_ok(charge, strfmt("a graph of %u entries", count).c_str()));
        CachedGraph g;
        g.hash = hash;
        g.dev = dev;
        g.charge = charge;
        const auto t0 = time_validation_ ? std::chrono::steady_clock::now()
                                         : std::chrono::steady_clock::time_point();
        // Validated against the closest cached table of the same size on the same device
        // (a delta's base; else the most recently used): a decode graph rebuilt for a longer
        // KV cache differs in a few shapes and many offsets, and only those are checked
        // again. FERRY_SERVE_REVALIDATE_ALL=1 validates every entry (for measurements).
        const CachedGraph* base = nullptr;
        if (!revalidate_all()) {
            for (const CachedGraph& c : cache_) {
                if (c.dev != dev || c.bytes.size() != bytes.size()) continue;
                if (!base || c.hash == base_hash) base = &c;
                if (!delta || c.hash == base_hash) break;
            }
        }
        FERRY_TRY(build_table(bytes.data(), count, true, dev, &g.tensors, base));
        entries_built_ += count;
        entries_checked_ += checked_;
        // One pass while the tensors are still in cache (the graph lists and estimate_work).
        g.graph.nodes.reserve(count);
        for (Tensor& t : g.tensors) {
            if (t.op == Op::NONE) {
                g.graph.leafs.push_back(&t);
            } else {
                g.graph.nodes.push_back(&t);
                g.work = saturating_add(g.work, node_work(&t));
            }
        }
        if (time_validation_) validation_ns_ += since_ns(t0);
        g.bytes = std::move(bytes);
        cache_misses_++;
        if (delta) delta_hits_++;
        // A stale entry with the same hash (other device) is replaced.
        for (auto c = cache_.begin(); c != cache_.end();) {
            if (c->hash == hash) {
                cache_charge_ -= c->charge;
                c = cache_.erase(c);
            } else {
                ++c;
            }
        }
        cache_charge_ += g.charge;
        cache_.push_front(std::move(g));
        while (cache_.size() > remote::kServerGraphCache) drop_last();
    }
    return run_cached(dev, out);
}

// Runs the most recently used cached graph (the front of the cache) on device `dev`.
Status Session::run_cached(uint32_t dev, Reply* out) {
    const CachedGraph& g = cache_.front();
    if (opts_.max_work && g.work > opts_.max_work) {
        return Status::errorf(
            "graph of %zu nodes needs an estimated %llu operations, over the limit of %llu "
            "per compute (--max-work)",
            g.graph.nodes.size(), static_cast<unsigned long long>(g.work),
            static_cast<unsigned long long>(opts_.max_work));
    }
    Expected<Backend*> b = backend(dev);
    if (!b) return b.status();
    // Scratch this compute may hold: what the session's budget has left (the backend's
    // current scratch is already charged, so it counts as available to itself), capped by
    // --max-scratch.
    ComputeLimits lim;
    lim.should_abort = abort_check_;
    if (opts_.max_memory) {
        const uint64_t mine = (*b)->scratch_bytes();
        const uint64_t others = charged() - mine;
        lim.max_scratch = others >= opts_.max_memory ? 0 : opts_.max_memory - others;
    }
    if (opts_.max_scratch) lim.max_scratch = std::min<uint64_t>(lim.max_scratch, opts_.max_scratch);
    (*b)->set_compute_limits(std::move(lim));
    // The step's input writes; with them, the graph queued ahead starts, when it is this one
    // (compute_table found it cached and unchanged).
    const bool step = pending_inputs_;
    bool started = false;
    if (pending_inputs_) {
        pending_inputs_ = false;
        const bool mine = ahead_graph_ == &cache_.front().graph && ahead_dev_ == dev;
        if (!mine) settle_ahead();
        ahead_graph_ = nullptr;
        const auto t0 = time_validation_ ? std::chrono::steady_clock::now()
                                         : std::chrono::steady_clock::time_point();
        if (mine) {
            Expected<bool> ran = (*b)->run_ahead(input_writes_);
            if (!ran) return ran.status();
            started = *ran;
        } else {
            FERRY_TRY((*b)->set_tensors_async(input_writes_));
        }
        if (time_validation_) inputs_ns_ += since_ns(t0);
    } else {
        settle_ahead();
    }
    const auto t0 = time_validation_ ? std::chrono::steady_clock::now()
                                     : std::chrono::steady_clock::time_point();
    if (!started) FERRY_TRY((*b)->compute(cache_.front().graph));
    if (time_validation_) {
        backend_ns_ += since_ns(t0);
        computes_++;
    }
    last_step_ = step ? &cache_.front().graph : nullptr;
    last_step_dev_ = dev;
    if (more_input_ && !defer_off()) {
        unsynced_ = dev + 1;  // waited for by the next request (see sync_pending)
    } else {
        FERRY_TRY((*b)->synchronize());
    }
    Writer w(&out->payload);
    w.u64(cache_.front().hash);
    return Status::ok();
}

Status Session::cmd_stats(Reply* out) {
    Writer w(&out->payload);
    w.u64(id_);
    w.u64(bytes_);
    w.u64(buffers_.size());
    w.u64(requests_);
    w.u64(errors_);
    w.u64(cache_hits_);
    w.u64(cache_misses_);
    w.u64(delta_hits_);
    w.u64(counters_->sessions.load());
    w.u64(counters_->bytes.load());
    w.u64(counters_->buffers.load());
    if (version_ < 2) return Status::ok();  // the 11 fields version 1 clients expect
    w.u64(charged());
    w.u64(buffer_charge_);
    w.u64(scratch());
    w.u64(cache_charge_);
    w.u64(cache_.size());
    w.u64(events_.size());
    w.u64(opts_.max_memory);
    w.u64(opts_.max_work);
    return Status::ok();
}

// ALLOC_SIZE: what the device's buffer type of `kind` needs for a tensor (a leaf: shape,
// type and strides only; it may exceed the tensor's bytes, e.g. padded quantized rows).
Status Session::cmd_alloc_size(const uint8_t* p, size_t n, Reply* out) {
    Reader r(p, n);
    const uint32_t dev = r.u32();
    const uint8_t kind = r.u8();
    const uint8_t* entry = r.bytes(remote::kEntrySize);
    if (!entry || !r.done()) return Status::error("malformed request");
    Expected<Device*> d = device(dev);
    if (!d) return d.status();
    BufferType* bt = kind == remote::kBufferHost ? (*d)->host_buffer_type()
                     : kind == remote::kBufferDevice || kind == remote::kBufferDevicePrivate
                         ? (*d)->buffer_type()
                         : nullptr;
    if (!bt) return Status::errorf("buffer kind %u unknown or absent on %s", kind, (*d)->name());
    std::vector<Tensor> ts;
    FERRY_TRY(build_table(entry, 1, false, dev, &ts));
    if (ts[0].op != Op::NONE) return Status::error("the tensor must be a leaf (op NONE)");
    Writer w(&out->payload);
    w.u64(bt->alloc_size(&ts[0]));
    return Status::ok();
}

// INIT_TENSOR: the device's Buffer::init_tensor for a tensor placed at the entry's offset in
// buffer `handle` (range-checked like any table entry). The device gets a temporary Tensor:
// it must not keep the pointer.
Status Session::cmd_init_tensor(const uint8_t* p, size_t n) {
    Reader r(p, n);
    const uint64_t handle = r.u64();
    const uint8_t* entry = r.bytes(remote::kEntrySize);
    if (!entry || !r.done()) return Status::error("malformed request");
    Expected<SrvBuffer*> b = lookup(handle);
    if (!b) return b.status();
    // The entry names its buffer itself; it must be this one (checked by build_table).
    Reader er(entry, remote::kEntrySize);
    if (er.u64() != handle) return Status::error("entry names another buffer");
    std::vector<Tensor> ts;
    FERRY_TRY(build_table(entry, 1, true, (*b)->dev, &ts));
    if (ts[0].op != Op::NONE) return Status::error("the tensor must be a leaf (op NONE)");
    return (*b)->buf->init_tensor(&ts[0]);
}

// PREPARE_WEIGHTS: the device's prepare_weights for leaves in its buffers (weights, written
// already). The tensors are kept, so that the device may refer to them, until their buffer is
// freed; leaves of graphs that are the same weights get their `extra` (see attach_prepared).
Status Session::cmd_prepare_weights(const uint8_t* p, size_t n) {
    Reader r(p, n);
    const uint32_t dev = r.u32();
    const uint32_t count = r.u32();
    if (!r.ok()) return Status::error("malformed request");
    Expected<Device*> d = device(dev);
    if (!d) return d.status();
    if (count == 0 || count > remote::kMaxPreparedWeights) {
        return Status::errorf("%u weights (1..%u)", count, remote::kMaxPreparedWeights);
    }
    const uint8_t* table = r.bytes(static_cast<uint64_t>(count) * remote::kEntrySize);
    if (!table || !r.done()) return Status::error("weight table size does not match its count");
    if (prepared_.size() + count > remote::kMaxPreparedWeights) {
        return Status::errorf("%zu prepared weights and %u more: over the limit of %u per session",
                              prepared_.size(), count, remote::kMaxPreparedWeights);
    }
    FERRY_TRY(charge_ok(saturating_mul(count, remote::kTensorCharge), "prepared weights"));
    std::vector<Tensor> ts;
    FERRY_TRY(build_table(table, count, true, dev, &ts));
    for (uint32_t i = 0; i < count; i++) {
        const Tensor& t = ts[i];
        if (t.op != Op::NONE || t.view_src) {
            return Status::errorf("entry %u: a weight must be a leaf (op NONE, not a view)", i);
        }
    }
    std::vector<Tensor*> weights;
    weights.reserve(count);
    for (uint32_t i = 0; i < count; i++) {
        Tensor& kept = prepared_[{ts[i].buffer, ts[i].offs}];
        kept = ts[i];
        kept.extra = nullptr;
        weights.push_back(&kept);
    }
    FERRY_TRY((*d)->prepare_weights(weights));
    // Graphs cached before this request get the new extras too.
    for (CachedGraph& g : cache_) {
        if (g.dev != dev) continue;
        for (Tensor* l : g.graph.leafs) {
            if (!l->view_src) attach_prepared(l);
        }
    }
    return Status::ok();
}

}  // namespace ferry::server
