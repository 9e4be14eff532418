// Tokenizer tests: the fixture vocabulary against llama.cpp's ids, round trips, special ids,
// metadata errors, small hand-made vocabularies, and the `ferry tokenize` command.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "json.h"
#include "ferry/gguf.h"
#include "ferry/vocab.h"
#include "shell.h"

namespace ferry {
namespace {

const std::string kFixtureDir = std::string(FERRY_FIXTURES_DIR) + "/tiny-llama";
const std::string kModel = kFixtureDir + "/tiny-llama-q8_0.gguf";

struct Case {
    std::string text;
    std::vector<int32_t> ids;            // SentencePiece (NFKC, whitespace folding)
    std::vector<int32_t> ids_llama_cpp;  // llama.cpp on the GGUF vocabulary
    std::vector<std::string> pieces;     // SentencePiece pieces of `ids`
    std::string decoded;                 // SentencePiece decode of `ids`
};

std::vector<int32_t> to_ids(const json::Value& a) {
    std::vector<int32_t> out;
    for (const json::Value& v : a.as_array()) out.push_back(static_cast<int32_t>(v.as_int()));
    return out;
}

std::vector<Case> load_cases() {
    Expected<json::Value> doc = json::parse_file(kFixtureDir + "/tokenizer-cases.json");
    EXPECT_TRUE(doc.has_value()) << doc.message();
    std::vector<Case> out;
    if (!doc) return out;
    for (const json::Value& c : (*doc)["cases"].as_array()) {
        Case k;
        k.text = c["text"].as_string();
        k.ids = to_ids(c["ids"]);
        k.ids_llama_cpp = to_ids(c["ids_llama_cpp"]);
        for (const json::Value& p : c["pieces"].as_array()) k.pieces.push_back(p.as_string());
        k.decoded = c["decoded"].as_string();
        out.push_back(std::move(k));
    }
    return out;
}

// The fixture vocabulary, loaded once.
const Vocab& fixture_vocab() {
    static const Vocab* v = [] {
        Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(kModel);
        EXPECT_TRUE(f.has_value()) << f.message();
        if (!f) return static_cast<Vocab*>(nullptr);
        Expected<Vocab> vocab = Vocab::from_gguf(**f);
        EXPECT_TRUE(vocab.has_value()) << vocab.message();
        if (!vocab) return static_cast<Vocab*>(nullptr);
        return new Vocab(std::move(vocab).value());
    }();
    if (v == nullptr) throw std::runtime_error("cannot load the fixture vocabulary");
    return *v;
}

std::string join(const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); i++) {
        if (i > 0) s += ',';
        s += std::to_string(ids[i]);
    }
    return s;
}

// Whitespace that SentencePiece's normalizer folds away (leading, doubled, tabs, newlines) but
// GGUF runners keep: only texts with such whitespace may tokenize differently there.
bool has_foldable_whitespace(const std::string& t) {
    return (!t.empty() && t[0] == ' ') || t.find("  ") != std::string::npos ||
           t.find('\t') != std::string::npos || t.find('\n') != std::string::npos;
}

TEST(Vocab, FixtureMetadata) {
    const Vocab& v = fixture_vocab();
    EXPECT_EQ(v.n_tokens(), 1024);
    EXPECT_EQ(v.bos(), 1);
    EXPECT_EQ(v.eos(), 2);
    EXPECT_EQ(v.unk(), 0);
    EXPECT_EQ(v.pad(), -1);
    EXPECT_TRUE(v.add_bos());
    EXPECT_TRUE(v.add_space_prefix());
    EXPECT_EQ(v.token_text(1), "<s>");
    EXPECT_EQ(v.token_type(1), TokenType::Control);
    EXPECT_EQ(v.token_type(0), TokenType::Unknown);
    EXPECT_EQ(v.token_type(13), TokenType::Byte);
    EXPECT_EQ(v.token_text(13), "<0x0A>");
    EXPECT_EQ(v.find("\xE2\x96\x81"), 606);
    EXPECT_EQ(v.find("no such token"), -1);
    EXPECT_TRUE(v.is_eog(2));
    EXPECT_FALSE(v.is_eog(1));
    EXPECT_FALSE(v.is_eog(-1));
}

