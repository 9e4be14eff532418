// Byte-level BPE ("gpt2") loading, encoding and decoding: see vocab.h.
#include <queue>

#include "ferry/vocab.h"
#include "model/pretokenize.h"
#include "model/unicode.h"
#include "model/vocab-impl.h"

namespace ferry {

using namespace vocab_detail;

Status Vocab::load_bpe(const GgufFile& f) {
    const std::string kPre = "tokenizer.ggml.pre";
    const std::string kMerges = "tokenizer.ggml.merges";
    Expected<std::string> pre = f.get_string(kPre);
    if (!pre) return pre.status();
    if (*pre == "llama-bpe") {
        pre_ = static_cast<int>(PreTokenizer::Llama3);
        ignore_merges_ = true;
    } else if (*pre == "qwen2") {
        pre_ = static_cast<int>(PreTokenizer::Qwen2);
    } else {
        return bad(f, "%s is \"%s\": supported are \"llama-bpe\" and \"qwen2\"", kPre.c_str(),
                   pre->c_str());
    }

    Expected<const GgufValue*> merges = typed_array(
        f, kMerges, [](GgufValueType t) { return t == GgufValueType::STRING; }, "strings");
    if (!merges) return merges.status();
    const std::vector<GgufValue>& m = (*merges)->arr;
    merge_rank_.reserve(m.size());
    for (size_t i = 0; i < m.size(); i++) {
        const std::string& s = m[i].s;
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
            s.find(' ', sp + 1) != std::string::npos) {
            return bad(f, "%s[%zu]: \"%s\" is not two tokens separated by one space",
                       kMerges.c_str(), i, s.c_str());
        }
        // The first occurrence of a pair has the rank that counts.
        merge_rank_.emplace(s, static_cast<int32_t>(i));
    }

    std::fill(std::begin(byte_tokens_), std::end(byte_tokens_), -1);
    std::string ch;
    for (int b = 0; b < 256; b++) {
        ch.clear();
        unicode::append_utf8(unicode::byte_to_codepoint(static_cast<uint8_t>(b)), ch);
        byte_tokens_[b] = find(ch);
    }
    return Status::ok();
}

void Vocab::encode_bpe_run(std::string_view run, std::vector<int32_t>& out) const {
    std::vector<std::string_view> pieces;
    pretokenize(static_cast<PreTokenizer>(pre_), run, pieces);
    for (std::string_view p : pieces) bpe_piece(p, out);
}

void Vocab::bpe_piece(std::string_view piece, std::vector<int32_t>& out) const {
    // The piece in GPT-2 characters; symbol i starts at byte start[i] of `s`.
    std::string s;
    s.reserve(piece.size() * 2);
    struct Sym {
        int32_t prev, next;
        size_t off, n;  // bytes of s; n == 0: merged away
    };
    std::vector<Sym> sym;
    sym.reserve(piece.size());
    for (char c : piece) {
        const size_t off = s.size();
        unicode::append_utf8(unicode::byte_to_codepoint(static_cast<uint8_t>(c)), s);
        const auto idx = static_cast<int32_t>(sym.size());
        sym.push_back({idx - 1, idx + 1, off, s.size() - off});
    }
    if (sym.empty()) return;
    sym.back().next = -1;
    const std::string_view sv(s);

    if (ignore_merges_) {
        const int32_t id = find(sv);
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }

    struct Pair {
        int32_t left, right;
        int32_t rank;
        size_t n;  // byte length of the merged text, to detect stale entries
    };
    // Lowest rank first; equal ranks: the leftmost pair first.
    auto later = [](const Pair& a, const Pair& b) {
        return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    };
    std::priority_queue<Pair, std::vector<Pair>, decltype(later)> queue(later);
    std::string key;
    auto try_pair = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const Sym& a = sym[static_cast<size_t>(l)];
        const Sym& b = sym[static_cast<size_t>(r)];
        key.assign(sv.substr(a.off, a.n));
        key += ' ';
        key.append(sv.substr(b.off, b.n));
        auto it = merge_rank_.find(key);
        if (it == merge_rank_.end()) return;
        queue.push({l, r, it->second, a.n + b.n});
    };
    for (size_t i = 0; i + 1 < sym.size(); i++) {
        try_pair(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
    }
    while (!queue.empty()) {
        const Pair p = queue.top();
        queue.pop();
        Sym& a = sym[static_cast<size_t>(p.left)];
        Sym& b = sym[static_cast<size_t>(p.right)];
        // Either side was merged into something else since this pair was queued.
        if (a.n == 0 || b.n == 0 || a.n + b.n != p.n || a.next != p.right) continue;
        a.n += b.n;
        b.n = 0;
        a.next = b.next;
        if (b.next >= 0) sym[static_cast<size_t>(b.next)].prev = p.left;
        try_pair(a.prev, p.left);
        try_pair(p.left, a.next);
    }

    for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
        const Sym& y = sym[static_cast<size_t>(i)];
        const int32_t id = find(sv.substr(y.off, y.n));
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        // Byte fallback: one token per byte of the symbol (each byte is one GPT-2 character).
        for (size_t off = y.off; off < y.off + y.n;) {
            size_t len = 0;
            const uint32_t cp = unicode::decode_utf8(sv, off, &len);
            off += len;
            const int b = unicode::codepoint_to_byte(cp);
            const int32_t t = b >= 0 ? byte_tokens_[b] : -1;
            if (t >= 0) {
                out.push_back(t);
            } else if (unk_ >= 0) {
                out.push_back(unk_);
            }
        }
    }
}

std::string Vocab::bpe_token_bytes(const std::string& text) const {
    std::string out;
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
        size_t len = 0;
        const uint32_t cp = unicode::decode_utf8(text, pos, &len);
        const int b = unicode::codepoint_to_byte(cp);
        if (b >= 0) {
            out += static_cast<char>(b);
        } else {
            // Not a GPT-2 byte character (a hand-added token): its own UTF-8.
            out.append(text, pos, len);
        }
        pos += len;
    }
    return out;
}

}  // namespace ferry
