// The OpenVINO backend (graph translation) on OPENVINO:CPU: every op it claims against the
// float64 reference, the tiny-llama logits against the oracle for every encoding, greedy text
// equal to the CPU backend's, a graph split between OpenVINO and the CPU, compilations bounded
// over a long generation, and bad input reported as errors. Without the backend built (no
// OpenVINO in .venv) these report SKIPPED.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/json.h"
#include "device-checks.h"
#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/llama.h"
#include "ferry/op-tests.h"
#ifdef FERRY_HAVE_OPENVINO
#include "backends/openvino/openvino-backend.h"
#endif

using namespace ferry;
using namespace ferry::test;

namespace {

Device* ov_cpu() {
    return find_device("OPENVINO:CPU");
}

BackendOptions two_threads() {
    BackendOptions o;
    o.n_threads = 2;
    return o;
}

#define REQUIRE_OV()                                                                 \
    do {                                                                             \
        if (!ov_cpu()) GTEST_SKIP() << "no OPENVINO:CPU device (backend not built)"; \
    } while (0)

TEST(OpenVino, EveryClaimedOpMatchesTheReference) {
    REQUIRE_OV();
    Expected<std::unique_ptr<Backend>> be = ov_cpu()->make_backend(two_threads());
    ASSERT_TRUE(be) << be.message();
    const test::OpSuiteCounts n = test::run_op_suite(be->get(), "openvino");
    EXPECT_EQ(n.failed, 0);
    // Every op of the llama/qwen graphs is among the passed ones: at most the quantized
    // copies and views are declined.
    EXPECT_LE(n.declined, 12);
    EXPECT_GT(n.passed, 150);
}

// ---------------------------------------------------------------------------------------------
// tiny-llama against the float64 oracle (as tests/test_llama.cpp, with the weights on OpenVINO)

class OpenVinoOracle : public ::testing::TestWithParam<Peer> {};

TEST_P(OpenVinoOracle, AtLeastAsCloseAsPeerWithF16Cache) {
    REQUIRE_OV();
    expect_at_least_as_close_as_peer(GetParam(), ov_cpu(), "openvino");
}

INSTANTIATE_TEST_SUITE_P(Encodings, OpenVinoOracle, ::testing::ValuesIn(peers_but_q5_k_m()),
                         peer_name);

// q5_k_m: one top-1 position short of the peer on an oracle near-tie, closer by mean KL
// (device-checks.h says why; OpenVINO multiplies f32 activations by Q5_K dequantized to f16).
TEST(OpenVino, Q5KMBeatsThePeersKLButIsOneTop1PositionShort) {
    REQUIRE_OV();
    expect_q5_k_m_one_top1_position_short(ov_cpu(), "openvino");
}

TEST(OpenVino, F32WithF32CacheMatchesOracle) {
    REQUIRE_OV();
    const Metrics r = measure("f32", Type::F32, ov_cpu());
    ASSERT_TRUE(r.ok);
    std::printf("[ openvino ] f32 kv f32: nmse max %.2e  top1 min %.3f  KL mean %.2e\n", r.nmse_max,
                r.top1_min, r.kl_mean);
    EXPECT_LE(r.nmse_max, 1e-8);
    EXPECT_EQ(r.top1_min, 1.0);
}

// NMSE of run against ref (same length).
double nmse(const std::vector<float>& run, const std::vector<float>& ref) {
    double err = 0.0, r = 0.0;
    for (size_t j = 0; j < ref.size(); j++) {
        const double e = static_cast<double>(run[j]) - ref[j];
        err += e * e;
        r += static_cast<double>(ref[j]) * ref[j];
    }
    return err / r;
}

// Greedy continuation of every fixture prompt, token by token, with the logits row each
// choice was made from.
struct Greedy {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<std::vector<float>>> rows;  // [case][step][vocab]
};

Greedy greedy(const std::string& enc, Device* dev, int n) {
    Greedy out;
    Expected<std::unique_ptr<LlamaModel>> m = load(enc, dev);
    EXPECT_TRUE(m) << m.message();
    if (!m) return out;
    SessionOptions so;
    so.n_threads = 2;
    so.n_ctx = 128;
    Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
    EXPECT_TRUE(s) << s.message();
    if (!s) return out;
    for (const Case& c : cases()) {
        (*s)->reset();
        std::vector<int32_t> got;
        std::vector<std::vector<float>> rows;
        Status st = (*s)->decode(c.tokens, false);
        for (int i = 0; st && i < n; i++) {
            const float* l = (*s)->logits(0);
            const int32_t next = static_cast<int32_t>(std::max_element(l, l + kVocab) - l);
            got.push_back(next);
            rows.emplace_back(l, l + kVocab);
            st = (*s)->decode(std::vector<int32_t>{next}, false);
        }
        EXPECT_TRUE(st) << st.message();
        out.tokens.push_back(got);
        out.rows.push_back(std::move(rows));
    }
    return out;
}

// OpenVINO's greedy text is the CPU's, up to a near-tie. The two backends round differently
// (the CPU multiplies q8_0 weights against activations quantized to 8 bits, OpenVINO against
// f32 ones; their vector kernels add in different orders, and those differ between AVX2 and
// AVX-512 machines), so where two candidates are nearly tied the choice may part: seen for
// q8_0, prompt 2, step 5 on an AVX-512 machine (candidates 620 and 339, 0.06 apart in 12.3).
// The check: the texts agree up to their first difference, and there, after the same tokens,
// the two backends' logit rows agree to NMSE <= (2 sqrt(e))^2 = 4 e, e = the peer's worst
// NMSE against the float64 oracle for the encoding (two rows each within e of the oracle are
// within that of each other) -- a parting caused by anything but rounding has rows far apart.
// Not the 4-bit files: there the rows differ by more (q4_0 parts at prompt 0, step 13).
TEST(OpenVino, GreedyTextEqualsTheCpus) {
    REQUIRE_OV();
    struct Enc {
        const char* name;
        double peer_nmse;  // the fixture README's "nmse max" for llama.cpp
    };
    for (const Enc& e : {Enc{"f32", 3.61e-7}, Enc{"f16", 9.35e-7}, Enc{"q8_0", 3.93e-4}}) {
        const Greedy ov = greedy(e.name, ov_cpu(), 24);
        const Greedy cpu = greedy(e.name, nullptr, 24);
        ASSERT_EQ(ov.tokens.size(), cases().size());
        ASSERT_EQ(cpu.tokens.size(), cases().size());
        for (size_t k = 0; k < cases().size(); k++) {
            ASSERT_EQ(ov.tokens[k].size(), cpu.tokens[k].size()) << e.name;
            size_t i = 0;
            while (i < ov.tokens[k].size() && ov.tokens[k][i] == cpu.tokens[k][i]) i++;
            if (i == ov.tokens[k].size()) continue;
            const std::vector<float>& a = ov.rows[k][i];
            const std::vector<float>& b = cpu.rows[k][i];
            const double rows_nmse = nmse(a, b);
            std::printf(
                "[ openvino ] %s prompt %zu parts at step %zu: OpenVINO %d (%.4f vs %.4f), CPU %d "
                "(%.4f vs %.4f), rows nmse %.2e (bound %.2e)\n",
                e.name, k, i, ov.tokens[k][i], a[static_cast<size_t>(ov.tokens[k][i])],
                a[static_cast<size_t>(cpu.tokens[k][i])], cpu.tokens[k][i],
                b[static_cast<size_t>(cpu.tokens[k][i])], b[static_cast<size_t>(ov.tokens[k][i])],
                rows_nmse, 4.0 * e.peer_nmse);
            EXPECT_LE(rows_nmse, 4.0 * e.peer_nmse)
                << e.name << " prompt " << k << " step " << i << ": not a near-tie";
        }
    }
}

#ifdef FERRY_HAVE_OPENVINO
// Prefill and decode share one compiled model: the token count and KV length are dynamic, and
// the session selects the logits rows by index rather than by a view at an offset. A prompt,
// 256 generated tokens and then a chunk of 5 more tokens compile one model, not one per step,
// per prompt length or per KV length.
TEST(OpenVino, LongGenerationCompilesFewModels) {
    REQUIRE_OV();
    Expected<std::unique_ptr<LlamaModel>> m = load("q8_0", ov_cpu());
    ASSERT_TRUE(m) << m.message();
    SessionOptions so;
    so.n_threads = 2;
    so.n_ctx = 512;
    Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
    ASSERT_TRUE(s) << s.message();
    const uint64_t before = openvino::stats().compiles;
    Status st0 = (*s)->decode(cases()[0].tokens, false);
    ASSERT_TRUE(st0) << st0.message();
    for (int i = 0; i < 256; i++) {
        const float* l = (*s)->logits(0);
        const int32_t next = static_cast<int32_t>(std::max_element(l, l + kVocab) - l);
        ASSERT_TRUE((*s)->decode(std::vector<int32_t>{next}, false));
    }
    const std::vector<int32_t> chunk(cases()[1].tokens.begin(), cases()[1].tokens.begin() + 5);
    ASSERT_TRUE((*s)->decode(chunk, false));
    const uint64_t compiles = openvino::stats().compiles - before;
    std::printf("[ openvino ] prompt of %zu + 256 generated + 5 tokens: %llu compilations\n",
                cases()[0].tokens.size(), static_cast<unsigned long long>(compiles));
    EXPECT_EQ(compiles, 1u);
}

// A multi-step decode on a session: the prompt, then `steps` tokens one at a time (the tokens
// are given, so two devices see the same inputs), the rows truncated back to `rewind` halfway
// (later steps overwrite cached rows), and the logits of every step.
struct Decoded {
    std::vector<std::vector<float>> logits;  // per step, kVocab
    std::vector<uint64_t> copied;            // openvino::stats().bytes_copied per step
    std::vector<uint64_t> window;            // openvino::stats().bytes_bound_window per step
};
Decoded decode_steps(const std::string& enc, Type kv, Device* dev, int n_ctx,
                     const std::vector<int32_t>& steps, int rewind) {
    Decoded d;
    Expected<std::unique_ptr<LlamaModel>> m = load(enc, dev);
    EXPECT_TRUE(m) << m.message();
    if (!m) return d;
    SessionOptions so;
    so.n_threads = 2;
    so.n_ctx = n_ctx;
    so.kv_type = kv;
    Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
    EXPECT_TRUE(s) << s.message();
    if (!s) return d;
    Status st = (*s)->decode(cases()[0].tokens, false);
    EXPECT_TRUE(st) << st.message();
    for (size_t i = 0; st && i < steps.size(); i++) {
        if (rewind > 0 && i == steps.size() / 2) (*s)->truncate(rewind);
        const openvino::Stats before = openvino::stats();
        st = (*s)->decode(std::vector<int32_t>{steps[i]}, false);
        EXPECT_TRUE(st) << st.message();
        const openvino::Stats after = openvino::stats();
        d.copied.push_back(after.bytes_copied - before.bytes_copied);
        d.window.push_back(after.bytes_bound_window - before.bytes_bound_window);
        d.logits.emplace_back((*s)->logits(0), (*s)->logits(0) + kVocab);
    }
    return d;
}

std::vector<int32_t> step_tokens(int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; i++) t.push_back(static_cast<int32_t>((37 * i + 11) % kVocab));
    return t;
}

