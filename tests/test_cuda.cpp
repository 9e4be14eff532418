// The CUDA backend on a real GPU: every op against the float64 reference, the tiny-llama logits
// against the oracle, the CPU fallback, device-side index checks, events, pinned buffers and
// CUDA-graph replay. Without a GPU (or without the CUDA backend built) these report SKIPPED.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu-backend.h"
#include "core/json.h"
#include "core/parallel.h"
#include "core/top-k.h"
#include "device-checks.h"
#include "ferry/backend.h"
#include "ferry/gen-model.h"
#include "ferry/gguf.h"
#include "ferry/llama.h"
#include "ferry/op-tests.h"
#include "ferry/remote.h"
#include "ferry/scheduler.h"
#include "host-device.h"
#include "test_remote_util.h"
#ifdef FERRY_HAVE_CUDA
#include "backends/cuda/cuda-backend.h"
#include "backends/cuda/ops/persist.h"
#endif

using namespace ferry;
using namespace ferry::test;

namespace {

// Deterministic values in [-1, 1) (a linear congruential generator): the same inputs on every
// machine, for GPU results compared with the CPU's or with themselves.
struct Lcg {
    uint32_t seed;
    float operator()() {
        seed = seed * 1664525u + 1013904223u;
        return static_cast<float>(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
};

// Two weight matrices (e.g. gate and up) of M rows of K random values, quantized to t.
// Threads for the CPU's share of a test (the device machine has 16 cores; the tests skip
// where there is no GPU): quantizing the random weights and the CPU backend's reference
// products took most of the product tests' time (stop 43).
int host_threads() {
    return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 16u));
}
std::unique_ptr<Backend> reference_cpu() {
    return cpu::make_cpu_backend(host_threads());
}

// M rows of K random values (one Lcg sequence, row by row) in type t; the rows are quantized
// on host_threads() threads, each alone, so the bytes do not depend on their number.
bool random_weights(Type t, int64_t K, int64_t M, Lcg& rnd, std::vector<uint8_t>& w) {
    std::vector<float> wf(static_cast<size_t>(K * M));
    for (float& v : wf) v = rnd();
    const size_t rs = row_size(t, K);
    w.resize(static_cast<size_t>(M) * rs);
    return static_cast<bool>(parallel_items(M, host_threads(), [&](int64_t r) {
        return from_float_row(t, wf.data() + r * K, w.data() + static_cast<size_t>(r) * rs, K);
    }));
}
bool random_weight_pair(Type t, int64_t K, int64_t M, Lcg& rnd, std::vector<uint8_t> (&wb)[2]) {
    return random_weights(t, K, M, rnd, wb[0]) && random_weights(t, K, M, rnd, wb[1]);
}

// y = W0 x (or SWIGLU(W0 x, W1 x)) [+ r] for one column x, computed by `be` in buffers of
// `bt`, the output poisoned with NaN first (every element must be written): the decode
// products the int8 kernel's forms are compared on.
struct ProductCase {
    Type t;
    int64_t K, M;
    std::vector<uint8_t> wb[2];  // W0, W1 in type t
    std::vector<float> xv, rv;   // x (K values), r (M values)
};

bool random_product(Type t, int64_t K, int64_t M, Lcg& rnd, ProductCase& c) {
    c.t = t;
    c.K = K;
    c.M = M;
    if (!random_weight_pair(t, K, M, rnd, c.wb)) return false;
    c.xv.resize(static_cast<size_t>(K));
    c.rv.resize(static_cast<size_t>(M));
    for (float& v : c.xv) v = rnd();
    for (float& v : c.rv) v = rnd();
    return true;
}

std::vector<float> decode_product(Backend* be, BufferType* bt, const ProductCase& c, bool glu,
                                  bool with_add) {
    const Type t = c.t;
    const int64_t K = c.K, M = c.M;
    const auto& wb = c.wb;
    const std::vector<float>& xv = c.xv;
    const std::vector<float>& rv = c.rv;
    Context in, gc;
    Tensor* w0 = in.new_tensor(t, {K, M});
    Tensor* w1 = in.new_tensor(t, {K, M});
    Tensor* x = in.new_tensor(Type::F32, {K, 1});
    Tensor* r = in.new_tensor(Type::F32, {M, 1});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, bt);
    EXPECT_TRUE(buf) << buf.message();
    if (!buf || !tensor_set(w0, wb[0].data(), wb[0].size()) ||
        !tensor_set(w1, wb[1].data(), wb[1].size()) || !tensor_set(x, xv.data(), xv.size() * 4) ||
        !tensor_set(r, rv.data(), rv.size() * 4)) {
        ADD_FAILURE() << "decode_product: inputs";
        return {};
    }
    Tensor* y = glu ? gc.swiglu(gc.mul_mat(w0, x), gc.mul_mat(w1, x)) : gc.mul_mat(w0, x);
    if (with_add) y = gc.add(y, r);
    y->flags |= kTensorOutput;
    Graph g;
    g.build_forward(y);
    GraphAllocator alloc(bt);
    std::vector<float> out(static_cast<size_t>(M), std::nanf(""));
    if (!alloc.allocate(g) || !tensor_set(y, out.data(), out.size() * 4) || !be->compute(g) ||
        !be->synchronize() || !tensor_get(y, out.data(), out.size() * 4)) {
        ADD_FAILURE() << "decode_product: compute";
        return {};
    }
    return out;
}

// Normalized squared error of a against the reference b (NaN in a fails every bound).
double nmse_of(const std::vector<float>& a, const std::vector<float>& b) {
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        const double d = static_cast<double>(a[i]) - b[i];
        err += d * d;
        ref += static_cast<double>(b[i]) * b[i];
    }
    return a.size() == b.size() && !a.empty() ? err / ref : std::nan("");
}

Device* gpu() {
    return find_device("CUDA0");
}

// The product of c on the GPU twice, with the switches off0 and then off1 set while each backend
// is made ("NAME": NAME=0; or "NAME=VALUE"; only those read per backend take effect: docs/cuda.md,
// "Switches"), and on the CPU (`cpu_be`): outs[0], outs[1], outs[2] (empty on failure).
void gpu_forms_and_cpu(Backend* cpu_be, const ProductCase& c, bool glu, bool with_add,
                       std::initializer_list<const char*> off0,
                       std::initializer_list<const char*> off1, std::vector<float> (&outs)[3]) {
    for (int d = 0; d < 2; d++) {
        outs[d].clear();
        std::vector<std::string> names;
        for (const char* e : d == 0 ? off0 : off1) {
            const std::string s = e;
            const size_t eq = s.find('=');
            names.push_back(s.substr(0, eq));
            setenv(names.back().c_str(), eq == std::string::npos ? "0" : s.c_str() + eq + 1, 1);
        }
        Expected<std::unique_ptr<Backend>> gbe = gpu()->make_backend();
        for (const std::string& name : names) unsetenv(name.c_str());
        if (!gbe) {
            ADD_FAILURE() << gbe.message();
            return;
        }
        outs[d] = decode_product(gbe->get(), gpu()->buffer_type(), c, glu, with_add);
    }
    outs[2] = decode_product(cpu_be, cpu::host_buffer_type(), c, glu, with_add);
}

#define REQUIRE_GPU()                                                 \
    do {                                                              \
        if (!gpu()) GTEST_SKIP() << "no CUDA device (CUDA0) present"; \
    } while (0)

TEST(CudaRegistry, ListsDevicesWithoutFailing) {
    // Whatever the machine: listing devices never fails, and every CUDA device has memory.
    for (Device* d : all_devices()) {
        if (std::string(d->name()).rfind("CUDA", 0) != 0) continue;
        EXPECT_EQ(d->type(), DeviceType::GPU);
        const DeviceMemory m = d->memory();
        EXPECT_GT(m.total, 0u) << d->name();
        EXPECT_LE(m.free, m.total) << d->name();
        std::printf("[ cuda     ] %s: %s, %.0f / %.0f MiB free\n", d->name(),
                    d->description().c_str(), m.free / 1048576.0, m.total / 1048576.0);
    }
#ifndef FERRY_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#endif
}

TEST(Cuda, EveryOpMatchesTheReference) {
    REQUIRE_GPU();
    Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
    ASSERT_TRUE(be) << be.message();
    const test::OpSuiteCounts n = test::run_op_suite(be->get(), "cuda");
    EXPECT_EQ(n.failed, 0);
    EXPECT_GT(n.passed, 0);
}

// ---------------------------------------------------------------------------------------------
// tiny-llama against the float64 oracle (as tests/test_llama.cpp, with the weights on CUDA0).

class CudaOracle : public ::testing::TestWithParam<Peer> {};

TEST_P(CudaOracle, AtLeastAsCloseAsPeerWithF16Cache) {
    REQUIRE_GPU();
    expect_at_least_as_close_as_peer(GetParam(), gpu(), "cuda");
}

INSTANTIATE_TEST_SUITE_P(Encodings, CudaOracle, ::testing::ValuesIn(peers_but_q5_k_m()), peer_name);

// q5_k_m: one top-1 position short of the peer on an oracle near-tie, closer by mean KL
// (device-checks.h and KQuantLogitsAreExactArithmeticOnTheSameWeights below say why).
TEST(Cuda, Q5KMBeatsThePeersKLButIsOneTop1PositionShort) {
    REQUIRE_GPU();
    expect_q5_k_m_one_top1_position_short(gpu(), "cuda");
}

TEST(Cuda, F32WithF32CacheMatchesOracle) {
    REQUIRE_GPU();
    const Metrics r = measure("f32", Type::F32, gpu());
    ASSERT_TRUE(r.ok);
    std::printf("[ cuda     ] f32 kv f32: nmse max %.2e  top1 min %.3f  KL mean %.2e\n", r.nmse_max,
                r.top1_min, r.kl_mean);
    EXPECT_LE(r.nmse_max, 1e-8);
    EXPECT_EQ(r.top1_min, 1.0);
}

// The model at `path` with its layers shared between `devs` and a session with a `kv` cache,
// with the backend's environment switches `env` ("NAME=VALUE") set while they are made;
// `s` is null (the failure recorded) when either could not be made.
struct OpenSession {
    std::unique_ptr<LlamaModel> m;
    std::unique_ptr<LlamaSession> s;
};
OpenSession open_session(const std::string& path, const std::vector<Device*>& devs, Type kv,
                         const std::vector<std::string>& env = {}, int32_t n_ctx = 0) {
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    OpenSession o;
    ModelOptions mo;
    mo.devices = devs;
    Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(path, mo);
    EXPECT_TRUE(m) << m.message();
    SessionOptions so;
    so.kv_type = kv;
    so.n_threads = 2;
    so.n_ctx = n_ctx;
    Expected<std::unique_ptr<LlamaSession>> s =
        m ? LlamaSession::create(**m, so) : Expected<std::unique_ptr<LlamaSession>>(m.status());
    for (const std::string& e : env) unsetenv(e.substr(0, e.find('=')).c_str());
    EXPECT_TRUE(s) << s.message();
    if (s) {
        o.m = std::move(*m);
        o.s = std::move(*s);
    }
    return o;
}

// A model of preset p and weight type `type` generated into the test's temporary folder (its
// path; empty, the failure recorded, when it could not be made) and n_toks token ids drawn
// from `seed`.
std::string generated_model(const ModelPreset& p, uint32_t seed, std::vector<int32_t>* toks,
                            size_t n_toks = 300, Type type = Type::F16) {
    GenModelOptions o;
    o.type = type;
    o.n_threads = 2;
    const std::string path =
        ::testing::TempDir() + "/ferry-" + p.name + "-" + type_name(type) + ".gguf";
    const Status st = generate_model(p, o, path);
    EXPECT_TRUE(st) << st.message();
    toks->resize(n_toks);
    Lcg rnd{seed};
    for (int32_t& t : *toks) {
        t = static_cast<int32_t>((rnd() + 1.0f) * 0.5f * static_cast<float>(p.n_vocab - 1));
    }
    return st ? path : std::string();
}

// Every position's logits of every prompt of the model at `path` with its layers shared
// between `devs`: each prompt at once, or (`stepwise`) one token at a time (the decode kernels
// and their fusions, CUDA-graph replay), with the backend's environment switches `env` set
// while the model and session are made.
std::vector<std::vector<float>> session_logits(const std::string& path,
                                               const std::vector<Device*>& devs, Type kv,
                                               bool stepwise,
                                               const std::vector<std::string>& env = {}) {
    std::vector<std::vector<float>> out;
    const OpenSession os = open_session(path, devs, kv, env);
    if (!os.s) return out;
    LlamaSession* s = os.s.get();
    for (const Case& c : cases()) {
        s->reset();
        std::vector<float> rows;
        if (stepwise) {
            for (int32_t t : c.tokens) {
                const Status st = s->decode(std::span<const int32_t>(&t, 1), false);
                EXPECT_TRUE(st) << st.message();
                if (!st) return {};
                rows.insert(rows.end(), s->logits(0), s->logits(0) + kVocab);
            }
        } else {
            const Status st = s->decode(c.tokens, true);
            EXPECT_TRUE(st) << st.message();
            if (!st) return {};
            for (size_t i = 0; i < c.tokens.size(); i++) {
                const float* r = s->logits(static_cast<int32_t>(i));
                rows.insert(rows.end(), r, r + kVocab);
            }
        }
        out.push_back(std::move(rows));
    }
    return out;
}

// Every position's logits of every prompt, one model path, one device, one KV type.
std::vector<std::vector<float>> prompt_logits(const std::string& path, Type kv, Device* dev) {
    return session_logits(path, {dev}, kv, false);
}

// The same model, prompts and binary give the same logits, bit for bit, every time (a race
// showed first as q8_0's distance to the oracle moving between runs).
TEST(Cuda, SameLogitsEveryRun) {
    REQUIRE_GPU();
    for (const char* enc : {"q8_0", "q4_0", "f16"}) {
        const std::string path = kDir + "/tiny-llama-" + enc + ".gguf";
        const std::vector<std::vector<float>> first = prompt_logits(path, Type::F16, gpu());
        ASSERT_EQ(first.size(), cases().size()) << enc;
        for (int rep = 1; rep < 4; rep++) {
            EXPECT_EQ(prompt_logits(path, Type::F16, gpu()), first) << enc << " run " << rep;
        }
    }
}

// Every position of every prompt decoded one token at a time on CUDA0, with the backend's
// environment switches `env` set while the session is made.
std::vector<std::vector<float>> step_logits(const std::string& enc,
                                            const std::vector<std::string>& env) {
    return session_logits(kDir + "/tiny-llama-" + enc + ".gguf", {gpu()}, Type::F16, true, env);
}

// Token-by-token decode with every fusion on gives what it gives with none (the fused
// kernels do the same arithmetic), and lands as close to the oracle as the peer.
TEST(Cuda, FusedDecodeMatchesUnfusedAndTheOracle) {
    REQUIRE_GPU();
    for (const Peer& p : kPeers) {
        const std::string enc = p.enc;
        if (enc != "q8_0" && enc != "q4_0" && enc != "q4_k_m" && enc != "f16" && enc != "f32") {
            continue;  // f16 and f32: the float kernel's fusions; the others: the int8 kernel's
        }
        static const std::vector<std::string> kOff = {"FERRY_CUDA_FUSION=0"};
        // The float kernel's folded norm is off by default: asked for here, so it is checked.
        static const std::vector<std::string> kOn = {"FERRY_CUDA_MV_FNORM=1"};
        const std::vector<std::vector<float>> on = step_logits(enc, kOn);
        const std::vector<std::vector<float>> off = step_logits(enc, kOff);
        ASSERT_EQ(on.size(), cases().size()) << enc;
        ASSERT_EQ(off.size(), cases().size()) << enc;
        double kl = 0.0, worst = 0.0;
        size_t rows = 0;
        for (size_t k = 0; k < cases().size(); k++) {
            double err = 0.0, ref = 0.0;
            for (size_t i = 0; i < on[k].size(); i++) {
                const double d = static_cast<double>(on[k][i]) - off[k][i];
                err += d * d;
                ref += static_cast<double>(off[k][i]) * off[k][i];
            }
            worst = std::max(worst, err / ref);
            for (size_t i = 0; i < cases()[k].tokens.size(); i++, rows++) {
                kl += kl_row(cases()[k].logits.data() + i * kVocab, on[k].data() + i * kVocab,
                             kVocab);
            }
        }
        kl /= static_cast<double>(rows);
        std::printf(
            "[ cuda     ] %-7s step by step: fused vs unfused nmse max %.2e, KL mean %.2e "
            "(peer %.2e)\n",
            enc.c_str(), worst, kl, p.kl_mean);
        EXPECT_LE(worst, 1e-10) << enc;
        EXPECT_LE(kl, p.kl_mean) << enc;
    }
}

