// MUL_MAT on the CPU backend at LLM shapes, for every weight type.
//
//   bench_mul_mat [--type q4_0,q8_0,...] [-t THREADS] [--reps R] [--shapes KxM,...]
//                 [--n 1,512] [--cold-mib MIB] [-o md]
//
// Weights [K, M] of each type are filled by quantizing random data; b [K, N] is F32. Each
// repetition runs one graph on the CPU backend and the median time per MUL_MAT is reported with
// GFLOP/s (2 K M N / t) and weight bandwidth (weight bytes / t).
//
// Decode shapes (N < 8) are memory-bound, and one weight matrix of these sizes fits in the
// 32 MiB L3 of the machines we use; to measure streaming from DRAM as a model does, the graph
// for N < 8 holds as many copies of the weights (each its own MUL_MAT node, like the layers of
// a model) as fill --cold-mib (default 512 MiB), and the time per node is reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu-backend.h"
#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/backends.h"
#include "ferry/graph.h"
#include "ferry/tensor.h"

using namespace ferry;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos <= s.size()) {
        const size_t e = s.find(sep, pos);
        out.push_back(s.substr(pos, e == std::string::npos ? std::string::npos : e - pos));
        if (e == std::string::npos) break;
        pos = e + 1;
    }
    return out;
}

struct Options {
    std::vector<Type> types;
    int threads = 2;
    int reps = 10;
    std::vector<std::pair<int64_t, int64_t>> shapes = {{2048, 2048}, {2048, 8192}, {8192, 2048}};
    std::vector<int64_t> ns = {1, 512};
    double cold_mib = 512;
    bool md = false;
};

[[noreturn]] void usage(const char* msg) {
    std::fprintf(stderr,
                 "error: %s\nusage: bench_mul_mat [--type T,...] [-t N] [--reps R] "
                 "[--shapes KxM,...] [--n N,...] [--cold-mib MIB] [-o md]\n",
                 msg);
    std::exit(2);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) usage(("missing value after " + a).c_str());
            return argv[++i];
        };
        if (a == "--type") {
            for (const std::string& n : split(next(), ',')) {
                Expected<Type> t = type_from_name(n.c_str());
                if (!t) usage(t.message().c_str());
                o.types.push_back(*t);
            }
        } else if (a == "-t") {
            o.threads = std::atoi(next().c_str());
        } else if (a == "--reps") {
            o.reps = std::max(1, std::atoi(next().c_str()));
        } else if (a == "--shapes") {
            o.shapes.clear();
            for (const std::string& s : split(next(), ',')) {
                const auto km = split(s, 'x');
                if (km.size() != 2) usage(("bad shape " + s).c_str());
                o.shapes.emplace_back(std::atoll(km[0].c_str()), std::atoll(km[1].c_str()));
            }
        } else if (a == "--n") {
            o.ns.clear();
            for (const std::string& s : split(next(), ',')) o.ns.push_back(std::atoll(s.c_str()));
        } else if (a == "--cold-mib") {
            o.cold_mib = std::atof(next().c_str());
        } else if (a == "-o") {
            o.md = next() == "md";
        } else {
            usage(("unknown argument " + a).c_str());
        }
    }
    if (o.types.empty()) {
        o.types = {Type::F32,  Type::F16,    Type::BF16,   Type::Q4_0, Type::Q4_1, Type::Q5_0,
                   Type::Q5_1, Type::Q8_0,   Type::Q2_K,   Type::Q3_K, Type::Q4_K, Type::Q5_K,
                   Type::Q6_K, Type::IQ4_NL, Type::IQ4_XS, Type::MXFP4};
    }
    return o;
}

struct Result {
    double ms = 0;      // median wall time per MUL_MAT
    double cpu_ms = 0;  // median CPU time per MUL_MAT, all threads together
    int copies = 1;
};

double cpu_now_ms() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

