// ferry::RemoteServer (ferry/server.h): the socket server and the ivshmem windows behind one
// public object, so that the command line (and any embedder) needs no private header.
#include <thread>

#include "ferry/server.h"
#include "server/ivshmem-server.h"
#include "server/server.h"

namespace ferry {
namespace {

class RemoteServerImpl final : public RemoteServer {
  public:
    RemoteServerImpl(server::ServerOptions opts, const server::ConnectionLimits& limits)
        : srv_(std::move(opts), limits), limits_(limits) {}
    ~RemoteServerImpl() override {
        stop();
        for (std::thread& t : window_threads_) {
            if (t.joinable()) t.join();
        }
    }

    Status bind(const ServeOptions& o) {
        for (const std::string& l : o.listen) {
            if (l.rfind("ivshmem:", 0) == 0) {
                Expected<std::unique_ptr<server::IvshmemServer>> w =
                    server::IvshmemServer::open(l.substr(8), srv_.options(), srv_.counters_ptr(),
                                                limits_.io_timeout_ms, limits_.hello_timeout_ms);
                if (!w) return w.status();
                addresses_.push_back((*w)->address());
                windows_.push_back(std::move(*w));
            } else {
                if (has_socket_) {
                    return Status::error(ErrorCode::InvalidArgument,
                                         "at most one unix: or tcp: address per server ('" +
                                             socket_address_ + "' and '" + l + "')");
                }
                std::string bound;
                if (Status st = srv_.listen(l, &bound); !st) return st;
                has_socket_ = true;
                socket_address_ = l;
                addresses_.push_back(bound);
            }
        }
        return Status::ok();
    }

    const std::vector<std::string>& addresses() const override { return addresses_; }

    Status run() override {
        for (auto& w : windows_) window_threads_.emplace_back([p = w.get()] { p->run(); });
        Status st = Status::ok();
        if (has_socket_) st = srv_.run();
        // Without a socket, the windows' threads serve until stop().
        for (std::thread& t : window_threads_) t.join();
        window_threads_.clear();
        return st;
    }

    void stop() override {
        if (has_socket_) srv_.stop();
        for (auto& w : windows_) w->stop();
    }

  private:
    server::Server srv_;
    server::ConnectionLimits limits_;
    bool has_socket_ = false;
    std::string socket_address_;
    std::vector<std::string> addresses_;
    std::vector<std::unique_ptr<server::IvshmemServer>> windows_;
    std::vector<std::thread> window_threads_;
};

}  // namespace

Expected<std::unique_ptr<RemoteServer>> RemoteServer::start(ServeOptions o) {
    if (o.listen.empty()) {
        return Status::error(ErrorCode::InvalidArgument,
                             "no address to listen on (unix:PATH, tcp:HOST:PORT or ivshmem:PATH)");
    }
    auto range = [](const char* what, long long v, long long lo, long long hi) -> Status {
        if (v < lo || v > hi) {
            return Status::error(ErrorCode::InvalidArgument,
                                 std::string(what) + " must be " + std::to_string(lo) + ".." +
                                     std::to_string(hi) + ", not " + std::to_string(v));
        }
        return Status::ok();
    };
    for (Status st :
         {range("threads", o.n_threads, 0, 1024), range("max sessions", o.max_sessions, 1, 100000),
          range("max sessions per client", o.max_sessions_per_client, 1, 100000),
          range("io timeout (ms)", o.io_timeout_ms, 0, 86400000),
          range("hello timeout (ms)", o.hello_timeout_ms, 0, 3600000)}) {
        if (!st) return st;
    }
    server::ServerOptions so;
    so.token = o.token;
    so.max_memory = o.max_memory ? o.max_memory : host_memory().total;
    so.max_scratch = o.max_scratch;
    so.max_work = o.max_work;
    so.n_threads = o.n_threads;
    so.verbose = o.verbose;
    if (o.devices.empty()) {
        for (Device* d : all_devices()) {
            if (d->type() != DeviceType::REMOTE) so.devices.push_back(d);
        }
    } else {
        for (Device* d : o.devices) {
            if (d->type() == DeviceType::REMOTE) {
                return Status::error(ErrorCode::InvalidArgument,
                                     std::string("cannot serve remote device '") + d->name() + "'");
            }
            so.devices.push_back(d);
        }
    }
    server::ConnectionLimits limits;
    limits.max_sessions = o.max_sessions;
    limits.max_sessions_per_client = o.max_sessions_per_client;
    limits.io_timeout_ms = o.io_timeout_ms;
    limits.hello_timeout_ms = o.hello_timeout_ms;
    auto impl = std::make_unique<RemoteServerImpl>(std::move(so), limits);
    if (Status st = impl->bind(o); !st) return st;
    return std::unique_ptr<RemoteServer>(std::move(impl));
}

}  // namespace ferry
