// The OpenVINO backend: registry, devices, host buffers, and the compute that translates,
// compiles once per structural key, binds ferry's memory and runs (see openvino-backend.h).
#include "backends/openvino/openvino-backend.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <openvino/openvino.hpp>
#include <string>
#include <unordered_map>

#include "backends/openvino/translate.h"
#include "backends/openvino/weights.h"
#include "core/env.h"

namespace ferry {
namespace openvino {

namespace {

constexpr size_t kAlign = 64;

std::atomic<uint64_t> g_compiles{0};
std::atomic<uint64_t> g_hits{0};
std::atomic<uint64_t> g_compile_us{0};
std::atomic<uint64_t> g_declined{0};  // bit per Op (test hook)
std::atomic<uint64_t> g_runs{0};
std::atomic<uint64_t> g_copied{0};
std::atomic<uint64_t> g_window{0};
std::atomic<uint64_t> g_attn_in_place{0};
static_assert(static_cast<size_t>(Op::COUNT) <= 64);

// Diagnostics from the environment (docs/openvino.md): FERRY_OPENVINO_TRACE=1 prints resident
// memory at each load/compile step and the compile times; FERRY_OPENVINO_PROFILE=1 compiles
// with the plugin's per-node counters and prints each model's time per node type when it is
// freed; FERRY_OPENVINO_DUMP=DIR writes every compiled model (as translated, and as the plugin
// runs it) there.
bool tracing() {
    static const bool on = env_on("FERRY_OPENVINO_TRACE");
    return on;
}
bool profiling() {
    static const bool on = env_on("FERRY_OPENVINO_PROFILE");
    return on;
}
// FERRY_OPENVINO_TRACE=maps: also the anonymous mappings whose resident memory grew by at least
// 1 MiB since the previous trace point, largest first (how the plugin's copies are told apart by
// their sizes). Mappings merge and split as memory is mapped next to them: a mapping's growth is
// its resident memory less that of the earlier mappings it overlaps.
bool tracing_maps() {
    static const bool on = [] {
        const char* e = std::getenv("FERRY_OPENVINO_TRACE");
        return e && std::strcmp(e, "maps") == 0;
    }();
    return on;
}
void trace_maps() {
    struct Map {
        unsigned long long end;
        long rss_kb;
    };
    static std::map<unsigned long long, Map> before;  // start -> (end, resident KiB)
    std::map<unsigned long long, Map> now;
    std::ifstream f("/proc/self/smaps");
    std::string line;
    unsigned long long start = 0, end = 0;
    bool anon = false;
    while (std::getline(f, line)) {
        const size_t dash = line.find('-'), space = line.find(' ');
        if (dash != std::string::npos && space != std::string::npos && dash < space &&
            std::isxdigit(static_cast<unsigned char>(line[0]))) {
            start = std::strtoull(line.substr(0, dash).c_str(), nullptr, 16);
            end = std::strtoull(line.substr(dash + 1, space - dash - 1).c_str(), nullptr, 16);
            // anonymous: nothing after the inode (the sixth field), or a [heap]-like name
            size_t fields = 0, i = 0;
            while (i < line.size() && fields < 5) {
                while (i < line.size() && line[i] != ' ') i++;
                while (i < line.size() && line[i] == ' ') i++;
                fields++;
            }
            anon = i >= line.size() || line[i] == '[';
        } else if (anon && line.rfind("Rss:", 0) == 0) {
            now[start] = {end, std::strtol(line.c_str() + 4, nullptr, 10)};
        }
    }
    std::vector<std::pair<long, unsigned long long>> grown;  // (KiB, bytes mapped)
    for (const auto& [a, m] : now) {
        long old = 0;
        for (auto it = before.lower_bound(a); it != before.end() && it->first < m.end; ++it)
            old += it->second.rss_kb;
        auto prev = before.lower_bound(a);
        if (prev != before.begin() && (--prev)->second.end > a) old += prev->second.rss_kb;
        if (m.rss_kb - old >= 1024) grown.push_back({m.rss_kb - old, m.end - a});
    }
    std::sort(grown.rbegin(), grown.rend());
    long total = 0;
    for (const auto& g : grown) total += g.first;
    std::fprintf(stderr, "[openvino]   %zu anonymous mappings grew by >= 1 MiB, %.1f MiB:\n",
                 grown.size(), static_cast<double>(total) / 1024.0);
    for (size_t i = 0; i < grown.size() && i < 24; i++) {
        std::fprintf(stderr, "[openvino]     +%8.1f MiB in a mapping of %llu bytes\n",
                     static_cast<double>(grown[i].first) / 1024.0, grown[i].second);
    }
    before = std::move(now);
}
void trace_mem(const char* what, double ms = -1.0) {
    if (!tracing()) return;
    std::ifstream f("/proc/self/status");
    std::string line, rss, hwm;
    while (std::getline(f, line)) {
        if (line.rfind("VmRSS:", 0) == 0) rss = line.substr(6);
        if (line.rfind("VmHWM:", 0) == 0) hwm = line.substr(6);
    }
    std::fprintf(stderr, "[openvino] %s: RSS%s, peak%s", what, rss.c_str(), hwm.c_str());
    if (ms >= 0) std::fprintf(stderr, ", %.0f ms", ms);
    std::fprintf(stderr, "\n");
    if (tracing_maps()) trace_maps();
}
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One ov::Core for the process (it loads the plugins), created on first use.
ov::Core* core(std::string* err = nullptr) {
    static std::once_flag once;
    static std::unique_ptr<ov::Core> c;
    static std::string error;
    std::call_once(once, [] {
        try {
            c = std::make_unique<ov::Core>();
        } catch (const std::exception& e) {
            error = e.what();
        }
    });
    if (!c && err) *err = error;
    return c.get();
}

class OvDevice;

// Host memory: OpenVINO reads and writes it in place (tensors wrap it, nothing is copied).
class OvBuffer : public Buffer {
  public:
    OvBuffer(BufferType* type, void* base, size_t size) : type_(type), base_(base), size_(size) {}
    ~OvBuffer() override { std::free(base_); }
    BufferType* type() const override { return type_; }
    size_t size() const override { return size_; }
    void* base() const override { return base_; }
    Status set_tensor(Tensor* t, const void* src, size_t offset, size_t size) override {
        FERRY_TRY(check_range(t, offset, size));
        FERRY_TRY(check_writable(t));
        if (size) std::memcpy(static_cast<uint8_t*>(base_) + t->offs + offset, src, size);
        return Status::ok();
    }
    Status get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) override {
        FERRY_TRY(check_range(t, offset, size));
        if (const PreparedWeight* w = converted(t)) {
            if (w->in_place) return restore_blocks(t, *w, offset, size, dst);
            return Status::errorf(
                ErrorCode::InvalidArgument,
                "tensor '%s' was converted for OpenVINO (prepare_weights) and its "
                "GGUF blocks were released",
                t->name);
        }
        if (size) std::memcpy(dst, static_cast<const uint8_t*>(base_) + t->offs + offset, size);
        return Status::ok();
    }
    Status memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) override {
        FERRY_TRY(check_range(t, offset, size));
        FERRY_TRY(check_writable(t));
        if (size) std::memset(static_cast<uint8_t*>(base_) + t->offs + offset, value, size);
        return Status::ok();
    }
    bool copy_tensor(const Tensor* src, Tensor* dst) override {
        if (!src->data || !dst->data || src->nbytes() != dst->nbytes()) return false;
        if (converted(src) || converted(dst)) return false;  // through get/set_tensor instead
        std::memcpy(dst->data, src->data, src->nbytes());
        return true;
    }
    Status clear(uint8_t value) override {
        if (size_) std::memset(base_, value, size_);
        return Status::ok();
    }
    // Converted weights (Tensor::extra) of tensors in this buffer, freed with it.
    void own(std::unique_ptr<PreparedWeight> w) { prepared_.push_back(std::move(w)); }