TEST(Vocab, AllCasesMatchLlamaCpp) {
    const Vocab& v = fixture_vocab();
    const std::vector<Case> cases = load_cases();
    ASSERT_EQ(cases.size(), 17u);
    for (const Case& c : cases) {
        EXPECT_EQ(join(v.encode(c.text, false)), join(c.ids_llama_cpp)) << "text: " << c.text;
    }
}

TEST(Vocab, SentencePieceDiffersOnlyWhereItFoldsWhitespace) {
    // SentencePiece's own ids differ from a GGUF runner's for exactly these fixture texts:
    // " leading space", "two  spaces and\ttab\nnewline", "def f(x):\n    return x ** 2  # square",
    // " ", "\n\n" and "tab\tseparated\tvalues". Everywhere else (including NFKC-stable accents,
    // CJK and emoji) the two tokenizers agree, piece by piece.
    const Vocab& v = fixture_vocab();
    int differing = 0;
    for (const Case& c : load_cases()) {
        if (c.ids != c.ids_llama_cpp) {
            differing++;
            EXPECT_TRUE(has_foldable_whitespace(c.text)) << "text: " << c.text;
            continue;
        }
        ASSERT_EQ(c.pieces.size(), c.ids.size());
        for (size_t i = 0; i < c.ids.size(); i++) {
            EXPECT_EQ(v.token_text(c.ids[i]), c.pieces[i]) << "text: " << c.text << " #" << i;
        }
        EXPECT_EQ(v.decode(c.ids), c.decoded);
    }
    EXPECT_EQ(differing, 6);
}

TEST(Vocab, RoundTripsFixtureTexts) {
    const Vocab& v = fixture_vocab();
    for (const Case& c : load_cases()) {
        EXPECT_EQ(v.decode(v.encode(c.text, false)), c.text);
        EXPECT_EQ(v.decode(v.encode(c.text, true)), c.text);
    }
}

TEST(Vocab, RoundTripsRandomText) {
    // Spaces, controls, multi-byte characters and stray bytes that are not UTF-8 at all: byte
    // fallback must carry every byte through.
    const Vocab& v = fixture_vocab();
    const std::vector<std::string> atoms = {
        " ", "  ", "\n", "\t", "a",   "e",    "the",  "ing",      "Hello", "1",  "2.5", "é",
        "ß", "日", "本", "🚀",  "<s>", "\x80", "\xFF", "\xE6\x97", "\x01",  "\"", "#",
    };
    std::mt19937 rng(1234);
    for (int iter = 0; iter < 300; iter++) {
        std::string text;
        const int n = static_cast<int>(rng() % 40);
        for (int i = 0; i < n; i++) text += atoms[rng() % atoms.size()];
        const std::vector<int32_t> ids = v.encode(text, iter % 2 == 0);
        for (int32_t id : ids) ASSERT_TRUE(v.valid(id));
        EXPECT_EQ(v.decode(ids), text) << "ids: " << join(ids);
    }
}

TEST(Vocab, LiteralSpaceMarkDecodesAsSpace) {
    // The one text that cannot round-trip: U+2581 in the input is the encoder's own space
    // mark, so it comes back as a space (llama.cpp and SentencePiece do the same).
    const Vocab& v = fixture_vocab();
    const std::string text = std::string("a") + "\xE2\x96\x81" + "b";
    EXPECT_EQ(v.encode(text, false), v.encode("a b", false));
    EXPECT_EQ(v.decode(v.encode(text, false)), "a b");
}

