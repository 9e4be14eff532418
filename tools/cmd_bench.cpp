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
    Args args(argc, argv);
    if (args.flag({"-h", "--help"})) {
        std::printf(
            "usage: ferry bench -m MODEL [-p N] [-n N] [-r REPS] [-t THREADS] [-o md|json]\n"
            "                   [--kv-type f16|f32] [--remote ADDR] [--device NAME] [--mmap]\n"
            "  pp: one batch of N prompt tokens from an empty cache; tg: N tokens one at a time\n"
            "  from an empty cache (as llama-bench). Each test runs once to warm up, then REPS\n"
            "  times; prints mean ± sd tokens/s, and the process's peak resident memory.\n"
            "  -p 0 or -n 0 skips that test. Defaults: -p 512 -n 128 -r 5.\n"
            "  --remote ADDR puts the weights (and the work) on a `ferry serve` device.\n"
            "  --mmap: CPU weights stay in the memory-mapped file instead of huge-page memory.\n");
        return 0;
    }
    const std::optional<std::string> model_path = args.value({"-m", "--model"});
    const long long n_prompt = args.integer({"-p", "--n-prompt"}).value_or(512);
    const long long n_gen = args.integer({"-n", "--n-gen"}).value_or(128);
    const long long reps = args.integer({"-r", "--repetitions"}).value_or(5);
    const long long threads = args.integer({"-t", "--threads"}).value_or(0);
    const std::string fmt = args.value({"-o", "--output"}).value_or("md");
    const std::optional<std::string> kv = args.value({"--kv-type"});
    const bool use_mmap = args.flag({"--mmap"});
    const std::vector<std::string> remotes = args.values({"--remote"});
    const std::optional<std::string> device_name = args.value({"--device"});
    if (Status st = args.finish(); !st) return fail("bench", st.message());
    if (!model_path) return fail("bench", "-m MODEL is required");
    if (fmt != "md" && fmt != "json") return fail("bench", "-o must be md or json");
    if (n_prompt < 0 || n_gen < 0 || reps < 1) return fail("bench", "-p/-n must be >= 0, -r >= 1");

    SessionOptions so;
    so.n_threads = static_cast<int>(threads);
    Expected<Type> kv_type = parse_kv_type(kv);
    if (!kv_type) return fail("bench", kv_type.message());
    so.kv_type = *kv_type;
    Expected<Device*> dev = pick_device(remotes, device_name);
    if (!dev) return fail("bench", dev.message());
    ModelOptions mo;
    if (*dev) mo.devices.push_back(*dev);
    mo.mmap = use_mmap;
    so.n_batch = static_cast<int32_t>(std::max<long long>(n_prompt, 1));
    so.n_ctx = static_cast<int32_t>(std::max<long long>(n_prompt, n_gen) + 16);

    Expected<std::unique_ptr<LlamaModel>> model = load_model(*model_path, mo);
    if (!model) return fail("bench", model.message());
    Expected<std::unique_ptr<LlamaSession>> sess = LlamaSession::create(**model, so);
    if (!sess) return fail("bench", sess.message());
    const int32_t n_vocab = (*model)->hparams().n_vocab;

    std::vector<Result> results;
    if (n_prompt > 0)
        results.push_back({strfmt("pp%lld", n_prompt), static_cast<int>(n_prompt), {}});
    if (n_gen > 0) results.push_back({strfmt("tg%lld", n_gen), static_cast<int>(n_gen), {}});
    for (Result& r : results) {
        const bool pp = r.test[0] == 'p';
        for (long long i = 0; i <= reps; i++) {
            double tps = 0;
            Status st = pp ? run_pp(**sess, r.n_tokens, n_vocab, &tps)
                           : run_tg(**sess, r.n_tokens, n_vocab, &tps);
            if (!st) return fail("bench", st.message());
            if (i > 0) r.tps.push_back(tps);  // the first run warms up
        }
    }
    const LlamaModel& m = **model;
    const int nth = threads > 0
                        ? static_cast<int>(threads)
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const std::string model_desc =
        strfmt("llama %s %s", human_params(static_cast<double>(m.n_params())).c_str(),
               m.type_desc().c_str());
    const std::string dev_name = m.device()->name();
    const size_t peak = peak_rss_bytes();
    if (fmt == "md") {
        std::printf("| model | size | params | device | threads | test | t/s |\n");
        std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
        for (const Result& r : results) {
            std::printf("| %s | %s | %s | %s | %d | %s | %.2f ± %.2f |\n", model_desc.c_str(),
                        human_size(static_cast<double>(m.size_bytes())).c_str(),
                        human_params(static_cast<double>(m.n_params())).c_str(), dev_name.c_str(),
                        nth, r.test.c_str(), r.mean(), r.sd());
        }
        std::printf("\npeak memory (max RSS): %s\n", human_size(static_cast<double>(peak)).c_str());
    } else {
        std::printf("[\n");
        for (size_t i = 0; i < results.size(); i++) {
            const Result& r = results[i];
            std::printf(
                "  {\"model\": \"%s\", \"model_size\": %llu, \"n_params\": %llu, "
                "\"device\": \"%s\", \"threads\": %d, \"test\": \"%s\", "
                "\"avg_ts\": %.4f, \"stddev_ts\": %.4f, \"samples_ts\": [",
                model_desc.c_str(), static_cast<unsigned long long>(m.size_bytes()),
                static_cast<unsigned long long>(m.n_params()), dev_name.c_str(), nth,
                r.test.c_str(), r.mean(), r.sd());
            for (size_t j = 0; j < r.tps.size(); j++)
                std::printf("%s%.4f", j ? ", " : "", r.tps[j]);
            std::printf("], \"peak_rss_bytes\": %zu}%s\n", peak, i + 1 < results.size() ? "," : "");
        }
        std::printf("]\n");
    }
    return 0;
}

}  // namespace
FERRY_COMMAND(bench, "bench", "measure prompt and generation throughput (llama-bench style)",
              cmd_bench);
}  // namespace ferry::cli
