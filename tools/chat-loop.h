// A conversation over one inference session, shared by `ferry chat` and `ferry run --chat`:
// each turn renders the whole conversation with the file's chat template, tokenizes it
// (special tokens parsed), decodes only what the KV cache does not hold yet (the longest common
// prefix with the cached tokens is kept), and streams the reply until an end-of-generation
// token, the token limit or a full context.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "ferry/chat.h"
#include "ferry/llama.h"
#include "ferry/sampler.h"
#include "ferry/status.h"

namespace ferry::cli {

struct ChatTurnStats {
    size_t n_prompt = 0;   // tokens of the rendered conversation
    size_t n_decoded = 0;  // of which decoded this turn (the rest came from the cache)
    long long n_generated = 0;
    bool stopped_at_eog = false;
    double prompt_s = 0, gen_s = 0;
};

class ChatLoop {
  public:
    // Fails when the file has no tokenizer.chat_template or one of an unknown family.
    static Expected<ChatLoop> create(const LlamaModel& model, LlamaSession& session,
                                     const SamplerParams& sp);

    void set_system(const std::string& text) { system_ = text; }
    const ChatTemplate& chat_template() const { return tmpl_; }

    // One turn: the user's message in, the assistant's reply streamed to `out` (piece by piece,
    // flushed) and kept in the history. max_tokens bounds the reply (< 0: no bound
    // but the context).
    Status turn(const std::string& user, long long max_tokens, FILE* out, ChatTurnStats* stats);
    // The token ids of the last turn's rendered conversation.
    const std::vector<int32_t>& last_prompt() const { return prompt_; }

  private:
    ChatLoop(const LlamaModel& m, LlamaSession& s, const SamplerParams& sp, ChatTemplate t)
        : model_(&m), session_(&s), sampler_(sp), tmpl_(std::move(t)) {}

    const LlamaModel* model_;
    LlamaSession* session_;
    Sampler sampler_;
    ChatTemplate tmpl_;
    std::string system_;
    std::vector<ChatMessage> history_;
    std::vector<int32_t> cached_;  // tokens whose keys and values the session holds
    std::vector<int32_t> prompt_;
};

// Has the session read back only the candidates the sampler needs (set_top_k) instead of whole
// rows of logits, where that picks the same tokens (Sampler::candidates_needed).
void read_only_candidates(LlamaSession& s, const Sampler& sampler, int32_t n_vocab);
// The next token from the session's last decode, from its candidates when it read only those.
int32_t sample_next(Sampler& sampler, const LlamaSession& s, int32_t n_vocab);

// Prints ids comma-separated (for --verbose-prompt).
std::string join_ids(const std::vector<int32_t>& ids);

}  // namespace ferry::cli
