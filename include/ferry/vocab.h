// Tokenizers built from GGUF metadata (tokenizer.ggml.*). Two models, one class:
//
// - "llama": SentencePiece-style (vocab-spm.cpp). Scores, byte-fallback tokens <0xNN>, spaces
//   as U+2581, a leading space added before the text as SentencePiece does.
// - "gpt2": byte-level BPE (vocab-bpe.cpp) with the pre-tokenizers "llama-bpe" (Llama 3) and
//   "qwen2" (Qwen 2/2.5/3) of model/pretokenize.h, merges by rank (tokenizer.ggml.merges).
//
// Encoding, for both:
//
//   1. Special tokens are split out of the text first: user-defined tokens always, control
//      tokens only when parse_special is set (longest token first). Each remaining run of text
//      is tokenized on its own.
//
// SentencePiece ("llama") runs, following what llama.cpp produces for the same GGUF vocabulary:
//
//   2. A run that starts the text or follows a special token gets a leading space when
//      tokenizer.ggml.add_space_prefix is true (the default). No other normalization: no NFKC,
//      no whitespace folding ("  " stays two spaces; '\t' and '\n' stay as they are).
//   3. Every ' ' becomes U+2581 "▁". The run is split into UTF-8 characters (an invalid byte
//      is a character of its own), and the adjacent pair whose concatenation is a vocabulary
//      token with the highest score is merged, repeatedly (ties: the leftmost pair).
//   4. Each final symbol that is a vocabulary token gives its id; any other symbol gives one
//      byte-fallback token <0xNN> per byte (or the unknown token where the vocabulary has no
//      byte tokens).
//
// SentencePiece itself (the model's training tokenizer) also applies NFKC and folds runs of
// whitespace, which GGUF does not record; texts with such characters tokenize differently
// there.
//
// Byte-level BPE ("gpt2") runs, following Hugging Face tokenizers:
//
//   2. The pre-tokenizer splits the run into pieces (no prefix space, no normalization: the
//      NFC normalizer of Qwen's tokenizer.json is not applied, so text that is not already in
//      NFC may tokenize differently there).
//   3. Each byte of a piece becomes its GPT-2 character (model/unicode.h). With "llama-bpe"
//      (Hugging Face's ignore_merges) a piece that is itself a token gives that token. Else
//      the adjacent pair with the lowest merge rank is merged, repeatedly (ties: leftmost).
//   4. Each final symbol that is a token gives its id; any other gives one token per byte
//      (the byte's character), or the unknown token where that is missing too.
//
// Decoding maps every token back to its bytes, so decode(encode(x)) == x for any bytes x that
// hold no special-token text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/gguf.h"
#include "ferry/status.h"

namespace ferry {

enum class TokenType : int32_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
};

class Vocab {
  public:
    // Reads tokenizer.ggml.model ("llama" or "gpt2"), tokens, scores ("llama": required;
    // "gpt2": ignored), merges and pre ("gpt2" only: required), token_type (optional:
    // Normal), bos/eos/unknown/padding/eot/eom ids (optional; "llama" defaults 1/2/0 where
    // they exist, "gpt2" none), add_bos_token (optional: true for "llama" and "llama-bpe",
    // else false) and add_space_prefix ("llama" only, optional: true). Fails with a message
    // naming the key on missing, mistyped or inconsistent metadata (array lengths that differ,
    // ids out of range, unknown token types, an unknown model or pre-tokenizer, a merge that
    // is not two tokens).
    static Expected<Vocab> from_gguf(const GgufFile& f);

    enum class Model { Spm, Bpe };
    Model model() const { return model_; }
    int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
    int32_t bos() const { return bos_; }  // -1: none
    int32_t eos() const { return eos_; }  // -1: none
    int32_t unk() const { return unk_; }  // -1: none
    int32_t pad() const { return pad_; }  // -1: none
    bool add_bos() const { return add_bos_; }
    bool add_space_prefix() const { return add_space_prefix_; }
    int32_t eot() const { return eot_; }  // -1: none
    // End of generation: tokenizer.ggml.eos/eot/eom_token_id and every control token spelled
    // <|eot_id|>, <|eom_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|> or <end_of_turn>.
    bool is_eog(int32_t id) const;
    const std::vector<int32_t>& eog_ids() const { return eog_; }
    bool valid(int32_t id) const { return id >= 0 && id < n_tokens(); }

    // Text (UTF-8) to ids. add_bos prepends BOS when the vocabulary uses one (add_bos_token and
    // a BOS id). parse_special: control tokens written in the text ("<s>") become those tokens;
    // otherwise they are tokenized as plain text.
    std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                bool parse_special = false) const;
    // The bytes of one token as they appear in output. "gpt2": a normal token's characters
    // become the bytes they stand for. "llama": U+2581 becomes a space, a byte token its
    // single byte (so a multi-byte character may arrive over several tokens: a streaming printer
    // concatenates pieces), control and unused tokens nothing, the unknown token U+2585 "▅",
    // user-defined tokens their text. An invalid id gives nothing.
    std::string token_to_piece(int32_t id) const;
    // Ids to text; with `strip_leading_space` (and add_space_prefix) drops the one leading
    // space the encoder added, so decode(encode(x, any)) == x for every text x (any bytes) that
    // holds neither U+2581 (which the encoder cannot tell from a space) nor a special token
    // (after one, the encoder adds another prefix space, as llama.cpp does).
    std::string decode(const std::vector<int32_t>& ids, bool strip_leading_space = true) const;
    // The token as stored in the vocabulary ("▁the", "<0x0A>", "<s>"). id must be valid.
    const std::string& token_text(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }
    float token_score(int32_t id) const { return scores_[static_cast<size_t>(id)]; }
    TokenType token_type(int32_t id) const { return types_[static_cast<size_t>(id)]; }
    // The id of a token with exactly this text, or -1.
    int32_t find(std::string_view text) const;

  private:
    // Heterogeneous lookup: find(string_view) without building a std::string.
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    Status load_bpe(const GgufFile& f);  // vocab-bpe.cpp: merges, pre, byte tokens
    // vocab-spm.cpp
    void encode_spm_run(std::string_view run, bool space_prefix, std::vector<int32_t>& out) const;
    // vocab-bpe.cpp
    void encode_bpe_run(std::string_view run, std::vector<int32_t>& out) const;
    void bpe_piece(std::string_view piece, std::vector<int32_t>& out) const;
    std::string bpe_token_bytes(const std::string& text) const;

    std::vector<std::string> tokens_;
    std::vector<float> scores_;
    std::vector<TokenType> types_;
    std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> index_;
    Model model_ = Model::Spm;
    // Byte fallback: "llama": <0xNN>; "gpt2": the byte's GPT-2 character. -1 where missing.
    int32_t byte_tokens_[256] = {};
    // "gpt2": merge rank by "left right" text; the pre-tokenizer.
    std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> merge_rank_;
    int pre_ = 0;                 // PreTokenizer
    bool ignore_merges_ = false;  // a piece that is a token is taken whole (llama-bpe)
    std::vector<int32_t> eog_;
    // Tokens split out of text before merging, longest first: user-defined and control tokens.
    std::vector<int32_t> special_;
    int32_t bos_ = -1, eos_ = -1, unk_ = -1, pad_ = -1, eot_ = -1, eom_ = -1;
    bool add_bos_ = true;
    bool add_space_prefix_ = true;
};

}  // namespace ferry
