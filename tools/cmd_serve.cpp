// ferry serve: hosts local devices for remote clients (API remoting).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "cli.h"
#include "ferry/backend.h"
#include "server/ivshmem-server.h"
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
                   "loopback requires a token. Or ivshmem:PATH[,size=BYTES]: a shared-\n"
                   "memory window (created if missing; default 64M) that a QEMU guest\n"
                   "maps as an ivshmem device, or a host process as a file\n"
                   "(docs/vm-guest.md). Repeatable: any number of ivshmem windows (one\n"
                   "client each) and at most one unix: or tcp: address."},
                  {{"-d", "--device"},
                   "NAME",
                   "a device to serve (repeatable; default: every local device)"},
                  {{"--token"}, "T", "token clients must present in HELLO (default: $FERRY_TOKEN)"},
                  {{"--max-memory"},
                   "BYTES",
                   "per-session limit on everything a session holds: buffers (whole\n"
                   "pages), kernel scratch, cached graphs, events (default: physical memory)"},
                  {{"--max-scratch"},
                   "BYTES",
                   "per-session limit on kernel scratch (default: --max-memory only)"},
                  {{"--max-work"},
                   "N",
                   "estimated operations one graph compute may ask for; larger graphs are\n"
                   "refused before they run (default 2^48; 0: no limit)"},
                  {{"--max-sessions"}, "N", "sessions at once, all clients (default 64)"},
                  {{"--max-sessions-per-client"},
                   "N",
                   "sessions at once per client: per uid on unix sockets, per host on\n"
                   "tcp: all of 127.0.0.0/8 is one client, IPv6 by /64 (default 16)"},
                  {{"--io-timeout"},
                   "SECONDS",
                   "seconds a started frame may take to arrive in full, or a reply to be\n"
                   "taken by the client, before the session is closed (default 30;\n"
                   "0: never). Idle clients are kept."},
                  {{"--hello-timeout"},
                   "SECONDS",
                   "seconds a new connection has to complete its HELLO (token checked);\n"
                   "only then does it take a session slot (default 5)"},
                  {{"-t", "--threads"}, "N", "CPU threads per client session (default: all cores)"},
                  {{"-v", "--verbose"}, nullptr, "log sessions and requests to stderr"},
              },
              argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    std::vector<std::string> listens = args.values({"-l", "--listen"});
    std::vector<std::string> names = args.values({"-d", "--device"});
    std::optional<std::string> token = args.value({"--token"});
    std::optional<long long> max_mem = args.integer({"--max-memory"});
    std::optional<long long> threads = args.integer({"-t", "--threads"});
    std::optional<long long> max_sessions = args.integer({"--max-sessions"});
    std::optional<long long> per_client = args.integer({"--max-sessions-per-client"});
    std::optional<long long> io_timeout = args.integer({"--io-timeout"});
    std::optional<long long> hello_timeout = args.integer({"--hello-timeout"});
    std::optional<long long> max_work = args.integer({"--max-work"});
    std::optional<long long> max_scratch = args.integer({"--max-scratch"});
    const bool verbose = args.flag({"-v", "--verbose"});
    if (Status st = args.finish(); !st) return fail("serve", st.message());
    if (listens.empty()) {
        return fail("serve",
                    "--listen ADDR is required (unix:PATH, tcp:HOST:PORT or ivshmem:PATH)");
    }
    std::optional<std::string> listen;
    std::vector<std::string> windows;
    for (const std::string& l : listens) {
        if (l.rfind("ivshmem:", 0) == 0) {
            windows.push_back(l.substr(8));
        } else if (listen) {
            return fail("serve", "at most one unix: or tcp: address per server ('" + *listen +
                                     "' and '" + l + "')");
        } else {
            listen = l;
        }
    }

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
    opts.max_work = 1ull << 48;
    if (max_work) {
        if (*max_work < 0) return fail("serve", "--max-work must be 0 (no limit) or positive");
        opts.max_work = static_cast<uint64_t>(*max_work);
    }
    if (max_scratch) {
        if (*max_scratch <= 0) return fail("serve", "--max-scratch must be positive");
        opts.max_scratch = static_cast<uint64_t>(*max_scratch);
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
    if (hello_timeout) {
        if (*hello_timeout <= 0 || *hello_timeout > 3600) {
            return fail("serve", "--hello-timeout must be 1..3600 seconds");
        }
        limits.hello_timeout_ms = static_cast<int>(*hello_timeout * 1000);
    }
    // Windows first (each on a thread of its own), then the socket, if any, on this thread.
    server::Server srv(std::move(opts), limits);
    std::vector<std::unique_ptr<server::IvshmemServer>> served;
    std::vector<std::thread> window_threads;
    for (const std::string& w : windows) {
        Expected<std::unique_ptr<server::IvshmemServer>> s = server::IvshmemServer::open(
            w, srv.options(), srv.counters_ptr(), limits.io_timeout_ms, limits.hello_timeout_ms);
        if (!s) return fail("serve", s.message());
        served.push_back(std::move(*s));
    }
    std::string bound;
    if (listen) {
        if (Status st = srv.listen(*listen, &bound); !st) return fail("serve", st.message());
    }
    for (auto& s : served) {
        std::printf("ferry serve: listening on %s\n", s->address().c_str());
        window_threads.emplace_back([p = s.get()] { p->run(); });
    }
    if (listen) std::printf("ferry serve: listening on %s\n", bound.c_str());
    std::fflush(stdout);
    if (listen) {
        if (Status st = srv.run(); !st) return fail("serve", st.message());
    }
    for (std::thread& t : window_threads) t.join();
    return 0;
}

}  // namespace
FERRY_COMMAND(serve, "serve", "host local devices for remote clients (--listen ADDR)", cmd_serve);
}  // namespace ferry::cli