TEST(Vocab, LongTextRoundTrips) {
    const Vocab& v = fixture_vocab();
    std::string text;
    for (int i = 0; i < 3000; i++) text += "Permission is hereby granted, free of charge. 日本 ";
    const std::vector<int32_t> ids = v.encode(text, false);
    EXPECT_LT(ids.size(), text.size());
    EXPECT_EQ(v.decode(ids), text);
}

TEST(Vocab, BosHandling) {
    const Vocab& v = fixture_vocab();
    const std::vector<int32_t> plain = v.encode("Hello world", false);
    const std::vector<int32_t> with_bos = v.encode("Hello world", true);
    ASSERT_EQ(with_bos.size(), plain.size() + 1);
    EXPECT_EQ(with_bos[0], 1);
    EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), plain);
    EXPECT_EQ(v.encode("", true), std::vector<int32_t>{1});
    EXPECT_TRUE(v.encode("", false).empty());
    // BOS and EOS decode to nothing.
    EXPECT_EQ(v.decode({1, 606, 660, 2}), "H");
}

TEST(Vocab, SpecialTokensOnlyWhenAsked) {
    const Vocab& v = fixture_vocab();
    // As plain text "<s>" is three characters (the fixture's ids_llama_cpp agrees).
    const std::vector<int32_t> plain = v.encode("<s>a", false);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
    // Parsed, it is BOS, and the text after it gets the prefix space again.
    const std::vector<int32_t> parsed = v.encode("<s>a", false, true);
    ASSERT_GE(parsed.size(), 2u);
    EXPECT_EQ(parsed[0], 1);
    EXPECT_EQ(std::vector<int32_t>(parsed.begin() + 1, parsed.end()), v.encode("a", false));
    EXPECT_EQ(v.encode("x</s>", false, true).back(), 2);
}

TEST(Vocab, TokenToPiece) {
    const Vocab& v = fixture_vocab();
    EXPECT_EQ(v.token_to_piece(606), " ");
    EXPECT_EQ(v.token_to_piece(13), "\n");
    EXPECT_EQ(v.token_to_piece(12), "\t");
    EXPECT_EQ(v.token_to_piece(198), "\xC3");  // <0xC3>: half of a character
    EXPECT_EQ(v.token_to_piece(1), "");
    EXPECT_EQ(v.token_to_piece(2), "");
    EXPECT_EQ(v.token_to_piece(0), "\xE2\x96\x85");
    EXPECT_EQ(v.token_to_piece(-5), "");
    EXPECT_EQ(v.token_to_piece(1024), "");
    // Streaming: concatenated pieces give the text (plus the prefix space).
    std::string streamed;
    for (int32_t id : v.encode("naïve 🚀", true)) streamed += v.token_to_piece(id);
    EXPECT_EQ(streamed, " naïve 🚀");
    EXPECT_EQ(v.decode(v.encode("x", false), false), " x");
}

// ---------------------------------------------------------------------------------------------
// Hand-made vocabularies.

struct MiniVocab {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    void add(const std::string& t, float score, TokenType type = TokenType::Normal) {
        tokens.push_back(t);
        scores.push_back(score);
        types.push_back(static_cast<int32_t>(type));
    }
    GgufWriter writer(const std::string& model = "llama") const {
        GgufWriter w;
        w.add_string("general.architecture", "llama");
        w.add_string("tokenizer.ggml.model", model);
        w.add_string_array("tokenizer.ggml.tokens", tokens);
        w.add_f32_array("tokenizer.ggml.scores", scores);
        w.add_i32_array("tokenizer.ggml.token_type", types);
        return w;
    }
};

MiniVocab base_mini() {
    MiniVocab m;
    m.add("<unk>", 0, TokenType::Unknown);  // 0
    m.add("<s>", 0, TokenType::Control);    // 1
    m.add("</s>", 0, TokenType::Control);   // 2
    m.add("a", -1);                         // 3
    m.add("b", -1);                         // 4
    m.add("c", -1);                         // 5
    m.add("\xE2\x96\x81", -1);              // 6 "▁"
    return m;
}

