// Model loading for every architecture (arch*.cpp): hyperparameters, weight checks, placement.
#include "ferry/llama.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "ferry/allocator.h"
#include "model/arch.h"
#include "model/llama-impl.h"

namespace ferry {

namespace {

// Reads llama.<key> as an integer in [lo, hi]; `def` when absent (required when def < 0).
Status read_int(const GgufFile& f, const std::string& key, int64_t def, int64_t lo, int64_t hi,
                int32_t* out) {
    const GgufKV* kv = f.find_kv(key);
    if (!kv) {
        if (def < 0) return Status::errorf("missing metadata key '%s'", key.c_str());
        *out = static_cast<int32_t>(def);
        return Status::ok();
    }
    Expected<int64_t> v = f.get_int(key);
    if (!v) return v.status();
    if (*v < lo || *v > hi) {
        return Status::errorf("metadata key '%s' = %lld is outside [%lld, %lld]", key.c_str(),
                              static_cast<long long>(*v), static_cast<long long>(lo),
                              static_cast<long long>(hi));
    }
    *out = static_cast<int32_t>(*v);
    return Status::ok();
}

// Reads a float key (float or integer in the file); `def` when absent unless `required`.
Status read_float(const GgufFile& f, const std::string& key, bool required, float def, float* out) {
    const GgufKV* kv = f.find_kv(key);
    if (!kv) {
        if (required) return Status::errorf("missing metadata key '%s'", key.c_str());
        *out = def;
        return Status::ok();
    }
    double v = 0.0;
    if (kv->value.type == GgufValueType::FLOAT32 || kv->value.type == GgufValueType::FLOAT64) {
        v = kv->value.f;
    } else if (gguf_is_integer(kv->value.type)) {
        Expected<int64_t> i = f.get_int(key);
        if (!i) return i.status();
        v = static_cast<double>(*i);
    } else {
        return Status::errorf("metadata key '%s' is not a number", key.c_str());
    }
    if (!std::isfinite(v)) return Status::errorf("metadata key '%s' is not finite", key.c_str());
    *out = static_cast<float>(v);
    return Status::ok();
}

Status read_hparams(const GgufFile& f, LlamaHParams* hp) {
    const std::string a = hp->arch + ".";
    constexpr int64_t kBig = 1 << 24;
    FERRY_TRY(read_int(f, a + "context_length", -1, 1, kBig, &hp->n_ctx_train));
    FERRY_TRY(read_int(f, a + "embedding_length", -1, 1, kBig, &hp->n_embd));
    FERRY_TRY(read_int(f, a + "block_count", -1, 1, 4096, &hp->n_layer));
    FERRY_TRY(read_int(f, a + "feed_forward_length", -1, 1, kBig, &hp->n_ff));
    FERRY_TRY(read_int(f, a + "attention.head_count", -1, 1, 4096, &hp->n_head));
    FERRY_TRY(read_int(f, a + "attention.head_count_kv", hp->n_head, 1, 4096, &hp->n_head_kv));
    if (hp->n_head % hp->n_head_kv != 0) {
        return Status::errorf("%sattention.head_count %d is not a multiple of head_count_kv %d",
                              a.c_str(), hp->n_head, hp->n_head_kv);
    }
    if (!f.find_kv(a + "attention.key_length") && hp->n_embd % hp->n_head != 0) {
        return Status::errorf("%sembedding_length %d is not a multiple of head_count %d", a.c_str(),
                              hp->n_embd, hp->n_head);
    }
    FERRY_TRY(
        read_int(f, a + "attention.key_length", hp->n_embd / hp->n_head, 2, 65536, &hp->head_dim));
    if (hp->head_dim < 2) {
        return Status::errorf(
            "head size %d (%sembedding_length %d / head_count %d) is too "
            "small",
            hp->head_dim, a.c_str(), hp->n_embd, hp->n_head);
    }
    int32_t v_len = 0;
    FERRY_TRY(read_int(f, a + "attention.value_length", hp->head_dim, 1, 65536, &v_len));
    if (v_len != hp->head_dim) {
        return Status::errorf(
            "%sattention.value_length %d differs from key_length %d "
            "(unsupported)",
            a.c_str(), v_len, hp->head_dim);
    }
    FERRY_TRY(read_int(f, a + "rope.dimension_count", hp->head_dim, 2, hp->head_dim, &hp->n_rot));
    if (hp->n_rot < 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0) {
        return Status::errorf("%srope.dimension_count %d must be even and in [2, %d]", a.c_str(),
                              hp->n_rot, hp->head_dim);
    }
    FERRY_TRY(read_float(f, a + "rope.freq_base", false, 10000.0f, &hp->rope_freq_base));
    if (hp->rope_freq_base <= 0.0f) {
        return Status::errorf("%srope.freq_base %g must be positive", a.c_str(),
                              hp->rope_freq_base);
    }
    if (const GgufKV* kv = f.find_kv(a + "rope.scaling.type")) {
        Expected<std::string> t = f.get_string(kv->key);
        if (!t) return t.status();
        // llama3 scaling lives in rope_freqs.weight (per-dimension factors), not in a scale.
        if (*t != "none" && *t != "linear" && *t != "llama3") {
            return Status::errorf(
                "%srope.scaling.type '%s' is not supported (none, linear, llama3)", a.c_str(),
                t->c_str());
        }
    }
    float factor = 1.0f;
    FERRY_TRY(read_float(f, a + "rope.scale_linear", false, 1.0f, &factor));
    FERRY_TRY(read_float(f, a + "rope.scaling.factor", false, factor, &factor));
    if (factor == 0.0f) factor = 1.0f;  // converters write 0 for "no scaling"
    if (factor < 0.0f) return Status::errorf("rope scaling factor %g must be positive", factor);
    hp->rope_freq_scale = 1.0f / factor;
    FERRY_TRY(read_float(f, a + "attention.layer_norm_rms_epsilon", true, 0.0f, &hp->norm_eps));
    if (hp->norm_eps < 0.0f) {
        return Status::errorf("%sattention.layer_norm_rms_epsilon %g is negative", a.c_str(),
                              hp->norm_eps);
    }
    return Status::ok();
}

std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

class Loader {
  public:
    Loader(LlamaModel::Impl& m) : m_(m), f_(*m.gguf), t_(m) {}

