// ferry tokenize: prints the token ids a model's vocabulary gives a text.
#include <cstdio>
#include <string>

#include "cli.h"
#include "ferry/gguf.h"
#include "ferry/vocab.h"

namespace ferry::cli {
namespace {

// A token's vocabulary text with control characters escaped, for one-line display.
std::string printable(const std::string& s) {
    std::string out;
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (u < 0x20 || u == 0x7F) {
            out += strfmt("\\x%02X", u);
        } else {
            out += c;
        }
    }
    return out;
}

int cmd_tokenize(int argc, char** argv) {
    Args args("tokenize",
              "usage: ferry tokenize -m MODEL -p TEXT [options]\n"
              "  Prints the token ids of TEXT, comma-separated on one line.\n",
              {
                  {{"-m", "--model"}, "PATH", "GGUF model whose vocabulary to use"},
                  {{"-p", "--prompt"}, "TEXT", "the text to tokenize"},
                  {{"--no-bos"}, nullptr, "do not prepend the BOS token"},
                  {{"--special"}, nullptr, "parse control tokens written in the text (\"<s>\")"},
                  {{"--pieces"}, nullptr, "also print one \"id<TAB>token\" line per token"},
              },
              argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    const std::optional<std::string> model = args.value({"-m", "--model"});
    const std::optional<std::string> prompt = args.value({"-p", "--prompt"});
    const bool no_bos = args.flag({"--no-bos"});
    const bool special = args.flag({"--special"});
    const bool pieces = args.flag({"--pieces"});
    if (Status st = args.finish(); !st) return fail("tokenize", st.message());
    if (!model) return fail("tokenize", "missing -m MODEL (a GGUF file)");
    if (!prompt) return fail("tokenize", "missing -p TEXT");

    Expected<std::unique_ptr<GgufFile>> file = GgufFile::open(*model);
    if (!file) return fail("tokenize", file.message());
    Expected<Vocab> vocab = Vocab::from_gguf(**file);
    if (!vocab) return fail("tokenize", vocab.message());

    const std::vector<int32_t> ids = vocab->encode(*prompt, !no_bos, special);
    std::string line;
    for (size_t i = 0; i < ids.size(); i++) {
        if (i > 0) line += ',';
        line += std::to_string(ids[i]);
    }
    std::printf("%s\n", line.c_str());
    if (pieces) {
        for (int32_t id : ids)
            std::printf("%d\t%s\n", id, printable(vocab->token_text(id)).c_str());
    }
    return 0;
}

}  // namespace
FERRY_COMMAND(tokenize, "tokenize", "print the token ids of a text", cmd_tokenize);
}  // namespace ferry::cli