  private:
    // The converted form of a weight converted over its own bytes (weights.h), or null.
    const PreparedWeight* converted(const Tensor* t) const {
        const auto* w = t->buffer == this ? static_cast<const PreparedWeight*>(t->extra) : nullptr;
        return w && (w->in_place || w->released) ? w : nullptr;
    }
    Status check_writable(const Tensor* t) const {
        if (!converted(t)) return Status::ok();
        return Status::errorf(ErrorCode::InvalidArgument,
                              "tensor '%s' was converted for OpenVINO (prepare_weights) and cannot "
                              "be written any more",
                              t->name);
    }
    BufferType* type_;
    void* base_;
    size_t size_;
    std::vector<std::unique_ptr<PreparedWeight>> prepared_;
};

class OvBufferType : public BufferType {
  public:
    explicit OvBufferType(Device* dev) : dev_(dev) {}
    const char* name() const override { return dev_->name(); }
    Device* device() const override { return dev_; }
    size_t alignment() const override { return kAlign; }
    bool is_host() const override { return true; }
    Expected<std::unique_ptr<Buffer>> allocate(size_t size) override {
        const size_t rounded = (std::max<size_t>(size, 1) + kAlign - 1) / kAlign * kAlign;
        void* p = std::aligned_alloc(kAlign, rounded);
        if (!p) {
            return Status::errorf(ErrorCode::OutOfMemory, "%s: cannot allocate %zu bytes",
                                  dev_->name(), size);
        }
        return std::unique_ptr<Buffer>(new OvBuffer(this, p, size));
    }

