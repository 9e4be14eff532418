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
#include "model/llama.h"
#include "model/sampler.h"

namespace ferry::cli {

namespace {

void usage() {
    std::printf(
        "usage: ferry chat -m MODEL [options]\n"
        "  Reads one user message per line from stdin and streams each reply to stdout, using\n"
        "  the file's tokenizer.chat_template (llama3 and chatml families). \"/exit\" or the\n"
        "  end of input ends the conversation.\n"
        "options:\n"
        "  -m, --model PATH        GGUF model with a chat template\n"
        "  --system TEXT           system message\n"
        "  -n, --n-predict N       most tokens per reply (default 1024; replies stop at the\n"
        "                          end-of-turn token)\n"
        "  -t, --threads N         CPU threads (default: all cores)\n"
        "  -c, --ctx N             context size (default: the model's, at most 4096)\n"
        "  --temp T, --top-k N, --top-p P, --min-p P, --repeat-penalty R, --seed S\n"
        "                          sampling, as for `ferry run`\n"
        "  --kv-type TYPE          KV cache type: f16 (default) or f32\n"
        "  --mmap                  compute from the memory-mapped file\n"
        "  --verbose-prompt        print each turn's prompt token ids to stderr\n"
        "  --remote ADDR, --device NAME   where to put the weights, as for `ferry run`\n");
}

int cmd_chat(int argc, char** argv) {
    Args args(argc, argv);
    if (args.flag({"-h", "--help"})) {
        usage();
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
    const std::optional<long long> seed = args.integer({"--seed", "-s"});
    const std::optional<std::string> kv = args.value({"--kv-type"});
    const bool use_mmap = args.flag({"--mmap"});
    const bool verbose_prompt = args.flag({"--verbose-prompt"});
    const std::vector<std::string> remotes = args.values({"--remote"});
    const std::optional<std::string> device_name = args.value({"--device"});
    if (Status st = args.finish(); !st) return fail("chat", st.message());
    if (!model_path) return fail("chat", "missing -m MODEL (a GGUF file with a chat template)");
    const long long n_gen = n_predict.value_or(1024);
    if (n_gen < 0) return fail("chat", "-n must not be negative");
    if (ctx && (*ctx <= 0 || *ctx > (1 << 24))) return fail("chat", "-c must be positive");
    Expected<Type> kv_type = parse_kv_type(kv);
    if (!kv_type) return fail("chat", kv_type.message());
    Expected<Device*> dev = pick_device(remotes, device_name);
    if (!dev) return fail("chat", dev.message());

    ModelOptions mo;
    if (*dev) mo.devices.push_back(*dev);
    mo.mmap = use_mmap;
    Expected<std::unique_ptr<LlamaModel>> model = LlamaModel::load(*model_path, mo);
    if (!model) return fail("chat", model.message());
    SessionOptions so;
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
