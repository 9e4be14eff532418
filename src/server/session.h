// One client's session on `ferry serve`: its buffer handle table, backends, graph cache and
// the request decoder + validator. Independent of sockets so the fuzzer can drive it directly.
// Events (EVENT_*) live in a per-session table like buffers, with handles from the same
// counter, and are destroyed with the session.
//
// Every byte a client sends is hostile: handles are looked up in this session's own table
// (another session's handles, stale handles and made-up ones are all just unknown), every
// offset and size is range-checked with overflow-checked arithmetic, and every tensor of a
// graph passes validate_node() plus buffer range checks before any kernel runs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ferry/backend.h"
#include "ferry/graph.h"
#include "remote-proto/protocol.h"
#include "remote-proto/step-trace.h"
#include "remote-proto/wire.h"

namespace ferry::server {

struct ServerOptions {
    std::vector<Device*> devices;  // devices served, in the order clients see them
    std::string token;             // required in HELLO when non-empty
    // Per-session memory limit (0: unlimited) on everything the session makes: buffers at
    // their charged size (whole pages), kernel scratch, cached graphs, events.
    uint64_t max_memory = 0;
    // Per-session cap on kernel scratch (0: only max_memory limits it).
    uint64_t max_scratch = 0;
    // Estimated work (multiply-adds and element operations, see estimate_work) one
    // GRAPH_COMPUTE may ask for; larger graphs are refused before they run (0: unlimited).
    uint64_t max_work = 0;
    int n_threads = 0;  // CPU threads per session backend (0: the device default)
    bool verbose = false;
};

// Estimated work of computing a graph's nodes (saturating): MUL_MAT K x M x columns,
// attention query rows x KV positions x (D + Dv), every other node its elements plus its
// sources' elements, and 1 per node. Shapes must have passed validate_node().
uint64_t estimate_work(const Graph& g);
// One node's share of estimate_work.
uint64_t node_work(const Tensor* n);

// Counters over all sessions of a server.
struct ServerCounters {
    std::atomic<uint64_t> sessions{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> buffers{0};
    std::atomic<uint64_t> next_session{1};
};

struct Reply {
    std::vector<uint8_t> payload;
    // When set, the reply's payload is these bytes instead (TENSOR_GET of host memory: sent
    // straight from the buffer; valid until the next request of the session).
    const uint8_t* data = nullptr;
    size_t data_len = 0;
    // With `more` (a progressive read, Session::offer_progressive): only the first data_ready
    // bytes of data are in place; more(n) blocks until more than n are and returns how many
    // (data_len: all); an error there ends the session (the reply is half sent).
    size_t data_ready = 0;
    std::function<Expected<size_t>(size_t)> more;
    bool error = false;
    int pass_fd = -1;    // descriptor to send with the reply (the caller closes it after)
    bool close = false;  // close the connection after sending the reply
};

// Whether b equals the expected secret a, in time that depends on a's length only.
bool tokens_equal(const std::string& a, const std::string& b);
// The checks every connection's first request makes (HELLO, STRIPE_JOIN): the client's
// protocol version is one this server speaks, and its token is the server's (if it has one).
Status check_client(const ServerOptions& opts, uint32_t version, const std::string& token);

class Session {
  public:
    // shared_memory: the transport can pass descriptors (Unix sockets), so host buffers are
    // allocated as memfd shared memory that the client maps.
    Session(const ServerOptions& opts, ServerCounters* counters, bool shared_memory);
    ~Session();  // destroys every event, then frees every buffer of the session
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    // Decodes, validates and executes one request; never trusts the payload.
    void handle(uint16_t cmd, const uint8_t* payload, size_t len, Reply* out);

