// ferry: run models on any device. `ferry help` lists the commands.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"
#include "ferry/backends.h"

namespace {

void usage() {
    std::printf("usage: ferry <command> [options]\n\ncommands:\n");
    for (const auto& c : ferry::cli::commands()) std::printf("  %-12s %s\n", c.name, c.summary);
    std::printf("\n`ferry <command> --help` describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
    ferry::init_backends();
    if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
        std::strcmp(argv[1], "-h") == 0) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    for (const auto& c : ferry::cli::commands()) {
        if (std::strcmp(c.name, argv[1]) == 0) return c.fn(argc - 1, argv + 1);
    }
    std::fprintf(stderr, "ferry: unknown command '%s'\n", argv[1]);
    usage();
    return 1;
}