// The attention reads the KV cache in place (no copy of the attended rows with the step's rows
// scattered in): every step of a decode, including steps after the cache was truncated (the
// new rows land on stale ones), gives the CPU backend's logits to the f32 tolerance of the
// oracle tests, with an f32 and with an f16 cache.
TEST(OpenVino, DecodeReadingTheCacheInPlaceMatchesTheCpu) {
    REQUIRE_OV();
    const std::vector<int32_t> steps = step_tokens(24);
    const int rewind = static_cast<int>(cases()[0].tokens.size()) + 4;
    for (Type kv : {Type::F32, Type::F16}) {
        SCOPED_TRACE(type_name(kv));
        const uint64_t in_place = openvino::stats().attention_in_place;
        const Decoded ov = decode_steps("f32", kv, ov_cpu(), 128, steps, rewind);
        const Decoded cpu = decode_steps("f32", kv, nullptr, 128, steps, rewind);
        // Every layer's attention (4) of the one compiled model took the in-place path.
        EXPECT_EQ(openvino::stats().attention_in_place - in_place, 4u);
        openvino::set_attention_in_place(false);
        const Decoded copied = decode_steps("f32", kv, ov_cpu(), 128, steps, rewind);
        openvino::set_attention_in_place(true);
        ASSERT_EQ(ov.logits.size(), steps.size());
        ASSERT_EQ(cpu.logits.size(), steps.size());
        ASSERT_EQ(copied.logits.size(), steps.size());
        double worst = 0.0, worst_before = 0.0, before_cpu = 0.0;
        for (size_t i = 0; i < steps.size(); i++) {
            worst = std::max(worst, nmse(ov.logits[i], cpu.logits[i]));
            worst_before = std::max(worst_before, nmse(ov.logits[i], copied.logits[i]));
            before_cpu = std::max(before_cpu, nmse(copied.logits[i], cpu.logits[i]));
        }
        std::printf(
            "[ openvino ] %zu decode steps, kv %s: nmse max against the earlier "
            "translation %.2e, against the CPU %.2e (earlier translation: %.2e)\n",
            steps.size(), type_name(kv), worst_before, worst, before_cpu);
        if (kv == Type::F32) {
            EXPECT_LE(worst_before, 1e-8);
            EXPECT_LE(worst, 1e-8);
        } else {
            // f16: the step's own rows are rounded to f16 before it attends to them, as the
            // CPU reads them back from its cache. The earlier translation attended to them
            // unrounded (the plugin drops a Convert to f16 and back): 9.1e-07 from the CPU,
            // this one 1.9e-07 (rows a last f32 bit apart round to neighbouring f16 values,
            // and later steps carry that on). No farther from the CPU than before.
            EXPECT_LT(worst, before_cpu);
        }
    }
}

