// Helpers shared by the tokenizer files (vocab.cpp, vocab-spm.cpp, vocab-bpe.cpp); not API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/gguf.h"
#include "ferry/status.h"

namespace ferry::vocab_detail {

inline constexpr std::string_view kSpaceMark = "\xE2\x96\x81";    // U+2581 "▁"
inline constexpr std::string_view kUnknownMark = "\xE2\x96\x85";  // U+2585 "▅"

// An error about this file's metadata, prefixed with its path as GgufFile's own errors are.
Status bad(const GgufFile& f, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
bool is_signed_int(GgufValueType t);
bool is_unsigned_int(GgufValueType t);
bool is_float(GgufValueType t);
// Byte length of the UTF-8 character starting at s[0] (s non-empty); 1 for a byte that does
// not start a well-formed sequence, so invalid input still splits into single bytes.
size_t utf8_char_len(std::string_view s);
// "<0xNN>" -> NN, or -1.
int parse_byte_token(std::string_view t);
// Fetches an array-valued key whose elements satisfy `elem_ok`.
Expected<const GgufValue*> typed_array(const GgufFile& f, const std::string& key,
                                       bool (*elem_ok)(GgufValueType), const char* what);

}  // namespace ferry::vocab_detail