    // Deferred synchronization. A transport that has already received bytes of the next
    // request says so before handling a GRAPH_COMPUTE (set_more_input(true)); the session then
    // leaves the compute running on its device's stream (Backend::compute without
    // synchronize) and sync_pending() is true after handle(). The compute's reply must then
    // be held, and the request's payload kept unchanged (queued input copies read it), until
    // the device was waited for: by the next handle() (a TENSOR_COPY or TENSOR_GET of that
    // device's memory into host memory queues its copy behind the compute and waits once;
    // any other request waits first), after which take_settled() says how the compute
    // ended, or by settle() (waits now) when the next request is not handled. An error
    // there turns the compute's held reply into an error reply. Without set_more_input
    // (the fuzzer, HELLO) every compute is waited for before its reply, as before.
    void set_more_input(bool more) { more_input_ = more; }
    // Before each request: whether bytes of another request have arrived behind it (a read of a
    // step's result then queues nothing before its wait: the next request would only release
    // it, and replied() queues nothing either).
    void set_next_waiting(bool waiting) { next_waiting_ = waiting; }
    // After the reply to the last request went out (whole, a progressive one included);
    // next_waiting: bytes of another request have arrived. A read of a decode step's result
    // then queues the step's graph on its device to run again once the next step's inputs
    // come (Backend::compute_ahead; FERRY_SERVE_AHEAD=0: never), unless the read queued it
    // already: a read of the step's result into host memory, behind the step still running,
    // queues it before it waits for the step (cmd_tensor_io), as a local session does.
    void replied(bool next_waiting);
    // The frame loop's FERRY_STEP_TRACE events: the session adds 'Q' (a step queued ahead
    // before the wait for the one before).
    void set_step_trace(remote::StepTrace* t) { trace_ = t; }
    bool sync_pending() const { return unsynced_ != 0; }
    Status take_settled();
    Status settle();

    uint64_t id() const { return id_; }
    // Graph tables deserialized and validated (cache misses), and the time that took in
    // nanoseconds (counted only when `timed`: FERRY_SERVE_PROFILE).
    void time_validation(bool timed) { time_validation_ = timed; }
    uint64_t validations() const { return cache_misses_; }
    uint64_t validation_ns() const { return validation_ns_; }
    // Entries of those tables, and how many of them went through validate_node() (the others
    // were taken from a cached table, see build_table).
    uint64_t validated_entries() const { return entries_checked_; }
    // Of GRAPH_COMPUTE's time (when timed): handing the folded inputs to the backend, and the
    // backend's compute call, in nanoseconds, and how many computes there were.
    uint64_t inputs_ns() const { return inputs_ns_; }
    uint64_t backend_ns() const { return backend_ns_; }
    uint64_t computes() const { return computes_; }
    uint64_t table_entries() const { return entries_built_; }
    // Called (rate-limited by the caller) while a compute runs; true stops it (the client is
    // gone). Set by the connection; the fuzzer leaves it unset.
    void set_abort_check(std::function<bool()> fn) { abort_check_ = std::move(fn); }
    // Bytes charged against max_memory now (buffers, scratch, graph cache, events).
    uint64_t charged() const;

    // Striped replies (tcp): a transport that can take extra connections for the session
    // offers them before the HELLO is handled. A client that asks for kCapStripes then gets
    // `key` in its HELLO reply; STRIPES calls enable(n) (which checks that connections
    // 1..n-1 joined); a TENSOR_GET that will be striped calls wake() before it waits for the
    // device, so the sending threads are polling when its bytes are ready.
    struct StripeHooks {
        uint8_t key[remote::kStripeKeyBytes] = {};
        std::function<Status(int n)> enable;
        std::function<void()> wake;
    };
    void offer_stripes(StripeHooks hooks) { stripes_ = std::move(hooks); }
    // Progressive reads (tcp): the transport can send a TENSOR_GET reply in pieces
    // (Reply::more), so the session's backends are made with
    // BackendOptions::progressive_results and a decode step's logits go out while the device
    // still computes them. Before the HELLO is handled.
    void offer_progressive() { progressive_ = true; }

    // For a TENSOR_SET whose 24-byte prefix (handle, offset, size) is at `prefix` and whose
    // payload is frame_len bytes: where its data may be received directly (host-addressable
    // buffer of this session, range checked, size matching the frame), counted as a handled
    // request; nullptr to take the ordinary path (which reports any error).
    uint8_t* direct_set_target(const uint8_t* prefix, uint64_t frame_len);