// Why q5_k_m lands one top-1 position under the peer: the GPU multiplies fp32 activations
// with the exact dequantized weights, and so does the CPU when handed the same weights as F32
// (no activation quantization anywhere). Both give the same logits and the same argmax at
// every position, so the GPU's top-1 is what exact arithmetic on these weights gives: the
// position it loses (prompt 0, position 2) is a near-tie in the oracle itself (margin 0.0074),
// which the peer's and the CPU's q8 activation rounding happen to resolve the other way.
TEST(Cuda, KQuantLogitsAreExactArithmeticOnTheSameWeights) {
    REQUIRE_GPU();
    Device* cpu = find_device("CPU");
    ASSERT_NE(cpu, nullptr);
    const std::string src = kDir + "/tiny-llama-q5_k_m.gguf";
    const std::string deq = ::testing::TempDir() + "/tiny-llama-q5_k_m-as-f32.gguf";
    {
        Expected<std::unique_ptr<GgufFile>> f = GgufFile::open(src);
        ASSERT_TRUE(f) << f.message();
        GgufWriter w;
        for (const GgufKV& kv : (*f)->kvs()) w.add_kv(kv.key, kv.value);
        for (const GgufTensorInfo& t : (*f)->tensors()) {
            const uint8_t* p = (*f)->tensor_data(t);
            if (!is_quantized(t.type)) {
                ASSERT_TRUE(w.add_tensor(t.name, t.type, t.n_dims, t.ne, p, t.nbytes));
                continue;
            }
            const int64_t n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
            std::vector<float> v(static_cast<size_t>(n));
            ASSERT_TRUE(to_float_row(t.type, p, v.data(), n));
            ASSERT_TRUE(w.add_tensor(t.name, Type::F32, t.n_dims, t.ne, v.data(),
                                     v.size() * sizeof(float)));
        }
        ASSERT_TRUE(w.write(deq));
    }
    const std::vector<std::vector<float>> g = prompt_logits(src, Type::F32, gpu());
    const std::vector<std::vector<float>> c = prompt_logits(deq, Type::F32, cpu);
    std::remove(deq.c_str());
    ASSERT_EQ(g.size(), cases().size());
    ASSERT_EQ(c.size(), cases().size());
    for (size_t k = 0; k < cases().size(); k++) {
        double err = 0.0, ref = 0.0;
        int agree_gc = 0, agree_go = 0, agree_co = 0;
        const size_t n = cases()[k].tokens.size();
        for (size_t i = 0; i < n; i++) {
            const float* gr = g[k].data() + i * kVocab;
            const float* cr = c[k].data() + i * kVocab;
            const float* orc = cases()[k].logits.data() + i * kVocab;
            const auto ag = std::max_element(gr, gr + kVocab) - gr;
            const auto ac = std::max_element(cr, cr + kVocab) - cr;
            const auto ao = std::max_element(orc, orc + kVocab) - orc;
            agree_gc += ag == ac;
            agree_go += ag == ao;
            agree_co += ac == ao;
            for (int j = 0; j < kVocab; j++) {
                const double d = static_cast<double>(gr[j]) - cr[j];
                err += d * d;
                ref += static_cast<double>(cr[j]) * cr[j];
            }
        }
        std::printf(
            "[ cuda     ] q5_k_m prompt %zu: GPU vs CPU-on-F32-weights nmse %.2e, "
            "top1 vs oracle GPU %d/%zu CPU-on-F32-weights %d/%zu\n",
            k, err / ref, agree_go, n, agree_co, n);
        EXPECT_LE(err / ref, 1e-8) << "prompt " << k;
        EXPECT_EQ(static_cast<size_t>(agree_gc), n) << "prompt " << k;
        EXPECT_EQ(agree_go, agree_co) << "prompt " << k;
    }
}

#ifdef FERRY_HAVE_CUDA
// An op the GPU declines runs on the CPU: the graph splits across the two devices and the
// logits stay as close to the oracle.
TEST(Cuda, DeclinedOpFallsBackToTheCpu) {
    REQUIRE_GPU();
    expect_declined_rms_norm_runs_on_the_cpu(gpu(), cuda::set_declined_ops, "cuda");
}
#endif

// A row index out of range is reported as an error naming the op and the index; nothing is
// written, and the device keeps working.
// TOP_K on rows the op suite cannot fill: a Llama 3 vocabulary of values on a coarse grid (long
// runs of ties), NaN, -0 and +0, -inf, rows shorter than k's parts; k from 1 to the kernel's
// largest. The CPU's selection (core/top-k.h, the same one the sampler uses) is the reference:
// every value and index must match.
TEST(Cuda, TopKMatchesTheCpuOnHardRows) {
    REQUIRE_GPU();
    Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
    ASSERT_TRUE(be) << be.message();
    Lcg rnd{17};
    const float nan = std::nanf(""), inf = INFINITY;
    for (int64_t n : {int64_t{100}, int64_t{4097}, int64_t{128256}}) {
        for (int32_t k : {1, 40, 256, 1024}) {
            if (k > n) continue;
            SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k);
            const int64_t rows = 3;
            std::vector<float> av(static_cast<size_t>(n * rows));
            for (size_t i = 0; i < av.size(); i++) {
                const float u = rnd();
                av[i] = std::round(u * 8.0f) / 4.0f;  // 33 distinct values: ties everywhere
                if (u > 0.995f) av[i] = nan;
                if (u < -0.995f) av[i] = -inf;
                if (av[i] == 0.0f && (i % 2)) av[i] = -0.0f;
            }
            Context in, gc;
            Tensor* a = in.new_tensor(Type::F32, {n, rows});
            Expected<std::unique_ptr<Buffer>> buf =
                allocate_context_tensors(in, gpu()->buffer_type());
            ASSERT_TRUE(buf) << buf.message();
            ASSERT_TRUE(tensor_set(a, av.data(), av.size() * 4));
            Tensor* t = gc.top_k(a, k);
            t->flags |= kTensorOutput;
            ASSERT_TRUE(gpu()->supports_op(t));
            Graph g;
            g.build_forward(t);
            GraphAllocator alloc(gpu()->buffer_type());
            ASSERT_TRUE(alloc.allocate(g));
            ASSERT_TRUE((*be)->compute(g));
            ASSERT_TRUE((*be)->synchronize());
            std::vector<float> out(static_cast<size_t>(2 * k * rows));
            ASSERT_TRUE(tensor_get(t, out.data(), out.size() * 4));
            std::vector<std::pair<float, int32_t>> want;
            for (int64_t r = 0; r < rows; r++) {
                top_k_of(av.data() + r * n, static_cast<size_t>(n), static_cast<size_t>(k), want);
                const float* o = out.data() + r * 2 * k;
                for (int32_t j = 0; j < k; j++) {
                    ASSERT_EQ(o[j], want[static_cast<size_t>(j)].first) << "row " << r << " " << j;
                    ASSERT_EQ(o[k + j], static_cast<float>(want[static_cast<size_t>(j)].second))
                        << "row " << r << " " << j;
                }
            }
        }
    }
}

TEST(Cuda, OutOfRangeIndexIsAnError) {
    REQUIRE_GPU();
    Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
    ASSERT_TRUE(be) << be.message();
    Context in, gc;
    Tensor* a = in.new_tensor(Type::F32, {8, 11});
    Tensor* idx = in.new_tensor(Type::I32, {3});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, gpu()->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    std::vector<float> av(88);
    for (size_t i = 0; i < av.size(); i++) av[i] = static_cast<float>(i) + 0.5f;
    ASSERT_TRUE(tensor_set(a, av.data(), av.size() * 4));
    Tensor* rows = gc.get_rows(a, idx);
    rows->flags |= kTensorOutput;
    Graph g;
    g.build_forward(rows);
    GraphAllocator alloc(gpu()->buffer_type());
    ASSERT_TRUE(alloc.allocate(g));
    for (int bad : {11, -1}) {
        const int32_t iv[3] = {1, bad, 2};
        ASSERT_TRUE(tensor_set(idx, iv, sizeof(iv)));
        Status st = (*be)->compute(g);
        if (st) st = (*be)->synchronize();
        ASSERT_FALSE(st);
        EXPECT_NE(st.message().find("GET_ROWS index " + std::to_string(bad)), std::string::npos)
            << st.message();
    }
    const int32_t good[3] = {10, 0, 3};
    ASSERT_TRUE(tensor_set(idx, good, sizeof(good)));
    ASSERT_TRUE((*be)->compute(g));
    std::vector<float> out(24);
    ASSERT_TRUE(tensor_get(rows, out.data(), out.size() * 4));
    EXPECT_EQ(out[0], av[80]);
    EXPECT_EQ(out[8], av[0]);
    EXPECT_EQ(out[16], av[24]);
}

// The same graph computed again with new inputs (replayed as a CUDA graph from the second
// run on) gives each run's own answer.
// Run by run, the inputs go in one set_tensors_async (staged: copied by the first node of the
// next compute, inside a captured graph when it replays one) or in one set_tensor_async each,
// in the pattern `how`; every compute sees the inputs of its moment.
void replayed_graph_sees_new_inputs(const char* how) {
    Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
    ASSERT_TRUE(be) << be.message();
    Context in, gc;
    Tensor* w = in.new_tensor(Type::F32, {64, 16});
    Tensor* x = in.new_tensor(Type::F32, {64, 1});
    Tensor* r = in.new_tensor(Type::F32, {16, 1});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, gpu()->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    std::vector<float> wv(64 * 16), xv(64), rv(16);
    for (size_t i = 0; i < wv.size(); i++) wv[i] = std::sin(0.1f * static_cast<float>(i));
    ASSERT_TRUE(tensor_set(w, wv.data(), wv.size() * 4));
    Tensor* y = gc.add(gc.mul_mat(w, x), r);
    Tensor* out = gc.rms_norm(y, 1e-5f);
    out->flags |= kTensorOutput;
    Graph g;
    g.build_forward(out);
    GraphAllocator alloc(gpu()->buffer_type());
    ASSERT_TRUE(alloc.allocate(g));
    for (int run = 0; how[run]; run++) {
        SCOPED_TRACE(::testing::Message() << "run " << run << " of " << how);
        for (size_t i = 0; i < xv.size(); i++) xv[i] = std::cos(0.3f * i + run);
        for (size_t i = 0; i < rv.size(); i++) rv[i] = 0.25f * run - 0.1f * i;
        if (how[run] == 'T') {
            const TensorWrite ws[2] = {{x, xv.data(), 0, xv.size() * 4},
                                       {r, rv.data(), 0, rv.size() * 4}};
            ASSERT_TRUE((*be)->set_tensors_async(ws));
            // The sources may be reused at once.
            std::fill(xv.begin(), xv.end(), 1e30f);
            for (size_t i = 0; i < xv.size(); i++) xv[i] = std::cos(0.3f * i + run);
        } else {
            ASSERT_TRUE((*be)->set_tensor_async(x, xv.data(), 0, xv.size() * 4));
            ASSERT_TRUE((*be)->set_tensor_async(r, rv.data(), 0, rv.size() * 4));
        }
        ASSERT_TRUE((*be)->compute(g));
        std::vector<float> got(16);
        ASSERT_TRUE((*be)->get_tensor_async(out, got.data(), 0, got.size() * 4));
        ASSERT_TRUE((*be)->synchronize());
        std::vector<double> yv(16);
        double ss = 0.0;
        for (int m = 0; m < 16; m++) {
            double s = rv[static_cast<size_t>(m)];
            for (int k = 0; k < 64; k++) s += static_cast<double>(wv[m * 64 + k]) * xv[k];
            yv[static_cast<size_t>(m)] = s;
            ss += s * s;
        }
        const double inv = 1.0 / std::sqrt(ss / 16 + 1e-5);
        for (int m = 0; m < 16; m++) {
            // float sums: the error scales with the terms' magnitudes, not with the result's
            // (row 0 nearly cancels).
            double mag = std::fabs(rv[static_cast<size_t>(m)]);
            for (int k = 0; k < 64; k++)
                mag += std::fabs(static_cast<double>(wv[m * 64 + k]) * xv[k]);
            EXPECT_NEAR(got[static_cast<size_t>(m)], yv[static_cast<size_t>(m)] * inv,
                        1e-6 * mag * inv + 1e-6)
                << "run " << run << " row " << m;
        }
    }
}

TEST(Cuda, ReplayedGraphSeesNewInputs) {
    REQUIRE_GPU();
    replayed_graph_sees_new_inputs("SSSSS");
}

TEST(Cuda, ReplayedGraphSeesNewStagedInputs) {
    REQUIRE_GPU();
    replayed_graph_sees_new_inputs("TTTTTSSTTSTTT");
}

// Staged inputs (set_tensors_async) keep their place among the stream's other operations: a
// later write of the same bytes wins, a read sees them without a compute between, a second
// batch staged before the first was issued replaces nothing it should not, and a batch larger
// than the staging area goes as it is.
TEST(Cuda, StagedInputsKeepTheCallersOrder) {
    REQUIRE_GPU();
    Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
    ASSERT_TRUE(be) << be.message();
    Context in;
    Tensor* a = in.new_tensor(Type::F32, {64});
    Tensor* b = in.new_tensor(Type::I32, {3});  // 12 bytes: not a multiple of 16
    Tensor* big = in.new_tensor(Type::F32, {8192});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, gpu()->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    auto fill = [](float v) { return std::vector<float>(64, v); };
    auto read_a = [&] {
        std::vector<float> got(64);
        EXPECT_TRUE((*be)->get_tensor_async(a, got.data(), 0, 64 * 4));
        EXPECT_TRUE((*be)->synchronize());
        return got;
    };
    // Staged, then read: the read issues them first.
    std::vector<float> v1 = fill(1.0f);
    const int32_t bi[3] = {7, -8, 9};
    const TensorWrite w1[2] = {{a, v1.data(), 0, 256}, {b, bi, 0, 12}};
    ASSERT_TRUE((*be)->set_tensors_async(w1));
    EXPECT_EQ(read_a(), v1);
    int32_t bgot[3] = {};
    ASSERT_TRUE(tensor_get(b, bgot, 12));  // after the synchronize: through the buffer
    EXPECT_EQ(bgot[0], 7);
    EXPECT_EQ(bgot[1], -8);
    EXPECT_EQ(bgot[2], 9);
    // Staged, then a plain write of part of it: the plain write comes last.
    std::vector<float> v2 = fill(2.0f), v3 = fill(3.0f);
    const TensorWrite w2[1] = {{a, v2.data(), 0, 256}};
    ASSERT_TRUE((*be)->set_tensors_async(w2));
    ASSERT_TRUE((*be)->set_tensor_async(a, v3.data(), 16, 32));
    std::vector<float> want = v2;
    for (int i = 4; i < 12; i++) want[static_cast<size_t>(i)] = 3.0f;
    EXPECT_EQ(read_a(), want);
    // Two batches before anything else: both land, in order (the second at offset 8 floats).
    std::vector<float> v4 = fill(4.0f), v5 = fill(5.0f);
    const TensorWrite w4[1] = {{a, v4.data(), 0, 256}};
    const TensorWrite w5[1] = {{a, v5.data(), 32, 64}};
    ASSERT_TRUE((*be)->set_tensors_async(w4));
    ASSERT_TRUE((*be)->set_tensors_async(w5));
    want = v4;
    for (int i = 8; i < 24; i++) want[static_cast<size_t>(i)] = 5.0f;
    EXPECT_EQ(read_a(), want);
    // More than the staging area holds: copied the ordinary way, after what was staged.
    std::vector<float> v6 = fill(6.0f), vb(8192);
    for (size_t i = 0; i < vb.size(); i++) vb[i] = static_cast<float>(i);
    const TensorWrite w6[1] = {{a, v6.data(), 0, 256}};
    const TensorWrite w7[2] = {{big, vb.data(), 0, vb.size() * 4}, {a, v3.data(), 0, 16}};
    ASSERT_TRUE((*be)->set_tensors_async(w6));
    ASSERT_TRUE((*be)->set_tensors_async(w7));
    want = v6;
    for (int i = 0; i < 4; i++) want[static_cast<size_t>(i)] = 3.0f;
    EXPECT_EQ(read_a(), want);
    std::vector<float> bigot(8192);
    ASSERT_TRUE(tensor_get(big, bigot.data(), bigot.size() * 4));
    EXPECT_EQ(bigot, vb);
    // A range outside the tensor is an error naming it, and nothing is staged.
    Tensor bad = *a;
    bad.set_name("bad_input");
    const TensorWrite w8[1] = {{&bad, v1.data(), size_t{1} << 30, 256}};
    Status st = (*be)->set_tensors_async(w8);
    EXPECT_FALSE(st);
    EXPECT_NE(st.message().find("bad_input"), std::string::npos) << st.message();
    EXPECT_EQ(read_a(), want);
}

// A graph changed in place after it was captured (a view moved to other rows of its weight, an
// input leaf moved to other bytes, an op parameter) is never replayed stale: each change is
// seen by the next compute and by the replays after it, under both forms of the graph key.
TEST(Cuda, InPlaceChangesAreNeverReplayedStale) {
    REQUIRE_GPU();
    for (const char* compact : {"1", "0"}) {
        SCOPED_TRACE(::testing::Message() << "FERRY_CUDA_COMPACT_KEY=" << compact);
        setenv("FERRY_CUDA_COMPACT_KEY", compact, 1);
        Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
        unsetenv("FERRY_CUDA_COMPACT_KEY");
        ASSERT_TRUE(be) << be.message();
        Context in, gc;
        Tensor* w = in.new_tensor(Type::F32, {64, 32});
        Tensor* x1 = in.new_tensor(Type::F32, {64, 1});
        Tensor* x2 = in.new_tensor(Type::F32, {64, 1});
        Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, gpu()->buffer_type());
        ASSERT_TRUE(buf) << buf.message();
        std::vector<float> wv(64 * 32), xv1(64), xv2(64);
        for (size_t i = 0; i < wv.size(); i++) wv[i] = std::sin(0.37f * static_cast<float>(i));
        for (size_t i = 0; i < 64; i++) {
            xv1[i] = std::cos(0.2f * static_cast<float>(i));
            xv2[i] = 1.0f - 0.03f * static_cast<float>(i);
        }
        ASSERT_TRUE(tensor_set(w, wv.data(), wv.size() * 4));
        ASSERT_TRUE(tensor_set(x1, xv1.data(), 256));
        ASSERT_TRUE(tensor_set(x2, xv2.data(), 256));
        Tensor* rows = gc.view_2d(w, 64, 16, w->nb[1], 0);  // rows 0..15 of w
        Tensor* sc = gc.scale(gc.mul_mat(rows, x1), 2.0f);
        sc->flags |= kTensorOutput;
        Graph g;
        g.build_forward(sc);
        GraphAllocator alloc(gpu()->buffer_type());
        ASSERT_TRUE(alloc.allocate(g));
        int row0 = 0;
        const std::vector<float>* xv = &xv1;
        float factor = 2.0f;
        auto check = [&](const char* what) {
            for (int rep = 0; rep < 4; rep++) {  // direct, captured, replayed, replayed
                ASSERT_TRUE((*be)->compute(g)) << what;
                std::vector<float> got(16);
                ASSERT_TRUE((*be)->get_tensor_async(sc, got.data(), 0, 64));
                ASSERT_TRUE((*be)->synchronize());
                for (int m = 0; m < 16; m++) {
                    double want = 0.0, mag = 0.0;
                    for (int k = 0; k < 64; k++) {
                        const double p = static_cast<double>(wv[(row0 + m) * 64 + k]) * (*xv)[k];
                        want += p;
                        mag += std::fabs(p);
                    }
                    EXPECT_NEAR(got[static_cast<size_t>(m)], factor * want,
                                1e-5 * mag * std::fabs(factor))
                        << what << ", repetition " << rep << ", row " << m;
                }
            }
        };
        check("as built");
        rows->view_offs = 16 * w->nb[1];  // rows 16..31, as a new allocation would place it
        rows->offs = w->offs + rows->view_offs;
        row0 = 16;
        check("view moved");
        Tensor* xin = sc->src[0]->src[1];
        ASSERT_EQ(xin, x1);
        x1->offs = x2->offs;  // the input leaf now reads x2's bytes
        xv = &xv2;
        check("input moved");
        sc->set_param_f(0, -0.5f);
        factor = -0.5f;
        check("parameter changed");
    }
}

