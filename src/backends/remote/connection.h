// A client connection to `ferry serve`: framing, request ids and the pipeline of requests in
// flight. Thread-safe (one lock per connection).
//
// Requests are sent without waiting; their replies are matched to them by id, in order (the
// server answers a connection's requests in the order they arrive). Small data-path requests
// (inputs, posted reads) are held and go out together with the next request that starts work
// or waits, in one send. A wait (drain) reads
// replies until nothing is in flight. While sending, replies that arrive are read as well, so
// a long pipeline never deadlocks on full socket buffers. The first error of an asynchronous
// request is kept and returned by the next wait.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/remote/transport-ivshmem.h"
#include "ferry/status.h"
#include "remote-proto/protocol.h"
#include "remote-proto/step-trace.h"
#include "remote-proto/stripes.h"
#include "remote-proto/transport.h"

namespace ferry::remote {

class Connection {
  public:
    // Connects and says HELLO. token empty: FERRY_TOKEN if set.
    static Expected<std::shared_ptr<Connection>> open(const std::string& addr,
                                                      const std::string& token);
    ~Connection();

    const std::string& addr() const { return addr_; }
    uint64_t caps() const { return caps_; }
    uint64_t waits() const { return waits_; }
    uint64_t bytes_in() const { return bytes_in_; }
    uint64_t sends() const { return sends_; }
    uint64_t session_id() const { return session_; }
    // tcp: connections that carry stripes of large replies, this one included (1: none), and
    // the replies that came striped.
    int stripes() const { return lanes_ ? lanes_->stripes() : 1; }
    uint64_t striped_replies() const { return striped_; }
    // Stripes a tcp connection asks for: FERRY_REMOTE_STRIPES (1 turns them off, at most
    // kMaxStripes), else kDefaultStripes on hosts of 8+ hardware threads and 1 on smaller ones.
    // Measured on the H200 host (stop 28, 1B Q4_0 tg128 over tcp loopback, one client per
    // count): 1,426 t/s with 1, 1,560 with 2, 1,565 with 4, 1,572 with 8; 2 costs one more
    // polling core on each side per session.
    static constexpr int kDefaultStripes = 2;
    static int stripes_wanted();
    std::recursive_mutex& mutex() { return mu_; }

    // The result of a synchronous call.
    struct Result {
        std::vector<uint8_t> payload;
        std::vector<int> fds;  // descriptors that came with the reply (caller owns them)
    };

    // Sends a request and waits for its reply (and everything before it). The payload is
    // `prefix` followed by `data` bytes.
    Expected<Result> call(Cmd cmd, const wire::Writer& prefix, const void* data = nullptr,
                          size_t size = 0);
    // Sends a request without waiting. When reply_dst is set, the reply payload (which must be
    // exactly reply_size bytes) is written there when it arrives.
    Status send_async(Cmd cmd, const wire::Writer& prefix, const void* data = nullptr,
                      size_t size = 0, void* reply_dst = nullptr, size_t reply_size = 0);
    // A posted TENSOR_SET of `size` bytes at `offset` of buffer `handle`: a small one is held
    // and travels inside the next GRAPH_COMPUTE frame (its inputs section: no frame, no reply
    // of its own; see kGraphInputs); it goes out as a TENSOR_SET frame instead when any other
    // request is sent first, or when the held inputs are full. The bytes are copied before
    // this returns.
    Status post_input(uint64_t handle, uint64_t offset, const void* data, size_t size);
    // Sends a GRAPH_COMPUTE on device `dev` with the held inputs; `body` is the table part
    // of `mode` (kGraphFull or kGraphDelta).
    Status send_compute(uint32_t dev, uint8_t mode, const wire::Writer& body);
    // Runs `fn` once every request sent so far has been answered (now, if none is in flight).
    Status after_pending(std::function<void()> fn);
    bool idle() const { return pending_.empty(); }
    // Waits for every request in flight; returns (and clears) the first asynchronous error.
    Status drain();
    // Sends what is held (inputs, posted reads, a held compute) now, without waiting: work the
    // caller does next then overlaps the server's.
    Status send_held();

