// Helpers for the remote tests: a real `ferry serve` child process and a raw-frame client.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backends/remote/transport-ivshmem.h"
#include "remote-proto/protocol.h"
#include "remote-proto/transport.h"
#include "remote-proto/wire.h"

namespace ferry::test {

inline std::string make_temp_dir() {
    char tmpl[] = "/tmp/ferry-remote-XXXXXX";
    const char* d = mkdtemp(tmpl);
    return d ? d : "/tmp";
}

// The files FERRY_STEP_TRACE=dir left (remote-proto/step-trace.h: DIR/ROLE-PID-N.txt, "T_NS
// KIND CMD" a line; one a connection or stripe lane, written whole by a rename, so a .part is
// not one yet).
struct TraceEvent {
    int64_t t;
    char kind;
    unsigned cmd;
};
struct TraceFile {
    std::string name, role;  // role: "client", "server", "lane-send" or "lane-receive"
    std::vector<TraceEvent> events;
};
inline std::vector<TraceFile> read_step_traces(const std::string& dir) {
    std::vector<TraceFile> out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        TraceFile f;
        f.name = e.path().filename().string();
        if (f.name.find(".part") != std::string::npos) continue;
        // ROLE is what comes before "-PID-N.txt".
        const size_t n_at = f.name.rfind('-');
        const size_t pid_at = n_at == std::string::npos ? n_at : f.name.rfind('-', n_at - 1);
        f.role = f.name.substr(0, pid_at);
        std::ifstream in(e.path());
        long long t = 0;
        char k = 0;
        unsigned c = 0;
        while (in >> t >> k >> c) f.events.push_back({t, k, c});
        out.push_back(std::move(f));
    }
    return out;
}

// The ferry binary the tests run: FERRY_TEST_BIN when set (test binaries copied to another
// machine, such as the GPU machine, with ferry beside them), else the one built with them.
inline const char* ferry_bin() {
    const char* e = std::getenv("FERRY_TEST_BIN");
    return e && *e ? e : FERRY_BIN;
}

// `ferry serve --listen ADDR ARGS...` as a child process; the address it bound is read from
// its first line of output.
class ServerProcess {
  public:
    ServerProcess() = default;
    ~ServerProcess() { stop(); }
    ServerProcess(const ServerProcess&) = delete;
    ServerProcess& operator=(const ServerProcess&) = delete;

    // Returns false (and fills *err) when the server did not come up within 20 s.
    bool start(const std::string& listen, std::vector<std::string> extra = {},
               std::string* err = nullptr) {
        int out[2];
        if (pipe2(out, O_CLOEXEC) != 0) return false;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(out[1], 1);
            std::vector<std::string> args = {ferry_bin(), "serve", "--listen", listen};
            for (auto& e : extra) args.push_back(e);
            std::vector<char*> argv;
            for (auto& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(ferry_bin(), argv.data());
            _exit(127);
        }
        close(out[1]);
        out_fd_ = out[0];
        std::string line;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (std::chrono::steady_clock::now() < deadline) {
            pollfd p{out_fd_, POLLIN, 0};
            if (poll(&p, 1, 200) <= 0) continue;
            char c;
            const ssize_t n = read(out_fd_, &c, 1);
            if (n <= 0) break;
            if (c == '\n') {
                const std::string key = "listening on ";
                const size_t at = line.find(key);
                if (at != std::string::npos) {
                    addr_ = line.substr(at + key.size());
                    return true;
                }
                line.clear();
            } else {
                line += c;
            }
        }
        if (err) *err = "server did not start: " + line;
        return false;
    }
    const std::string& addr() const { return addr_; }
    pid_t pid() const { return pid_; }
    bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
    void kill9() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
    }
    void stop() {
        if (pid_ > 0) {
            kill(pid_, SIGTERM);
            waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
        if (out_fd_ >= 0) close(out_fd_);
        out_fd_ = -1;
    }

    // A line of /proc/PID/status in KiB ("VmRSS", "VmHWM"); -1 when unreadable.
    long status_kib(const char* key) const {
        FILE* f = fopen(("/proc/" + std::to_string(pid_) + "/status").c_str(), "r");
        if (!f) return -1;
        char line[256];
        long v = -1;
        const size_t n = strlen(key);
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, key, n) == 0 && line[n] == ':') v = strtol(line + n + 1, nullptr, 10);
        }
        fclose(f);
        return v;
    }

  private:
    pid_t pid_ = -1;
    int out_fd_ = -1;
    std::string addr_;
};

// A client that writes raw frames, for hostile requests.
class RawClient {
  public:
    struct Reply {
        bool ok = false;  // a reply arrived
        remote::Header h;
        std::vector<uint8_t> payload;
        bool is_error() const { return ok && (h.flags & remote::kFlagError); }
        std::string message() const {
            wire::Reader r(payload.data(), payload.size());
            return r.str(1u << 16);
        }
    };

