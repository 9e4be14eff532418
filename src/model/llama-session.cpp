// Llama inference sessions: the KV cache, the forward graph and decoding.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "core/env.h"
#include "ferry/allocator.h"
#include "ferry/llama.h"
#include "ferry/scheduler.h"
#include "model/arch.h"
#include "model/llama-impl.h"

namespace ferry {

namespace {

constexpr fp16_t kF16NegInf = 0xFC00;

}  // namespace

struct LlamaSession::Impl {
    LlamaModel::Impl* m = nullptr;
    int32_t n_ctx = 0;
    int32_t n_batch = 0;
    int32_t kv_pad = 32;  // SessionOptions::kv_pad
    Type kv_type = Type::F16;

    // KV cache: per layer, K and V rows [head_dim * n_head_kv] for every position.
    Context kv_ctx;
    std::vector<Tensor*> k_cache;                  // [head_dim * n_head_kv, n_ctx] per layer
    std::vector<Tensor*> v_cache;                  // [head_dim * n_head_kv, n_ctx] per layer
    std::vector<std::unique_ptr<Buffer>> kv_bufs;  // one per device holding layers

    std::vector<std::unique_ptr<Backend>> dev_backends;  // devices other than the CPU
    std::unique_ptr<Backend> cpu_backend;
    std::unique_ptr<Scheduler> sched;

    int32_t n_past = 0;
    // The logits [n_rows, n_vocab]: in host memory of the output's device when it has some
    // (pinned for a GPU, shared with the server for a remote device), so that the device
    // writes them there itself, without a copy through the host; in logits_vec otherwise.
    float* logits = nullptr;
    std::unique_ptr<Buffer> logits_buf;
    std::vector<float> logits_vec;
    bool host_logits_refused = false;
    int32_t n_rows = 0;
    // A decode step of g queued ahead on the device while the last one's logits were read
    // (Scheduler::get_tensor_then): the next one-token step of the same graph starts it with
    // its inputs (run_ahead) instead of launching it. FERRY_AHEAD=0: never (before/after).
    bool ahead = false;
    bool ahead_on = !env_off("FERRY_AHEAD");
    // set_top_k: the k best of the last row come back instead of the row (0: the row). n_top
    // is the k of the last decode (0 when it read logits); top_ids their ids.
    int32_t top_k = 0;
    int32_t n_top = 0;
    std::vector<int32_t> top_ids;

    // The last graph built; reused while its shape parameters stay the same.
    struct Built {
        std::unique_ptr<Context> ctx;
        Graph graph;
        Tensor* ids = nullptr;       // [n_tokens] i32
        Tensor* pos = nullptr;       // [n_tokens] i32
        Tensor* mask = nullptr;      // [n_kv, n_tokens] f16
        Tensor* out_ids = nullptr;   // [n_out] i32 rows feeding the logits, or nullptr (all)
        Tensor* mask_out = nullptr;  // [n_kv, n_out] f16: their mask rows (with out_ids)
        Tensor* out = nullptr;       // [n_vocab, n_out], or TOP_K's [2 top_k, n_out]
        int32_t n_tokens = -1, n_kv = -1, n_out = -1, top_k = -1;
        bool valid = false;
    } g;
    std::vector<fp16_t> mask_host;
    std::vector<int32_t> pos_host;
    std::vector<int32_t> out_ids_host;

    // FERRY_SESSION_PROFILE=1: host time of each part of a step (graph build, inputs, the
    // compute call, the read of the logits, which waits for the device), summed over the
    // session's steps and printed to stderr when it ends. On an asynchronous device the
    // device is idle while the host is in the first three of a step (the read before them
    // waited for everything): their sum is the host's share of a token.
    struct StepProfile {
        bool on = env_on("FERRY_SESSION_PROFILE");
        int64_t steps = 0, builds = 0;
        double build_us = 0, inputs_us = 0, between_us = 0;
        std::vector<float> compute_each, read_each;  // per step (means and medians)
        std::chrono::steady_clock::time_point last_end{};
    } prof;

