// ferry gen-model: writes a random-weight GGUF with a real architecture's shapes.
#include <chrono>
#include <cstdio>

#include "cli.h"
#include "ferry/gen-model.h"

namespace ferry::cli {
namespace {

int cmd_gen_model(int argc, char** argv) {
    Args args("gen-model",
              "usage: ferry gen-model --preset NAME --type TYPE -o FILE [options]\n"
              "  Writes a GGUF (llama, qwen2, qwen3) with random weights and a valid vocabulary.\n",
              {
                  {{"--preset"}, "NAME", "the architecture's shapes (see the list below)"},
                  {{"--type"}, "TYPE", "weight type or mixture (see the lists below)"},
                  {{"-o", "--output"}, "FILE", "the GGUF file to write"},
                  {{"--embd-type"},
                   "TYPE",
                   "token embedding / output type (default q6_k for 4- and 5-bit\n"
                   "types, as llama.cpp's quantizer makes them; the weight type otherwise)"},
                  {{"-s", "--seed"}, "N", "random seed"},
                  {{"-t", "--threads"}, "N", "threads (default: all cores)"},
                  {{"--tokenizer", "--vocab"},
                   "PATH",
                   "a Hugging Face tokenizer.json (byte-level BPE), or a folder holding\n"
                   "one: the model gets its vocabulary, special tokens and chat template\n"
                   "(tokenizer_config.json beside it) instead of the generated ones, with\n"
                   "max(preset, tokenizer) token rows (the rest unused padding)"},
              },
              argc, argv);
    if (args.help()) {
        args.print_help();
        std::printf("presets:");
        for (const ModelPreset& p : model_presets()) std::printf(" %s", p.name);
        std::printf("\ntypes:");
        int count = 0;
        const Type* ts = storage_types(&count);
        for (int i = 0; i < count; i++) {
            if (ts[i] != Type::I32) std::printf(" %s", type_name(ts[i]));
        }
        std::printf(
            "\nmixtures (as llama.cpp's presets): q4_k_m q5_k_m: q6_k output, q6_k attn_v and "
            "ffn_down in about half the layers, q4_k / q5_k elsewhere\n"
            "rows a type's block does not divide fall back as in llama.cpp: q4_k -> q5_0, "
            "q5_k -> q5_1, q6_k -> q8_0, q2_k / q3_k / iq4_xs -> iq4_nl\n");
        return 0;
    }
    const std::optional<std::string> preset = args.value({"--preset"});
    const std::optional<std::string> type = args.value({"--type"});
    const std::optional<std::string> out = args.value({"-o", "--output"});
    const std::optional<std::string> embd = args.value({"--embd-type"});
    const std::optional<long long> seed = args.integer({"-s", "--seed"});
    const std::optional<long long> threads = args.integer({"-t", "--threads"});
    const std::optional<std::string> tokenizer = args.value({"--tokenizer", "--vocab"});
    if (Status st = args.finish(); !st) return fail("gen-model", st.message());
    if (!preset || !out) return fail("gen-model", "--preset and -o are required (see --help)");
    Expected<ModelPreset> p = find_preset(*preset);
    if (!p) return fail("gen-model", p.message());
    GenModelOptions opts;
    if (type) {
        if (Status st = set_weight_type(opts, *type); !st) {
            return fail("gen-model", "--type: " + st.message());
        }
    }
    if (embd) {
        Expected<Type> t = type_from_name(embd->c_str());
        if (!t) return fail("gen-model", "--embd-type: " + t.message());
        opts.embd_type = *t;
        opts.embd_type_set = true;
    }
    if (seed) opts.seed = static_cast<uint64_t>(*seed);
    if (threads) opts.n_threads = static_cast<int>(*threads);
    if (tokenizer) opts.tokenizer = *tokenizer;
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = generate_model(*p, opts, *out); !st) return fail("gen-model", st.message());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "ferry gen-model: wrote %s (%s, %s) in %.1f s\n", out->c_str(), p->name,
                 opts.mixture == Mixture::Q4_K_M   ? "q4_k_m"
                 : opts.mixture == Mixture::Q5_K_M ? "q5_k_m"
                                                   : type_name(opts.type),
                 s);
    return 0;
}

}  // namespace
FERRY_COMMAND(gen_model, "gen-model", "write a random-weight GGUF with a real model's shapes",
              cmd_gen_model);
}  // namespace ferry::cli
