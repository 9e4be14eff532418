// ferry chat: an interactive, multi-turn conversation with a model, using its chat template.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "chat-loop.h"
#include "cli.h"
#include "ferry/backend.h"
#include "ferry/llama.h"
#include "ferry/sampler.h"

namespace ferry::cli {

namespace {

const char* const kUsage =
    "usage: ferry chat -m MODEL [options]\n"
    "  Reads one user message per line from stdin and streams each reply to stdout, using\n"
    "  the file's tokenizer.chat_template (llama3 and chatml families). \"/exit\" or the\n"
    "  end of input ends the conversation.\n";

std::vector<OptionSpec> options() {
    return with_placement({
        {{"-m", "--model"}, "PATH", "GGUF model with a chat template"},
        {{"--system"}, "TEXT", "system message"},
        {{"-n", "--n-predict"},
         "N",
         "most tokens per reply (default 1024; -1: no limit); replies stop\n"
         "at the end-of-turn token"},
        {{"-t", "--threads"}, "N", "CPU threads (default: all cores)"},
        {{"-c", "--ctx"}, "N", "context size (default: the model's, at most 4096)"},
        {{"--temp"}, "T", "temperature (default 0.8; 0: greedy)"},
        {{"--top-k"}, "N", "top-k (default 40; 0: off)"},
        {{"--top-p"}, "P", "top-p (default 0.95; 1: off)"},
        {{"--min-p"}, "P", "min-p (default 0.05; 0: off)"},
        {{"--repeat-penalty"}, "R", "repetition penalty over the last 64 tokens (default 1: off)"},
        {{"-s", "--seed"}, "S", "sampling seed"},
        {{"--kv-type"}, "TYPE", "KV cache type: f16 (default), f32 or bf16"},
        {{"--mmap"}, nullptr, "CPU: compute from the memory-mapped file"},
        {{"--verbose-prompt"}, nullptr, "print each turn's prompt token ids to stderr"},
    });
}

int cmd_chat(int argc, char** argv) {
    Args args("chat", kUsage, options(), argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    const std::optional<std::string> model_path = args.value({"-m", "--model"});
    const std::optional<std::string> system = args.value({"--system"});
    const std::optional<long long> n_predict = args.integer({"-n", "--n-predict"});
    const std::optional<long long> threads = args.integer({"-t", "--threads"});
    const std::optional<long long> ctx = args.integer({"-c", "--ctx"});
    const std::optional<double> temp = args.number({"--temp"});
    const std::optional<long long> top_k = args.integer({"--top-k"});
    const std::optional<double> top_p = args.number({"--top-p"});
    const std::optional<double> min_p = args.number({"--min-p"});
    const std::optional<double> repeat_penalty = args.number({"--repeat-penalty"});
    const std::optional<long long> seed = args.integer({"-s", "--seed"});
    const std::optional<std::string> kv = args.value({"--kv-type"});
    const bool use_mmap = args.flag({"--mmap"});
    const bool verbose_prompt = args.flag({"--verbose-prompt"});
    const Placement placement = read_placement(args);
    if (Status st = args.finish(); !st) return fail("chat", st.message());
    if (!model_path) return fail("chat", "missing -m MODEL (a GGUF file with a chat template)");
    const long long n_gen = n_predict.value_or(1024);
    if (n_gen < -1) {
        return fail("chat", strfmt("-n %lld: give a token count, or -1 for no limit", n_gen));
    }
    if (ctx && (*ctx <= 0 || *ctx > (1 << 24))) return fail("chat", "-c must be positive");
    Expected<Type> kv_type = parse_kv_type(kv);
    if (!kv_type) return fail("chat", kv_type.message());

    ModelOptions mo;
    if (Status st = apply_placement(placement, &mo); !st) return fail("chat", st.message());
    mo.mmap = use_mmap;
    Expected<std::unique_ptr<LlamaModel>> model = load_model(*model_path, mo);
    if (!model) return fail("chat", model.message());
    SessionOptions so;
    so.cache_dir = placement.cache_dir;
    so.kv_type = *kv_type;
    so.n_threads = threads ? static_cast<int>(*threads) : 0;
    so.n_ctx = ctx ? static_cast<int32_t>(*ctx) : 0;
    Expected<std::unique_ptr<LlamaSession>> session = LlamaSession::create(**model, so);
    if (!session) return fail("chat", session.message());

    SamplerParams sp;
    if (temp) sp.temp = static_cast<float>(*temp);
    if (top_k) sp.top_k = static_cast<int32_t>(*top_k);
    if (top_p) sp.top_p = static_cast<float>(*top_p);
    if (min_p) sp.min_p = static_cast<float>(*min_p);
    if (repeat_penalty) sp.repeat_penalty = static_cast<float>(*repeat_penalty);
    if (seed) sp.seed = static_cast<uint64_t>(*seed);
    Expected<ChatLoop> chat = ChatLoop::create(**model, **session, sp);
    if (!chat) return fail("chat", chat.message());
    if (system) chat->set_system(*system);

    const bool interactive = isatty(STDIN_FILENO) != 0;
    if (interactive) {
        std::fprintf(stderr, "ferry chat: %s (%s template); /exit or Ctrl-D ends\n",
                     model_path->c_str(), chat->chat_template().family_name());
    }
    std::string line;
    while (true) {
        if (interactive) {
            std::printf("> ");
            std::fflush(stdout);
        }
        if (!std::getline(std::cin, line)) break;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line == "/exit") break;
        if (line.empty()) continue;
        ChatTurnStats st;
        if (Status s = chat->turn(line, n_gen, stdout, &st); !s) return fail("chat", s.message());
        std::printf("\n");
        std::fflush(stdout);
        if (verbose_prompt) {
            std::fprintf(stderr, "prompt ids: %s\n", join_ids(chat->last_prompt()).c_str());
            std::fprintf(stderr,
                         "ferry chat: prompt %zu tokens (%zu decoded), generated %lld tokens%s\n",
                         st.n_prompt, st.n_decoded, st.n_generated,
                         st.stopped_at_eog ? " (end of turn)" : "");
        }
    }
    return 0;
}

}  // namespace
FERRY_COMMAND(chat, "chat", "talk with a model (multi-turn, its chat template)", cmd_chat);
}  // namespace ferry::cli
