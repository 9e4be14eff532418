// The remote protocol: framing, commands, capability bits and the tensor-table entry layout.
// docs/remote-protocol.md is the full description; this header is its single source of
// numbers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/tensor.h"
#include "remote-proto/wire.h"

namespace ferry::remote {

constexpr uint32_t kMagic = 0x31595246u;  // "FRY1" little-endian
// Version 2 added ALLOC_SIZE, INIT_TENSOR, the device caps bits 8/16/32 and the longer
// SESSION_STATS record. A version 2 server still serves version 1 clients (answering their
// SESSION_STATS with the 11 fields they expect). Version 3 added PREPARE_WEIGHTS and the
// device caps bit 64. Version 4 added GRAPH_COMPUTE's inputs section (kGraphInputs): the
// small input writes of a step travel in the compute's own frame. A server serves every
// version from kMinProtocolVersion to its own.
constexpr uint32_t kProtocolVersion = 4;
constexpr uint32_t kMinProtocolVersion = 1;

// Frame header (24 bytes, little-endian), followed by `len` payload bytes.
//   u32 magic, u16 cmd, u16 flags, u64 id, u64 len
constexpr size_t kHeaderSize = 24;
// Largest payload either side accepts. Bulk transfers are split into chunks below it.
constexpr uint64_t kMaxPayload = 256ull << 20;
constexpr uint64_t kMaxChunk = 64ull << 20;

enum FrameFlags : uint16_t {
    kFlagReply = 1u,  // a reply to the request with the same id and cmd
    kFlagError = 2u,  // reply payload is a u32-length error message
    // A reply whose payload is split over the session's stripe connections (STRIPES): the
    // frame's connection carries the header and stripe 0, joined connection i stripe i (see
    // stripe_parts); only successful TENSOR_GET replies of at least kStripeMin bytes.
    kFlagStriped = 4u,
};

enum class Cmd : uint16_t {
    HELLO =
        1,  // u32 version, u64 caps, str token -> u32 version, u64 caps, u64 session, str server
    LIST_DEVICES = 2,    // -> u32 n, n x device record
    DEVICE_MEMORY = 3,   // u32 dev -> u64 free, u64 total
    SUPPORTS_OP = 4,     // u32 dev, tensor table (last entry = the node) -> u8 supported
    BUFFER_ALLOC = 5,    // u32 dev, u8 kind, u64 size -> u64 handle, u64 size, u8 mappable (+ fd)
    BUFFER_FREE = 6,     // u64 handle -> (empty)
    BUFFER_CLEAR = 7,    // u64 handle, u8 value -> (empty)
    TENSOR_SET = 8,      // u64 handle, u64 offset, u64 size, bytes -> (empty)
    TENSOR_GET = 9,      // u64 handle, u64 offset, u64 size -> bytes
    TENSOR_MEMSET = 10,  // u64 handle, u64 offset, u64 size, u8 value -> (empty)
    TENSOR_COPY = 11,    // u64 src, u64 src_off, u64 dst, u64 dst_off, u64 size -> (empty)
    GRAPH_COMPUTE = 12,  // u32 dev, u8 mode, ... (see docs) -> u64 table hash
    SYNCHRONIZE = 13,    // u32 dev -> (empty)
    SESSION_STATS = 14,  // -> stats record
    PING = 15,           // -> (empty)
    // Events (server-side): handles like buffer handles (session id in the high 32 bits).
    EVENT_NEW = 16,          // u32 dev -> u64 event handle
    EVENT_FREE = 17,         // u64 event -> (empty)
    EVENT_RECORD = 18,       // u64 event, u32 dev -> (empty)
    EVENT_WAIT = 19,         // u32 dev, u64 event -> (empty)
    EVENT_SYNCHRONIZE = 20,  // u64 event -> (empty), once the recorded point has passed
    // Version 2.
    ALLOC_SIZE = 21,   // u32 dev, u8 kind, entry (a leaf) -> u64 bytes the tensor needs
    INIT_TENSOR = 22,  // u64 handle, entry (a leaf at entry offset) -> (empty)
    // Version 3.
    PREPARE_WEIGHTS = 23,  // u32 dev, u32 n, n entries (leaves in dev's buffers) -> (empty)
    // kCapStripes (tcp). STRIPE_JOIN is the first (and only) request of an extra connection:
    //   u32 version, str token, u64 session, kStripeKeyBytes key (from the session's HELLO
    //   reply), u8 index (1..kMaxStripes-1) -> (empty)
    // after which that connection only carries stripe index of striped replies. STRIPES on
    // the session's own connection: u8 n (2..kMaxStripes; connections 1..n-1 joined) ->
    // (empty); from then on every successful TENSOR_GET reply of at least kStripeMin bytes
    // is striped over n connections (kFlagStriped). Once per session.
    STRIPE_JOIN = 24,
    STRIPES = 25,
};
constexpr uint16_t kCmdMax = 25;
const char* cmd_name(uint16_t cmd);

// Capability bits (HELLO). The server answers with the intersection of what both offer.
enum Caps : uint64_t {
    kCapSharedMemory = 1ull << 0,  // host buffers are memfd shared memory, fd in the alloc reply
    kCapGraphCache = 1ull << 1,    // GRAPH_COMPUTE mode 1 (delta against a cached table)
    kCapEvents = 1ull << 2,        // EVENT_* commands (server-side events)
    // tcp: the HELLO reply ends with a kStripeKeyBytes key, with which extra connections may
    // join the session to carry stripes of large replies (STRIPE_JOIN, STRIPES), in the
    // interleaved layout of stripe_parts. (Bit 3 was the first form, one contiguous part per
    // stripe; no longer offered or granted, so that builds of the two forms never stripe.)
    kCapStripes = 1ull << 4,
};

// Striped replies: one tcp connection moves ~8.6 GB/s on the H200 host's loopback (its bytes
// are copied by one core on each side; bench/bench_tcp_stripes); n connections served by n
// threads on each side move them in parallel. A payload of len bytes over n connections is cut
// into chunks of stripe_chunk(len, n) bytes (whole 4 KiB pages, at least 32 KiB, at most
// kStripeChunksEach per stripe), chunk j on stripe j % n: interleaved, so that the bytes of a
// reply the server sends as they are produced (progressive reads) keep every stripe busy, not
// the first stripe while the first part is made and the last while the rest is (measured on
// the H200, stop 32: contiguous stripes sent a step's logits ~30-45 us after the last piece).
constexpr int kMaxStripes = 8;
constexpr uint64_t kStripeMin = 256u << 10;
constexpr size_t kStripeKeyBytes = 16;
constexpr uint64_t kStripeChunkMin = 32u << 10;
constexpr uint64_t kStripeChunksEach = 32;
inline uint64_t stripe_chunk(uint64_t len, int n) {
    const uint64_t per = len / (static_cast<uint64_t>(n) * kStripeChunksEach);
    const uint64_t c = (per + 4095) & ~uint64_t{4095};
    return c > kStripeChunkMin ? c : kStripeChunkMin;
}
// Calls f(offset, size) for each part of stripe i (of n) of a len-byte payload that lies in
// [from, to), in order (one part for n == 1).
template <class F>
void stripe_parts(uint64_t len, int n, int i, uint64_t from, uint64_t to, F&& f) {
    if (to > len) to = len;
    if (from >= to) return;
    if (n <= 1) {
        f(from, to - from);
        return;
    }
    const uint64_t c = stripe_chunk(len, n), nn = static_cast<uint64_t>(n);
    uint64_t j = from / c;
    j += (static_cast<uint64_t>(i) + nn - j % nn) % nn;  // the stripe's first chunk from there
    for (; j * c < to; j += nn) {
        const uint64_t b = j * c > from ? j * c : from, e = (j + 1) * c < to ? (j + 1) * c : to;
        f(b, e - b);
    }
}
// The first byte at or after `at` that stripe i carries (len when none).
inline uint64_t stripe_next(uint64_t len, int n, int i, uint64_t at) {
    uint64_t next = len;
    bool found = false;
    stripe_parts(len, n, i, at, len, [&](uint64_t off, uint64_t) {
        if (!found) next = off, found = true;
    });
    return next;
}

// Device record caps bits (LIST_DEVICES, u8).
constexpr uint8_t kDeviceCapAsync = 1;            // the device's caps().async
constexpr uint8_t kDeviceCapEvents = 2;           // caps().events: EVENT_* work on this device
constexpr uint8_t kDeviceCapSharedMemory = 4;     // host buffers are shared memory (unix sockets)
constexpr uint8_t kDeviceCapPaddedAlloc = 8;      // caps().padded_alloc: ask ALLOC_SIZE
constexpr uint8_t kDeviceCapInitTensor = 16;      // caps().init_tensor: send INIT_TENSOR
constexpr uint8_t kDeviceCapSizeDependent = 32;   // caps().size_dependent: supports_op by size
constexpr uint8_t kDeviceCapPrepareWeights = 64;  // caps().prepare_weights: PREPARE_WEIGHTS
constexpr uint8_t kDeviceCapGraphReplay = 128;    // caps().graph_replay (advice only)

// BUFFER_ALLOC kinds.
constexpr uint8_t kBufferDevice = 0;  // the device's buffer_type()
constexpr uint8_t kBufferHost = 1;    // the device's host_buffer_type()
// The device's buffer_type() in server memory the client does not map (weights: written
// once through TENSOR_SET, then only read by the device; on the CPU that memory can use huge
// pages, which shared memory here cannot).
constexpr uint8_t kBufferDevicePrivate = 2;

// GRAPH_COMPUTE modes (the low bits of the mode byte).
constexpr uint8_t kGraphFull = 0;  // u32 n, n entries
constexpr uint8_t kGraphDelta =
    1;  // u64 base hash, u32 n, u32 n_changed, n_changed x (u32 idx, entry)
// Mode flag (version 4): the mode byte is followed by the step's input writes, applied in
// order before the graph runs, as TENSOR_SETs sent just before it would be:
//   u32 n (1..kMaxComputeInputs), n x (u64 handle, u64 offset, u64 size, size bytes)
// then the table part of the mode's low bits.
constexpr uint8_t kGraphInputs = 0x80;
constexpr uint32_t kMaxComputeInputs = 256;
// Writes the client folds into the next GRAPH_COMPUTE: each at most this many bytes (larger
// ones go as TENSOR_SET frames), at most kMaxComputeInputs of them and kMaxFoldedBytes in
// all (the held ones are sent as TENSOR_SET frames first when one more would not fit).
constexpr size_t kMaxFoldedInput = 32u << 10;
constexpr size_t kMaxFoldedBytes = 256u << 10;

// Limits the server enforces on tables.
constexpr uint32_t kMaxTableEntries = 1u << 18;  // 262144 tensors
// Prepared weights a session may hold (PREPARE_WEIGHTS beyond it is an error); each is
// charged kTensorCharge.
constexpr uint32_t kMaxPreparedWeights = 1u << 16;
// Graph tables a session keeps (LRU). Clients track at most kClientGraphCache of them so a
// base they name is always still cached on the server.
constexpr size_t kServerGraphCache = 16;
constexpr size_t kClientGraphCache = 8;
// Live events a session may hold (EVENT_NEW beyond it is an error).
constexpr size_t kMaxSessionEvents = 4096;
// Live buffers a session may hold (BUFFER_ALLOC beyond it is an error): each costs the server
// a mapping or an allocation, whatever its size.
constexpr size_t kMaxSessionBuffers = 4096;
// What a session is charged against its memory limit (--max-memory) besides its buffers'
// bytes: every buffer whole pages, at least one (a zero-byte buffer still costs a mapping);
// each live event kEventCharge bytes; each cached graph its table bytes plus kTensorCharge
// per entry (the deserialized tensors and graph lists); kernel scratch at its real size.
constexpr uint64_t kPageCharge = 4096;
constexpr uint64_t kEventCharge = 256;
constexpr uint64_t kTensorCharge = 384;
// SESSION_STATS fields: version 1 sessions get the first 11, version 2 all of them.
constexpr int kStatsFieldsV1 = 11;
constexpr int kStatsFields = 19;

// One tensor-table entry, exactly kEntrySize bytes on the wire:
//   u64 buffer handle (0: none; ignored for views), u64 offset in the buffer,
//   u32 type, i64 ne[4], u64 nb[4], u32 op, i32 op_params[8],
//   i32 src[4] (entry index, -1 none), i32 view_src (entry index, -1 none), u64 view_offs,
//   u32 flags
// Sources and view sources must refer to earlier entries (no cycles, no forward references).
struct Entry {
    uint64_t handle = 0;
    uint64_t offs = 0;
    uint32_t type = 0;
    int64_t ne[kMaxDims] = {};
    uint64_t nb[kMaxDims] = {};
    uint32_t op = 0;
    int32_t op_params[kMaxOpParams] = {};
    int32_t src[kMaxSrc] = {-1, -1, -1, -1};
    int32_t view_src = -1;
    uint64_t view_offs = 0;
    uint32_t flags = 0;
};
constexpr size_t kEntrySize =
    8 + 8 + 4 + 8 * kMaxDims + 8 * kMaxDims + 4 + 4 * kMaxOpParams + 4 * kMaxSrc + 4 + 8 + 4;

inline void write_entry(wire::Writer& w, const Entry& e) {
    w.u64(e.handle);
    w.u64(e.offs);
    w.u32(e.type);
    for (int i = 0; i < kMaxDims; i++) w.i64(e.ne[i]);
    for (int i = 0; i < kMaxDims; i++) w.u64(e.nb[i]);
    w.u32(e.op);
    for (int i = 0; i < kMaxOpParams; i++) w.i32(e.op_params[i]);
    for (int i = 0; i < kMaxSrc; i++) w.i32(e.src[i]);
    w.i32(e.view_src);
    w.u64(e.view_offs);
    w.u32(e.flags);
}

inline Entry read_entry(wire::Reader& r) {
    Entry e;
    e.handle = r.u64();
    e.offs = r.u64();
    e.type = r.u32();
    for (int i = 0; i < kMaxDims; i++) e.ne[i] = r.i64();
    for (int i = 0; i < kMaxDims; i++) e.nb[i] = r.u64();
    e.op = r.u32();
    for (int i = 0; i < kMaxOpParams; i++) e.op_params[i] = r.i32();
    for (int i = 0; i < kMaxSrc; i++) e.src[i] = r.i32();
    e.view_src = r.i32();
    e.view_offs = r.u64();
    e.flags = r.u32();
    return e;
}

// Frame header encode/decode.
struct Header {
    uint32_t magic = kMagic;
    uint16_t cmd = 0;
    uint16_t flags = 0;
    uint64_t id = 0;
    uint64_t len = 0;
};

inline void write_header(uint8_t out[kHeaderSize], const Header& h) {
    wire::Writer w;
    w.u32(h.magic);
    w.u16(h.cmd);
    w.u16(h.flags);
    w.u64(h.id);
    w.u64(h.len);
    std::memcpy(out, w.data(), kHeaderSize);
}

inline Header read_header(const uint8_t in[kHeaderSize]) {
    wire::Reader r(in, kHeaderSize);
    Header h;
    h.magic = r.u32();
    h.cmd = r.u16();
    h.flags = r.u16();
    h.id = r.u64();
    h.len = r.u64();
    return h;
}

}  // namespace ferry::remote