  private:
    Device* dev_;
};

// A compiled model and what its parameters and results are bound to.
struct Compiled {
    ModelPlan plan;
    ov::CompiledModel model;
    ov::InferRequest req;
    std::vector<std::vector<float>> dequant;  // host f32 copies of quantized input leaves
    uint64_t runs = 0;
    std::map<std::string, std::pair<double, uint64_t>> prof;  // FERRY_OPENVINO_PROFILE
    ~Compiled() {
        if (prof.empty()) return;
        std::vector<std::pair<double, std::string>> v;
        double total = 0;
        for (auto& [k, e] : prof) {
            v.push_back({e.first, k});
            total += e.first;
        }
        std::sort(v.rbegin(), v.rend());
        std::fprintf(stderr, "[openvino] profile of a model over %llu runs: %.1f ms per run\n",
                     static_cast<unsigned long long>(runs),
                     total / 1000.0 / static_cast<double>(runs));
        for (size_t i = 0; i < v.size() && i < 25; i++)
            std::fprintf(stderr, "  %-50s %8.2f ms/run\n", v[i].second.c_str(),
                         v[i].first / 1000.0 / static_cast<double>(runs));
    }
};

// The structural key plus what a compiled model bakes in beyond the structure: the memory of
// constant weights, and the literal strides of non-contiguous views.
std::string model_key(const Graph& g) {
    const GraphSignature sig = graph_signature(g, SignatureMode::Dynamic);
    std::string k(sig.bytes.begin(), sig.bytes.end());
    auto put = [&k](const void* p, size_t n) { k.append(static_cast<const char*>(p), n); };
    for (const Tensor* t : g.leafs) {
        const void* p = t->extra ? t->extra : t->data;
        if ((t->flags | t->storage()->flags) & kTensorParam) put(&p, sizeof p);
    }
    for (const Tensor* t : g.nodes) {
        if (t->op == Op::VIEW && !t->is_contiguous()) put(t->nb, sizeof t->nb);
    }
    return k;
}

class OvBackend : public Backend {
  public:
    OvBackend(Device* dev, std::string ov_name, BackendOptions opts)
        : dev_(dev), ov_name_(std::move(ov_name)), opts_(std::move(opts)) {
        // The environment names a model cache for programs that set none themselves.
        const char* env = std::getenv("FERRY_OPENVINO_CACHE_DIR");
        if (opts_.cache_dir.empty() && env) opts_.cache_dir = env;
    }
    const char* name() const override { return dev_->name(); }
    Device* device() const override { return dev_; }
    void set_n_threads(int n) override {
        if (n != opts_.n_threads) {
            opts_.n_threads = n;
            cache_.clear();  // threads are a compile-time property
        }
    }
    Status compute(Graph& g) override {
        try {
            return run(g);
        } catch (const std::exception& e) {
            return Status::errorf("%s: OpenVINO: %s", dev_->name(), e.what());
        }
    }