Expected<Vocab> load(const GgufWriter& w) {
    const std::vector<uint8_t> bytes = w.to_bytes();
    Expected<std::unique_ptr<GgufFile>> f =
        GgufFile::from_memory(bytes.data(), bytes.size(), "mini");
    if (!f) return f.status();
    return Vocab::from_gguf(**f);
}

TEST(Vocab, MergesHighestScoreFirstThenLeftmost) {
    {
        MiniVocab m = base_mini();
        m.add("ab", -5);  // 7
        m.add("bc", -5);  // 8: same score: the leftmost pair (ab) wins
        GgufWriter w = m.writer();
        w.add_bool("tokenizer.ggml.add_space_prefix", false);
        Expected<Vocab> v = load(w);
        ASSERT_TRUE(v.has_value()) << v.message();
        EXPECT_FALSE(v->add_space_prefix());
        EXPECT_EQ(v->encode("abc", false), (std::vector<int32_t>{7, 5}));
        EXPECT_EQ(v->decode({7, 5}), "abc");  // no prefix space to strip
    }
    {
        MiniVocab m = base_mini();
        m.add("ab", -5);  // 7
        m.add("bc", -2);  // 8: higher score wins though it is further right
        m.add("bcb", 3);  // 9: can only form from "bc" + "b", never from "b" + "cb"
        GgufWriter w = m.writer();
        w.add_bool("tokenizer.ggml.add_space_prefix", false);
        Expected<Vocab> v = load(w);
        ASSERT_TRUE(v.has_value()) << v.message();
        EXPECT_EQ(v->encode("abc", false), (std::vector<int32_t>{3, 8}));
        EXPECT_EQ(v->encode("abcabc", false), (std::vector<int32_t>{3, 8, 3, 8}));
        EXPECT_EQ(v->encode("abcb", false), (std::vector<int32_t>{3, 9}));
    }
}

TEST(Vocab, UnknownWithoutByteTokensAndDefaults) {
    MiniVocab m = base_mini();
    Expected<Vocab> v = load(m.writer());
    ASSERT_TRUE(v.has_value()) << v.message();
    // Defaults: llama's bos 1 / eos 2 / unk 0, BOS added, space prefix on.
    EXPECT_EQ(v->bos(), 1);
    EXPECT_EQ(v->eos(), 2);
    EXPECT_EQ(v->unk(), 0);
    EXPECT_TRUE(v->add_bos());
    // 'z' is not in the vocabulary and there are no byte tokens: one <unk> per byte.
    EXPECT_EQ(v->encode("az", false), (std::vector<int32_t>{6, 3, 0}));
    EXPECT_EQ(v->encode("é", false), (std::vector<int32_t>{6, 0, 0}));
}

TEST(Vocab, UserDefinedTokensAreAlwaysSplitOut) {
    MiniVocab m = base_mini();
    m.add("<tool>", 0, TokenType::UserDefined);  // 7
    m.add("<t", 10);                             // 8: must not break up <tool>
    GgufWriter w = m.writer();
    w.add_bool("tokenizer.ggml.add_bos_token", false);
    Expected<Vocab> v = load(w);
    ASSERT_TRUE(v.has_value()) << v.message();
    EXPECT_FALSE(v->add_bos());
    EXPECT_EQ(v->encode("a<tool>b", true), (std::vector<int32_t>{6, 3, 7, 6, 4}));
    EXPECT_EQ(v->token_to_piece(7), "<tool>");
}

