// Hugging Face tokenizer files -> GGUF tokenizer metadata, for `ferry convert` and tests.
//
// tokenizer_json_to_gguf_kv reads a byte-level BPE tokenizer.json (model.type "BPE" with a
// ByteLevel pre-tokenizer: Llama 3, Qwen 2/2.5/3) and, optionally, tokenizer_config.json, and
// returns the metadata entries the public converter (llama.cpp's convert_hf_to_gguf.py) writes,
// with the same keys and value types:
//
//   tokenizer.ggml.model            string  "gpt2"
//   tokenizer.ggml.pre              string  "llama-bpe" or "qwen2", recognised from the
//                                           pre_tokenizer's Split regex (anything else fails)
//   tokenizer.ggml.tokens           string[] every id 0..n-1: model.vocab and added_tokens;
//                                           ids in neither become "[PAD<id>]"
//   tokenizer.ggml.token_type       int32[] 1 NORMAL (vocab), 3 CONTROL (added, "special": true
//                                           or spelled "<|...|>"), 4 USER_DEFINED (other added
//                                           tokens), 5 UNUSED (padding)
//   tokenizer.ggml.merges           string[] "left right" in rank order (both of tokenizer.json's
//                                           spellings, "a b" and ["a", "b"], are read)
//   tokenizer.ggml.bos_token_id     uint32  } from tokenizer_config.json's bos_token, eos_token,
//   tokenizer.ggml.eos_token_id     uint32  } pad_token, unk_token (a string or {"content": ..})
//   tokenizer.ggml.padding_token_id uint32  } when set and found among the tokens
//   tokenizer.ggml.unknown_token_id uint32  }
//   tokenizer.ggml.add_bos_token    bool    tokenizer_config.json's add_bos_token; else true
//                                           when tokenizer.json's post_processor (a
//                                           TemplateProcessing, possibly in a Sequence) puts
//                                           the BOS token first; else not written
//   tokenizer.ggml.add_eos_token    bool    tokenizer_config.json's add_eos_token, when present
//   tokenizer.chat_template         string  tokenizer_config.json's chat_template (a string,
//                                           or the "default" entry of a list of named ones);
//                                           else the text of chat_template.jinja next to
//                                           tokenizer_config.json, when that file exists
//
// Errors name the file and the field (e.g. "tokenizer.json: model.type is \"Unigram\"").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/gguf.h"
#include "ferry/status.h"

namespace ferry {

struct TokenizerJsonOptions {
    // Total number of tokens to write (the model's embedding rows, config.json's vocab_size),
    // padding with "[PAD<id>]" UNUSED tokens. 0: the tokenizer's own count (highest id + 1).
    // Smaller than the tokenizer's count is an error.
    int64_t vocab_size = 0;
    // Instead of vocab_size: pad up to at least this many tokens; a tokenizer with more keeps
    // its own count (gen-model: the preset's rows or the tokenizer's, whichever is larger).
    int64_t min_vocab_size = 0;
};

// tokenizer_config_path may be empty (no config: no special ids, no chat template).
// The entries come in the order above; add them to a GgufWriter with add_kv.
Expected<std::vector<GgufKV>> tokenizer_json_to_gguf_kv(const std::string& tokenizer_json_path,
                                                        const std::string& tokenizer_config_path,
                                                        const TokenizerJsonOptions& opts = {});

// The same for a tokenizer.json file or a folder holding one, with the tokenizer_config.json
// beside it when that file exists.
Expected<std::vector<GgufKV>> tokenizer_to_gguf_kv(const std::string& file_or_dir,
                                                   const TokenizerJsonOptions& opts = {});

}  // namespace ferry