    Status build(int32_t n_tokens, int32_t n_kv, int32_t n_out, int32_t top_k);
    void reserve_logits(size_t n_floats);
    // Floats a row of the output: the logits, or TOP_K's top_k values and ids.
    size_t out_row(int32_t top_k) const {
        return top_k > 0 ? 2 * static_cast<size_t>(top_k) : static_cast<size_t>(m->hp.n_vocab);
    }
    Status run_chunk(const int32_t* tokens, int32_t n_tokens, bool all_logits, int32_t top_k,
                     float* out_rows);
};

// Room for n_floats logits. Up to kDeviceLogitsMax bytes they go to the output device's host
// memory; larger requests (all the logits of a long prompt) and devices without host memory,
// or that refuse it (a remote session's budget), use ordinary memory.
constexpr size_t kDeviceLogitsMax = size_t{64} << 20;

void LlamaSession::Impl::reserve_logits(size_t n_floats) {
    // FERRY_HOST_LOGITS=0: ordinary memory always (for before/after measurements).
    static const bool host_logits = !env_off("FERRY_HOST_LOGITS");
    const size_t bytes = n_floats * sizeof(float);
    if (host_logits && !(logits_buf && logits_buf->size() >= bytes) && !host_logits_refused &&
        bytes <= kDeviceLogitsMax) {
        BufferType* bt = m->device ? m->device->host_buffer_type() : nullptr;
        if (bt && bt->is_host()) {
            // A step queued ahead may store its logits into the old buffer (the CUDA
            // backend's last product does, into the read's destination): it runs first.
            if (logits_buf && sched) (void)sched->synchronize();
            logits_buf.reset();
            Expected<std::unique_ptr<Buffer>> b = bt->allocate(bytes);
            if (b && (*b)->base()) {
                logits_buf = std::move(*b);
            } else {
                host_logits_refused = true;  // not asked again on every step
            }
        }
    }
    if (logits_buf && logits_buf->size() >= bytes) {
        logits = static_cast<float*>(logits_buf->base());
        return;
    }
    if (logits_vec.size() < n_floats) logits_vec.resize(n_floats);
    logits = logits_vec.data();
}

// Builds the forward graph for n_tokens new tokens attending to n_kv cached positions
// (including the new ones, padded), producing logits for the last n_out tokens (with top_k > 0,
// only the top_k best of each row and their ids).
Status LlamaSession::Impl::build(int32_t n_tokens, int32_t n_kv, int32_t n_out, int32_t top_k) {
    const LlamaHParams& hp = m->hp;
    const int64_t nt = n_tokens;

    g.valid = false;
    g.graph.clear();
    g.ctx = std::make_unique<Context>();
    Context& c = *g.ctx;

    // The token count and the attended KV length change from step to step while the graph's
    // structure stays: they are marked dynamic, so a compiling backend serves every step
    // with one compilation (graph_signature).
    g.ids = c.new_tensor(Type::I32, {nt});  // [n_tokens]
    g.ids->set_name("inp_tokens");
    g.ids->flags |= kTensorInput;
    c.mark_dynamic(g.ids, 0, kDimTokens);
    g.pos = c.new_tensor(Type::I32, {nt});  // [n_tokens]
    g.pos->set_name("inp_pos");
    g.pos->flags |= kTensorInput;
    c.mark_dynamic(g.pos, 0, kDimTokens);
    // Every step has a mask (also one whose positions are all visible), and when fewer rows
    // than tokens feed the logits, or one, they are selected by index: so the graph keeps one
    // structure over every prompt length and decode step (graph_signature), and a compiling
    // backend compiles it once.
    g.mask = c.new_tensor(Type::F16, {n_kv, nt});  // [n_kv, n_tokens]
    g.mask->set_name("inp_mask");
    g.mask->flags |= kTensorInput;
    c.mark_dynamic(g.mask, 0, kDimKv);
    c.mark_dynamic(g.mask, 1, kDimTokens);
    g.out_ids = nullptr;
    g.mask_out = nullptr;
    if (n_out < n_tokens || n_out == 1) {
        g.out_ids = c.new_tensor(Type::I32, {n_out});  // [n_out]
        g.out_ids->set_name("inp_out_ids");
        g.out_ids->flags |= kTensorInput;
        g.mask_out = c.new_tensor(Type::F16, {n_kv, n_out});  // [n_kv, n_out]
        g.mask_out->set_name("inp_mask_out");
        g.mask_out->flags |= kTensorInput;
        c.mark_dynamic(g.mask_out, 0, kDimKv);
    }

    Tensor* x = c.get_rows(m->tok_embd, g.ids);  // [n_embd, n_tokens]
    for (int32_t il = 0; il < hp.n_layer; il++) {
        // In the last layer only the last n_out tokens feed the logits: their queries alone
        // attend, and the other rows are dropped before the FFN. n_out == n_tokens elsewhere.
        const bool last = il == hp.n_layer - 1;
        ForwardContext f{c,
                         *m,
                         g.pos,
                         g.mask,
                         k_cache[static_cast<size_t>(il)],
                         v_cache[static_cast<size_t>(il)],
                         nt,
                         n_kv,
                         last ? n_out : nt,
                         kv_type,
                         last ? g.out_ids : nullptr,
                         last ? g.mask_out : nullptr};
        x = m->arch->build_layer(f, m->layers[static_cast<size_t>(il)], x);  // [n_embd, n_out]
    }
    x = c.mul(c.rms_norm(x, hp.norm_eps), m->output_norm);  // [n_embd, n_out]
    g.out = c.mul_mat(m->output, x);                        // [n_vocab, n_out]
    g.out->set_name("logits");
    if (top_k > 0) {
        // Read back 8 bytes a candidate instead of 4 a vocabulary entry: 320 bytes instead of
        // Llama 3's 513 KB for the default sampler, a long way for a remote device.
        g.out = c.top_k(g.out, top_k);  // [2 top_k, n_out]
        g.out->set_name("logits_top");
    }
    g.out->flags |= kTensorOutput;
    g.graph.build_forward(g.out);
    g.n_tokens = n_tokens;
    g.n_kv = n_kv;
    g.n_out = n_out;
    g.top_k = top_k;
    FERRY_TRY(sched->alloc(g.graph));
    g.valid = true;
    return Status::ok();
}

Status LlamaSession::Impl::run_chunk(const int32_t* tokens, int32_t n_tokens, bool all_logits,
                                     int32_t top_k, float* out_rows) {
    const int32_t n_end = n_past + n_tokens;
    // The attended KV length of a step that ends at position n (padded: kv_pad steps share it).
    auto padded = [&](int32_t n) { return std::min(n_ctx, (n + kv_pad - 1) / kv_pad * kv_pad); };
    const int32_t n_kv = padded(n_end);
    const int32_t n_out = all_logits ? n_tokens : 1;
    using clock = std::chrono::steady_clock;
    auto us = [](clock::time_point a, clock::time_point b) {
        return std::chrono::duration<double, std::micro>(b - a).count();
    };
    const clock::time_point t0 = prof.on ? clock::now() : clock::time_point{};
    // A graph is reused only when its inputs keep their storage (alloc was its last plan).
    if (!g.valid || g.n_tokens != n_tokens || g.n_kv != n_kv || g.n_out != n_out ||
        g.top_k != top_k) {
        ahead = false;  // build's alloc runs a graph queued ahead with its last inputs first
        FERRY_TRY(build(n_tokens, n_kv, n_out, top_k));
        if (prof.on) prof.builds++;
    }
    const clock::time_point t1 = prof.on ? clock::now() : clock::time_point{};
    pos_host.resize(static_cast<size_t>(n_tokens));
    for (int32_t i = 0; i < n_tokens; i++) pos_host[static_cast<size_t>(i)] = n_past + i;
    // The step's inputs in one call: a GPU moves them in one launch instead of one copy each.
    TensorWrite writes[5];
    size_t n_writes = 0;
    writes[n_writes++] = {g.ids, tokens, 0, sizeof(int32_t) * static_cast<size_t>(n_tokens)};
    writes[n_writes++] = {g.pos, pos_host.data(), 0, sizeof(int32_t) * pos_host.size()};
    mask_host.resize(static_cast<size_t>(n_kv) * static_cast<size_t>(n_tokens));
    for (int32_t i = 0; i < n_tokens; i++) {
        fp16_t* row = mask_host.data() + static_cast<size_t>(i) * static_cast<size_t>(n_kv);
        const int32_t visible = n_past + i + 1;  // positions [0, visible) are attended
        std::fill(row, row + visible, fp16_t{0});
        std::fill(row + visible, row + n_kv, kF16NegInf);
    }
    writes[n_writes++] = {g.mask, mask_host.data(), 0, sizeof(fp16_t) * mask_host.size()};
    if (g.out_ids) {
        // The last n_out rows, and their mask rows.
        const int32_t first = n_tokens - n_out;
        out_ids_host.resize(static_cast<size_t>(n_out));
        for (int32_t i = 0; i < n_out; i++) out_ids_host[static_cast<size_t>(i)] = first + i;
        writes[n_writes++] = {g.out_ids, out_ids_host.data(), 0,
                              sizeof(int32_t) * out_ids_host.size()};
        writes[n_writes++] = {
            g.mask_out, mask_host.data() + static_cast<size_t>(first) * static_cast<size_t>(n_kv),
            0, sizeof(fp16_t) * static_cast<size_t>(n_kv) * static_cast<size_t>(n_out)};
    }
    const std::span<const TensorWrite> inputs(writes, n_writes);
    bool started = false;  // by its inputs: the step was queued ahead
    if (ahead) {
        ahead = false;
        Expected<bool> r = sched->run_ahead(inputs);
        if (!r) {
            g.valid = false;
            return r.status();
        }
        started = *r;
    } else {
        FERRY_TRY(sched->set_tensors(inputs));
    }
    const clock::time_point t2 = prof.on ? clock::now() : clock::time_point{};
    Status st = started ? Status::ok() : sched->compute(g.graph);
    if (!st) {
        g.valid = false;
        return st;
    }
    const clock::time_point t3 = prof.on ? clock::now() : clock::time_point{};
    // Read through the backend that wrote the logits: it waits for that device's work. When
    // the next one-token step will be this graph again (the same padded KV length), it is
    // queued on the device first, to start as soon as its inputs come.
    const size_t out_bytes = sizeof(float) * out_row(top_k) * static_cast<size_t>(n_out);
    if (ahead_on && n_tokens == 1 && n_out == 1 && n_end < n_ctx && padded(n_end + 1) == n_kv) {
        st = sched->get_tensor_then(g.out, out_rows, out_bytes, g.graph, &ahead);
        if (!st && ahead) {
            ahead = false;
            (void)sched->synchronize();
        }
    } else {
        st = sched->get_tensor(g.out, out_rows, out_bytes);
    }
    if (prof.on && n_tokens == 1) {  // decode steps only
        const clock::time_point t4 = clock::now();
        if (prof.steps > 0) prof.between_us += us(prof.last_end, t0);
        prof.steps++;
        prof.build_us += us(t0, t1);
        prof.inputs_us += us(t1, t2);
        prof.compute_each.push_back(static_cast<float>(us(t2, t3)));
        prof.read_each.push_back(static_cast<float>(us(t3, t4)));
        prof.last_end = t4;
    }
    return st;
}

Expected<std::unique_ptr<LlamaSession>> LlamaSession::create(LlamaModel& model,
                                                             const SessionOptions& opts) {
    LlamaModel::Impl* m = model.impl();
    const LlamaHParams& hp = m->hp;
    std::unique_ptr<LlamaSession> s(new LlamaSession());
    s->impl_ = std::make_unique<Impl>();
    Impl& d = *s->impl_;
    d.m = m;
    if (opts.n_ctx < 0) return Status::errorf("session: n_ctx %d is negative", opts.n_ctx);
    d.n_ctx = opts.n_ctx > 0 ? opts.n_ctx : std::min(hp.n_ctx_train, 4096);
    if (opts.n_batch < 0) return Status::errorf("session: n_batch %d is negative", opts.n_batch);
    d.n_batch = std::min(opts.n_batch > 0 ? opts.n_batch : 512, d.n_ctx);
    if (opts.kv_pad < 0) {
        return Status::errorf("session: kv_pad %d is negative (0: the device's choice)",
                              opts.kv_pad);
    }
    d.kv_pad = opts.kv_pad;
    if (d.kv_pad == 0) {
        // A device that captures and replays graphs pays a capture for every new KV length:
        // 256 (measured on the H200, stop 24: 1B Q4_0 tg128 1,398 t/s at 32, 1,466 at 256); a
        // device that does not pays the padding's masked positions (the CPU, tiny-llama tg128:
        // 4,037-4,643 t/s at 32, 3,392-4,111 at 256).
        bool replay = m->device->caps().graph_replay;
        for (Device* dev : m->layer_device) replay |= dev->caps().graph_replay;
        d.kv_pad = replay ? 256 : 32;
    }
    if (opts.kv_type != Type::F16 && opts.kv_type != Type::F32 && opts.kv_type != Type::BF16) {
        return Status::errorf("session: KV cache type %s is not supported (f16, f32, bf16)",
                              type_name(opts.kv_type));
    }
    d.kv_type = opts.kv_type;

    const int64_t kv_ne[2] = {int64_t{hp.head_dim} * hp.n_head_kv, d.n_ctx};
    for (int32_t il = 0; il < hp.n_layer; il++) {
        for (int kv = 0; kv < 2; kv++) {
            Expected<Tensor*> t = d.kv_ctx.new_tensor_checked(d.kv_type, 2, kv_ne);
            if (!t) return t.status().context(strfmt("session: KV cache of %d positions", d.n_ctx));
            Tensor* c = *t;  // [hd*n_head_kv, n_ctx]
            c->set_name((kv == 0 ? "cache_k_l" : "cache_v_l") + std::to_string(il));
            (kv == 0 ? d.k_cache : d.v_cache).push_back(c);
        }
    }
    // Each layer's cache lives with its weights: one buffer per device.
    std::vector<Device*> kv_devices;
    std::map<Device*, std::vector<Tensor*>> kv_of;
    for (int32_t il = 0; il < hp.n_layer; il++) {
        Device* dev = m->layer_device[static_cast<size_t>(il)];
        if (!kv_of.count(dev)) kv_devices.push_back(dev);
        kv_of[dev].push_back(d.k_cache[static_cast<size_t>(il)]);
        kv_of[dev].push_back(d.v_cache[static_cast<size_t>(il)]);
    }
    for (Device* dev : kv_devices) {
        BufferType* bt = dev->buffer_type();
        size_t total = 0;
        for (const Tensor* t : kv_of[dev])
            total = align_tensor_offset(total, bt) + bt->alloc_size(t);
        const DeviceMemory mem = dev->memory();
        if (mem.total > 0 && total > mem.total) {
            return Status::errorf(ErrorCode::OutOfMemory,
                                  "session: KV cache of %d positions needs %.1f MiB on %s, more "
                                  "than its %.1f MiB",
                                  d.n_ctx, static_cast<double>(total) / 1048576.0, dev->name(),
                                  static_cast<double>(mem.total) / 1048576.0);
        }
        Expected<std::unique_ptr<Buffer>> kv = bt->allocate_for(total, BufferUsage::Any);
        if (!kv) return kv.status().context(strfmt("session: KV cache on %s", dev->name()));
        size_t off = 0;
        for (Tensor* t : kv_of[dev]) {
            off = align_tensor_offset(off, bt);
            FERRY_TRY(place_tensor(t, kv->get(), off));
            off += bt->alloc_size(t);
        }
        // Padded attention reads positions nobody wrote yet (masked): they must hold finite
        // values.
        FERRY_TRY((*kv)->clear(0));
        d.kv_bufs.push_back(std::move(*kv));
    }

    // A stream per device that holds weights (in the order of preference the model was given),
    // the CPU last: the scheduler runs each layer where its weights are.
    BackendOptions bo;
    bo.n_threads = opts.n_threads;
    bo.cache_dir = opts.cache_dir;
    Device* cpu = cpu_device();
    if (!cpu) return Status::error("session: no CPU device (ferry::init_backends was not called)");
    Expected<std::unique_ptr<Backend>> cb = cpu->make_backend(bo);
    if (!cb) return cb.status().context("session: CPU backend");
    d.cpu_backend = std::move(*cb);
    std::vector<Backend*> backends;
    std::vector<Device*> used = m->layer_device;
    used.push_back(m->input_device);
    used.push_back(m->device);
    for (Device* dev : used) {
        if (dev->type() == DeviceType::CPU) continue;
        bool have = false;
        for (const auto& b : d.dev_backends) have |= b->device() == dev;
        if (have) continue;
        Expected<std::unique_ptr<Backend>> b = dev->make_backend(bo);
        if (!b) return b.status().context(strfmt("session: backend for %s", dev->name()));
        (*b)->set_n_threads(opts.n_threads);
        backends.push_back(b->get());
        d.dev_backends.push_back(std::move(*b));
    }
    backends.push_back(d.cpu_backend.get());
    d.sched = std::make_unique<Scheduler>(std::move(backends));
    return s;
}

LlamaSession::~LlamaSession() {
    // Work still in flight on an asynchronous device reads the graph freed below.
    if (impl_ && impl_->sched) (void)impl_->sched->synchronize();
    if (impl_ && impl_->prof.on && impl_->prof.steps > 0) {
        Impl::StepProfile& p = impl_->prof;
        const double n = static_cast<double>(p.steps);
        auto mean = [n](const std::vector<float>& v) {
            double sum = 0.0;
            for (float x : v) sum += x;
            return sum / n;
        };
        // The q-quantile of v (0.5: the median; v is reordered).
        auto nth = [](std::vector<float>& v, double q) {
            const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
            std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
            return static_cast<double>(v[k]);
        };
        std::fprintf(stderr,
                     "session profile: %lld one-token steps (%lld graph builds), per step us: "
                     "build %.1f, inputs %.1f, compute call %.1f, logits read (waits for the "
                     "device) %.1f, caller between steps %.1f; medians: compute call %.1f, "
                     "logits read %.1f; logits read p90 %.1f, max %.1f\n",
                     static_cast<long long>(p.steps), static_cast<long long>(p.builds),
                     p.build_us / n, p.inputs_us / n, mean(p.compute_each), mean(p.read_each),
                     p.steps > 1 ? p.between_us / (n - 1) : 0.0, nth(p.compute_each, 0.5),
                     nth(p.read_each, 0.5), nth(p.read_each, 0.9), nth(p.read_each, 1.0));
    }
}

Status LlamaSession::decode(std::span<const int32_t> tokens, bool all_logits) {
    Impl& d = *impl_;
    const int32_t n_vocab = d.m->hp.n_vocab;
    if (tokens.empty()) return Status::error("decode: no tokens given");
    for (size_t i = 0; i < tokens.size(); i++) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return Status::errorf(
                "decode: token id %d at position %zu is outside the vocabulary "
                "[0, %d)",
                tokens[i], i, n_vocab);
        }
    }
    if (tokens.size() > static_cast<size_t>(d.n_ctx - d.n_past)) {
        return Status::errorf(
            "decode: prompt of %zu tokens plus %d cached exceeds the context "
            "of %d",
            tokens.size(), d.n_past, d.n_ctx);
    }
    const int32_t n = static_cast<int32_t>(tokens.size());
    d.n_rows = all_logits ? n : 1;
    const int32_t top_k = all_logits ? 0 : d.top_k;
    d.n_top = 0;
    d.reserve_logits(static_cast<size_t>(d.n_rows) * d.out_row(top_k));
    const int32_t n_past0 = d.n_past;
    for (int32_t i = 0; i < n; i += d.n_batch) {
        const int32_t nt = std::min(d.n_batch, n - i);
        // Without all_logits, only the last chunk's last row survives: earlier chunks write
        // their single row to row 0 and are overwritten.
        float* dst =
            d.logits + (all_logits ? static_cast<size_t>(i) * static_cast<size_t>(n_vocab) : 0);
        Status st = d.run_chunk(tokens.data() + i, nt, all_logits, top_k, dst);
        if (!st) {
            d.n_past = n_past0;
            d.n_rows = 0;
            return st.context("decode");
        }
        d.n_past += nt;
    }
    if (top_k > 0) {
        // TOP_K gives the ids as exact floats after the values.
        d.top_ids.resize(static_cast<size_t>(top_k));
        for (int32_t j = 0; j < top_k; j++) {
            d.top_ids[static_cast<size_t>(j)] = static_cast<int32_t>(d.logits[top_k + j]);
        }
        d.n_top = top_k;
    }
    return Status::ok();
}

