// Pre-tokenizers of byte-level BPE vocabularies: split text into the pieces that BPE merges
// never cross, exactly as the regex of the model's Hugging Face tokenizer.json does (leftmost
// alternative first, greedy, with backtracking), for all of Unicode.
//
// Written by hand instead of with a regex engine: std::regex has no \p{L} and is slow, and the
// two patterns are small. The patterns (tokenizer.json pre_tokenizer Split, "Isolated"):
//
//   llama-bpe (Llama 3):
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//      ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2 (Qwen 2, 2.5, 3): the same with \p{N} (one digit per piece) instead of \p{N}{1,3}.
//
// \p{L}, \p{N} and \s are the classes of model/unicode.h. The (?i) of the contractions folds
// ASCII letters only. A byte that is not well-formed UTF-8 is a character of no class.
#pragma once

#include <string_view>
#include <vector>

namespace ferry {

enum class PreTokenizer {
    Llama3,  // tokenizer.ggml.pre = "llama-bpe"
    Qwen2,   // tokenizer.ggml.pre = "qwen2"
};

// Appends the pieces of `text` to `out` (views into `text`, in order, covering all of it).
void pretokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>& out);

}  // namespace ferry
