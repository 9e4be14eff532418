#include "backends/remote/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry::remote {

Expected<std::shared_ptr<Connection>> Connection::open(const std::string& addr,
                                                       const std::string& token) {
    Expected<Address> a = parse_address(addr);
    if (!a) return a.status();
    std::shared_ptr<Connection> c(new Connection());
    c->addr_ = addr;
    Expected<Socket> s = connect_to(*a);
    if (!s) return c->error(s.message());
    c->sock_ = std::move(*s);
    std::string tok = token;
    if (tok.empty()) {
        if (const char* env = std::getenv("FERRY_TOKEN")) tok = env;
    }
    wire::Writer w;
    w.u32(kProtocolVersion);
    uint64_t caps = kCapGraphCache;
    if (a->kind == Address::Kind::Unix) caps |= kCapSharedMemory;
    w.u64(caps);
    w.str(tok);
    Expected<Result> r = c->call(Cmd::HELLO, w);
    if (!r) return r.status();
    wire::Reader rd(r->payload.data(), r->payload.size());
    const uint32_t version = rd.u32();
    c->caps_ = rd.u64();
    c->session_ = rd.u64();
    (void)rd.str();
    if (!rd.ok() || version != kProtocolVersion) {
        return c->error(strfmt("HELLO: server speaks protocol version %u, this client %u", version,
                               kProtocolVersion));
    }
    return c;
}

Connection::~Connection() {
    if (!std::getenv("FERRY_REMOTE_STATS")) return;
    std::string per_cmd;
    for (uint16_t c = 1; c <= kCmdMax; c++) {
        if (sent_[c])
            per_cmd += strfmt(" %s=%llu", cmd_name(c), static_cast<unsigned long long>(sent_[c]));
    }
    std::fprintf(stderr, "ferry remote %s: %llu waits, %llu bytes out, %llu bytes in;%s\n",
                 addr_.c_str(), static_cast<unsigned long long>(waits_),
                 static_cast<unsigned long long>(bytes_out_),
                 static_cast<unsigned long long>(bytes_in_), per_cmd.c_str());
}

Status Connection::error(const std::string& what) const {
    return Status::error("remote server " + addr_ + ": " + what);
}

Status Connection::fail(const std::string& why) {
    if (!dead_) {
        dead_ = true;
        dead_why_ = why;
        sock_.close();
        pending_.clear();
    }
    return error("connection lost: " + dead_why_);
}