// Two graphs in the order A A A B A A B B A A (a decode step's structure, a prompt's, the decode
// again): each compute gives its own graph's result for the inputs of that moment, whether it
// ran kernel by kernel, was captured, or replayed a capture made before the other graph ran.
TEST(Cuda, AlternatingGraphsEachGiveTheirOwnResult) {
    REQUIRE_GPU();
    Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
    ASSERT_TRUE(be) << be.message();
    Context in, gc;
    Tensor* w = in.new_tensor(Type::F32, {32, 8});
    Tensor* x = in.new_tensor(Type::F32, {32, 1});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, gpu()->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    std::vector<float> wv(32 * 8), xv(32);
    for (size_t i = 0; i < wv.size(); i++) wv[i] = std::sin(0.7f * static_cast<float>(i));
    ASSERT_TRUE(tensor_set(w, wv.data(), wv.size() * 4));
    Tensor* ya = gc.mul_mat(w, x);  // A: w x
    ya->flags |= kTensorOutput;
    Tensor* yb = gc.scale(gc.mul_mat(w, x), -3.0f);  // B: -3 w x
    yb->flags |= kTensorOutput;
    Graph ga, gb;
    ga.build_forward(ya);
    gb.build_forward(yb);
    GraphAllocator alloc_a(gpu()->buffer_type()), alloc_b(gpu()->buffer_type());
    ASSERT_TRUE(alloc_a.allocate(ga));
    ASSERT_TRUE(alloc_b.allocate(gb));
    int run = 0;
    for (char which : std::string("AAABAABBAA")) {
        const bool a = which == 'A';
        for (size_t i = 0; i < xv.size(); i++) xv[i] = std::cos(0.3f * i + run);
        ASSERT_TRUE((*be)->set_tensor_async(x, xv.data(), 0, xv.size() * 4));
        ASSERT_TRUE((*be)->compute(a ? ga : gb));
        std::vector<float> got(8);
        ASSERT_TRUE((*be)->get_tensor_async(a ? ya : yb, got.data(), 0, got.size() * 4));
        ASSERT_TRUE((*be)->synchronize());
        for (int m = 0; m < 8; m++) {
            double s = 0.0, mag = 0.0;
            for (int k = 0; k < 32; k++) {
                s += static_cast<double>(wv[m * 32 + k]) * xv[k];
                mag += std::fabs(static_cast<double>(wv[m * 32 + k]) * xv[k]);
            }
            if (!a) s *= -3.0;
            EXPECT_NEAR(got[static_cast<size_t>(m)], s, 1e-5 * mag * (a ? 1 : 3) + 1e-6)
                << "compute " << run << " (" << which << ") row " << m;
        }
        run++;
    }
}

// One decode step's attention (one query per head) over n_kv F16 keys of which the first
// `visible` are unmasked (a session's padded KV view), with the backend made while the
// switches `off` are "0".
std::vector<float> decode_attention(int64_t D, int64_t n_head, int64_t n_head_kv, int64_t n_kv,
                                    int64_t visible, std::initializer_list<const char*> off) {
    for (const char* name : off) setenv(name, "0", 1);
    Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
    for (const char* name : off) unsetenv(name);
    EXPECT_TRUE(be) << be.message();
    if (!be) return {};
    Context in, gc;
    Tensor* q = in.new_tensor(Type::F32, {D, 1, n_head});
    Tensor* k = in.new_tensor(Type::F16, {D, n_kv, n_head_kv});
    Tensor* v = in.new_tensor(Type::F16, {D, n_kv, n_head_kv});
    Tensor* mask = in.new_tensor(Type::F16, {n_kv, 1});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, gpu()->buffer_type());
    EXPECT_TRUE(buf) << buf.message();
    if (!buf) return {};
    Lcg rnd{static_cast<uint32_t>(D * 7 + n_kv)};
    std::vector<float> qv(static_cast<size_t>(D * n_head));
    for (float& x : qv) x = rnd();
    std::vector<fp16_t> kv(static_cast<size_t>(D * n_kv * n_head_kv)), vv(kv.size());
    for (fp16_t& x : kv) x = fp32_to_fp16(rnd());
    for (fp16_t& x : vv) x = fp32_to_fp16(rnd());
    std::vector<fp16_t> mv(static_cast<size_t>(n_kv), fp16_t{0xfc00});  // -inf
    for (int64_t j = 0; j < visible; j++) mv[static_cast<size_t>(j)] = fp32_to_fp16(0.1f * rnd());
    if (!tensor_set(q, qv.data(), qv.size() * 4) || !tensor_set(k, kv.data(), kv.size() * 2) ||
        !tensor_set(v, vv.data(), vv.size() * 2) || !tensor_set(mask, mv.data(), mv.size() * 2)) {
        ADD_FAILURE() << "decode_attention: inputs";
        return {};
    }
    Tensor* y = gc.flash_attn_ext(q, k, v, mask, 1.0f / std::sqrt(static_cast<float>(D)));
    y->flags |= kTensorOutput;
    Graph g;
    g.build_forward(y);
    GraphAllocator alloc(gpu()->buffer_type());
    std::vector<float> out(static_cast<size_t>(D * n_head), std::nanf(""));
    if (!alloc.allocate(g) || !(*be)->compute(g) || !(*be)->synchronize() ||
        !tensor_get(y, out.data(), out.size() * 4)) {
        ADD_FAILURE() << "decode_attention: compute";
        return {};
    }
    return out;
}

// Decode attention over caches longer than one block's keys, split into blocks of 256 (D 64)
// or 128 (D 128) keys and merged, equals one block per KV head walking every key
// (FERRY_CUDA_ATTN_CHUNKS=0): only fp32 sums in another order differ. Shapes of Llama 3.2 1B
// (32 heads, 8 KV heads) and of a D = 128 model with 7 heads per KV head; caches padded as a
// session pads them, so that the last block may see few keys or none (512 keys, 129 visible:
// D 128's blocks 2 and 3 are all masked), and 257 keys (a last block of one key).
TEST(Cuda, ChunkedDecodeAttentionMatchesOneBlockPerKvHead) {
    REQUIRE_GPU();
    struct Shape {
        int64_t D, n_head, n_head_kv, n_kv, visible;
    };
    for (const Shape& s :
         {Shape{64, 32, 8, 512, 257}, Shape{64, 32, 8, 768, 300}, Shape{64, 32, 8, 1024, 1000},
          Shape{128, 14, 2, 512, 129}, Shape{128, 14, 2, 1024, 1024}, Shape{64, 32, 8, 257, 257}}) {
        const std::vector<float> chunks =
            decode_attention(s.D, s.n_head, s.n_head_kv, s.n_kv, s.visible, {});
        const std::vector<float> one = decode_attention(s.D, s.n_head, s.n_head_kv, s.n_kv,
                                                        s.visible, {"FERRY_CUDA_ATTN_CHUNKS"});
        const double e = nmse_of(chunks, one);
        std::printf(
            "[ cuda     ] decode attention D %lld, %lld of %lld keys: chunks vs one "
            "block per KV head nmse %.2e\n",
            static_cast<long long>(s.D), static_cast<long long>(s.visible),
            static_cast<long long>(s.n_kv), e);
        EXPECT_LE(e, 1e-12) << s.D << " " << s.n_kv << " " << s.visible;
    }
}

// A session on the GPU pads its KV length to 256 (the device replays captured graphs), and one
// token at a time over 300 positions gives the logits of a session that pads to 1 (no masked
// keys, a new graph every step). An F32 cache: the attention sums its keys in another order in
// the two (tiny-llama's head size 32 takes k_attn, split by the cache length), and an F16 cache
// could round a K or V value the other way (one f16 ulp, 5e-4 relative; measured 9.4e-11 with
// one on the H200).
TEST(Cuda, LongDecodeIsTheSameWithEveryPad) {
    REQUIRE_GPU();
    constexpr int kSteps = 300;
    std::vector<std::vector<float>> runs;
    for (int32_t pad : {0, 1}) {
        Expected<std::unique_ptr<LlamaModel>> m = load("f16", gpu());
        ASSERT_TRUE(m) << m.message();
        SessionOptions so;
        so.n_ctx = 512;
        so.kv_type = Type::F32;
        so.kv_pad = pad;
        Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
        ASSERT_TRUE(s) << s.message();
        EXPECT_EQ((*s)->kv_pad(), pad == 0 ? 256 : 1);
        const std::vector<int32_t>& toks = cases()[0].tokens;
        ASSERT_FALSE(toks.empty());
        std::vector<float> rows;
        for (int i = 0; i < kSteps; i++) {
            const int32_t t = toks[static_cast<size_t>(i) % toks.size()];
            Status st = (*s)->decode(std::span<const int32_t>(&t, 1), false);
            ASSERT_TRUE(st) << st.message();
            if (i >= 250) rows.insert(rows.end(), (*s)->logits(0), (*s)->logits(0) + kVocab);
        }
        runs.push_back(std::move(rows));
    }
    const double e = nmse_of(runs[1], runs[0]);
    std::printf("[ cuda     ] positions 250-299, f32 cache, pad 256 vs pad 1: nmse %.2e\n", e);
    EXPECT_LE(e, 1e-12);
}

// The index of the first value where a and b differ (a.size() when none).
size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++) {
        if (std::memcmp(&a[i], &b[i], 4) != 0) return i;
    }
    return a.size() == b.size() ? a.size() : std::min(a.size(), b.size());
}

#ifdef FERRY_HAVE_CUDA
// The steps queued ahead, started by their inputs and released idle since `before` (an
// earlier cuda::ahead_counts()).
cuda::AheadCounts ahead_since(const cuda::AheadCounts& before) {
    const cuda::AheadCounts after = cuda::ahead_counts();
    return {after.queued - before.queued, after.started - before.started, after.idle - before.idle};
}

// Runs decode steps through every way into and out of steps queued ahead (Backend::
// compute_ahead): 40 one-token steps after a prompt, a prompt chunk after a queued step (the
// queued graph runs again with its last inputs first), a truncated session going on at earlier
// positions (the same graph, other inputs), device TOP_K on and off (other graphs), the KV
// length crossing the 256 pad, a reset with a new prompt. Returns every step's logits (or top
// values and ids); empty after a failure (recorded).
std::vector<float> ahead_script(LlamaSession* s, const std::vector<int32_t>& toks, int n_vocab) {
    std::vector<float> out;
    auto tok = [&](int i) { return toks[static_cast<size_t>(i) % toks.size()]; };
    auto keep = [&]() {
        if (s->n_top() > 0) {
            out.insert(out.end(), s->top_logits(), s->top_logits() + s->n_top());
            for (int j = 0; j < s->n_top(); j++) out.push_back(static_cast<float>(s->top_ids()[j]));
        } else {
            out.insert(out.end(), s->logits(0), s->logits(0) + n_vocab);
        }
    };
    auto chunk = [&](std::vector<int32_t> c) {
        const Status st = s->decode(c, false);
        EXPECT_TRUE(st) << st.message();
        if (st) keep();
        return st.is_ok();
    };
    auto steps = [&](int from, int to) {
        for (int i = from; i < to; i++) {
            const int32_t t = tok(i);
            const Status st = s->decode(std::span<const int32_t>(&t, 1), false);
            EXPECT_TRUE(st) << "step " << i << ": " << st.message();
            if (!st) return false;
            keep();
        }
        return true;
    };
    // A pause longer than a queued step waits (CudaBackend's watcher releases it).
    auto pause = [] {
        std::this_thread::sleep_for(std::chrono::milliseconds(60));
        return true;
    };
    const bool ok = chunk({tok(0), tok(1), tok(2), tok(3), tok(4)}) && steps(5, 45) &&
                    chunk({tok(45), tok(46), tok(47)}) && steps(48, 52) &&
                    (s->truncate(s->n_past() - 10), steps(52, 60)) &&
                    (s->set_top_k(8), steps(60, 66)) && (s->set_top_k(0), steps(66, 100)) &&
                    pause() && steps(100, 300) && (s->reset(), chunk({tok(7), tok(5), tok(3)})) &&
                    steps(300, 310);
    if (!ok) out.clear();
    return out;
}

// A session queues each one-token step on the device while it reads the step before's logits
// (Scheduler::get_tensor_then), and the next step's inputs start it: ahead_script gives the
// logits of a session that never queues ahead (FERRY_AHEAD=0) bit for bit, most steps start
// queued, some queued steps ran again with their last inputs, and the session is destroyed with
// a step still queued. The graph's last product (the logits, the streaming form) of a step
// started by its inputs stores them into the session's read memory itself: every such read but
// those of TOP_K's steps copies nothing.
TEST(Cuda, StepsQueuedAheadGiveTheSameBits) {
    REQUIRE_GPU();
    const std::vector<int32_t>& toks = cases()[0].tokens;
    ASSERT_GE(toks.size(), 8u);
    std::vector<float> runs[2];
    cuda::AheadCounts counts[2];
    uint64_t host_reads[2];
    for (int mode = 0; mode < 2; mode++) {
        Expected<std::unique_ptr<LlamaModel>> m = load("f16", gpu());
        ASSERT_TRUE(m) << m.message();
        if (mode == 0) setenv("FERRY_AHEAD", "0", 1);
        SessionOptions so;
        so.n_ctx = 512;
        Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
        unsetenv("FERRY_AHEAD");
        ASSERT_TRUE(s) << s.message();
        ASSERT_EQ((*s)->kv_pad(), 256);
        const cuda::AheadCounts before = cuda::ahead_counts();
        const uint64_t reads = cuda::host_reads();
        runs[mode] = ahead_script(s->get(), toks, kVocab);
        ASSERT_FALSE(runs[mode].empty());
        s->reset();  // destroyed with a step queued
        counts[mode] = ahead_since(before);
        host_reads[mode] = cuda::host_reads() - reads;
    }
    std::printf(
        "[ cuda     ] queued ahead: %llu steps, %llu started by their inputs, %llu released "
        "idle (%llu queued with FERRY_AHEAD=0); %llu logits stored into the read's memory by "
        "the step\n",
        static_cast<unsigned long long>(counts[1].queued),
        static_cast<unsigned long long>(counts[1].started),
        static_cast<unsigned long long>(counts[1].idle),
        static_cast<unsigned long long>(counts[0].queued),
        static_cast<unsigned long long>(host_reads[1]));
    EXPECT_EQ(counts[0].queued, 0u);
    EXPECT_EQ(host_reads[0], 0u);
    EXPECT_LE(host_reads[1], counts[1].started);
    EXPECT_GE(host_reads[1] + 6, counts[1].started);
    EXPECT_GE(counts[1].idle, 1u);  // the pause
    EXPECT_GT(counts[1].started, 250u);
    EXPECT_LT(counts[1].started, counts[1].queued);  // some ran again with their last inputs
    const size_t first = first_difference(runs[0], runs[1]);
    EXPECT_EQ(first, runs[0].size())
        << "first differing value " << first << " of " << runs[0].size();
}