void LlamaSession::set_top_k(int32_t k) {
    // FERRY_DEVICE_TOPK=0: whole rows always (for before/after measurements).
    static const bool on = !env_off("FERRY_DEVICE_TOPK");
    Impl& d = *impl_;
    const int32_t n_vocab = d.m->hp.n_vocab;
    // TOP_K's indices are exact floats up to kTopKMaxRow entries a row.
    k = on && n_vocab <= kTopKMaxRow ? std::clamp(k, 0, n_vocab) : 0;
    if (k > 0) {
        // Only where the device that computes the logits runs TOP_K itself: elsewhere the
        // scheduler would bring the row to the CPU for it, past the session's own read of the
        // logits (into the device's pinned or shared host memory), for nothing.
        Context probe;
        Tensor* row = probe.new_tensor(Type::F32, {n_vocab, 1});
        if (!d.m->device->supports_op(probe.top_k(row, k))) k = 0;
    }
    d.top_k = k;
}
int32_t LlamaSession::top_k() const {
    return impl_->top_k;
}
int32_t LlamaSession::n_top() const {
    return impl_->n_top;
}
const float* LlamaSession::top_logits() const {
    return impl_->n_top > 0 ? impl_->logits : nullptr;
}
const int32_t* LlamaSession::top_ids() const {
    return impl_->n_top > 0 ? impl_->top_ids.data() : nullptr;
}

