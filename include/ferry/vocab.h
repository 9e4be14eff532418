// Tokenizer built from GGUF metadata (tokenizer.ggml.*).
//
// Supported: the SentencePiece-style "llama" vocabulary (scores, byte-fallback tokens <0xNN>,
// spaces as U+2581, a leading space added before the text as SentencePiece does). Encoding
// follows what llama.cpp produces for the same GGUF vocabulary (the fixture's ids_llama_cpp):
//
//   1. Special tokens are split out of the text first: user-defined tokens always, control
//      tokens only when parse_special is set (longest token first). Each remaining run of text
//      is tokenized on its own.
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
    // Reads tokenizer.ggml.model ("llama"), tokens, scores, token_type (optional: Normal),
    // bos/eos/unknown/padding/eot ids (optional: llama defaults 1/2/0 where they exist),
    // add_bos_token (optional: true) and add_space_prefix (optional: true). Fails with a message
    // naming the key on missing, mistyped or inconsistent metadata (array lengths that differ,
    // ids out of range, unknown token types).
    static Expected<Vocab> from_gguf(const GgufFile& f);

    int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
    int32_t bos() const { return bos_; }  // -1: none
    int32_t eos() const { return eos_; }  // -1: none
    int32_t unk() const { return unk_; }  // -1: none
    int32_t pad() const { return pad_; }  // -1: none
    bool add_bos() const { return add_bos_; }
    bool add_space_prefix() const { return add_space_prefix_; }
    // End of generation (eos, eot, ...).
    bool is_eog(int32_t id) const;
    bool valid(int32_t id) const { return id >= 0 && id < n_tokens(); }

    // Text (UTF-8) to ids. add_bos prepends BOS when the vocabulary uses one (add_bos_token and
    // a BOS id). parse_special: control tokens written in the text ("<s>") become those tokens;
    // otherwise they are tokenized as plain text.
    std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                bool parse_special = false) const;
    // The bytes of one token as they appear in output: U+2581 becomes a space, a byte token its
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
    void encode_run(std::string_view run, bool space_prefix, std::vector<int32_t>& out) const;

    std::vector<std::string> tokens_;
    std::vector<float> scores_;
    std::vector<TokenType> types_;
    std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> index_;
    int32_t byte_tokens_[256] = {};  // -1 where the vocabulary lacks <0xNN>
    // Tokens split out of text before merging, longest first: user-defined and control tokens.
    std::vector<int32_t> special_;
    int32_t bos_ = -1, eos_ = -1, unk_ = -1, pad_ = -1, eot_ = -1;
    bool add_bos_ = true;
    bool add_space_prefix_ = true;
};

}  // namespace ferry
