// ferry serve: hosts local devices for remote clients (API remoting).
#include <cstdio>
#include <cstdlib>

#include "cli.h"
#include "ferry/backend.h"
#include "server/server.h"

namespace ferry::cli {
namespace {

int cmd_serve(int argc, char** argv) {
    Args args("serve",
              "usage: ferry serve --listen ADDR [options]\n"
              "  Hosts local devices for `--remote ADDR` clients. Prints\n"
              "  'ferry serve: listening on ADDR' once ready.\n",
              {
                  {{"-l", "--listen"},
                   "ADDR",
                   "unix:PATH (shared memory buffers, fd passing) or tcp:HOST:PORT\n"
                   "(data inline; port 0 picks a free port). A tcp address other than\n"
                   "loopback requires a token."},
                  {{"-d", "--device"},
                   "NAME",
                   "a device to serve (repeatable; default: every local device)"},
                  {{"--token"}, "T", "token clients must present in HELLO (default: $FERRY_TOKEN)"},
                  {{"--max-memory"},
                   "BYTES",
                   "per-session limit on buffer bytes (default: physical memory)"},
                  {{"--max-sessions"}, "N", "sessions at once, all clients (default 64)"},
                  {{"--max-sessions-per-client"},
                   "N",
                   "sessions at once per client: per uid on unix sockets, per IP\n"
                   "address on tcp (default 16)"},
                  {{"--io-timeout"},
                   "SECONDS",
                   "seconds a started frame, or a reply being sent, may stall before\n"
                   "the session is closed (default 30; 0: never). Idle clients are kept."},
                  {{"-t", "--threads"}, "N", "CPU threads per client session (default: all cores)"},
                  {{"-v", "--verbose"}, nullptr, "log sessions and requests to stderr"},
              },
              argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    std::optional<std::string> listen = args.value({"-l", "--listen"});
    std::vector<std::string> names = args.values({"-d", "--device"});
    std::optional<std::string> token = args.value({"--token"});
    std::optional<long long> max_mem = args.integer({"--max-memory"});
    std::optional<long long> threads = args.integer({"-t", "--threads"});
    std::optional<long long> max_sessions = args.integer({"--max-sessions"});
    std::optional<long long> per_client = args.integer({"--max-sessions-per-client"});
    std::optional<long long> io_timeout = args.integer({"--io-timeout"});
    const bool verbose = args.flag({"-v", "--verbose"});
    if (Status st = args.finish(); !st) return fail("serve", st.message());
    if (!listen) return fail("serve", "--listen ADDR is required (unix:PATH or tcp:HOST:PORT)");

    server::ServerOptions opts;
    opts.verbose = verbose;
    if (threads) {
        if (*threads <= 0 || *threads > 1024) return fail("serve", "--threads must be 1..1024");
        opts.n_threads = static_cast<int>(*threads);
    }
    if (token) {
        opts.token = *token;
    } else if (const char* env = std::getenv("FERRY_TOKEN")) {
        opts.token = env;
    }
    if (max_mem) {
        if (*max_mem <= 0) return fail("serve", "--max-memory must be positive");
        opts.max_memory = static_cast<uint64_t>(*max_mem);
    } else {
        const DeviceMemory m = cpu_device()->memory();
        opts.max_memory = m.total;
    }
    if (names.empty()) {
        for (Device* d : all_devices()) {
            if (d->type() != DeviceType::REMOTE) opts.devices.push_back(d);
        }
    } else {
        for (const std::string& n : names) {
            Device* d = find_device(n);
            if (!d) return fail("serve", "no device named '" + n + "' (see `ferry devices`)");
            if (d->type() == DeviceType::REMOTE) {
                return fail("serve", "cannot serve remote device '" + n + "'");
            }
            opts.devices.push_back(d);
        }
    }
    server::ConnectionLimits limits;
    if (max_sessions) {
        if (*max_sessions <= 0 || *max_sessions > 100000) {
            return fail("serve", "--max-sessions must be 1..100000");
        }
        limits.max_sessions = static_cast<int>(*max_sessions);
    }
    if (per_client) {
        if (*per_client <= 0 || *per_client > 100000) {
            return fail("serve", "--max-sessions-per-client must be 1..100000");
        }
        limits.max_sessions_per_client = static_cast<int>(*per_client);
    }
    if (io_timeout) {
        if (*io_timeout < 0 || *io_timeout > 86400) {
            return fail("serve", "--io-timeout must be 0..86400 seconds");
        }
        limits.io_timeout_ms = static_cast<int>(*io_timeout * 1000);
    }
    server::Server srv(std::move(opts), limits);
    std::string bound;
    if (Status st = srv.listen(*listen, &bound); !st) return fail("serve", st.message());
    std::printf("ferry serve: listening on %s\n", bound.c_str());
    std::fflush(stdout);
    if (Status st = srv.run(); !st) return fail("serve", st.message());
    return 0;
}

}  // namespace
FERRY_COMMAND(serve, "serve", "host local devices for remote clients (--listen ADDR)", cmd_serve);
}  // namespace ferry::cli
