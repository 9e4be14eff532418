// SentencePiece-style ("llama") encoding of one run of text: see vocab.h.
#include <queue>

#include "ferry/vocab.h"
#include "model/vocab-impl.h"

namespace ferry {

using namespace vocab_detail;

void Vocab::encode_spm_run(std::string_view run, bool space_prefix,
                           std::vector<int32_t>& out) const {
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

}  // namespace ferry