// A server queues a session's decode step ahead when its logits are read, and the next
// GRAPH_COMPUTE of that graph starts it; a read into the client's shared memory (unix) of a step
// still running queues it before the server waits for the step, as a local session does, and
// any other read after its reply. ahead_script through servers over unix and tcp, by default,
// with FERRY_SERVE_AHEAD_EARLY=0 (always after the reply) and with FERRY_SERVE_AHEAD=0
// (never), gives a local session's logits bit for bit; the unix server's step trace
// (FERRY_STEP_TRACE, 'Q') shows the steps queued before its wait by default, and none with
// FERRY_SERVE_AHEAD_EARLY=0.
TEST(Cuda, ServedStepsQueuedAheadGiveTheSameBits) {
    REQUIRE_GPU();
    const std::vector<int32_t>& toks = cases()[0].tokens;
    ASSERT_GE(toks.size(), 8u);
    std::vector<float> local;
    {
        Expected<std::unique_ptr<LlamaModel>> m = load("f16", gpu());
        ASSERT_TRUE(m) << m.message();
        setenv("FERRY_AHEAD", "0", 1);
        SessionOptions so;
        so.n_ctx = 512;
        Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
        unsetenv("FERRY_AHEAD");
        ASSERT_TRUE(s) << s.message();
        local = ahead_script(s->get(), toks, kVocab);
        ASSERT_FALSE(local.empty());
    }
    const std::string dir = make_temp_dir();
    int n = 0;
    for (const char* listen : {"unix", "tcp"}) {
        for (const char* form : {"", "FERRY_SERVE_AHEAD_EARLY", "FERRY_SERVE_AHEAD"}) {
            SCOPED_TRACE(std::string(listen) + " " + (*form ? form : "default"));
            const bool unix_sock = std::string(listen) == "unix";
            const std::string trace = dir + "/trace" + std::to_string(n);
            if (*form) setenv(form, "0", 1);
            if (unix_sock) {
                std::filesystem::create_directory(trace);
                setenv("FERRY_STEP_TRACE", trace.c_str(), 1);
            }
            ServerProcess srv;
            std::string err;
            const std::string addr = unix_sock ? "unix:" + dir + "/s" + std::to_string(n++)
                                               : std::string("tcp:127.0.0.1:0");
            const bool up = srv.start(addr, {"-d", "CUDA0"}, &err);
            if (*form) unsetenv(form);
            unsetenv("FERRY_STEP_TRACE");
            ASSERT_TRUE(up) << err;
            {
                Expected<std::unique_ptr<Registry>> reg = remote_open(srv.addr());
                ASSERT_TRUE(reg) << reg.message();
                ASSERT_FALSE((*reg)->devices().empty());
                Expected<std::unique_ptr<LlamaModel>> m = load("f16", (*reg)->devices()[0]);
                ASSERT_TRUE(m) << m.message();
                SessionOptions so;
                so.n_ctx = 512;
                Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
                ASSERT_TRUE(s) << s.message();
                const std::vector<float> served = ahead_script(s->get(), toks, kVocab);
                ASSERT_FALSE(served.empty());
                const size_t first = first_difference(local, served);
                EXPECT_EQ(first, local.size())
                    << "first differing value " << first << " of " << local.size();
                Expected<RemoteStats> st = remote_stats(reg->get());
                ASSERT_TRUE(st) << st.message();
                EXPECT_EQ(st->errors, 0u);
            }
            if (!unix_sock) continue;
            // The server writes a connection's events when it ends (the client has gone).
            size_t queued_early = 0, lines = 0;
            for (int tries = 0; tries < 100 && lines == 0; tries++) {
                for (const auto& e : std::filesystem::directory_iterator(trace)) {
                    if (e.path().filename().string().rfind("server-", 0) != 0) continue;
                    std::ifstream f(e.path());
                    std::string t, kind, cmd;
                    while (f >> t >> kind >> cmd) {
                        lines++;
                        queued_early += kind == "Q";
                    }
                }
                if (lines == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
            ASSERT_GT(lines, 0u) << "no server step trace in " << trace;
            std::printf("[ cuda     ] unix server, %s: %zu steps queued before its wait\n",
                        *form ? form : "default", queued_early);
            if (*form) {
                EXPECT_EQ(queued_early, 0u);
            } else {
                EXPECT_GT(queued_early, 250u);
            }
        }
    }
    std::filesystem::remove_all(dir);
}
#endif

#ifdef FERRY_HAVE_CUDA
// Decode attention with a head size of 64 (k_attn_row) inside a captured graph loads the
// cache's rows before griddepcontrol.wait and, after it, again the rows the step's SET_ROWS
// wrote: a 20-token prompt and then 280 tokens one at a time (KV lengths 256 and 512, one and
// two blocks a head) give the logits of loading every row after the wait
// (FERRY_CUDA_ATTN_EARLY=0) bit for bit, with F16 and BF16 caches; and the early form ran. By
// default it reads the mask first and loads no row past the last key the mask lets through
// (the masked rows' weights are 0 either way); FERRY_CUDA_ATTN_EARLY_MASK=0 loads them all.
TEST(Cuda, EarlyAttentionLoadsGiveTheSameBits) {
    REQUIRE_GPU();
    const ModelPreset p = {"test-d64", 384, 512, 256, 2, 4, 2, 512, 10000.0f, 1e-5f, false};
    std::vector<int32_t> toks;
    const std::string path = generated_model(p, 7u, &toks);
    ASSERT_FALSE(path.empty());
    // Rows loaded after the wait; before it with the indices after it; with the indices
    // before it too (the default: they are the graph's inputs); the dependents' launch
    // allowed only once the loads after the wait are issued (forms 0-3 without gate/up's
    // weights asked for in L2); the device's default (an eighth of them asked for, or none);
    // and with them asked for: an eighth, 64 KiB and all of them.
    const std::vector<std::vector<std::string>> forms = {
        {"FERRY_CUDA_ATTN_EARLY=0", "FERRY_CUDA_L2_NEXT=-1"},
        {"FERRY_CUDA_ATTN_EARLY=1", "FERRY_CUDA_ATTN_EARLY_IDX=0", "FERRY_CUDA_L2_NEXT=0"},
        {"FERRY_CUDA_ATTN_EARLY=1", "FERRY_CUDA_L2_NEXT=0"},
        {"FERRY_CUDA_ATTN_EARLY=1", "FERRY_CUDA_ATTN_LATE_TRIGGER=1", "FERRY_CUDA_L2_NEXT=0"},
        {"FERRY_CUDA_ATTN_EARLY=1"},
        {"FERRY_CUDA_ATTN_EARLY=1", "FERRY_CUDA_L2_NEXT=-1"},
        {"FERRY_CUDA_ATTN_EARLY=1", "FERRY_CUDA_L2_NEXT=64"},
        {"FERRY_CUDA_ATTN_EARLY=1", "FERRY_CUDA_L2_NEXT=65536"},
        {"FERRY_CUDA_ATTN_EARLY=1", "FERRY_CUDA_ATTN_EARLY_MASK=0", "FERRY_CUDA_L2_NEXT=0"}};
    const int n = static_cast<int>(forms.size());
    for (const Type kv : {Type::F16, Type::BF16}) {
        std::vector<std::vector<float>> runs(forms.size());
        std::vector<uint64_t> early(forms.size()), idx(forms.size()), asks(forms.size()),
            masks(forms.size());
        for (int e = 0; e < n; e++) {
            const OpenSession os = open_session(path, {gpu()}, kv, forms[e]);
            ASSERT_TRUE(os.s);
            LlamaSession* s = os.s.get();
            const uint64_t before = cuda::early_attention_launches();
            const uint64_t before_idx = cuda::early_index_launches();
            const uint64_t before_asks = cuda::l2_ask_launches();
            const uint64_t before_masks = cuda::early_mask_launches();
            ASSERT_TRUE(s->decode(std::span<const int32_t>(toks.data(), 20), false));
            for (size_t i = 20; i < toks.size(); i++) {
                const Status st = s->decode(std::span<const int32_t>(&toks[i], 1), false);
                ASSERT_TRUE(st) << st.message();
                runs[e].insert(runs[e].end(), s->logits(0), s->logits(0) + p.n_vocab);
            }
            early[e] = cuda::early_attention_launches() - before;
            idx[e] = cuda::early_index_launches() - before_idx;
            asks[e] = cuda::l2_ask_launches() - before_asks;
            masks[e] = cuda::early_mask_launches() - before_masks;
        }
        EXPECT_EQ(early[0], 0u) << type_name(kv);
        EXPECT_EQ(idx[1], 0u) << type_name(kv);
        for (int e = 1; e < n; e++) EXPECT_GT(early[e], 0u) << type_name(kv) << " form " << e;
        for (int e = 2; e < n; e++) EXPECT_EQ(idx[e], early[e]) << type_name(kv) << " form " << e;
        // Every layer's attention has wo and gate/up after it, so every early launch asks
        // where asked to (none without the early form; by default, all or none by the
        // device's DRAM bandwidth).
        for (int e = 0; e < 4; e++) EXPECT_EQ(asks[e], 0u) << type_name(kv) << " form " << e;
        EXPECT_TRUE(asks[4] == 0u || asks[4] == early[4]) << type_name(kv) << " " << asks[4];
        for (int e = 5; e < n - 1; e++) {
            EXPECT_EQ(asks[e], early[e]) << type_name(kv) << " form " << e;
        }
        EXPECT_EQ(asks[n - 1], 0u) << type_name(kv);
        // The mask is the graph's input: read first wherever the early form ran, but where
        // turned off.
        for (int e = 0; e < n - 1; e++) {
            EXPECT_EQ(masks[e], early[e]) << type_name(kv) << " form " << e;
        }
        EXPECT_EQ(masks[n - 1], 0u) << type_name(kv);
        for (int e = 1; e < n; e++) {
            ASSERT_EQ(runs[0].size(), runs[e].size());
            const size_t first = first_difference(runs[0], runs[e]);
            std::printf(
                "[ cuda     ] %s cache, form %d: %llu early attention launches (%llu with the "
                "indices before the wait, %llu asking for weights in L2, %llu reading the mask "
                "first); first differing logit %zu of %zu\n",
                type_name(kv), e, static_cast<unsigned long long>(early[e]),
                static_cast<unsigned long long>(idx[e]), static_cast<unsigned long long>(asks[e]),
                static_cast<unsigned long long>(masks[e]), first, runs[0].size());
            EXPECT_EQ(first, runs[0].size()) << type_name(kv) << " form " << e << ": decode step "
                                             << first / static_cast<size_t>(p.n_vocab);
        }
    }
    std::remove(path.c_str());
}
#endif

#ifdef FERRY_HAVE_CUDA
// A device that runs the CPU kernels and, for every graph it is given, asks the persistent
// step's lowering (cuda::match_persist, with host addresses for device ones) whether it would
// replace the graph's layers and logits: the real graphs a session builds, matched without a
// GPU (the lowering's first run on the device had fallen back on every decode graph, at the
// last layer's row picked by index).
class LoweringProbe : public HostKernelDevice {
  public:
    struct Seen {
        bool matched = false;
        std::string why;
        cuda::PersistModel m;
        size_t lo = 0, hi = 0, kernel_nodes = 0;
    };
    std::vector<Seen> seen_graphs;
    // Set: each graph is matched with its first product's F16 weight taken as BF16 for the
    // match alone (a model of two weight types, which the kernel does not take).
    bool mix_types = false;
    LoweringProbe() : HostKernelDevice("lowering-probe") {}

  protected:
    void seen(const Graph& g) override {
        std::vector<const Tensor*> kn;
        Tensor* mixed = nullptr;
        for (const Tensor* n : g.nodes) {
            if (n->op != Op::NONE && (op_info(n->op).flags & kOpView) == 0) kn.push_back(n);
            if (mix_types && !mixed && n->op == Op::MUL_MAT && n->src[0]->type == Type::F16) {
                mixed = n->src[0];
            }
        }
        if (mixed) mixed->type = Type::BF16;
        Seen s;
        s.kernel_nodes = kn.size();
        s.matched = cuda::match_persist(g, kn, &s.lo, &s.hi, &s.m, &s.why, host);
        if (mixed) mixed->type = Type::F16;
        seen_graphs.push_back(std::move(s));
    }

  private:
    static char* host(const Tensor* t) { return static_cast<char*>(t->data); }
};

// A 3-token prompt and one more token of a generated model of preset p (weights of `type`) on
// dev, its graphs in dev.seen_graphs (cleared first); false, the failure recorded, when a step
// did not run.
bool probe_generated(LoweringProbe& dev, const ModelPreset& p, uint32_t seed,
                     Type type = Type::F16) {
    std::vector<int32_t> ids;
    const std::string path = generated_model(p, seed, &ids, 300, type);
    if (path.empty()) return false;
    ModelOptions mo;
    mo.devices.push_back(&dev);
    SessionOptions so;
    so.n_threads = 2;
    Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(path, mo);
    Expected<std::unique_ptr<LlamaSession>> s =
        m ? LlamaSession::create(**m, so) : Expected<std::unique_ptr<LlamaSession>>(m.status());
    dev.seen_graphs.clear();
    Status st = s.status();
    if (st) st = (*s)->decode(std::span<const int32_t>(ids.data(), 3), false);
    if (st) st = (*s)->decode(std::span<const int32_t>(&ids[3], 1), false);
    std::remove(path.c_str());
    EXPECT_TRUE(st) << p.name << ": " << st.message();
    return st.is_ok();
}

// A session's decode graphs (one token) are lowered to the persistent step, its prompt graph
// is not: tiny-llama's F16 file (4 layers) gives every field of the step as the model has it,
// and one run of 19 kernel nodes a layer (the last layer's two GET_ROWS by out_ids too) and 3
// for the logits. Qwen2's biases and Qwen3's q/k norms are not in the pattern: their graphs
// keep the kernel plan.
TEST(Cuda, PersistentLoweringMatchesDecodeGraphsOnly) {
    LoweringProbe dev;
    ModelOptions mo;
    mo.devices.push_back(&dev);
    Expected<std::unique_ptr<LlamaModel>> m = LlamaModel::load(kDir + "/tiny-llama-f16.gguf", mo);
    ASSERT_TRUE(m) << m.message();
    SessionOptions so;
    so.n_threads = 2;
    Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
    ASSERT_TRUE(s) << s.message();
    const std::vector<int32_t>& toks = cases()[0].tokens;
    ASSERT_GE(toks.size(), 8u);
    ASSERT_TRUE((*s)->decode(std::span<const int32_t>(toks.data(), 5), false));
    const size_t prompt_graphs = dev.seen_graphs.size();
    for (size_t i = 5; i < 8; i++) {
        ASSERT_TRUE((*s)->decode(std::span<const int32_t>(&toks[i], 1), false));
    }
    ASSERT_GE(prompt_graphs, 1u);
    ASSERT_EQ(dev.seen_graphs.size(), prompt_graphs + 3);
    for (size_t i = 0; i < prompt_graphs; i++) {
        EXPECT_FALSE(dev.seen_graphs[i].matched) << "prompt graph " << i;
        EXPECT_FALSE(dev.seen_graphs[i].why.empty());
    }
    for (size_t i = prompt_graphs; i < dev.seen_graphs.size(); i++) {
        const LoweringProbe::Seen& e = dev.seen_graphs[i];
        ASSERT_TRUE(e.matched) << "decode graph " << i << ": " << e.why;
        const cuda::PersistModel& pm = e.m;
        EXPECT_EQ(pm.layers.size(), 4u);
        EXPECT_EQ(pm.n_embd, 256);
        EXPECT_EQ(pm.n_ff, 768);
        EXPECT_EQ(pm.n_head, 8);
        EXPECT_EQ(pm.n_head_kv, 4);
        EXPECT_EQ(pm.head_dim, 32);
        EXPECT_EQ(pm.n_rot, 32);
        EXPECT_EQ(pm.n_vocab, 1024);
        const int pad = (*s)->kv_pad(), n = static_cast<int>(i - prompt_graphs) + 6;
        EXPECT_EQ(pm.n_kv, (n + pad - 1) / pad * pad);
        EXPECT_FLOAT_EQ(pm.eps, 1e-5f);
        EXPECT_FLOAT_EQ(pm.kq_scale, 1.0f / std::sqrt(32.0f));
        EXPECT_DOUBLE_EQ(pm.rope_base, 10000.0);
        EXPECT_DOUBLE_EQ(pm.rope_scale, 1.0);
        EXPECT_EQ(pm.rope_ff, nullptr);
        EXPECT_NE(pm.out_ids, nullptr);
        EXPECT_NE(pm.pos, nullptr);
        EXPECT_NE(pm.x0, nullptr);
        EXPECT_NE(pm.logits, nullptr);
        EXPECT_EQ(pm.cache_row_bytes, 4 * 32 * 2);
        EXPECT_FALSE(pm.bf16);
        for (const cuda::PersistLayer& l : pm.layers) {
            EXPECT_TRUE(l.wq && l.wk && l.wv && l.wo && l.gate && l.up && l.down && l.attn_norm &&
                        l.ffn_norm && l.kc && l.vc && l.mask);
            EXPECT_NE(l.kc, l.vc);
        }
        // Every layer but the last attends with the step's mask, the last with the rows of
        // the tokens whose logits it reads (mask_out): the kernel takes exactly these two.
        for (size_t l = 1; l + 1 < pm.layers.size(); l++) {
            EXPECT_EQ(pm.layers[l].mask, pm.layers.front().mask);
        }
        EXPECT_NE(pm.layers.back().mask, pm.layers.front().mask);
        // Each layer's weights are its own (the first and the last layer's differ).
        EXPECT_NE(pm.layers.front().wq, pm.layers.back().wq);
        EXPECT_EQ(e.hi + 1 - e.lo, size_t{4 * 19 + 2 + 3});
        EXPECT_EQ(e.lo, 1u);  // after the token's GET_ROWS
        EXPECT_EQ(e.hi + 1, e.kernel_nodes);
        // Too small for the kernel (hidden 256): the plan keeps its kernels.
        std::string why;
        EXPECT_FALSE(cuda::persist_shapes_ok(pm, 132, &why));
        EXPECT_NE(why.find("n_embd"), std::string::npos) << why;
    }
    // The shapes the GPU tests below run: lowered, and taken by the kernel on a device of an
    // H100's or H200's 132 SMs and 227 KiB of shared memory a block (a 1B layer with Llama 3's
    // rope factors, the embedding as the output, F16 and BF16; hidden 1024).
    const ModelPreset b1 = {"test-1b-2l-cpu", 4096,  1024, 2048,    2, 32,   8, 8192,
                            500000.0f,        1e-5f, true, "llama", 0, 32.0f};
    const ModelPreset h1024 = {"test-h1024-cpu", 2048,  1024, 1024, 3, 16, 4, 4096,
                               10000.0f,         1e-5f, false};
    for (const auto& [p, type] :
         {std::pair{b1, Type::F16}, std::pair{b1, Type::BF16}, std::pair{h1024, Type::F16}}) {
        ASSERT_TRUE(probe_generated(dev, p, 5u, type)) << p.name;
        ASSERT_GE(dev.seen_graphs.size(), 2u);
        const LoweringProbe::Seen& e = dev.seen_graphs.back();
        ASSERT_TRUE(e.matched) << p.name << " " << type_name(type) << ": " << e.why;
        EXPECT_EQ(e.m.bf16, type == Type::BF16) << p.name;
        EXPECT_EQ(e.m.layers.size(), static_cast<size_t>(p.n_layer)) << p.name;
        EXPECT_EQ(e.m.rope_ff != nullptr, p.llama3_rope_factor > 0.0f) << p.name;
        std::string why;
        EXPECT_TRUE(cuda::persist_shapes_ok(e.m, 132, &why, 227 << 10)) << p.name << ": " << why;
        EXPECT_FALSE(cuda::persist_shapes_ok(e.m, 132, &why, 200 << 10)) << p.name;
        EXPECT_EQ(why, "shared memory") << p.name;
    }
    // One weight of another type than the rest: not lowered.
    dev.mix_types = true;
    ASSERT_TRUE(probe_generated(dev, h1024, 5u));
    dev.mix_types = false;
    ASSERT_FALSE(dev.seen_graphs.empty());
    EXPECT_FALSE(dev.seen_graphs.back().matched);
    std::printf("[ cuda     ] a decode graph with one weight BF16, the rest F16, not lowered: %s\n",
                dev.seen_graphs.back().why.c_str());
    for (const char* arch : {"qwen2", "qwen3"}) {
        const ModelPreset p = {"tiny-lowering", 1024,  512,   256,  2, 8, 4, 768,
                               10000.0f,        1e-6f, false, arch, 32};
        ASSERT_TRUE(probe_generated(dev, p, 3u)) << arch;
        ASSERT_FALSE(dev.seen_graphs.empty());
        for (const LoweringProbe::Seen& e : dev.seen_graphs) {
            EXPECT_FALSE(e.matched) << arch;
            std::printf("[ cuda     ] %s graph of %zu kernel nodes not lowered: %s\n", arch,
                        e.kernel_nodes, e.why.c_str());
        }
    }
}
#endif

#ifdef FERRY_HAVE_CUDA
// The persistent decode step (one cooperative launch from the first layer's norm to the logits,
// src/backends/cuda/ops/persist.cu) against the kernel-per-node plan (FERRY_CUDA_PERSIST=0) on
// models of the shapes it takes: Llama 3.2 1B's layers (hidden 2048, 32 heads of 64 over 8
// KV heads, FFN 8192, Llama 3's rope frequency factors, tied output) with 2 layers, F16 and
// BF16, and hidden 1024 (16 heads over 4, FFN 4096, untied) with 3, F16. A 20-token prompt, then
// one token at a time to position 800 (KV lengths 256 to 1,024, the most the kernel takes), or to
// position 160 (the large model, in a context of 170: a KV length that is not a multiple of 8,
// which the attention's search for the last visible key reads one value at a time). Both sum the
// same weights and values in fp32 in different orders (~1e-7 relative a value) and may round a key
// or value to F16 the other way (one F16 ulp, 5e-4 relative in that one element): the logits' nmse
// stays below 1e-9, and the lowering ran (none with it off). Its attention both ways: from position
// 127 on, a head's keys split over as many blocks as the SMs take (four for these shapes on 132
// SMs), merged by wo's input read, and one block a head throughout (FERRY_CUDA_PERSIST_SPLITS=1).
TEST(Cuda, PersistentDecodeMatchesTheKernelPlan) {
    REQUIRE_GPU();
    const ModelPreset b1 = {"test-1b-2l", 4096,      1024,  2048, 2,       32, 8,
                            8192,         500000.0f, 1e-5f, true, "llama", 0,  32.0f};
    const ModelPreset h1024 = {"test-h1024", 2048,     1024,  1024, 3, 16, 4,
                               4096,         10000.0f, 1e-5f, false};
    for (const auto& [p, type] :
         {std::pair{b1, Type::F16}, std::pair{b1, Type::BF16}, std::pair{h1024, Type::F16}}) {
        std::vector<int32_t> toks;
        const std::string path = generated_model(p, 11u, &toks, p.n_embd == 2048 ? 160 : 800, type);
        ASSERT_FALSE(path.empty());
        const size_t steps = toks.size();
        std::vector<float> runs[3];
        uint64_t lowered[3];
        for (int on = 0; on < 3; on++) {
            const OpenSession os = open_session(
                path, {gpu()}, Type::F16,
                {on ? "FERRY_CUDA_PERSIST=1" : "FERRY_CUDA_PERSIST=0", "FERRY_CUDA_PERSIST_WHY=1",
                 on == 2 ? "FERRY_CUDA_PERSIST_SPLITS=1" : "FERRY_CUDA_PERSIST_SPLITS=0"},
                p.n_embd == 2048 ? 170 : 0);
            ASSERT_TRUE(os.s);
            LlamaSession* s = os.s.get();
            const uint64_t before = cuda::persist_plans();
            ASSERT_TRUE(s->decode(std::span<const int32_t>(toks.data(), 20), false));
            for (size_t i = 20; i < steps; i++) {
                const Status st = s->decode(std::span<const int32_t>(&toks[i], 1), false);
                ASSERT_TRUE(st) << p.name << " step " << i << ": " << st.message();
                runs[on].insert(runs[on].end(), s->logits(0), s->logits(0) + p.n_vocab);
            }
            lowered[on] = cuda::persist_plans() - before;
        }
        EXPECT_EQ(lowered[0], 0u) << p.name;
        for (int on = 1; on < 3; on++) {
            const char* form = on == 1 ? "split keys" : "a block a head";
            const double e = nmse_of(runs[on], runs[0]);
            size_t same_top = 0, rows = runs[0].size() / static_cast<size_t>(p.n_vocab);
            for (size_t r = 0; r < rows; r++) {
                const float* x = runs[0].data() + r * static_cast<size_t>(p.n_vocab);
                const float* y = runs[on].data() + r * static_cast<size_t>(p.n_vocab);
                same_top += std::max_element(x, x + p.n_vocab) - x ==
                            std::max_element(y, y + p.n_vocab) - y;
            }
            std::printf(
                "[ cuda     ] %s %s (%s): persistent decode vs the kernel plan over %zu steps: "
                "nmse %.2e, same top-1 %zu, %llu plans lowered\n",
                p.name, type_name(type), form, rows, e, same_top,
                static_cast<unsigned long long>(lowered[on]));
            EXPECT_GT(lowered[on], 0u) << p.name << " " << type_name(type) << " " << form;
            EXPECT_LE(e, 1e-9) << p.name << " " << type_name(type) << " " << form;
        }
        std::remove(path.c_str());
    }
}
#endif

#ifdef FERRY_HAVE_CUDA
// The persistent decode step through every way into and out of steps queued ahead
// (ahead_script: the KV length crossing the 256 pad, a truncated session, device TOP_K after
// the step, a pause, a reset) gives the same bits as a session that never queues ahead: its
// sums run in one fixed order, and a step run again with its last inputs stores the same rows.
TEST(Cuda, PersistentDecodeQueuedAheadGivesTheSameBits) {
    REQUIRE_GPU();
    const ModelPreset p = {"test-h1024-ahead", 2048,  1024, 1024, 3, 16, 4, 4096,
                           10000.0f,           1e-5f, false};
    std::vector<int32_t> toks;
    const std::string path = generated_model(p, 13u, &toks);
    ASSERT_FALSE(path.empty());
    std::vector<float> runs[2];
    cuda::AheadCounts counts[2];
    uint64_t lowered[2], host_reads[2];
    for (int mode = 0; mode < 2; mode++) {
        const OpenSession os =
            open_session(path, {gpu()}, Type::F16,
                         {mode == 0 ? "FERRY_AHEAD=0" : "FERRY_AHEAD=1", "FERRY_CUDA_PERSIST=1"});
        ASSERT_TRUE(os.s);
        const cuda::AheadCounts before = cuda::ahead_counts();
        const uint64_t plans = cuda::persist_plans(), reads = cuda::host_reads();
        runs[mode] = ahead_script(os.s.get(), toks, p.n_vocab);
        ASSERT_FALSE(runs[mode].empty());
        lowered[mode] = cuda::persist_plans() - plans;
        host_reads[mode] = cuda::host_reads() - reads;
        counts[mode] = ahead_since(before);
    }
    std::printf(
        "[ cuda     ] persistent decode queued ahead: %llu steps, %llu started by their inputs; "
        "%llu and %llu plans lowered; %llu logits stored into the read's memory by the step\n",
        static_cast<unsigned long long>(counts[1].queued),
        static_cast<unsigned long long>(counts[1].started),
        static_cast<unsigned long long>(lowered[0]), static_cast<unsigned long long>(lowered[1]),
        static_cast<unsigned long long>(host_reads[1]));
    EXPECT_GT(lowered[0], 0u);
    EXPECT_GT(lowered[1], 0u);
    EXPECT_GT(counts[1].started, 250u);
    // Every step started by its inputs had its logits stored by the step itself, but for the
    // 6 steps that read TOP_K's result instead (the rest were copied): the same bits either way.
    EXPECT_EQ(host_reads[0], 0u);
    EXPECT_LE(host_reads[1], counts[1].started);
    EXPECT_GE(host_reads[1] + 6, counts[1].started);
    const size_t first = first_difference(runs[0], runs[1]);
    EXPECT_EQ(first, runs[0].size())
        << "first differing value " << first << " of " << runs[0].size();
    std::remove(path.c_str());
}

// The persistent step's copies in flight (FERRY_CUDA_PERSIST_INFLIGHT: A,C or, the attention's
// chain's parts apart and the output phase's, A,Q,T,I,W,O) only pace the weights' stream: every
// setting gives the default's bits, past 128 keys too (the attention split over blocks), and none
// stalls. The settings: the default; one copy everywhere; the chain's parts each at another value;
// the output phase at 8; and the most the ring takes (each is clamped to its stages less one). The
// per-phase stamps (FERRY_CUDA_PERSIST_STAMPS=1, a diagnostic) change no bits either, and print a
// line a phase (3 layers of 5, then the output, whose producer is stamped too) when the backend
// goes.
TEST(Cuda, PersistentDecodeCopiesInFlightAndStampsChangeNoBits) {
    REQUIRE_GPU();
    const ModelPreset p = {
        "test-h1024-inflight", 2048, 1024, 1024, 3, 16, 4, 4096, 10000.0f, 1e-5f, false};
    std::vector<int32_t> toks;
    const std::string path = generated_model(p, 17u, &toks, 160);
    ASSERT_FALSE(path.empty());
    const std::string settings[] = {"",
                                    "FERRY_CUDA_PERSIST_INFLIGHT=1,1",
                                    "FERRY_CUDA_PERSIST_INFLIGHT=3,1,1,3,1",
                                    "FERRY_CUDA_PERSIST_INFLIGHT=3,2,1,1,1",
                                    "FERRY_CUDA_PERSIST_INFLIGHT=3,1,2,1,3",
                                    "FERRY_CUDA_PERSIST_INFLIGHT=4,1,1,1,2",
                                    "FERRY_CUDA_PERSIST_INFLIGHT=3,1,1,1,1,8",
                                    "FERRY_CUDA_PERSIST_INFLIGHT=99,99,99,99,99",
                                    "FERRY_CUDA_PERSIST_STAMPS=1"};
    std::vector<float> runs[std::size(settings)];
    for (size_t i = 0; i < std::size(settings); i++) {
        const std::string& set = settings[i];
        const std::string name = set.empty() ? "default" : set;
        std::vector<std::string> env = {"FERRY_CUDA_PERSIST=1"};
        if (!set.empty()) env.push_back(set);
        const bool stamps = set == "FERRY_CUDA_PERSIST_STAMPS=1";
        // (The session and its backend gone before the stamps' lines are read: they print then.)
        auto run = [&]() -> std::string {
            const OpenSession os = open_session(path, {gpu()}, Type::F16, env);
            if (!os.s) return "no session";
            LlamaSession* s = os.s.get();
            const uint64_t before = cuda::persist_plans();
            if (!s->decode(std::span<const int32_t>(toks.data(), 8), false)) return "the prompt";
            for (size_t t = 8; t < toks.size(); t++) {
                const Status st = s->decode(std::span<const int32_t>(&toks[t], 1), false);
                if (!st) return "step " + std::to_string(t) + ": " + st.message();
                runs[i].insert(runs[i].end(), s->logits(0), s->logits(0) + p.n_vocab);
            }
            return cuda::persist_plans() > before ? "" : "not lowered";
        };
        if (stamps) ::testing::internal::CaptureStderr();
        const std::string failed = run();
        const std::string err = stamps ? ::testing::internal::GetCapturedStderr() : "";
        ASSERT_EQ(failed, "") << name;
        if (stamps) {
            size_t lines = 0;
            for (size_t at = err.find("stamps "); at != std::string::npos;
                 at = err.find("stamps ", at + 1)) {
                lines++;
            }
            EXPECT_EQ(lines, 16u) << err;
            EXPECT_NE(err.find("attn blocks"), std::string::npos) << err;
            EXPECT_NE(err.find("out  blocks"), std::string::npos) << err;
            char unstamped[32];  // (as print_stamps writes a median over no blocks)
            std::snprintf(unstamped, sizeof unstamped, "producer %8.1f", -1.0);
            EXPECT_EQ(err.find(unstamped, err.find("out  blocks")), std::string::npos)
                << "the output phase's producer not stamped: " << err;
        }
        if (i > 0) {
            const size_t first = first_difference(runs[0], runs[i]);
            EXPECT_EQ(first, runs[0].size())
                << name << ": first differing value " << first << " of " << runs[0].size();
        }
    }
    std::remove(path.c_str());
}
#endif

// Products in the shapes of a model's layers (every path: vector kernel with split-K and
// column groups, fused residual add, cuBLAS; the element-read formats' decoders, whose wide
// products stay in column groups) agree with the CPU backend on the same inputs.
TEST(Cuda, ModelShapedProductsMatchTheCpu) {
    REQUIRE_GPU();
    Expected<std::unique_ptr<Backend>> gbe = gpu()->make_backend();
    ASSERT_TRUE(gbe) << gbe.message();
    std::unique_ptr<Backend> cbe = reference_cpu();
    const int64_t shapes[][2] = {{256, 768}, {768, 256}, {256, 1024}, {2048, 512}, {8192, 64}};
    Lcg rnd{1u};
    for (Type t : {Type::F32, Type::F16, Type::Q8_0, Type::Q4_0, Type::Q6_K, Type::Q5_0, Type::Q3_K,
                   Type::IQ4_XS, Type::MXFP4}) {
        for (const auto& sh : shapes) {
            for (int64_t n : {1, 5, 13, 40, 100}) {
                for (bool with_add : {false, true}) {
                    const int64_t K = sh[0], M = sh[1];
                    std::vector<float> wf(static_cast<size_t>(K * M)),
                        xv(static_cast<size_t>(K * n)), rv(static_cast<size_t>(M * n));
                    for (float& v : wf) v = rnd();
                    for (float& v : xv) v = rnd();
                    for (float& v : rv) v = rnd();
                    std::vector<uint8_t> wb(static_cast<size_t>(M) * row_size(t, K));
                    ASSERT_TRUE(from_float_row(t, wf.data(), wb.data(), K * M));
                    std::vector<float> outs[2];
                    for (int d = 0; d < 2; d++) {
                        Backend* be = d == 0 ? gbe->get() : cbe.get();
                        BufferType* bt = d == 0 ? gpu()->buffer_type() : cpu::host_buffer_type();
                        Context in, gc;
                        Tensor* w = in.new_tensor(t, {K, M});
                        Tensor* x = in.new_tensor(Type::F32, {K, n});
                        Tensor* r = in.new_tensor(Type::F32, {M, n});
                        Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, bt);
                        ASSERT_TRUE(buf) << buf.message();
                        ASSERT_TRUE(tensor_set(w, wb.data(), wb.size()));
                        ASSERT_TRUE(tensor_set(x, xv.data(), xv.size() * 4));
                        ASSERT_TRUE(tensor_set(r, rv.data(), rv.size() * 4));
                        Tensor* y = gc.mul_mat(w, x);
                        if (with_add) y = gc.add(y, r);
                        y->flags |= kTensorOutput;
                        Graph g;
                        g.build_forward(y);
                        GraphAllocator alloc(bt);
                        ASSERT_TRUE(alloc.allocate(g));
                        ASSERT_TRUE(be->compute(g));
                        ASSERT_TRUE(be->synchronize());
                        outs[d].resize(static_cast<size_t>(M * n));
                        ASSERT_TRUE(tensor_get(y, outs[d].data(), outs[d].size() * 4));
                    }
                    double err = 0.0, ref = 0.0;
                    for (size_t i = 0; i < outs[0].size(); i++) {
                        const double dd = static_cast<double>(outs[0][i]) - outs[1][i];
                        err += dd * dd;
                        ref += static_cast<double>(outs[1][i]) * outs[1][i];
                    }
                    // CPU: block formats multiply q8-quantized activations, F16 may round x.
                    const double bound = t == Type::F32 ? 1e-10 : (t == Type::F16 ? 1e-6 : 1e-4);
                    EXPECT_LE(err / ref, bound) << type_name(t) << " K=" << K << " M=" << M
                                                << " N=" << n << " add=" << with_add;
                }
            }
        }
    }
}

// The graph allocator may place a node over the storage its predecessor's inputs just freed:
// here the residual ADD's result lands on the activation the product multiplies, and the
// SWIGLU's on the activation gate and up multiply. Fused into one kernel with that product,
// the result would be written while other blocks still read the activation (the llama
// layers' output projection did this, and its logits moved from run to run). Whatever the
// backend fuses, the results match the CPU's on the same graph, every time.
TEST(Cuda, FusedKernelsNeverOverwriteWhatTheyRead) {
    REQUIRE_GPU();
    Expected<std::unique_ptr<Backend>> gbe = gpu()->make_backend();
    ASSERT_TRUE(gbe) << gbe.message();
    std::unique_ptr<Backend> cbe = reference_cpu();
    Lcg rnd{7u};
    // K > M: the result fits in the freed activation's place. Enough blocks for several
    // waves, so that late blocks read b after early ones wrote.
    const int64_t K = 8192, M = 2048;
    for (Type t : {Type::F16, Type::Q8_0, Type::Q4_0}) {
        std::vector<uint8_t> wb[2];
        ASSERT_TRUE(random_weight_pair(t, K, M, rnd, wb));
        for (int64_t n : {1, 13}) {
            for (bool glu : {false, true}) {
                if (glu && n != 1) continue;  // gate+up+swiglu fuses for decode only
                std::vector<float> xv(static_cast<size_t>(K * n)), rv(static_cast<size_t>(M * n));
                for (float& v : xv) v = rnd();
                for (float& v : rv) v = rnd();
                std::vector<float> outs[2];
                for (int d = 0; d < 2; d++) {
                    Backend* be = d == 0 ? gbe->get() : cbe.get();
                    BufferType* bt = d == 0 ? gpu()->buffer_type() : cpu::host_buffer_type();
                    Context in, gc;
                    Tensor* w0 = in.new_tensor(t, {K, M});
                    Tensor* w1 = in.new_tensor(t, {K, M});
                    Tensor* x = in.new_tensor(Type::F32, {K, n});
                    Tensor* r = in.new_tensor(Type::F32, {M, n});
                    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, bt);
                    ASSERT_TRUE(buf) << buf.message();
                    ASSERT_TRUE(tensor_set(w0, wb[0].data(), wb[0].size()));
                    ASSERT_TRUE(tensor_set(w1, wb[1].data(), wb[1].size()));
                    ASSERT_TRUE(tensor_set(x, xv.data(), xv.size() * 4));
                    ASSERT_TRUE(tensor_set(r, rv.data(), rv.size() * 4));
                    Tensor* b = gc.scale(x, 0.5f);  // [K, n], an intermediate
                    Tensor* y = glu ? gc.swiglu(gc.mul_mat(w0, b), gc.mul_mat(w1, b))
                                    : gc.add(gc.mul_mat(w0, b), r);  // [M, n]
                    y->flags |= kTensorOutput;
                    Graph g;
                    g.build_forward(y);
                    GraphAllocator alloc(bt);
                    ASSERT_TRUE(alloc.allocate(g));
                    // The case this test is about: the result placed over b.
                    ASSERT_EQ(y->buffer, b->buffer);
                    ASSERT_EQ(y->offs, b->offs) << "the allocator no longer reuses b's place";
                    for (int rep = 0; rep < (d == 0 ? 3 : 1); rep++) {
                        ASSERT_TRUE(be->compute(g));
                        ASSERT_TRUE(be->synchronize());
                        std::vector<float> got(static_cast<size_t>(M * n));
                        ASSERT_TRUE(tensor_get(y, got.data(), got.size() * 4));
                        if (rep == 0) {
                            outs[d] = got;
                        } else {
                            EXPECT_EQ(got, outs[d]) << "run " << rep << " differs";
                        }
                    }
                }
                double err = 0.0, ref = 0.0;
                for (size_t i = 0; i < outs[0].size(); i++) {
                    const double dd = static_cast<double>(outs[0][i]) - outs[1][i];
                    err += dd * dd;
                    ref += static_cast<double>(outs[1][i]) * outs[1][i];
                }
                const double bound = t == Type::F16 ? 1e-6 : 1e-4;  // as in the test above
                EXPECT_LE(err / ref, bound)
                    << type_name(t) << " N=" << n << (glu ? " gate+up+swiglu" : " +add");
            }
        }
    }
}