  private:
    Status run(Graph& g) {
        bool work = false;
        for (const Tensor* t : g.nodes) work = work || (op_info(t->op).flags & kOpView) == 0;
        if (!work) return Status::ok();
        std::string key = model_key(g);
        auto it = cache_.find(key);
        if (it == cache_.end()) {
            trace_mem("compute on a new structure");
            const auto t0 = std::chrono::steady_clock::now();
            Expected<ModelPlan> plan = translate_graph(g);
            if (!plan) return plan.status();
            ov::Core* c = core();
            if (!c) return Status::error("OpenVINO core is not available");
            ov::AnyMap cfg{ov::hint::inference_precision(ov::element::f32),
                           ov::hint::performance_mode(ov::hint::PerformanceMode::LATENCY)};
            if (opts_.n_threads > 0) cfg.emplace(ov::inference_num_threads(opts_.n_threads));
            if (profiling()) cfg.emplace(ov::enable_profiling(true));
            if (!opts_.cache_dir.empty()) cfg.emplace(ov::cache_dir(opts_.cache_dir));
            // FERRY_OPENVINO_CONFIG="KEY=VALUE,KEY=VALUE": further compile properties by their
            // OpenVINO names (experiments; docs/openvino.md), over the ones above.
            if (const char* extra = std::getenv("FERRY_OPENVINO_CONFIG")) {
                std::string list = extra;
                size_t at = 0;
                while (at < list.size()) {
                    size_t end = list.find(',', at);
                    if (end == std::string::npos) end = list.size();
                    const std::string kv = list.substr(at, end - at);
                    const size_t eq = kv.find('=');
                    if (eq == std::string::npos || eq == 0) {
                        return Status::errorf(ErrorCode::InvalidArgument,
                                              "FERRY_OPENVINO_CONFIG: '%s' is not KEY=VALUE",
                                              kv.c_str());
                    }
                    cfg[kv.substr(0, eq)] = kv.substr(eq + 1);
                    at = end + 1;
                }
            }
            auto cm = std::make_unique<Compiled>();
            cm->plan = std::move(*plan);
            const double translate_ms = ms_since(t0);
            trace_mem("translated");
            cm->model = c->compile_model(cm->plan.model, ov_name_, cfg);
            if (const char* dump = std::getenv("FERRY_OPENVINO_DUMP")) {
                const std::string base =
                    std::string(dump) + "/model" + std::to_string(g_compiles.load());
                ov::serialize(cm->plan.model, base + ".xml", base + ".bin");
                ov::serialize(cm->model.get_runtime_model(), base + "-exec.xml",
                              base + "-exec.bin");
            }
            // The compiled model is the plugin's own copy of the graph: the translated one (its
            // nodes; the constants share ferry's memory) is not needed any more.
            cm->plan.model.reset();
            cm->req = cm->model.create_infer_request();
            cm->dequant.resize(cm->plan.inputs.size());
            g_compiles++;
            g_attn_in_place += static_cast<uint64_t>(cm->plan.attention_in_place);
            const double total_ms = ms_since(t0);
            g_compile_us += static_cast<uint64_t>(total_ms * 1000.0);
            if (tracing()) {
                std::fprintf(
                    stderr, "[openvino] model %llu: translated in %.0f ms, compiled%s in %.0f ms\n",
                    static_cast<unsigned long long>(g_compiles.load()), translate_ms,
                    opts_.cache_dir.empty() ? "" : " (or loaded from --cache-dir)",
                    total_ms - translate_ms);
                trace_mem("compiled");
            }
            it = cache_.emplace(std::move(key), std::move(cm)).first;
        } else {
            g_hits++;
        }
        Compiled& cm = *it->second;
        const auto t1 = std::chrono::steady_clock::now();
        FERRY_TRY(bind(g, cm));
        cm.req.infer();
        g_runs++;
        // The first run also makes the plugin's kernels and repacks the weights for them.
        if (cm.runs++ == 0) trace_mem("first inference", ms_since(t1));
        if (profiling()) {
            for (const ov::ProfilingInfo& p : cm.req.get_profiling_info()) {
                auto& e = cm.prof[p.node_type + "/" + p.exec_type];
                e.first += static_cast<double>(p.real_time.count());
                e.second++;
            }
        }
        return store(g, cm);
    }

