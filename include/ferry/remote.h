// The remote backend (API remoting), client side.
//
// remote_connect("unix:/run/ferry.sock") or remote_connect("tcp:127.0.0.1:7070") opens a
// connection to a `ferry serve` process, says HELLO, lists the server's devices and registers a
// Registry whose devices are named "ADDR/NAME" (e.g. "unix:/tmp/s/CPU"). Those devices behave
// like local ones: buffers, set/get, graph compute (see docs/remote-protocol.md). Calls on a
// remote backend are pipelined; Backend::synchronize() and every synchronous Buffer call wait.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/backend.h"
#include "ferry/status.h"

namespace ferry {

// Connects to ADDR and registers its devices globally (ferry::all_devices(), find_device()).
// Connecting twice to the same address is a no-op. The token for tcp comes from FERRY_TOKEN.
Status remote_connect(const std::string& addr);

// Same as remote_connect with an explicit token (empty: FERRY_TOKEN, if set).
Status remote_connect(const std::string& addr, const std::string& token);

// Opens a connection of its own (a separate server session) without registering it: for
// programs and tests that want several independent clients in one process.
Expected<std::unique_ptr<Registry>> remote_open(const std::string& addr,
                                                const std::string& token = "");

// Server and session counters (SESSION_STATS).
struct RemoteStats {
    // This connection's session.
    uint64_t session_id = 0;
    uint64_t session_bytes = 0;    // bytes of live buffers
    uint64_t session_buffers = 0;  // live buffers
    uint64_t requests = 0;         // requests handled (including this one)
    uint64_t errors = 0;           // requests answered with an error
    uint64_t graph_cache_hits = 0;
    uint64_t graph_cache_misses = 0;
    uint64_t graph_delta_hits = 0;  // graphs rebuilt from a cached base plus changed entries
    // Whole server.
    uint64_t server_sessions = 0;
    uint64_t server_bytes = 0;
    uint64_t server_buffers = 0;
    // Protocol version 2: the session's memory budget (--max-memory) and what is charged to it.
    uint64_t charged = 0;        // everything below, together
    uint64_t buffer_charge = 0;  // buffers in whole pages (at least one each)
    uint64_t scratch_bytes = 0;  // kernel scratch held by the session's backends
    uint64_t graph_cache_bytes = 0;
    uint64_t graph_cache_entries = 0;
    uint64_t events = 0;      // live events (each charged kEventCharge)
    uint64_t max_memory = 0;  // the limit (0: none)
    uint64_t max_work = 0;    // estimated operations per GRAPH_COMPUTE (0: no limit)
    // This client's side of the connection, before the stats request itself.
    uint64_t client_waits = 0;            // times the client waited for replies (round trips)
    uint64_t client_bytes_in = 0;         // reply bytes received (frames with their headers)
    uint64_t client_sends = 0;            // send system calls (a batch of frames is one)
    uint32_t client_stripes = 1;          // tcp connections that carry large replies (1: unstriped)
    uint64_t client_striped_replies = 0;  // replies that came over all of them
};

// Stats of the session behind `reg` (a registry from remote_open or remote_connect).
Expected<RemoteStats> remote_stats(Registry* reg);
// Stats through the globally registered connection to ADDR.
Expected<RemoteStats> remote_stats(const std::string& addr);

// One empty request (PING) and its reply: for latency measurements.
Status remote_ping(Registry* reg);

}  // namespace ferry