// The RMS norm folded into the product that reads it (FERRY_CUDA_FUSE_NORM_MV): every
// block recomputes the norm in the RMS_NORM kernel's own order of operations, so the results
// equal the unfused kernels' bit for bit, for each block size that kernel picks (K = 256:
// 256 threads, 2048: 1024), with and without the residual ADD before it (whose sum is
// written by one block and must equal the CPU's, the same float additions), for a plain
// product and gate+up+SWIGLU. The unfused kernels are what test-ops checks against the
// float64 reference and ModelShapedProductsMatchTheCpu against the CPU: the product of this
// normalised b is not compared with the CPU again here (the CPU rounds b's q8 scales to
// fp16, the GPU does not: for b scaled by a norm weight the two land 1.4e-4 apart in NMSE,
// measured on the H200, against a 1e-4 bound set for uniform inputs).
TEST(Cuda, FoldedNormMatchesTheUnfusedKernels) {
    REQUIRE_GPU();
    std::unique_ptr<Backend> cbe = reference_cpu();
    Lcg rnd{11u};
    const int64_t M = 1024;
    // Q4_0, Q6_K: the int8 kernel; F16, BF16: the streaming form; F32: the float kernel (b in
    // shared memory).
    for (Type t : {Type::Q4_0, Type::Q6_K, Type::F16, Type::BF16, Type::F32}) {
        // K = 256: norm_inv's form (k_norm's block of 256); 2048, 3072, 4096: the one-round-trip
        // form (a block of 1024; two, three and four float4s a thread).
        for (int64_t K : {int64_t{256}, int64_t{2048}, int64_t{3072}, int64_t{4096}}) {
            std::vector<uint8_t> wb[2];
            ASSERT_TRUE(random_weight_pair(t, K, M, rnd, wb));
            std::vector<float> xv(static_cast<size_t>(K)), rv(xv.size()), nv(xv.size());
            for (float& v : xv) v = rnd() * 3.0f;
            for (float& v : rv) v = rnd();
            for (float& v : nv) v = rnd() + 1.5f;
            for (bool with_add : {false, true}) {
                for (bool glu : {false, true}) {
                    // 0: GPU, folded; 1: GPU, norm kernels apart; 2: CPU
                    std::vector<float> outs[3], sums[3];
                    for (int d = 0; d < 3; d++) {
                        // The float kernel folds the norm only when asked (FERRY_CUDA_MV_FNORM);
                        // the streaming form always does.
                        if (d == 0) setenv("FERRY_CUDA_MV_FNORM", "1", 1);
                        if (d == 1) setenv("FERRY_CUDA_FUSE_NORM_MV", "0", 1);
                        Expected<std::unique_ptr<Backend>> gbe = gpu()->make_backend();
                        unsetenv("FERRY_CUDA_FUSE_NORM_MV");
                        unsetenv("FERRY_CUDA_MV_FNORM");
                        ASSERT_TRUE(gbe) << gbe.message();
                        Backend* be = d < 2 ? gbe->get() : cbe.get();
                        BufferType* bt = d < 2 ? gpu()->buffer_type() : cpu::host_buffer_type();
                        Context in, gc;
                        Tensor* w0 = in.new_tensor(t, {K, M});
                        Tensor* w1 = in.new_tensor(t, {K, M});
                        Tensor* x = in.new_tensor(Type::F32, {K, 1});
                        Tensor* r = in.new_tensor(Type::F32, {K, 1});
                        Tensor* nw = in.new_tensor(Type::F32, {K});
                        Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, bt);
                        ASSERT_TRUE(buf) << buf.message();
                        ASSERT_TRUE(tensor_set(w0, wb[0].data(), wb[0].size()));
                        ASSERT_TRUE(tensor_set(w1, wb[1].data(), wb[1].size()));
                        ASSERT_TRUE(tensor_set(x, xv.data(), xv.size() * 4));
                        ASSERT_TRUE(tensor_set(r, rv.data(), rv.size() * 4));
                        ASSERT_TRUE(tensor_set(nw, nv.data(), nv.size() * 4));
                        Tensor* xs = with_add ? gc.add(gc.scale(x, 0.5f), r) : gc.scale(x, 0.5f);
                        Tensor* h = gc.mul(gc.rms_norm(xs, 1e-5f), nw);
                        Tensor* y = glu ? gc.swiglu(gc.mul_mat(w0, h), gc.mul_mat(w1, h))
                                        : gc.mul_mat(w0, h);
                        y->flags |= kTensorOutput;
                        xs->flags |= kTensorOutput;
                        Graph g;
                        g.build_forward(y);
                        g.build_forward(xs);
                        GraphAllocator alloc(bt);
                        ASSERT_TRUE(alloc.allocate(g));
                        for (int rep = 0; rep < 2; rep++) {
                            ASSERT_TRUE(be->compute(g));
                            ASSERT_TRUE(be->synchronize());
                        }
                        outs[d].resize(static_cast<size_t>(M));
                        sums[d].resize(static_cast<size_t>(K));
                        ASSERT_TRUE(tensor_get(y, outs[d].data(), outs[d].size() * 4));
                        ASSERT_TRUE(tensor_get(xs, sums[d].data(), sums[d].size() * 4));
                    }
                    const std::string what = std::string(type_name(t)) + " K=" + std::to_string(K) +
                                             (with_add ? " add" : "") +
                                             (glu ? " gate+up+swiglu" : "");
                    EXPECT_EQ(outs[0], outs[1]) << what;
                    EXPECT_EQ(sums[0], sums[1]) << what;
                    EXPECT_EQ(sums[0], sums[2]) << what;
                    // Not all zero, and no NaN: the comparisons above mean something.
                    double ss = 0.0;
                    for (float v : outs[0]) ss += static_cast<double>(v) * v;
                    EXPECT_TRUE(ss > 0.0 && std::isfinite(ss)) << what;
                }
            }
        }
    }
}