    Status take_all() {
        const LlamaHParams& hp = m_.hp;
        const int64_t n_embd = hp.n_embd, n_vocab = hp.n_vocab;
        FERRY_TRY(t_.take("token_embd.weight", {n_embd, n_vocab}, false, &m_.tok_embd));
        FERRY_TRY(t_.take("output_norm.weight", {n_embd}, true, &m_.output_norm));
        if (f_.find_tensor("output.weight")) {
            FERRY_TRY(t_.take("output.weight", {n_embd, n_vocab}, false, &m_.output));
        } else {
            m_.output = m_.tok_embd;
            m_.hp.tied_output = true;
        }
        FERRY_TRY(t_.take_rope_freqs());
        m_.layers.resize(static_cast<size_t>(hp.n_layer));
        for (int il = 0; il < hp.n_layer; il++) {
            FERRY_TRY(m_.arch->take_layer(t_, il, m_.layers[static_cast<size_t>(il)]));
        }
        tensors_ = t_.tensors();
        infos_ = t_.infos();
        return Status::ok();
    }

    void summarize() {
        std::map<Type, uint64_t> elems_by_type;
        for (size_t i = 0; i < tensors_.size(); i++) {
            const Tensor* t = tensors_[i];
            m_.n_params += static_cast<uint64_t>(t->nelements());
            m_.size_bytes += t->nbytes();
            if (t->ne[1] > 1) elems_by_type[t->type] += static_cast<uint64_t>(t->nelements());
        }
        const char* ft = nullptr;
        if (f_.find_kv("general.file_type")) {
            Expected<int64_t> v = f_.get_int("general.file_type");
            if (v) ft = gguf_file_type_name(*v);
        }
        if (ft) {
            m_.type_desc = ft;
        } else {
            Type best = Type::F32;
            uint64_t most = 0;
            for (auto& [t, n] : elems_by_type) {
                if (n > most) {
                    most = n;
                    best = t;
                }
            }
            m_.type_desc = upper(type_name(best));
        }
    }

    // The device of a weight, by its name: blk.N.* follows layer N, token_embd the input
    // device, everything else (output norm, output) the main device.
    Device* device_of(const Tensor* t) const {
        const char* n = t->name;
        if (std::strncmp(n, "blk.", 4) == 0) {
            const long il = std::strtol(n + 4, nullptr, 10);
            if (il >= 0 && static_cast<size_t>(il) < m_.layer_device.size())
                return m_.layer_device[static_cast<size_t>(il)];
        }
        if (std::strncmp(n, "token_embd.", 11) == 0) return m_.input_device;
        return m_.device;
    }

    // Every weight into the memory of its device: the CPU computes from the mapped file when
    // asked (or when the file is in memory already), other devices get uploads.
    Status place(bool mmap, const std::function<void(float)>& progress) {
        std::vector<Device*> order;
        std::map<Device*, std::vector<size_t>> groups;
        for (size_t i = 0; i < tensors_.size(); i++) {
            Device* d = device_of(tensors_[i]);
            if (!groups.count(d)) order.push_back(d);
            groups[d].push_back(i);
        }
        uint64_t done = 0;
        for (Device* d : order) {
            if (d->type() == DeviceType::CPU && (mmap || !f_.is_mapped())) {
                FERRY_TRY(place_mapped(d, groups[d]));
            } else {
                FERRY_TRY(place_uploaded(d, groups[d], &done, progress));
            }
        }
        if (progress) progress(1.0f);
        return Status::ok();
    }

