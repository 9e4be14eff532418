// libFuzzer target over the remote server's request decoder and validator: a Session on the
// CPU device receives HELLO, then the frames cut from the input (u16 cmd, u32 len, payload).
// Handles are predictable (session 1: 0x100000001, 0x100000002, ...) so the fuzzer can reach
// the graph validator with live buffers. Buffer and event handles come from one counter, in
// the order of the successful BUFFER_ALLOC / EVENT_NEW frames, so the event commands (16..20:
// EVENT_NEW u32 dev, EVENT_FREE u64 event, EVENT_RECORD u64 event + u32 dev, EVENT_WAIT u32 dev
// + u64 event, EVENT_SYNCHRONIZE u64 event) reach live events the same way. The CPU device has
// events.
//
// Frames with cmd 0xFFFF are a compact graph description that becomes a GRAPH_COMPUTE (mode 0)
// on device 0, so that shapes the byte-level mutator rarely assembles are reached directly:
// u8 n (1..8 entries), then per entry u8 op, u8 type, u8 handle index (0: none, k: the k-th
// handle), u8 offset, 4 x (u8 extent selector, u8 stride selector), 4 x u8 source (0xFF none),
// u8 view source (0xFF none), i32 op_params[0..1]. Extents come from a table of edge values
// (0, 1, 2, 32, 4096, 2^31, 2^32 + 1, 2^40, 2^62, INT64_MAX, -1, ...); a stride selector 0 is
// a zero stride, 1 the contiguous stride, others edge values. Work is capped (max_work) so a
// huge but valid graph is refused instead of timing out.
// See docs/remote-protocol.md for the run command.
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "remote-proto/protocol.h"
#include "remote-proto/wire.h"
#include "ferry/backend.h"
#include "ferry/backends.h"
#include "server/session.h"

using namespace ferry;

namespace {

constexpr int64_t kExtents[] = {0,         1,
                                2,         3,
                                32,        64,
                                4096,      65536,
                                1ll << 31, (1ll << 32) + 1,
                                1ll << 40, 1ll << 62,
                                INT64_MAX, -1,
                                INT64_MIN, (1ll << 21) + 3};
constexpr uint64_t kStrides[] = {0,          0,          1,          2, 4,  8,  64,  4096,
                                 1ull << 32, 1ull << 63, UINT64_MAX, 3, 18, 34, 128, 1ull << 40};

// Builds a GRAPH_COMPUTE (mode 0, device 0) payload from the compact description at r.
bool compact_graph(wire::Reader& r, wire::Writer* out) {
    const uint32_t n = 1 + r.u8() % 8;
    out->u32(0);
    out->u8(remote::kGraphFull);
    out->u32(n);
    for (uint32_t i = 0; i < n; i++) {
        remote::Entry e;
        e.op = r.u8() % static_cast<uint32_t>(Op::COUNT);
        const uint8_t type = r.u8();
        e.type = type % 16;
        const uint8_t h = r.u8();
        e.handle = h ? (1ull << 32) + h : 0;
        e.offs = r.u8() * 4ull;
        uint64_t contiguous =
            type_traits_or_null(e.type) ? type_traits_or_null(e.type)->type_size : 4;
        for (int d = 0; d < kMaxDims; d++) {
            const uint8_t es = r.u8(), ss = r.u8();
            e.ne[d] = kExtents[es % 16];
            e.nb[d] = ss % 16 == 1 ? contiguous : kStrides[ss % 16];
            contiguous *= static_cast<uint64_t>(e.ne[d] > 0 ? e.ne[d] : 1);
        }
        for (int k = 0; k < kMaxSrc; k++) {
            const uint8_t s = r.u8();
            e.src[k] = s == 0xFF ? -1 : s % 8;
        }
        const uint8_t v = r.u8();
        e.view_src = v == 0xFF ? -1 : v % 8;
        e.op_params[0] = r.i32();
        e.op_params[1] = r.i32();
        if (!r.ok()) return false;
        remote::write_entry(*out, e);
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static server::ServerOptions opts = [] {
        server::ServerOptions o;
        init_backends();
        o.devices = {cpu_device()};
        o.max_memory = 16u << 20;
        o.max_work = 1u << 24;  // refuses what would run for long (the server's own defence)
        return o;
    }();
    static server::ServerCounters counters;
    counters.next_session.store(1);
    server::Session session(opts, &counters, /*shared_memory=*/true);
    server::Reply reply;
    wire::Writer hello;
    hello.u32(remote::kProtocolVersion);
    hello.u64(remote::kCapGraphCache | remote::kCapSharedMemory | remote::kCapEvents);
    hello.str("");
    session.handle(static_cast<uint16_t>(remote::Cmd::HELLO), hello.data(), hello.size(), &reply);
    wire::Reader r(data, size);
    int frames = 0;
    while (r.remaining() >= 6 && frames++ < 64) {
        const uint16_t cmd = r.u16();
        if (cmd == 0xFFFF) {
            wire::Writer g;
            if (!compact_graph(r, &g)) break;
            session.handle(static_cast<uint16_t>(remote::Cmd::GRAPH_COMPUTE), g.data(), g.size(),
                           &reply);
            continue;
        }
        uint64_t len = r.u32();
        if (len > r.remaining()) len = r.remaining();
        const uint8_t* p = r.bytes(len);
        session.handle(cmd, p, static_cast<size_t>(len), &reply);
        if (reply.pass_fd >= 0) close(reply.pass_fd);
    }
    return 0;
}