// The int8 decode kernel's ring form (weights streamed into shared memory by bulk copies,
// FERRY_CUDA_MV_RING) adds the same chunks in the same order as its register form: equal bit
// for bit, for every block format, plain and gate+up+SWIGLU, with the residual ADD, rows that
// leave a last partial group (M % 8 != 0), long rows (K = 8192: two warps per row), rows too
// short for bulk copies (Q6_K with K = 256: 210 bytes, the register form either way), and
// matrices tall enough that every block refills its slots (M = 24,000: ~11 row groups per
// block against at most 8 slots). The register form is what ModelShapedProductsMatchTheCpu and
// test-ops check against the CPU and float64; a CPU bound here keeps the comparison honest.
TEST(Cuda, RingProductsEqualTheRegisterForm) {
    REQUIRE_GPU();
    std::unique_ptr<Backend> cbe = reference_cpu();
    Lcg rnd{23u};
    struct Shape {
        int64_t K, M;
    };
    for (Type t : {Type::Q4_0, Type::Q4_1, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
        for (Shape sh :
             {Shape{2048, 24000}, Shape{256, 9001}, Shape{8192, 2048}, Shape{2048, 3000}}) {
            const int64_t K = sh.K, M = sh.M;
            ProductCase pc;
            ASSERT_TRUE(random_product(t, K, M, rnd, pc));
            for (bool glu : {false, true}) {
                for (bool with_add : {false, true}) {
                    if (glu && (with_add || M > 9001)) continue;
                    // 0: GPU, ring; 1: GPU, register form; 2: CPU
                    std::vector<float> outs[3];
                    // Q4_0 and Q6_K run in the streaming form unless it is off.
                    gpu_forms_and_cpu(cbe.get(), pc, glu, with_add, {"FERRY_CUDA_MV_STREAM"},
                                      {"FERRY_CUDA_MV_STREAM", "FERRY_CUDA_MV_RING"}, outs);
                    for (const std::vector<float>& o : outs) {
                        ASSERT_EQ(o.size(), static_cast<size_t>(M));
                    }
                    const std::string what = std::string(type_name(t)) + " K=" + std::to_string(K) +
                                             " M=" + std::to_string(M) +
                                             (glu ? " gate+up+swiglu" : "") +
                                             (with_add ? " add" : "");
                    EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4), 0)
                        << what;
                    // The bound of ModelShapedProductsMatchTheCpu for block formats (q8 b).
                    EXPECT_LE(nmse_of(outs[0], outs[2]), 1e-4) << what;  // NaN fails too
                }
            }
        }
    }
}

// The block-lane form (Q4_0: two whole blocks per lane; Q6_K: a quarter of a super-block per
// lane; b's quants swizzled in shared memory; FERRY_CUDA_MV_BLK) against the lane-per-8-weights
// form: the same quantized b and the same integer block sums, added in another order, so the
// two agree to float rounding (NMSE far below the CPU bound; a wrong block, nibble, scale or
// swizzle mapping is off by O(1)). Shapes: whole spans of 2048 weights, rows shorter than a
// span (Q4_0 K = 256: four busy lanes; Q6_K K = 1024: sixteen), a span and a part, two warps
// per row (K = 8192), plain, gate+up+SWIGLU and the residual ADD, in the ring form (the
// default) and the register form. Q6_K rows whose super-blocks alternate between word-aligned
// and 2 bytes off (every row here) take both realignments.
TEST(Cuda, BlockLaneProductsMatchTheOtherForm) {
    REQUIRE_GPU();
    std::unique_ptr<Backend> cbe = reference_cpu();
    Lcg rnd{29u};
    struct Shape {
        Type t;
        int64_t K, M;
    };
    for (Shape sh : {Shape{Type::Q4_0, 2048, 3000}, Shape{Type::Q4_0, 256, 1000},
                     Shape{Type::Q4_0, 2304, 520}, Shape{Type::Q4_0, 8192, 2048},
                     Shape{Type::Q6_K, 2048, 3000}, Shape{Type::Q6_K, 1024, 1000},
                     Shape{Type::Q6_K, 2560, 520}, Shape{Type::Q6_K, 8192, 2048}}) {
        const Type t = sh.t;
        const int64_t K = sh.K, M = sh.M;
        ProductCase pc;
        ASSERT_TRUE(random_product(t, K, M, rnd, pc));
        for (bool ring : {true, false}) {
            for (int variant = 0; variant < 3; variant++) {
                const bool glu = variant == 1, with_add = variant == 2;
                // 0: GPU, block-lane form; 1: GPU, the other form; 2: CPU
                std::vector<float> outs[3];
                // (The streaming form, the default for these types, is off in both.)
                if (ring) {
                    gpu_forms_and_cpu(cbe.get(), pc, glu, with_add, {"FERRY_CUDA_MV_STREAM"},
                                      {"FERRY_CUDA_MV_STREAM", "FERRY_CUDA_MV_BLK"}, outs);
                } else {
                    gpu_forms_and_cpu(
                        cbe.get(), pc, glu, with_add,
                        {"FERRY_CUDA_MV_STREAM", "FERRY_CUDA_MV_RING"},
                        {"FERRY_CUDA_MV_STREAM", "FERRY_CUDA_MV_RING", "FERRY_CUDA_MV_BLK"}, outs);
                }
                for (const std::vector<float>& o : outs) {
                    ASSERT_EQ(o.size(), static_cast<size_t>(M));
                }
                const std::string what = std::string(type_name(t)) + " K=" + std::to_string(K) +
                                         " M=" + std::to_string(M) +
                                         (ring ? " ring" : " register") +
                                         (glu ? " gate+up+swiglu" : "") + (with_add ? " add" : "");
                EXPECT_LE(nmse_of(outs[0], outs[1]), 1e-10) << what;  // NaN fails too
                EXPECT_LE(nmse_of(outs[0], outs[2]), 1e-4) << what;
            }
        }
    }
}

// The float kernel's raw form (plain weights held as raw bytes, decoded just before use, so
// that 4-8 chunks per matrix are in flight; FERRY_CUDA_MV_FRAW) adds the same chunks in the
// same order as the decoded form: equal bit for bit, for F16, BF16 and F32, plain,
// gate+up+SWIGLU and the residual ADD, rows with a last partial chunk (K = 2056), rows of one
// group and of several (K = 2048 and 4096), and long rows split between warps (K = 8192).
TEST(Cuda, RawFloatProductsEqualTheDecodedForm) {
    REQUIRE_GPU();
    std::unique_ptr<Backend> cbe = reference_cpu();
    Lcg rnd{31u};
    for (Type t : {Type::F16, Type::BF16, Type::F32}) {
        for (int64_t K : {int64_t{2048}, int64_t{2056}, int64_t{4096}, int64_t{8192}}) {
            const int64_t M = K == 8192 ? 2048 : 3000;
            ProductCase pc;
            ASSERT_TRUE(random_product(t, K, M, rnd, pc));
            for (int variant = 0; variant < 3; variant++) {
                const bool glu = variant == 1, with_add = variant == 2;
                // 0: GPU, raw form; 1: GPU, decoded form; 2: CPU
                std::vector<float> outs[3];
                // F16/BF16 run in the streaming form unless it is off.
                gpu_forms_and_cpu(cbe.get(), pc, glu, with_add, {"FERRY_CUDA_MV_STREAM"},
                                  {"FERRY_CUDA_MV_STREAM", "FERRY_CUDA_MV_FRAW"}, outs);
                for (const std::vector<float>& o : outs) {
                    ASSERT_EQ(o.size(), static_cast<size_t>(M));
                }
                const std::string what = std::string(type_name(t)) + " K=" + std::to_string(K) +
                                         (glu ? " gate+up+swiglu" : "") + (with_add ? " add" : "");
                EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4), 0)
                    << what;
                EXPECT_LE(nmse_of(outs[0], outs[2]), 1e-10) << what;  // NaN fails too
            }
        }
    }
}