Expected<Result> run_case(Type t, int64_t K, int64_t M, int64_t N, const Options& o) {
    const size_t wbytes = row_size(t, K) * static_cast<size_t>(M);
    int copies = 1;
    if (N < 8) {
        copies =
            static_cast<int>(std::max(1.0, o.cold_mib * 1048576.0 / static_cast<double>(wbytes)));
    }
    Context ctx;
    std::vector<Tensor*> ws;
    for (int i = 0; i < copies; i++) ws.push_back(ctx.new_tensor(t, {K, M}));
    Tensor* b = ctx.new_tensor(Type::F32, {K, N});
    std::vector<Tensor*> outs;
    for (Tensor* w : ws) {
        Tensor* out = ctx.mul_mat(w, b);
        out->flags |= kTensorOutput;
        outs.push_back(out);
    }
    auto buf = allocate_context_tensors(ctx, cpu::host_buffer_type());
    if (!buf) return buf.status();

    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(K));
    const size_t rs = row_size(t, K);
    auto* w0 = static_cast<uint8_t*>(ws[0]->data);
    for (int64_t r = 0; r < M; r++) {
        for (float& x : row) x = dist(rng);
        FERRY_TRY(from_float_row(t, row.data(), w0 + r * rs, K));
    }
    for (int i = 1; i < copies; i++) std::memcpy(ws[i]->data, w0, wbytes);
    // As the model loader does: the CPU device may repack the weights once
    // (FERRY_CPU_REPACK=0: not).
    for (Registry* reg : registries()) {
        for (Device* d : reg->devices()) {
            if (d->type() == DeviceType::CPU) FERRY_TRY(d->prepare_weights(ws));
        }
    }
    auto* bp = static_cast<float*>(b->data);
    for (int64_t i = 0; i < K * N; i++) bp[i] = dist(rng);

    Graph g;
    for (Tensor* out : outs) g.build_forward(out);
    auto be = cpu::make_cpu_backend(o.threads);
    FERRY_TRY(be->compute(g));  // warm-up
    std::vector<double> times, cpu;
    for (int rep = 0; rep < o.reps; rep++) {
        const double c0 = cpu_now_ms();
        const auto t0 = std::chrono::steady_clock::now();
        FERRY_TRY(be->compute(g));
        const auto t1 = std::chrono::steady_clock::now();
        cpu.push_back((cpu_now_ms() - c0) / copies);
        times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / copies);
    }
    std::sort(times.begin(), times.end());
    std::sort(cpu.begin(), cpu.end());
    Result res;
    res.ms = times[times.size() / 2];
    res.cpu_ms = cpu[cpu.size() / 2];
    res.copies = copies;
    return res;
}

}  // namespace

int main(int argc, char** argv) {
    ferry::init_backends();
    const Options o = parse(argc, argv);
    if (o.md) {
        std::printf(
            "| type | K | M | N | copies | median ms | GFLOP/s | weight GB/s | cpu ms "
            "| GFLOP/s per core | GB/s per core |\n");
        std::printf(
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    } else {
        std::printf("%-6s %6s %6s %5s %6s %10s %9s %11s %9s %10s %9s\n", "type", "K", "M", "N",
                    "copies", "median_ms", "GFLOP/s", "weight_GB/s", "cpu_ms", "GFLOP/s/c",
                    "GB/s/c");
    }
    for (Type t : o.types) {
        for (const auto& [K, M] : o.shapes) {
            for (int64_t N : o.ns) {
                if (K % block_size(t) != 0) continue;
                Expected<Result> r = run_case(t, K, M, N, o);
                if (!r) {
                    std::fprintf(stderr, "%s %lldx%lld N=%lld: %s\n", type_name(t),
                                 static_cast<long long>(K), static_cast<long long>(M),
                                 static_cast<long long>(N), r.message().c_str());
                    return 1;
                }
                const double s = r->ms / 1e3;
                const double gflops = 2.0 * K * M * N / s / 1e9;
                const double gbs = static_cast<double>(row_size(t, K)) * M / s / 1e9;
                // Per CPU-second of work: what one core delivers when it is not shared.
                const double cs = r->cpu_ms / 1e3;
                const double gflops_c = 2.0 * K * M * N / cs / 1e9;
                const double gbs_c = static_cast<double>(row_size(t, K)) * M / cs / 1e9;
                if (o.md) {
                    std::printf(
                        "| %s | %lld | %lld | %lld | %d | %.3f | %.1f | %.2f | %.3f | %.1f "
                        "| %.2f |\n",
                        type_name(t), static_cast<long long>(K), static_cast<long long>(M),
                        static_cast<long long>(N), r->copies, r->ms, gflops, gbs, r->cpu_ms,
                        gflops_c, gbs_c);
                } else {
                    std::printf(
                        "%-6s %6lld %6lld %5lld %6d %10.3f %9.1f %11.2f %9.3f %10.1f %9.2f\n",
                        type_name(t), static_cast<long long>(K), static_cast<long long>(M),
                        static_cast<long long>(N), r->copies, r->ms, gflops, gbs, r->cpu_ms,
                        gflops_c, gbs_c);
                }
                std::fflush(stdout);
            }
        }
    }
    return 0;
}