const float* LlamaSession::logits(int32_t i) const {
    const Impl& d = *impl_;
    if (i < 0 || i >= d.n_rows || d.n_top > 0) return nullptr;
    return d.logits + static_cast<size_t>(i) * static_cast<size_t>(d.m->hp.n_vocab);
}

int32_t LlamaSession::n_logit_rows() const {
    return impl_->n_rows;
}
int32_t LlamaSession::n_past() const {
    return impl_->n_past;
}
int32_t LlamaSession::n_ctx() const {
    return impl_->n_ctx;
}
int32_t LlamaSession::kv_pad() const {
    return impl_->kv_pad;
}
void LlamaSession::reset() {
    impl_->n_past = 0;
    impl_->n_rows = 0;
    impl_->n_top = 0;
}
void LlamaSession::truncate(int32_t n_past) {
    // Later decodes overwrite the cache from n_past on and attend only to positions before
    // their own, so dropping the tail is just moving the end back.
    if (n_past >= 0 && n_past < impl_->n_past) {
        impl_->n_past = n_past;
        impl_->n_rows = 0;
        impl_->n_top = 0;
    }
}

size_t LlamaSession::kv_bytes() const {
    size_t n = 0;
    for (const auto& b : impl_->kv_bufs) n += b->size();
    return n;
}

}  // namespace ferry