// The streaming form of the decode products (k_mv_stream, FERRY_CUDA_MV_STREAM) against the
// CPU and against the kernels it replaces (the float kernel for F16/BF16, the int8 kernel for
// Q4_0/Q6_K), for plain, gate+up+SWIGLU and the residual ADD: rows shorter than one piece of
// 2048 weights (K = 264 for F16/BF16, the second chunk partial; K = 256 for Q4_0: four busy
// lanes; K = 1024 for Q6_K), a last partial chunk or span (2056, 2304, 2560), one and two
// pieces a row (2048, 4096), four (8192), fewer rows than a block has warps (M = 5), about
// one item a warp (2048) and tall matrices whose warps take many items, so every slot is
// refilled (M = 24,000). The output is poisoned with NaN first: a row left unwritten fails.
// Q6_K rows here alternate word-aligned and 2-bytes-off super-blocks: both realignments.
TEST(Cuda, StreamProductsMatchTheCpuAndTheOtherKernels) {
    REQUIRE_GPU();
    std::unique_ptr<Backend> cbe = reference_cpu();
    Lcg rnd{37u};
    struct Shape {
        Type t;
        int64_t K, M;
    };
    std::vector<Shape> shapes;
    for (Type t : {Type::F16, Type::BF16}) {
        // K = 12288: b takes the whole 48 KiB of kStreamMaxK (stop 27: the launch failed with
        // "invalid argument" until the kernels asked for more than the default 48 KiB).
        for (Shape sh : {Shape{t, 264, 5}, Shape{t, 2056, 2048}, Shape{t, 2048, 24000},
                         Shape{t, 4096, 3000}, Shape{t, 8192, 2048}, Shape{t, 12288, 600}}) {
            shapes.push_back(sh);
        }
    }
    for (Shape sh :
         {Shape{Type::Q4_0, 256, 5}, Shape{Type::Q4_0, 2304, 2048}, Shape{Type::Q4_0, 2048, 24000},
          Shape{Type::Q4_0, 8192, 2048}, Shape{Type::Q6_K, 1024, 5}, Shape{Type::Q6_K, 2560, 2048},
          Shape{Type::Q6_K, 2048, 24000}, Shape{Type::Q6_K, 8192, 2048}}) {
        shapes.push_back(sh);
    }
    for (const Shape& sh : shapes) {
        const bool plain = sh.t == Type::F16 || sh.t == Type::BF16;
        ProductCase pc;
        ASSERT_TRUE(random_product(sh.t, sh.K, sh.M, rnd, pc));
        for (int variant = 0; variant < 3; variant++) {
            const bool glu = variant == 1, with_add = variant == 2;
            // 0: GPU, streaming form; 1: GPU, the other kernel; 2: CPU
            std::vector<float> outs[3];
            gpu_forms_and_cpu(cbe.get(), pc, glu, with_add, {}, {"FERRY_CUDA_MV_STREAM"}, outs);
            for (const std::vector<float>& o : outs) {
                ASSERT_EQ(o.size(), static_cast<size_t>(sh.M));
            }
            const std::string what = std::string(type_name(sh.t)) + " K=" + std::to_string(sh.K) +
                                     " M=" + std::to_string(sh.M) + (glu ? " gate+up+swiglu" : "") +
                                     (with_add ? " add" : "");
            // The same weights and the same b (floats, or the same int8 quantization of it), the
            // sums in another order: ~1e-14 apart; a wrong or missing piece, block or scale is
            // ~1e-4 or more off. NaN fails every bound.
            EXPECT_LE(nmse_of(outs[0], outs[1]), 1e-10) << what;
            // Against the CPU: the float bound, or ModelShapedProductsMatchTheCpu's for int8 b,
            // a bound on the error of b's quantization averaged over many rows (the GPU quantizes
            // b in blocks of 32, the CPU's Q6_K product in blocks of 256): over 5 rows it is one
            // row's luck (H200, stop 26: Q6_K K=1024 M=5 gate+up 3.8e-4, the int8 kernel's
            // result to 1e-10), so the 5-row int8 cases are held to the bound above only.
            if (plain || sh.M >= 64) {
                EXPECT_LE(nmse_of(outs[0], outs[2]), plain ? 1e-10 : 1e-4) << what;
            }
        }
    }
}

// The streaming form's launches without a folded norm in one 16-warp block per SM (Q4_0/Q6_K
// by default, every type with FERRY_CUDA_MV_STREAM_WIDE=2) sum every row as the two 8-warp
// blocks (FERRY_CUDA_MV_STREAM_WIDE=0) do: the same bits, in products and in decode.
TEST(Cuda, WideStreamBlocksEqualTheDefault) {
    REQUIRE_GPU();
    std::unique_ptr<Backend> cbe = reference_cpu();
    Lcg rnd{43u};
    for (auto [t, K, M] : {std::tuple<Type, int64_t, int64_t>{Type::F16, 264, 5},
                           {Type::F16, 8192, 2048},
                           {Type::BF16, 2048, 24000},
                           {Type::F16, 12288, 600},
                           {Type::Q4_0, 8192, 2048},
                           {Type::Q4_0, 256, 5},
                           {Type::Q6_K, 2048, 24000}}) {
        ProductCase pc;
        ASSERT_TRUE(random_product(t, K, M, rnd, pc));
        for (const bool with_add : {false, true}) {
            std::vector<float> outs[3];
            // (F16/BF16 in the register form: the bulk form has no wide blocks.)
            gpu_forms_and_cpu(cbe.get(), pc, false, with_add,
                              {"FERRY_CUDA_MV_STREAM_WIDE=2", "FERRY_CUDA_MV_BULK=0"},
                              {"FERRY_CUDA_MV_STREAM_WIDE=0", "FERRY_CUDA_MV_BULK=0"}, outs);
            const std::string what = std::string(type_name(t)) + " K=" + std::to_string(K) +
                                     " M=" + std::to_string(M) + (with_add ? " add" : "");
            ASSERT_EQ(outs[0].size(), static_cast<size_t>(M)) << what;
            ASSERT_EQ(outs[1].size(), static_cast<size_t>(M)) << what;
            EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4), 0) << what;
        }
    }
    for (const char* enc : {"f16", "q4_0"}) {
        const std::vector<std::vector<float>> base =
            step_logits(enc, {"FERRY_CUDA_MV_STREAM_WIDE=0", "FERRY_CUDA_MV_BULK=0"});
        const std::vector<std::vector<float>> got =
            step_logits(enc, {"FERRY_CUDA_MV_STREAM_WIDE=2", "FERRY_CUDA_MV_BULK=0"});
        ASSERT_EQ(got.size(), cases().size()) << enc;
        ASSERT_EQ(base.size(), got.size()) << enc;
        for (size_t k = 0; k < got.size(); k++) {
            ASSERT_EQ(got[k].size(), base[k].size()) << enc;
            EXPECT_EQ(std::memcmp(got[k].data(), base[k].data(), got[k].size() * 4), 0)
                << enc << " prompt " << k;
        }
    }
}

// The streaming form's bulk form (FERRY_CUDA_MV_BULK=S for F16/BF16, FERRY_CUDA_MV_BULK_Q=S
// for Q4_0/Q6_K: pieces in shared-memory slots filled by bulk copies) gives the register
// form's bits: products with a short last piece (F16 K = 264, Q4_0 K = 2304), several pieces
// a row (K = 8192, 12288), F16's b in shared memory and from global memory, the GLU pair and
// the residual add, with one slot a warp and with several, one and two blocks per SM, every
// slot issued before griddepcontrol.wait or some after b's loads (FERRY_CUDA_MV_BULK_PRE);
// then token-by-token f16 and q4_0 decode (q/k/v with the folded norm, rope and KV store;
// gate/up; down; the output product).
TEST(Cuda, BulkStreamEqualsTheRegisterForm) {
    REQUIRE_GPU();
    std::unique_ptr<Backend> cbe = reference_cpu();
    Lcg rnd{47u};
    for (auto [t, K, M] : {std::tuple<Type, int64_t, int64_t>{Type::F16, 264, 5},
                           {Type::F16, 2048, 3000},
                           {Type::F16, 8192, 2048},
                           {Type::BF16, 2048, 24000},
                           {Type::F16, 12288, 600},
                           {Type::Q4_0, 2304, 1000},
                           {Type::Q4_0, 8192, 2048},
                           {Type::Q6_K, 2048, 24000}}) {
        ProductCase pc;
        ASSERT_TRUE(random_product(t, K, M, rnd, pc));
        const bool plain = t == Type::F16 || t == Type::BF16;
        const std::string var = plain ? "FERRY_CUDA_MV_BULK=" : "FERRY_CUDA_MV_BULK_Q=";
        // (XGLOBAL=1: F16/BF16 b from global memory for every K, not only K <= 4096.)
        for (const int form : {0, 1, 2}) {
            const std::string slots = var + (form == 0 ? "1" : plain ? "3" : "8");
            const char* xg =
                form == 2 ? "FERRY_CUDA_MV_BULK_XGLOBAL=1" : "FERRY_CUDA_MV_BULK_XGLOBAL=0";
            // (PRE: slots issued before the wait, the rest once b's loads are; 0: all.)
            const std::string pre = "FERRY_CUDA_MV_BULK_PRE=" + std::to_string(form);
            for (const char* blocks :
                 {"FERRY_CUDA_MV_BULK_BLOCKS=1", "FERRY_CUDA_MV_BULK_BLOCKS=2"}) {
                for (const bool glu : {false, true}) {
                    for (const bool with_add : {false, true}) {
                        if (glu && with_add) continue;
                        std::vector<float> outs[3];
                        gpu_forms_and_cpu(cbe.get(), pc, glu, with_add,
                                          {slots.c_str(), blocks, xg, pre.c_str()},
                                          {"FERRY_CUDA_MV_BULK=0"}, outs);
                        const std::string what =
                            std::string(type_name(t)) + " K=" + std::to_string(K) +
                            " M=" + std::to_string(M) + " " + slots + " " + blocks + " " + xg +
                            " " + pre + (glu ? " glu" : "") + (with_add ? " add" : "");
                        ASSERT_EQ(outs[0].size(), static_cast<size_t>(M)) << what;
                        ASSERT_EQ(outs[1].size(), static_cast<size_t>(M)) << what;
                        EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4),
                                  0)
                            << what;
                    }
                }
            }
        }
    }
    for (const char* enc : {"f16", "q4_0"}) {
        const std::vector<std::vector<float>> base =
            step_logits(enc, {"FERRY_CUDA_MV_BULK=0", "FERRY_CUDA_MV_BULK_Q=0"});
        // (The default first: S = 3, PRE = 2.)
        const std::vector<std::vector<std::string>> envs = {
            {"FERRY_CUDA_MV_BULK=3"},
            {"FERRY_CUDA_MV_BULK=2", "FERRY_CUDA_MV_BULK_PRE=0"},
            {"FERRY_CUDA_MV_BULK=3", "FERRY_CUDA_MV_BULK_PRE=0"},
            {"FERRY_CUDA_MV_BULK=3", "FERRY_CUDA_MV_BULK_PRE=1"},
            {"FERRY_CUDA_MV_BULK_Q=4"},
            {"FERRY_CUDA_MV_BULK_Q=8"},
            {"FERRY_CUDA_MV_BULK_Q=8", "FERRY_CUDA_MV_BULK_PRE=2"}};
        for (const std::vector<std::string>& env : envs) {
            std::string slots;
            for (const std::string& e : env) slots += (slots.empty() ? "" : " ") + e;
            const std::vector<std::vector<float>> got = step_logits(enc, env);
            ASSERT_EQ(got.size(), cases().size()) << enc << " " << slots;
            ASSERT_EQ(base.size(), got.size()) << enc << " " << slots;
            for (size_t k = 0; k < got.size(); k++) {
                ASSERT_EQ(got[k].size(), base[k].size()) << enc << " " << slots;
                EXPECT_EQ(std::memcmp(got[k].data(), base[k].data(), got[k].size() * 4), 0)
                    << enc << " " << slots << " prompt " << k;
            }
        }
    }
}

// Token-by-token decode with the ring form gives the register form's logits bit for bit.
TEST(Cuda, RingDecodeEqualsTheRegisterForm) {
    REQUIRE_GPU();
    for (const char* enc : {"q8_0", "q4_0", "q4_k_m", "q6_k"}) {
        // (Q4_0 and Q6_K products run in the streaming form unless it is off.)
        static const std::vector<std::string> kOn = {"FERRY_CUDA_MV_STREAM=0"};
        static const std::vector<std::string> kOff = {"FERRY_CUDA_MV_STREAM=0",
                                                      "FERRY_CUDA_MV_RING=0"};
        const std::vector<std::vector<float>> on = step_logits(enc, kOn);
        const std::vector<std::vector<float>> off = step_logits(enc, kOff);
        ASSERT_EQ(on.size(), cases().size()) << enc;
        ASSERT_EQ(off.size(), cases().size()) << enc;
        for (size_t k = 0; k < on.size(); k++) {
            ASSERT_EQ(on[k].size(), off[k].size()) << enc;
            EXPECT_EQ(std::memcmp(on[k].data(), off[k].data(), on[k].size() * 4), 0)
                << enc << " prompt " << k;
        }
    }
}

// Progressive results (BackendOptions::progressive_results, what `ferry serve` asks for over
// tcp): a one-column product of many rows, last in its graph and with its RMS norm folded in
// like a model's output product, is handed over in pieces while the GPU computes: through the
// host mirror (the default) and in the cut form. Over six computes (a direct run, the capture,
// replays), reading the whole result and a middle part that crosses piece boundaries, with
// unread runs and an unmirrored F32 product in between, the bytes are those of a backend made
// without the option (the cut form in more than one piece); nothing else is offered (another
// tensor, a second read, a backend without the option).
TEST(Cuda, ProgressiveResultsGiveTheUsualBytes) {
    REQUIRE_GPU();
    Lcg rnd{21u};
    const int64_t K = 2048, M = 40000, M32 = 20000, K32 = 256;
    const size_t bytes = static_cast<size_t>(M) * 4;
    // Each type's weights, made once (quantizing 82M values on the CPU took most of the test's
    // ~130 s when every case made its own).
    std::map<Type, std::vector<uint8_t>> weights;
    for (const Type t : {Type::F16, Type::Q6_K, Type::Q8_0}) {
        ASSERT_TRUE(random_weights(t, K, M, rnd, weights[t])) << type_name(t);
    }
    // The host mirror (the default: F16 in the streaming form's bulk form, Q6_K in its
    // register form), the cut form (FERRY_CUDA_PIECE_CUT=1), and the mirror of each type's
    // other form (FERRY_CUDA_MV_BULK=0, FERRY_CUDA_MV_BULK_Q=8).
    for (const int mode : {0, 1, 2}) {
        const bool cut = mode == 1, other = mode == 2;
        // The streaming form (F16, Q6_K) and the int8 kernel (Q8_0), with the RMS norm folded
        // in; and a plain Q6_K product (the streaming form's one-block-per-SM launch).
        const struct {
            Type t;
            bool norm;
        } cases[] = {
            {Type::F16, true}, {Type::Q6_K, true}, {Type::Q8_0, true}, {Type::Q6_K, false}};
        for (const auto& cs : cases) {
            const Type t = cs.t;
            if (other && t == Type::Q8_0) continue;
            SCOPED_TRACE(std::string(type_name(t)) + (cut ? ", cut" : ", mirror") +
                         (other ? " (the other form)" : "") + (cs.norm ? "" : ", no norm"));
            // The streaming kernel's products are mirrored unless the cut form is asked for;
            // the int8 kernel's (Q8_0) are cut either way.
            const bool mirrored = !cut && t != Type::Q8_0;
            const std::vector<uint8_t>& wb = weights[t];
            std::vector<float> nv(static_cast<size_t>(K)), xv(nv.size());
            for (float& v : nv) v = rnd() + 1.5f;
            BackendOptions po;
            po.progressive_results = true;
            if (cut) setenv("FERRY_CUDA_PIECE_CUT", "1", 1);
            if (other) {
                setenv("FERRY_CUDA_MV_BULK", "0", 1);
                setenv("FERRY_CUDA_MV_BULK_Q", "8", 1);
            }
            Expected<std::unique_ptr<Backend>> pbe = gpu()->make_backend(po);
            unsetenv("FERRY_CUDA_PIECE_CUT");
            unsetenv("FERRY_CUDA_MV_BULK");
            unsetenv("FERRY_CUDA_MV_BULK_Q");
            Expected<std::unique_ptr<Backend>> ube = gpu()->make_backend();
            ASSERT_TRUE(pbe && ube);
            BufferType* bt = gpu()->buffer_type();
            Context in, gc;
            Tensor* w = in.new_tensor(t, {K, M});
            Tensor* x = in.new_tensor(Type::F32, {K, 1});
            Tensor* nw = in.new_tensor(Type::F32, {K});
            // A product of F32 weights, which no mirrored kernel takes (computed in between).
            Tensor* w32 = in.new_tensor(Type::F32, {K32, M32});
            Tensor* x32 = in.new_tensor(Type::F32, {K32, 1});
            Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, bt);
            ASSERT_TRUE(buf) << buf.message();
            ASSERT_TRUE(tensor_set(w, wb.data(), wb.size()));
            ASSERT_TRUE(tensor_set(nw, nv.data(), nv.size() * 4));
            {
                std::vector<float> v32(static_cast<size_t>(K32 * (M32 + 1)));
                for (float& v : v32) v = rnd();
                ASSERT_TRUE(tensor_set(w32, v32.data(), static_cast<size_t>(K32 * M32) * 4));
                ASSERT_TRUE(tensor_set(x32, v32.data() + K32 * M32, static_cast<size_t>(K32) * 4));
            }
            Tensor* y =
                cs.norm ? gc.mul_mat(w, gc.mul(gc.rms_norm(x, 1e-5f), nw)) : gc.mul_mat(w, x);
            y->flags |= kTensorOutput;
            Graph g;
            g.build_forward(y);
            GraphAllocator alloc(bt);
            ASSERT_TRUE(alloc.allocate(g));
            Context gc32;
            Tensor* y32 = gc32.mul_mat(w32, x32);
            y32->flags |= kTensorOutput;
            Graph g32;
            g32.build_forward(y32);
            GraphAllocator alloc32(bt);
            ASSERT_TRUE(alloc32.allocate(g32));
            const std::vector<float> poison(static_cast<size_t>(M), std::nanf(""));
            for (int step = 0; step < 6; step++) {
                for (float& v : xv) v = rnd() * 3.0f;
                ASSERT_TRUE(tensor_set(x, xv.data(), xv.size() * 4));
                if (step == 2 || step == 3) {
                    // A run nobody reads, then the F32 product (not the streaming kernel's: in
                    // the cut form), before the run that is read.
                    ASSERT_TRUE((*pbe)->compute(g));
                    ASSERT_TRUE((*pbe)->compute(g32));
                    PieceRead r32 = (*pbe)->read_in_pieces(y32, 0, static_cast<size_t>(M32) * 4);
                    EXPECT_NE(r32.data, nullptr) << "step " << step;  // (in the cut form)
                    ASSERT_TRUE((*pbe)->synchronize());
                }
                ASSERT_TRUE((*ube)->compute(g));
                ASSERT_TRUE((*ube)->synchronize());
                std::vector<float> want(static_cast<size_t>(M));
                ASSERT_TRUE(tensor_get(y, want.data(), bytes));
                ASSERT_TRUE(tensor_set(y, poison.data(), bytes));
                // Odd steps read rows [15000, 27000): the end of one piece, two whole ones, the
                // start of a fourth (8 pieces of 5,120 rows by default).
                const size_t off = step % 2 ? 15000 * 4 : 0, len = step % 2 ? 12000 * 4 : bytes;
                ASSERT_TRUE((*pbe)->compute(g));
                PieceRead pr = (*pbe)->read_in_pieces(y, off, len);
                ASSERT_NE(pr.data, nullptr) << "step " << step;
                ASSERT_EQ(pr.size, len);
                size_t have = 0;
                int waits = 0;
                while (have < len) {
                    Expected<size_t> r = pr.wait(have);
                    ASSERT_TRUE(r) << r.message();
                    ASSERT_GT(*r, have);
                    ASSERT_LE(*r, len);
                    have = *r;
                    waits++;
                }
                // The cut form hands out whole pieces; the mirror every step of W G rows
                // whose flag is set (all of it at once when the GPU was quicker).
                if (!mirrored) {
                    EXPECT_GE(waits, 2) << "step " << step;
                }
                EXPECT_EQ(
                    std::memcmp(pr.data, reinterpret_cast<const uint8_t*>(want.data()) + off, len),
                    0)
                    << "step " << step;
                // Read once: the next call gets the usual path.
                EXPECT_EQ((*pbe)->read_in_pieces(y, off, len).data, nullptr);
                // The pinned copy (the mirror's rows and its 64 step flags; from step 2 on also
                // the F32 product's pieces) is reported for a host to charge; a backend without
                // pieces holds none.
                EXPECT_EQ((*pbe)->scratch_bytes(), (mirrored ? bytes + 64 * 4 : bytes) +
                                                       (mirrored && step >= 2 ? M32 * 4 : 0));
                EXPECT_EQ((*ube)->scratch_bytes(), 0u);
                std::vector<float> got(static_cast<size_t>(M));
                ASSERT_TRUE(tensor_get(y, got.data(), bytes));
                EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << "step " << step;
            }
            ASSERT_TRUE((*pbe)->compute(g));
            EXPECT_EQ((*pbe)->read_in_pieces(x, 0, xv.size() * 4).data, nullptr);
            EXPECT_EQ((*pbe)->read_in_pieces(y, bytes - 4, 8).data, nullptr);  // past its end
            ASSERT_TRUE((*pbe)->synchronize());
            ASSERT_TRUE((*ube)->compute(g));
            EXPECT_EQ((*ube)->read_in_pieces(y, 0, bytes).data, nullptr);
            ASSERT_TRUE((*ube)->synchronize());
        }
    }
}