    // Zero copy: the CPU reads the mapped file through a buffer that wraps it.
    Status place_mapped(Device* dev, const std::vector<size_t>& idx) {
        size_t max_tensor = 0;
        for (size_t i : idx) max_tensor = std::max(max_tensor, tensors_[i]->nbytes());
        Expected<std::unique_ptr<Buffer>> b = dev->buffer_from_host_ptr(
            const_cast<uint8_t*>(f_.file_data()), f_.file_size(), max_tensor);
        if (!b) return b.status().context("mapping weights");
        Buffer* buf = b->get();
        buf->set_usage(BufferUsage::Weights);
        m_.buffers.push_back(std::move(*b));
        for (size_t i : idx) {
            FERRY_TRY(place_tensor(tensors_[i], buf, f_.data_offset() + infos_[i]->offset));
        }
        return Status::ok();
    }

    // Device memory: one buffer of the device's type, tensors uploaded one by one.
    Status place_uploaded(Device* dev, const std::vector<size_t>& idx, uint64_t* done,
                          const std::function<void(float)>& progress) {
        BufferType* bt = dev->buffer_type();
        size_t total = 0;
        for (size_t i : idx) total = align_tensor_offset(total, bt) + bt->alloc_size(tensors_[i]);
        Expected<std::unique_ptr<Buffer>> b = bt->allocate_for(total, BufferUsage::Weights);
        if (!b) {
            return b.status().context(strfmt("allocating %.1f MiB of weights on %s",
                                             static_cast<double>(total) / 1048576.0, dev->name()));
        }
        Buffer* buf = b->get();
        m_.buffers.push_back(std::move(*b));
        size_t off = 0;
        for (size_t i : idx) {
            Tensor* t = tensors_[i];
            off = align_tensor_offset(off, bt);
            FERRY_TRY(place_tensor(t, buf, off));
            off += bt->alloc_size(t);
            FERRY_TRY(buf->set_tensor(t, f_.tensor_data(*infos_[i]), 0, t->nbytes())
                          .context(strfmt("uploading '%s' to %s", t->name, dev->name())));
            // The copy is all we need now: the file's pages leave this process as we go, so
            // they are never counted alongside the copy.
            f_.release_pages(f_.tensor_data(*infos_[i]), t->nbytes());
            *done += t->nbytes();
            if (progress) {
                progress(
                    static_cast<float>(static_cast<double>(*done) /
                                       static_cast<double>(std::max<uint64_t>(m_.size_bytes, 1))));
            }
        }
        return Status::ok();
    }

    // Weights per device, for Device::prepare_weights.
    std::map<Device*, std::vector<Tensor*>> by_device() const {
        std::map<Device*, std::vector<Tensor*>> out;
        for (Tensor* t : tensors_) out[device_of(t)].push_back(t);
        return out;
    }

  private:
    LlamaModel::Impl& m_;
    const GgufFile& f_;
    TensorLoader t_;
    std::vector<const GgufTensorInfo*> infos_;
    std::vector<Tensor*> tensors_;