  private:
    struct SrvBuffer {
        std::unique_ptr<Buffer> buf;
        uint64_t size = 0;
        uint64_t charge = 0;  // bytes charged: size in whole pages, at least one
        uint32_t dev = 0;
        void* map = nullptr;  // memfd mapping (shared memory buffers)
        size_t map_len = 0;
    };
    struct SrvEvent {
        std::unique_ptr<Event> ev;
        uint32_t dev = 0;  // the device index it was made on
    };
    struct CachedGraph {
        uint64_t hash = 0;
        uint32_t dev = 0;
        std::vector<uint8_t> bytes;  // the serialized table
        std::vector<Tensor> tensors;
        Graph graph;
        uint64_t charge = 0;  // bytes charged for it (see kTensorCharge)
        uint64_t work = 0;    // estimated work of one compute (see estimate_work)
    };

    Status dispatch(uint16_t cmd, const uint8_t* payload, size_t len, Reply* out);
    Status cmd_hello(const uint8_t* p, size_t n, Reply* out);
    Status cmd_list_devices(Reply* out);
    Status cmd_buffer_alloc(const uint8_t* p, size_t n, Reply* out);
    Status cmd_buffer_free(const uint8_t* p, size_t n);
    Status cmd_tensor_io(uint16_t cmd, const uint8_t* p, size_t n, Reply* out);
    Status cmd_supports_op(const uint8_t* p, size_t n, Reply* out);
    Status run_cached(uint32_t dev, Reply* out);
    // Waits for a deferred compute (see sync_pending), keeping the result for take_settled.
    void settle_now();
    // The backend of the deferred compute when a read of buffer `b` into host memory may be
    // queued behind it; nullptr otherwise.
    Backend* pending_reader(const SrvBuffer& b) const;
    Status cmd_graph_compute(const uint8_t* p, size_t n, Reply* out);
    // The table part of a GRAPH_COMPUTE (mode kGraphFull or kGraphDelta), read from r.
    Status compute_table(uint32_t dev, uint8_t mode, wire::Reader& r, Reply* out);
    Status cmd_stats(Reply* out);
    Status cmd_event(uint16_t cmd, const uint8_t* p, size_t n, Reply* out);
    Status cmd_alloc_size(const uint8_t* p, size_t n, Reply* out);
    Status cmd_init_tensor(const uint8_t* p, size_t n);
    Status cmd_prepare_weights(const uint8_t* p, size_t n);
    // Gives a leaf that is a prepared weight (same buffer, offset, type, shape and strides)
    // that weight's Tensor::extra.
    void attach_prepared(Tensor* leaf) const;
    // Fails, naming what and how much, when charging `more` bytes would pass max_memory.
    Status charge_ok(uint64_t more, const char* what) const;
    uint64_t scratch() const;

    Expected<SrvBuffer*> lookup(uint64_t handle);
    Expected<SrvEvent*> lookup_event(uint64_t handle);
    Expected<Device*> device(uint32_t dev);
    Expected<Backend*> backend(uint32_t dev);
    // Deserializes and validates a table of n entries. With storage, every tensor gets its
    // buffer (session handles), offset and host address, each range-checked. With `base` (a
    // cached table of the same size and device), entries whose bytes, sources and view source
    // are those of the base are taken from it: only what changed, and what reads it, is
    // decoded and validated again (see the definition).
    Status build_table(const uint8_t* bytes, uint32_t n, bool with_storage, uint32_t dev,
                       std::vector<Tensor>* out, const CachedGraph* base = nullptr);
    // Entry i's shape part (type, shape, strides, op, parameters, sources, view, flags) into
    // ts[i], a fresh tensor; ids, source indices and flags checked, not validate_node().
    Status decode_entry(const remote::Entry& e, uint32_t i, Tensor* ts);
    // Gives a decoded tensor its storage: the view source's, or buffer `handle` of this
    // session at `offs`; checks the range, the device's buffer type and the alignment.
    Status place_entry(uint64_t handle, uint64_t offs, Device* d, Tensor& t);
    void free_buffer(SrvBuffer& b);

