#include "model/tokenizer-json.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/json.h"
#include "ferry/convert.h"

namespace ferry {

namespace {

// The pre-tokenizer regexes of the supported families (tokenizer.json, Split "Regex").
constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

GgufValue str_value(std::string s) {
    GgufValue v;
    v.type = GgufValueType::STRING;
    v.s = std::move(s);
    return v;
}
GgufValue u32_value(uint32_t x) {
    GgufValue v;
    v.type = GgufValueType::UINT32;
    v.u = x;
    v.i = x;
    return v;
}
GgufValue bool_value(bool b) {
    GgufValue v;
    v.type = GgufValueType::BOOL;
    v.u = b ? 1 : 0;
    v.i = b ? 1 : 0;
    return v;
}
GgufValue string_array(std::vector<std::string> items) {
    GgufValue v;
    v.type = GgufValueType::ARRAY;
    v.elem_type = GgufValueType::STRING;
    v.arr.reserve(items.size());
    for (std::string& s : items) v.arr.push_back(str_value(std::move(s)));
    return v;
}
GgufValue i32_array(const std::vector<int32_t>& items) {
    GgufValue v;
    v.type = GgufValueType::ARRAY;
    v.elem_type = GgufValueType::INT32;
    v.arr.reserve(items.size());
    for (int32_t x : items) {
        GgufValue e;
        e.type = GgufValueType::INT32;
        e.i = x;
        e.u = x >= 0 ? static_cast<uint64_t>(x) : 0;
        v.arr.push_back(std::move(e));
    }
    return v;
}

// Collects the Split regexes of a pre_tokenizer (itself or inside a Sequence).
void split_regexes(const json::Value& pt, std::vector<std::string>& out) {
    if (pt["type"].as_string() == "Sequence") {
        for (const json::Value& p : pt["pretokenizers"].as_array()) split_regexes(p, out);
    } else if (pt["type"].as_string() == "Split" && pt["pattern"]["Regex"].is_string()) {
        out.push_back(pt["pattern"]["Regex"].as_string());
    }
}

bool has_byte_level(const json::Value& pt) {
    if (pt["type"].as_string() == "ByteLevel") return true;
    for (const json::Value& p : pt["pretokenizers"].as_array()) {
        if (has_byte_level(p)) return true;
    }
    return false;
}

// The first token a post_processor's single-sequence template puts before the text, or "".
std::string template_first_special(const json::Value& pp) {
    if (pp["type"].as_string() == "Sequence") {
        for (const json::Value& p : pp["processors"].as_array()) {
            std::string s = template_first_special(p);
            if (!s.empty()) return s;
        }
        return {};
    }
    if (pp["type"].as_string() != "TemplateProcessing") return {};
    const json::Value& first = pp["single"].at(0);
    return first["SpecialToken"]["id"].as_string();
}

bool looks_special(const std::string& t) {
    return t.size() >= 4 && t.compare(0, 2, "<|") == 0 && t.compare(t.size() - 2, 2, "|>") == 0;
}

// A special token setting of tokenizer_config.json: "text" or {"content": "text"}.
std::string token_setting(const json::Value& v) {
    if (v.is_string()) return v.as_string();
    return v["content"].as_string();
}

}  // namespace

Expected<std::vector<GgufKV>> tokenizer_json_to_gguf_kv(const std::string& tokenizer_json_path,
                                                        const std::string& tokenizer_config_path,
                                                        const TokenizerJsonOptions& opts) {
    Expected<json::Value> doc = json::parse_file(tokenizer_json_path);
    if (!doc) return doc.status();
    const json::Value& tj = *doc;
    const std::string& where = tokenizer_json_path;
    auto fail = [&](const std::string& msg) { return Status::error(where + ": " + msg); };

    const json::Value& model = tj["model"];
    if (model["type"].as_string() != "BPE") {
        return fail("model.type is \"" + model["type"].as_string() +
                    "\": only byte-level \"BPE\" tokenizers are supported");
    }
    if (!has_byte_level(tj["pre_tokenizer"])) {
        return fail("pre_tokenizer has no ByteLevel step: only byte-level BPE is supported");
    }
    std::vector<std::string> regexes;
    split_regexes(tj["pre_tokenizer"], regexes);
    std::string pre;
    if (regexes.size() == 1 && regexes[0] == kLlama3Regex) {
        pre = "llama-bpe";
    } else if (regexes.size() == 1 && regexes[0] == kQwen2Regex) {
        pre = "qwen2";
    } else {
        return fail("pre_tokenizer: unknown Split regex" +
                    (regexes.empty() ? std::string(" (none)") : " \"" + regexes[0] + "\"") +
                    "; known: those of Llama 3 (llama-bpe) and Qwen 2 (qwen2)");
    }

    // id -> (text, type)
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<bool> present;
    std::unordered_map<std::string, int64_t> ids;
    auto put = [&](int64_t id, const std::string& text, int32_t type) -> Status {
        if (id < 0 || id > (int64_t{1} << 30)) {
            return fail(strfmt("token \"%s\" has id %lld, out of range", text.c_str(),
                               static_cast<long long>(id)));
        }
        const auto i = static_cast<size_t>(id);
        if (i >= tokens.size()) {
            tokens.resize(i + 1);
            types.resize(i + 1, 5);
            present.resize(i + 1, false);
        }
        tokens[i] = text;
        types[i] = type;
        present[i] = true;
        ids[text] = id;
        return Status::ok();
    };
    if (!model["vocab"].is_object()) return fail("model.vocab is not an object");
    for (const auto& [text, id] : model["vocab"].as_object()) {
        if (!id.is_integer()) return fail("model.vocab[\"" + text + "\"] is not an integer id");
        FERRY_TRY(put(id.as_int(), text, 1));
    }
    for (const json::Value& a : tj["added_tokens"].as_array()) {
        if (!a["id"].is_integer() || !a["content"].is_string()) {
            return fail("added_tokens: an entry lacks an integer id or a string content");
        }
        const std::string& text = a["content"].as_string();
        const bool control = a["special"].as_bool() || looks_special(text);
        FERRY_TRY(put(a["id"].as_int(), text, control ? 3 : 4));
    }
    if (opts.vocab_size > 0) {
        if (opts.vocab_size < static_cast<int64_t>(tokens.size())) {
            return fail(strfmt("the tokenizer has %zu tokens, more than vocab_size %lld",
                               tokens.size(), static_cast<long long>(opts.vocab_size)));
        }
        tokens.resize(static_cast<size_t>(opts.vocab_size));
    } else if (opts.min_vocab_size > static_cast<int64_t>(tokens.size())) {
        tokens.resize(static_cast<size_t>(opts.min_vocab_size));
    }
    types.resize(tokens.size(), 5);
    present.resize(tokens.size(), false);
    for (size_t i = 0; i < tokens.size(); i++) {
        if (!present[i]) tokens[i] = strfmt("[PAD%zu]", i);
    }

    std::vector<std::string> merges;
    merges.reserve(model["merges"].size());
    for (const json::Value& m : model["merges"].as_array()) {
        if (m.is_string()) {
            merges.push_back(m.as_string());
        } else if (m.is_array() && m.size() == 2 && m.at(0).is_string() && m.at(1).is_string()) {
            merges.push_back(m.at(0).as_string() + " " + m.at(1).as_string());
        } else {
            return fail(
                strfmt("model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", merges.size()));
        }
    }
    if (merges.empty()) return fail("model.merges is missing or empty");

    std::vector<GgufKV> kv;
    kv.push_back({"tokenizer.ggml.model", str_value("gpt2")});
    kv.push_back({"tokenizer.ggml.pre", str_value(pre)});
    kv.push_back({"tokenizer.ggml.tokens", string_array(std::move(tokens))});
    kv.push_back({"tokenizer.ggml.token_type", i32_array(types)});
    kv.push_back({"tokenizer.ggml.merges", string_array(std::move(merges))});

    if (tokenizer_config_path.empty()) return kv;
    Expected<json::Value> cfg_doc = json::parse_file(tokenizer_config_path);
    if (!cfg_doc) return cfg_doc.status();
    const json::Value& cfg = *cfg_doc;
    const struct {
        const char* setting;
        const char* key;
    } kIds[] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                {"eos_token", "tokenizer.ggml.eos_token_id"},
                {"pad_token", "tokenizer.ggml.padding_token_id"},
                {"unk_token", "tokenizer.ggml.unknown_token_id"}};
    for (const auto& k : kIds) {
        const std::string text = token_setting(cfg[k.setting]);
        if (text.empty()) continue;
        auto it = ids.find(text);
        if (it == ids.end()) {
            return Status::error(tokenizer_config_path + ": " + k.setting + " \"" + text +
                                 "\" is not a token of " + tokenizer_json_path);
        }
        kv.push_back({k.key, u32_value(static_cast<uint32_t>(it->second))});
    }
    if (cfg["add_bos_token"].is_bool()) {
        kv.push_back({"tokenizer.ggml.add_bos_token", bool_value(cfg["add_bos_token"].as_bool())});
    } else {
        const std::string first = template_first_special(tj["post_processor"]);
        if (!first.empty() && first == token_setting(cfg["bos_token"])) {
            kv.push_back({"tokenizer.ggml.add_bos_token", bool_value(true)});
        }
    }
    if (cfg["add_eos_token"].is_bool()) {
        kv.push_back({"tokenizer.ggml.add_eos_token", bool_value(cfg["add_eos_token"].as_bool())});
    }
    const json::Value& ct = cfg["chat_template"];
    std::string chat_template;
    if (ct.is_string()) {
        chat_template = ct.as_string();
    } else if (ct.is_array()) {
        for (const json::Value& e : ct.as_array()) {
            if (e["name"].as_string() == "default") chat_template = e["template"].as_string();
        }
    } else {
        const size_t slash = tokenizer_config_path.rfind('/');
        const std::string dir =
            slash == std::string::npos ? "." : tokenizer_config_path.substr(0, slash);
        std::ifstream in(dir + "/chat_template.jinja", std::ios::binary);
        if (in) {
            std::ostringstream ss;
            ss << in.rdbuf();
            chat_template = ss.str();
        }
    }
    if (!chat_template.empty()) {
        kv.push_back({"tokenizer.chat_template", str_value(std::move(chat_template))});
    }
    return kv;
}

Expected<std::vector<GgufKV>> tokenizer_to_gguf_kv(const std::string& file_or_dir,
                                                   const TokenizerJsonOptions& opts) {
    struct stat st {};
    const bool dir = ::stat(file_or_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    const std::string json = dir ? file_or_dir + "/tokenizer.json" : file_or_dir;
    const size_t slash = json.rfind('/');
    const std::string config =
        (slash == std::string::npos ? std::string(".") : json.substr(0, slash)) +
        "/tokenizer_config.json";
    return tokenizer_json_to_gguf_kv(json, access(config.c_str(), R_OK) == 0 ? config : "", opts);
}

Status convert_tokenizer(const std::string& dir, int64_t n_vocab, GgufWriter& w) {
    TokenizerJsonOptions o;
    o.vocab_size = n_vocab;
    Expected<std::vector<GgufKV>> kv = tokenizer_to_gguf_kv(dir, o);
    if (!kv) return kv.status();
    for (GgufKV& e : *kv) w.add_kv(e.key, std::move(e.value));
    return Status::ok();
}

}  // namespace ferry
