// `ferry convert` and the llama / qwen2 / qwen3 architectures against Hugging Face
// transformers: tiny random-weight HF folders (tests/data/hf/, made by
// tests/data/make-hf-oracles.py) are converted by the real command, loaded, and their logits
// compared with the float64 logits transformers computed (oracle.json). Also the converter's
// metadata, its fallbacks and its errors, the safetensors reader's bounds checks, and the
// remote backend on the converted models.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/json.h"
#include "ferry/convert.h"
#include "ferry/gen-model.h"
#include "ferry/gguf.h"
#include "ferry/llama.h"
#include "ferry/vocab.h"
#include "model/safetensors.h"
#include "shell.h"
#include "test_remote_util.h"

using namespace ferry;

namespace {

const std::string kHf = std::string(FERRY_TEST_DATA_DIR) + "/hf";
const std::string kBin = FERRY_BIN;

ferry::testing::ShellResult sh(const std::string& cmd) {
    return ferry::testing::run_shell(cmd + " 2>&1");
}

std::string tmp_dir() {
    static const std::string d = ferry::test::make_temp_dir();
    return d;
}

struct Oracle {
    std::vector<int32_t> tokens;
    std::vector<std::vector<double>> logits;  // [n_tokens][n_vocab]
};

Oracle read_oracle(const std::string& arch) {
    Oracle o;
    Expected<json::Value> j = json::parse_file(kHf + "/" + arch + "/oracle.json");
    EXPECT_TRUE(j.has_value()) << j.message();
    if (!j) return o;
    for (const json::Value& t : (*j)["tokens"].as_array()) {
        o.tokens.push_back(static_cast<int32_t>(t.as_int()));
    }
    for (const json::Value& row : (*j)["logits"].as_array()) {
        o.logits.emplace_back();
        for (const json::Value& v : row.as_array()) o.logits.back().push_back(v.as_number());
    }
    return o;
}

// Converts tests/data/hf/<arch> with `ferry convert` into a fresh file; "" on failure.
std::string convert(const std::string& arch, const std::string& type) {
    const std::string out = tmp_dir() + "/" + arch + "-" + type + ".gguf";
    std::remove(out.c_str());
    auto r = sh(kBin + " convert " + kHf + "/" + arch + " -o " + out + " --type " + type);
    EXPECT_EQ(r.rc, 0) << r.out;
    return r.rc == 0 ? out : "";
}

// NMSE of ferry's logits for every position against the oracle.
double logits_nmse(const std::string& gguf, const Oracle& o, Type kv = Type::F32) {
    Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(gguf, {});
    EXPECT_TRUE(m.has_value()) << m.message();
    if (!m) return INFINITY;
    SessionOptions so;
    so.kv_type = kv;
    so.n_ctx = 64;
    so.n_threads = 2;
    Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
    EXPECT_TRUE(s.has_value()) << s.message();
    if (!s) return INFINITY;
    EXPECT_TRUE((*s)->decode(o.tokens, true).is_ok());
    const auto n_vocab = static_cast<size_t>((*m)->hparams().n_vocab);
    EXPECT_EQ(n_vocab, o.logits.at(0).size());
    double err = 0, ref = 0;
    for (size_t t = 0; t < o.tokens.size(); t++) {
        const float* l = (*s)->logits(static_cast<int32_t>(t));
        for (size_t i = 0; i < n_vocab; i++) {
            const double d = static_cast<double>(l[i]) - o.logits[t][i];
            err += d * d;
            ref += o.logits[t][i] * o.logits[t][i];
        }
    }
    return err / ref;
}

// NMSE of the 2-D weights of `quant` against the same weights in `f32` (both converted from
// one folder): what the encoding alone costs on this model's weights.
double weight_nmse(const std::string& quant, const std::string& f32) {
    Expected<std::unique_ptr<GgufFile>> q = GgufFile::open(quant), r = GgufFile::open(f32);
    EXPECT_TRUE(q.has_value() && r.has_value());
    if (!q || !r) return INFINITY;
    double err = 0, ref = 0;
    std::vector<float> a, b;
    for (const GgufTensorInfo& t : (*r)->tensors()) {
        if (t.n_dims != 2) continue;
        const GgufTensorInfo* tq = (*q)->find_tensor(t.name);
        EXPECT_NE(tq, nullptr) << t.name;
        if (!tq) return INFINITY;
        const int64_t n = t.ne[0] * t.ne[1];
        a.resize(static_cast<size_t>(n));
        b.resize(static_cast<size_t>(n));
        EXPECT_TRUE(to_float_row(tq->type, (*q)->tensor_data(*tq), a.data(), n).is_ok());
        std::memcpy(b.data(), (*r)->tensor_data(t), static_cast<size_t>(n) * 4);
        for (int64_t i = 0; i < n; i++) {
            const double d =
                static_cast<double>(a[static_cast<size_t>(i)]) - b[static_cast<size_t>(i)];
            err += d * d;
            ref += static_cast<double>(b[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
        }
    }
    return err / ref;
}

// A quantized conversion: its weights are within the type's usual encoding error (`w_bound`,
// weight NMSE on normal-like data), and its logits within a fixed multiple of the error its
// weights carry. Through these tiny random networks (2 layers, 7 matmuls each plus the
// output) the weight error is amplified 10-30x in the logits (measured: Q8_0 ~25x, Q4_0 ~15x);
// 60x leaves margin for the type mix while any real mistake (a wrong row order, a lost bias,
// a mis-packed block) gives NMSE ~1.
void check_quantized(const std::string& arch, const char* type, double w_bound) {
    const Oracle o = read_oracle(arch);
    const std::string f32 = convert(arch, "f32"), q = convert(arch, type);
    ASSERT_FALSE(f32.empty() || q.empty());
    const double w = weight_nmse(q, f32);
    const double nmse = logits_nmse(q, o);
    std::printf("%s %s: weight nmse %.3g, logits nmse %.3g (%.1fx)\n", arch.c_str(), type, w, nmse,
                nmse / w);
    EXPECT_LE(w, w_bound) << arch << " " << type;
    EXPECT_GT(w, 0.0) << arch << " " << type << ": no encoding error at all?";
    EXPECT_LE(nmse, 60.0 * w) << arch << " " << type;
}

class ConvertOracle : public ::testing::TestWithParam<std::string> {};

// F32 weights and KV cache: only float32 rounding separates ferry from float64 transformers.
TEST_P(ConvertOracle, F32MatchesTransformers) {
    const Oracle o = read_oracle(GetParam());
    const std::string f = convert(GetParam(), "f32");
    ASSERT_FALSE(f.empty());
    const double nmse = logits_nmse(f, o);
    EXPECT_LE(nmse, 1e-8) << GetParam();
    std::printf("%s f32: logits nmse %.3g\n", GetParam().c_str(), nmse);
}

// F16 holds these F16/BF16 checkpoints' values exactly: the same logits as F32.
TEST_P(ConvertOracle, F16IsExact) {
    const std::string f = convert(GetParam(), "f16");
    ASSERT_FALSE(f.empty());
    EXPECT_LE(logits_nmse(f, read_oracle(GetParam())), 1e-8);
}

// A F16 KV cache rounds K and V to 11 significant bits (relative error variance
// 2^-22 / 3 = 8e-8 per element).
TEST_P(ConvertOracle, F16KvCache) {
    const std::string f = convert(GetParam(), "f32");
    ASSERT_FALSE(f.empty());
    const double nmse = logits_nmse(f, read_oracle(GetParam()), Type::F16);
    std::printf("%s f32, f16 KV: logits nmse %.3g\n", GetParam().c_str(), nmse);
    EXPECT_LE(nmse, 1e-6);
}

TEST_P(ConvertOracle, Q8_0) {
    check_quantized(GetParam(), "q8_0", 1e-4);
}
TEST_P(ConvertOracle, Q4_0) {
    check_quantized(GetParam(), "q4_0", 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Archs, ConvertOracle, ::testing::Values("llama", "qwen2", "qwen3"),
                         [](const auto& info) { return info.param; });

// qwen3's rows are 256 long: K-quant types apply to every weight.
TEST(ConvertOracleKQuant, Qwen3) {
    for (const char* t : {"q6_k", "q5_k", "q4_k"}) {
        const std::string f = convert("qwen3", t);
        ASSERT_FALSE(f.empty());
        Expected<std::unique_ptr<GgufFile>> g = GgufFile::open(f);
        ASSERT_TRUE(g.has_value());
        Expected<Type> want = type_from_name(t);
        ASSERT_TRUE(want.has_value());
        EXPECT_EQ((*g)->find_tensor("blk.0.ffn_down.weight")->type, *want) << t;
    }
    check_quantized("qwen3", "q6_k", 1e-3);
    check_quantized("qwen3", "q5_k", 5e-3);
    check_quantized("qwen3", "q4_k", 2e-2);
}

// llama's rows (64) are not a multiple of 256: K-quant weights fall back to a type whose blocks
// divide them (Q8_0 today), and the model still matches.
TEST(ConvertFallback, RowsNotMultipleOf256FallBack) {
    const std::string f = convert("llama", "q4_k");
    ASSERT_FALSE(f.empty());
    Expected<std::unique_ptr<GgufFile>> g = GgufFile::open(f);
    ASSERT_TRUE(g.has_value());
    for (const GgufTensorInfo& t : (*g)->tensors()) {
        if (t.n_dims == 2) {
            EXPECT_EQ(t.type, convert_fallback_type(Type::Q4_K, 64)) << t.name;
        }
    }
    // llama.cpp's substitutes (the logits of such a file: NotMultipleOf256FallsBackToQ5).
    EXPECT_EQ(convert_fallback_type(Type::Q4_K, 256), Type::Q4_K);
    EXPECT_EQ(convert_fallback_type(Type::Q4_K, 64), Type::Q5_0);
    EXPECT_EQ(convert_fallback_type(Type::Q5_K, 64), Type::Q5_1);
    EXPECT_EQ(convert_fallback_type(Type::Q6_K, 64), Type::Q8_0);
    EXPECT_EQ(convert_fallback_type(Type::Q8_0, 48), Type::F16);
}

// llama.cpp's quantizer: Q4_K -> Q5_0, Q5_K -> Q5_1 for rows not a multiple of 256.
TEST(ConvertFallback, NotMultipleOf256FallsBackToQ5) {
    const std::string f = convert("llama", "q4_k");
    ASSERT_FALSE(f.empty());
    Expected<std::unique_ptr<GgufFile>> g = GgufFile::open(f);
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(static_cast<uint32_t>((*g)->find_tensor("blk.0.ffn_up.weight")->type), 6u);  // Q5_0
    EXPECT_LE(logits_nmse(f, read_oracle("llama"), Type::F16), 5e-2);
}

std::string kv_str(const GgufFile& g, const std::string& k) {
    Expected<std::string> s = g.get_string(k);
    return s ? *s : "<" + s.message() + ">";
}
int64_t kv_int(const GgufFile& g, const std::string& k) {
    Expected<int64_t> v = g.get_int(k);
    return v ? *v : -1;
}

// The keys and tensors the public converter writes.
TEST(Convert, MetadataAndTensorNames) {
    const std::string f = convert("llama", "f16");
    ASSERT_FALSE(f.empty());
    Expected<std::unique_ptr<GgufFile>> g = GgufFile::open(f);
    ASSERT_TRUE(g.has_value()) << g.message();
    const GgufFile& l = **g;
    EXPECT_EQ(kv_str(l, "general.architecture"), "llama");
    EXPECT_EQ(kv_int(l, "general.file_type"), 1);
    EXPECT_EQ(kv_int(l, "llama.block_count"), 2);
    EXPECT_EQ(kv_int(l, "llama.embedding_length"), 64);
    EXPECT_EQ(kv_int(l, "llama.feed_forward_length"), 128);
    EXPECT_EQ(kv_int(l, "llama.attention.head_count"), 4);
    EXPECT_EQ(kv_int(l, "llama.attention.head_count_kv"), 2);
    EXPECT_EQ(kv_int(l, "llama.rope.dimension_count"), 16);
    EXPECT_EQ(kv_int(l, "llama.vocab_size"), 304);
    EXPECT_EQ(kv_str(l, "tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(kv_str(l, "tokenizer.ggml.pre"), "llama-bpe");
    EXPECT_EQ(kv_int(l, "tokenizer.ggml.bos_token_id"), 300);
    EXPECT_EQ(kv_int(l, "tokenizer.ggml.eos_token_id"), 301);
    ASSERT_NE(l.find_kv("tokenizer.ggml.tokens"), nullptr);
    const auto& toks = l.find_kv("tokenizer.ggml.tokens")->value.arr;
    ASSERT_EQ(toks.size(), 304u);
    EXPECT_EQ(toks[300].s, "<|begin_of_text|>");
    EXPECT_EQ(toks[303].s, "[PAD303]");
    EXPECT_GT(l.find_kv("tokenizer.ggml.merges")->value.arr.size(), 10u);
    EXPECT_NE(l.find_kv("tokenizer.chat_template"), nullptr);
    // Llama 3 rope scaling becomes per-dimension factors: 1 (short wavelengths) up to the
    // factor 8 (long ones).
    const GgufTensorInfo* rf = l.find_tensor("rope_freqs.weight");
    ASSERT_NE(rf, nullptr);
    ASSERT_EQ(rf->type, Type::F32);
    ASSERT_EQ(rf->ne[0], 8);
    const float* fv = reinterpret_cast<const float*>(l.tensor_data(*rf));
    EXPECT_EQ(fv[0], 1.0f);
    EXPECT_EQ(fv[7], 8.0f);
    for (const char* n : {"token_embd.weight", "output.weight", "output_norm.weight",
                          "blk.1.attn_q.weight", "blk.1.ffn_down.weight"}) {
        EXPECT_NE(l.find_tensor(n), nullptr) << n;
    }
    EXPECT_EQ(l.find_tensor("blk.0.attn_norm.weight")->type, Type::F32);
    EXPECT_EQ(l.find_tensor("blk.0.attn_q.weight")->type, Type::F16);

    const std::string q2 = convert("qwen2", "f32"), q3 = convert("qwen3", "f32");
    Expected<std::unique_ptr<GgufFile>> g2 = GgufFile::open(q2), g3 = GgufFile::open(q3);
    ASSERT_TRUE(g2.has_value() && g3.has_value());
    EXPECT_EQ(kv_str(**g2, "general.architecture"), "qwen2");
    EXPECT_EQ(kv_str(**g2, "tokenizer.ggml.pre"), "qwen2");
    EXPECT_NE((*g2)->find_tensor("blk.1.attn_k.bias"), nullptr);
    EXPECT_EQ((*g2)->find_tensor("output.weight"), nullptr);  // tied
    EXPECT_EQ(kv_int(**g2, "tokenizer.ggml.eos_token_id"),
              kv_int(**g2, "tokenizer.ggml.eos_token_id"));
    EXPECT_EQ(kv_str(**g3, "general.architecture"), "qwen3");
    EXPECT_EQ(kv_int(**g3, "qwen3.attention.key_length"), 64);
    EXPECT_NE((*g3)->find_tensor("blk.0.attn_q_norm.weight"), nullptr);
}

// Copies an HF folder so a test can break one thing in it.
std::string copy_folder(const std::string& arch, const std::string& name) {
    const std::string d = tmp_dir() + "/" + name;
    auto r = sh("rm -rf " + d + " && cp -r " + kHf + "/" + arch + " " + d);
    EXPECT_EQ(r.rc, 0) << r.out;
    return d;
}

void rewrite(const std::string& path, const std::string& from, const std::string& to) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    const size_t at = s.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << path;
    s.replace(at, from.size(), to);
    std::ofstream(path) << s;
}

TEST(ConvertErrors, NameTheProblem) {
    const std::string out = tmp_dir() + "/err.gguf";
    struct C {
        std::string dir, expect;
    };
    std::vector<C> cases;
    cases.push_back({tmp_dir() + "/no-such-folder", "config.json"});
    {
        const std::string d = copy_folder("qwen2", "bad-arch");
        rewrite(d + "/config.json", "Qwen2ForCausalLM", "MambaForCausalLM");
        cases.push_back({d, "MambaForCausalLM"});
    }
    {
        const std::string d = copy_folder("qwen2", "bad-shape");
        rewrite(d + "/config.json", "\"intermediate_size\": 96", "\"intermediate_size\": 97");
        cases.push_back({d, "down_proj.weight' has shape [64, 96]; config.json implies [64, 97]"});
    }
    {
        const std::string d = copy_folder("qwen2", "sliding-window");
        rewrite(d + "/config.json", "\"use_sliding_window\": false",
                "\"use_sliding_window\": true");
        cases.push_back({d, "use_sliding_window"});
    }
    {
        const std::string d = copy_folder("qwen2", "no-tokenizer");
        std::remove((d + "/tokenizer.json").c_str());
        cases.push_back({d, "tokenizer.json"});
    }
    {
        const std::string d = copy_folder("llama", "missing-shard");
        auto r = sh("rm " + d + "/model-00002-of-00002.safetensors");
        cases.push_back({d, "model-00002-of-00002.safetensors"});
    }
    {
        const std::string d = copy_folder("qwen2", "truncated");
        auto r = sh("truncate -s 100000 " + d + "/model.safetensors");
        cases.push_back({d, "outside the data region"});
    }
    for (const C& c : cases) {
        auto r = sh(kBin + " convert " + c.dir + " -o " + out + " --force");
        EXPECT_NE(r.rc, 0) << c.dir;
        EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.dir << ": " << r.out;
        struct stat st {};
        EXPECT_NE(stat(out.c_str(), &st), 0) << "a failed conversion left " << out;
    }
}

TEST(ConvertErrors, NeverOverwritesWithoutForce) {
    const std::string out = tmp_dir() + "/exists.gguf";
    std::ofstream(out) << "keep me";
    auto r = sh(kBin + " convert " + kHf + "/qwen2 -o " + out);
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
    std::ifstream in(out);
    std::string s;
    std::getline(in, s);
    EXPECT_EQ(s, "keep me");
    r = sh(kBin + " convert " + kHf + "/qwen2 -o " + out + " --force --type q8_0");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(GgufFile::open(out).has_value());
}

// Hostile safetensors headers: every length and offset is checked against the file.
TEST(Safetensors, RejectsBadHeaders) {
    auto write = [](const std::string& path, const std::string& header, size_t data_bytes,
                    uint64_t len_override = 0) {
        std::ofstream f(path, std::ios::binary);
        uint64_t n = len_override ? len_override : header.size();
        for (int i = 0; i < 8; i++) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
        f << header << std::string(data_bytes, '\0');
    };
    const std::string p = tmp_dir() + "/x.safetensors";
    struct C {
        std::string header;
        size_t data;
        uint64_t len;
        const char* expect;
    };
    const std::vector<C> cases = {
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, 1u << 30, "header length"},
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8, 0, "outside the data"},
        {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, 0, "8 bytes for 3"},
        {R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8, 0, "dtype 'I64'"},
        {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", 8, 0, "bad size"},
        {R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
         R"("b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
         8, 0, "overlap"},
        {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, 0, "header"},
        {R"({"a":{"dtype":"F32","shape":[1073741824,1073741824],"data_offsets":[0,8]}})", 8, 0,
         "too large"},
    };
    for (const C& c : cases) {
        write(p, c.header, c.data, c.len);
        Expected<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::open(p);
        ASSERT_FALSE(f.has_value()) << c.header;
        EXPECT_NE(f.message().find(c.expect), std::string::npos) << f.message();
        EXPECT_NE(f.message().find(p), std::string::npos) << f.message();
    }
    write(p,
          R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2],)"
          R"("data_offsets":[0,4]}})",
          4);
    Expected<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::open(p);
    ASSERT_TRUE(f.has_value()) << f.message();
    ASSERT_EQ((*f)->tensors().size(), 1u);
    EXPECT_EQ((*f)->tensors()[0].nelements, 2u);
}

// The remote backend carries the new architectures: logits through a real `ferry serve` are
// the local ones, bit for bit.
TEST(ConvertRemote, LogitsThroughServeAreLocalBits) {
    ferry::test::ServerProcess server;
    std::string err;
    ASSERT_TRUE(server.start("unix:" + tmp_dir() + "/serve.sock", {}, &err)) << err;
    for (const std::string arch : {"llama", "qwen2", "qwen3"}) {
        const Oracle o = read_oracle(arch);
        std::string toks;
        for (int32_t t : o.tokens) {
            if (!toks.empty()) toks += ',';
            toks += std::to_string(t);
        }
        const std::string f = convert(arch, "q8_0");
        ASSERT_FALSE(f.empty());
        const std::string& m = f;
        const std::string local = tmp_dir() + "/" + arch + ".local", remote = local + ".remote";
        auto a = sh(kBin + " logits -m " + m + " --tokens " + toks + " --out " + local);
        ASSERT_EQ(a.rc, 0) << a.out;
        auto b = sh(kBin + " logits -m " + m + " --tokens " + toks + " --out " + remote +
                    " --remote " + server.addr());
        ASSERT_EQ(b.rc, 0) << b.out;
        std::ifstream fa(local, std::ios::binary), fb(remote, std::ios::binary);
        std::stringstream sa, sb;
        sa << fa.rdbuf();
        sb << fb.rdbuf();
        EXPECT_EQ(sa.str().size(), o.tokens.size() * o.logits[0].size() * 4) << arch;
        EXPECT_TRUE(sa.str() == sb.str()) << arch << ": remote logits differ from local";
    }
}

}  // namespace

namespace {

// The presets carry the shapes of the public configs.
TEST(GenModel, PresetsHavePublicShapes) {
    struct C {
        const char* name;
        const char* arch;
        int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim;
    };
    for (const C& c : {C{"llama-3.2-1b", "llama", 128256, 2048, 16, 32, 8, 8192, 0},
                       C{"qwen2.5-0.5b", "qwen2", 151936, 896, 24, 14, 2, 4864, 0},
                       C{"qwen3-0.6b", "qwen3", 151936, 1024, 28, 16, 8, 3072, 128}}) {
        Expected<ModelPreset> p = find_preset(c.name);
        ASSERT_TRUE(p.has_value()) << c.name;
        EXPECT_STREQ(p->arch, c.arch);
        EXPECT_EQ(p->n_vocab, c.n_vocab);
        EXPECT_EQ(p->n_embd, c.n_embd);
        EXPECT_EQ(p->n_layer, c.n_layer);
        EXPECT_EQ(p->n_head, c.n_head);
        EXPECT_EQ(p->n_head_kv, c.n_head_kv);
        EXPECT_EQ(p->n_ff, c.n_ff);
        EXPECT_EQ(p->head_dim, c.head_dim);
        EXPECT_TRUE(p->tied_output);
    }
    // Llama 3.2's rope factors (head size 64, theta 500000, factor 32): 1 for the fastest
    // rotations, 32 for the slowest, never decreasing between.
    const std::vector<float> f = llama3_rope_factors(64, 500000.0, 32.0, 1.0, 4.0, 8192);
    ASSERT_EQ(f.size(), 32u);
    EXPECT_EQ(f.front(), 1.0f);
    EXPECT_EQ(f.back(), 32.0f);
    for (size_t i = 1; i < f.size(); i++) EXPECT_GE(f[i], f[i - 1]);
}

// Every architecture gen-model writes loads and runs (the presets at a small size).
TEST(GenModel, EveryArchitectureLoadsAndRuns) {
    for (const std::string name : {"llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b"}) {
        ModelPreset p = *find_preset(name);
        p.n_vocab = 600;
        p.n_embd = 128;
        p.n_layer = 2;
        p.n_ff = 256;
        p.n_head = 4;
        p.n_head_kv = 2;
        if (p.head_dim) p.head_dim = 64;
        GenModelOptions o;
        // Rows of 128 (n_embd) take the fallback of Q4_K; ffn_down's rows of 256 keep it.
        o.type = Type::Q4_K;
        o.n_threads = 2;
        const std::string path = tmp_dir() + "/gen-" + name + ".gguf";
        ASSERT_TRUE(generate_model(p, o, path).is_ok()) << name;
        Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(path, {});
        ASSERT_TRUE(m.has_value()) << name << ": " << m.message();
        EXPECT_EQ((*m)->hparams().arch, p.arch);
        const GgufFile& g = (*m)->gguf();
        EXPECT_EQ(g.find_tensor("blk.0.ffn_down.weight")->type, Type::Q4_K);
        EXPECT_EQ(g.find_tensor("blk.0.attn_q.weight")->type,
                  convert_fallback_type(Type::Q4_K, 128));
        EXPECT_EQ(g.find_tensor("token_embd.weight")->type, convert_fallback_type(Type::Q6_K, 128));
        EXPECT_EQ(g.find_tensor("rope_freqs.weight") != nullptr, p.llama3_rope_factor > 0) << name;
        EXPECT_EQ(g.find_tensor("blk.1.attn_v.bias") != nullptr, std::string(p.arch) == "qwen2");
        EXPECT_EQ(g.find_tensor("blk.1.attn_k_norm.weight") != nullptr,
                  std::string(p.arch) == "qwen3");
        if (p.head_dim) {
            EXPECT_EQ((*m)->hparams().head_dim, 64);
        }
        SessionOptions so;
        so.n_ctx = 32;
        so.n_threads = 2;
        Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
        ASSERT_TRUE(s.has_value()) << s.message();
        const std::vector<int32_t> toks = {1, 300, 5};
        ASSERT_TRUE((*s)->decode(toks, false).is_ok());
        for (int i = 0; i < 600; i++) ASSERT_TRUE(std::isfinite((*s)->logits(0)[i])) << name;
        // `ferry bench` names the architecture in its model column, as llama-bench does.
        auto b = sh(kBin + " bench -m " + path + " -p 0 -n 2 -r 1 -t 2");
        ASSERT_EQ(b.rc, 0) << b.out;
        EXPECT_NE(b.out.find("| " + std::string(p.arch) + " "), std::string::npos) << b.out;
    }
}

// Hostile or inconsistent model files: a rope factor that would divide by zero is refused.
TEST(Arch, RejectsNonPositiveRopeFactors) {
    const std::string f = convert("llama", "f32");
    ASSERT_FALSE(f.empty());
    Expected<std::unique_ptr<GgufFile>> g = GgufFile::open(f);
    ASSERT_TRUE(g.has_value());
    std::vector<float> zeros(8, 0.0f);
    // Rebuild with rope_freqs replaced: copy every tensor, swapping the one.
    GgufWriter w2;
    for (const GgufKV& kv : (*g)->kvs()) w2.add_kv(kv.key, kv.value);
    for (const GgufTensorInfo& t : (*g)->tensors()) {
        const bool rf = t.name == "rope_freqs.weight";
        ASSERT_TRUE(
            w2.add_tensor(t.name, t.type, t.n_dims, t.ne,
                          rf ? static_cast<const void*>(zeros.data()) : (*g)->tensor_data(t),
                          t.nbytes)
                .is_ok());
    }
    const std::string bad = tmp_dir() + "/bad-rope.gguf";
    ASSERT_TRUE(w2.write(bad).is_ok());
    Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(bad, {});
    ASSERT_FALSE(m.has_value());
    EXPECT_NE(m.message().find("rope_freqs.weight"), std::string::npos) << m.message();
}

}  // namespace

namespace {

// The tokenizer step on the real Llama 3 and Qwen3 tokenizers (../shared/fixtures/tokenizers):
// every id in place, the pre-tokenizer recognised from its regex, the added tokens typed as
// control, padding up to the model's vocab_size.
TEST(ConvertTokenizer, RealVocabularies) {
    const std::string fx = std::string(FERRY_FIXTURES_DIR) + "/tokenizers";
    struct C {
        const char* family;
        const char* pre;
        int64_t n_vocab;
        int64_t n_merges;
        int64_t bos, eos;
        int64_t special_id;
        const char* special;
    };
    for (const C& c :
         {C{"llama3", "llama-bpe", 128256, 280147, 128000, 128001, 128009, "<|eot_id|>"},
          C{"qwen3", "qwen2", 151936, 151387, -1, 151645, 151644, "<|im_start|>"}}) {
        const std::string d = tmp_dir() + "/tok-" + c.family;
        auto r = sh("mkdir -p " + d + " && zcat " + fx + "/" + c.family + "/tokenizer.json.gz > " +
                    d + "/tokenizer.json && cp " + fx + "/" + c.family + "/tokenizer_config.json " +
                    d + "/");
        ASSERT_EQ(r.rc, 0) << r.out;
        GgufWriter w;
        Status st = convert_tokenizer(d, c.n_vocab, w);
        ASSERT_TRUE(st.is_ok()) << st.message();
        const std::vector<uint8_t> bytes = w.to_bytes();
        Expected<std::unique_ptr<GgufFile>> g =
            GgufFile::from_memory(bytes.data(), bytes.size(), "tok.gguf");
        ASSERT_TRUE(g.has_value()) << g.message();
        const GgufFile& f = **g;
        EXPECT_EQ(kv_str(f, "tokenizer.ggml.model"), "gpt2");
        EXPECT_EQ(kv_str(f, "tokenizer.ggml.pre"), c.pre);
        const auto& toks = f.find_kv("tokenizer.ggml.tokens")->value.arr;
        const auto& types = f.find_kv("tokenizer.ggml.token_type")->value.arr;
        ASSERT_EQ(static_cast<int64_t>(toks.size()), c.n_vocab) << c.family;
        EXPECT_EQ(static_cast<int64_t>(f.find_kv("tokenizer.ggml.merges")->value.arr.size()),
                  c.n_merges);
        EXPECT_EQ(toks[static_cast<size_t>(c.special_id)].s, c.special);
        EXPECT_EQ(types[static_cast<size_t>(c.special_id)].i, 3);  // control
        EXPECT_EQ(toks[0].s, "!");
        EXPECT_EQ(types[0].i, 1);  // normal
        EXPECT_EQ(kv_int(f, "tokenizer.ggml.bos_token_id"), c.bos);
        EXPECT_EQ(kv_int(f, "tokenizer.ggml.eos_token_id"), c.eos);
        EXPECT_NE(f.find_kv("tokenizer.chat_template"), nullptr);
    }
    // Qwen3 has fewer tokens than its vocab_size: the rest are unused padding.
    GgufWriter w;
    ASSERT_TRUE(convert_tokenizer(tmp_dir() + "/tok-qwen3", 151936, w).is_ok());
    const std::vector<uint8_t> bytes = w.to_bytes();
    Expected<std::unique_ptr<GgufFile>> g =
        GgufFile::from_memory(bytes.data(), bytes.size(), "tok.gguf");
    ASSERT_TRUE(g.has_value());
    const auto& toks = (*g)->find_kv("tokenizer.ggml.tokens")->value.arr;
    EXPECT_EQ(toks[151935].s, "[PAD151935]");
    EXPECT_EQ((*g)->find_kv("tokenizer.ggml.token_type")->value.arr[151935].i, 5);  // unused
}

}  // namespace
