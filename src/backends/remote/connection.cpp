#include "backends/remote/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/env.h"

namespace ferry::remote {

Expected<std::shared_ptr<Connection>> Connection::open(const std::string& addr,
                                                       const std::string& token) {
    std::shared_ptr<Connection> c(new Connection());
    c->addr_ = addr;
    bool unix_socket = false;
    if (addr.rfind("ivshmem:", 0) == 0) {
        Expected<std::unique_ptr<IvshmemChannel>> ch = IvshmemChannel::attach(addr.substr(8));
        if (!ch) return c->error(ch.message());
        c->ring_ = std::move(*ch);
    } else {
        Expected<Address> a = parse_address(addr);
        if (!a) return a.status();
        Expected<Socket> s = connect_to(*a);
        if (!s) return c->error(s.message());
        c->sock_ = std::move(*s);
        c->sock_.set_spin_ns(socket_spin_ns(true));
        unix_socket = a->kind == Address::Kind::Unix;
    }
    c->fold_inputs_ = !env_off("FERRY_REMOTE_FOLD");
    c->hold_compute_ = !env_off("FERRY_REMOTE_HOLD_COMPUTE");
    std::string tok = token;
    if (tok.empty()) {
        if (const char* env = std::getenv("FERRY_TOKEN")) tok = env;
    }
    const int stripes = c->ring_ || unix_socket ? 1 : stripes_wanted();
    wire::Writer w;
    w.u32(kProtocolVersion);
    uint64_t caps = kCapGraphCache | kCapEvents;
    if (unix_socket) caps |= kCapSharedMemory;
    if (stripes > 1) caps |= kCapStripes;
    w.u64(caps);
    w.str(tok);
    Expected<Result> r = c->call(Cmd::HELLO, w);
    if (!r) return r.status();
    wire::Reader rd(r->payload.data(), r->payload.size());
    const uint32_t version = rd.u32();
    c->caps_ = rd.u64();
    c->session_ = rd.u64();
    (void)rd.str();
    const uint8_t* key = (c->caps_ & kCapStripes) ? rd.bytes(kStripeKeyBytes) : nullptr;
    if (!rd.ok() || version != kProtocolVersion) {
        return c->error(strfmt("HELLO: server speaks protocol version %u, this client %u", version,
                               kProtocolVersion));
    }
    if (key) {
        // Slower without them, never wrong: a server that refuses stripes is used without.
        if (Status st = c->open_stripes(addr, tok, key, stripes); !st) {
            std::fprintf(stderr, "ferry: %s: continuing without stripe connections\n",
                         st.message().c_str());
        }
    }
    return c;
}

int Connection::stripes_wanted() {
    if (const char* v = std::getenv("FERRY_REMOTE_STRIPES")) {
        const long n = std::strtol(v, nullptr, 10);
        return static_cast<int>(std::clamp<long>(n, 1, kMaxStripes));
    }
    // As with spinning (socket_spin_ns): only hosts with cores to spare, where the client's
    // lanes and the server's each take a core while a reply moves.
    return spare_cores() ? kDefaultStripes : 1;
}

Status Connection::open_stripes(const std::string& addr, const std::string& token,
                                const uint8_t* key, int n) {
    Expected<Address> a = parse_address(addr);
    if (!a) return a.status();
    // The lanes poll as long as the connection's own receive does (after wake(): a read of a
    // step's result was sent).
    const int64_t spin = socket_spin_ns(true);
    auto lanes = std::make_unique<StripeLanes>(StripeLanes::Dir::Receive, spin, spin,
                                               /*frame_ms=*/0);
    for (int i = 1; i < n; i++) {
        Expected<Socket> s = connect_to(*a);
        if (!s) return error("stripe connection: " + s.message());
        wire::Writer w;
        w.u32(kProtocolVersion);
        w.str(token);
        w.u64(session_);
        w.bytes(key, kStripeKeyBytes);
        w.u8(static_cast<uint8_t>(i));
        Header h;
        h.cmd = static_cast<uint16_t>(Cmd::STRIPE_JOIN);
        h.id = 1;
        h.len = w.size();
        uint8_t hdr[kHeaderSize];
        write_header(hdr, h);
        FERRY_TRY(s->send_all(hdr, sizeof(hdr), w.data(), w.size()));
        uint8_t rh[kHeaderSize];
        FERRY_TRY(s->recv_exact(rh, sizeof(rh), nullptr));
        const Header reply = read_header(rh);
        if (reply.magic != kMagic || reply.len > (1u << 16)) {
            return error("stripe connection: malformed reply");
        }
        std::vector<uint8_t> msg(static_cast<size_t>(reply.len));
        FERRY_TRY(s->recv_exact(msg.data(), msg.size(), nullptr));
        if (reply.flags & kFlagError) {
            wire::Reader r(msg.data(), msg.size());
            return error("stripe connection refused: " + r.str(1u << 16));
        }
        FERRY_TRY(lanes->add(std::move(*s)));
    }
    wire::Writer w;
    w.u8(static_cast<uint8_t>(n));
    Expected<Result> r = call(Cmd::STRIPES, w);
    if (!r) return r.status();
    lanes_ = std::move(lanes);
    return Status::ok();
}

Connection::~Connection() {
    (void)flush();  // held requests (posted writes) still reach the server
    if (!std::getenv("FERRY_REMOTE_STATS")) return;
    std::string per_cmd;
    for (uint16_t c = 1; c <= kCmdMax; c++) {
        if (sent_[c])
            per_cmd += strfmt(" %s=%llu", cmd_name(c), static_cast<unsigned long long>(sent_[c]));
    }
    std::fprintf(
        stderr,
        "ferry remote %s: %llu waits, %llu sends, %llu receives, %llu bytes out, %llu "
        "bytes in; inputs folded into GRAPH_COMPUTE=%llu; replies striped over %d=%llu;%s\n",
        addr_.c_str(), static_cast<unsigned long long>(waits_),
        static_cast<unsigned long long>(sends_), static_cast<unsigned long long>(in_.receives()),
        static_cast<unsigned long long>(bytes_out_), static_cast<unsigned long long>(bytes_in_),
        static_cast<unsigned long long>(folded_), lanes_ ? lanes_->stripes() : 1,
        static_cast<unsigned long long>(striped_), per_cmd.c_str());
}

Status Connection::error(const std::string& what, ErrorCode code) const {
    return Status::error(code, "remote server " + addr_ + ": " + what);
}

Status Connection::fail(const std::string& why) {
    if (!dead_) {
        dead_ = true;
        dead_why_ = why;
        sock_.close();
        ring_.reset();
        pending_.clear();
        out_.clear();
        inputs_.clear();
        n_inputs_ = 0;
        in_.reset();
        close_fds_in();
        lanes_.reset();
    }
    return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
}

namespace {

// Requests whose sending may wait for the next one: the small data-path requests a step
// posts around its compute (inputs, clears, posted reads; the compute itself, see
// send_frame). Anything that changes what others can see (a free) or waits (a call) goes
// out at once, with whatever is held.
bool may_hold(Cmd cmd) {
    switch (cmd) {
        case Cmd::TENSOR_SET:
        case Cmd::TENSOR_GET:
        case Cmd::TENSOR_MEMSET:
        case Cmd::TENSOR_COPY:
        case Cmd::BUFFER_CLEAR:
            return true;
        default:
            return false;
    }
}

}  // namespace

Status Connection::send_frame(Cmd cmd, uint64_t id, const wire::Writer& prefix, const void* data,
                              size_t size) {
    uint64_t len = 0;
    if (!checked_add(prefix.size(), size, &len) || len > kMaxPayload) {
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
    // A compute is held too (when its frame is small: a decode step's delta): what follows
    // it, the read of its result and the wait, joins it in one send, and the server then
    // finds both in one receive and answers both in one send. The next request or wait sends
    // it, whichever comes first.
    const bool hold = may_hold(cmd) || (cmd == Cmd::GRAPH_COMPUTE && hold_compute_);
    if (hold && HeldFrames::fits(kHeaderSize + len)) {
        const bool send_now =
            out_.add({{hdr, kHeaderSize}, {prefix.data(), prefix.size()}, {data, size}});
        return send_now ? flush() : Status::ok();
    }
    const uint8_t* parts[4] = {out_.data(), hdr, prefix.data(), static_cast<const uint8_t*>(data)};
    size_t left[4] = {out_.size(), kHeaderSize, prefix.size(), size};
    Status st = write_parts(parts, left, 4);
    out_.clear();
    return st;
}

Status Connection::flush() {
    if (dead_) return Status::ok();
    FERRY_TRY(spill_inputs());
    if (out_.empty()) return Status::ok();
    const uint8_t* parts[1] = {out_.data()};
    size_t left[1] = {out_.size()};
    Status st = write_parts(parts, left, 1);
    out_.clear();
    return st;
}

Status Connection::post_input(uint64_t handle, uint64_t offset, const void* data, size_t size) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (dead_) return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
    if (!fold_inputs_ || size > kMaxFoldedInput) {
        wire::Writer w;
        w.u64(handle);
        w.u64(offset);
        w.u64(size);
        return send_async(Cmd::TENSOR_SET, w, data, size);
    }
    if (n_inputs_ == kMaxComputeInputs || inputs_.size() + 24 + size > kMaxFoldedBytes) {
        FERRY_TRY(spill_inputs());
    }
    wire::Writer w(&inputs_);
    w.u64(handle);
    w.u64(offset);
    w.u64(size);
    w.bytes(data, size);
    n_inputs_++;
    return Status::ok();
}

Status Connection::spill_inputs() {
    if (!n_inputs_) return Status::ok();
    std::vector<uint8_t> held;
    held.swap(inputs_);
    const uint32_t n = n_inputs_;
    n_inputs_ = 0;
    wire::Reader r(held.data(), held.size());
    Status st;
    for (uint32_t i = 0; i < n && st; i++) {
        wire::Writer w;
        w.u64(r.u64());
        w.u64(r.u64());
        const uint64_t size = r.u64();
        w.u64(size);
        const uint8_t* data = r.bytes(size);
        st = send_async(Cmd::TENSOR_SET, w, data, static_cast<size_t>(size));
    }
    held.clear();
    if (inputs_.empty()) inputs_.swap(held);  // keeps the memory for the next step
    return st;
}

Status Connection::send_compute(uint32_t dev, uint8_t mode, const wire::Writer& body) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (dead_) return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
    wire::Writer w;
    w.u32(dev);
    if (n_inputs_ && w.size() + 5 + inputs_.size() + body.size() + kHeaderSize <= kMaxPayload) {
        w.u8(static_cast<uint8_t>(mode | kGraphInputs));
        w.u32(n_inputs_);
        w.bytes(inputs_.data(), inputs_.size());
        folded_ += n_inputs_;
        inputs_.clear();
        n_inputs_ = 0;
    } else {
        FERRY_TRY(spill_inputs());
        w.u8(mode);
    }
    const uint64_t id = next_id_++;
    FERRY_TRY(send_frame(Cmd::GRAPH_COMPUTE, id, w, body.data(), body.size()));
    Pending p;
    p.id = id;
    p.cmd = static_cast<uint16_t>(Cmd::GRAPH_COMPUTE);
    pending_.push_back(std::move(p));
    return Status::ok();
}

