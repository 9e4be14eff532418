// Helpers for the remote tests: a real `ferry serve` child process and a raw-frame client.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "remote-proto/protocol.h"
#include "remote-proto/transport.h"
#include "remote-proto/wire.h"

namespace ferry::test {

inline std::string make_temp_dir() {
    char tmpl[] = "/tmp/ferry-remote-XXXXXX";
    const char* d = mkdtemp(tmpl);
    return d ? d : "/tmp";
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
            std::vector<std::string> args = {FERRY_BIN, "serve", "--listen", listen};
            for (auto& e : extra) args.push_back(e);
            std::vector<char*> argv;
            for (auto& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(FERRY_BIN, argv.data());
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

    bool connect(const std::string& addr) {
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
    // Sends HELLO (caps 0: no shared memory, so no descriptors come back).
    Reply hello(const std::string& token = "", uint32_t version = remote::kProtocolVersion,
                uint64_t caps = remote::kCapGraphCache | remote::kCapEvents) {
        wire::Writer w;
        w.u32(version);
        w.u64(caps);
        w.str(token);
        return request(remote::Cmd::HELLO, w.buf());
    }
    bool send_raw(const void* p, size_t n) { return sock_.send_all(p, n, nullptr, 0).is_ok(); }
    bool send_frame(uint16_t cmd, const std::vector<uint8_t>& payload, uint16_t flags = 0,
                    uint64_t len_override = UINT64_MAX) {
        remote::Header h;
        h.cmd = cmd;
        h.flags = flags;
        h.id = next_id_++;
        h.len = len_override == UINT64_MAX ? payload.size() : len_override;
        uint8_t hdr[remote::kHeaderSize];
        remote::write_header(hdr, h);
        return sock_.send_all(hdr, sizeof(hdr), payload.data(), payload.size()).is_ok();
    }
    Reply read_reply() {
        Reply r;
        uint8_t hdr[remote::kHeaderSize];
        if (!sock_.recv_exact(hdr, sizeof(hdr), nullptr)) return r;
        r.h = remote::read_header(hdr);
        if (r.h.len > remote::kMaxPayload) return r;
        r.payload.resize(r.h.len);
        if (!sock_.recv_exact(r.payload.data(), r.payload.size(), nullptr)) return r;
        r.ok = true;
        return r;
    }
    Reply request(remote::Cmd cmd, const std::vector<uint8_t>& payload) {
        if (!send_frame(static_cast<uint16_t>(cmd), payload)) return Reply{};
        return read_reply();
    }
    void shutdown_write() { ::shutdown(sock_.fd(), SHUT_WR); }
    // True when the server closed the connection (EOF within the receive timeout).
    bool closed_by_server() {
        char c;
        const ssize_t n = recv(sock_.fd(), &c, 1, 0);
        return n == 0;
    }

  private:
    remote::Socket sock_;
    uint64_t next_id_ = 1;
};

}  // namespace ferry::test
