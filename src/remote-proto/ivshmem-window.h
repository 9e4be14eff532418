// The ivshmem transport's shared-memory window: its layout (one header both sides include),
// the mapping of a window (a host file, or an ivshmem PCI device's BAR 2 inside a guest), the
// two byte rings in it and the polling backoff. docs/remote-protocol.md ("Transport: ivshmem
// window") is the full description; this header is its single source of numbers.
//
// A window carries the same frames as a socket, as two byte streams: the request ring (guest
// writes, host reads) and the reply ring (host writes, guest reads). Each ring has a head (bytes
// ever written) and a tail (bytes ever read), 64-bit counters that only grow, each written by
// one side only: the writer publishes data with a release store of head, the reader frees space
// with a release store of tail, and each loads the other's counter with acquire.
//
// Trust: the host never reads back a value it owns (its own counters, the geometry) from the
// window; it keeps private copies. Every counter it loads from the window is checked (a head
// more than a ring's capacity ahead, or a tail behind or ahead of what was written, ends the
// session), and every byte of a request is copied into private memory before it is parsed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/status.h"

namespace ferry::remote::ivshmem {

constexpr uint64_t kWindowMagic = 0x4e49575952524546ull;  // "FERRYWIN" little-endian
constexpr uint32_t kWindowVersion = 1;
constexpr uint64_t kHeaderBytes = 4096;  // the rings start here
constexpr uint64_t kMinWindow = 64u << 10;
constexpr uint64_t kDefaultWindow = 64u << 20;
constexpr uint64_t kMaxWindow = 64ull << 30;

// Byte offsets of the header's 64-bit words. Fields a side writes sit on cache lines of
// their own, so that polling one does not bounce the other's.
enum HeaderWord : uint64_t {
    kMagicWord = 0,      // kWindowMagic, written last by the host when it sets a window up
    kVersionWord = 8,    // u32 version | u32 header bytes << 32
    kSizeWord = 16,      // window bytes
    kReqOffWord = 24,    // request ring: offset in the window
    kReqCapWord = 32,    //               capacity in bytes
    kRepOffWord = 40,    // reply ring: offset
    kRepCapWord = 48,    //             capacity
    kClientEpoch = 128,  // guest: u32 epoch it asks for (0: detached)
    kClientBeat = 136,   // guest: heartbeat, +1 every kBeatMs
    kServerAck = 256,    // host: epoch << 32 | AckState
    kServerBeat = 264,   // host: heartbeat, +1 every kBeatMs
    kReqHead = 384,      // guest: request bytes written
    kReqTail = 512,      // host: request bytes consumed
    kRepHead = 640,      // host: reply bytes written
    kRepTail = 768,      // guest: reply bytes consumed
};

// Low 32 bits of kServerAck.
enum AckState : uint32_t {
    kAckNone = 0,    // no session
    kAckOpen = 1,    // a session for the epoch in the high 32 bits is being served
    kAckClosed = 2,  // the host ended that epoch's session (error, timeout, detach)
};

constexpr int kBeatMs = 100;             // heartbeat period, both sides
constexpr int kServerGoneMs = 5000;      // a guest gives up on a host heartbeat this old
constexpr int kAttachTimeoutMs = 10000;  // a guest waits this long for the host's answer
constexpr int kMagicWaitMs = 2000;       // and this long for a window to be set up

// A mapped window. Move-only; unmaps on destruction.
class Window {
  public:
    Window() = default;
    ~Window();
    Window(Window&& o) noexcept;
    Window& operator=(Window&& o) noexcept;
    Window(const Window&) = delete;
    Window& operator=(const Window&) = delete;

    // Host: creates PATH (or opens it), sizes it to `size` bytes (0: keep an existing file's
    // size, or kDefaultWindow for a new one), maps it shared.
    static Expected<Window> create(const std::string& path, uint64_t size);
    // Guest or host process: maps what `spec` names: "auto" (the first PCI device 1af4:1110),
    // a PCI address ("0000:00:04.0" or "00:04.0": its resource2 in sysfs), or a file path.
    static Expected<Window> open(const std::string& spec);

    uint8_t* base() const { return base_; }
    uint64_t size() const { return size_; }
    const std::string& what() const { return what_; }  // the file or device mapped
    std::atomic_ref<uint64_t> word(uint64_t off) const {
        return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base_ + off));
    }

  private:
    uint8_t* base_ = nullptr;
    uint64_t size_ = 0;
    std::string what_;
};

// Ring geometry for a window of `size` bytes: two equal rings after the header, each a
// multiple of 64 bytes.
struct Geometry {
    uint64_t req_off = 0, req_cap = 0, rep_off = 0, rep_cap = 0;
};
Geometry geometry_for(uint64_t size);

// Copies between private memory and a ring of `cap` bytes at `ring`, at stream position pos
// (wrapping).
void ring_read(const uint8_t* ring, uint64_t cap, uint64_t pos, void* dst, size_t n);
void ring_write(uint8_t* ring, uint64_t cap, uint64_t pos, const void* src, size_t n);

// Waiting without a doorbell: spins first (a reply usually comes within microseconds; a
// decode step's within hundreds where a core is to spare: spin_us()), then sleeps for growing
// short periods (longer ones once the wait is long, so an idle window costs
// little CPU). No yield phase (see Backoff::wait; FERRY_IVSHMEM_YIELD_US restores one).
class Backoff {
  public:
    // long_sleep_us: the sleep once a wait is long (over 50 ms).
    explicit Backoff(uint32_t long_sleep_us = 1000) : long_sleep_us_(long_sleep_us) {}
    void wait();
    void reset() { started_ = false; }
    // Milliseconds since the first wait() after the last reset.
    int64_t waited_ms() const;
    // How long a wait spins before it sleeps, in microseconds: 300 where the process may run
    // on four or more CPUs, else 20; FERRY_IVSHMEM_SPIN_US overrides.
    static int64_t spin_us();

  private:
    bool started_ = false;
    std::chrono::steady_clock::time_point start_;
    uint32_t spins_ = 0;
    uint32_t sleep_us_ = 0;
    uint32_t long_sleep_us_;
};

// Sleeps `us` microseconds with a 1 us timer slack (set once per thread).
void sleep_us(uint32_t us);

// Parses "PATH[,size=BYTES]" (BYTES may end in K, M or G) for `ferry serve --listen ivshmem:`.
Status parse_listen_spec(const std::string& spec, std::string* path, uint64_t* size);

// A 32-bit epoch that is not 0 and not `avoid`.
uint32_t new_epoch(uint32_t avoid);

}  // namespace ferry::remote::ivshmem