Status Connection::write_parts(const uint8_t** parts, size_t* left, int n_parts) {
    if (ring_) return write_ring(parts, left, n_parts);
    // Sends without waiting first (the bytes fit the socket buffer almost always: one
    // syscall); only a full socket makes us poll, and then replies are read while we wait.
    bool full = false;
    auto remaining = [&] {
        size_t n = 0;
        for (int i = 0; i < n_parts; i++) n += left[i];
        return n;
    };
    while (remaining() > 0) {
        if (full) {
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
                if (dead_) return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
                continue;
            }
            if (pfd.revents & (POLLERR | POLLHUP | POLLNVAL) && !(pfd.revents & POLLOUT)) {
                return fail("the server closed the connection");
            }
        }
        iovec iov[4];
        int n = 0;
        for (int i = 0; i < n_parts; i++) {
            if (left[i]) iov[n++] = {const_cast<uint8_t*>(parts[i]), left[i]};
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(n);
        sends_++;
        trace_.ev('S', 0);
        const ssize_t sent = ::sendmsg(sock_.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) full = true;
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            if (errno == EPIPE || errno == ECONNRESET) {
                return fail("the server closed the connection");
            }
            return fail(std::string("send: ") + std::strerror(errno));
        }
        full = true;  // a partial send: the buffer is full now
        size_t s = static_cast<size_t>(sent);
        for (int i = 0; i < n_parts && s > 0; i++) {
            const size_t take = s < left[i] ? s : left[i];
            parts[i] += take;
            left[i] -= take;
            s -= take;
        }
    }
    return Status::ok();
}