// A server's progressive replies by its step trace (FERRY_STEP_TRACE files in dir, written as
// its connections end): the computes it was asked for, its progressive replies and their
// pieces, and the first event out of order (a reply's first piece, its later ones, the last;
// a striped reply's stripe 0 and then every stripe sent).
struct ProgressiveTrace {
    int computes = 0, replies = 0, pieces = 0;
    std::string disorder;
};
ProgressiveTrace read_progressive_trace(const std::string& dir) {
    constexpr unsigned kCompute = 12;  // GRAPH_COMPUTE
    ProgressiveTrace r;
    for (const TraceFile& f : read_step_traces(dir)) {
        if (f.role != "server") continue;
        int64_t prev = 0;
        char last = 0;
        for (const TraceEvent& e : f.events) {
            const int64_t t = e.t;
            const char k = e.kind;
            r.computes += k == 'H' && e.cmd == kCompute;
            if (k != 'F' && k != 'P' && k != 'L' && k != '0' && k != 'A') continue;
            const bool ok = k == 'F'   ? last != 'P'
                            : k == '0' ? last != 'P' && last != '0'
                            : k == 'A' ? last == '0'
                                       : last == 'F' || last == 'P';
            if ((!ok || t < prev) && r.disorder.empty()) {
                r.disorder = strfmt("%s: '%c' after '%c' (reply %d)", f.name.c_str(), k,
                                    last ? last : '-', r.replies);
            }
            r.replies += k == 'F';
            r.pieces += k == 'F' || k == 'P' || k == 'L';
            last = k, prev = t;
        }
    }
    return r;
}

// The same through `ferry serve` over tcp (a child process serving CUDA0): a generated model
// whose 20,000-entry vocabulary makes its logits a progressive product. Every decode step's
// logits are the local GPU's bit for bit, with the server's pieces on (the kernel's host mirror
// by default, the cut form, and on one connection) and off (FERRY_CUDA_PIECES=0), over graph
// rebuilds (KV length 256 -> 512).
// The server's step trace shows the decode steps' logits sent in pieces (none with them off),
// its events in order.
TEST(Cuda, ServedTcpLogitsEqualLocalWithProgressiveReads) {
    REQUIRE_GPU();
    const ModelPreset p = {"test-v20k", 20000, 1024, 256, 2, 4, 2, 512, 10000.0f, 1e-5f, false};
    std::vector<int32_t> toks;
    const std::string path = generated_model(p, 5u, &toks);
    ASSERT_FALSE(path.empty());
    std::vector<float> local;
    {
        const OpenSession os = open_session(path, {gpu()}, Type::F16);
        ASSERT_TRUE(os.s);
        ASSERT_TRUE(os.s->decode(std::span<const int32_t>(toks.data(), 8), false));
        for (size_t i = 8; i < toks.size(); i++) {
            ASSERT_TRUE(os.s->decode(std::span<const int32_t>(&toks[i], 1), false));
            local.insert(local.end(), os.s->logits(0), os.s->logits(0) + p.n_vocab);
        }
    }
    // The server's environment: the default (the mirror; striped when the client joins stripe
    // connections, as it does on hosts of 8+ threads), none, 2 pieces (the cut form's count:
    // the mirror's steps are the kernel's, so still the mirror), the cut form (8 launches), and
    // on one connection.
    for (const char* env : {"FERRY_CUDA_PIECES=8", "FERRY_CUDA_PIECES=0", "FERRY_CUDA_PIECES=2",
                            "FERRY_CUDA_PIECE_CUT=1", "FERRY_SERVE_PIECE_STRIPES=0"}) {
        SCOPED_TRACE(env);
        const std::string e = env;
        const std::string name = e.substr(0, e.find('='));
        const std::string dir = make_temp_dir();
        setenv(name.c_str(), e.c_str() + name.size() + 1, 1);
        setenv("FERRY_STEP_TRACE", dir.c_str(), 1);
        ServerProcess srv;
        std::string err;
        const bool up = srv.start("tcp:127.0.0.1:0", {"-d", "CUDA0"}, &err);
        unsetenv(name.c_str());
        unsetenv("FERRY_STEP_TRACE");
        ASSERT_TRUE(up) << err;
        const size_t steps = toks.size() - 8;
        {
            Expected<std::unique_ptr<Registry>> reg = remote_open(srv.addr());
            ASSERT_TRUE(reg) << reg.message();
            ASSERT_FALSE((*reg)->devices().empty());
            Device* rdev = (*reg)->devices()[0];
            ASSERT_NE(std::string(rdev->name()).find("CUDA0"), std::string::npos) << rdev->name();
            const OpenSession os = open_session(path, {rdev}, Type::F16);
            ASSERT_TRUE(os.s);
            ASSERT_TRUE(os.s->decode(std::span<const int32_t>(toks.data(), 8), false));
            std::vector<float> served;
            for (size_t i = 8; i < toks.size(); i++) {
                const Status st = os.s->decode(std::span<const int32_t>(&toks[i], 1), false);
                ASSERT_TRUE(st) << st.message();
                served.insert(served.end(), os.s->logits(0), os.s->logits(0) + p.n_vocab);
            }
            const size_t first = first_difference(local, served);
            EXPECT_EQ(first, local.size())
                << "decode step " << first / static_cast<size_t>(p.n_vocab);
            Expected<RemoteStats> st = remote_stats(reg->get());
            ASSERT_TRUE(st) << st.message();
            EXPECT_EQ(st->errors, 0u);
        }
        // The session's connections are closed: the server writes their files (by a rename)
        // once it has seen that.
        ProgressiveTrace tr;
        for (int i = 0; i < 250 && tr.computes < static_cast<int>(steps); i++) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            tr = read_progressive_trace(dir);
        }
        EXPECT_GE(tr.computes, static_cast<int>(steps));
        EXPECT_EQ(tr.disorder, "");
        if (e == "FERRY_CUDA_PIECES=0") {
            EXPECT_EQ(tr.replies, 0);
        } else {
            // A read that finds the whole product done (its server thread came late) goes
            // out whole, not in pieces: 290-292 of these 292 steps did on an H100 (stop 47).
            EXPECT_GE(tr.replies, static_cast<int>(steps * 9 / 10));
            EXPECT_GT(tr.pieces, tr.replies) << "no reply came in more than one piece";
        }
        std::filesystem::remove_all(dir);
    }
    std::remove(path.c_str());
}

TEST(Cuda, EventsAndPinnedUploads) {
    REQUIRE_GPU();
    Expected<std::unique_ptr<Backend>> be = gpu()->make_backend();
    ASSERT_TRUE(be) << be.message();
    BufferType* pinned = gpu()->host_buffer_type();
    ASSERT_NE(pinned, nullptr);
    EXPECT_TRUE(pinned->is_host());
    Context hc, dc;
    Tensor* h = hc.new_tensor(Type::F32, {1 << 20});
    Tensor* d = dc.new_tensor(Type::F32, {1 << 20});
    Expected<std::unique_ptr<Buffer>> hb = allocate_context_tensors(hc, pinned);
    ASSERT_TRUE(hb) << hb.message();
    ASSERT_NE(h->data, nullptr);
    Expected<std::unique_ptr<Buffer>> db = allocate_context_tensors(dc, gpu()->buffer_type());
    ASSERT_TRUE(db) << db.message();
    EXPECT_EQ(d->data, nullptr);  // device memory is not host-addressable
    float* hv = static_cast<float*>(h->data);
    for (int i = 0; i < (1 << 20); i++) hv[i] = static_cast<float>(i) * 0.5f;
    ASSERT_TRUE((*be)->copy_tensor_async(h, d));
    Expected<std::unique_ptr<Event>> ev = gpu()->make_event();
    ASSERT_TRUE(ev) << ev.message();
    ASSERT_TRUE((*be)->record_event(ev->get()));
    ASSERT_TRUE((*ev)->synchronize());
    std::vector<float> back(1 << 20);
    ASSERT_TRUE(tensor_get(d, back.data(), back.size() * 4));
    EXPECT_EQ(back[12345], 12345 * 0.5f);
    EXPECT_EQ(back.back(), static_cast<float>((1 << 20) - 1) * 0.5f);
    // A second backend (stream) waits for the first one's event.
    Expected<std::unique_ptr<Backend>> be2 = gpu()->make_backend();
    ASSERT_TRUE(be2) << be2.message();
    ASSERT_TRUE((*be2)->wait_event(ev->get()));
    ASSERT_TRUE((*be2)->synchronize());
}

TEST(Cuda, TooLargeAllocationNamesTheDeviceAndSizes) {
    REQUIRE_GPU();
    const DeviceMemory m = gpu()->memory();
    Expected<std::unique_ptr<Buffer>> b = gpu()->buffer_type()->allocate(m.total * 2);
    ASSERT_FALSE(b);
    EXPECT_NE(b.message().find("CUDA0"), std::string::npos) << b.message();
    EXPECT_NE(b.message().find("MiB"), std::string::npos) << b.message();
    // The device still works after the refusal.
    Expected<std::unique_ptr<Buffer>> ok = gpu()->buffer_type()->allocate(1 << 20);
    EXPECT_TRUE(ok) << ok.message();
}

// ---------------------------------------------------------------------------------------------
// Two GPUs (CUDA0 and CUDA1; SKIPPED with fewer).

Device* gpu1() {
    return find_device("CUDA1");
}

#define REQUIRE_TWO_GPUS()                                                               \
    do {                                                                                 \
        REQUIRE_GPU();                                                                   \
        if (!gpu1()) GTEST_SKIP() << "one CUDA device: this test needs CUDA0 and CUDA1"; \
    } while (0)

// Bytes copied from one GPU's memory into the other's arrive intact, both ways, by the buffer's
// copy and by the backend's asynchronous copy (what the scheduler uses between the layers of a
// split model); the asynchronous copy's speed is printed (peer to peer where the pair allows).
TEST(Cuda, CopiesBetweenTwoGpus) {
    REQUIRE_TWO_GPUS();
    constexpr int64_t n = 64 << 20;  // 256 MiB of f32
    std::vector<float> src(static_cast<size_t>(n)), back(static_cast<size_t>(n));
    Lcg rnd{7};
    for (float& v : src) v = rnd();
    Device* devs[2] = {gpu(), gpu1()};
    for (int from = 0; from < 2; from++) {
        Device* sd = devs[from];
        Device* dd = devs[1 - from];
        Context sc, dc;
        Tensor* a = sc.new_tensor(Type::F32, {n});
        Tensor* b = dc.new_tensor(Type::F32, {n});
        Expected<std::unique_ptr<Buffer>> sb = allocate_context_tensors(sc, sd->buffer_type());
        ASSERT_TRUE(sb) << sb.message();
        Expected<std::unique_ptr<Buffer>> db = allocate_context_tensors(dc, dd->buffer_type());
        ASSERT_TRUE(db) << db.message();
        ASSERT_TRUE(tensor_set(a, src.data(), src.size() * 4));
        ASSERT_TRUE((*db)->clear(0));
        ASSERT_TRUE(b->buffer->copy_tensor(a, b)) << sd->name() << " -> " << dd->name();
        ASSERT_TRUE(tensor_get(b, back.data(), back.size() * 4));
        EXPECT_EQ(std::memcmp(back.data(), src.data(), src.size() * 4), 0)
            << "buffer copy " << sd->name() << " -> " << dd->name();

        Expected<std::unique_ptr<Backend>> be = dd->make_backend();
        ASSERT_TRUE(be) << be.message();
        ASSERT_TRUE((*db)->clear(0));
        constexpr int kReps = 10;
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < kReps; r++) ASSERT_TRUE((*be)->copy_tensor_async(a, b));
        ASSERT_TRUE((*be)->synchronize());
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fill(back.begin(), back.end(), 0.0f);
        ASSERT_TRUE(tensor_get(b, back.data(), back.size() * 4));
        EXPECT_EQ(std::memcmp(back.data(), src.data(), src.size() * 4), 0)
            << "asynchronous copy " << sd->name() << " -> " << dd->name();
        std::printf("[ cuda     ] %s -> %s: %.1f GB/s (10 copies of 256 MiB)\n", sd->name(),
                    dd->name(), kReps * static_cast<double>(n) * 4 / s / 1e9);
    }
}

// A model split over two GPUs (half the layers each, the activations handed over by a
// device-to-device copy) gives the logits one GPU gives, bit for bit: the same kernels on the
// same kind of GPU in the same order, prompts at once and token by token (CUDA-graph replay on
// each GPU).
TEST(Cuda, ModelSplitOverTwoGpusGivesOneGpusLogits) {
    REQUIRE_TWO_GPUS();
    for (const char* enc : {"f16", "q4_0", "q8_0"}) {
        for (bool stepwise : {false, true}) {
            const std::string path = kDir + "/tiny-llama-" + enc + ".gguf";
            const auto one = session_logits(path, {gpu()}, Type::F16, stepwise);
            const auto two = session_logits(path, {gpu(), gpu1()}, Type::F16, stepwise);
            ASSERT_EQ(one.size(), cases().size()) << enc;
            ASSERT_EQ(two.size(), one.size()) << enc;
            for (size_t k = 0; k < one.size(); k++) {
                EXPECT_EQ(two[k], one[k]) << enc << (stepwise ? " token by token" : " prompt")
                                          << " case " << k << ": nmse " << nmse_of(two[k], one[k]);
            }
        }
    }
}

}  // namespace
