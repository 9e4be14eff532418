// Chat: template recognition and rendering (against the text of the models' published
// formats), and `ferry run --chat` / `ferry chat` end to end on random-weight models with the
// real Llama 3 and Qwen 3 vocabularies: the prompt ids the template produced, multi-turn
// history, /exit, and generation stopping at end-of-generation tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/json.h"
#include "ferry/chat.h"
#include "ferry/gguf.h"
#include "ferry/vocab.h"
#include "shell.h"

namespace ferry {
namespace {

const std::string kDir = std::string(FERRY_FIXTURES_DIR) + "/tokenizers";
const std::string kBin = FERRY_BIN;

const std::string& tmp_dir() {
    static const std::string dir = [] {
        char tmpl[] = "/tmp/ferry-test-chat-XXXXXX";
        const char* d = mkdtemp(tmpl);
        EXPECT_NE(d, nullptr);
        std::string s = d != nullptr ? d : "/tmp";
        std::atexit([] { std::system(("rm -rf " + tmp_dir()).c_str()); });
        return s;
    }();
    return dir;
}

std::string fixture_template(const std::string& name) {
    Expected<json::Value> cfg = json::parse_file(kDir + "/" + name + "/tokenizer_config.json");
    EXPECT_TRUE(cfg.has_value()) << cfg.message();
    return cfg ? (*cfg)["chat_template"].as_string() : std::string();
}

// A folder with the fixture's tokenizer.json (unpacked) and tokenizer_config.json.
std::string hf_dir(const std::string& name) {
    const std::string dir = tmp_dir() + "/" + name;
    if (access((dir + "/tokenizer.json").c_str(), R_OK) != 0) {
        const std::string cmd = "mkdir -p '" + dir + "' && gzip -dc '" + kDir + "/" + name +
                                "/tokenizer.json.gz' > '" + dir + "/tokenizer.json' && cp '" +
                                kDir + "/" + name + "/tokenizer_config.json' '" + dir + "/'";
        EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return dir;
}

TEST(ChatTemplate, RecognisesFamiliesAndRejectsOthers) {
    Expected<ChatTemplate> l =
        ChatTemplate::recognise(fixture_template("llama3"), "<|begin_of_text|>");
    ASSERT_TRUE(l.has_value()) << l.message();
    EXPECT_EQ(l->family(), ChatTemplate::Family::Llama3);
    Expected<ChatTemplate> q = ChatTemplate::recognise(fixture_template("qwen3"), "");
    ASSERT_TRUE(q.has_value()) << q.message();
    EXPECT_EQ(q->family(), ChatTemplate::Family::ChatML);
    for (const char* other :
         {"", "{{ messages }}", "<start_of_turn>user\n{{ content }}<end_of_turn>",
          "<|im_start|> without the end marker"}) {
        Expected<ChatTemplate> u = ChatTemplate::recognise(other, "");
        ASSERT_FALSE(u.has_value()) << other;
        EXPECT_EQ(u.message(), "unknown chat template; known: llama3, chatml");
    }
}

const std::vector<ChatMessage> kConversation = {
    {"system", "  You are terse.\n"},
    {"user", "Hi!"},
    {"assistant", "Hello. "},
    {"user", "2+2?"},
};

TEST(ChatTemplate, Llama3MatchesPublishedFormat) {
    Expected<ChatTemplate> t =
        ChatTemplate::recognise(fixture_template("llama3"), "<|begin_of_text|>");
    ASSERT_TRUE(t.has_value());
    // Meta's Llama 3 model card: each message is a header, a blank line, the trimmed content
    // and <|eot_id|>; the prompt ends with the assistant's header.
    EXPECT_EQ(t->render(kConversation, true),
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are "
              "terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    EXPECT_EQ(t->render({{"user", "x"}}, false),
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
}

TEST(ChatTemplate, Llama31SystemBlock) {
    // The distinctive lines of the Llama 3.1 / 3.2 templates.
    const std::string t31 =
        "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = \"26 Jul "
        "2024\" %}{%- endif %}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- "
        "\"Cutting Knowledge Date: December 2023\\n\" }}{{- '<|eot_id|>' }}";
    Expected<ChatTemplate> t = ChatTemplate::recognise(t31, "<|begin_of_text|>");
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->render({{"user", "Hi"}}, true),
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
              "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    Expected<ChatTemplate> t32 = ChatTemplate::recognise(t31 + "{{ strftime_now(\"%d %b %Y\") }}",
                                                         "<|begin_of_text|>", "01 Dec 2026");
    ASSERT_TRUE(t32.has_value());
    EXPECT_EQ(t32->render({{"system", "Be kind."}, {"user", "Hi"}}, false),
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
              "Date: December 2023\nToday Date: 01 Dec 2026\n\nBe kind.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplate, ChatMLMatchesPublishedFormat) {
    Expected<ChatTemplate> t = ChatTemplate::recognise(fixture_template("qwen3"), "");
    ASSERT_TRUE(t.has_value());
    // Qwen 3: contents as they are (no trim), and an earlier assistant turn loses its
    // reasoning; the generation prompt is the assistant's header.
    std::vector<ChatMessage> conv = kConversation;
    conv[2].content = "<think>\nadd\n</think>\n\nHello. ";
    EXPECT_EQ(t->render(conv, true),
              "<|im_start|>system\n  You are terse.\n<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
              "<|im_start|>assistant\nHello. <|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
              "<|im_start|>assistant\n");
    // After the last user message, the reasoning stays.
    EXPECT_EQ(t->render({{"user", "a"}, {"assistant", "<think>r</think>b"}}, false),
              "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nb"
              "<|im_end|>\n");
    // Qwen 2.5 adds its default system message when the conversation has none.
    Expected<ChatTemplate> q25 = ChatTemplate::recognise(
        "{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\\n' }}{{ '<|im_start|>' }}",
        "");
    ASSERT_TRUE(q25.has_value());
    EXPECT_EQ(q25->render({{"user", "Hi"}}, true),
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
              "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// A random-weight model (tiny shapes) with a fixture's vocabulary and chat template.
std::string model_file(const std::string& name) {
    const std::string path = tmp_dir() + "/" + name + ".gguf";
    if (access(path.c_str(), R_OK) != 0) {
        const std::string cmd = kBin +
                                " gen-model --preset tiny --type q8_0 --embd-type f16 --vocab '" +
                                hf_dir(name) + "/tokenizer.json' -o '" + path + "' 2>&1";
        const testing::ShellResult r = testing::run_shell(cmd);
        EXPECT_EQ(r.rc, 0) << r.out;
    }
    return path;
}

// The oracle-checked tokenizer (test_bpe) of a fixture vocabulary: the model file's metadata,
// which tokenizer_json_to_gguf_kv wrote.
Vocab vocab(const std::string& name) {
    Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(model_file(name));
    EXPECT_TRUE(f.has_value()) << f.message();
    if (!f) return Vocab();
    Expected<Vocab> v = Vocab::from_gguf(**f);
    EXPECT_TRUE(v.has_value()) << v.message();
    return v ? std::move(*v) : Vocab();
}

// Rewrites output.weight (F16) so that greedy decoding always picks one of two tokens: their
// rows are +1 and -1 (so one of the two logits is positive), all others 0.
void force_tokens(const std::string& path, int32_t a, int32_t b) {
    Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(path);
    ASSERT_TRUE(f.has_value()) << f.message();
    const GgufTensorInfo* t = (*f)->find_tensor("output.weight");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->type, Type::F16);
    const int64_t n_embd = t->ne[0], n_rows = t->ne[1];
    const size_t at = (*f)->data_offset() + t->offset;
    f->reset();
    std::vector<uint16_t> data(static_cast<size_t>(n_embd * n_rows), 0);
    for (int64_t i = 0; i < n_embd; i++) {
        data[static_cast<size_t>(a * n_embd + i)] = 0x3C00;  // +1.0
        data[static_cast<size_t>(b * n_embd + i)] = 0xBC00;  // -1.0
    }
    FILE* fp = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(fp, nullptr);
    ASSERT_EQ(std::fseek(fp, static_cast<long>(at), SEEK_SET), 0);
    ASSERT_EQ(std::fwrite(data.data(), 2, data.size(), fp), data.size());
    std::fclose(fp);
}

std::vector<std::string> lines_with(const std::string& out, const std::string& prefix) {
    std::vector<std::string> got;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind(prefix, 0) == 0) got.push_back(line.substr(prefix.size()));
    }
    return got;
}

std::string ids(const std::vector<int32_t>& v) {
    std::string s;
    for (int32_t id : v) {
        if (!s.empty()) s += ',';
        s += std::to_string(id);
    }
    return s;
}

TEST(ChatEndToEnd, Llama3) {
    const std::string model = model_file("llama3");
    const Vocab v = vocab("llama3");
    const std::string expected_text =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    const std::vector<int32_t> expected = v.encode(expected_text, false, true);
    // The special tokens of the published format, by id (Meta's model card).
    EXPECT_EQ(ids(expected),
              "128000,128006,9125,128007,271,3513,10015,13,128009,128006,882,128007,271,13347,"
              "1070,128009,128006,78191,128007,271");

    // Random weights: -n bounds the reply.
    const std::string run = kBin + " run --chat -m '" + model +
                            "' -p 'Hi there' --system 'Be brief.' -n 6 --temp 0 -t 2 "
                            "--verbose-prompt 2>&1";
    testing::ShellResult r = testing::run_shell(run);
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(lines_with(r.out, "prompt ids: "), std::vector<std::string>{ids(expected)}) << r.out;
    EXPECT_NE(r.out.find("generated 6 tokens"), std::string::npos) << r.out;

    // Only <|eot_id|> or <|end_of_text|> can win: generation stops at once, at either.
    force_tokens(model, v.find("<|eot_id|>"), v.find("<|end_of_text|>"));
    r = testing::run_shell(run);
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("generated 0 tokens in"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(end of turn)"), std::string::npos) << r.out;
    force_tokens(model, v.find("<|end_of_text|>"), v.find("<|eot_id|>"));
    r = testing::run_shell(run);
    EXPECT_NE(r.out.find("generated 0 tokens in"), std::string::npos) << r.out;

    // Multi-turn from a pipe: the second prompt carries the first exchange; /exit ends it.
    const std::string chat = "printf 'Hello\\nHow are you?\\n/exit\\nnot read\\n' | " + kBin +
                             " chat -m '" + model + "' --temp 0 -t 2 --verbose-prompt 2>&1";
    r = testing::run_shell(chat);
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<std::string> prompts = lines_with(r.out, "prompt ids: ");
    ASSERT_EQ(prompts.size(), 2u) << r.out;
    EXPECT_EQ(prompts[0], ids(v.encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>"
                                       "\n\nHello<|eot_id|><|start_header_id|>assistant"
                                       "<|end_header_id|>\n\n",
                                       false, true)));
    EXPECT_EQ(prompts[1],
              ids(v.encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello"
                           "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n",
                           false, true)));
    // The cache kept the whole first prompt (11 tokens): only the 14 new ones were decoded.
    EXPECT_EQ(lines_with(r.out, "ferry chat: prompt ").size(), 2u);
    EXPECT_NE(
        r.out.find("ferry chat: prompt 25 tokens (14 decoded), generated 0 tokens (end of turn)"),
        std::string::npos)
        << r.out;
}

TEST(ChatEndToEnd, Qwen3) {
    const std::string model = model_file("qwen3");
    const Vocab v = vocab("qwen3");
    const std::vector<int32_t> expected =
        v.encode("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", false, true);
    EXPECT_EQ(ids(expected), "151644,872,198,13048,1052,151645,198,151644,77091,198");
    const std::string run = kBin + " run --chat -m '" + model +
                            "' -p 'Hi there' -n 4 --temp 0 -t 2 --verbose-prompt 2>&1";
    testing::ShellResult r = testing::run_shell(run);
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(lines_with(r.out, "prompt ids: "), std::vector<std::string>{ids(expected)}) << r.out;
    EXPECT_NE(r.out.find("generated 4 tokens"), std::string::npos) << r.out;
    force_tokens(model, v.find("<|im_end|>"), v.find("<|endoftext|>"));
    r = testing::run_shell(run);
    EXPECT_NE(r.out.find("generated 0 tokens in"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(end of turn)"), std::string::npos) << r.out;
}

TEST(ChatEndToEnd, MissingOrUnknownTemplateFailsClearly) {
    const std::string tiny = std::string(FERRY_FIXTURES_DIR) + "/tiny-llama/tiny-llama-q8_0.gguf";
    Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(tiny);
    ASSERT_TRUE(f.has_value()) << f.message();
    GgufWriter w = gguf_writer_from(**f);
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
    const std::string odd = tmp_dir() + "/odd-template.gguf";
    ASSERT_TRUE(w.write(odd).is_ok());
    testing::ShellResult r =
        testing::run_shell(kBin + " run --chat -m '" + odd + "' -p hi -n 1 2>&1");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.out.find("tokenizer.chat_template: unknown chat template; known: llama3, chatml"),
              std::string::npos)
        << r.out;
    if ((*f)->find_kv("tokenizer.chat_template") == nullptr) {
        r = testing::run_shell("echo hi | " + kBin + " chat -m '" + tiny + "' 2>&1");
        EXPECT_NE(r.rc, 0);
        EXPECT_NE(r.out.find("has no tokenizer.chat_template"), std::string::npos) << r.out;
    }
}

}  // namespace
}  // namespace ferry
