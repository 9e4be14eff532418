// ferry: run models on any device. `ferry help` lists the commands.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"
#include "ferry/backends.h"

namespace {

void usage(FILE* out) {
    std::fprintf(out, "usage: ferry <command> [options]\n\ncommands:\n");
    for (const auto& c : ferry::cli::commands())
        std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
    std::fprintf(out,
                 "\n`ferry <command> --help` (or `ferry help <command>`) lists a command's "
                 "options; `ferry --version` prints the version.\n");
}

const ferry::cli::Command* find_command(const char* name) {
    for (const auto& c : ferry::cli::commands()) {
        if (std::strcmp(c.name, name) == 0) return &c;
    }
    return nullptr;
}

int cmd_version(int argc, char** argv) {
    ferry::cli::Args args("version", "usage: ferry version\n  Prints the version and build.\n", {},
                          argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    if (ferry::Status st = args.finish(); !st) return ferry::cli::fail("version", st.message());
    std::printf("%s\n", ferry::cli::version_string().c_str());
    return 0;
}

}  // namespace

FERRY_COMMAND(version, "version", "print the version (also `ferry --version`)", cmd_version);

int main(int argc, char** argv) {
    ferry::init_backends();
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    const char* first = argv[1];
    if (std::strcmp(first, "--version") == 0) {
        std::printf("%s\n", ferry::cli::version_string().c_str());
        return 0;
    }
    if (std::strcmp(first, "help") == 0 || std::strcmp(first, "--help") == 0 ||
        std::strcmp(first, "-h") == 0) {
        if (argc >= 3) {  // `ferry help run` is `ferry run --help`
            const ferry::cli::Command* c = find_command(argv[2]);
            if (!c) {
                std::fprintf(stderr, "ferry: unknown command '%s'\n", argv[2]);
                return 1;
            }
            char help_flag[] = "--help";
            char* sub[] = {argv[2], help_flag, nullptr};
            return c->fn(2, sub);
        }
        usage(stdout);
        return 0;
    }
    if (const ferry::cli::Command* c = find_command(first)) return c->fn(argc - 1, argv + 1);
    std::fprintf(stderr, "ferry: unknown command '%s'\n", first);
    usage(stderr);
    return 1;
}
