// Client side of the ivshmem transport (see ivshmem-window.h and docs/remote-protocol.md): a
// session over the two rings of a shared-memory window, from a QEMU guest (the ivshmem PCI
// device's BAR) or from a host process (the window file itself).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "ferry/status.h"
#include "remote-proto/ivshmem-window.h"
#include "remote-proto/protocol.h"

namespace ferry::remote {

class IvshmemChannel {
  public:
    // Maps the window `spec` names (the text after "ivshmem:": auto, a PCI address or a file)
    // and opens a session: asks the host for a new epoch and waits (kAttachTimeoutMs) for it
    // to be acknowledged. A heartbeat thread runs until the channel is destroyed.
    static Expected<std::unique_ptr<IvshmemChannel>> attach(const std::string& spec);
    // Detaches (the host then ends the session and frees its memory).
    ~IvshmemChannel();
    IvshmemChannel(const IvshmemChannel&) = delete;
    IvshmemChannel& operator=(const IvshmemChannel&) = delete;

    // Copies as much of [p, p+n) into the request ring as fits now; returns the count (0 when
    // the ring is full). Fails when the session is over.
    Expected<size_t> write_some(const void* p, size_t n);
    // Whether reply bytes are waiting.
    bool readable();
    // Reads exactly n reply bytes, waiting (Backoff) as long as the host is alive, and at
    // most timeout_ms without progress when that is not 0.
    Status read(void* dst, size_t n, int timeout_ms = 0);
    // The next read is the header of the reply to `cmd`: its wait may be predicted from the
    // last wait for a reply to the same command (see expect_us_).
    void expect_reply_to(uint16_t cmd) { expect_cmd_ = cmd <= kCmdMax ? cmd : 0; }
    // Tells the host this client is done (it ends the session); replies already written can
    // still be read.
    void detach();
    // Fails when the host ended the session, another client took the window over, or the
    // host's heartbeat stopped.
    Status check_alive();

    uint32_t epoch() const { return epoch_; }
    const std::string& what() const { return win_.what(); }

  private:
    IvshmemChannel() = default;
    Status violation(const char* what);

    ivshmem::Window win_;
    ivshmem::Geometry geo_;
    uint32_t epoch_ = 0;
    uint64_t req_head_ = 0;  // request bytes written (private copy)
    uint64_t rep_tail_ = 0;  // reply bytes read (private copy)
    uint64_t last_beat_ = 0;
    // How long the next wait for a reply to each command is expected to take (microseconds;
    // 0: no guess): a wait first sleeps through most of it in one go instead of spinning and
    // waking on a short period, which on few cores takes CPU time from the server's compute
    // and adds up to 100 us of wake-up delay per reply. Learned from the last wait for the
    // same command's reply: set from what a wait took, halved when a predicted sleep found
    // the reply already there (it overslept). Per command, because a decode step waits long
    // for GRAPH_COMPUTE's reply and then microseconds for the TENSOR_GET behind it: one guess
    // for both slept through the short wait for as long as the compute took (1B on a 16-core
    // host: 15 ms of a 60 ms token). Only a header's wait is predicted (expect_reply_to).
    std::array<uint32_t, kCmdMax + 1> expect_us_{};
    uint16_t expect_cmd_ = 0;  // 0: the next read is no header announced by expect_reply_to
    std::chrono::steady_clock::time_point beat_seen_;
    std::atomic<bool> stop_{false};
    std::thread ticker_;
};

}  // namespace ferry::remote
