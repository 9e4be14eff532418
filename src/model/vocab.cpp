#include "ferry/vocab.h"

#include <algorithm>
#include <cstdarg>
#include <cstring>
#include <queue>

namespace ferry {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";    // U+2581 "▁"
constexpr std::string_view kUnknownMark = "\xE2\x96\x85";  // U+2585 "▅"

// An error about this file's metadata, prefixed with its path as GgufFile's own errors are.
Status bad(const GgufFile& f, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
Status bad(const GgufFile& f, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vstrfmt(fmt, ap);
    va_end(ap);
    return Status::error(f.path() + ": " + msg);
}

bool is_signed_int(GgufValueType t) {
    return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
           t == GgufValueType::INT64;
}
bool is_unsigned_int(GgufValueType t) {
    return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
           t == GgufValueType::UINT64 || t == GgufValueType::BOOL;
}
bool is_float(GgufValueType t) {
    return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

// An integer array element as int64 (signed widths live in `i`, unsigned in `u`).
int64_t int_of(const GgufValue& v, GgufValueType t) {
    if (is_signed_int(t)) return v.i != 0 ? v.i : static_cast<int64_t>(v.u);
    return v.u != 0 ? static_cast<int64_t>(v.u) : v.i;
}

// Byte length of the UTF-8 character starting at s[0] (s non-empty); 1 for a byte that does
// not start a well-formed sequence, so invalid input still splits into single bytes.
size_t utf8_char_len(std::string_view s) {
    const auto c = static_cast<unsigned char>(s[0]);
    size_t n = 1;
    if (c >= 0xC0 && c < 0xE0) {
        n = 2;
    } else if (c >= 0xE0 && c < 0xF0) {
        n = 3;
    } else if (c >= 0xF0 && c < 0xF8) {
        n = 4;
    }
    if (n > s.size()) return 1;
    for (size_t i = 1; i < n; i++) {
        if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) return 1;
    }
    return n;
}

// "<0xNN>" -> NN, or -1.
int parse_byte_token(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    int v = 0;
    for (size_t i = 3; i < 5; i++) {
        const char c = t[i];
        int d = -1;
        if (c >= '0' && c <= '9') d = c - '0';
        if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

// Fetches an array-valued key whose elements satisfy `elem_ok`.
Expected<const GgufValue*> typed_array(const GgufFile& f, const std::string& key,
                                       bool (*elem_ok)(GgufValueType), const char* what) {
    Expected<const GgufValue*> a = f.get_array(key);
    if (!a) return a.status();
    if (!elem_ok((*a)->elem_type)) {
        return bad(f, "%s: array elements must be %s (GGUF value type %u)", key.c_str(), what,
                   static_cast<unsigned>((*a)->elem_type));
    }
    return a;
}

// Reads an optional token id key into *id; `fallback` applies when the key is absent and is
// dropped (-1) when it does not name a token of this vocabulary.
Status read_token_id(const GgufFile& f, const std::string& key, int32_t n_tokens, int32_t fallback,
                     int32_t* id) {
    if (f.find_kv(key) == nullptr) {
        *id = fallback < n_tokens ? fallback : -1;
        return Status::ok();
    }
    Expected<int64_t> v = f.get_int(key);
    if (!v) return v.status();
    if (*v < 0 || *v >= n_tokens) {
        return bad(f, "%s: token id %lld is out of range (the vocabulary has %d tokens)",
                   key.c_str(), static_cast<long long>(*v), n_tokens);
    }
    *id = static_cast<int32_t>(*v);
    return Status::ok();
}

Status read_bool(const GgufFile& f, const std::string& key, bool fallback, bool* out) {
    if (f.find_kv(key) == nullptr) {
        *out = fallback;
        return Status::ok();
    }
    Expected<bool> v = f.get_bool(key);
    if (!v) return v.status();
    *out = *v;
    return Status::ok();
}

}  // namespace

Expected<Vocab> Vocab::from_gguf(const GgufFile& f) {
    const std::string kModel = "tokenizer.ggml.model";
    const std::string kTokens = "tokenizer.ggml.tokens";
    const std::string kScores = "tokenizer.ggml.scores";
    const std::string kTypes = "tokenizer.ggml.token_type";

    Expected<std::string> model = f.get_string(kModel);
    if (!model) return model.status();
    if (*model != "llama") {
        return bad(f, "%s is \"%s\": only \"llama\" (SentencePiece) vocabularies are supported",
                   kModel.c_str(), model->c_str());
    }

    Vocab v;
    Expected<const GgufValue*> tokens = typed_array(
        f, kTokens, [](GgufValueType t) { return t == GgufValueType::STRING; }, "strings");
    if (!tokens) return tokens.status();
    const std::vector<GgufValue>& tok = (*tokens)->arr;
    if (tok.empty()) return bad(f, "%s: the vocabulary is empty", kTokens.c_str());
    if (tok.size() > static_cast<size_t>(INT32_MAX)) {
        return bad(f, "%s: %zu tokens is too many", kTokens.c_str(), tok.size());
    }
    const auto n = static_cast<int32_t>(tok.size());

    Expected<const GgufValue*> scores = typed_array(f, kScores, is_float, "floats");
    if (!scores) return scores.status();
    if ((*scores)->arr.size() != tok.size()) {
        return bad(f, "%s has %zu entries but %s has %zu", kScores.c_str(), (*scores)->arr.size(),
                   kTokens.c_str(), tok.size());
    }

    const GgufValue* types = nullptr;
    if (f.find_kv(kTypes) != nullptr) {
        Expected<const GgufValue*> t = typed_array(
            f, kTypes, [](GgufValueType e) { return is_signed_int(e) || is_unsigned_int(e); },
            "integers");
        if (!t) return t.status();
        types = *t;
        if (types->arr.size() != tok.size()) {
            return bad(f, "%s has %zu entries but %s has %zu", kTypes.c_str(), types->arr.size(),
                       kTokens.c_str(), tok.size());
        }
    }

    v.tokens_.reserve(tok.size());
    v.scores_.reserve(tok.size());
    v.types_.reserve(tok.size());
    v.index_.reserve(tok.size());
    std::fill(std::begin(v.byte_tokens_), std::end(v.byte_tokens_), -1);
    for (int32_t id = 0; id < n; id++) {
        const auto i = static_cast<size_t>(id);
        v.tokens_.push_back(tok[i].s);
        v.scores_.push_back(static_cast<float>((*scores)->arr[i].f));
        TokenType type = TokenType::Normal;
        if (types != nullptr) {
            const int64_t t = int_of(types->arr[i], types->elem_type);
            if (t < 0 || t > static_cast<int64_t>(TokenType::Byte)) {
                return bad(f, "%s[%d]: unknown token type %lld", kTypes.c_str(), id,
                           static_cast<long long>(t));
            }
            type = static_cast<TokenType>(t);
        }
        v.types_.push_back(type);
        const int byte = parse_byte_token(v.tokens_.back());
        if (type == TokenType::Byte && byte < 0) {
            return bad(f, "%s[%d]: byte token \"%s\" is not of the form <0xNN>", kTokens.c_str(),
                       id, v.tokens_.back().c_str());
        }
        // Byte fallback looks tokens up by their text, as SentencePiece does.
        if (byte >= 0) v.byte_tokens_[byte] = id;
        // A repeated text maps to its last id (as llama.cpp's table does).
        v.index_[v.tokens_.back()] = id;
        if ((type == TokenType::Control || type == TokenType::UserDefined ||
             type == TokenType::Unknown) &&
            !v.tokens_.back().empty()) {
            v.special_.push_back(id);
        }
    }
    std::stable_sort(v.special_.begin(), v.special_.end(), [&v](int32_t a, int32_t b) {
        return v.token_text(a).size() > v.token_text(b).size();
    });

    // Defaults are llama.cpp's for SentencePiece vocabularies.
    FERRY_TRY(read_token_id(f, "tokenizer.ggml.bos_token_id", n, 1, &v.bos_));
    FERRY_TRY(read_token_id(f, "tokenizer.ggml.eos_token_id", n, 2, &v.eos_));
    FERRY_TRY(read_token_id(f, "tokenizer.ggml.unknown_token_id", n, 0, &v.unk_));
    FERRY_TRY(read_token_id(f, "tokenizer.ggml.padding_token_id", n, -1, &v.pad_));
    FERRY_TRY(read_token_id(f, "tokenizer.ggml.eot_token_id", n, -1, &v.eot_));
    FERRY_TRY(read_bool(f, "tokenizer.ggml.add_bos_token", true, &v.add_bos_));
    FERRY_TRY(read_bool(f, "tokenizer.ggml.add_space_prefix", true, &v.add_space_prefix_));
    return v;
}

bool Vocab::is_eog(int32_t id) const {
    return id >= 0 && (id == eos_ || id == eot_);
}

int32_t Vocab::find(std::string_view text) const {
    auto it = index_.find(text);
    return it == index_.end() ? -1 : it->second;
}

std::vector<int32_t> Vocab::encode(std::string_view text, bool add_bos, bool parse_special) const {
    std::vector<int32_t> out;
    if (add_bos && add_bos_ && bos_ >= 0) out.push_back(bos_);

    // Split special tokens out of the text: each token in turn (longest first) cuts every
    // remaining raw run at its occurrences, left to right.
    struct Frag {
        int32_t token;  // -1: raw text [off, off + len)
        size_t off, len;
    };
    std::vector<Frag> frags;
    if (!text.empty()) frags.push_back({-1, 0, text.size()});
    std::vector<Frag> next;
    for (int32_t id : special_) {
        const TokenType t = types_[static_cast<size_t>(id)];
        if (!parse_special && t != TokenType::UserDefined) continue;
        const std::string& s = tokens_[static_cast<size_t>(id)];
        next.clear();
        for (const Frag& fr : frags) {
            if (fr.token >= 0 || fr.len < s.size()) {
                next.push_back(fr);
                continue;
            }
            const std::string_view run = text.substr(fr.off, fr.len);
            size_t pos = 0;
            for (size_t hit; (hit = run.find(s, pos)) != std::string_view::npos;) {
                if (hit > pos) next.push_back({-1, fr.off + pos, hit - pos});
                next.push_back({id, 0, 0});
                pos = hit + s.size();
            }
            if (pos < run.size()) next.push_back({-1, fr.off + pos, run.size() - pos});
        }
        frags.swap(next);
    }

    // A raw run gets the prefix space when it starts the text or follows a special token.
    bool prev_special = true;
    for (const Frag& fr : frags) {
        if (fr.token >= 0) {
            out.push_back(fr.token);
            prev_special = true;
        } else {
            encode_run(text.substr(fr.off, fr.len), add_space_prefix_ && prev_special, out);
            prev_special = false;
        }
    }
    return out;
}

void Vocab::encode_run(std::string_view run, bool space_prefix, std::vector<int32_t>& out) const {
    std::string s;
    s.reserve(run.size() + 8);
    if (space_prefix) s += kSpaceMark;
    for (char c : run) {
        if (c == ' ') {
            s += kSpaceMark;
        } else {
            s += c;
        }
    }

    // Symbols form a doubly linked list over s; a merged-away symbol has n == 0.
    struct Sym {
        int32_t prev, next;
        size_t off, n;
    };
    std::vector<Sym> sym;
    for (size_t off = 0; off < s.size();) {
        const size_t n = utf8_char_len(std::string_view(s).substr(off));
        const auto idx = static_cast<int32_t>(sym.size());
        sym.push_back({idx - 1, idx + 1, off, n});
        off += n;
    }
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Bigram {
        int32_t left, right;
        float score;
        size_t n;  // byte length of the merged text, to detect stale entries
    };
    // Highest score first; equal scores: the leftmost pair first.
    auto lower = [](const Bigram& a, const Bigram& b) {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
    const std::string_view sv(s);
    auto try_pair = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const Sym& a = sym[static_cast<size_t>(l)];
        const Sym& b = sym[static_cast<size_t>(r)];
        const int32_t id = find(sv.substr(a.off, a.n + b.n));
        if (id < 0) return;
        queue.push({l, r, scores_[static_cast<size_t>(id)], a.n + b.n});
    };
    for (size_t i = 0; i + 1 < sym.size(); i++) {
        try_pair(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
    }

    while (!queue.empty()) {
        const Bigram bg = queue.top();
        queue.pop();
        Sym& a = sym[static_cast<size_t>(bg.left)];
        Sym& b = sym[static_cast<size_t>(bg.right)];
        // Either side was merged into something else since this pair was queued.
        if (a.n == 0 || b.n == 0 || a.n + b.n != bg.n || a.next != bg.right) continue;
        a.n += b.n;
        b.n = 0;
        a.next = b.next;
        if (b.next >= 0) sym[static_cast<size_t>(b.next)].prev = bg.left;
        try_pair(a.prev, bg.left);
        try_pair(bg.left, a.next);
    }

    for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
        const Sym& y = sym[static_cast<size_t>(i)];
        const std::string_view piece = sv.substr(y.off, y.n);
        const int32_t id = find(piece);
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        for (char c : piece) {
            const int32_t b = byte_tokens_[static_cast<unsigned char>(c)];
            if (b >= 0) {
                out.push_back(b);
            } else if (unk_ >= 0) {
                out.push_back(unk_);
            }
        }
    }
}

std::string Vocab::token_to_piece(int32_t id) const {
    if (!valid(id)) return {};
    const std::string& t = tokens_[static_cast<size_t>(id)];
    switch (types_[static_cast<size_t>(id)]) {
        case TokenType::Control:
        case TokenType::Unused:
            return {};
        case TokenType::Unknown:
            return std::string(kUnknownMark);
        case TokenType::UserDefined:
            return t;
        case TokenType::Byte:
            return std::string(1, static_cast<char>(parse_byte_token(t)));
        case TokenType::Undefined:
        case TokenType::Normal:
            break;
    }
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
        if (std::string_view(t).substr(i, kSpaceMark.size()) == kSpaceMark) {
            out += ' ';
            i += kSpaceMark.size();
        } else {
            out += t[i++];
        }
    }
    return out;
}

std::string Vocab::decode(const std::vector<int32_t>& ids, bool strip_leading_space) const {
    std::string out;
    for (int32_t id : ids) out += token_to_piece(id);
    if (strip_leading_space && add_space_prefix_ && !out.empty() && out[0] == ' ') {
        out.erase(0, 1);
    }
    return out;
}

}  // namespace ferry
