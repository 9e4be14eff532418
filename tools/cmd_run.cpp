// ferry run: generates a completion of a prompt, streaming tokens as they come.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "chat-loop.h"
#include "cli.h"
#include "embedded-model.h"
#include "ferry/backend.h"
#include "ferry/llama.h"
#include "ferry/sampler.h"

namespace ferry::cli {

namespace {

constexpr const char* kDefaultPrompt = "Permission is hereby granted";

// A one-line progress bar on stderr while weights load, when stderr is a terminal.
void show_progress(float f) {
    static int last = -1;
    const int pct = static_cast<int>(f * 100.0f);
    if (pct == last) return;
    last = pct;
    const int width = 30, filled = static_cast<int>(f * width);
    std::fprintf(stderr, "\rloading [%.*s%*s] %3d%%", filled, "##############################",
                 width - filled, "", pct);
    if (f >= 1.0f) std::fprintf(stderr, "\r%*s\r", width + 16, "");
    std::fflush(stderr);
}

const char* const kUsage =
    "usage: ferry run [-m MODEL] [-p PROMPT] [options]\n"
    "  Streams the completion of PROMPT to stdout; timings go to stderr.\n";

std::vector<OptionSpec> options() {
    return with_placement({
        {{"-m", "--model"},
         "PATH",
         "GGUF model (default: the embedded demo model, tiny-llama Q8_0)"},
        {{"-p", "--prompt"}, "TEXT", "prompt (default: \"Permission is hereby granted\")"},
        {{"-n", "--n-predict"},
         "N",
         "tokens to generate (default 128; fewer at the end of text);\n"
         "-1: until the end of text or a full context"},
        {{"-t", "--threads"}, "N", "CPU threads (default: all cores)"},
        {{"-c", "--ctx"}, "N", "context size (default: the model's, at most 4096)"},
        {{"--temp"}, "T", "temperature (default 0.8; 0: greedy)"},
        {{"--top-k"}, "N", "top-k (default 40; 0: off)"},
        {{"--top-p"}, "P", "top-p (default 0.95; 1: off)"},
        {{"--min-p"}, "P", "min-p (default 0.05; 0: off)"},
        {{"--repeat-penalty"}, "R", "repetition penalty over the last 64 tokens (default 1: off)"},
        {{"-s", "--seed"}, "S", "sampling seed"},
        {{"--kv-type"}, "TYPE", "KV cache type: f16 (default), f32 or bf16"},
        {{"--mmap"},
         nullptr,
         "CPU: compute from the memory-mapped file (no copy, faster start);\n"
         "default: load into huge-page memory (faster decode)"},
        {{"--chat"},
         nullptr,
         "one chat turn: PROMPT is the user's message, rendered with the\n"
         "file's chat template; stops at the end-of-turn token"},
        {{"--system"}, "TEXT", "with --chat: the system message"},
        {{"--verbose-prompt"}, nullptr, "print the prompt's token ids to stderr"},
    });
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int cmd_run(int argc, char** argv) {
    Args args("run", kUsage, options(), argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    const std::optional<std::string> model_path = args.value({"-m", "--model"});
    const std::optional<std::string> prompt = args.value({"-p", "--prompt"});
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
    const bool chat = args.flag({"--chat"});
    const std::optional<std::string> system = args.value({"--system"});
    const bool verbose_prompt = args.flag({"--verbose-prompt"});
    const Placement placement = read_placement(args);
    if (Status st = args.finish(); !st) return fail("run", st.message());
    const std::string path = model_path ? *model_path : embedded_demo_model().name;
    const std::string prompt_text = prompt ? *prompt : kDefaultPrompt;
    const long long n_gen = n_predict.value_or(128);
    if (n_gen < -1)
        return fail("run", strfmt("-n %lld: give a token count, or -1 for no limit", n_gen));
    if (system && !chat) return fail("run", "--system needs --chat");
    if (ctx && (*ctx <= 0 || *ctx > (1 << 24))) return fail("run", "-c must be positive");
    Expected<Type> kv_type = parse_kv_type(kv);
    if (!kv_type) return fail("run", kv_type.message());

    const auto t_load = std::chrono::steady_clock::now();
    ModelOptions mo;
    if (Status st = apply_placement(placement, &mo); !st) return fail("run", st.message());
    mo.mmap = use_mmap;
    if (isatty(STDERR_FILENO)) mo.progress = show_progress;
    Expected<std::unique_ptr<LlamaModel>> model = load_model(path, mo);
    if (!model) return fail("run", model.message());
    SessionOptions so;
    so.cache_dir = placement.cache_dir;
    so.kv_type = *kv_type;
    so.n_threads = threads ? static_cast<int>(*threads) : 0;
    so.n_ctx = ctx ? static_cast<int32_t>(*ctx) : 0;
    Expected<std::unique_ptr<LlamaSession>> session = LlamaSession::create(**model, so);
    if (!session) return fail("run", session.message());
    const double load_s = seconds_since(t_load);

    SamplerParams sp;
    if (temp) sp.temp = static_cast<float>(*temp);
    if (top_k) sp.top_k = static_cast<int32_t>(*top_k);
    if (top_p) sp.top_p = static_cast<float>(*top_p);
    if (min_p) sp.min_p = static_cast<float>(*min_p);
    if (repeat_penalty) sp.repeat_penalty = static_cast<float>(*repeat_penalty);
    if (seed) sp.seed = static_cast<uint64_t>(*seed);

    if (chat) {
        Expected<ChatLoop> loop = ChatLoop::create(**model, **session, sp);
        if (!loop) return fail("run", loop.message());
        if (system) loop->set_system(*system);
        ChatTurnStats st;
        if (Status s = loop->turn(prompt_text, n_gen, stdout, &st); !s) {
            return fail("run", s.message());
        }
        std::printf("\n");
        std::fflush(stdout);
        if (verbose_prompt) {
            std::fprintf(stderr, "prompt ids: %s\n", join_ids(loop->last_prompt()).c_str());
        }
        std::fprintf(stderr, "ferry run: load %.3f s (%s, %s on %s)\n", load_s,
                     (*model)->type_desc().c_str(), path.c_str(), (*model)->device()->name());
        std::fprintf(stderr, "ferry run: prompt %zu tokens in %.3f s (%s chat template)\n",
                     st.n_prompt, st.prompt_s, loop->chat_template().family_name());
        std::fprintf(stderr, "ferry run: generated %lld tokens in %.3f s%s\n", st.n_generated,
                     st.gen_s, st.stopped_at_eog ? " (end of turn)" : "");
        return 0;
    }

    const Vocab& vocab = (*model)->vocab();
    const int32_t n_vocab = (*model)->hparams().n_vocab;
    std::vector<int32_t> tokens = vocab.encode(prompt_text, true);
    if (tokens.empty()) return fail("run", "the prompt gives no tokens");
    if (verbose_prompt) std::fprintf(stderr, "prompt ids: %s\n", join_ids(tokens).c_str());
    Sampler sampler(sp);
    for (int32_t t : tokens) sampler.accept(t);

    LlamaSession& s = **session;
    read_only_candidates(s, sampler, n_vocab);
    const auto t_prompt = std::chrono::steady_clock::now();
    if (Status st = s.decode(tokens, false); !st) return fail("run", st.message());
    const double prompt_s = seconds_since(t_prompt);

    const auto t_gen = std::chrono::steady_clock::now();
    long long n_done = 0;
    while (n_gen < 0 || n_done < n_gen) {
        const int32_t next = sample_next(sampler, s, n_vocab);
        if (next < 0 || vocab.is_eog(next)) break;
        sampler.accept(next);
        const std::string piece = vocab.token_to_piece(next);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        n_done++;
        if (n_done == n_gen) break;
        if (s.n_past() >= s.n_ctx()) {
            std::fprintf(stderr, "\nferry run: context of %d tokens is full\n", s.n_ctx());
            break;
        }
        const int32_t one[1] = {next};
        if (Status st = s.decode(one, false); !st) return fail("run", st.message());
    }
    const double gen_s = seconds_since(t_gen);
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "ferry run: load %.3f s (%s, %s on %s)\n", load_s,
                 (*model)->type_desc().c_str(), path.c_str(), (*model)->device()->name());
    std::fprintf(stderr, "ferry run: prompt %zu tokens in %.3f s (%.1f tokens/s)\n", tokens.size(),
                 prompt_s, prompt_s > 0 ? tokens.size() / prompt_s : 0.0);
    std::fprintf(stderr, "ferry run: generated %lld tokens in %.3f s (%.1f tokens/s)\n", n_done,
                 gen_s, gen_s > 0 ? n_done / gen_s : 0.0);
    return 0;
}

}  // namespace
FERRY_COMMAND(run, "run", "generate text from a prompt", cmd_run);
}  // namespace ferry::cli
