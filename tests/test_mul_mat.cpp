// Tests for the CPU MUL_MAT: the SIMD b-row quantizers against the reference (byte identity),
// the SIMD dot products against the reference dots, the direct and packed kernels (fast and
// portable) against a double-precision oracle, and the op through the CPU backend for every
// weight type, with broadcasting, strided operands, and 1/2/3-thread bit identity.
//
// Error bounds. Oracle "exact": double dot of the dequantized weights with b as the kernel sees
// it (b quantized to Q8_0 / Q8_K and dequantized, for the quantized types): what remains is
// float rounding of per-block scales and of the accumulation, NMSE ~1e-14..1e-12; bound 1e-10.
// Oracle "float": the same with the original F32 b: adds the error of quantizing b. For b
// uniform in [-1, 1], a 32- or 256-element block's absmax is ~1, the step d ~ 1/127, the
// rounding error d / sqrt(12) ~ 2.3e-3 against rms(b) = 0.577: relative 3.9e-3, NMSE ~1.6e-5 for
// independent weights; bound 6e-5 (about 4x). Float weight types are exact up to accumulation
// rounding: bound 1e-10.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu-backend.h"
#include "backends/cpu/simd/simd.h"
#include "core/quants.h"
#include "ferry/allocator.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "ferry/tensor.h"

using namespace ferry;

namespace {

constexpr double kExactNmse = 1e-10;
constexpr double kQuantNmse = 6e-5;

const Type kWeightTypes[] = {Type::F32,  Type::F16,    Type::BF16,   Type::Q4_0,
                             Type::Q4_1, Type::Q5_0,   Type::Q5_1,   Type::Q8_0,
                             Type::Q2_K, Type::Q3_K,   Type::Q4_K,   Type::Q5_K,
                             Type::Q6_K, Type::IQ4_NL, Type::IQ4_XS, Type::MXFP4};

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

std::vector<uint8_t> quantize_rows(Type t, const float* x, int64_t nrows, int64_t k) {
    const size_t rs = row_size(t, k);
    std::vector<uint8_t> out(rs * static_cast<size_t>(nrows));
    for (int64_t r = 0; r < nrows; r++) {
        EXPECT_TRUE(from_float_row(t, x + r * k, out.data() + r * rs, k).is_ok());
    }
    return out;
}

std::vector<float> dequantize(Type t, const uint8_t* x, int64_t nrows, int64_t k, size_t stride) {
    std::vector<float> out(static_cast<size_t>(nrows * k));
    for (int64_t r = 0; r < nrows; r++) {
        EXPECT_TRUE(to_float_row(t, x + r * stride, out.data() + r * k, k).is_ok());
    }
    return out;
}

// b as the kernels see it: rounded through the type's vec_dot partner.
std::vector<float> partner_round(Type weight, const float* b, int64_t nrows, int64_t k) {
    const Type vdt = type_traits(weight).vec_dot_type;
    if (vdt == Type::F32) return std::vector<float>(b, b + nrows * k);
    const std::vector<uint8_t> q = quantize_rows(vdt, b, nrows, k);
    return dequantize(vdt, q.data(), nrows, k, row_size(vdt, k));
}

double nmse(const float* got, const double* want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

// ---------------------------------------------------------------------------------------------
// Quantizers

std::vector<float> quantizer_inputs(int64_t n, uint32_t seed) {
    std::vector<float> x = random_floats(static_cast<size_t>(n), seed, -3.0f, 3.0f);
    // Blocks with special content: all zero, tiny (subnormal scales), huge, ties, a single spike.
    for (int i = 0; i < 256; i++) x[i] = 0.0f;
    for (int i = 256; i < 512; i++) x[i] = 1e-40f * static_cast<float>(i % 7 - 3);
    for (int i = 512; i < 768; i++) x[i] = 6e4f * static_cast<float>(i % 5 - 2);
    for (int i = 768; i < 1024; i++) x[i] = static_cast<float>(i % 9 - 4) * 0.5f;
    for (int i = 1024; i < 1280; i++) x[i] = i == 1100 ? 100.0f : 1e-3f;
    return x;
}

TEST(MulMatQuantize, Q8_0MatchesReferenceBytes) {
    const int64_t n = 4096;
    const std::vector<float> x = quantizer_inputs(n, 1);
    std::vector<uint8_t> ref(row_size(Type::Q8_0, n)), got(ref.size());
    quants::quantize_row_q8_0(x.data(), ref.data(), n);
    cpu::simd::quantize_row_q8_0(x.data(), got.data(), n);
    EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size()));
}

