// ferry convert: a Hugging Face model folder -> a GGUF file.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli.h"
#include "ferry/convert.h"

namespace ferry::cli {
namespace {

int cmd_convert(int argc, char** argv) {
    Args args("convert",
              "usage: ferry convert HF_DIR -o FILE [--type TYPE] [--force]\n"
              "  Converts a Hugging Face folder (config.json, *.safetensors in F32/F16/BF16,\n"
              "  sharded or not, tokenizer.json, tokenizer_config.json) into a GGUF file with\n"
              "  the public converter's keys, tensor names and layouts.\n"
              "  Architectures: LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2),\n"
              "  Qwen3ForCausalLM (qwen3).\n",
              {
                  {{"-o", "--output"}, "FILE", "the GGUF file to write"},
                  {{"--type"},
                   "TYPE",
                   "type of the 2-D weights (default f16): f32 f16 bf16 q8_0 q4_0 q4_1\n"
                   "q4_k q5_k q6_k; rows the type's blocks do not divide fall back to q8_0\n"
                   "(or f16); norms and biases stay f32"},
                  {{"--force"}, nullptr, "overwrite FILE if it exists"},
                  {{"-t", "--threads"}, "N", "quantization threads (default: all cores)"},
              },
              argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    ConvertOptions o;
    const std::optional<std::string> out = args.value({"-o", "--output"});
    const std::optional<std::string> type = args.value({"--type"});
    o.force = args.flag({"--force"});
    const std::optional<long long> threads = args.integer({"-t", "--threads"});
    const std::vector<std::string> pos = args.positional();
    if (Status st = args.finish(); !st) return fail("convert", st.message());
    if (pos.size() != 1 || !out)
        return fail("convert", "HF_DIR and -o FILE are required (see --help)");
    o.hf_dir = pos[0];
    o.out_path = *out;
    if (threads) o.n_threads = static_cast<int>(*threads);
    if (type) {
        Expected<Type> t = type_from_name(type->c_str());
        if (!t) return fail("convert", "--type: " + t.message());
        o.type = *t;
    }
    // A one-line progress bar when stderr is a terminal.
    if (isatty(STDERR_FILENO)) {
        o.progress = [](uint64_t done, uint64_t total, const std::string& name) {
            const double f = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
            const int width = 30, fill = static_cast<int>(f * width);
            std::fprintf(stderr, "\r[%-*s] %3d%% %-32.32s", width,
                         std::string(static_cast<size_t>(fill), '#').c_str(),
                         static_cast<int>(f * 100.0), name.c_str());
            if (done == total) std::fprintf(stderr, "\n");
        };
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = convert_hf_to_gguf(o); !st) return fail("convert", st.message());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "ferry convert: wrote %s (%s) in %.1f s\n", o.out_path.c_str(),
                 type_name(o.type), s);
    return 0;
}

}  // namespace
FERRY_COMMAND(convert, "convert", "convert a Hugging Face model folder into a GGUF file",
              cmd_convert);
}  // namespace ferry::cli
