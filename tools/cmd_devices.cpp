// ferry devices: lists every device with its type and memory.
#include <cstdio>

#include "cli.h"
#include "ferry/backend.h"
#include "ferry/remote.h"

namespace ferry::cli {
namespace {

int cmd_devices(int argc, char** argv) {
    Args args("devices",
              "usage: ferry devices [--remote ADDR ...]\n"
              "  Lists devices with their type and memory.\n",
              {{{"--remote"},
                "ADDR",
                "also list the devices of the `ferry serve` at ADDR (unix:PATH or\n"
                "tcp:HOST:PORT), named ADDR/NAME (repeatable)"}},
              argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    const std::vector<std::string> remotes = args.values({"--remote"});
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
    return 0;
}

}  // namespace
FERRY_COMMAND(devices, "devices", "list devices with their type and memory", cmd_devices);
}  // namespace ferry::cli