// What the backend copies per decode step does not depend on the context: the same steps with
// a cache of 128 and of 1024 positions copy the same bytes (the new K and V rows and the
// logits), and later steps (more rows attended) copy no more than earlier ones; the plugin is
// shown the attended rows of each cache, not its n_ctx rows.
TEST(OpenVino, BytesCopiedPerDecodeStepDoNotGrowWithTheContext) {
    REQUIRE_OV();
    const std::vector<int32_t> steps = step_tokens(16);
    const Decoded small = decode_steps("f32", Type::F16, ov_cpu(), 128, steps, 0);
    const Decoded large = decode_steps("f32", Type::F16, ov_cpu(), 1024, steps, 0);
    ASSERT_EQ(small.copied.size(), steps.size());
    ASSERT_EQ(large.copied.size(), steps.size());
    // tiny-llama: 4 layers, 4 KV heads of 32, f16 cache; logits 1024 f32.
    const uint64_t row = 4 * 32 * 2, expected = 4 * 2 * row + kVocab * 4;
    const size_t p0 = cases()[0].tokens.size();
    for (size_t i = 0; i < steps.size(); i++) {
        EXPECT_EQ(small.copied[i], expected) << "step " << i;
        EXPECT_EQ(large.copied[i], expected) << "step " << i;
        // K and V of 4 layers, bound by the attended rows (the positions so far).
        EXPECT_EQ(small.window[i], large.window[i]) << "step " << i;
        EXPECT_GE(small.window[i], 4 * 2 * row * (p0 + i + 1)) << "step " << i;
        EXPECT_LT(small.window[i], 4 * 2 * row * 128) << "step " << i;
    }
    std::printf(
        "[ openvino ] per decode step: %llu bytes copied at n_ctx 128 and 1024; "
        "cache rows shown to the plugin %llu -> %llu bytes (whole caches: %llu, %llu)\n",
        static_cast<unsigned long long>(small.copied.back()),
        static_cast<unsigned long long>(small.window.front()),
        static_cast<unsigned long long>(small.window.back()),
        static_cast<unsigned long long>(4 * 2 * row * 128),
        static_cast<unsigned long long>(4 * 2 * row * 1024));
}

