// ferry logits: runs token ids through a model and writes the logits of every position.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/remote.h"
#include "cli.h"
#include "ferry/backend.h"
#include "ferry/llama.h"

namespace ferry::cli {
namespace {

void usage() {
    std::printf(
        "usage: ferry logits -m MODEL --tokens ID,ID,... --out FILE [options]\n"
        "  Writes float32 little-endian logits [n_tokens, n_vocab], one row per position.\n"
        "options:\n"
        "  -m, --model PATH     GGUF model\n"
        "  --tokens LIST        comma-separated token ids\n"
        "  --out FILE           output file\n"
        "  --kv-type TYPE       KV cache type: f16 (default) or f32\n"
        "  --mmap               CPU: compute from the memory-mapped file (no copy)\n"
        "  -t, --threads N      CPU threads (default: all cores)\n"
        "  -c, --ctx N          context size (default: the number of tokens)\n"
        "  --remote ADDR        connect to a `ferry serve` (unix:PATH or tcp:HOST:PORT) and put\n"
        "                       the weights on its first device (repeatable)\n"
        "  --device NAME        put the weights on this device (see `ferry devices`)\n");
}

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

// Connects to each --remote address and returns the device the weights should go to:
// `device_name` when given, else the first device of the first address (nullptr: the CPU).
namespace {

int cmd_logits(int argc, char** argv) {
    Args args(argc, argv);
    if (args.flag({"-h", "--help"})) {
        usage();
        return 0;
    }
    const std::optional<std::string> model_path = args.value({"-m", "--model"});
    const std::optional<std::string> tokens_arg = args.value({"--tokens"});
    const std::optional<std::string> out_path = args.value({"--out", "-o"});
    const std::optional<std::string> kv = args.value({"--kv-type"});
    const bool use_mmap = args.flag({"--mmap"});
    const std::optional<long long> threads = args.integer({"-t", "--threads"});
    const std::optional<long long> ctx = args.integer({"-c", "--ctx"});
    const std::vector<std::string> remotes = args.values({"--remote"});
    const std::optional<std::string> device_name = args.value({"--device"});
    if (Status st = args.finish(); !st) return fail("logits", st.message());
    if (!model_path) return fail("logits", "-m MODEL is required");
    if (!tokens_arg) return fail("logits", "--tokens LIST is required");
    if (!out_path) return fail("logits", "--out FILE is required");

    Expected<std::vector<int32_t>> tokens = parse_tokens(*tokens_arg);
    if (!tokens) return fail("logits", tokens.message());
    Expected<Type> kv_type = parse_kv_type(kv);
    if (!kv_type) return fail("logits", kv_type.message());
    Expected<Device*> dev = pick_device(remotes, device_name);
    if (!dev) return fail("logits", dev.message());

    ModelOptions mo;
    if (*dev) mo.devices.push_back(*dev);
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
