// Chat templates: the file's tokenizer.chat_template (Jinja text) is recognised by the
// distinctive markers of its family and rendered by C++ code, not interpreted:
//
//   llama3  <|start_header_id|> ... <|eot_id|>   Llama 3, 3.1, 3.2, 3.3 (3.1+: the system
//                                                block with "Cutting Knowledge Date")
//   chatml  <|im_start|> ... <|im_end|>          Qwen 2, 2.5 (with its default system
//                                                message), Qwen 3 (<think> handling)
//
// Anything else fails with "unknown chat template; known: llama3, chatml". Rendering covers
// plain messages (system, user, assistant); tools and tool calls are not rendered.
#pragma once

#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry {

struct ChatMessage {
    std::string role;  // "system", "user" or "assistant"
    std::string content;
};

class ChatTemplate {
  public:
    enum class Family { Llama3, ChatML };

    // Recognises a template. bos_text is the text of the BOS token (Llama 3 templates begin
    // with it); today_date ("26 Jul 2024" style) is used by templates that print the date
    // with strftime_now (Llama 3.2); empty: today's date.
    static Expected<ChatTemplate> recognise(const std::string& jinja, const std::string& bos_text,
                                            const std::string& today_date = "");

    Family family() const { return family_; }
    const char* family_name() const { return family_ == Family::Llama3 ? "llama3" : "chatml"; }

    // The conversation as text, ending with the assistant's header when add_generation_prompt.
    // Special tokens appear spelled out ("<|eot_id|>"): tokenize with parse_special.
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  private:
    Family family_ = Family::ChatML;
    std::string bos_;
    bool llama31_system_ = false;  // the "Cutting Knowledge Date" system block
    std::string date_;             // its "Today Date"
    std::string default_system_;   // chatml: system message when the conversation has none
    bool think_ = false;           // chatml: Qwen 3's <think> handling of assistant messages
};

}  // namespace ferry