TEST(MulMatQuantize, Q8_KMatchesReferenceBytes) {
    const int64_t n = 4096;
    const std::vector<float> x = quantizer_inputs(n, 2);
    std::vector<uint8_t> ref(row_size(Type::Q8_K, n)), got(ref.size());
    quants::quantize_row_q8_k(x.data(), ref.data(), n);
    cpu::simd::quantize_row_q8_k(x.data(), got.data(), n);
    EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size()));
}

// ---------------------------------------------------------------------------------------------
// vec_dot against the reference dot

class MulMatTyped : public ::testing::TestWithParam<Type> {};

TEST_P(MulMatTyped, VecDotMatchesReference) {
    const Type t = GetParam();
    const TypeTraits& tr = type_traits(t);
    for (int64_t n : {256, 1024, 4096}) {
        for (uint32_t seed = 0; seed < 4; seed++) {
            const std::vector<float> xf = random_floats(static_cast<size_t>(n), 10 + seed);
            const std::vector<float> yf = random_floats(static_cast<size_t>(n), 20 + seed);
            const std::vector<uint8_t> x = quantize_rows(t, xf.data(), 1, n);
            const std::vector<uint8_t> y = quantize_rows(tr.vec_dot_type, yf.data(), 1, n);
            float ref = 0, got = 0;
            tr.vec_dot(n, &ref, x.data(), y.data());
            cpu::simd::vec_dot(t, n, &got, x.data(), y.data());
            // |error| relative to sum |x_i y_i|: float accumulation over at most n / 16 terms
            // per lane (float types) or n / 32 block sums (quantized types).
            const std::vector<float> xd = dequantize(t, x.data(), 1, n, x.size());
            const std::vector<float> yd = dequantize(tr.vec_dot_type, y.data(), 1, n, y.size());
            double mag = 0;
            for (int64_t i = 0; i < n; i++) mag += std::fabs(static_cast<double>(xd[i]) * yd[i]);
            EXPECT_LE(std::fabs(static_cast<double>(got) - ref), 4e-6 * mag)
                << type_name(t) << " n=" << n << " ref=" << ref << " got=" << got;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels directly: direct tiles and the packed GEMM, fast and portable.

struct KernelCase {
    int64_t k, m, n;
};

// out[c * m + r] for the whole matrix via the direct tiles.
std::vector<float> run_direct(const cpu::simd::MatKernels& mk, Type t, const uint8_t* a,
                              const float* b, int64_t k, int64_t m, int64_t n) {
    const size_t rs = row_size(t, k);
    std::vector<uint8_t> yq;
    const uint8_t* y = reinterpret_cast<const uint8_t*>(b);
    size_t by = static_cast<size_t>(k) * 4;
    if (mk.quantize_b) {
        by = (mk.b_bytes(k) + 63) / 64 * 64;
        yq.resize(by * static_cast<size_t>(n) + 64);
        uint8_t* base = yq.data() + (64 - reinterpret_cast<uintptr_t>(yq.data()) % 64) % 64;
        for (int64_t c = 0; c < n; c++) mk.quantize_b(b + c * k, base + c * by, k);
        y = base;
    }
    std::vector<float> out(static_cast<size_t>(m * n), NAN);
    for (int64_t r = 0; r < m; r += cpu::simd::kDirectRows) {
        for (int64_t c = 0; c < n; c += cpu::simd::kDirectCols) {
            const int nr = static_cast<int>(std::min<int64_t>(cpu::simd::kDirectRows, m - r));
            const int nc = static_cast<int>(std::min<int64_t>(cpu::simd::kDirectCols, n - c));
            mk.direct(k, a + r * rs, rs, nr, y + c * by, by, nc, out.data() + c * m + r,
                      static_cast<size_t>(m));
        }
    }
    return out;
}

std::vector<float> run_packed(const cpu::simd::PackedKernels& pk, Type t, const uint8_t* a,
                              const float* b, int64_t k, int64_t m, int64_t n) {
    const size_t rs = row_size(t, k);
    const size_t cb = pk.column_bytes(k);
    std::vector<uint8_t> cols(cb * static_cast<size_t>(n) + 64);
    uint8_t* colp = cols.data() + (64 - reinterpret_cast<uintptr_t>(cols.data()) % 64) % 64;
    for (int64_t c = 0; c < n; c++) pk.convert_column(b + c * k, k, colp + c * cb);
    const size_t gb = pk.group_bytes(k);
    std::vector<uint8_t> g(2 * gb + 64);
    uint8_t* g0 = g.data() + (64 - reinterpret_cast<uintptr_t>(g.data()) % 64) % 64;
    uint8_t* g1 = g0 + gb;
    std::vector<float> out(static_cast<size_t>(m * n), NAN);
    for (int64_t r = 0; r < m; r += 2 * cpu::simd::kPackRows) {
        const int nr = static_cast<int>(std::min<int64_t>(2 * cpu::simd::kPackRows, m - r));
        pk.pack(a + r * rs, rs, std::min(nr, cpu::simd::kPackRows), k, g0);
        const bool two = nr > cpu::simd::kPackRows;
        if (two) pk.pack(a + (r + 16) * rs, rs, nr - cpu::simd::kPackRows, k, g1);
        for (int64_t c = 0; c < n; c += 4) {
            const int nc = static_cast<int>(std::min<int64_t>(4, n - c));
            pk.gemm(k, g0, two ? g1 : nullptr, nr, colp + c * cb, cb, nc, out.data() + c * m + r,
                    static_cast<size_t>(m));
        }
    }
    return out;
}

// Double oracle: out[c * m + r] = sum a_deq[r] * bq[c].
std::vector<double> oracle(const std::vector<float>& ad, const std::vector<float>& bd, int64_t k,
                           int64_t m, int64_t n) {
    std::vector<double> out(static_cast<size_t>(m * n));
    for (int64_t c = 0; c < n; c++) {
        for (int64_t r = 0; r < m; r++) {
            double s = 0;
            for (int64_t i = 0; i < k; i++) s += static_cast<double>(ad[r * k + i]) * bd[c * k + i];
            out[c * m + r] = s;
        }
    }
    return out;
}

TEST_P(MulMatTyped, KernelsMatchOracle) {
    const Type t = GetParam();
    const bool kq = block_size(t) == kQK_K;
    std::vector<KernelCase> cases = {
        {kq ? 256 : 96, 7, 5}, {kq ? 512 : 160, 37, 9}, {kq ? 256 : 32, 33, 1}};
    // Float rows of any length: k that is no multiple of the vector width (8 or 16) exercises
    // the tails of the float tiles.
    if (block_size(t) == 1) {
        cases.push_back({45, 6, 3});
        cases.push_back({7, 5, 2});
    }
    for (const KernelCase& kc : cases) {
        const std::vector<float> af = random_floats(static_cast<size_t>(kc.m * kc.k), 3);
        const std::vector<float> bf = random_floats(static_cast<size_t>(kc.n * kc.k), 4);
        const std::vector<uint8_t> a = quantize_rows(t, af.data(), kc.m, kc.k);
        const std::vector<float> ad = dequantize(t, a.data(), kc.m, kc.k, row_size(t, kc.k));
        const std::vector<float> bq = partner_round(t, bf.data(), kc.n, kc.k);
        const std::vector<double> want = oracle(ad, bq, kc.k, kc.m, kc.n);
        const size_t total = static_cast<size_t>(kc.m * kc.n);
        for (bool portable : {false, true}) {
            const cpu::simd::MatKernels& mk = cpu::simd::mat_kernels(t, portable);
            const std::vector<float> d = run_direct(mk, t, a.data(), bf.data(), kc.k, kc.m, kc.n);
            EXPECT_LE(nmse(d.data(), want.data(), total), kExactNmse)
                << type_name(t) << " direct portable=" << portable << " m=" << kc.m;
            if (mk.packed) {
                const std::vector<float> p =
                    run_packed(*mk.packed, t, a.data(), bf.data(), kc.k, kc.m, kc.n);
                EXPECT_LE(nmse(p.data(), want.data(), total), kExactNmse)
                    << type_name(t) << " packed portable=" << portable << " m=" << kc.m;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The op through the CPU backend

struct OpCase {
    int64_t k, m, n;
    int64_t a2, a3, b2, b3;
    int64_t a_pad;  // extra elements per a row (a is a strided view)
    int64_t b_pad;  // extra floats per b row (b is a strided view)
};

struct OpResult {
    std::vector<float> out;
    std::vector<double> want_exact;
    std::vector<double> want_float;
};

OpResult run_op(Type t, const OpCase& oc, const std::vector<int>& threads,
                std::vector<std::vector<float>>* outs) {
    Context ctx;
    const int64_t ka = oc.k + oc.a_pad, kb = oc.k + oc.b_pad;
    Tensor* abig = ctx.new_tensor(t, {ka, oc.m, oc.a2, oc.a3});
    Tensor* bbig = ctx.new_tensor(Type::F32, {kb, oc.n, oc.b2, oc.b3});
    Tensor* a = oc.a_pad ? ctx.view(abig, {oc.k, oc.m, oc.a2, oc.a3},
                                    {abig->nb[1], abig->nb[2], abig->nb[3]}, 0)
                         : abig;
    Tensor* b = oc.b_pad ? ctx.view(bbig, {oc.k, oc.n, oc.b2, oc.b3},
                                    {bbig->nb[1], bbig->nb[2], bbig->nb[3]}, 0)
                         : bbig;
    Tensor* out = ctx.mul_mat(a, b);
    auto buf = allocate_context_tensors(ctx, cpu::host_buffer_type());
    EXPECT_TRUE(buf.has_value()) << buf.message();

    const int64_t arows = oc.m * oc.a2 * oc.a3, brows = oc.n * oc.b2 * oc.b3;
    const std::vector<float> af = random_floats(static_cast<size_t>(arows * ka), 100);
    const std::vector<float> bf = random_floats(static_cast<size_t>(brows * kb), 200);
    const std::vector<uint8_t> aq = quantize_rows(t, af.data(), arows, ka);
    std::memcpy(abig->data, aq.data(), aq.size());
    std::memcpy(bbig->data, bf.data(), bf.size() * 4);

    OpResult res;
    Graph g;
    g.build_forward(out);
    for (int nth : threads) {
        auto be = cpu::make_cpu_backend(nth);
        const Status st = be->compute(g);
        EXPECT_TRUE(st.is_ok()) << st.message();
        const float* o = static_cast<const float*>(out->data);
        outs->emplace_back(o, o + out->nelements());
    }
    res.out = outs->front();

    // Oracles, in the output's layout [m, n, b2, b3].
    const size_t ars = row_size(t, ka);
    std::vector<float> brow(static_cast<size_t>(oc.k));
    res.want_exact.resize(res.out.size());
    res.want_float.resize(res.out.size());
    for (int64_t i3 = 0; i3 < oc.b3; i3++) {
        for (int64_t i2 = 0; i2 < oc.b2; i2++) {
            const int64_t am = (i3 / (oc.b3 / oc.a3)) * oc.a2 + i2 / (oc.b2 / oc.a2);
            const std::vector<float> ad =
                dequantize(t, aq.data() + am * oc.m * ars, oc.m, oc.k, ars);
            for (int64_t i1 = 0; i1 < oc.n; i1++) {
                const float* bsrc = bf.data() + ((i3 * oc.b2 + i2) * oc.n + i1) * kb;
                const std::vector<float> bq = partner_round(t, bsrc, 1, oc.k);
                for (int64_t i0 = 0; i0 < oc.m; i0++) {
                    double se = 0, sf = 0;
                    for (int64_t i = 0; i < oc.k; i++) {
                        se += static_cast<double>(ad[i0 * oc.k + i]) * bq[i];
                        sf += static_cast<double>(ad[i0 * oc.k + i]) * bsrc[i];
                    }
                    const size_t o =
                        static_cast<size_t>(((i3 * oc.b2 + i2) * oc.n + i1) * oc.m + i0);
                    res.want_exact[o] = se;
                    res.want_float[o] = sf;
                }
            }
        }
    }
    return res;
}

TEST_P(MulMatTyped, OpMatchesOracleAndIsThreadInvariant) {
    const Type t = GetParam();
    const bool kq = block_size(t) == kQK_K;
    const bool fl = !is_quantized(t);
    const int64_t bs = block_size(t);
    const OpCase cases[] = {
        // decode-like, prefill-like (packed path for quantized), odd sizes
        {kq ? 256 : 128, 33, 1, 1, 1, 1, 1, 0, 0},
        {kq ? 512 : 96, 7, 33, 1, 1, 1, 1, 0, 0},
        {kq ? 256 : (fl ? 37 : 64), 33, 7, 1, 1, 1, 1, 0, 0},
        {kq ? 256 : 64, 70, 40, 1, 1, 1, 1, 0, 0},
        // broadcasting a over dims 2-3, strided a and b
        {kq ? 256 : 64, 7, 9, 2, 1, 6, 2, bs == 1 ? 3 : bs, 5},
        {kq ? 256 : 64, 5, 3, 2, 1, 6, 1, 0, 8},
        // few columns but much of b: one shared conversion, barrier and dynamic tasks
        {1024, 9, 7, 1, 1, 3, 1, 0, 0},
    };
    for (const OpCase& oc : cases) {
        std::vector<std::vector<float>> outs;
        const OpResult r = run_op(t, oc, {1, 2, 3}, &outs);
        const size_t n = r.out.size();
        const double e_exact = nmse(r.out.data(), r.want_exact.data(), n);
        const double e_float = nmse(r.out.data(), r.want_float.data(), n);
        EXPECT_LE(e_exact, kExactNmse)
            << type_name(t) << " k=" << oc.k << " m=" << oc.m << " n=" << oc.n;
        EXPECT_LE(e_float, fl ? kExactNmse : kQuantNmse)
            << type_name(t) << " k=" << oc.k << " m=" << oc.m << " n=" << oc.n;
        for (size_t i = 1; i < outs.size(); i++) {
            EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[i].data(), n * sizeof(float)))
                << type_name(t) << ": thread count changed the result (case m=" << oc.m
                << " n=" << oc.n << ")";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MulMatTyped, ::testing::ValuesIn(kWeightTypes),
                         [](const ::testing::TestParamInfo<Type>& info) {
                             return std::string(type_name(info.param));
                         });

TEST(MulMatOp, SupportedByCpuDevice) {
    Context ctx;
    Tensor* a = ctx.new_tensor(Type::Q4_K, {256, 4});
    Tensor* b = ctx.new_tensor(Type::F32, {256, 3});
    Tensor* out = ctx.mul_mat(a, b);
    Device* cpu = nullptr;
    for (Registry* reg : registries()) {
        for (Device* d : reg->devices()) {
            if (d->type() == DeviceType::CPU) cpu = d;
        }
    }
    ASSERT_NE(cpu, nullptr);
    EXPECT_TRUE(cpu->supports_op(out));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Repacked weights (CpuDevice::prepare_weights): the layout's kernels, the op on a repacked
// weight, and every other reader of the weight.

namespace {

Device* cpu_device() {
    for (Registry* reg : registries()) {
        for (Device* d : reg->devices()) {
            if (d->type() == DeviceType::CPU) return d;
        }
    }
    return nullptr;
}

// The repacked tile (8 rows) over every full group and the direct tile over the rest, as the
// op does: out[c * m + r].
std::vector<float> run_repacked(const cpu::simd::RepackedKernels& rk, const uint8_t* a,
                                const float* b, int64_t k, int64_t m, int64_t n) {
    const size_t rs = row_size(rk.type, k);
    const size_t by = (rk.b_bytes(k) + 63) / 64 * 64;
    std::vector<uint8_t> yq(by * static_cast<size_t>(n) + 64);
    uint8_t* y = yq.data() + (64 - reinterpret_cast<uintptr_t>(yq.data()) % 64) % 64;
    for (int64_t c = 0; c < n; c++) rk.quantize_b(b + c * k, y + c * by, k);
    std::vector<float> out(static_cast<size_t>(m * n), NAN);
    const int64_t full = m / cpu::simd::kRepackRows * cpu::simd::kRepackRows;
    for (int64_t c = 0; c < n; c += 4) {
        const int nc = static_cast<int>(std::min<int64_t>(4, n - c));
        for (int64_t r = 0; r < full; r += cpu::simd::kRepackRows) {
            rk.tile(k, a + r * rs, y + c * by, by, nc, out.data() + c * m + r,
                    static_cast<size_t>(m));
        }
        for (int64_t r = full; r < m; r += cpu::simd::kDirectRows) {
            const int nr = static_cast<int>(std::min<int64_t>(cpu::simd::kDirectRows, m - r));
            rk.direct(k, a + r * rs, rs, nr, y + c * by + rk.direct_b_offset(k), by, nc,
                      out.data() + c * m + r, static_cast<size_t>(m));
        }
    }
    return out;
}

// Repacks the full groups of m rows at a (a copy) the way prepare_weights does.
std::vector<uint8_t> repack_copy(const cpu::simd::RepackedKernels& rk, const uint8_t* a, int64_t k,
                                 int64_t m) {
    const size_t rs = row_size(rk.type, k);
    std::vector<uint8_t> out(a, a + rs * static_cast<size_t>(m));
    std::vector<uint8_t> tmp(rk.group_bytes(k));
    for (int64_t r = 0; r + cpu::simd::kRepackRows <= m; r += cpu::simd::kRepackRows) {
        rk.repack(out.data() + r * rs, k, tmp.data());
    }
    return out;
}

const Type kRepackTypes[] = {Type::Q4_0, Type::Q4_K, Type::Q6_K, Type::Q8_0};

class MulMatRepacked : public ::testing::TestWithParam<Type> {};

TEST_P(MulMatRepacked, KernelsMatchOracleAndPortableBitExactly) {
    const Type t = GetParam();
    const int64_t bs = block_size(t);
    // Rows no multiple of 8 (tails of 1..7 rows), one block per row, one to nine columns.
    const KernelCase cases[] = {{bs, 8, 1},      {bs, 9, 3},      {3 * bs, 13, 5}, {5 * bs, 37, 9},
                                {2 * bs, 16, 4}, {8 * bs, 71, 2}, {2048, 24, 6}};
    for (const KernelCase& kc : cases) {
        const std::vector<float> af = random_floats(static_cast<size_t>(kc.m * kc.k), 13);
        const std::vector<float> bf = random_floats(static_cast<size_t>(kc.n * kc.k), 14);
        const std::vector<uint8_t> a = quantize_rows(t, af.data(), kc.m, kc.k);
        const std::vector<float> ad = dequantize(t, a.data(), kc.m, kc.k, row_size(t, kc.k));
        const std::vector<float> bq = partner_round(t, bf.data(), kc.n, kc.k);
        const std::vector<double> want = oracle(ad, bq, kc.k, kc.m, kc.n);
        const size_t total = static_cast<size_t>(kc.m * kc.n);
        std::vector<float> outs[2];
        for (bool portable : {false, true}) {
            const cpu::simd::RepackedKernels* rk = cpu::simd::repacked_kernels(t, portable);
            ASSERT_NE(rk, nullptr);
            EXPECT_EQ(rk->group_bytes(kc.k), cpu::simd::kRepackRows * row_size(t, kc.k));
            const std::vector<uint8_t> ar = repack_copy(*rk, a.data(), kc.k, kc.m);
            if (kc.m >= cpu::simd::kRepackRows) {
                EXPECT_NE(0, std::memcmp(ar.data(), a.data(), a.size())) << "nothing repacked";
            }
            outs[portable] = run_repacked(*rk, ar.data(), bf.data(), kc.k, kc.m, kc.n);
            EXPECT_LE(nmse(outs[portable].data(), want.data(), total), kExactNmse)
                << "repacked portable=" << portable << " k=" << kc.k << " m=" << kc.m
                << " n=" << kc.n;
        }
        // The 8-row tiles agree bit for bit (the GGUF-layout tail rows take the direct tiles,
        // whose vector and scalar forms sum in different orders).
        const int64_t full = kc.m / cpu::simd::kRepackRows * cpu::simd::kRepackRows;
        for (int64_t c = 0; c < kc.n; c++) {
            EXPECT_EQ(0, std::memcmp(outs[0].data() + c * kc.m, outs[1].data() + c * kc.m,
                                     static_cast<size_t>(full) * sizeof(float)))
                << "vector and scalar repacked kernels differ, k=" << kc.k << " m=" << kc.m
                << " column " << c;
        }
    }
}

TEST_P(MulMatRepacked, UnpackRowGivesTheGgufRows) {
    const Type t = GetParam();
    const cpu::simd::RepackedKernels* rk = cpu::simd::repacked_kernels(t);
    ASSERT_NE(rk, nullptr);
    const int64_t k = 3 * block_size(t), m = 8;
    const size_t rs = row_size(t, k);
    // Wide range: Q4_K's 6-bit scales and mins take many values, high bits included.
    const std::vector<float> af = random_floats(static_cast<size_t>(m * k), 21, -3.0f, 5.0f);
    const std::vector<uint8_t> a = quantize_rows(t, af.data(), m, k);
    const std::vector<uint8_t> ar = repack_copy(*rk, a.data(), k, m);
    std::vector<uint8_t> row(rs);
    for (int r = 0; r < m; r++) {
        rk->unpack_row(ar.data(), k, r, row.data());
        EXPECT_EQ(0, std::memcmp(row.data(), a.data() + r * rs, rs)) << "row " << r;
    }
}

// A weight [k, m] of type t in a CPU host buffer, filled with quantized random rows.
struct Weight {
    Context ctx;
    Tensor* w = nullptr;
    std::unique_ptr<Buffer> buf;
    std::vector<uint8_t> bytes;  // the GGUF bytes
    Weight(Type t, int64_t k, int64_t m, uint32_t seed) {
        w = ctx.new_tensor(t, {k, m});
        auto b = allocate_context_tensors(ctx, cpu::host_buffer_type());
        EXPECT_TRUE(b.has_value()) << b.message();
        buf = std::move(*b);
        const std::vector<float> f = random_floats(static_cast<size_t>(k * m), seed);
        bytes = quantize_rows(t, f.data(), m, k);
        EXPECT_TRUE(buf->set_tensor(w, bytes.data(), 0, bytes.size()).is_ok());
    }
    bool repack() {
        bool done = false;
        auto* hb = dynamic_cast<cpu::HostBuffer*>(buf.get());
        EXPECT_NE(hb, nullptr);
        const Status st = hb->repack(w, cpu::simd::repacked_kernels(w->type), &done);
        EXPECT_TRUE(st.is_ok()) << st.message();
        return done;
    }
};

// out = w x b for b [k, n] random, with nth threads.
std::vector<float> weight_times(Tensor* w, int64_t n, int nth, Status* st) {
    Context ctx;
    Tensor* b = ctx.new_tensor(Type::F32, {w->ne[0], n});
    Tensor* out = ctx.mul_mat(w, b);
    auto buf = allocate_context_tensors(ctx, cpu::host_buffer_type());
    EXPECT_TRUE(buf.has_value()) << buf.message();
    const std::vector<float> bf = random_floats(static_cast<size_t>(w->ne[0] * n), 31);
    std::memcpy(b->data, bf.data(), bf.size() * 4);
    Graph g;
    g.build_forward(out);
    *st = cpu::make_cpu_backend(nth)->compute(g);
    const float* o = static_cast<const float*>(out->data);
    return std::vector<float>(o, o + out->nelements());
}

TEST_P(MulMatRepacked, OpOnRepackedWeightMatchesGgufLayout) {
    // Decode (1 column), few columns, prefill (packed path in the GGUF layout); rows with a
    // tail of 3 past the last group (also what the unpacking prefill copies as it is).
    for (int64_t n : {1, 3, 40}) {
        Weight wt(GetParam(), 512, 75, 41);
        Status st;
        const std::vector<float> plain = weight_times(wt.w, n, 2, &st);
        ASSERT_TRUE(st.is_ok()) << st.message();
        ASSERT_TRUE(wt.repack());
        ASSERT_NE(cpu::repacked_weight(wt.w), nullptr);
        std::vector<float> outs[3];
        for (int nth : {1, 2, 3}) {
            outs[nth - 1] = weight_times(wt.w, n, nth, &st);
            ASSERT_TRUE(st.is_ok()) << st.message();
        }
        // Same b quantization, another summation order only: bounded as the kernels' oracle.
        std::vector<double> want(plain.begin(), plain.end());
        EXPECT_LE(nmse(outs[0].data(), want.data(), want.size()), kExactNmse) << "n=" << n;
        for (int i = 1; i < 3; i++) {
            EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[i].data(), want.size() * sizeof(float)))
                << "thread count changed the result, n=" << n;
        }
        // And the repacked rows really take the new path: the results are not the old bits.
        // Except prefill where the build's packed GEMM is the faster one (AVX-512): there the
        // rows are unpacked for it, and the results are the GGUF layout's bit for bit.
        const cpu::simd::MatKernels& mk = cpu::simd::mat_kernels(GetParam());
        if (cpu::simd::packed_over_repacked() && mk.packed && n >= mk.packed_min_cols) {
            EXPECT_EQ(0, std::memcmp(outs[0].data(), plain.data(), want.size() * sizeof(float)))
                << "prefill over unpacked rows differs from the GGUF layout, n=" << n;
        } else {
            EXPECT_NE(0, std::memcmp(outs[0].data(), plain.data(), want.size() * sizeof(float)))
                << "n=" << n;
        }
    }
}

TEST_P(MulMatRepacked, GetTensorSetTensorAndCopyReadGgufBytes) {
    const Type t = GetParam();
    Weight wt(t, 256, 21, 51);
    ASSERT_TRUE(wt.repack());
    const size_t size = wt.bytes.size();
    EXPECT_NE(0, std::memcmp(wt.w->data, wt.bytes.data(), size)) << "stored bytes not repacked";
    std::vector<uint8_t> got(size);
    ASSERT_TRUE(wt.buf->get_tensor(wt.w, got.data(), 0, size).is_ok());
    EXPECT_EQ(got, wt.bytes);
    // Unaligned sub-ranges that start and end inside groups.
    for (size_t off : {size_t{1}, size_t{77}, size_t{600}, size / 2}) {
        const size_t len = std::min<size_t>(333, size - off);
        std::vector<uint8_t> part(len);
        ASSERT_TRUE(wt.buf->get_tensor(wt.w, part.data(), off, len).is_ok());
        EXPECT_EQ(0, std::memcmp(part.data(), wt.bytes.data() + off, len)) << "offset " << off;
    }
    // copy_tensor into another host buffer gives the GGUF bytes.
    Context ctx;
    Tensor* dst = ctx.new_tensor(t, {256, 21});
    auto db = allocate_context_tensors(ctx, cpu::host_buffer_type());
    ASSERT_TRUE(db.has_value());
    ASSERT_TRUE((*db)->copy_tensor(wt.w, dst));
    EXPECT_EQ(0, std::memcmp(dst->data, wt.bytes.data(), size));
    // A partial write puts the weight back into the GGUF layout first.
    const uint8_t patch[4] = {1, 2, 3, 4};
    ASSERT_TRUE(wt.buf->set_tensor(wt.w, patch, 40, 4).is_ok());
    EXPECT_EQ(cpu::repacked_weight(wt.w), nullptr);
    std::vector<uint8_t> want = wt.bytes;
    std::memcpy(want.data() + 40, patch, 4);
    EXPECT_EQ(0, std::memcmp(wt.w->data, want.data(), size));
}

TEST_P(MulMatRepacked, GetRowsOfRepackedWeightGivesTheSameRows) {
    Weight wt(GetParam(), 512, 19, 61);  // 2 groups and 3 GGUF rows
    auto rows_of = [&](Status* st) {
        Context ctx;
        Tensor* idx = ctx.new_tensor(Type::I32, {6});
        Tensor* out = ctx.get_rows(wt.w, idx);
        auto buf = allocate_context_tensors(ctx, cpu::host_buffer_type());
        EXPECT_TRUE(buf.has_value());
        const int32_t ids[6] = {0, 7, 8, 15, 16, 18};
        std::memcpy(idx->data, ids, sizeof(ids));
        Graph g;
        g.build_forward(out);
        *st = cpu::make_cpu_backend(2)->compute(g);
        const float* o = static_cast<const float*>(out->data);
        return std::vector<float>(o, o + out->nelements());
    };
    Status st;
    const std::vector<float> plain = rows_of(&st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    ASSERT_TRUE(wt.repack());
    const std::vector<float> packed = rows_of(&st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(plain, packed);
}

TEST_P(MulMatRepacked, ViewIntoRepackedWeightIsAClearError) {
    Weight wt(GetParam(), 256, 16, 71);
    ASSERT_TRUE(wt.repack());
    Context ctx;
    Tensor* v = ctx.view(wt.w, {256, 8}, {wt.w->nb[1]}, wt.w->nb[1] * 8);
    Tensor* b = ctx.new_tensor(Type::F32, {256, 1});
    Tensor* out = ctx.mul_mat(v, b);
    auto buf = allocate_context_tensors(ctx, cpu::host_buffer_type());
    ASSERT_TRUE(buf.has_value()) << buf.message();
    Graph g;
    g.build_forward(out);
    const Status st = cpu::make_cpu_backend(1)->compute(g);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("repacked"), std::string::npos) << st.message();
}

TEST_P(MulMatRepacked, DevicePrepareWeightsRepacksUnlessSwitchedOff) {
    Device* cpu = cpu_device();
    ASSERT_NE(cpu, nullptr);
    EXPECT_TRUE(cpu->caps().prepare_weights);
    const bool want = cpu::simd::repack_by_default(GetParam());
    {
        Weight wt(GetParam(), 256, 16, 81);
        ::setenv("FERRY_CPU_REPACK", "0", 1);
        Tensor* ws[] = {wt.w};
        ASSERT_TRUE(cpu->prepare_weights(ws).is_ok());
        ::unsetenv("FERRY_CPU_REPACK");
        EXPECT_EQ(cpu::repacked_weight(wt.w), nullptr);
        EXPECT_EQ(0, std::memcmp(wt.w->data, wt.bytes.data(), wt.bytes.size()));
        ASSERT_TRUE(cpu->prepare_weights(ws).is_ok());
        EXPECT_EQ(cpu::repacked_weight(wt.w) != nullptr, want);
        ASSERT_TRUE(cpu->prepare_weights(ws).is_ok());  // twice: no harm
        std::vector<uint8_t> got(wt.bytes.size());
        ASSERT_TRUE(wt.buf->get_tensor(wt.w, got.data(), 0, got.size()).is_ok());
        EXPECT_EQ(got, wt.bytes);
    }
}

INSTANTIATE_TEST_SUITE_P(Types, MulMatRepacked, ::testing::ValuesIn(kRepackTypes),
                         [](const ::testing::TestParamInfo<Type>& info) {
                             return std::string(type_name(info.param));
                         });

}  // namespace
