// Hugging Face folder -> GGUF (see convert.h for the conventions followed).
#include "ferry/convert.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "core/json.h"
#include "core/parallel.h"
#include "model/safetensors.h"

namespace ferry {

namespace {

constexpr double kPi = 3.14159265358979323846;

struct HfConfig {
    std::string arch;  // GGUF architecture
    int64_t n_embd = 0, n_layer = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    int64_t n_vocab = 0, n_ctx = 0;
    bool has_head_dim = false;
    double rope_theta = 10000.0, norm_eps = 1e-6;
    bool tied = false;
    std::string rope_type;  // "", "linear", "llama3"
    double rope_factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
    int64_t original_ctx = 8192;
};

// An integer field of config.json (obj[key]) in [lo, hi]; def when absent (required if def<0).
Status int_field(const json::Value& obj, const char* key, int64_t def, int64_t lo, int64_t hi,
                 int64_t* out, const std::string& file) {
    const json::Value* v = obj.find(key);
    if (!v || v->is_null()) {
        if (def < 0) return Status::errorf("%s: missing field '%s'", file.c_str(), key);
        *out = def;
        return Status::ok();
    }
    if (!v->is_integer() || v->as_int() < lo || v->as_int() > hi) {
        return Status::errorf("%s: field '%s' = %s is not an integer in [%lld, %lld]", file.c_str(),
                              key, json::dump(*v).c_str(), static_cast<long long>(lo),
                              static_cast<long long>(hi));
    }
    *out = v->as_int();
    return Status::ok();
}

Status num_field(const json::Value& obj, const char* key, double def, double* out,
                 const std::string& file) {
    const json::Value* v = obj.find(key);
    if (!v || v->is_null()) {
        *out = def;
        return Status::ok();
    }
    if (!v->is_number() || !std::isfinite(v->as_number()) || v->as_number() <= 0.0) {
        return Status::errorf("%s: field '%s' = %s is not a positive number", file.c_str(), key,
                              json::dump(*v).c_str());
    }
    *out = v->as_number();
    return Status::ok();
}

Expected<HfConfig> read_config(const std::string& dir) {
    const std::string file = dir + "/config.json";
    Expected<json::Value> jv = json::parse_file(file);
    if (!jv) return jv.status();
    const json::Value& j = *jv;
    HfConfig c;
    const std::string hf_arch = j["architectures"].at(0).as_string();
    if (hf_arch == "LlamaForCausalLM") {
        c.arch = "llama";
    } else if (hf_arch == "Qwen2ForCausalLM") {
        c.arch = "qwen2";
    } else if (hf_arch == "Qwen3ForCausalLM") {
        c.arch = "qwen3";
    } else {
        return Status::errorf(
            "%s: architectures[0] = '%s' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, "
            "Qwen3ForCausalLM)",
            file.c_str(), hf_arch.c_str());
    }
    // Sliding-window attention (a Qwen option the released Qwen 2.5/3 models leave off) is not
    // modelled: converting such a model would give wrong answers past the window.
    if (j["use_sliding_window"].as_bool()) {
        return Status::errorf("%s: use_sliding_window = true is not supported", file.c_str());
    }
    constexpr int64_t kBig = int64_t{1} << 24;
    FERRY_TRY(int_field(j, "hidden_size", -1, 1, kBig, &c.n_embd, file));
    FERRY_TRY(int_field(j, "num_hidden_layers", -1, 1, 4096, &c.n_layer, file));
    FERRY_TRY(int_field(j, "intermediate_size", -1, 1, kBig, &c.n_ff, file));
    FERRY_TRY(int_field(j, "num_attention_heads", -1, 1, 4096, &c.n_head, file));
    FERRY_TRY(int_field(j, "num_key_value_heads", c.n_head, 1, 4096, &c.n_head_kv, file));
    FERRY_TRY(int_field(j, "vocab_size", -1, 1, int64_t{1} << 31, &c.n_vocab, file));
    FERRY_TRY(int_field(j, "max_position_embeddings", 2048, 1, int64_t{1} << 31, &c.n_ctx, file));
    c.has_head_dim = j.find("head_dim") && !j["head_dim"].is_null();
    if (!c.has_head_dim && c.n_embd % c.n_head != 0) {
        return Status::errorf("%s: hidden_size %lld is not a multiple of num_attention_heads %lld",
                              file.c_str(), static_cast<long long>(c.n_embd),
                              static_cast<long long>(c.n_head));
    }
    FERRY_TRY(int_field(j, "head_dim", c.n_embd / c.n_head, 2, 65536, &c.head_dim, file));
    if (c.n_head % c.n_head_kv != 0) {
        return Status::errorf(
            "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
            file.c_str(), static_cast<long long>(c.n_head), static_cast<long long>(c.n_head_kv));
    }
    if (c.head_dim % 2 != 0) {
        return Status::errorf("%s: head size %lld is odd", file.c_str(),
                              static_cast<long long>(c.head_dim));
    }
    // transformers 4 writes rope_theta and rope_scaling; transformers 5 writes both in
    // rope_parameters (rope_type "default": no scaling).
    const json::Value& rp = j["rope_parameters"];
    FERRY_TRY(
        num_field(j.contains("rope_theta") ? j : rp, "rope_theta", 10000.0, &c.rope_theta, file));
    FERRY_TRY(num_field(j, "rms_norm_eps", 1e-6, &c.norm_eps, file));
    c.tied = j["tie_word_embeddings"].as_bool();
    const json::Value& rs = j["rope_scaling"].is_object() ? j["rope_scaling"] : rp;
    if (rs.is_object()) {
        c.rope_type =
            rs.contains("rope_type") ? rs["rope_type"].as_string() : rs["type"].as_string();
        if (c.rope_type == "default") c.rope_type.clear();
        const std::string f = file + " rope_scaling";
        if (c.rope_type == "linear" || c.rope_type == "llama3") {
            FERRY_TRY(num_field(rs, "factor", 1.0, &c.rope_factor, f));
        }
        if (c.rope_type == "llama3") {
            if (c.arch != "llama") {
                return Status::errorf("%s: llama3 rope scaling on a %s model", file.c_str(),
                                      c.arch.c_str());
            }
            FERRY_TRY(num_field(rs, "low_freq_factor", 1.0, &c.low_freq_factor, f));
            FERRY_TRY(num_field(rs, "high_freq_factor", 4.0, &c.high_freq_factor, f));
            FERRY_TRY(int_field(rs, "original_max_position_embeddings", 8192, 1, int64_t{1} << 31,
                                &c.original_ctx, f));
            if (c.high_freq_factor <= c.low_freq_factor) {
                return Status::errorf("%s: high_freq_factor %g must exceed low_freq_factor %g",
                                      f.c_str(), c.high_freq_factor, c.low_freq_factor);
            }
        } else if (!c.rope_type.empty() && c.rope_type != "linear") {
            return Status::errorf("%s: rope_scaling type '%s' is not supported (linear, llama3)",
                                  file.c_str(), c.rope_type.c_str());
        }
    } else if (!rs.is_null()) {
        return Status::errorf("%s: rope_scaling is not an object", file.c_str());
    }
    return c;
}

// One tensor the output must have: its GGUF name, the HF shape config.json implies (outermost
// first), and whether its rows are permuted (llama Q/K: n heads).
struct Want {
    std::string gguf;
    std::vector<int64_t> shape;
    int64_t permute_heads = 0;
    bool required = true;
};

std::map<std::string, Want> expected_tensors(const HfConfig& c) {
    std::map<std::string, Want> w;
    const int64_t n_q = c.n_head * c.head_dim, n_kv = c.n_head_kv * c.head_dim;
    const bool llama = c.arch == "llama";
    w["model.embed_tokens.weight"] = {"token_embd.weight", {c.n_vocab, c.n_embd}};
    w["model.norm.weight"] = {"output_norm.weight", {c.n_embd}};
    w["lm_head.weight"] = {"output.weight", {c.n_vocab, c.n_embd}, 0, !c.tied};
    for (int64_t i = 0; i < c.n_layer; i++) {
        const std::string h = "model.layers." + std::to_string(i) + ".";
        const std::string g = "blk." + std::to_string(i) + ".";
        w[h + "input_layernorm.weight"] = {g + "attn_norm.weight", {c.n_embd}};
        w[h + "self_attn.q_proj.weight"] = {
            g + "attn_q.weight", {n_q, c.n_embd}, llama ? c.n_head : 0};
        w[h + "self_attn.k_proj.weight"] = {
            g + "attn_k.weight", {n_kv, c.n_embd}, llama ? c.n_head_kv : 0};
        w[h + "self_attn.v_proj.weight"] = {g + "attn_v.weight", {n_kv, c.n_embd}};
        w[h + "self_attn.o_proj.weight"] = {g + "attn_output.weight", {c.n_embd, n_q}};
        if (c.arch == "qwen2") {
            w[h + "self_attn.q_proj.bias"] = {g + "attn_q.bias", {n_q}};
            w[h + "self_attn.k_proj.bias"] = {g + "attn_k.bias", {n_kv}};
            w[h + "self_attn.v_proj.bias"] = {g + "attn_v.bias", {n_kv}};
        }
        if (c.arch == "qwen3") {
            w[h + "self_attn.q_norm.weight"] = {g + "attn_q_norm.weight", {c.head_dim}};
            w[h + "self_attn.k_norm.weight"] = {g + "attn_k_norm.weight", {c.head_dim}};
        }
        w[h + "post_attention_layernorm.weight"] = {g + "ffn_norm.weight", {c.n_embd}};
        w[h + "mlp.gate_proj.weight"] = {g + "ffn_gate.weight", {c.n_ff, c.n_embd}};
        w[h + "mlp.up_proj.weight"] = {g + "ffn_up.weight", {c.n_ff, c.n_embd}};
        w[h + "mlp.down_proj.weight"] = {g + "ffn_down.weight", {c.n_embd, c.n_ff}};
    }
    return w;
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

bool file_exists(const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0;
}

// Opens the safetensors files of dir: the index's shards, else model.safetensors.
Status open_shards(const std::string& dir, std::vector<std::unique_ptr<SafetensorsFile>>* out) {
    const std::string index = dir + "/model.safetensors.index.json";
    std::vector<std::string> files;
    if (file_exists(index)) {
        Expected<json::Value> j = json::parse_file(index);
        if (!j) return j.status();
        const json::Value& map = (*j)["weight_map"];
        if (!map.is_object() || map.size() == 0) {
            return Status::errorf("%s: 'weight_map' is missing or empty", index.c_str());
        }
        std::set<std::string> seen;
        for (const json::Value::Member& m : map.as_object()) {
            const std::string& f = m.second.as_string();
            if (f.empty() || f.find('/') != std::string::npos || f[0] == '.') {
                return Status::errorf("%s: weight_map['%s'] = %s is not a file name in the folder",
                                      index.c_str(), m.first.c_str(), json::dump(m.second).c_str());
            }
            if (seen.insert(f).second) files.push_back(dir + "/" + f);
        }
    } else if (file_exists(dir + "/model.safetensors")) {
        files.push_back(dir + "/model.safetensors");
    } else {
        return Status::errorf("%s: no model.safetensors or model.safetensors.index.json",
                              dir.c_str());
    }
    for (const std::string& f : files) {
        Expected<std::unique_ptr<SafetensorsFile>> s = SafetensorsFile::open(f);
        if (!s) return s.status();
        out->push_back(std::move(*s));
    }
    return Status::ok();
}

}  // namespace

// Meta's published formula (also Hugging Face's "llama3" rope type): wavelengths shorter than
// original_ctx / high_freq_factor keep their frequency, longer than original_ctx /
// low_freq_factor are divided by factor, and those between blend smoothly.
std::vector<float> llama3_rope_factors(int64_t head_dim, double rope_theta, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       int64_t original_ctx) {
    std::vector<float> out;
    const double ctx = static_cast<double>(original_ctx);
    const double low_wavelen = ctx / low_freq_factor, high_wavelen = ctx / high_freq_factor;
    for (int64_t i = 0; i < head_dim; i += 2) {
        const double freq =
            1.0 / std::pow(rope_theta, static_cast<double>(i) / static_cast<double>(head_dim));
        const double wavelen = 2.0 * kPi / freq;
        double f = 1.0;
        if (wavelen > low_wavelen) {
            f = factor;
        } else if (wavelen >= high_wavelen) {
            const double smooth =
                (ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
            f = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        out.push_back(static_cast<float>(f));
    }
    return out;
}

Type convert_fallback_type(Type want, int64_t ne0) {
    if (ne0 % block_size(want) == 0) return want;
    // llama.cpp's quantizer's substitutes for rows a super-block does not divide.
    Type t = Type::Q8_0;
    switch (want) {
        case Type::Q4_K:
            t = Type::Q5_0;
            break;
        case Type::Q5_K:
            t = Type::Q5_1;
            break;
        case Type::Q2_K:
        case Type::Q3_K:
        case Type::IQ4_XS:
            t = Type::IQ4_NL;
            break;
        default:
            break;
    }
    return ne0 % block_size(t) == 0 ? t : Type::F16;
}

Status convert_hf_to_gguf(const ConvertOptions& o) {
    if (file_exists(o.out_path) && !o.force) {
        return Status::errorf("%s exists; pass --force to overwrite it", o.out_path.c_str());
    }
    const TypeTraits* tt = type_traits_or_null(static_cast<uint32_t>(o.type));
    if (!tt || !tt->is_storage || o.type == Type::I32 || o.type == Type::Q8_K) {
        return Status::errorf("convert: %s is not a weight type", type_name(o.type));
    }
    Expected<HfConfig> cfg = read_config(o.hf_dir);
    if (!cfg) return cfg.status();
    const HfConfig& c = *cfg;
    std::vector<std::unique_ptr<SafetensorsFile>> shards;
    FERRY_TRY(open_shards(o.hf_dir, &shards));

    // Match every stored tensor to what config.json implies, before writing anything.
    std::map<std::string, Want> want = expected_tensors(c);
    struct Src {
        const StTensor* t;
        const SafetensorsFile* file;
    };
    std::map<std::string, Src> found;  // HF name -> source
    uint64_t total = 0;
    for (const auto& s : shards) {
        for (const StTensor& t : s->tensors()) {
            // Rotary caches some checkpoints carry are recomputed from the config.
            if (t.name.find("rotary_emb.inv_freq") != std::string::npos) continue;
            auto it = want.find(t.name);
            if (it == want.end()) {
                return Status::errorf("%s: tensor '%s' is not part of a %s model (config.json)",
                                      s->path().c_str(), t.name.c_str(), c.arch.c_str());
            }
            if (t.shape != it->second.shape) {
                return Status::errorf("%s: tensor '%s' has shape %s; config.json implies %s",
                                      s->path().c_str(), t.name.c_str(), shape_str(t.shape).c_str(),
                                      shape_str(it->second.shape).c_str());
            }
            if (!found.emplace(t.name, Src{&t, s.get()}).second) {
                return Status::errorf("%s: tensor '%s' appears in two files", s->path().c_str(),
                                      t.name.c_str());
            }
            total += t.nbytes();
        }
    }
    for (const auto& [name, w] : want) {
        if (w.required && !found.count(name)) {
            return Status::errorf("%s: tensor '%s' (shape %s) is missing", o.hf_dir.c_str(),
                                  name.c_str(), shape_str(w.shape).c_str());
        }
    }

    GgufWriter w;
    const std::string& a = c.arch;
    std::string name = o.hf_dir;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    name = name.substr(name.find_last_of('/') + 1);
    w.add_string("general.architecture", a);
    w.add_string("general.name", name);
    w.add_u32(a + ".block_count", static_cast<uint32_t>(c.n_layer));
    w.add_u32(a + ".context_length", static_cast<uint32_t>(c.n_ctx));
    w.add_u32(a + ".embedding_length", static_cast<uint32_t>(c.n_embd));
    w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(c.n_ff));
    w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(c.n_head));
    w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
    w.add_f32(a + ".rope.freq_base", static_cast<float>(c.rope_theta));
    w.add_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.norm_eps));
    if (c.has_head_dim) {
        w.add_u32(a + ".attention.key_length", static_cast<uint32_t>(c.head_dim));
        w.add_u32(a + ".attention.value_length", static_cast<uint32_t>(c.head_dim));
    }
    w.add_u32("general.file_type", gguf_file_type(o.type));
    if (a == "llama") {
        w.add_u32(a + ".vocab_size", static_cast<uint32_t>(c.n_vocab));
        w.add_u32(a + ".rope.dimension_count", static_cast<uint32_t>(c.head_dim));
    }
    if (c.rope_type == "linear") {
        w.add_string(a + ".rope.scaling.type", "linear");
        w.add_f32(a + ".rope.scaling.factor", static_cast<float>(c.rope_factor));
    }
    w.add_u32("general.quantization_version", 2);
    FERRY_TRY(convert_tokenizer(o.hf_dir, c.n_vocab, w));

