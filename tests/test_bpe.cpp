// Byte-level BPE tokenizers (Llama 3, Qwen 3): vocab-only GGUF files built from the real
// tokenizer.json files by tokenizer_json_to_gguf_kv, checked against the reference ids of
// ../shared/fixtures/tokenizers/cases.json; round trips of random bytes; the Unicode classes;
// the converter's metadata and errors; `ferry tokenize` on a vocab-only file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/json.h"
#include "ferry/gguf.h"
#include "ferry/vocab.h"
#include "model/pretokenize.h"
#include "model/tokenizer-json.h"
#include "model/unicode.h"
#include "shell.h"

namespace ferry {
namespace {

const std::string kDir = std::string(FERRY_FIXTURES_DIR) + "/tokenizers";

// A temporary directory for this process, removed at exit.
const std::string& tmp_dir() {
    static const std::string dir = [] {
        char tmpl[] = "/tmp/ferry-test-bpe-XXXXXX";
        const char* d = mkdtemp(tmpl);
        EXPECT_NE(d, nullptr);
        std::string s = d != nullptr ? d : "/tmp";
        std::atexit([] { std::system(("rm -rf " + tmp_dir()).c_str()); });
        return s;
    }();
    return dir;
}

// The fixture's tokenizer.json (gzipped in the fixture), unpacked once.
std::string tokenizer_json(const std::string& name) {
    const std::string out = tmp_dir() + "/" + name + "-tokenizer.json";
    if (access(out.c_str(), R_OK) != 0) {
        const std::string cmd =
            "gzip -dc '" + kDir + "/" + name + "/tokenizer.json.gz' > '" + out + "'";
        EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return out;
}

// A vocab-only GGUF (metadata, no tensors) made from the fixture. ctest runs every test in a
// process of its own and parsing tokenizer.json takes seconds, so the file is kept next to the
// build (build/<preset>/test-cache), named after this test binary's modification time: a
// rebuilt converter makes it anew.
std::string vocab_gguf(const std::string& name) {
    static std::map<std::string, std::string> made;
    auto it = made.find(name);
    if (it != made.end()) return it->second;
    struct stat exe {};
    EXPECT_EQ(stat("/proc/self/exe", &exe), 0);
    const std::string bin = FERRY_BIN;
    const std::string cache_dir = bin.substr(0, bin.rfind('/')) + "/../test-cache";
    std::system(("mkdir -p '" + cache_dir + "'").c_str());
    const std::string cached = cache_dir + "/" + name + "-vocab-" +
                               std::to_string(static_cast<long long>(exe.st_mtime)) + ".gguf";
    if (access(cached.c_str(), R_OK) == 0) return made[name] = cached;
    Expected<std::vector<GgufKV>> kv = tokenizer_json_to_gguf_kv(
        tokenizer_json(name), kDir + "/" + name + "/tokenizer_config.json");
    EXPECT_TRUE(kv.has_value()) << kv.message();
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    if (kv) {
        for (GgufKV& e : *kv) w.add_kv(e.key, std::move(e.value));
    }
    const std::string path = tmp_dir() + "/" + name + "-vocab.gguf";
    Status st = w.write(path);
    EXPECT_TRUE(st.is_ok()) << st.message();
    // Published whole (rename is atomic), so parallel tests never read a partial file.
    std::system(("rm -f '" + cache_dir + "/" + name + "'-vocab-*.gguf; cp '" + path + "' '" +
                 cached + ".tmp." + std::to_string(getpid()) + "' && mv '" + cached + ".tmp." +
                 std::to_string(getpid()) + "' '" + cached + "'")
                    .c_str());
    made[name] = path;
    return path;
}

struct Loaded {
    std::unique_ptr<GgufFile> file;
    Vocab vocab;
};

const Loaded& load(const std::string& name) {
    static std::map<std::string, Loaded> cache;
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    Loaded l;
    Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(vocab_gguf(name));
    EXPECT_TRUE(f.has_value()) << f.message();
    if (f) {
        l.file = std::move(*f);
        Expected<Vocab> v = Vocab::from_gguf(*l.file);
        EXPECT_TRUE(v.has_value()) << v.message();
        if (v) l.vocab = std::move(*v);
    }
    return cache.emplace(name, std::move(l)).first->second;
}

struct Case {
    std::string text;
    std::vector<int32_t> ids;
};

std::vector<Case> cases(const std::string& name) {
    Expected<json::Value> doc = json::parse_file(kDir + "/cases.json");
    EXPECT_TRUE(doc.has_value()) << doc.message();
    std::vector<Case> out;
    if (!doc) return out;
    for (const json::Value& c : (*doc)["cases"][name].as_array()) {
        Case k;
        k.text = c["text"].as_string();
        for (const json::Value& v : c["ids"].as_array())
            k.ids.push_back(static_cast<int32_t>(v.as_int()));
        out.push_back(std::move(k));
    }
    return out;
}

std::string ids_str(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
        if (!s.empty()) s += ',';
        s += std::to_string(id);
    }
    return s;
}

void check_cases(const std::string& name) {
    const Vocab& v = load(name).vocab;
    ASSERT_GT(v.n_tokens(), 0);
    const std::vector<Case> cs = cases(name);
    ASSERT_EQ(cs.size(), 30u);
    int matched = 0;
    for (const Case& c : cs) {
        const std::vector<int32_t> got = v.encode(c.text, false, true);
        EXPECT_EQ(ids_str(got), ids_str(c.ids)) << "text: " << json::dump(json::Value(c.text));
        matched += got == c.ids;
        // Decoding gives the text back (special tokens included, as their text is parsed).
        std::string back;
        for (int32_t id : got) {
            back +=
                v.token_type(id) == TokenType::Control ? v.token_text(id) : v.token_to_piece(id);
        }
        EXPECT_EQ(back, c.text);
    }
    EXPECT_EQ(matched, 30);
}

TEST(Bpe, Llama3MatchesReferenceCases) {
    check_cases("llama3");
}
TEST(Bpe, Qwen3MatchesReferenceCases) {
    check_cases("qwen3");
}

// Random byte strings: ASCII-heavy text, any bytes (invalid UTF-8 included), and characters
// from all over Unicode, in every mixture.
std::string random_bytes(std::mt19937_64& rng) {
    static const char* const kPieces[] = {" ",        "  ",           "\n",   "\r\n", "\t", "'s",
                                          "'LL",      "123456",       "é",    "中文", "Ж",  "٣",
                                          "\xC2\xA0", "\xE2\x80\x8B", "🦙", "a",    "Z",  "!?",
                                          "...",      "\xE3\x80\x80"};
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; i++) {
        switch (rng() % 4) {
            case 0:
                s += static_cast<char>(rng() % 256);
                break;
            case 1:
                s += static_cast<char>(0x20 + rng() % 95);
                break;
            case 2:
                s += kPieces[rng() % (sizeof(kPieces) / sizeof(kPieces[0]))];
                break;
            default: {
                uint32_t cp = static_cast<uint32_t>(rng() % 0x110000);
                if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x41;
                unicode::append_utf8(cp, s);
            }
        }
    }
    return s;
}

void check_round_trips(const std::string& name) {
    const Vocab& v = load(name).vocab;
    ASSERT_GT(v.n_tokens(), 0);
    std::mt19937_64 rng(42);
    int n_checked = 0;
    for (int i = 0; i < 3000; i++) {
        const std::string s = random_bytes(rng);
        const std::vector<int32_t> ids = v.encode(s, false, false);
        for (int32_t id : ids) ASSERT_TRUE(v.valid(id));
        ASSERT_EQ(v.decode(ids), s) << "ids " << ids_str(ids);
        n_checked++;
    }
    EXPECT_EQ(n_checked, 3000);
}

TEST(Bpe, Llama3RandomBytesRoundTrip) {
    check_round_trips("llama3");
}
TEST(Bpe, Qwen3RandomBytesRoundTrip) {
    check_round_trips("qwen3");
}

TEST(Bpe, EveryByteAloneRoundTrips) {
    for (const char* name : {"llama3", "qwen3"}) {
        const Vocab& v = load(name).vocab;
        for (int b = 0; b < 256; b++) {
            const std::string s(1, static_cast<char>(b));
            const std::vector<int32_t> ids = v.encode(s, false, false);
            ASSERT_EQ(ids.size(), 1u) << name << " byte " << b;
            EXPECT_EQ(v.decode(ids), s);
        }
    }
}

TEST(Bpe, MetadataFromTokenizerJson) {
    const Loaded& l3 = load("llama3");
    const Vocab& v3 = l3.vocab;
    EXPECT_EQ(v3.model(), Vocab::Model::Bpe);
    EXPECT_EQ(v3.n_tokens(), 128256);
    EXPECT_EQ(*l3.file->get_string("tokenizer.ggml.pre"), "llama-bpe");
    EXPECT_EQ(v3.bos(), 128000);
    EXPECT_EQ(v3.eos(), 128001);
    EXPECT_TRUE(v3.add_bos());
    EXPECT_EQ(v3.token_type(128000), TokenType::Control);
    EXPECT_EQ(v3.token_type(791), TokenType::Normal);
    EXPECT_EQ(v3.encode("Hello", true).front(), 128000);
    EXPECT_TRUE(l3.file->find_kv("tokenizer.chat_template") != nullptr);
    EXPECT_TRUE(l3.file->tensors().empty());
    // End of generation: <|end_of_text|>, <|eot_id|>; not BOS or a reserved token.
    EXPECT_TRUE(v3.is_eog(128001));
    EXPECT_TRUE(v3.is_eog(v3.find("<|eot_id|>")));
    EXPECT_EQ(v3.find("<|eom_id|>"), -1);  // Llama 3.0's vocabulary has none (3.1 adds it)
    EXPECT_FALSE(v3.is_eog(128000));
    EXPECT_FALSE(v3.is_eog(v3.find("<|reserved_special_token_0|>")));

    const Loaded& lq = load("qwen3");
    const Vocab& vq = lq.vocab;
    EXPECT_EQ(*lq.file->get_string("tokenizer.ggml.pre"), "qwen2");
    EXPECT_EQ(vq.n_tokens(), 151669);
    EXPECT_EQ(vq.bos(), -1);
    EXPECT_FALSE(vq.add_bos());
    EXPECT_EQ(vq.eos(), vq.find("<|im_end|>"));
    EXPECT_EQ(vq.pad(), vq.find("<|endoftext|>"));
    EXPECT_TRUE(vq.is_eog(vq.find("<|im_end|>")));
    EXPECT_TRUE(vq.is_eog(vq.find("<|endoftext|>")));
    EXPECT_FALSE(vq.is_eog(vq.find("<|im_start|>")));
    // Qwen's non-special added tokens are user-defined: split out of text even without
    // parse_special, and decoded as their text.
    const int32_t think = vq.find("<think>");
    ASSERT_GE(think, 0);
    EXPECT_EQ(vq.token_type(think), TokenType::UserDefined);
    EXPECT_EQ(vq.encode("<think>", false, false), std::vector<int32_t>{think});
    EXPECT_EQ(vq.token_to_piece(think), "<think>");
    // Control tokens are plain text unless parse_special.
    EXPECT_GT(vq.encode("<|im_end|>", false, false).size(), 1u);
    EXPECT_EQ(vq.encode("<|im_end|>", false, true), std::vector<int32_t>{vq.eos()});
}

TEST(Bpe, VocabSizePadding) {
    TokenizerJsonOptions o;
    o.vocab_size = 151936;  // Qwen's config.json vocab_size
    Expected<std::vector<GgufKV>> kv = tokenizer_json_to_gguf_kv(tokenizer_json("qwen3"), "", o);
    ASSERT_TRUE(kv.has_value()) << kv.message();
    const GgufKV* tokens = nullptr;
    const GgufKV* types = nullptr;
    for (const GgufKV& e : *kv) {
        if (e.key == "tokenizer.ggml.tokens") tokens = &e;
        if (e.key == "tokenizer.ggml.token_type") types = &e;
    }
    ASSERT_TRUE(tokens && types);
    ASSERT_EQ(tokens->value.arr.size(), 151936u);
    EXPECT_EQ(tokens->value.arr[151935].s, "[PAD151935]");
    EXPECT_EQ(types->value.arr[151935].i, 5);
    o.vocab_size = 1000;
    Expected<std::vector<GgufKV>> small = tokenizer_json_to_gguf_kv(tokenizer_json("qwen3"), "", o);
    ASSERT_FALSE(small.has_value());
    EXPECT_NE(small.message().find("vocab_size 1000"), std::string::npos) << small.message();
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

TEST(Bpe, ConverterErrorsNameTheField) {
    const std::string p = tmp_dir() + "/bad-tokenizer.json";
    write_file(p, R"({"model": {"type": "Unigram", "vocab": []}})");
    Expected<std::vector<GgufKV>> a = tokenizer_json_to_gguf_kv(p, "");
    ASSERT_FALSE(a.has_value());
    EXPECT_NE(a.message().find("model.type is \"Unigram\""), std::string::npos) << a.message();

    write_file(p, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": "\\s+"}}, {"type": "ByteLevel"}]}})");
    Expected<std::vector<GgufKV>> b = tokenizer_json_to_gguf_kv(p, "");
    ASSERT_FALSE(b.has_value());
    EXPECT_NE(b.message().find("unknown Split regex"), std::string::npos) << b.message();

    Expected<std::vector<GgufKV>> c = tokenizer_json_to_gguf_kv(tmp_dir() + "/missing.json", "");
    ASSERT_FALSE(c.has_value());
    EXPECT_NE(c.message().find("missing.json"), std::string::npos) << c.message();
}

TEST(Bpe, LoaderRejectsBadMetadata) {
    auto try_with = [](const std::function<void(GgufWriter&)>& edit) {
        Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(vocab_gguf("qwen3"));
        EXPECT_TRUE(f.has_value());
        GgufWriter w = gguf_writer_from(**f);
        edit(w);
        std::vector<uint8_t> bytes = w.to_bytes();
        Expected<std::unique_ptr<GgufFile>> g =
            GgufFile::from_memory(bytes.data(), bytes.size(), "edited.gguf");
        EXPECT_TRUE(g.has_value());
        Expected<Vocab> v = Vocab::from_gguf(**g);
        EXPECT_FALSE(v.has_value());
        return v.has_value() ? std::string() : v.message();
    };
    EXPECT_NE(try_with([](GgufWriter& w) {
                  w.add_string("tokenizer.ggml.pre", "gpt-4o");
              }).find("tokenizer.ggml.pre is \"gpt-4o\""),
              std::string::npos);
    EXPECT_NE(try_with([](GgufWriter& w) {
                  w.add_string_array("tokenizer.ggml.merges", {"a b", "nospace"});
              }).find("tokenizer.ggml.merges[1]"),
              std::string::npos);
    EXPECT_NE(try_with([](GgufWriter& w) {
                  w.add_string("tokenizer.ggml.model", "bert");
              }).find("\"bert\""),
              std::string::npos);
}

TEST(Bpe, UnicodeClasses) {
    using namespace unicode;
    EXPECT_TRUE(is_letter('a'));
    EXPECT_TRUE(is_letter(0xE9));     // é
    EXPECT_TRUE(is_letter(0x416));    // Ж
    EXPECT_TRUE(is_letter(0x4E2D));   // 中
    EXPECT_TRUE(is_letter(0x20000));  // CJK Extension B
    EXPECT_TRUE(is_letter(0x2B0));    // ʰ (Lm)
    EXPECT_TRUE(is_number(0x663));    // ٣ Arabic-Indic digit (Nd)
    EXPECT_TRUE(is_number(0xBD));     // ½ (No)
    EXPECT_TRUE(is_number(0x216B));   // Ⅻ (Nl)
    EXPECT_TRUE(is_number(0x1D7CE));  // mathematical bold digit zero
    EXPECT_TRUE(is_whitespace(0xA0));
    EXPECT_TRUE(is_whitespace(0x3000));
    EXPECT_TRUE(is_whitespace(0x2029));
    EXPECT_TRUE(is_whitespace(0x85));
    EXPECT_FALSE(is_whitespace(0x200B));  // zero-width space is a format character
    EXPECT_EQ(flags(0x1F999), 0);         // 🦙
    EXPECT_EQ(flags(0x300), 0);           // combining grave accent (Mn)
    EXPECT_EQ(flags(0x10FFFF), 0);
    EXPECT_EQ(flags(kInvalid), 0);
    // The tables are sorted and disjoint.
    for (size_t i = 0; i < kNumRanges; i++) {
        EXPECT_LE(kRanges[i].first, kRanges[i].last);
        if (i > 0) {
            EXPECT_GT(kRanges[i].first, kRanges[i - 1].last);
        }
    }
    // The GPT-2 byte map is a bijection onto printable characters.
    for (int b = 0; b < 256; b++) {
        const uint32_t cp = byte_to_codepoint(static_cast<uint8_t>(b));
        EXPECT_EQ(codepoint_to_byte(cp), b);
        EXPECT_FALSE(is_whitespace(cp));
    }
    EXPECT_EQ(byte_to_codepoint(' '), 0x120u);   // Ġ
    EXPECT_EQ(byte_to_codepoint('\n'), 0x10Au);  // Ċ
}

std::vector<std::string> split(PreTokenizer k, const std::string& s) {
    std::vector<std::string_view> v;
    pretokenize(k, s, v);
    return {v.begin(), v.end()};
}

TEST(Bpe, PreTokenizerPieces) {
    using V = std::vector<std::string>;
    EXPECT_EQ(split(PreTokenizer::Llama3, "I'M here's 12345"),
              (V{"I", "'M", " here", "'s", " ", "123", "45"}));
    EXPECT_EQ(split(PreTokenizer::Qwen2, "12345"), (V{"1", "2", "3", "4", "5"}));
    // Whitespace runs: newlines end a piece, the last space before a word joins the word.
    EXPECT_EQ(split(PreTokenizer::Llama3, "a  \n\n  b   "), (V{"a", "  \n\n", " ", " b", "   "}));
    EXPECT_EQ(split(PreTokenizer::Llama3, " ?!\n\nx"), (V{" ?!\n\n", "x"}));
    EXPECT_EQ(split(PreTokenizer::Llama3, "\xC2\xA0Привет"), (V{"\xC2\xA0Привет"}));
    // An invalid byte is a symbol of its own class.
    EXPECT_EQ(split(PreTokenizer::Llama3, "a\xFF\xFE b"), (V{"a", "\xFF\xFE", " b"}));
    EXPECT_TRUE(split(PreTokenizer::Llama3, "").empty());
}

TEST(Bpe, TokenizeCommandOnVocabOnlyFile) {
    const std::string file = vocab_gguf("llama3");
    const testing::ShellResult r = testing::run_shell(std::string(FERRY_BIN) + " tokenize -m '" +
                                                      file + "' -p 'Hello, world!' --special");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.out, "128000,9906,11,1917,0\n");
    const testing::ShellResult q =
        testing::run_shell(std::string(FERRY_BIN) + " tokenize -m '" + vocab_gguf("qwen3") +
                           "' -p '<|im_start|>user' --special");
    EXPECT_EQ(q.rc, 0) << q.out;
    EXPECT_EQ(q.out, "151644,872\n");
}

}  // namespace
}  // namespace ferry
