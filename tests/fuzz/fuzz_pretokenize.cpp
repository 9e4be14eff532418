// libFuzzer target for the byte-level BPE pre-tokenizers and the chat template renderer: any
// bytes must split into non-empty pieces that concatenate back to the input (for both
// patterns), with every piece boundary on a character boundary of the UTF-8 decoder; and
// rendering a conversation of arbitrary contents must keep ChatML's user messages verbatim.
//
//   build/fuzz/tests/fuzz_pretokenize -max_total_time=60

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/chat.h"
#include "model/pretokenize.h"

namespace {

void check(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    for (ferry::PreTokenizer k : {ferry::PreTokenizer::Llama3, ferry::PreTokenizer::Qwen2}) {
        std::vector<std::string_view> pieces;
        ferry::pretokenize(k, text, pieces);
        size_t at = 0;
        for (std::string_view p : pieces) {
            check(!p.empty());
            check(p.data() == text.data() + at);
            at += p.size();
        }
        check(at == text.size());
    }
    static const ferry::ChatTemplate templates[] = {
        *ferry::ChatTemplate::recognise("<|start_header_id|><|eot_id|>", "<|begin_of_text|>"),
        *ferry::ChatTemplate::recognise("<|im_start|><|im_end|></think>", ""),
    };
    const std::string s(text);
    for (const ferry::ChatTemplate& t : templates) {
        const std::string out =
            t.render({{"system", s}, {"user", s}, {"assistant", s}, {"user", s}}, true);
        // ChatML keeps user contents verbatim; Llama 3 trims them, between its fixed frame.
        if (t.family() == ferry::ChatTemplate::Family::ChatML) {
            check(out.find("<|im_start|>user\n" + s + "<|im_end|>") != std::string::npos);
        } else {
            const std::string head = "<|start_header_id|>assistant<|end_header_id|>\n\n";
            check(out.rfind("<|begin_of_text|>", 0) == 0);
            check(out.size() >= head.size() &&
                  out.compare(out.size() - head.size(), head.size(), head) == 0);
        }
    }
    return 0;
}
