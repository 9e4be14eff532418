// libFuzzer target over the remote server's request decoder and validator: a Session on the
// CPU device receives HELLO, then the frames cut from the input (u16 cmd, u32 len, payload).
// Handles are predictable (session 1: 0x100000001, 0x100000002, ...) so the fuzzer can reach
// the graph validator with live buffers. Buffer and event handles come from one counter, in
// the order of the successful BUFFER_ALLOC / EVENT_NEW frames, so the event commands (16..20:
// EVENT_NEW u32 dev, EVENT_FREE u64 event, EVENT_RECORD u64 event + u32 dev, EVENT_WAIT u32 dev
// + u64 event, EVENT_SYNCHRONIZE u64 event) reach live events the same way. The CPU device has
// events. See docs/remote-protocol.md for the run command.
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "remote-proto/protocol.h"
#include "remote-proto/wire.h"
#include "ferry/backend.h"
#include "ferry/backends.h"
#include "server/session.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static server::ServerOptions opts = [] {
        server::ServerOptions o;
        init_backends();
        o.devices = {cpu_device()};
        o.max_memory = 16u << 20;
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
        uint64_t len = r.u32();
        if (len > r.remaining()) len = r.remaining();
        const uint8_t* p = r.bytes(len);
        session.handle(cmd, p, static_cast<size_t>(len), &reply);
        if (reply.pass_fd >= 0) close(reply.pass_fd);
    }
    return 0;
}
