#include "model/unicode.h"

#include <algorithm>
#include <array>

namespace ferry::unicode {

uint8_t flags(uint32_t cp) {
    // Fast path: ASCII is most text.
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return kLetter;
        if (cp >= '0' && cp <= '9') return kNumber;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return kWhitespace;
        return 0;
    }
    const CodepointRange* end = kRanges + kNumRanges;
    const CodepointRange* it = std::upper_bound(
        kRanges, end, cp, [](uint32_t c, const CodepointRange& r) { return c < r.first; });
    if (it == kRanges) return 0;
    --it;
    return cp <= it->last ? it->flags : 0;
}

uint32_t decode_utf8(std::string_view s, size_t pos, size_t* len) {
    const auto b0 = static_cast<unsigned char>(s[pos]);
    *len = 1;
    if (b0 < 0x80) return b0;
    size_t n;
    uint32_t cp, min;
    if (b0 >= 0xC2 && b0 < 0xE0) {
        n = 2, cp = b0 & 0x1F, min = 0x80;
    } else if (b0 >= 0xE0 && b0 < 0xF0) {
        n = 3, cp = b0 & 0x0F, min = 0x800;
    } else if (b0 >= 0xF0 && b0 < 0xF5) {
        n = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
        return kInvalid;
    }
    if (pos + n > s.size()) return kInvalid;
    for (size_t i = 1; i < n; i++) {
        const auto b = static_cast<unsigned char>(s[pos + i]);
        if ((b & 0xC0) != 0x80) return kInvalid;
        cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalid;
    *len = n;
    return cp;
}

void append_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

namespace {

// Bytes GPT-2 keeps as themselves: '!'..'~', '¡'..'¬', '®'..'ÿ'.
constexpr bool kept(int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteMap {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 0x100 + 68> from_cp{};  // -1: not a mapped character
    ByteMap() {
        from_cp.fill(-1);
        uint32_t next = 0x100;
        for (int b = 0; b < 256; b++) {
            const uint32_t cp = kept(b) ? static_cast<uint32_t>(b) : next++;
            to_cp[static_cast<size_t>(b)] = cp;
            from_cp[cp] = static_cast<int16_t>(b);
        }
    }
};
const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) {
    return byte_map().to_cp[b];
}

int codepoint_to_byte(uint32_t cp) {
    const ByteMap& m = byte_map();
    return cp < m.from_cp.size() ? m.from_cp[cp] : -1;
}

}  // namespace ferry::unicode