    if (c.rope_type == "llama3") {
        const std::vector<float> f =
            llama3_rope_factors(c.head_dim, c.rope_theta, c.rope_factor, c.low_freq_factor,
                                c.high_freq_factor, c.original_ctx);
        const int64_t ne[1] = {static_cast<int64_t>(f.size())};
        FERRY_TRY(w.add_tensor("rope_freqs.weight", Type::F32, 1, ne, f.data(), f.size() * 4));
    }
    // Output order: embeddings, the layers in order, then the output norm and matrix.
    std::vector<std::string> order;
    order.push_back("model.embed_tokens.weight");
    for (int64_t i = 0; i < c.n_layer; i++) {
        const std::string p = "model.layers." + std::to_string(i) + ".";
        for (const auto& [hf, _] : want) {
            if (hf.compare(0, p.size(), p) == 0) order.push_back(hf);
        }
    }
    order.push_back("model.norm.weight");
    order.push_back("lm_head.weight");

    const int n_threads = o.n_threads > 0
                              ? o.n_threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    uint64_t done = 0;
    std::vector<float> f32, tmp;
    std::vector<uint8_t> bytes;
    for (const std::string& hf : order) {
        auto it = found.find(hf);
        if (it == found.end()) continue;  // lm_head of a tied model
        const Want& wt = want.at(hf);
        const StTensor& t = *it->second.t;
        if (hf == "lm_head.weight" && c.tied) continue;  // the embeddings serve as output
        f32.resize(t.nelements);
        SafetensorsFile::to_f32(t, f32.data(), 0, t.nelements);
        for (float v : f32) {
            if (!std::isfinite(v)) {
                return Status::errorf("%s: tensor '%s' holds a non-finite value",
                                      it->second.file->path().c_str(), hf.c_str());
            }
        }
        const int64_t ne0 = t.shape.back();
        const int64_t ne1 = t.shape.size() == 2 ? t.shape[0] : 1;
        if (wt.permute_heads > 0) {
            // Rows of head h come as [2, hd/2] (rotate-half halves); GGUF llama wants them as
            // [hd/2, 2] (adjacent pairs), the order its rope rotates.
            const int64_t hd = ne1 / wt.permute_heads, half = hd / 2;
            tmp = f32;
            for (int64_t h = 0; h < wt.permute_heads; h++) {
                for (int64_t j = 0; j < 2; j++) {
                    for (int64_t i = 0; i < half; i++) {
                        const int64_t src = h * hd + j * half + i, dst = h * hd + i * 2 + j;
                        std::copy_n(tmp.data() + src * ne0, ne0, f32.data() + dst * ne0);
                    }
                }
            }
        }
        const Type type = t.shape.size() == 1 ? Type::F32 : convert_fallback_type(o.type, ne0);
        Expected<size_t> rs = row_size_checked(type, ne0);
        if (!rs) return rs.status().context(hf);
        bytes.resize(*rs * static_cast<size_t>(ne1));
        // Rows are independent: quantize them on every core (K-quants of a 1B model take
        // minutes on one).
        FERRY_TRY(parallel_items(ne1, n_threads, [&](int64_t r) {
                      return from_float_row(type, f32.data() + r * ne0,
                                            bytes.data() + static_cast<size_t>(r) * *rs, ne0);
                  }).context(hf));
        const int64_t ne[2] = {ne0, ne1};
        FERRY_TRY(w.add_tensor(wt.gguf, type, static_cast<int>(t.shape.size()), ne, bytes.data(),
                               bytes.size()));
        done += t.nbytes();
        if (o.progress) o.progress(done, total, wt.gguf);
    }
    if (file_exists(o.out_path) && !o.force) {
        return Status::errorf("%s appeared while converting; pass --force to overwrite it",
                              o.out_path.c_str());
    }
    return w.write(o.out_path);
}

}  // namespace ferry