  public:
    std::span<Tensor* const> tensors() const { return tensors_; }
};

// Which device each layer lives on (ModelOptions::devices, n_gpu_layers, tensor_split).
Status assign_layers(LlamaModel::Impl& m, const ModelOptions& opts) {
    Device* cpu = cpu_device();
    if (!cpu) return Status::error("no CPU device (ferry::init_backends was not called)");
    const int32_t n_layer = m.hp.n_layer;
    const std::vector<Device*>& devs = opts.devices;
    for (Device* d : devs) {
        if (!d) return Status::error(ErrorCode::InvalidArgument, "no device given (null)");
    }
    if (!opts.tensor_split.empty()) {
        if (opts.tensor_split.size() != devs.size()) {
            return Status::errorf(ErrorCode::InvalidArgument,
                                  "tensor split has %zu shares for %zu devices",
                                  opts.tensor_split.size(), devs.size());
        }
        float sum = 0;
        for (float f : opts.tensor_split) {
            if (!(f >= 0) || !std::isfinite(f)) {
                return Status::errorf(ErrorCode::InvalidArgument,
                                      "tensor split share %g is not a non-negative number", f);
            }
            sum += f;
        }
        if (!(sum > 0))
            return Status::error(ErrorCode::InvalidArgument, "tensor split shares sum to 0");
    }
    int32_t ngl = devs.empty() ? 0 : opts.n_gpu_layers;
    if (ngl < 0 || ngl > n_layer) ngl = devs.empty() ? 0 : n_layer;
    const int32_t first = n_layer - ngl;
    m.layer_device.assign(static_cast<size_t>(n_layer), cpu);
    // Offloaded layer k of ngl goes to the device whose share covers its position.
    std::vector<double> cum;
    double total = 0;
    for (size_t j = 0; j < devs.size(); j++) {
        total += opts.tensor_split.empty() ? 1.0 : opts.tensor_split[j];
        cum.push_back(total);
    }
    for (int32_t k = 0; k < ngl; k++) {
        const double at = (static_cast<double>(k) + 0.5) / static_cast<double>(ngl) * total;
        size_t j = 0;
        while (j + 1 < devs.size() && at >= cum[j]) j++;
        m.layer_device[static_cast<size_t>(first + k)] = devs[j];
    }
    m.input_device = ngl == n_layer && n_layer > 0 ? m.layer_device[0] : cpu;
    m.device = ngl > 0 ? m.layer_device[static_cast<size_t>(n_layer - 1)] : cpu;
    return Status::ok();
}

Status load_into(LlamaModel::Impl& m, const ModelOptions& opts) {
    if (!m.gguf) {
        Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(m.path);
        if (!f) return f.status();
        m.gguf = std::move(*f);
    }
    const GgufFile& g = *m.gguf;
    Expected<std::string> arch = g.get_string("general.architecture");
    if (!arch) return arch.status();
    m.arch = find_arch(*arch);
    if (!m.arch) {
        return Status::errorf("unsupported architecture '%s' (general.architecture); ferry runs %s",
                              arch->c_str(), known_arch_names().c_str());
    }
    m.hp.arch = m.arch->name;
    m.hp.rope_mode = m.arch->rope_mode;
    FERRY_TRY(read_hparams(g, &m.hp));
    Expected<Vocab> vocab = Vocab::from_gguf(g);
    if (!vocab) return vocab.status();
    m.vocab = std::move(*vocab);
    m.hp.n_vocab = m.vocab.n_tokens();
    if (m.hp.n_vocab <= 0) return Status::error("the vocabulary is empty");

    Loader loader(m);
    FERRY_TRY(loader.take_all());
    loader.summarize();

    FERRY_TRY(assign_layers(m, opts));
    FERRY_TRY(loader.place(opts.mmap, opts.progress));
    // Every weight is in: each device may convert or repack its weights once.
    for (auto& [dev, ts] : loader.by_device()) {
        FERRY_TRY(dev->prepare_weights(ts).context(strfmt("preparing weights on %s", dev->name())));
    }
    return Status::ok();
}

}  // namespace

Expected<std::unique_ptr<LlamaModel>> LlamaModel::load(std::unique_ptr<GgufFile> file,
                                                       const ModelOptions& opts) {
    std::unique_ptr<LlamaModel> model(new LlamaModel());
    model->impl_ = std::make_unique<Impl>();
    model->impl_->path = file->path();
    model->impl_->gguf = std::move(file);
    const std::string& path = model->impl_->path;
    Status st = load_into(*model->impl_, opts);
    if (!st) {
        if (st.message().find(path) != std::string::npos) return st;
        return st.context("loading " + path);
    }
    return model;
}

Expected<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& path,
                                                       const ModelOptions& opts) {
    std::unique_ptr<LlamaModel> model(new LlamaModel());
    model->impl_ = std::make_unique<Impl>();
    model->impl_->path = path;
    Status st = load_into(*model->impl_, opts);
    if (!st) {
        // GGUF errors already name the file.
        if (st.message().find(path) != std::string::npos) return st;
        return st.context("loading " + path);
    }
    return model;
}

LlamaModel::~LlamaModel() = default;

const LlamaHParams& LlamaModel::hparams() const {
    return impl_->hp;
}
const Vocab& LlamaModel::vocab() const {
    return impl_->vocab;
}
const GgufFile& LlamaModel::gguf() const {
    return *impl_->gguf;
}
const std::string& LlamaModel::path() const {
    return impl_->path;
}
uint64_t LlamaModel::n_params() const {
    return impl_->n_params;
}
uint64_t LlamaModel::size_bytes() const {
    return impl_->size_bytes;
}
uint64_t LlamaModel::step_weight_bytes() const {
    const Tensor* e = impl_->tok_embd;
    if (!e || impl_->output == e) return impl_->size_bytes;
    return impl_->size_bytes - e->nbytes() + e->nb[1];
}
std::string LlamaModel::type_desc() const {
    return impl_->type_desc;
}
Device* LlamaModel::device() const {
    return impl_->device;
}
Device* LlamaModel::layer_device(int32_t il) const {
    if (il < 0 || static_cast<size_t>(il) >= impl_->layer_device.size()) return nullptr;
    return impl_->layer_device[static_cast<size_t>(il)];
}

}  // namespace ferry
