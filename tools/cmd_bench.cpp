// ferry bench: prompt processing (pp) and token generation (tg) throughput, llama-bench style.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "ferry/backend.h"
#include "ferry/llama.h"

namespace ferry::cli {
namespace {

struct Result {
    std::string test;  // "pp512", "tg128"
    int n_tokens = 0;
    std::vector<double> tps;
    // The model's GPU's memory in use (total less free, every process on it) at the end of the
    // test's runs, its session still holding its buffers; 0 on other devices.
    size_t dev_used = 0;
    // A decode test (tg: a token at a time), else a prompt batch (pp).
    bool decode() const { return test[0] == 't'; }
    double mean() const {
        double s = 0;
        for (double v : tps) s += v;
        return tps.empty() ? 0 : s / static_cast<double>(tps.size());
    }
    double sd() const {
        if (tps.size() < 2) return 0;
        const double m = mean();
        double s = 0;
        for (double v : tps) s += (v - m) * (v - m);
        return std::sqrt(s / static_cast<double>(tps.size() - 1));
    }
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

size_t peak_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

std::string human_size(double bytes) {
    if (bytes >= 1024.0 * 1024 * 1024) return strfmt("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    return strfmt("%.2f MiB", bytes / (1024.0 * 1024));
}

// Bytes a second in decimal units, as memory bandwidth is quoted.
std::string human_rate(double bytes_per_s) {
    if (bytes_per_s >= 1e12) return strfmt("%.2f TB/s", bytes_per_s / 1e12);
    return strfmt("%.1f GB/s", bytes_per_s / 1e9);
}

std::string human_params(double n) {
    if (n >= 1e9) return strfmt("%.2f B", n / 1e9);
    if (n >= 1e6) return strfmt("%.2f M", n / 1e6);
    return strfmt("%.0f", n);
}

// Random in-vocabulary tokens (speed does not depend on which).
std::vector<int32_t> random_tokens(int n, int32_t n_vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(0, n_vocab - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = d(rng);
    return t;
}

Status run_pp(LlamaSession& s, int n, int32_t n_vocab, double* tps) {
    std::vector<int32_t> toks = random_tokens(n, n_vocab, 1);
    s.reset();
    const double t0 = now_s();
    FERRY_TRY(s.decode(toks, false));
    *tps = n / (now_s() - t0);
    return Status::ok();
}

Status run_tg(LlamaSession& s, int n, int32_t n_vocab, double* tps) {
    std::vector<int32_t> toks = random_tokens(n, n_vocab, 2);
    s.reset();
    const double t0 = now_s();
    for (int i = 0; i < n; i++) {
        FERRY_TRY(s.decode(std::span<const int32_t>(&toks[static_cast<size_t>(i)], 1), false));
    }
    *tps = n / (now_s() - t0);
    return Status::ok();
}

int cmd_bench(int argc, char** argv) {
    Args args(
        "bench",
        "usage: ferry bench -m MODEL [-p N] [-n N] [-r REPS] [options]\n"
        "  pp: one batch of N prompt tokens from an empty cache; tg: N tokens one at a\n"
        "  time from an empty cache (as llama-bench). Each test runs once to warm up, then\n"
        "  REPS times; prints mean ± sd tokens/s, the process's peak resident memory, and for\n"
        "  tg the weights a token reads times tokens/s (the memory bandwidth it reached).\n",
        with_placement({
            {{"-m", "--model"}, "PATH", "GGUF model"},
            {{"-p", "--n-prompt"}, "N", "prompt tokens of the pp test (default 512; 0: skip)"},
            {{"-n", "--n-gen"}, "N", "generated tokens of the tg test (default 128; 0: skip)"},
            {{"-r", "--repetitions"}, "N", "timed runs of each test (default 5)"},
            {{"-t", "--threads"}, "N", "CPU threads (default: all cores)"},
            {{"-o", "--output"}, "FILE", "write the results to FILE (default: stdout)"},
            {{"--format"}, "FMT", "md (default: a markdown table) or json"},
            {{"-c", "--ctx"},
             "N",
             "context size of every test (default: each test's own tokens + 16, as llama-bench "
             "gives each test its own context)"},
            {{"--kv-type"}, "TYPE", "KV cache type: f16 (default), f32 or bf16"},
            {{"--kv-pad"},
             "N",
             "attended KV length rounded up to a multiple of N: N steps share a graph (default "
             "0: 256 on devices that replay captured graphs, CUDA; 32 elsewhere)"},
            {{"--mmap"},
             nullptr,
             "CPU: weights stay in the memory-mapped file instead of huge-page memory"},
        }),
        argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    const std::optional<std::string> model_path = args.value({"-m", "--model"});
    const long long n_prompt = args.integer({"-p", "--n-prompt"}).value_or(512);
    const long long n_gen = args.integer({"-n", "--n-gen"}).value_or(128);
    const long long reps = args.integer({"-r", "--repetitions"}).value_or(5);
    const long long threads = args.integer({"-t", "--threads"}).value_or(0);
    const std::optional<std::string> out_path = args.value({"-o", "--output"});
    const std::string fmt = args.value({"--format"}).value_or("md");
    const std::optional<std::string> kv = args.value({"--kv-type"});
    const long long kv_pad = args.integer({"--kv-pad"}).value_or(0);
    const std::optional<long long> ctx = args.integer({"-c", "--ctx"});
    const bool use_mmap = args.flag({"--mmap"});
    const Placement placement = read_placement(args);
    if (Status st = args.finish(); !st) return fail("bench", st.message());
    if (!model_path) return fail("bench", "-m MODEL is required");
    if (fmt != "md" && fmt != "json") {
        return fail("bench", "--format " + fmt + ": not md or json");
    }
    // A benchmark times a fixed number of tokens: -n -1 ("until the end") has no meaning here.
    if (n_prompt < 0) return fail("bench", strfmt("-p %lld: must be 0 or more", n_prompt));
    if (n_gen < 0) return fail("bench", strfmt("-n %lld: must be 0 or more", n_gen));
    if (reps < 1) return fail("bench", strfmt("-r %lld: must be 1 or more", reps));
    if (kv_pad < 0 || kv_pad > (1 << 20)) {
        return fail("bench", strfmt("--kv-pad %lld: must be 0 to 1048576", kv_pad));
    }
    const long long min_ctx = std::max(n_prompt, n_gen) + 16;
    if (ctx && (*ctx < min_ctx || *ctx > (1 << 24))) {
        return fail("bench", strfmt("-c %lld: must be %lld (the longer test's tokens + 16) to "
                                    "16777216",
                                    *ctx, min_ctx));
    }
    // Created before the run, so that a bad path fails at once, not after minutes of timing.
    FILE* out = stdout;
    if (out_path) {
        out = std::fopen(out_path->c_str(), "w");
        if (!out) return fail("bench", "-o: cannot create " + *out_path);
    }

    SessionOptions so;
    so.cache_dir = placement.cache_dir;
    so.n_threads = static_cast<int>(threads);
    Expected<Type> kv_type = parse_kv_type(kv);
    if (!kv_type) return fail("bench", kv_type.message());
    so.kv_type = *kv_type;
    so.kv_pad = static_cast<int32_t>(kv_pad);
    ModelOptions mo;
    if (Status st = apply_placement(placement, &mo); !st) return fail("bench", st.message());
    mo.mmap = use_mmap;

    Expected<std::unique_ptr<LlamaModel>> model = load_model(*model_path, mo);
    if (!model) return fail("bench", model.message());
    const int32_t n_vocab = (*model)->hparams().n_vocab;

    std::vector<Result> results;
    if (n_prompt > 0)
        results.push_back({strfmt("pp%lld", n_prompt), static_cast<int>(n_prompt), {}});
    if (n_gen > 0) results.push_back({strfmt("tg%lld", n_gen), static_cast<int>(n_gen), {}});
    for (Result& r : results) {
        const bool pp = !r.decode();
        // Each test in a session of its own, as llama-bench gives each its own context (one
        // context sized for pp512 had tg128 attend 256 padded keys instead of 144: stop 55,
        // H100, 1B tg128 2.4-2.8% slower before the attention skipped the masked ones).
        so.n_batch = pp ? r.n_tokens : 1;
        so.n_ctx = static_cast<int32_t>(ctx.value_or(r.n_tokens + 16));
        Expected<std::unique_ptr<LlamaSession>> sess = LlamaSession::create(**model, so);
        if (!sess) return fail("bench", sess.message());
        for (long long i = 0; i <= reps; i++) {
            double tps = 0;
            Status st = pp ? run_pp(**sess, r.n_tokens, n_vocab, &tps)
                           : run_tg(**sess, r.n_tokens, n_vocab, &tps);
            if (!st) return fail("bench", st.message());
            if (i > 0) r.tps.push_back(tps);  // the first run warms up
        }
        if (Device* d = (*model)->device(); d->type() == DeviceType::GPU) {
            const DeviceMemory dm = d->memory();
            r.dev_used = dm.total > dm.free ? dm.total - dm.free : 0;
        }
    }
    const LlamaModel& m = **model;
    const int nth = threads > 0
                        ? static_cast<int>(threads)
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const std::string model_desc =
        strfmt("%s %s %s", m.hparams().arch.c_str(),
               human_params(static_cast<double>(m.n_params())).c_str(), m.type_desc().c_str());
    const std::string dev_name = m.device()->name();
    const size_t peak = peak_rss_bytes();
    const uint64_t step_bytes = m.step_weight_bytes();
    if (fmt == "md") {
        std::fprintf(out, "| model | size | params | device | threads | test | t/s |\n");
        std::fprintf(out, "| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
        for (const Result& r : results) {
            std::fprintf(out, "| %s | %s | %s | %s | %d | %s | %.2f ± %.2f |\n", model_desc.c_str(),
                         human_size(static_cast<double>(m.size_bytes())).c_str(),
                         human_params(static_cast<double>(m.n_params())).c_str(), dev_name.c_str(),
                         nth, r.test.c_str(), r.mean(), r.sd());
        }
        std::fprintf(out, "\npeak memory (max RSS): %s\n",
                     human_size(static_cast<double>(peak)).c_str());
        if (!results.empty() && results[0].dev_used > 0) {
            // (Buffers live as long as their test's session, so this is each test's peak but
            // for scratch freed within a step; every process on the device counts.)
            std::fprintf(out, "%s memory in use at the end of each test:", dev_name.c_str());
            for (const Result& r : results) {
                std::fprintf(out, " %s %s", r.test.c_str(),
                             human_size(static_cast<double>(r.dev_used)).c_str());
            }
            std::fprintf(out, "\n");
        }
        // Decode reads every weight once a token: its bytes times tokens/s is the bandwidth
        // reached (the KV cache's reads, small at these lengths, left out).
        bool first = true;
        for (const Result& r : results) {
            if (!r.decode()) continue;
            if (first) {
                const double b = static_cast<double>(step_bytes);
                std::fprintf(
                    out, "weights read a token: %s;",
                    (b >= 1e9 ? strfmt("%.3f GB", b / 1e9) : strfmt("%.2f MB", b / 1e6)).c_str());
            }
            std::fprintf(out, " %s %s", r.test.c_str(),
                         human_rate(static_cast<double>(step_bytes) * r.mean()).c_str());
            first = false;
        }
        if (!first) std::fprintf(out, "\n");
    } else {
        std::fprintf(out, "[\n");
        for (size_t i = 0; i < results.size(); i++) {
            const Result& r = results[i];
            std::fprintf(out,
                         "  {\"model\": \"%s\", \"model_size\": %llu, \"n_params\": %llu, "
                         "\"device\": \"%s\", \"threads\": %d, \"test\": \"%s\", "
                         "\"avg_ts\": %.4f, \"stddev_ts\": %.4f, \"samples_ts\": [",
                         model_desc.c_str(), static_cast<unsigned long long>(m.size_bytes()),
                         static_cast<unsigned long long>(m.n_params()), dev_name.c_str(), nth,
                         r.test.c_str(), r.mean(), r.sd());
            for (size_t j = 0; j < r.tps.size(); j++)
                std::fprintf(out, "%s%.4f", j ? ", " : "", r.tps[j]);
            std::fprintf(out, "], \"peak_rss_bytes\": %zu, \"device_used_bytes\": %zu", peak,
                         r.dev_used);
            if (r.decode()) {
                std::fprintf(out,
                             ", \"weight_bytes_per_token\": %llu, \"weight_bytes_per_s\": %.0f",
                             static_cast<unsigned long long>(step_bytes),
                             static_cast<double>(step_bytes) * r.mean());
            }
            std::fprintf(out, "}%s\n", i + 1 < results.size() ? "," : "");
        }
        std::fprintf(out, "]\n");
    }
    if (out != stdout && std::fclose(out) != 0)
        return fail("bench", "-o: cannot write " + *out_path);
    return 0;
}

}  // namespace
FERRY_COMMAND(bench, "bench", "measure prompt and generation throughput (llama-bench style)",
              cmd_bench);
}  // namespace ferry::cli