    static ov::Shape shape_of(const Tensor* t) {
        return {static_cast<size_t>(t->ne[3]), static_cast<size_t>(t->ne[2]),
                static_cast<size_t>(t->ne[1]), static_cast<size_t>(t->ne[0])};
    }

    // Row indices that come from the caller are checked before the run: OpenVINO's Gather
    // answers zeros for an index out of range instead of failing.
    Status check_indices(const Graph& g) {
        for (const Tensor* t : g.nodes) {
            const Tensor* idx = t->op == Op::GET_ROWS   ? t->src[1]
                                : t->op == Op::SET_ROWS ? t->src[2]
                                                        : nullptr;
            if (!idx || idx->op != Op::NONE || !idx->data || !idx->is_contiguous()) continue;
            const int64_t rows = t->op == Op::GET_ROWS ? t->src[0]->ne[1] : t->src[0]->ne[1];
            const auto* v = static_cast<const int32_t*>(idx->data);
            for (int64_t i = 0; i < idx->nelements(); i++) {
                if (v[i] < 0 || v[i] >= rows) {
                    return Status::errorf(ErrorCode::InvalidArgument,
                                          "%s: %s index %d at %lld out of range [0, %lld) in '%s'",
                                          dev_->name(), op_name(t->op), v[i],
                                          static_cast<long long>(i), static_cast<long long>(rows),
                                          t->name);
                }
            }
        }
        return Status::ok();
    }

    Status bind(const Graph& g, Compiled& cm) {
        FERRY_TRY(check_indices(g));
        int64_t sym[256] = {};
        auto scan = [&sym](const Tensor* t) {
            for (int d = 0; d < kMaxDims; d++) {
                if (t->dim_sym[d] != kDimFixed) sym[t->dim_sym[d]] = t->ne[d];
            }
        };
        for (const Tensor* t : g.leafs) scan(t);
        for (const Tensor* t : g.nodes) scan(t);
        const auto inputs = cm.model.inputs();
        for (size_t i = 0; i < cm.plan.inputs.size(); i++) {
            const ModelPlan::Input& in = cm.plan.inputs[i];
            if (in.kind == ModelPlan::Input::Symbol) {
                ov::Tensor v(ov::element::i64, ov::Shape{1});
                v.data<int64_t>()[0] = sym[in.sym];
                cm.req.set_tensor(inputs[i], v);
                continue;
            }
            Tensor* t = g.leafs[static_cast<size_t>(in.leaf)];
            if (!t->data)
                return Status::errorf("%s: leaf '%s' has no host memory", dev_->name(), t->name);
            if (in.kind == ModelPlan::Input::DequantLeaf) {
                const TypeTraits& tr = type_traits(t->type);
                std::vector<float>& buf = cm.dequant[i];
                buf.resize(static_cast<size_t>(t->nelements()));
                const int64_t n0 = t->ne[0];
                for (int64_t r = 0; r < t->nrows(); r++) {
                    tr.to_float(
                        static_cast<const uint8_t*>(t->data) + static_cast<size_t>(r) * t->nb[1],
                        buf.data() + r * n0, n0);
                }
                cm.req.set_tensor(inputs[i], ov::Tensor(ov::element::f32, shape_of(t), buf.data()));
                g_copied += buf.size() * sizeof(float);
                continue;
            }
            if (in.kind == ModelPlan::Input::StridedLeaf) {
                size_t span = 0;
                if (!tensor_span(t, &span))
                    return Status::errorf("leaf '%s' is malformed", t->name);
                cm.req.set_tensor(inputs[i],
                                  ov::Tensor(inputs[i].get_element_type(),
                                             ov::Shape{span / type_size(t->type)}, t->data));
            } else if (in.window) {
                // The first rows only (translate.h), in place.
                const int64_t rows = sym[in.window];
                if (rows <= 0 || rows > t->ne[1]) {
                    return Status::errorf("%s: window of %lld rows of '%s', which has %lld",
                                          dev_->name(), static_cast<long long>(rows), t->name,
                                          static_cast<long long>(t->ne[1]));
                }
                ov::Shape sh = shape_of(t);
                sh[2] = static_cast<size_t>(rows);
                g_window += static_cast<uint64_t>(rows) * t->nb[1];
                cm.req.set_tensor(inputs[i], ov::Tensor(inputs[i].get_element_type(), sh, t->data));
            } else if (t->is_contiguous()) {
                cm.req.set_tensor(inputs[i],
                                  ov::Tensor(inputs[i].get_element_type(), shape_of(t), t->data));
            } else {
                // A strided leaf (another split's view): read in place through its strides.
                const ov::Strides st{t->nb[3], t->nb[2], t->nb[1], t->nb[0]};
                cm.req.set_tensor(
                    inputs[i], ov::Tensor(inputs[i].get_element_type(), shape_of(t), t->data, st));
            }
        }
        return Status::ok();
    }