TEST(Vocab, ErrorsNameTheKey) {
    {
        GgufWriter w;
        w.add_string("general.architecture", "llama");
        Expected<Vocab> v = load(w);
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("tokenizer.ggml.model"), std::string::npos) << v.message();
    }
    {
        Expected<Vocab> v = load(base_mini().writer("gpt2"));
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("tokenizer.ggml.model"), std::string::npos) << v.message();
        EXPECT_NE(v.message().find("gpt2"), std::string::npos) << v.message();
    }
    {
        GgufWriter w;
        w.add_string("tokenizer.ggml.model", "llama");
        Expected<Vocab> v = load(w);
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("tokenizer.ggml.tokens"), std::string::npos) << v.message();
    }
    {
        MiniVocab m = base_mini();
        m.scores.pop_back();
        Expected<Vocab> v = load(m.writer());
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("tokenizer.ggml.scores"), std::string::npos) << v.message();
    }
    {
        MiniVocab m = base_mini();
        m.types.push_back(1);
        Expected<Vocab> v = load(m.writer());
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("tokenizer.ggml.token_type"), std::string::npos) << v.message();
    }
    {
        MiniVocab m = base_mini();
        m.types[4] = 42;
        Expected<Vocab> v = load(m.writer());
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("tokenizer.ggml.token_type"), std::string::npos) << v.message();
    }
    {
        GgufWriter w = base_mini().writer();
        w.add_u32("tokenizer.ggml.eos_token_id", 7);  // 7 tokens: ids 0..6
        Expected<Vocab> v = load(w);
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("tokenizer.ggml.eos_token_id"), std::string::npos)
            << v.message();
    }
    {
        GgufWriter w = base_mini().writer();
        w.add_string("tokenizer.ggml.add_bos_token", "yes");
        Expected<Vocab> v = load(w);
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("tokenizer.ggml.add_bos_token"), std::string::npos)
            << v.message();
    }
    {
        MiniVocab m = base_mini();
        m.add("<0xZZ>", 0, TokenType::Byte);
        Expected<Vocab> v = load(m.writer());
        ASSERT_FALSE(v.has_value());
        EXPECT_NE(v.message().find("<0xZZ>"), std::string::npos) << v.message();
    }
}

// ---------------------------------------------------------------------------------------------
// `ferry tokenize`

struct RunResult {
    int status = -1;
    std::string output;  // stdout and stderr
};

RunResult run(const std::string& args) {
    const ferry::testing::ShellResult r =
        ferry::testing::run_shell(std::string("'") + FERRY_BIN + "' tokenize " + args + " 2>&1");
    return {r.rc, r.out};
}

TEST(TokenizeCli, PrintsIds) {
    RunResult r = run("-m '" + kModel + "' -p 'Hello world'");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "1,606,660,607,316,610,291,265,615,616\n");

    r = run("-m '" + kModel + "' -p 'Hello world' --no-bos --pieces");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output,
              "606,660,607,316,610,291,265,615,616\n"
              "606\t\xE2\x96\x81\n660\tH\n607\te\n316\tll\n610\to\n291\t\xE2\x96\x81w\n"
              "265\tor\n615\tl\n616\td\n");
}

TEST(TokenizeCli, BadInput) {
    RunResult r = run("-p 'Hello'");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("-m"), std::string::npos) << r.output;

    r = run("-m /nonexistent/model.gguf -p 'Hello'");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("/nonexistent/model.gguf"), std::string::npos) << r.output;

    // A file that is not GGUF.
    r = run("-m '" + kFixtureDir + "/tokenizer-cases.json' -p 'Hello'");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("tokenizer-cases.json"), std::string::npos) << r.output;

    // A GGUF file with no tokenizer.
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    const std::string no_vocab = ::testing::TempDir() + "/ferry-test-no-vocab.gguf";
    ASSERT_TRUE(w.write(no_vocab).is_ok());
    r = run("-m '" + no_vocab + "' -p 'Hello'");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("tokenizer.ggml.model"), std::string::npos) << r.output;
    std::remove(no_vocab.c_str());

    r = run("-m '" + kModel + "' -p 'Hello' --bogus");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("--bogus"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ferry
