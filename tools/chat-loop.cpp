#include "chat-loop.h"

#include <chrono>

namespace ferry::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string join_ids(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
        if (!s.empty()) s += ',';
        s += std::to_string(id);
    }
    return s;
}

Expected<ChatLoop> ChatLoop::create(const LlamaModel& model, LlamaSession& session,
                                    const SamplerParams& sp) {
    const GgufFile& f = model.gguf();
    if (f.find_kv("tokenizer.chat_template") == nullptr) {
        return Status::error(f.path() + ": the file has no tokenizer.chat_template");
    }
    Expected<std::string> text = f.get_string("tokenizer.chat_template");
    if (!text) return text.status();
    const Vocab& v = model.vocab();
    Expected<ChatTemplate> t =
        ChatTemplate::recognise(*text, v.bos() >= 0 ? v.token_text(v.bos()) : std::string());
    if (!t) return Status::error(f.path() + ": tokenizer.chat_template: " + t.message());
    read_only_candidates(session, Sampler(sp), model.hparams().n_vocab);
    return ChatLoop(model, session, sp, std::move(*t));
}

void read_only_candidates(LlamaSession& s, const Sampler& sampler, int32_t n_vocab) {
    s.set_top_k(sampler.candidates_needed(n_vocab));
}

int32_t sample_next(Sampler& sampler, const LlamaSession& s, int32_t n_vocab) {
    if (s.n_top() > 0) return sampler.sample_top(s.top_logits(), s.top_ids(), s.n_top());
    return sampler.sample(s.logits(0), n_vocab);
}

Status ChatLoop::turn(const std::string& user, long long max_tokens, FILE* out,
                      ChatTurnStats* stats) {
    ChatTurnStats st;
    const Vocab& vocab = model_->vocab();
    const int32_t n_vocab = model_->hparams().n_vocab;
    LlamaSession& s = *session_;

    std::vector<ChatMessage> msgs;
    if (!system_.empty()) msgs.push_back({"system", system_});
    msgs.insert(msgs.end(), history_.begin(), history_.end());
    msgs.push_back({"user", user});
    // The template writes BOS itself where the model wants one.
    prompt_ = vocab.encode(tmpl_.render(msgs, true), false, true);
    st.n_prompt = prompt_.size();
    if (prompt_.size() >= static_cast<size_t>(s.n_ctx())) {
        return Status::errorf("the conversation (%zu tokens) does not fit the context of %d tokens",
                              prompt_.size(), s.n_ctx());
    }

    // Keep the cached prefix; at least the last prompt token is decoded again for its logits.
    size_t keep = 0;
    while (keep < cached_.size() && keep < prompt_.size() && cached_[keep] == prompt_[keep]) keep++;
    if (keep == prompt_.size()) keep--;
    s.truncate(static_cast<int32_t>(keep));
    cached_.resize(keep);
    const std::vector<int32_t> fresh(prompt_.begin() + static_cast<std::ptrdiff_t>(keep),
                                     prompt_.end());
    const auto t_prompt = std::chrono::steady_clock::now();
    FERRY_TRY(s.decode(fresh, false));
    cached_.insert(cached_.end(), fresh.begin(), fresh.end());
    st.n_decoded = fresh.size();
    st.prompt_s = seconds_since(t_prompt);
    sampler_.reset();
    for (int32_t t : prompt_) sampler_.accept(t);

    const auto t_gen = std::chrono::steady_clock::now();
    std::string reply;
    while (max_tokens < 0 || st.n_generated < max_tokens) {
        const int32_t next = sample_next(sampler_, s, n_vocab);
        if (next < 0) break;
        if (vocab.is_eog(next)) {
            st.stopped_at_eog = true;
            break;
        }
        sampler_.accept(next);
        const std::string piece = vocab.token_to_piece(next);
        reply += piece;
        std::fwrite(piece.data(), 1, piece.size(), out);
        std::fflush(out);
        st.n_generated++;
        if (st.n_generated == max_tokens) break;
        if (s.n_past() >= s.n_ctx()) {
            std::fprintf(stderr, "\n(context of %d tokens is full)\n", s.n_ctx());
            break;
        }
        const int32_t one[1] = {next};
        FERRY_TRY(s.decode(one, false));
        cached_.push_back(next);
    }
    st.gen_s = seconds_since(t_gen);
    history_.push_back({"user", user});
    history_.push_back({"assistant", reply});
    if (stats) *stats = st;
    return Status::ok();
}

}  // namespace ferry::cli