// A graph split between OpenVINO and the CPU: with the attention on the CPU, it reads the rows
// OpenVINO stored into ferry's cache (the cache as ferry sees it is right); with the norms on
// the CPU, every layer is split and OpenVINO's attention reads the cache in place. Both decode
// as the CPU alone does, steps after a truncation included. (A SET_ROWS into a cache held by
// OPENVINO:CPU cannot be sent to the CPU: the scheduler refuses it.)
TEST(OpenVino, CacheSharedWithTheCpuInASplitGraph) {
    REQUIRE_OV();
    const std::vector<int32_t> steps = step_tokens(12);
    const int rewind = static_cast<int>(cases()[0].tokens.size()) + 2;
    const Decoded cpu = decode_steps("f32", Type::F32, nullptr, 128, steps, rewind);
    ASSERT_EQ(cpu.logits.size(), steps.size());
    for (Op declined : {Op::FLASH_ATTN_EXT, Op::RMS_NORM}) {
        SCOPED_TRACE(op_name(declined));
        openvino::set_declined_ops({declined});
        const Decoded ov = decode_steps("f32", Type::F32, ov_cpu(), 128, steps, rewind);
        openvino::set_declined_ops({});
        ASSERT_EQ(ov.logits.size(), steps.size());
        double worst = 0.0;
        for (size_t i = 0; i < steps.size(); i++)
            worst = std::max(worst, nmse(ov.logits[i], cpu.logits[i]));
        std::printf("[ openvino ] %s on the CPU: nmse max against the CPU %.2e\n",
                    op_name(declined), worst);
        EXPECT_LE(worst, 1e-8);
    }
}

