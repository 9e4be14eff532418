// MINIMAL STAND-IN for the tokenizer part of `ferry convert` (see convert.h): to be replaced by
// tokenizer_json_to_gguf_kv() from the tokenizer work. It writes the keys the public converter
// writes for a byte-level BPE tokenizer.json (tokens by id, merges, token types, special ids,
// add_bos, chat template); the pre-tokenizer name comes from the architecture, not from
// recognising the pre-tokenizer's regex.
#include <algorithm>
#include <map>

#include "core/json.h"
#include "ferry/convert.h"

namespace ferry {

namespace {

// GGUF token types (tokenizer.ggml.token_type).
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// A special token's text from tokenizer_config.json: a string or {"content": ...}.
std::string token_text(const json::Value& v) {
    if (v.is_string()) return v.as_string();
    return v["content"].as_string();
}

}  // namespace

Status convert_tokenizer(const std::string& dir, const std::string& pre, int64_t n_vocab,
                         GgufWriter& w) {
    const std::string tj = dir + "/tokenizer.json";
    Expected<json::Value> tok = json::parse_file(tj);
    if (!tok) return tok.status();
    const json::Value& model = (*tok)["model"];
    if (model["type"].as_string() != "BPE") {
        return Status::errorf("%s: model.type '%s' is not supported (BPE)", tj.c_str(),
                              model["type"].as_string().c_str());
    }
    std::vector<std::string> tokens(static_cast<size_t>(n_vocab));
    std::vector<int32_t> types(static_cast<size_t>(n_vocab), kUnused);
    std::vector<bool> set(static_cast<size_t>(n_vocab), false);
    std::map<std::string, int64_t> ids;
    auto put = [&](const std::string& text, const json::Value& id, int32_t type) -> Status {
        if (!id.is_integer() || id.as_int() < 0 || id.as_int() >= n_vocab) {
            return Status::errorf(
                "%s: token '%s' has id %s outside [0, %lld) (config.json "
                "vocab_size)",
                tj.c_str(), text.c_str(), json::dump(id).c_str(), static_cast<long long>(n_vocab));
        }
        const auto i = static_cast<size_t>(id.as_int());
        tokens[i] = text;
        types[i] = type;
        set[i] = true;
        ids[text] = id.as_int();
        return Status::ok();
    };
    if (!model["vocab"].is_object())
        return Status::errorf("%s: model.vocab is not an object", tj.c_str());
    for (const json::Value::Member& m : model["vocab"].as_object()) {
        FERRY_TRY(put(m.first, m.second, kNormal));
    }
    for (const json::Value& t : (*tok)["added_tokens"].as_array()) {
        FERRY_TRY(put(t["content"].as_string(), t["id"],
                      t["special"].as_bool() ? kControl : kUserDefined));
    }
    for (size_t i = 0; i < tokens.size(); i++) {
        if (!set[i]) tokens[i] = "[PAD" + std::to_string(i) + "]";
    }
    std::vector<std::string> merges;
    for (const json::Value& m : model["merges"].as_array()) {
        if (m.is_string()) {
            merges.push_back(m.as_string());
        } else if (m.is_array() && m.size() == 2) {
            merges.push_back(m.at(0).as_string() + " " + m.at(1).as_string());
        } else {
            return Status::errorf(
                "%s: model.merges has an entry %s that is neither \"a b\" nor "
                "[a, b]",
                tj.c_str(), json::dump(m).c_str());
        }
    }
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", pre);
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    w.add_string_array("tokenizer.ggml.merges", merges);

    const std::string tc = dir + "/tokenizer_config.json";
    Expected<json::Value> cfg = json::parse_file(tc);
    if (!cfg) return cfg.status();
    auto special = [&](const char* field, const char* key) -> Status {
        const json::Value* v = cfg->find(field);
        if (!v || v->is_null()) return Status::ok();
        const std::string text = token_text(*v);
        auto it = ids.find(text);
        if (it == ids.end()) {
            return Status::errorf("%s: %s '%s' is not in %s", tc.c_str(), field, text.c_str(),
                                  tj.c_str());
        }
        w.add_u32(key, static_cast<uint32_t>(it->second));
        return Status::ok();
    };
    FERRY_TRY(special("bos_token", "tokenizer.ggml.bos_token_id"));
    FERRY_TRY(special("eos_token", "tokenizer.ggml.eos_token_id"));
    FERRY_TRY(special("pad_token", "tokenizer.ggml.padding_token_id"));
    if (const json::Value* v = cfg->find("add_bos_token"); v && v->is_bool()) {
        w.add_bool("tokenizer.ggml.add_bos_token", v->as_bool());
    }
    if (const json::Value* v = cfg->find("chat_template"); v && v->is_string()) {
        w.add_string("tokenizer.chat_template", v->as_string());
    }
    return Status::ok();
}

}  // namespace ferry