Status Connection::write_ring(const uint8_t** parts, size_t* left, int n_parts) {
    ivshmem::Backoff bo;
    for (int i = 0; i < n_parts;) {
        if (!left[i]) {
            i++;
            continue;
        }
        Expected<size_t> n = ring_->write_some(parts[i], left[i]);
        if (!n) return fail(n.message());
        if (*n) {
            parts[i] += *n;
            left[i] -= *n;
            bo.reset();
            continue;
        }
        sends_++;
        // The ring is full: keep the pipeline moving (the server may be waiting for room in
        // the reply ring), or wait for the server to take bytes.
        if (!pending_.empty() && pending_.front().cmd != 0 && ring_->readable()) {
            FERRY_TRY(read_reply(nullptr, nullptr));
            if (dead_) return error("connection lost: " + dead_why_);
            continue;
        }
        if (Status st = ring_->check_alive(); !st) return fail(st.message());
        bo.wait();
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

Status Connection::read_in(void* dst, size_t n) {
    if (ring_) return ring_->read(dst, n);
    return in_.read(dst, n, false, nullptr, &fds_in_);
}

void Connection::close_fds_in() {
    for (int fd : fds_in_) ::close(fd);
    fds_in_.clear();
}

Status Connection::read_reply(Result* sync_result, Status* sync_status) {
    if (dead_) return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
    uint8_t hdr[kHeaderSize];
    if (ring_ && !pending_.empty()) ring_->expect_reply_to(pending_.front().cmd);
    Status st = read_in(hdr, sizeof(hdr));
    if (!st) return fail(st.message());
    const Header h = read_header(hdr);
    trace_.ev('H', h.cmd);
    auto bad = [&](const std::string& why) { return fail("protocol error: " + why); };
    if (h.magic != kMagic) return bad("bad magic in reply");
    if (h.len > kMaxPayload) return bad("oversized reply");
    if (h.id == 0 && h.cmd == 0 && (h.flags & kFlagError) && h.len <= (1u << 16)) {
        // A connection-level error (e.g. "server busy"), sent before the server closes.
        std::vector<uint8_t> msg(static_cast<size_t>(h.len));
        if (read_in(msg.data(), msg.size())) {
            wire::Reader r(msg.data(), msg.size());
            const std::string text = r.str(1u << 16);
            if (r.ok()) return fail(text);
        }
        return bad("malformed connection error");
    }
    if (pending_.empty() || pending_.front().cmd == 0) return bad("unexpected reply");
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
    if (h.flags & kFlagStriped) {
        // Only where both sides agreed: a successful TENSOR_GET reply of kStripeMin bytes or
        // more, into its destination (stripe 0 here, the others on the lanes meanwhile).
        if (!lanes_ || is_error || p.cmd != static_cast<uint16_t>(Cmd::TENSOR_GET) || !p.dst ||
            h.len != p.dst_size || h.len < kStripeMin) {
            return bad("unexpected striped reply");
        }
        uint8_t* dst = static_cast<uint8_t*>(p.dst);
        lanes_->start(dst, h.len);
        // Stripe 0's chunks straight into place, as few receives as their arrival allows.
        if (ring_) {
            st = Status::error("striped reply on a shared-memory ring");
        } else {
            st = stripe_io(dst, h.len, lanes_->stripes(), 0, 0, h.len,
                           [&](const iovec* parts, int k) { return in_.read_parts(parts, k); });
        }
        const Status lanes = lanes_->finish();
        if (!st) return fail(st.message());
        if (!lanes) return fail(lanes.message());
        striped_++;
        trace_.ev('E', p.cmd);
        run_local_actions();
        return Status::ok();
    }
    if (!is_error && p.dst && h.len == p.dst_size) {
        st = read_in(p.dst, p.dst_size);
    } else {
        payload.resize(h.len);
        st = read_in(payload.data(), payload.size());
    }
    if (!st) return fail(st.message());
    trace_.ev('E', p.cmd);
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
        // Descriptors come only with replies to synchronous calls (BUFFER_ALLOC), and one
        // call waits at a time: whatever arrived while reading up to here is this reply's
        // (a read may take in the start of the next reply with its descriptor, so they are
        // gathered per call, not per read).
        sync_result->payload = std::move(payload);
        sync_result->fds = std::move(fds_in_);
        fds_in_.clear();
        *sync_status = result;
    } else if (!result && sticky_) {
        sticky_ = result;
    }
    run_local_actions();
    return Status::ok();
}

Status Connection::send_async(Cmd cmd, const wire::Writer& prefix, const void* data, size_t size,
                              void* reply_dst, size_t reply_size) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (dead_) return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
    FERRY_TRY(spill_inputs());  // held inputs go first, in the order they were posted
    const uint64_t id = next_id_++;
    if (lanes_ && cmd == Cmd::TENSOR_GET && reply_size >= kStripeMin) lanes_->wake();
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
    if (dead_) return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
    FERRY_TRY(spill_inputs());
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
    FERRY_TRY(flush());
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

Status Connection::send_held() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (dead_) return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
    return flush();
}

Status Connection::drain() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (!dead_) FERRY_TRY(spill_inputs());
    if (!pending_.empty()) waits_++;
    FERRY_TRY(flush());
    while (!pending_.empty()) {
        if (pending_.front().cmd == 0) {
            run_local_actions();
            continue;
        }
        FERRY_TRY(read_reply(nullptr, nullptr));
    }
    close_fds_in();  // nothing is waiting for descriptors now
    if (dead_) return error("connection lost: " + dead_why_, ErrorCode::ConnectionLost);
    Status s = sticky_;
    sticky_ = Status::ok();
    return s;
}

}  // namespace ferry::remote