    // "ivshmem:PATH" attaches to a window instead (the same frames over its rings).
    bool connect(const std::string& addr) {
        if (addr.rfind("ivshmem:", 0) == 0) {
            auto c = remote::IvshmemChannel::attach(addr.substr(8));
            if (!c) return false;
            ring_ = std::move(*c);
            return true;
        }
        auto a = remote::parse_address(addr);
        if (!a) return false;
        auto s = remote::connect_to(*a);
        if (!s) return false;
        sock_ = std::move(*s);
        // Replies that never come fail the test after 10 s instead of hanging it (raw recv()
        // calls below see the same limit).
        timeval tv{10, 0};
        setsockopt(sock_.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        return sock_.set_io_timeout(10000).is_ok();
    }
    // Takes an already connected socket (e.g. bound to a chosen source address).
    bool adopt(remote::Socket s) {
        sock_ = std::move(s);
        timeval tv{10, 0};
        setsockopt(sock_.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        return sock_.set_io_timeout(10000).is_ok();
    }
    int fd() const { return sock_.fd(); }
    void close() { sock_.close(); }
    // Sends HELLO (caps 0: no shared memory, so no descriptors come back).
    Reply hello(const std::string& token = "", uint32_t version = remote::kProtocolVersion,
                uint64_t caps = remote::kCapGraphCache | remote::kCapEvents) {
        wire::Writer w;
        w.u32(version);
        w.u64(caps);
        w.str(token);
        return request(remote::Cmd::HELLO, w.buf());
    }
    bool send_raw(const void* p, size_t n) {
        if (ring_) return ring_send(p, n);
        return sock_.send_all(p, n, nullptr, 0).is_ok();
    }
    bool send_frame(uint16_t cmd, const std::vector<uint8_t>& payload, uint16_t flags = 0,
                    uint64_t len_override = UINT64_MAX) {
        remote::Header h;
        h.cmd = cmd;
        h.flags = flags;
        h.id = next_id_++;
        h.len = len_override == UINT64_MAX ? payload.size() : len_override;
        uint8_t hdr[remote::kHeaderSize];
        remote::write_header(hdr, h);
        if (ring_) return ring_send(hdr, sizeof(hdr)) && ring_send(payload.data(), payload.size());
        return sock_.send_all(hdr, sizeof(hdr), payload.data(), payload.size()).is_ok();
    }
    Reply read_reply() {
        Reply r;
        uint8_t hdr[remote::kHeaderSize];
        auto recv = [&](void* p, size_t n) {
            if (ring_) return ring_->read(p, n, 10000).is_ok();
            return sock_.recv_exact(p, n, nullptr).is_ok();
        };
        if (!recv(hdr, sizeof(hdr))) return r;
        r.h = remote::read_header(hdr);
        if (r.h.len > remote::kMaxPayload) return r;
        r.payload.resize(r.h.len);
        if (!recv(r.payload.data(), r.payload.size())) return r;
        r.ok = true;
        return r;
    }
    Reply request(remote::Cmd cmd, const std::vector<uint8_t>& payload) {
        if (!send_frame(static_cast<uint16_t>(cmd), payload)) return Reply{};
        return read_reply();
    }
    // SESSION_STATS field i (0-based, see docs/remote-protocol.md); UINT64_MAX on failure.
    uint64_t stat(int i) {
        Reply r = request(remote::Cmd::SESSION_STATS, {});
        if (!r.ok || r.is_error() || r.payload.size() < static_cast<size_t>(i + 1) * 8) {
            return UINT64_MAX;
        }
        wire::Reader rd(r.payload.data() + static_cast<size_t>(i) * 8, 8);
        return rd.u64();
    }
    // On a window: detaches (what a half-closed socket says: no more requests).
    void shutdown_write() {
        if (ring_) {
            ring_->detach();
            return;
        }
        ::shutdown(sock_.fd(), SHUT_WR);
    }
    // True when the server closed the connection (EOF within the receive timeout; on a
    // window: the session ended within 10 s).
    bool closed_by_server() {
        if (ring_) {
            const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (std::chrono::steady_clock::now() < end) {
                if (!ring_->check_alive()) return true;
                usleep(1000);
            }
            return false;
        }
        char c;
        const ssize_t n = recv(sock_.fd(), &c, 1, 0);
        return n == 0;
    }

    remote::IvshmemChannel* ring() { return ring_.get(); }

  private:
    bool ring_send(const void* p, size_t n) {
        const uint8_t* b = static_cast<const uint8_t*>(p);
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (n > 0) {
            auto w = ring_->write_some(b, n);
            if (!w) return false;
            b += *w;
            n -= *w;
            if (!*w) {
                if (!ring_->check_alive() || std::chrono::steady_clock::now() > end) return false;
                usleep(100);
            }
        }
        return true;
    }

    remote::Socket sock_;
    std::unique_ptr<remote::IvshmemChannel> ring_;
    uint64_t next_id_ = 1;
};

}  // namespace ferry::test