    const ServerOptions& opts_;
    ServerCounters* counters_;
    const bool shared_memory_;
    StripeHooks stripes_;  // enable unset: not offered
    bool stripes_enabled_ = false;
    bool progressive_ = false;
    const uint64_t id_;
    bool hello_ = false;
    uint32_t version_ = 0;  // protocol version of the client (HELLO)
    std::function<bool()> abort_check_;
    uint64_t buffer_charge_ = 0, cache_charge_ = 0;
    // Weights given to a device's prepare_weights (PREPARE_WEIGHTS), by (buffer, offset):
    // the device may keep pointers to them and sets their `extra`. Dropped with their buffer.
    std::map<std::pair<const Buffer*, uint64_t>, Tensor> prepared_;
    uint64_t caps_ = 0;
    std::map<uint64_t, SrvBuffer> buffers_;
    uint64_t next_handle_;  // buffer and event handles (one counter: never equal)
    uint64_t bytes_ = 0;
    std::vector<std::unique_ptr<Backend>> backends_;
    // Declared after backends_ so that it is destroyed first even without the destructor's
    // explicit clear: an event may refer to its device's streams.
    std::map<uint64_t, SrvEvent> events_;
    std::list<CachedGraph> cache_;  // most recently used first
    std::vector<uint8_t> redo_;     // build_table against a base: what each entry needed
    // GRAPH_COMPUTE's input writes (kept to reuse their memory from step to step).
    struct InputWrite {
        SrvBuffer* b = nullptr;
        uint64_t off = 0, size = 0;
        const uint8_t* data = nullptr;  // in the request's payload
    };
    std::vector<InputWrite> inputs_;
    std::vector<Tensor> input_tensors_;
    std::vector<TensorWrite> input_writes_;  // input_tensors_ on the compute's device
    // Host memory TENSOR_GET copies device memory into before it is sent (a reply's data
    // stays valid until the next request): for reads of at most kKeepReadStage bytes the
    // device's host buffer type where it has one (pinned for CUDA), plain memory otherwise.
    // At most kKeepReadStage bytes are kept between requests.
    static constexpr uint64_t kKeepReadStage = 4u << 20;
    Expected<uint8_t*> read_stage(uint32_t dev, uint64_t size);
    std::unique_ptr<Buffer> stage_buf_;
    std::unique_ptr<uint8_t[]> stage_plain_;
    uint8_t* stage_base_ = nullptr;
    uint64_t stage_cap_ = 0;
    uint32_t stage_dev_ = 0;
    uint64_t requests_ = 0, errors_ = 0, cache_hits_ = 0, cache_misses_ = 0, delta_hits_ = 0;
    bool time_validation_ = false;
    bool more_input_ = false;
    uint32_t unsynced_ = 0;  // device index + 1 of a compute not waited for (0: none)
    // Decode steps queued ahead (Backend::compute_ahead): once a step's result has been read
    // and no request follows yet, the step's cached graph is queued on its device to run
    // again; the next GRAPH_COMPUTE of that graph unchanged starts it with its input writes
    // (run_ahead), and any other request first releases it with the inputs it last had
    // (settle_ahead: the step before, repeated). FERRY_SERVE_AHEAD=0: never.
    const Graph* ahead_graph_ = nullptr;  // queued on backends_[ahead_dev_]
    uint32_t ahead_dev_ = 0;
    const Graph* last_step_ = nullptr;  // the last compute with input writes, until read
    uint32_t last_step_dev_ = 0;
    bool pending_inputs_ = false;  // input_writes_ not given to the backend yet (run_cached)
    bool ahead_on_ = true;
    // FERRY_SERVE_AHEAD_EARLY=0: a step is queued only after its result's reply.
    bool ahead_early_ = true;
    bool next_waiting_ = false;
    remote::StepTrace* trace_ = nullptr;
    bool ahead_due_ = false;  // the last request read a step's result (replied() may queue)
    void settle_ahead();
    void queue_ahead();
    Status settled_;  // how the last deferred compute's wait ended
    uint64_t validation_ns_ = 0;
    uint64_t inputs_ns_ = 0, backend_ns_ = 0, computes_ = 0;
    uint64_t since_ns(std::chrono::steady_clock::time_point t0) const {
        return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count());
    }
    uint64_t entries_checked_ = 0, entries_built_ = 0;
    uint32_t checked_ = 0;  // validate_node() calls of the last build_table
};

}  // namespace ferry::server