// A session reads candidates (set_top_k) only where the logits' device runs TOP_K: declined,
// the scheduler would bring the whole row to the CPU for it, so the session reads the row.
TEST(OpenVino, SessionReadsCandidatesOnlyWhereTheDeviceRunsTopK) {
    REQUIRE_OV();
    Expected<std::unique_ptr<LlamaModel>> m = load("q8_0", ov_cpu());
    ASSERT_TRUE(m) << m.message();
    SessionOptions so;
    so.n_threads = 2;
    const std::vector<int32_t> prompt = {1, 45, 99, 300};
    for (bool declined : {false, true}) {
        SCOPED_TRACE(declined ? "declined" : "offered");
        openvino::set_declined_ops(declined ? std::vector<Op>{Op::TOP_K} : std::vector<Op>{});
        Expected<std::unique_ptr<LlamaSession>> s = LlamaSession::create(**m, so);
        ASSERT_TRUE(s) << s.message();
        (*s)->set_top_k(40);
        openvino::set_declined_ops({});
        EXPECT_EQ((*s)->top_k(), declined ? 0 : 40);
        ASSERT_TRUE((*s)->decode(prompt, false));
        EXPECT_EQ((*s)->n_top(), declined ? 0 : 40);
        EXPECT_EQ((*s)->logits(0) != nullptr, declined);
    }
}

