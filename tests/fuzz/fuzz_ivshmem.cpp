// libFuzzer target over the ivshmem transport's host side: an IvshmemServer (the real ring
// reader, framing checks and Session) serves a window file in this process; each input is one
// guest session. The input is: u8 mode, then (mode & 1) u16 word + u64 value written into the
// header after the bytes (a guest scribbling a counter or the geometry), then the bytes the
// guest writes into the request ring (a valid HELLO is written first so inputs reach the
// Session). (mode & 2): the request head is published one byte at a time (a guest that trickles
// its requests). The target waits until the host consumed everything or ended the session, then
// detaches and waits for the session to be freed. See docs/remote-protocol.md for run commands.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "ferry/backend.h"
#include "remote-proto/ivshmem-window.h"
#include "remote-proto/protocol.h"
#include "remote-proto/wire.h"
#include "server/ivshmem-server.h"

using namespace ferry;
using namespace ferry::remote::ivshmem;

namespace {

struct Host {
    server::ServerOptions opts;
    server::ServerCounters counters;
    std::unique_ptr<server::IvshmemServer> srv;
    Window win;
    std::thread thread;
    uint32_t epoch = 0;

    Host() {
        opts.devices = {cpu_device()};
        opts.max_memory = 16u << 20;
        const std::string path = "/dev/shm/ferry-fuzz-ivshmem-" + std::to_string(getpid());
        auto s = server::IvshmemServer::open(path + ",size=256K", opts, &counters, 1000);
        if (!s) __builtin_trap();
        srv = std::move(*s);
        auto w = Window::open(path);
        if (!w) __builtin_trap();
        win = std::move(*w);
        thread = std::thread([this] { srv->run(); });
        unlink(path.c_str());  // both mappings stay
    }
};

bool wait_for(const std::function<bool()>& done, int ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!done()) {
        if (std::chrono::steady_clock::now() > end) return false;
        std::this_thread::yield();
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static Host* host = new Host();  // lives for the whole run
    Window& win = host->win;
    wire::Reader r(data, size);
    const uint8_t mode = size ? r.u8() : 0;
    uint16_t word = 0;
    uint64_t value = 0;
    if (mode & 1) {
        word = r.u16();
        value = r.u64();
    }
    const size_t n = r.ok() ? r.remaining() : 0;
    const uint8_t* body = n ? r.bytes(n) : nullptr;

    // Attach: a fresh epoch, acknowledged.
    host->epoch = new_epoch(host->epoch);
    const uint32_t e = host->epoch;
    win.word(kClientEpoch).store(e, std::memory_order_release);
    if (!wait_for([&] { return win.word(kServerAck).load() == ((uint64_t{e} << 32) | kAckOpen); },
                  5000)) {
        __builtin_trap();  // the host stopped serving new sessions
    }
    const uint64_t off = win.word(kReqOffWord).load(), cap = win.word(kReqCapWord).load();
    // HELLO, then the input, as much as fits in the ring (the host reads as it goes).
    wire::Writer hello;
    hello.u32(remote::kProtocolVersion);
    hello.u64(remote::kCapGraphCache | remote::kCapEvents);
    hello.str("");
    remote::Header h;
    h.cmd = static_cast<uint16_t>(remote::Cmd::HELLO);
    h.id = 1;
    h.len = hello.size();
    uint8_t hdr[remote::kHeaderSize];
    remote::write_header(hdr, h);
    uint64_t head = 0;
    auto put = [&](const void* p, size_t len, bool trickle) {
        const uint8_t* b = static_cast<const uint8_t*>(p);
        for (size_t i = 0; i < len;) {
            const uint64_t tail = win.word(kReqTail).load(std::memory_order_acquire);
            const uint64_t room = cap - (head - tail);
            if (room == 0) {
                if (win.word(kServerAck).load() != ((uint64_t{e} << 32) | kAckOpen)) return;
                std::this_thread::yield();
                continue;
            }
            const size_t take =
                trickle ? 1 : static_cast<size_t>(std::min<uint64_t>(room, len - i));
            ring_write(win.base() + off, cap, head, b + i, take);
            head += take;
            i += take;
            win.word(kReqHead).store(head, std::memory_order_release);
        }
    };
    put(hdr, sizeof(hdr), false);
    put(hello.data(), hello.size(), false);
    put(body, n, (mode & 2) != 0);
    if (mode & 1) {
        win.word((static_cast<uint64_t>(word) % (kHeaderBytes / 8)) * 8).store(value);
    }
    // Until the host took everything or ended the session (a partial frame waits for the I/O
    // timeout of 1 s: then the session ends too).
    wait_for(
        [&] {
            return win.word(kReqTail).load() == head ||
                   win.word(kServerAck).load() != ((uint64_t{e} << 32) | kAckOpen);
        },
        3000);
    // Detach and wait for the session (and its memory) to be gone.
    win.word(kClientEpoch).store(0, std::memory_order_release);
    if (!wait_for([&] { return win.word(kServerAck).load() != ((uint64_t{e} << 32) | kAckOpen); },
                  5000)) {
        __builtin_trap();  // the host hung in a session
    }
    return 0;
}
