// ferry logits: runs token ids through a model and writes the logits of every position.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.h"
#include "ferry/backend.h"
#include "ferry/llama.h"
#include "ferry/remote.h"

namespace ferry::cli {
namespace {

Expected<std::vector<int32_t>> parse_tokens(const std::string& s) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i <= s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        const std::string item = s.substr(i, j - i);
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX) {
            return Status::errorf("--tokens: '%s' (item %zu) is not a token id", item.c_str(),
                                  out.size());
        }
        out.push_back(static_cast<int32_t>(v));
        i = j + 1;
    }
    if (out.empty()) return Status::error("--tokens: no token ids");
    return out;
}

}  // namespace

namespace {

int cmd_logits(int argc, char** argv) {
    Args args("logits",
              "usage: ferry logits -m MODEL --tokens ID,ID,... -o FILE [options]\n"
              "  Writes float32 little-endian logits [n_tokens, n_vocab], one row per position.\n",
              with_placement({
                  {{"-m", "--model"}, "PATH", "GGUF model"},
                  {{"--tokens"}, "LIST", "comma-separated token ids"},
                  {{"-o", "--output", "--out"}, "FILE", "output file"},
                  {{"--kv-type"}, "TYPE", "KV cache type: f16 (default), f32 or bf16"},
                  {{"--mmap"}, nullptr, "CPU: compute from the memory-mapped file (no copy)"},
                  {{"-t", "--threads"}, "N", "CPU threads (default: all cores)"},
                  {{"-c", "--ctx"}, "N", "context size (default: the number of tokens)"},
              }),
              argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    const std::optional<std::string> model_path = args.value({"-m", "--model"});
    const std::optional<std::string> tokens_arg = args.value({"--tokens"});
    const std::optional<std::string> out_path = args.value({"-o", "--output", "--out"});
    const std::optional<std::string> kv = args.value({"--kv-type"});
    const bool use_mmap = args.flag({"--mmap"});
    const std::optional<long long> threads = args.integer({"-t", "--threads"});
    const std::optional<long long> ctx = args.integer({"-c", "--ctx"});
    const Placement placement = read_placement(args);
    if (Status st = args.finish(); !st) return fail("logits", st.message());
    if (!model_path) return fail("logits", "-m MODEL is required");
    if (!tokens_arg) return fail("logits", "--tokens LIST is required");
    if (!out_path) return fail("logits", "-o FILE is required");

    Expected<std::vector<int32_t>> tokens = parse_tokens(*tokens_arg);
    if (!tokens) return fail("logits", tokens.message());
    Expected<Type> kv_type = parse_kv_type(kv);
    if (!kv_type) return fail("logits", kv_type.message());

    ModelOptions mo;
    if (Status st = apply_placement(placement, &mo); !st) return fail("logits", st.message());
    mo.mmap = use_mmap;
    Expected<std::unique_ptr<LlamaModel>> model = load_model(*model_path, mo);
    if (!model) return fail("logits", model.message());
    const int32_t n_vocab = (*model)->hparams().n_vocab;
    for (size_t i = 0; i < tokens->size(); i++) {
        const int32_t id = (*tokens)[i];
        if (id < 0 || id >= n_vocab) {
            return fail("logits", strfmt("--tokens: id %d (item %zu) is outside the vocabulary "
                                         "[0, %d)",
                                         id, i, n_vocab));
        }
    }
    SessionOptions so;
    so.cache_dir = placement.cache_dir;
    so.kv_type = *kv_type;
    so.n_threads = threads ? static_cast<int>(*threads) : 0;
    so.n_ctx = ctx ? static_cast<int32_t>(*ctx) : static_cast<int32_t>(tokens->size());
    Expected<std::unique_ptr<LlamaSession>> session = LlamaSession::create(**model, so);
    if (!session) return fail("logits", session.message());
    if (Status st = (*session)->decode(*tokens, true); !st) return fail("logits", st.message());

    FILE* f = std::fopen(out_path->c_str(), "wb");
    if (!f) return fail("logits", strfmt("cannot create %s", out_path->c_str()));
    bool ok = true;
    for (int32_t i = 0; i < (*session)->n_logit_rows() && ok; i++) {
        // float32 little-endian: the host layout on every platform ferry builds for.
        ok = std::fwrite((*session)->logits(i), sizeof(float), static_cast<size_t>(n_vocab), f) ==
             static_cast<size_t>(n_vocab);
    }
    if (std::fclose(f) != 0) ok = false;
    if (!ok) return fail("logits", strfmt("cannot write %s", out_path->c_str()));
    std::fprintf(stderr, "ferry logits: wrote %d x %d logits to %s\n", (*session)->n_logit_rows(),
                 n_vocab, out_path->c_str());
    return 0;
}

}  // namespace
FERRY_COMMAND(logits, "logits", "write the logits of every position of a token sequence",
              cmd_logits);
}  // namespace ferry::cli