// An op OpenVINO declines runs on the CPU: the scheduler splits every layer between the two
// devices, and the logits stay as close to the oracle.
TEST(OpenVino, DeclinedOpRunsOnTheCpu) {
    REQUIRE_OV();
    expect_declined_rms_norm_runs_on_the_cpu(ov_cpu(), openvino::set_declined_ops, "openvino");
}

// Weights converted by prepare_weights (q8_0 and q4_0 in place, q6_k apart with its blocks
// given back) are not GGUF blocks any more: even when the products and row gathers are
// declined, the ops that read those weights stay on OpenVINO (the CPU would compute on the
// converted bytes), and the logits are the undeclined run's.
TEST(OpenVino, OpsOnConvertedWeightsAreNeverSentToTheCpu) {
    REQUIRE_OV();
    for (const char* enc : {"q8_0", "q4_0", "q6_k"}) {
        SCOPED_TRACE(enc);
        const Metrics base = measure(enc, Type::F16, ov_cpu());
        ASSERT_TRUE(base.ok);
        openvino::set_declined_ops({Op::MUL_MAT, Op::GET_ROWS});
        const Metrics declined = measure(enc, Type::F16, ov_cpu());
        openvino::set_declined_ops({});
        ASSERT_TRUE(declined.ok);
        EXPECT_EQ(declined.nmse_max, base.nmse_max);
        EXPECT_EQ(declined.kl_mean, base.kl_mean);
    }
}
#endif  // FERRY_HAVE_OPENVINO

// A node the translators lack, computed on the device directly, fails naming the op; the
// backend keeps working afterwards.
TEST(OpenVino, UntranslatableNodeFailsNamingTheOp) {
    REQUIRE_OV();
    Expected<std::unique_ptr<Backend>> be = ov_cpu()->make_backend(two_threads());
    ASSERT_TRUE(be) << be.message();
    Context in, gc;
    Tensor* src = in.new_tensor(Type::F32, {64, 2});
    Tensor* dst = in.new_tensor(Type::Q8_0, {64, 2});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, ov_cpu()->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    std::vector<float> v(128, 0.25f);
    ASSERT_TRUE(tensor_set(src, v.data(), v.size() * 4));
    Tensor* c = gc.cpy(src, dst);
    c->flags |= kTensorOutput;
    EXPECT_FALSE(ov_cpu()->supports_op(c));
    Graph g;
    g.build_forward(c);
    GraphAllocator alloc(ov_cpu()->buffer_type());
    ASSERT_TRUE(alloc.allocate(g));
    Status st = (*be)->compute(g);
    ASSERT_FALSE(st);
    EXPECT_NE(st.message().find("CPY"), std::string::npos) << st.message();
    EXPECT_EQ(st.code(), ErrorCode::Unsupported) << st.message();
}