    Status store(const Graph& g, Compiled& cm) {
        const auto outputs = cm.model.outputs();
        for (size_t i = 0; i < cm.plan.outputs.size(); i++) {
            const ModelPlan::Output& o = cm.plan.outputs[i];
            if (o.kind == ModelPlan::Output::Node) {
                Tensor* t = g.nodes[static_cast<size_t>(o.node)];
                ov::Tensor r = cm.req.get_tensor(outputs[i]);
                if (!t->data)
                    return Status::errorf("%s: output '%s' has no host memory", dev_->name(),
                                          t->name);
                if (r.get_byte_size() != t->nbytes()) {
                    return Status::errorf("%s: output '%s' has %zu bytes, the model made %zu",
                                          dev_->name(), t->name, t->nbytes(), r.get_byte_size());
                }
                std::memcpy(t->data, r.data(), r.get_byte_size());
                g_copied += r.get_byte_size();
            } else if (o.kind == ModelPlan::Output::WriteIndex) {
                Tensor* s = g.leafs[static_cast<size_t>(o.node)];
                ov::Tensor idx = cm.req.get_tensor(outputs[i]);
                ov::Tensor val = cm.req.get_tensor(outputs[i + 1]);
                const size_t es = type_size(s->type);
                const size_t n = idx.get_size();
                const size_t limit = s->nbytes() / es;
                const int64_t* ix = idx.data<int64_t>();
                const auto* src = static_cast<const uint8_t*>(val.data());
                auto* dst = static_cast<uint8_t*>(s->data);
                if (!dst)
                    return Status::errorf("%s: '%s' has no host memory", dev_->name(), s->name);
                for (size_t e = 0; e < n; e++) {
                    if (ix[e] < 0 || static_cast<size_t>(ix[e]) >= limit) {
                        return Status::errorf("%s: write into '%s' at element %lld, past its %zu",
                                              dev_->name(), s->name, static_cast<long long>(ix[e]),
                                              limit);
                    }
                    if (s->type == Type::BF16) {
                        float f;
                        std::memcpy(&f, src + e * 4, 4);
                        const bf16_t h = fp32_to_bf16(f);
                        std::memcpy(dst + static_cast<size_t>(ix[e]) * es, &h, es);
                    } else {
                        std::memcpy(dst + static_cast<size_t>(ix[e]) * es, src + e * es, es);
                    }
                }
                g_copied += n * es;
                i++;  // the values result was consumed with its indices
            }
        }
        return Status::ok();
    }

