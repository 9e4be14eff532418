// ferry devices: lists every device with its type and memory.
#include <cstdio>

#include "cli.h"
#include "ferry/backend.h"
#include "ferry/remote.h"

namespace ferry::cli {
namespace {

int cmd_devices(int argc, char** argv) {
    Args args("devices",
              "usage: ferry devices [--remote ADDR ...] [--stats]\n"
              "  Lists devices with their type and memory.\n",
              {{{"--remote"},
                "ADDR",
                "also list the devices of the `ferry serve` at ADDR (unix:PATH,\n"
                "tcp:HOST:PORT or ivshmem:...), named ADDR/NAME (repeatable)"},
               {{"--stats"},
                nullptr,
                "also print each remote server's totals over all its sessions (sessions,\n"
                "bytes and buffers held), as this new session sees them"}},
              argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    const std::vector<std::string> remotes = args.values({"--remote"});
    const bool stats = args.flag({"--stats"});
    if (Status st = args.finish(); !st) return fail("devices", st.message());
    for (const std::string& addr : remotes) {
        if (Status st = remote_connect(addr); !st) return fail("devices", st.message());
    }
    std::printf("%-24s %-7s %12s %12s  %s\n", "device", "type", "free MiB", "total MiB",
                "description");
    for (Device* d : all_devices()) {
        const DeviceMemory m = d->memory();
        std::printf("%-24s %-7s %12.0f %12.0f  %s\n", d->name(), device_type_name(d->type()),
                    m.free / 1048576.0, m.total / 1048576.0, d->description().c_str());
    }
    for (const std::string& addr : remotes) {
        if (!stats) break;
        Expected<RemoteStats> s = remote_stats(addr);
        if (!s) return fail("devices", s.message());
        std::printf("%s: server sessions %llu, bytes %llu, buffers %llu (this session: id %llu)\n",
                    addr.c_str(), static_cast<unsigned long long>(s->server_sessions),
                    static_cast<unsigned long long>(s->server_bytes),
                    static_cast<unsigned long long>(s->server_buffers),
                    static_cast<unsigned long long>(s->session_id));
    }
    return 0;
}

}  // namespace
FERRY_COMMAND(devices, "devices", "list devices with their type and memory", cmd_devices);
}  // namespace ferry::cli
