#include <ctime>

#include "ferry/chat.h"
#include "model/unicode.h"

namespace ferry {

namespace {

bool contains(const std::string& s, const char* what) {
    return s.find(what) != std::string::npos;
}

// Python's str.isspace (Jinja's trim filter is str.strip()): White_Space and U+001C..U+001F.
bool py_space(uint32_t cp) {
    return unicode::is_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F);
}

// Jinja's `| trim`.
std::string trim(const std::string& s) {
    size_t begin = 0, end = s.size();
    while (begin < end) {
        size_t len = 0;
        const uint32_t cp = unicode::decode_utf8(s, begin, &len);
        if (!py_space(cp)) break;
        begin += len;
    }
    // Walk back to the start of each trailing character.
    while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) start--;
        size_t len = 0;
        const uint32_t cp = unicode::decode_utf8(s, start, &len);
        if (start + len != end || !py_space(cp)) break;
        end = start;
    }
    return s.substr(begin, end - begin);
}

std::string lstrip_nl(const std::string& s) {
    const size_t b = s.find_first_not_of('\n');
    return b == std::string::npos ? std::string() : s.substr(b);
}
std::string rstrip_nl(const std::string& s) {
    const size_t e = s.find_last_not_of('\n');
    return e == std::string::npos ? std::string() : s.substr(0, e + 1);
}

// strftime("%d %b %Y") of today, as Llama 3.2's template prints it.
std::string today() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
    return buf;
}

}  // namespace

Expected<ChatTemplate> ChatTemplate::recognise(const std::string& jinja,
                                               const std::string& bos_text,
                                               const std::string& today_date) {
    ChatTemplate t;
    t.bos_ = bos_text;
    if (contains(jinja, "<|start_header_id|>") && contains(jinja, "<|eot_id|>")) {
        t.family_ = Family::Llama3;
        if (contains(jinja, "Cutting Knowledge Date")) {
            t.llama31_system_ = true;
            // 3.2 asks strftime_now; 3.1 sets a fixed date_string.
            const std::string kSet = "date_string = \"";
            const size_t at = jinja.find(kSet);
            if (contains(jinja, "strftime_now")) {
                t.date_ = today_date.empty() ? today() : today_date;
            } else if (at != std::string::npos) {
                const size_t b = at + kSet.size();
                t.date_ = jinja.substr(b, jinja.find('"', b) - b);
            } else {
                t.date_ = "26 Jul 2024";
            }
        }
        return t;
    }
    if (contains(jinja, "<|im_start|>") && contains(jinja, "<|im_end|>")) {
        t.family_ = Family::ChatML;
        const char* kQwenSystem =
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
        if (contains(jinja, kQwenSystem)) t.default_system_ = kQwenSystem;
        t.think_ = contains(jinja, "</think>");
        return t;
    }
    return Status::error("unknown chat template; known: llama3, chatml");
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
    std::string out;
    if (family_ == Family::Llama3) {
        size_t first = 0;
        out += bos_;
        if (llama31_system_) {
            // The system block always comes first, carrying the system message (if any).
            std::string system;
            if (!messages.empty() && messages[0].role == "system") {
                system = trim(messages[0].content);
                first = 1;
            }
            out += "<|start_header_id|>system<|end_header_id|>\n\n";
            out += "Cutting Knowledge Date: December 2023\nToday Date: " + date_ + "\n\n";
            out += system + "<|eot_id|>";
        }
        for (size_t i = first; i < messages.size(); i++) {
            out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" +
                   trim(messages[i].content) + "<|eot_id|>";
        }
        if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
        return out;
    }

    // ChatML
    if ((messages.empty() || messages[0].role != "system") && !default_system_.empty()) {
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    }
    // Qwen 3 keeps the reasoning only of assistant messages after the last user message.
    size_t last_query = messages.empty() ? 0 : messages.size() - 1;
    for (size_t i = messages.size(); i-- > 0;) {
        if (messages[i].role == "user") {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < messages.size(); i++) {
        const ChatMessage& m = messages[i];
        if (m.role != "assistant" || !think_) {
            out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
            continue;
        }
        std::string content = m.content, reasoning;
        const size_t close = content.rfind("</think>");
        if (close != std::string::npos) {
            const std::string before = m.content.substr(0, m.content.find("</think>"));
            const size_t open = before.rfind("<think>");
            reasoning =
                lstrip_nl(rstrip_nl(open == std::string::npos ? before : before.substr(open + 7)));
            content = lstrip_nl(m.content.substr(close + 8));
        }
        out += "<|im_start|>assistant\n";
        if (i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
            out += "<think>\n" + lstrip_nl(rstrip_nl(reasoning)) + "\n</think>\n\n" +
                   lstrip_nl(content);
        } else {
            out += content;
        }
        out += "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

}  // namespace ferry
