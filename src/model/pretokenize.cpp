#include "model/pretokenize.h"

#include <cstdint>

#include "model/unicode.h"

namespace ferry {

namespace {

bool is_cr_lf(uint32_t c) {
    return c == '\r' || c == '\n';
}

uint32_t ascii_lower(uint32_t c) {
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

}  // namespace

void pretokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>& out) {
    // Characters of the text: code point, class flags and starting byte offset (off[n] is the
    // end of the text).
    std::vector<uint32_t> cp;
    std::vector<uint8_t> fl;
    std::vector<size_t> off;
    cp.reserve(text.size());
    fl.reserve(text.size());
    off.reserve(text.size() + 1);
    for (size_t pos = 0; pos < text.size();) {
        size_t len = 0;
        const uint32_t c = unicode::decode_utf8(text, pos, &len);
        cp.push_back(c);
        fl.push_back(unicode::flags(c));
        off.push_back(pos);
        pos += len;
    }
    off.push_back(text.size());
    const size_t n = cp.size();
    const size_t max_digits = kind == PreTokenizer::Llama3 ? 3 : 1;

    auto letter = [&](size_t j) { return j < n && (fl[j] & unicode::kLetter) != 0; };
    auto number = [&](size_t j) { return j < n && (fl[j] & unicode::kNumber) != 0; };
    auto space = [&](size_t j) { return j < n && (fl[j] & unicode::kWhitespace) != 0; };
    // [^\s\p{L}\p{N}]
    auto other = [&](size_t j) { return j < n && fl[j] == 0; };

    for (size_t i = 0; i < n;) {
        size_t end = i;  // the match is characters [i, end)
        const uint32_t c = cp[i];
        if (c == '\'' && i + 1 < n) {
            // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            const uint32_t a = ascii_lower(cp[i + 1]);
            const uint32_t b = i + 2 < n ? ascii_lower(cp[i + 2]) : 0;
            if (a == 's' || a == 't' || a == 'm' || a == 'd') {
                end = i + 2;
            } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
                end = i + 3;
            }
        }
        if (end == i) {
            // [^\r\n\p{L}\p{N}]?\p{L}+ : first with the optional prefix, then without.
            size_t j = i;
            if (!is_cr_lf(c) && !letter(i) && !number(i) && letter(i + 1)) j = i + 1;
            if (letter(j)) {
                while (letter(j)) j++;
                end = j;
            }
        }
        if (end == i && number(i)) {
            // \p{N}{1,3} (llama-bpe) or \p{N} (qwen2)
            size_t j = i;
            while (j - i < max_digits && number(j)) j++;
            end = j;
        }
        if (end == i) {
            //  ?[^\s\p{L}\p{N}]+[\r\n]*
            size_t j = i;
            if (c == ' ' && other(i + 1)) j = i + 1;
            if (other(j)) {
                while (other(j)) j++;
                while (j < n && is_cr_lf(cp[j])) j++;
                end = j;
            }
        }
        if (end == i && space(i)) {
            size_t e = i;
            while (space(e)) e++;
            // \s*[\r\n]+ : up to the last CR or LF of the whitespace run.
            size_t last_nl = n;
            for (size_t k = i; k < e; k++) {
                if (is_cr_lf(cp[k])) last_nl = k;
            }
            if (last_nl != n) {
                end = last_nl + 1;
            } else if (e == n || e - i == 1) {
                // \s+(?!\S) at the end of the text, or \s+ for a single space before \S.
                end = e;
            } else {
                // \s+(?!\S): the run but its last character, which goes with what follows.
                end = e - 1;
            }
        }
        if (end == i) end = i + 1;  // unreachable: every character is L, N, \s or other
        out.push_back(text.substr(off[i], off[end] - off[i]));
        i = end;
    }
}

}  // namespace ferry