    Device* dev_;
    std::string ov_name_;
    BackendOptions opts_;
    std::unordered_map<std::string, std::unique_ptr<Compiled>> cache_;
};

class OvDevice : public Device {
  public:
    explicit OvDevice(std::string ov_name)
        : ov_name_(ov_name), name_("OPENVINO:" + ov_name), bt_(this) {}
    const char* name() const override { return name_.c_str(); }
    std::string description() const override {
        try {
            if (ov::Core* c = core())
                return "OpenVINO " + c->get_property(ov_name_, ov::device::full_name);
        } catch (const std::exception&) {
        }
        return "OpenVINO " + ov_name_;
    }
    DeviceType type() const override { return DeviceType::ACCEL; }
    DeviceMemory memory() const override { return host_memory(); }
    DeviceCaps caps() const override {
        DeviceCaps c;
        c.size_dependent = false;
        return c;
    }
    BufferType* buffer_type() override { return &bt_; }
    bool supports_op(const Tensor* node) override {
        if (node->op == Op::NONE) return true;
        // A weight this device converted (prepare_weights) no longer holds its GGUF blocks
        // where another device would read them (converted in place, or its pages given back):
        // an op reading one stays here whatever else is said, so it is translated or fails
        // naming the op, never computed by the CPU from the converted bytes.
        for (int i = 0; i < kMaxSrc; i++) {
            const Tensor* s = node->src[i] ? node->src[i]->storage() : nullptr;
            if (s && s->extra && dynamic_cast<const OvBuffer*>(s->buffer)) return true;
        }
        if (g_declined.load() & (uint64_t{1} << static_cast<unsigned>(node->op))) return false;
        return translatable(node);
    }
    bool supports_buffer_type(const BufferType* type) override { return type->is_host(); }
    Status prepare_weights(std::span<Tensor* const> weights) override {
        trace_mem("weights loaded");
        try {
            for (Tensor* t : weights) {
                if (!is_quantized(t->type) || t->extra) continue;
                auto* buf = dynamic_cast<OvBuffer*>(t->buffer);
                if (!buf) continue;  // held elsewhere: dequantized per run instead
                Expected<std::unique_ptr<PreparedWeight>> w = prepare_weight(t, true);
                if (!w) return w.status();
                // The blocks of a weight converted apart are read by nobody any more: their
                // whole pages go back to the system (a reader gets an error, see converted()).
                if (!(*w)->in_place) (*w)->released = release_pages(t->data, t->nbytes());
                t->extra = w->get();
                buf->own(std::move(*w));
            }
        } catch (const std::exception& e) {
            return Status::errorf("%s: preparing weights: %s", name(), e.what());
        }
        if (tracing()) {
            size_t owned = 0, in_place = 0;
            for (const Tensor* t : weights) {
                const auto* w = static_cast<const PreparedWeight*>(t->extra);
                if (!w || !dynamic_cast<OvBuffer*>(t->buffer)) continue;
                owned += w->owned_bytes;
                in_place += w->in_place ? t->nbytes() : 0;
            }
            std::fprintf(
                stderr, "[openvino] weights converted: %.1f MiB in place, %.1f MiB apart\n",
                static_cast<double>(in_place) / 1048576.0, static_cast<double>(owned) / 1048576.0);
        }
        trace_mem("weights prepared");
        return Status::ok();
    }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& opts = {}) override {
        return std::unique_ptr<Backend>(new OvBackend(this, ov_name_, opts));
    }

  private:
    std::string ov_name_;
    std::string name_;
    OvBufferType bt_;
};

class OvRegistry : public Registry {
  public:
    OvRegistry() {
        ov::Core* c = core();
        if (!c) return;
        try {
            for (const std::string& d : c->get_available_devices()) {
                devices_.push_back(std::make_unique<OvDevice>(d));
            }
        } catch (const std::exception&) {
            // No plugin answered: the registry lists no device.
        }
    }
    const char* name() const override { return "OPENVINO"; }
    std::vector<Device*> devices() override {
        std::vector<Device*> out;
        for (auto& d : devices_) out.push_back(d.get());
        return out;
    }

  private:
    std::vector<std::unique_ptr<OvDevice>> devices_;
};

}  // namespace

void set_declined_ops(const std::vector<Op>& ops) {
    uint64_t m = 0;
    for (Op op : ops) m |= uint64_t{1} << static_cast<unsigned>(op);
    g_declined = m;
}

Stats stats() {
    Stats s;
    s.compiles = g_compiles.load();
    s.cache_hits = g_hits.load();
    s.compile_ms = static_cast<double>(g_compile_us.load()) / 1000.0;
    s.runs = g_runs.load();
    s.bytes_copied = g_copied.load();
    s.bytes_bound_window = g_window.load();
    s.attention_in_place = g_attn_in_place.load();
    return s;
}

}  // namespace openvino

std::unique_ptr<Registry> make_openvino_registry() {
    return std::make_unique<openvino::OvRegistry>();
}

}  // namespace ferry