// A row index out of range is an error naming the op and the index (OpenVINO itself would
// answer zeros); the same graph then runs with good indices.
TEST(OpenVino, OutOfRangeIndexIsAnError) {
    REQUIRE_OV();
    Expected<std::unique_ptr<Backend>> be = ov_cpu()->make_backend(two_threads());
    ASSERT_TRUE(be) << be.message();
    Context in, gc;
    Tensor* a = in.new_tensor(Type::F32, {8, 11});
    Tensor* idx = in.new_tensor(Type::I32, {3});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, ov_cpu()->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    std::vector<float> av(88);
    for (size_t i = 0; i < av.size(); i++) av[i] = static_cast<float>(i) + 0.5f;
    ASSERT_TRUE(tensor_set(a, av.data(), av.size() * 4));
    Tensor* rows = gc.get_rows(a, idx);
    rows->flags |= kTensorOutput;
    Graph g;
    g.build_forward(rows);
    GraphAllocator alloc(ov_cpu()->buffer_type());
    ASSERT_TRUE(alloc.allocate(g));
    for (int bad : {11, -1}) {
        const int32_t iv[3] = {1, bad, 2};
        ASSERT_TRUE(tensor_set(idx, iv, sizeof(iv)));
        Status st = (*be)->compute(g);
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

// FERRY_OPENVINO_CONFIG hands further compile properties to the plugin (experiments such as
// DYNAMIC_QUANTIZATION_GROUP_SIZE=32): a good one compiles and gives the same rows, an entry
// that is not KEY=VALUE is an error naming the variable, and a property the plugin rejects is
// an error, not a crash. It is read at each compilation (each new backend compiles afresh).
TEST(OpenVino, ExtraCompilePropertiesFromTheEnvironment) {
    REQUIRE_OV();
    Context in, gc;
    Tensor* a = in.new_tensor(Type::F32, {8, 5});
    Tensor* idx = in.new_tensor(Type::I32, {2});
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, ov_cpu()->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    std::vector<float> av(40);
    for (size_t i = 0; i < av.size(); i++) av[i] = static_cast<float>(i) * 0.25f;
    ASSERT_TRUE(tensor_set(a, av.data(), av.size() * 4));
    const int32_t iv[2] = {4, 1};
    ASSERT_TRUE(tensor_set(idx, iv, sizeof(iv)));
    Tensor* rows = gc.get_rows(a, idx);
    rows->flags |= kTensorOutput;
    Graph g;
    g.build_forward(rows);
    GraphAllocator alloc(ov_cpu()->buffer_type());
    ASSERT_TRUE(alloc.allocate(g));
    auto run = [&](const char* config) {
        setenv("FERRY_OPENVINO_CONFIG", config, 1);
        Expected<std::unique_ptr<Backend>> be = ov_cpu()->make_backend(two_threads());
        Status st = be ? (*be)->compute(g) : be.status();
        unsetenv("FERRY_OPENVINO_CONFIG");
        return st;
    };
    ASSERT_TRUE(run("INFERENCE_NUM_THREADS=1,DYNAMIC_QUANTIZATION_GROUP_SIZE=32"));
    std::vector<float> out(16);
    ASSERT_TRUE(tensor_get(rows, out.data(), out.size() * 4));
    EXPECT_EQ(out[0], av[32]);
    EXPECT_EQ(out[8], av[8]);
    Status st = run("INFERENCE_NUM_THREADS");
    ASSERT_FALSE(st);
    EXPECT_NE(st.message().find("FERRY_OPENVINO_CONFIG: 'INFERENCE_NUM_THREADS' is not KEY=VALUE"),
              std::string::npos)
        << st.message();
    st = run("NOT_AN_OPENVINO_PROPERTY=1");
    ASSERT_FALSE(st);
    EXPECT_NE(st.message().find("NOT_AN_OPENVINO_PROPERTY"), std::string::npos) << st.message();
}

}  // namespace

// Resident pages among the whole pages inside [p, p + n), and how many whole pages there are.
static std::pair<size_t, size_t> resident_pages(const void* p, size_t n) {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (b <= a) return {0, 0};
    std::vector<unsigned char> v((b - a) / page);
    if (mincore(reinterpret_cast<void*>(a), b - a, v.data()) != 0) return {~size_t{0}, v.size()};
    size_t r = 0;
    for (unsigned char c : v) r += c & 1;
    return {r, v.size()};
}

// Q4_0 and Q8_0 weights are converted for OpenVINO over their own bytes (no second copy): the
// values in place, the scales apart as f32, and the whole pages past the values (where the
// blocks' f16 scales would go) given back to the system. The buffer still answers their GGUF
// blocks to a reader, whole or in part, and refuses writes that would no longer reach the
// converted form.
TEST(OpenVino, WeightsConvertedInPlaceReadBackAsTheirBlocks) {
    REQUIRE_OV();
    for (Type type : {Type::Q4_0, Type::Q8_0}) {
        Context in;
        Tensor* w = in.new_tensor(type, {256, 2048});
        w->flags |= kTensorParam;
        Expected<std::unique_ptr<Buffer>> buf =
            allocate_context_tensors(in, ov_cpu()->buffer_type());
        ASSERT_TRUE(buf) << buf.message();
        std::vector<float> x(256 * 2048);
        for (size_t i = 0; i < x.size(); i++) x[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
        std::vector<uint8_t> blocks(w->nbytes());
        type_traits(type).from_float(x.data(), blocks.data(), static_cast<int64_t>(x.size()));
        ASSERT_TRUE(tensor_set(w, blocks.data(), blocks.size()));
        // values: 4 or 8 bits per element; the 2-byte scales of the blocks follow them
        const size_t vb = type == Type::Q4_0 ? x.size() / 2 : x.size();
        ASSERT_EQ(vb + x.size() / 32 * 2, w->nbytes());
        const auto [before, pages] =
            resident_pages(static_cast<uint8_t*>(w->data) + vb, w->nbytes() - vb);
        ASSERT_GE(pages, 7u);
        EXPECT_EQ(before, pages) << type_name(type);
        Tensor* ws[] = {w};
        ASSERT_TRUE(ov_cpu()->prepare_weights(ws));
        ASSERT_NE(w->extra, nullptr);
        EXPECT_EQ(resident_pages(static_cast<uint8_t*>(w->data) + vb, w->nbytes() - vb).first, 0u)
            << type_name(type) << ": the pages past the values were not given back";
        EXPECT_NE(std::memcmp(w->data, blocks.data(), blocks.size()), 0)
            << type_name(type) << ": not converted in place";
        std::vector<uint8_t> back(blocks.size());
        ASSERT_TRUE((*buf)->get_tensor(w, back.data(), 0, back.size()));
        EXPECT_EQ(back, blocks) << type_name(type);
        std::vector<uint8_t> part(50);
        ASSERT_TRUE((*buf)->get_tensor(w, part.data(), 7, part.size()));
        EXPECT_TRUE(std::equal(part.begin(), part.end(), blocks.begin() + 7)) << type_name(type);
        Status st = (*buf)->set_tensor(w, blocks.data(), 0, blocks.size());
        ASSERT_FALSE(st);
        EXPECT_NE(st.message().find("converted for OpenVINO"), std::string::npos) << st.message();
    }
}

// A weight converted into a larger form (Q6_K -> i8 with a scale per 16) gives its GGUF blocks'
// pages back; reading them is an error naming the tensor, never zeros.
TEST(OpenVino, WeightsConvertedApartReleaseTheirBlocks) {
    REQUIRE_OV();
    Context in;
    Tensor* w = in.new_tensor(Type::Q6_K, {256, 64});
    w->set_name("w_q6k");
    w->flags |= kTensorParam;
    Expected<std::unique_ptr<Buffer>> buf = allocate_context_tensors(in, ov_cpu()->buffer_type());
    ASSERT_TRUE(buf) << buf.message();
    std::vector<float> x(256 * 64);
    for (size_t i = 0; i < x.size(); i++) x[i] = std::cos(0.11f * static_cast<float>(i));
    std::vector<uint8_t> blocks(w->nbytes());
    type_traits(Type::Q6_K).from_float(x.data(), blocks.data(), static_cast<int64_t>(x.size()));
    ASSERT_TRUE(tensor_set(w, blocks.data(), blocks.size()));
    Tensor* ws[] = {w};
    ASSERT_TRUE(ov_cpu()->prepare_weights(ws));
    ASSERT_NE(w->extra, nullptr);
    std::vector<uint8_t> back(blocks.size());
    Status st = (*buf)->get_tensor(w, back.data(), 0, back.size());
    ASSERT_FALSE(st);
    EXPECT_NE(st.message().find("w_q6k"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("released"), std::string::npos) << st.message();
}
