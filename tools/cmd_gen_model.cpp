// ferry gen-model: writes a random-weight GGUF with a real architecture's shapes.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli.h"
#include "model/gen-model.h"
#include "model/tokenizer-json.h"

namespace ferry::cli {
namespace {

int cmd_gen_model(int argc, char** argv) {
    Args args(argc, argv);
    if (args.flag({"-h", "--help"})) {
        std::printf(
            "usage: ferry gen-model --preset NAME --type TYPE -o FILE [--embd-type TYPE] "
            "[--seed N] [-t N]\n"
            "  Writes a llama GGUF with random weights and a valid vocabulary.\n"
            "  presets:");
        for (const ModelPreset& p : model_presets()) std::printf(" %s", p.name);
        std::printf(
            "\n  types: f32 f16 bf16 q4_0 q4_1 q8_0 q4_k q5_k q6_k\n"
            "  --embd-type: token embedding / output type (default q6_k for 4- and 5-bit "
            "types, as llama.cpp's quantizer makes them; the weight type otherwise)\n"
            "  --vocab FILE: a Hugging Face tokenizer.json (byte-level BPE) whose vocabulary,\n"
            "    special tokens and chat template (tokenizer_config.json in the same folder)\n"
            "    the model gets instead of the generated one\n");
        return 0;
    }
    const std::optional<std::string> preset = args.value({"--preset"});
    const std::optional<std::string> type = args.value({"--type"});
    const std::optional<std::string> out = args.value({"-o", "--output"});
    const std::optional<std::string> embd = args.value({"--embd-type"});
    const std::optional<long long> seed = args.integer({"--seed"});
    const std::optional<long long> threads = args.integer({"-t", "--threads"});
    const std::optional<std::string> vocab = args.value({"--vocab"});
    if (Status st = args.finish(); !st) return fail("gen-model", st.message());
    if (!preset || !out) return fail("gen-model", "--preset and -o are required (see --help)");
    Expected<ModelPreset> p = find_preset(*preset);
    if (!p) return fail("gen-model", p.message());
    GenModelOptions opts;
    if (type) {
        Expected<Type> t = type_from_name(type->c_str());
        if (!t) return fail("gen-model", "--type: " + t.message());
        opts.type = *t;
    }
    if (embd) {
        Expected<Type> t = type_from_name(embd->c_str());
        if (!t) return fail("gen-model", "--embd-type: " + t.message());
        opts.embd_type = *t;
        opts.embd_type_set = true;
    }
    if (seed) opts.seed = static_cast<uint64_t>(*seed);
    if (threads) opts.n_threads = static_cast<int>(*threads);
    if (vocab) {
        const size_t slash = vocab->rfind('/');
        const std::string config =
            (slash == std::string::npos ? std::string(".") : vocab->substr(0, slash)) +
            "/tokenizer_config.json";
        Expected<std::vector<GgufKV>> kv = tokenizer_json_to_gguf_kv(
            *vocab, access(config.c_str(), R_OK) == 0 ? config : std::string());
        if (!kv) return fail("gen-model", "--vocab: " + kv.message());
        opts.vocab_kv = std::move(*kv);
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = generate_model(*p, opts, *out); !st) return fail("gen-model", st.message());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "ferry gen-model: wrote %s (%s, %s) in %.1f s\n", out->c_str(), p->name,
                 type_name(opts.type), s);
    return 0;
}

}  // namespace
FERRY_COMMAND(gen_model, "gen-model", "write a random-weight GGUF with a real model's shapes",
              cmd_gen_model);
}  // namespace ferry::cli