    // Client mirror of the server's graph cache (see protocol.h: kClientGraphCache).
    struct SentGraph {
        uint64_t hash;
        std::vector<uint8_t> bytes;
    };
    std::list<SentGraph>& sent_graphs() { return sent_graphs_; }
    void forget_graphs() { sent_graphs_.clear(); }

    // Error naming the server: "remote server ADDR: what".
    Status error(const std::string& what, ErrorCode code = ErrorCode::Failed) const;

  private:
    struct Pending {
        uint64_t id = 0;
        uint16_t cmd = 0;  // 0: a local action
        void* dst = nullptr;
        size_t dst_size = 0;
        bool sync = false;
        std::function<void()> action;
    };

    Connection() = default;
    // Joins n - 1 stripe connections to the session (STRIPE_JOIN with the HELLO's key), then
    // turns striping on (STRIPES).
    Status open_stripes(const std::string& addr, const std::string& token, const uint8_t* key,
                        int n);
    // Sends a frame, or holds it (small data-path requests) to go out with the next one.
    Status send_frame(Cmd cmd, uint64_t id, const wire::Writer& prefix, const void* data,
                      size_t size);
    Status flush();  // sends the held inputs and frames
    // Sends the held inputs as TENSOR_SET frames (before a request that is not a compute).
    Status spill_inputs();
    Status write_parts(const uint8_t** parts, size_t* left, int n_parts);
    // Reads one reply and retires the request at the front of the pipeline.
    Status read_reply(Result* sync_result, Status* sync_status);
    Status fail(const std::string& why);  // marks the connection dead
    // Reads n reply bytes through the receive buffer (one receive takes in every reply that
    // has arrived); descriptors that come along are gathered in fds_in_.
    Status read_in(void* dst, size_t n);
    void close_fds_in();
    void run_local_actions();

    // Sends over the ivshmem window's request ring; while it is full, replies are read.
    Status write_ring(const uint8_t** parts, size_t* left, int n_parts);

    std::recursive_mutex mu_;
    std::string addr_;
    Socket sock_;
    std::unique_ptr<IvshmemChannel> ring_;  // set for "ivshmem:" addresses instead of sock_
    uint64_t caps_ = 0;
    uint64_t session_ = 0;
    uint64_t next_id_ = 1;
    bool dead_ = false;
    std::string dead_why_;
    Status sticky_;
    std::deque<Pending> pending_;
    HeldFrames out_;  // held frames, sent before anything that waits or starts work
    // Held inputs (post_input): n_inputs_ records of u64 handle, u64 offset, u64 size, bytes.
    std::vector<uint8_t> inputs_;
    uint32_t n_inputs_ = 0;
    bool fold_inputs_ = true;  // FERRY_REMOTE_FOLD=0 sends every input as a TENSOR_SET
    // FERRY_REMOTE_HOLD_COMPUTE=0 sends a GRAPH_COMPUTE at once instead of with what follows.
    bool hold_compute_ = true;
    BufferedReader in_{sock_};
    std::vector<int> fds_in_;  // descriptors received, not yet handed to a call
    std::list<SentGraph> sent_graphs_;
    std::unique_ptr<StripeLanes> lanes_;  // set once STRIPES succeeded
    uint64_t striped_ = 0;
    // Client-side counters, printed at exit when FERRY_REMOTE_STATS is set.
    uint64_t sent_[kCmdMax + 1] = {};
    uint64_t bytes_out_ = 0, bytes_in_ = 0, waits_ = 0, sends_ = 0, folded_ = 0;
    remote::StepTrace trace_{"client"};  // FERRY_STEP_TRACE
};

}  // namespace ferry::remote