Status Connection::send_frame(Cmd cmd, uint64_t id, const wire::Writer& prefix, const void* data,
                              size_t size) {
    uint64_t len = 0;
    if (!wire::add_ok(prefix.size(), size, &len) || len > kMaxPayload) {
        return error(strfmt("%s: request of %llu bytes exceeds the frame limit",
                            cmd_name(static_cast<uint16_t>(cmd)),
                            static_cast<unsigned long long>(len)));
    }
    Header h;
    h.cmd = static_cast<uint16_t>(cmd);
    h.id = id;
    h.len = len;
    sent_[h.cmd <= kCmdMax ? h.cmd : 0]++;
    bytes_out_ += kHeaderSize + len;
    uint8_t hdr[kHeaderSize];
    write_header(hdr, h);
    const uint8_t* parts[3] = {hdr, prefix.data(), static_cast<const uint8_t*>(data)};
    size_t left[3] = {kHeaderSize, prefix.size(), size};
    while (left[0] + left[1] + left[2] > 0) {
        pollfd pfd{sock_.fd(), POLLOUT, 0};
        if (!pending_.empty()) pfd.events |= POLLIN;
        const int pr = ::poll(&pfd, 1, -1);
        if (pr < 0) {
            if (errno == EINTR) continue;
            return fail(std::string("poll: ") + std::strerror(errno));
        }
        if ((pfd.revents & POLLIN) && !pending_.empty()) {
            // Keep the pipeline moving: the server may be blocked sending us a reply.
            FERRY_TRY(read_reply(nullptr, nullptr));
            if (dead_) return error("connection lost: " + dead_why_);
            continue;
        }
        if (pfd.revents & (POLLERR | POLLHUP | POLLNVAL) && !(pfd.revents & POLLOUT)) {
            return fail("the server closed the connection");
        }
        iovec iov[3];
        int n = 0;
        for (int i = 0; i < 3; i++) {
            if (left[i]) iov[n++] = {const_cast<uint8_t*>(parts[i]), left[i]};
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(n);
        const ssize_t sent = ::sendmsg(sock_.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return fail(std::string("send: ") + std::strerror(errno));
        }
        size_t s = static_cast<size_t>(sent);
        for (int i = 0; i < 3 && s > 0; i++) {
            const size_t take = s < left[i] ? s : left[i];
            parts[i] += take;
            left[i] -= take;
            s -= take;
        }
    }
    return Status::ok();
}

void Connection::run_local_actions() {
    while (!pending_.empty() && pending_.front().cmd == 0) {
        std::function<void()> fn = std::move(pending_.front().action);
        pending_.pop_front();
        if (fn) fn();
    }
}

Status Connection::read_reply(Result* sync_result, Status* sync_status) {
    if (dead_) return error("connection lost: " + dead_why_);
    uint8_t hdr[kHeaderSize];
    std::vector<int> fds;
    Status st = sock_.recv_exact(hdr, sizeof(hdr), &fds);
    if (!st) {
        for (int fd : fds) ::close(fd);
        return fail(st.message());
    }
    const Header h = read_header(hdr);
    auto bad = [&](const std::string& why) {
        for (int fd : fds) ::close(fd);
        return fail("protocol error: " + why);
    };
    if (h.magic != kMagic) return bad("bad magic in reply");
    if (h.len > kMaxPayload) return bad("oversized reply");
    if (pending_.empty() || pending_.front().cmd == 0) {
        // An unsolicited error (e.g. "server busy") before the connection closes.
        return bad("unexpected reply");
    }
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    if (!(h.flags & kFlagReply) || h.id != p.id || h.cmd != p.cmd) {
        return bad(strfmt("reply %llu (%s) does not match request %llu (%s)",
                          static_cast<unsigned long long>(h.id), cmd_name(h.cmd),
                          static_cast<unsigned long long>(p.id), cmd_name(p.cmd)));
    }
    const bool is_error = (h.flags & kFlagError) != 0;
    bytes_in_ += kHeaderSize + h.len;
    std::vector<uint8_t> payload;
    if (!is_error && p.dst && h.len == p.dst_size) {
        st = sock_.recv_exact(p.dst, p.dst_size, &fds);
    } else {
        payload.resize(h.len);
        st = sock_.recv_exact(payload.data(), payload.size(), &fds);
    }
    if (!st) {
        for (int fd : fds) ::close(fd);
        return fail(st.message());
    }
    Status result;
    if (is_error) {
        wire::Reader r(payload.data(), payload.size());
        const std::string msg = r.str(1u << 16);
        result = error(r.ok() ? msg : "malformed error reply");
        if (p.cmd == static_cast<uint16_t>(Cmd::GRAPH_COMPUTE)) forget_graphs();
    } else if (p.dst && h.len != p.dst_size) {
        result = error(strfmt("%s: reply of %llu bytes, expected %zu", cmd_name(p.cmd),
                              static_cast<unsigned long long>(h.len), p.dst_size));
    }
    if (p.sync && sync_result) {
        sync_result->payload = std::move(payload);
        sync_result->fds = std::move(fds);
        *sync_status = result;
    } else {
        for (int fd : fds) ::close(fd);
        if (!result && sticky_) sticky_ = result;
    }
    run_local_actions();
    return Status::ok();
}

Status Connection::send_async(Cmd cmd, const wire::Writer& prefix, const void* data, size_t size,
                              void* reply_dst, size_t reply_size) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (dead_) return error("connection lost: " + dead_why_);
    const uint64_t id = next_id_++;
    FERRY_TRY(send_frame(cmd, id, prefix, data, size));
    Pending p;
    p.id = id;
    p.cmd = static_cast<uint16_t>(cmd);
    p.dst = reply_dst;
    p.dst_size = reply_size;
    pending_.push_back(std::move(p));
    return Status::ok();
}

Status Connection::after_pending(std::function<void()> fn) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (pending_.empty()) {
        fn();
        return Status::ok();
    }
    Pending p;
    p.action = std::move(fn);
    pending_.push_back(std::move(p));
    return Status::ok();
}

Expected<Connection::Result> Connection::call(Cmd cmd, const wire::Writer& prefix, const void* data,
                                              size_t size) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (dead_) return error("connection lost: " + dead_why_);
    const uint64_t id = next_id_++;
    FERRY_TRY(send_frame(cmd, id, prefix, data, size));
    Pending p;
    p.id = id;
    p.cmd = static_cast<uint16_t>(cmd);
    p.sync = true;
    pending_.push_back(std::move(p));
    Result res;
    Status own;
    waits_++;
    while (!pending_.empty()) {
        const bool mine = pending_.front().id == id && pending_.front().cmd != 0;
        FERRY_TRY(read_reply(mine ? &res : nullptr, &own));
        if (mine) break;
    }
    run_local_actions();
    if (!own) {
        for (int fd : res.fds) ::close(fd);
        return own;
    }
    if (!sticky_) {
        Status s = sticky_;
        sticky_ = Status::ok();
        for (int fd : res.fds) ::close(fd);
        return s;
    }
    return res;
}

Status Connection::drain() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (!pending_.empty()) waits_++;
    while (!pending_.empty()) {
        if (pending_.front().cmd == 0) {
            run_local_actions();
            continue;
        }
        FERRY_TRY(read_reply(nullptr, nullptr));
    }
    if (dead_) return error("connection lost: " + dead_why_);
    Status s = sticky_;
    sticky_ = Status::ok();
    return s;
}

}  // namespace ferry::remote
