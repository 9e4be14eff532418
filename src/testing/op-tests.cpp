#include "ferry/op-tests.h"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>

#include "core/reference.h"
#include "ferry/graph.h"

namespace ferry::testing {

// ---------------------------------------------------------------------------------------------
// NMSE bounds and why.
//
// u = 2^-24 ≈ 6e-8 is float32's unit roundoff; an error of relative size r on every element
// gives NMSE ≈ r^2. Inputs are uniform in [-1, 1) unless a case says otherwise.
namespace {

// Pure data movement (copies, views, row gathers, conversions to a wider type, F32 -> F16/BF16
// which round to nearest even by definition): every backend must reproduce the bits.
constexpr double kExact = 0.0;
// Dequantized values: a block format's value is d*q (exact in float) or d*sc*q - dmin*m,
// which a backend may evaluate with or without FMA: <= 3 float roundings, NMSE <= (3u)^2 ≈
// 3e-14.
constexpr double kDequant = 1e-13;
// One or two float roundings per element (ADD, MUL, SCALE with or without FMA): NMSE <=
// (2u)^2 ≈ 1.4e-14; 1e-12 leaves room for cancellation in x*s + b.
constexpr double kElementwise = 1e-12;
// Float reductions and transcendentals: a sum of n <= ~1000 terms in float has relative error
// ≈ sqrt(n) u typically (NMSE ≈ n u^2 ≈ 4e-12); vectorized exp/tanh/sin approximations are
// allowed up to ~1e-5 relative error. Covers RMS_NORM, NORM, SOFT_MAX, SUM_ROWS, SILU, GELU,
// SWIGLU, GEGLU, F32 MUL_MAT (K <= 256) and F32 FLASH_ATTN_EXT.
constexpr double kFloatMath = 1e-10;
// ROPE: theta = pos * freq_scale * base^(-2i/n) computed in float (possibly by repeated
// multiplication): relative error of theta up to ~n_dims/2 * u, absolute up to pos * 32 u ≈
// 1.2e-4 at pos < 64 for the fastest pair, much less on average: NMSE <= ~1e-9.
constexpr double kRope = 1e-8;
// MUL_MAT with F16 / BF16 weights: a backend may round b to the weight's type for the dot
// product (ggml-style vec_dot_type), relative error per term <= 2^-11 (f16) / 2^-8 (bf16),
// NMSE ≈ ulp^2 / 3 = 8e-8 / 5e-6; x10.
constexpr double kMulMatF16 = 1e-6;
constexpr double kMulMatBF16 = 5e-5;
// MUL_MAT with block-format weights: the reference uses the weight's exact dequantized values
// and an unrounded b, while a backend quantizes b to Q8_0 / Q8_K (step = amax/127 per block of
// 32 / 256). Rounding noise of variance step^2/12 on b against E[b^2] = 1/3 for uniform b
// gives NMSE ≈ 3 / (127^2 * 12) ≈ 1.6e-5 independently of K and of the weight type; the scale
// stored as f16 (Q8_0) adds ≈ (2^-11)^2/3 ≈ 8e-8. Bound 1e-4 (about 6x). The same bound holds
// for every block format, the 2-bit Q2_K and the non-linear IQ4 / MXFP4 included: the
// weights' own quantization error is not part of the comparison (measured on the CPU:
// 0.8e-5 .. 2.1e-5 for all of them).
constexpr double kMulMatQ = 1e-4;
// FLASH_ATTN_EXT with F16 K/V: a backend may round q to f16 for q.k (score error ≈ 2^-11 |s|,
// NMSE ≈ 1e-8) and accumulate p*v in f16 over n_kv steps (relative error ≈ sqrt(n_kv)
// 2^-11 / sqrt(3) ≈ 1.6e-3 at n_kv = 33-65: NMSE ≈ 2.6e-6..5e-6). Bound 2e-5.
constexpr double kAttnF16 = 2e-5;
// BF16 K/V: q rounded to bf16 (2^-8): score error NMSE ≈ (2^-8)^2 / 3 ≈ 5e-6, V accumulation
// in float. Bound 1e-4.
constexpr double kAttnBF16 = 1e-4;

// Rounding noise (NMSE) of quantizing uniform [-1, 1) data to a block format: step^2/12 over
// E[x^2] = 1/3. A backend may quantize with a different but valid rounding than the
// reference quantizer; two independent quantizations differ by at most about twice this.
double quant_noise(Type t) {
    auto noise = [](double step) { return step * step / 12.0 * 3.0; };
    switch (t) {
        case Type::Q8_0:
            return noise(1.0 / 127.0);  // d = amax / 127
        case Type::Q4_0:
            return noise(1.0 / 8.0);  // d = max / -8
        case Type::Q4_1:
            return noise(2.0 / 15.0);  // d = (max - min) / 15
        case Type::Q4_K:
            return noise(2.0 / 15.0);
        case Type::Q5_K:
            return noise(2.0 / 31.0);
        case Type::Q6_K:
            return noise(1.0 / 32.0);
        default:
            return 0.0;
    }
}
double quant_store_bound(Type t) {
    return 4.0 * quant_noise(t);
}

// ---------------------------------------------------------------------------------------------
// Deterministic random numbers (splitmix64).

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
    int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

uint64_t hash_str(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (char c : s) {
        h ^= static_cast<uint8_t>(c);
        h *= 1099511628211ull;
    }
    return h;
}

std::vector<uint8_t> encode_floats(const Tensor* t, const std::vector<float>& v) {
    std::vector<uint8_t> bytes(t->nbytes());
    const int64_t n0 = t->ne[0];
    const size_t rs = row_size(t->type, n0);
    for (int64_t r = 0; r < t->nrows(); r++) {
        Status st = from_float_row(t->type, &v[static_cast<size_t>(r * n0)], &bytes[r * rs], n0);
        FERRY_ASSERT(st.is_ok());
    }
    return bytes;
}

std::string dims(const Tensor* t) {
    int n = 4;
    while (n > 1 && t->ne[n - 1] == 1) n--;
    std::string s = "[";
    for (int i = 0; i < n; i++) {
        s += std::to_string(t->ne[i]);
        if (i + 1 < n) s += ",";
    }
    return s + "]";
}

}  // namespace

std::vector<uint8_t> make_input_bytes(const Tensor* t, const Fill& f, uint64_t seed) {
    Rng rng(seed);
    const int64_t n = t->nelements();
    const int64_t n0 = t->ne[0];
    if (f.kind == Fill::Indices || f.kind == Fill::RowPerm || f.kind == Fill::Positions) {
        FERRY_ASSERT(t->type == Type::I32 && f.n > 0);
        std::vector<int32_t> v(static_cast<size_t>(n));
        if (f.kind == Fill::Indices) {
            for (auto& x : v) x = static_cast<int32_t>(rng.below(f.n));
        } else {
            // Distinct values per row (RowPerm) or over the whole tensor (Positions): a partial
            // Fisher-Yates shuffle of [0, f.n).
            const int64_t group = f.kind == Fill::RowPerm ? n0 : n;
            FERRY_ASSERT(group <= f.n);
            std::vector<int32_t> perm(static_cast<size_t>(f.n));
            for (int64_t g = 0; g < n; g += group) {
                std::iota(perm.begin(), perm.end(), 0);
                for (int64_t i = 0; i < group; i++) {
                    const int64_t j = i + rng.below(f.n - i);
                    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
                    v[static_cast<size_t>(g + i)] = perm[static_cast<size_t>(i)];
                }
            }
        }
        std::vector<uint8_t> bytes(static_cast<size_t>(n) * 4);
        std::memcpy(bytes.data(), v.data(), bytes.size());
        return bytes;
    }
    std::vector<float> v(static_cast<size_t>(n));
    switch (f.kind) {
        case Fill::Uniform:
            for (auto& x : v) x = static_cast<float>(f.lo + (f.hi - f.lo) * rng.uniform());
            break;
        case Fill::Mask:
            for (int64_t r = 0; r < n / n0; r++) {
                const int64_t keep = rng.below(n0);  // at least one finite entry per row
                for (int64_t i = 0; i < n0; i++) {
                    float& x = v[static_cast<size_t>(r * n0 + i)];
                    x = static_cast<float>(f.lo + (f.hi - f.lo) * rng.uniform());
                    if (i != keep && rng.uniform() < f.p)
                        x = -std::numeric_limits<float>::infinity();
                }
            }
            break;
        case Fill::Causal: {
            const int64_t n1 = t->ne[1];
            FERRY_ASSERT(n0 - f.n >= n1);  // every row sees at least one key
            for (int64_t r = 0; r < n / n0; r++) {
                const int64_t last = n0 - f.n - n1 + r % n1;
                for (int64_t i = 0; i < n0; i++) {
                    float& x = v[static_cast<size_t>(r * n0 + i)];
                    x = static_cast<float>(f.lo + (f.hi - f.lo) * rng.uniform());
                    if (i > last) x = -std::numeric_limits<float>::infinity();
                }
            }
            break;
        }
        case Fill::Distinct: {
            std::vector<int64_t> perm(static_cast<size_t>(n0));
            for (int64_t r = 0; r < n / n0; r++) {
                std::iota(perm.begin(), perm.end(), 0);
                for (int64_t i = n0 - 1; i > 0; i--) {
                    std::swap(perm[static_cast<size_t>(i)],
                              perm[static_cast<size_t>(rng.below(i + 1))]);
                }
                for (int64_t i = 0; i < n0; i++) {
                    const double u = (static_cast<double>(perm[static_cast<size_t>(i)]) + 0.5) /
                                     static_cast<double>(n0);
                    v[static_cast<size_t>(r * n0 + i)] =
                        static_cast<float>(f.lo + (f.hi - f.lo) * u);
                }
            }
            break;
        }
        default:
            break;
    }
    return encode_floats(t, v);
}

Tensor* CaseBuilder::in(Type type, std::initializer_list<int64_t> ne, Fill fill) {
    Tensor* t = inputs_.new_tensor(type, ne);
    t->flags |= kTensorInput;
    t->set_name("in" + std::to_string(in_.size()));
    in_.push_back({t, fill});
    return t;
}

// ---------------------------------------------------------------------------------------------
// The table of cases.

namespace {

using Build = std::function<Tensor*(CaseBuilder&)>;

struct Table {
    std::vector<OpTestCase> cases;
    void add(Op op, const std::string& tag, double bound, const char* note, Build build) {
        OpTestCase c;
        c.op = op;
        c.name = std::string(op_name(op)) + "_" + tag;
        for (char& ch : c.name) {
            if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
        }
        c.max_nmse = bound;
        c.bound_note = note;
        c.seed = hash_str(c.name);
        c.build = std::move(build);
        cases.push_back(std::move(c));
    }
};

const char* kNoteExact = "data movement: must be bit-exact";
const char* kNoteInteger = "integer result: must match exactly";
const char* kNoteDequant = "dequantization: <= 3 float roundings";
const char* kNoteElementwise = "1-2 float roundings per element";
const char* kNoteFloatMath = "float reductions / transcendentals";
const char* kNoteRope = "theta computed in float";
const char* kNoteQStore = "store into a block format: 4x its quantization noise";
const char* kNoteMulMatF16 = "b may be rounded to f16";
const char* kNoteMulMatBF16 = "b may be rounded to bf16";
const char* kNoteMulMatQ = "b quantized to q8_0/q8_K: noise ≈ 1.6e-5";
const char* kNoteAttnF16 = "q rounded to f16, p*v accumulated in f16";
const char* kNoteAttnBF16 = "q rounded to bf16";

constexpr Type kF32 = Type::F32;
constexpr Type kF16 = Type::F16;
constexpr Type kBF16 = Type::BF16;
constexpr Type kI32 = Type::I32;

const Type kWeightTypes[] = {Type::F32,  Type::F16,    Type::BF16,   Type::Q4_0,
                             Type::Q4_1, Type::Q5_0,   Type::Q5_1,   Type::Q8_0,
                             Type::Q2_K, Type::Q3_K,   Type::Q4_K,   Type::Q5_K,
                             Type::Q6_K, Type::IQ4_NL, Type::IQ4_XS, Type::MXFP4};

// Super-block (256-element) formats: rows must be a multiple of 256.
bool is_k_quant(Type t) {
    return block_size(t) == kQK_K;
}
std::string tn(Type t) {
    return type_name(t);
}

double mul_mat_bound(Type t) {
    if (t == kF32) return kFloatMath;
    if (t == kF16) return kMulMatF16;
    if (t == kBF16) return kMulMatBF16;
    return kMulMatQ;
}
const char* mul_mat_note(Type t) {
    if (t == kF32) return kNoteFloatMath;
    if (t == kF16) return kNoteMulMatF16;
    if (t == kBF16) return kNoteMulMatBF16;
    return kNoteMulMatQ;
}

void add_copy_cases(Table& T) {
    T.add(Op::CPY, "f32_f32", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cpy(b.in(kF32, {33, 7, 3}), b.in(kF32, {33, 7, 3}));
    });
    T.add(Op::CPY, "f32_f32_transposed_src", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cpy(b.g().transpose(b.in(kF32, {7, 33})), b.in(kF32, {33, 7}));
    });
    T.add(Op::CPY, "f32_permuted_flatten", kExact, kNoteExact, [](CaseBuilder& b) {
        Tensor* a = b.g().permute(b.in(kF32, {12, 8, 3}), 0, 2, 1, 3);
        return b.g().cpy(a, b.in(kF32, {288}));
    });
    for (Type t : {kF16, kBF16}) {
        T.add(Op::CPY, "f32_" + tn(t), kExact, kNoteExact, [t](CaseBuilder& b) {
            return b.g().cpy(b.in(kF32, {65, 5, 2}), b.in(t, {65, 5, 2}));
        });
        T.add(Op::CPY, tn(t) + "_f32", kExact, kNoteExact, [t](CaseBuilder& b) {
            return b.g().cpy(b.in(t, {65, 5, 2}), b.in(kF32, {65, 5, 2}));
        });
        T.add(Op::CPY, "f32_permuted_" + tn(t), kExact, kNoteExact, [t](CaseBuilder& b) {
            Tensor* a = b.g().permute(b.in(kF32, {8, 6, 4}), 2, 0, 1, 3);
            return b.g().cpy(a, b.in(t, {6, 4, 8}));
        });
    }
    for (Type t : {Type::Q8_0, Type::Q4_0}) {
        T.add(Op::CPY, "f32_" + tn(t), quant_store_bound(t), kNoteQStore, [t](CaseBuilder& b) {
            return b.g().cpy(b.in(kF32, {64, 5, 2}), b.in(t, {64, 5, 2}));
        });
        T.add(Op::CPY, tn(t) + "_f32", kDequant, kNoteDequant, [t](CaseBuilder& b) {
            return b.g().cpy(b.in(t, {64, 5, 2}), b.in(kF32, {64, 5, 2}));
        });
    }
    // KV-cache writes: into a window of a larger destination, read back whole.
    T.add(Op::CPY, "f32_into_f16_cache_rows", kExact, kNoteExact, [](CaseBuilder& b) {
        Tensor* cache = b.in(kF16, {64, 16});
        Tensor* dst = b.g().view_2d(cache, 64, 4, cache->nb[1], 5 * cache->nb[1]);
        Tensor* r = b.g().cpy(b.in(kF32, {64, 4}), dst);
        b.read(cache);
        return r;
    });
    for (Type t : {kF32, kF16}) {
        // Transposed V-cache store: [D, n_tok] written as columns of a [n_ctx, D] cache.
        T.add(Op::CPY, "transposed_into_" + tn(t) + "_cache", kExact, kNoteExact,
              [t](CaseBuilder& b) {
                  Tensor* cache = b.in(t, {20, 32});
                  Tensor* dst = b.g().view_2d(cache, 3, 32, cache->nb[1], 6 * type_size(t));
                  Tensor* r = b.g().cpy(b.g().transpose(b.in(kF32, {32, 3})), dst);
                  b.read(cache);
                  return r;
              });
    }
    T.add(Op::CPY, "f32_into_q8_0_cache_rows", quant_store_bound(Type::Q8_0), kNoteQStore,
          [](CaseBuilder& b) {
              Tensor* cache = b.in(Type::Q8_0, {64, 10});
              Tensor* dst = b.g().view_2d(cache, 64, 3, cache->nb[1], 2 * cache->nb[1]);
              Tensor* r = b.g().cpy(b.in(kF32, {64, 3}), dst);
              b.read(cache);
              return r;
          });
}

void add_layout_cases(Table& T) {
    // CONT: any layout in, contiguous out.
    T.add(Op::CONT, "f32_transposed", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cont(b.g().transpose(b.in(kF32, {33, 7, 3})));
    });
    T.add(Op::CONT, "f32_permuted_4d", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cont(b.g().permute(b.in(kF32, {7, 5, 3, 2}), 2, 0, 3, 1));
    });
    T.add(Op::CONT, "f16_permuted", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cont(b.g().permute(b.in(kF16, {8, 5, 3}), 1, 2, 0, 3));
    });
    T.add(Op::CONT, "bf16_transposed", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cont(b.g().transpose(b.in(kBF16, {9, 4})));
    });
    T.add(Op::CONT, "i32_transposed", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cont(b.g().transpose(b.in(kI32, {5, 7}, Fill::indices(1000))));
    });
    for (Type t : {Type::Q8_0, Type::Q4_K}) {
        T.add(Op::CONT, tn(t) + "_permuted", kExact, kNoteExact, [t](CaseBuilder& b) {
            const int64_t ne0 = is_k_quant(t) ? 256 : 64;
            return b.g().cont(b.g().permute(b.in(t, {ne0, 3, 5}), 0, 2, 1, 3));
        });
    }
    T.add(Op::CONT, "f32_strided_view", kExact, kNoteExact, [](CaseBuilder& b) {
        Tensor* a = b.in(kF32, {10, 12});
        return b.g().cont(b.g().view_2d(a, 7, 6, 2 * a->nb[1], 1 * sizeof(float)));
    });

    // RESHAPE
    T.add(Op::RESHAPE, "f32_into_mul", kElementwise, kNoteElementwise, [](CaseBuilder& b) {
        Tensor* a = b.g().reshape(b.in(kF32, {12, 11, 2}), {22, 6, 2});
        return b.g().mul(a, b.in(kF32, {22, 1, 2}));
    });
    T.add(Op::RESHAPE, "of_node", kElementwise, kNoteElementwise, [](CaseBuilder& b) {
        Tensor* s = b.g().scale(b.in(kF32, {33, 6}), 0.5f, 0.25f);
        return b.g().add(b.g().reshape(s, {11, 18}), b.in(kF32, {11, 18}));
    });
    T.add(Op::RESHAPE, "q8_0_get_rows", kDequant, kNoteDequant, [](CaseBuilder& b) {
        Tensor* a = b.g().reshape(b.in(Type::Q8_0, {64, 6, 2}), {64, 12});
        return b.g().get_rows(a, b.in(kI32, {9}, Fill::indices(12)));
    });

    // VIEW
    T.add(Op::VIEW, "f32_2d_strided_offset", kElementwise, kNoteElementwise, [](CaseBuilder& b) {
        Tensor* a = b.in(kF32, {16, 10});
        Tensor* v = b.g().view_2d(a, 7, 5, 2 * a->nb[1], 3 * sizeof(float));
        return b.g().add(v, b.in(kF32, {7, 5}));
    });
    T.add(Op::VIEW, "f32_3d", kExact, kNoteExact, [](CaseBuilder& b) {
        Tensor* a = b.in(kF32, {12, 6, 4});
        return b.g().cont(b.g().view_3d(a, 5, 3, 2, a->nb[1], 2 * a->nb[2], a->nb[1]));
    });
    T.add(Op::VIEW, "q8_0_rows_mul_mat", kMulMatQ, kNoteMulMatQ, [](CaseBuilder& b) {
        Tensor* w = b.in(Type::Q8_0, {64, 12});
        Tensor* v = b.g().view_2d(w, 64, 5, w->nb[1], 4 * w->nb[1]);
        return b.g().mul_mat(v, b.in(kF32, {64, 3}));
    });
    T.add(Op::VIEW, "f16_rows_get_rows", kExact, kNoteExact, [](CaseBuilder& b) {
        Tensor* a = b.in(kF16, {32, 12});
        Tensor* v = b.g().view_2d(a, 32, 8, a->nb[1], 2 * a->nb[1]);
        return b.g().get_rows(v, b.in(kI32, {6}, Fill::indices(8)));
    });

    // PERMUTE (attention layouts feeding MUL_MAT, SOFT_MAX)
    T.add(Op::PERMUTE, "kq_mul_mat", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        Tensor* q = b.g().permute(b.in(kF32, {32, 4, 5}), 0, 2, 1, 3);  // [32, 5, 4]
        Tensor* k = b.g().permute(b.in(kF32, {32, 4, 9}), 0, 2, 1, 3);  // [32, 9, 4]
        return b.g().mul_mat(k, q);                                     // [9, 5, 4]
    });
    T.add(Op::PERMUTE, "kq_mul_mat_gqa", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        Tensor* q = b.g().permute(b.in(kF32, {32, 8, 5}), 0, 2, 1, 3);  // [32, 5, 8]
        Tensor* k = b.g().permute(b.in(kF32, {32, 2, 9}), 0, 2, 1, 3);  // [32, 9, 2]
        return b.g().mul_mat(k, q);                                     // [9, 5, 8]
    });
    T.add(Op::PERMUTE, "soft_max", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        Tensor* a = b.g().permute(b.in(kF32, {16, 3, 5}, Fill::uniform(-4, 4)), 0, 2, 1, 3);
        return b.g().soft_max(a, nullptr, 0.7f);
    });
    T.add(Op::PERMUTE, "cont_4d", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cont(b.g().permute(b.in(kF32, {3, 4, 5, 2}), 3, 1, 0, 2));
    });

    // TRANSPOSE
    T.add(Op::TRANSPOSE, "f32_cont", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cont(b.g().transpose(b.in(kF32, {65, 3})));
    });
    T.add(Op::TRANSPOSE, "f16_cont", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cont(b.g().transpose(b.in(kF16, {7, 33, 2})));
    });
    T.add(Op::TRANSPOSE, "f32_cpy_f16", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().cpy(b.g().transpose(b.in(kF32, {9, 17})), b.in(kF16, {17, 9}));
    });
    T.add(Op::TRANSPOSE, "of_node", kExact, kNoteExact, [](CaseBuilder& b) {
        Tensor* s = b.g().scale(b.in(kF32, {6, 5}), 2.0f, 0.0f);
        return b.g().cont(b.g().transpose(s));
    });
}

void add_rows_cases(Table& T) {
    for (Type t : kWeightTypes) {
        const bool q = is_quantized(t);
        T.add(Op::GET_ROWS, tn(t), q ? kDequant : kExact, q ? kNoteDequant : kNoteExact,
              [t](CaseBuilder& b) {
                  const int64_t ne0 = is_k_quant(t) ? 256 : 64;
                  return b.g().get_rows(b.in(t, {ne0, 11}), b.in(kI32, {7}, Fill::indices(11)));
              });
    }
    T.add(Op::GET_ROWS, "i32", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().get_rows(b.in(kI32, {5, 11}, Fill::indices(1000)),
                              b.in(kI32, {7}, Fill::indices(11)));
    });
    T.add(Op::GET_ROWS, "f32_batched", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().get_rows(b.in(kF32, {33, 9, 3}), b.in(kI32, {5, 3}, Fill::indices(9)));
    });
    T.add(Op::GET_ROWS, "q8_0_batched", kDequant, kNoteDequant, [](CaseBuilder& b) {
        return b.g().get_rows(b.in(Type::Q8_0, {32, 9, 3}), b.in(kI32, {5, 3}, Fill::indices(9)));
    });
    T.add(Op::GET_ROWS, "f16_4d", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().get_rows(b.in(kF16, {16, 6, 2, 2}), b.in(kI32, {4, 2, 2}, Fill::indices(6)));
    });
    T.add(Op::GET_ROWS, "f32_ne0_1", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().get_rows(b.in(kF32, {1, 20}), b.in(kI32, {12}, Fill::indices(20)));
    });

    for (Type t : {kF32, kF16, kBF16, Type::Q8_0}) {
        const bool q = is_quantized(t);
        T.add(Op::SET_ROWS, tn(t), q ? quant_store_bound(t) : kExact, q ? kNoteQStore : kNoteExact,
              [t](CaseBuilder& b) {
                  return b.g().set_rows(b.in(t, {64, 13}), b.in(kF32, {64, 5}),
                                        b.in(kI32, {5}, Fill::row_perm(13)));
              });
    }
    T.add(Op::SET_ROWS, "f16_batched", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().set_rows(b.in(kF16, {32, 10, 2}), b.in(kF32, {32, 3, 2}),
                              b.in(kI32, {3, 2}, Fill::row_perm(10)));
    });
    T.add(Op::SET_ROWS, "f32_into_view", kExact, kNoteExact, [](CaseBuilder& b) {
        Tensor* cache = b.in(kF32, {33, 20});
        Tensor* dst = b.g().view_2d(cache, 33, 8, cache->nb[1], 4 * cache->nb[1]);
        Tensor* r = b.g().set_rows(dst, b.in(kF32, {33, 3}), b.in(kI32, {3}, Fill::row_perm(8)));
        b.read(cache);
        return r;
    });
}

void add_elementwise_cases(Table& T) {
    for (Op op : {Op::ADD, Op::MUL}) {
        auto bin = [op](CaseBuilder& b, Tensor* x, Tensor* y) {
            return op == Op::ADD ? b.g().add(x, y) : b.g().mul(x, y);
        };
        T.add(op, "same_shape", kElementwise, kNoteElementwise, [bin](CaseBuilder& b) {
            return bin(b, b.in(kF32, {33, 7, 3, 2}), b.in(kF32, {33, 7, 3, 2}));
        });
        T.add(op, "bcast_rows", kElementwise, kNoteElementwise, [bin](CaseBuilder& b) {
            return bin(b, b.in(kF32, {33, 7, 3, 2}), b.in(kF32, {33, 1, 3, 1}));
        });
        T.add(op, "bcast_cols", kElementwise, kNoteElementwise, [bin](CaseBuilder& b) {
            return bin(b, b.in(kF32, {33, 7, 3, 2}), b.in(kF32, {1, 7, 1, 2}));
        });
        T.add(op, "scalar", kElementwise, kNoteElementwise, [bin](CaseBuilder& b) {
            return bin(b, b.in(kF32, {65, 3}), b.in(kF32, {1, 1}));
        });
        T.add(op, "ne0_1", kElementwise, kNoteElementwise, [bin](CaseBuilder& b) {
            return bin(b, b.in(kF32, {1, 65}), b.in(kF32, {1, 65}));
        });
        T.add(op, "permuted_a", kElementwise, kNoteElementwise, [bin](CaseBuilder& b) {
            Tensor* a = b.g().permute(b.in(kF32, {16, 5, 3}), 0, 2, 1, 3);  // [16, 3, 5]
            return bin(b, a, b.in(kF32, {16, 3, 1}));
        });
        T.add(op, "permuted_b", kElementwise, kNoteElementwise, [bin](CaseBuilder& b) {
            Tensor* y = b.g().permute(b.in(kF32, {16, 5, 3}), 0, 2, 1, 3);  // [16, 3, 5]
            return bin(b, b.in(kF32, {16, 3, 5}), y);
        });
    }
    T.add(Op::SCALE, "bias", kElementwise, kNoteElementwise, [](CaseBuilder& b) {
        return b.g().scale(b.in(kF32, {65, 7, 3}), 0.7f, 0.2f);
    });
    T.add(Op::SCALE, "ne0_1", kElementwise, kNoteElementwise, [](CaseBuilder& b) {
        return b.g().scale(b.in(kF32, {1, 9}), -1.5f, 0.0f);
    });
    T.add(Op::SCALE, "permuted", kElementwise, kNoteElementwise, [](CaseBuilder& b) {
        return b.g().scale(b.g().permute(b.in(kF32, {16, 5, 3}), 0, 2, 1, 3), 3.0f, -1.0f);
    });
    for (Op op : {Op::SILU, Op::GELU}) {
        auto un = [op](CaseBuilder& b, Tensor* x) {
            return op == Op::SILU ? b.g().silu(x) : b.g().gelu(x);
        };
        T.add(op, "3d", kFloatMath, kNoteFloatMath, [un](CaseBuilder& b) {
            return un(b, b.in(kF32, {65, 7, 3}, Fill::uniform(-6, 6)));
        });
        T.add(op, "one", kFloatMath, kNoteFloatMath, [un](CaseBuilder& b) {
            return un(b, b.in(kF32, {1, 1}, Fill::uniform(-6, 6)));
        });
        T.add(op, "permuted", kFloatMath, kNoteFloatMath, [un](CaseBuilder& b) {
            Tensor* a = b.g().permute(b.in(kF32, {33, 5, 3}, Fill::uniform(-6, 6)), 0, 2, 1, 3);
            return un(b, a);
        });
    }
    for (Op op : {Op::SWIGLU, Op::GEGLU}) {
        auto glu = [op](CaseBuilder& b, Tensor* x, Tensor* y) {
            return op == Op::SWIGLU ? b.g().swiglu(x, y) : b.g().geglu(x, y);
        };
        T.add(op, "3d", kFloatMath, kNoteFloatMath, [glu](CaseBuilder& b) {
            return glu(b, b.in(kF32, {65, 7, 3}, Fill::uniform(-6, 6)), b.in(kF32, {65, 7, 3}));
        });
        T.add(op, "row", kFloatMath, kNoteFloatMath, [glu](CaseBuilder& b) {
            return glu(b, b.in(kF32, {33, 1}, Fill::uniform(-6, 6)), b.in(kF32, {33, 1}));
        });
    }
}

void add_reduction_cases(Table& T) {
    for (Op op : {Op::RMS_NORM, Op::NORM}) {
        auto nrm = [op](CaseBuilder& b, Tensor* x, float eps) {
            return op == Op::RMS_NORM ? b.g().rms_norm(x, eps) : b.g().norm(x, eps);
        };
        T.add(op, "3d", kFloatMath, kNoteFloatMath, [nrm](CaseBuilder& b) {
            return nrm(b, b.in(kF32, {65, 7, 3}), 1e-6f);
        });
        T.add(op, "wide", kFloatMath, kNoteFloatMath, [nrm](CaseBuilder& b) {
            return nrm(b, b.in(kF32, {512, 3}), 1e-5f);
        });
        T.add(op, "offset_data", kFloatMath, kNoteFloatMath, [nrm](CaseBuilder& b) {
            return nrm(b, b.in(kF32, {257, 2}, Fill::uniform(2.0, 3.0)), 1e-5f);
        });
        T.add(op, "ne0_1", kFloatMath, kNoteFloatMath, [nrm](CaseBuilder& b) {
            return nrm(b, b.in(kF32, {1, 5}), 1e-5f);
        });
        T.add(op, "permuted", kFloatMath, kNoteFloatMath, [nrm](CaseBuilder& b) {
            return nrm(b, b.g().permute(b.in(kF32, {32, 4, 3}), 0, 2, 1, 3), 1e-6f);
        });
    }
    T.add(Op::SUM_ROWS, "3d", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().sum_rows(b.in(kF32, {65, 7, 3}));
    });
    T.add(Op::SUM_ROWS, "ne0_1", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().sum_rows(b.in(kF32, {1, 9}));
    });
    T.add(Op::SUM_ROWS, "long", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().sum_rows(b.in(kF32, {1000, 3}));
    });
    T.add(Op::SUM_ROWS, "permuted", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().sum_rows(b.g().permute(b.in(kF32, {33, 4, 3}), 0, 2, 1, 3));
    });
    T.add(Op::ARGMAX, "3d", kExact, kNoteInteger, [](CaseBuilder& b) {
        return b.g().argmax(b.in(kF32, {65, 7, 3}, Fill::distinct()));
    });
    T.add(Op::ARGMAX, "ne0_1", kExact, kNoteInteger, [](CaseBuilder& b) {
        return b.g().argmax(b.in(kF32, {1, 5}, Fill::distinct()));
    });
    T.add(Op::ARGMAX, "long", kExact, kNoteInteger, [](CaseBuilder& b) {
        return b.g().argmax(b.in(kF32, {300, 2}, Fill::distinct()));
    });
    T.add(Op::ARGMAX, "permuted", kExact, kNoteInteger, [](CaseBuilder& b) {
        return b.g().argmax(b.g().permute(b.in(kF32, {33, 4, 3}, Fill::distinct()), 0, 2, 1, 3));
    });
    // Values are copies and indices exact: the whole result must match.
    T.add(Op::TOP_K, "k1", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().top_k(b.in(kF32, {300, 3}, Fill::distinct()), 1);
    });
    T.add(Op::TOP_K, "k40_vocab", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().top_k(b.in(kF32, {32000, 2}, Fill::distinct()), 40);
    });
    T.add(Op::TOP_K, "k_whole_row", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().top_k(b.in(kF32, {17, 2, 2}, Fill::distinct()), 17);
    });
    T.add(Op::TOP_K, "permuted", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().top_k(b.g().permute(b.in(kF32, {33, 4, 3}, Fill::distinct()), 0, 2, 1, 3), 5);
    });
    // Most of each row -inf: the last places are ties, taken in index order.
    T.add(Op::TOP_K, "ties_at_neg_inf", kExact, kNoteExact, [](CaseBuilder& b) {
        return b.g().top_k(b.in(kF32, {200, 3}, Fill::mask(0.9)), 64);
    });
}

void add_mul_mat_cases(Table& T) {
    for (Type t : kWeightTypes) {
        const double bound = mul_mat_bound(t);
        const char* note = mul_mat_note(t);
        T.add(Op::MUL_MAT, tn(t) + "_bcast", bound, note, [t](CaseBuilder& b) {
            return b.g().mul_mat(b.in(t, {256, 33, 2}), b.in(kF32, {256, 7, 4}));
        });
        T.add(Op::MUL_MAT, tn(t) + "_vec", bound, note, [t](CaseBuilder& b) {
            return b.g().mul_mat(b.in(t, {256, 65}), b.in(kF32, {256, 1}));
        });
    }
    // Rows of 3 blocks (not a multiple of 256, as where llama.cpp's presets fall back to
    // Q5_0 / Q5_1); MXFP4 rows are then 51 bytes, an odd stride.
    for (Type t : {Type::Q5_0, Type::Q5_1, Type::IQ4_NL, Type::MXFP4}) {
        T.add(Op::MUL_MAT, tn(t) + "_k96", kMulMatQ, kNoteMulMatQ, [t](CaseBuilder& b) {
            return b.g().mul_mat(b.in(t, {96, 19}), b.in(kF32, {96, 6}));
        });
    }
    for (Type t : {kF32, kF16, Type::Q4_0, Type::Q4_K, Type::Q5_0, Type::Q3_K, Type::MXFP4}) {
        T.add(Op::MUL_MAT, tn(t) + "_batch", mul_mat_bound(t), mul_mat_note(t),
              [t](CaseBuilder& b) {
                  return b.g().mul_mat(b.in(t, {256, 65}), b.in(kF32, {256, 33}));
              });
    }
    // Wider than a device's matrix-vector kernels take (CUDA: 64 columns; then cuBLAS, or,
    // for the formats without a prefill path, the vector kernel's column groups).
    for (Type t :
         {kF16, Type::Q4_0, Type::Q6_K, Type::Q5_0, Type::Q3_K, Type::IQ4_XS, Type::MXFP4}) {
        T.add(Op::MUL_MAT, tn(t) + "_wide", mul_mat_bound(t), mul_mat_note(t), [t](CaseBuilder& b) {
            return b.g().mul_mat(b.in(t, {256, 40}), b.in(kF32, {256, 72}));
        });
    }
    for (Type t : {kF32, kF16}) {
        T.add(Op::MUL_MAT, tn(t) + "_k65", mul_mat_bound(t), mul_mat_note(t), [t](CaseBuilder& b) {
            return b.g().mul_mat(b.in(t, {65, 17}), b.in(kF32, {65, 9}));
        });
        T.add(Op::MUL_MAT, tn(t) + "_k1", mul_mat_bound(t), mul_mat_note(t), [t](CaseBuilder& b) {
            return b.g().mul_mat(b.in(t, {1, 5}), b.in(kF32, {1, 3}));
        });
        T.add(Op::MUL_MAT, tn(t) + "_bcast_4d", mul_mat_bound(t), mul_mat_note(t),
              [t](CaseBuilder& b) {
                  return b.g().mul_mat(b.in(t, {32, 5, 2, 3}), b.in(kF32, {32, 3, 4, 6}));
              });
    }
    T.add(Op::MUL_MAT, "f32_permuted_b", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        Tensor* y = b.g().permute(b.in(kF32, {64, 3, 5}), 0, 2, 1, 3);  // [64, 5, 3]
        return b.g().mul_mat(b.in(kF32, {64, 9, 3}), y);
    });
    T.add(Op::MUL_MAT, "q8_0_permuted_a", kMulMatQ, kNoteMulMatQ, [](CaseBuilder& b) {
        Tensor* a = b.g().permute(b.in(Type::Q8_0, {64, 3, 9}), 0, 2, 1, 3);  // [64, 9, 3]
        return b.g().mul_mat(a, b.in(kF32, {64, 5, 3}));
    });
    T.add(Op::MUL_MAT, "f16_permuted_a", kMulMatF16, kNoteMulMatF16, [](CaseBuilder& b) {
        Tensor* a = b.g().permute(b.in(kF16, {32, 3, 9}), 0, 2, 1, 3);  // [32, 9, 3]
        return b.g().mul_mat(a, b.in(kF32, {32, 5, 6}));
    });
}

void add_attention_cases(Table& T) {
    // SOFT_MAX
    T.add(Op::SOFT_MAX, "no_mask", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().soft_max(b.in(kF32, {65, 7, 3}, Fill::uniform(-4, 4)), nullptr, 0.5f);
    });
    T.add(Op::SOFT_MAX, "mask_f32_taller", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().soft_max(b.in(kF32, {65, 7, 3}, Fill::uniform(-4, 4)),
                              b.in(kF32, {65, 9}, Fill::mask(0.3)), 1.0f);
    });
    T.add(Op::SOFT_MAX, "mask_f16_per_matrix", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().soft_max(b.in(kF32, {33, 7, 3}, Fill::uniform(-4, 4)),
                              b.in(kF16, {33, 7, 3}, Fill::mask(0.3)), 0.125f);
    });
    T.add(Op::SOFT_MAX, "mask_bcast_dim2", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().soft_max(b.in(kF32, {32, 4, 2, 2}, Fill::uniform(-4, 4)),
                              b.in(kF32, {32, 4, 1, 2}, Fill::mask(0.3)), 1.0f);
    });
    T.add(Op::SOFT_MAX, "ne0_1", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().soft_max(b.in(kF32, {1, 5}), nullptr, 1.0f);
    });
    T.add(Op::SOFT_MAX, "permuted_masked", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        Tensor* a = b.g().permute(b.in(kF32, {16, 3, 5}, Fill::uniform(-4, 4)), 0, 2, 1, 3);
        return b.g().soft_max(a, b.in(kF16, {16, 5}, Fill::mask(0.3)), 0.7f);
    });

    // ROPE: positions distinct and out of order.
    for (int mode : {kRopeNormal, kRopeNeox}) {
        const std::string m = mode == kRopeNeox ? "neox" : "normal";
        T.add(Op::ROPE, m, kRope, kNoteRope, [mode](CaseBuilder& b) {
            return b.g().rope(b.in(kF32, {64, 8, 5}), b.in(kI32, {5}, Fill::positions(64)), 64,
                              mode, 10000.0f, 1.0f);
        });
        T.add(Op::ROPE, m + "_partial", kRope, kNoteRope, [mode](CaseBuilder& b) {
            return b.g().rope(b.in(kF32, {70, 4, 3}), b.in(kI32, {3}, Fill::positions(64)), 32,
                              mode, 10000.0f, 1.0f);
        });
        T.add(Op::ROPE, m + "_scaled", kRope, kNoteRope, [mode](CaseBuilder& b) {
            return b.g().rope(b.in(kF32, {128, 2, 7}), b.in(kI32, {7}, Fill::positions(64)), 128,
                              mode, 500000.0f, 0.25f);
        });
        T.add(Op::ROPE, m + "_permuted", kRope, kNoteRope, [mode](CaseBuilder& b) {
            Tensor* a = b.g().permute(b.in(kF32, {64, 5, 8}), 0, 2, 1, 3);  // [64, 8, 5]
            return b.g().rope(a, b.in(kI32, {5}, Fill::positions(64)), 64, mode, 10000.0f, 1.0f);
        });
        // Prefill-sized (16+ positions: a backend may share each position's angles between
        // heads): partial rotation, frequency factors, a permuted source.
        T.add(Op::ROPE, m + "_prefill_partial_ff", kRope, kNoteRope, [mode](CaseBuilder& b) {
            return b.g().rope(b.in(kF32, {70, 3, 20}), b.in(kI32, {20}, Fill::positions(4096)), 48,
                              mode, 500000.0f, 1.0f, b.in(kF32, {24}, Fill::uniform(1, 8)));
        });
        T.add(Op::ROPE, m + "_prefill_permuted", kRope, kNoteRope, [mode](CaseBuilder& b) {
            Tensor* a = b.g().permute(b.in(kF32, {128, 17, 4}), 0, 2, 1, 3);  // [128, 4, 17]
            return b.g().rope(a, b.in(kI32, {17}, Fill::positions(64)), 128, mode, 10000.0f, 1.0f);
        });
        // Llama 3 style frequency factors (divisors in [1, 8]).
        T.add(Op::ROPE, m + "_freq_factors", kRope, kNoteRope, [mode](CaseBuilder& b) {
            return b.g().rope(b.in(kF32, {64, 4, 6}), b.in(kI32, {6}, Fill::positions(64)), 48,
                              mode, 500000.0f, 1.0f, b.in(kF32, {24}, Fill::uniform(1, 8)));
        });
    }

    // FLASH_ATTN_EXT: q [D, n_q, n_head], k/v [D, n_kv, n_head_kv], out [Dv, n_head, n_q].
    const float s64 = 0.125f;  // 1/sqrt(64)
    T.add(Op::FLASH_ATTN_EXT, "f32_gqa_no_mask", kFloatMath, kNoteFloatMath, [s64](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {64, 7, 8}), b.in(kF32, {64, 33, 2}),
                                    b.in(kF32, {64, 33, 2}), nullptr, s64);
    });
    T.add(Op::FLASH_ATTN_EXT, "f16_gqa_mask", kAttnF16, kNoteAttnF16, [s64](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {64, 7, 8}), b.in(kF16, {64, 33, 2}),
                                    b.in(kF16, {64, 33, 2}), b.in(kF16, {33, 7}, Fill::mask(0.3)),
                                    s64);
    });
    T.add(Op::FLASH_ATTN_EXT, "f16_gqa_mask_padded", kAttnF16, kNoteAttnF16, [s64](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {64, 7, 8}), b.in(kF16, {64, 33, 2}),
                                    b.in(kF16, {64, 33, 2}), b.in(kF16, {33, 16}, Fill::mask(0.3)),
                                    s64);
    });
    T.add(Op::FLASH_ATTN_EXT, "f16_decode", kAttnF16, kNoteAttnF16, [s64](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {64, 1, 8}), b.in(kF16, {64, 65, 2}),
                                    b.in(kF16, {64, 65, 2}), b.in(kF16, {65, 1}, Fill::mask(0.3)),
                                    s64);
    });
    // Decode over fewer than 256 keys in several batches per warp (a backend may load a batch
    // of keys and values at once): head groups of 7 at D = 128, D = 32 with a batch dim and
    // Dv != D, per-head masks.
    T.add(Op::FLASH_ATTN_EXT, "f16_decode_short_d128_g7", kAttnF16, kNoteAttnF16,
          [](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {128, 1, 14}), b.in(kF16, {128, 200, 2}),
                                          b.in(kF16, {128, 200, 2}),
                                          b.in(kF16, {200, 1}, Fill::mask(0.2)), 0.088f);
          });
    // Decode over a short cache in one round trip (a backend may load every key and value of a
    // head at once): D = 128 with head groups of 7, 256 keys of BF16 with per-head masks, a
    // single key with a batch dim, a permuted cache view.
    T.add(Op::FLASH_ATTN_EXT, "f16_decode_row_d128_g7", kAttnF16, kNoteAttnF16, [](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {128, 1, 14}), b.in(kF16, {128, 120, 2}),
                                    b.in(kF16, {128, 120, 2}),
                                    b.in(kF16, {120, 1}, Fill::mask(0.2)), 0.088f);
    });
    T.add(Op::FLASH_ATTN_EXT, "bf16_decode_row_256_mask_per_head", kAttnBF16, kNoteAttnBF16,
          [s64](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {64, 1, 8}), b.in(kBF16, {64, 256, 2}),
                                          b.in(kBF16, {64, 256, 2}),
                                          b.in(kF32, {256, 1, 8}, Fill::mask(0.5)), s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "f16_decode_row_one_key_ne3", kAttnF16, kNoteAttnF16,
          [s64](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {64, 1, 4, 2}), b.in(kF16, {64, 1, 2, 2}),
                                          b.in(kF16, {64, 1, 2, 2}), nullptr, s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "f16_decode_row_cache_view", kAttnF16, kNoteAttnF16,
          [s64](CaseBuilder& b) {
              Tensor* k = b.g().permute(b.in(kF16, {64, 2, 100}), 0, 2, 1, 3);
              Tensor* v = b.g().permute(b.in(kF16, {64, 2, 100}), 0, 2, 1, 3);
              return b.g().flash_attn_ext(b.in(kF32, {64, 1, 8}), k, v,
                                          b.in(kF16, {100, 1}, Fill::mask(0.3)), s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "f32_decode_short_dv_differs_ne3", kFloatMath, kNoteFloatMath,
          [s64](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {64, 1, 4, 2}), b.in(kF32, {64, 150, 2, 2}),
                                          b.in(kF32, {32, 150, 2, 2}), nullptr, s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "bf16_decode_short_mask_per_head", kAttnBF16, kNoteAttnBF16,
          [](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {32, 1, 8}), b.in(kBF16, {32, 130, 4}),
                                          b.in(kBF16, {32, 130, 4}),
                                          b.in(kF32, {130, 1, 8}, Fill::mask(0.5)), 0.18f);
          });
    T.add(Op::FLASH_ATTN_EXT, "f32_dv_differs", kFloatMath, kNoteFloatMath, [s64](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {64, 5, 4}), b.in(kF32, {64, 17, 4}),
                                    b.in(kF32, {32, 17, 4}), b.in(kF32, {17, 5}, Fill::mask(0.3)),
                                    s64);
    });
    T.add(Op::FLASH_ATTN_EXT, "bf16_gqa", kAttnBF16, kNoteAttnBF16, [s64](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {64, 4, 8}), b.in(kBF16, {64, 20, 2}),
                                    b.in(kBF16, {64, 20, 2}), nullptr, s64);
    });
    T.add(Op::FLASH_ATTN_EXT, "f16_permuted_kv", kAttnF16, kNoteAttnF16, [s64](CaseBuilder& b) {
        // K/V stored as a cache [D, n_head_kv, n_kv], viewed as [D, n_kv, n_head_kv].
        Tensor* k = b.g().permute(b.in(kF16, {64, 2, 33}), 0, 2, 1, 3);
        Tensor* v = b.g().permute(b.in(kF16, {64, 2, 33}), 0, 2, 1, 3);
        return b.g().flash_attn_ext(b.in(kF32, {64, 6, 8}), k, v,
                                    b.in(kF16, {33, 6}, Fill::mask(0.3)), s64);
    });
    T.add(Op::FLASH_ATTN_EXT, "f32_mask_per_head", kFloatMath, kNoteFloatMath,
          [s64](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {64, 7, 8}), b.in(kF32, {64, 33, 2}),
                                          b.in(kF32, {64, 33, 2}),
                                          b.in(kF32, {33, 7, 2}, Fill::mask(0.3)), s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "f32_batch_ne3", kFloatMath, kNoteFloatMath, [](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {32, 3, 4, 2}), b.in(kF32, {32, 9, 2, 2}),
                                    b.in(kF32, {32, 9, 2, 2}), nullptr, 0.2f);
    });
    // Decode-sized (one query per head) over 256+ keys (a backend may take one block per KV
    // head there): head groups of 7, per-head masks, cache views, f32.
    T.add(Op::FLASH_ATTN_EXT, "f16_decode_d128_g7", kAttnF16, kNoteAttnF16, [](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {128, 1, 14}), b.in(kF16, {128, 260, 2}),
                                    b.in(kF16, {128, 260, 2}),
                                    b.in(kF16, {260, 1}, Fill::mask(0.2)), 0.088f);
    });
    T.add(Op::FLASH_ATTN_EXT, "f16_decode_cache_view", kAttnF16, kNoteAttnF16,
          [s64](CaseBuilder& b) {
              Tensor* k = b.g().permute(b.in(kF16, {64, 2, 270}), 0, 2, 1, 3);
              Tensor* v = b.g().permute(b.in(kF16, {64, 2, 270}), 0, 2, 1, 3);
              return b.g().flash_attn_ext(b.in(kF32, {64, 1, 8}), k, v,
                                          b.in(kF16, {270, 1}, Fill::mask(0.3)), s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "bf16_decode_mask_per_head", kAttnBF16, kNoteAttnBF16,
          [s64](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {64, 1, 8}), b.in(kBF16, {64, 300, 2}),
                                          b.in(kBF16, {64, 300, 2}),
                                          b.in(kF32, {300, 1, 8}, Fill::mask(0.5)), s64);
          });
    // Decode over a padded cache view, as a session pads its KV length: 700 keys of which the
    // first 300 are visible, so whole blocks of keys may be masked (a backend may split the keys
    // into chunks and merge them); D = 128 over 1,000 keys with 7 heads per KV head, 999 visible.
    T.add(Op::FLASH_ATTN_EXT, "f16_decode_padded_700", kAttnF16, kNoteAttnF16,
          [s64](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {64, 1, 8}), b.in(kF16, {64, 700, 2}),
                                          b.in(kF16, {64, 700, 2}),
                                          b.in(kF16, {700, 1}, Fill::causal(400)), s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "bf16_decode_d128_g7_1000", kAttnBF16, kNoteAttnBF16,
          [](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {128, 1, 14}), b.in(kBF16, {128, 1000, 2}),
                                          b.in(kBF16, {128, 1000, 2}),
                                          b.in(kF16, {1000, 1}, Fill::causal(1)), 0.088f);
          });
    T.add(Op::FLASH_ATTN_EXT, "f32_decode_batch_ne3", kFloatMath, kNoteFloatMath,
          [](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {32, 1, 4, 2}), b.in(kF32, {32, 280, 2, 2}),
                                          b.in(kF32, {32, 280, 2, 2}), nullptr, 0.2f);
          });
    // Prefill-sized: 16+ queries per head take a backend's tiled kernels (CUDA: 64 queries x
    // 64 keys a block), so these cross tile edges, skip whole masked tiles and leave tails.
    T.add(Op::FLASH_ATTN_EXT, "f16_prefill_causal", kAttnF16, kNoteAttnF16, [s64](CaseBuilder& b) {
        return b.g().flash_attn_ext(b.in(kF32, {64, 100, 8}), b.in(kF16, {64, 130, 2}),
                                    b.in(kF16, {64, 130, 2}),
                                    b.in(kF16, {130, 100}, Fill::causal()), s64);
    });
    T.add(Op::FLASH_ATTN_EXT, "f32_prefill_d128_no_mask", kFloatMath, kNoteFloatMath,
          [](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {128, 40, 4}), b.in(kF32, {128, 70, 2}),
                                          b.in(kF32, {128, 70, 2}), nullptr, 0.088f);
          });
    T.add(Op::FLASH_ATTN_EXT, "f32_prefill_dv_differs", kFloatMath, kNoteFloatMath,
          [s64](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {64, 20, 4}), b.in(kF32, {64, 33, 4}),
                                          b.in(kF32, {32, 33, 4}),
                                          b.in(kF32, {33, 20, 4}, Fill::mask(0.5)), s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "f32_prefill_batch_ne3", kFloatMath, kNoteFloatMath,
          [](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {32, 17, 4, 2}), b.in(kF32, {32, 20, 2, 2}),
                                          b.in(kF32, {32, 20, 2, 2}), nullptr, 0.2f);
          });
    T.add(Op::FLASH_ATTN_EXT, "f16_prefill_d128_causal", kAttnF16, kNoteAttnF16,
          [](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {128, 70, 8}), b.in(kF16, {128, 90, 2}),
                                          b.in(kF16, {128, 90, 2}),
                                          b.in(kF16, {90, 70}, Fill::causal()), 0.088f);
          });
    T.add(Op::FLASH_ATTN_EXT, "f16_prefill_permuted_kv", kAttnF16, kNoteAttnF16,
          [s64](CaseBuilder& b) {
              // K/V as a cache [D, n_head_kv, n_kv] viewed as [D, n_kv, n_head_kv].
              Tensor* k = b.g().permute(b.in(kF16, {64, 2, 80}), 0, 2, 1, 3);
              Tensor* v = b.g().permute(b.in(kF16, {64, 2, 80}), 0, 2, 1, 3);
              return b.g().flash_attn_ext(b.in(kF32, {64, 33, 8}), k, v,
                                          b.in(kF16, {80, 33}, Fill::causal()), s64);
          });
    T.add(Op::FLASH_ATTN_EXT, "f16_prefill_d36", kAttnF16, kNoteAttnF16, [](CaseBuilder& b) {
        // 72-byte rows: not whole 16-byte chunks, so element-by-element tile loads.
        return b.g().flash_attn_ext(b.in(kF32, {36, 20, 4}), b.in(kF16, {36, 40, 2}),
                                    b.in(kF16, {36, 40, 2}), b.in(kF16, {40, 20}, Fill::causal()),
                                    0.1667f);
    });
    T.add(Op::FLASH_ATTN_EXT, "bf16_prefill_mask_padded", kAttnBF16, kNoteAttnBF16,
          [s64](CaseBuilder& b) {
              return b.g().flash_attn_ext(b.in(kF32, {64, 24, 8}), b.in(kBF16, {64, 50, 2}),
                                          b.in(kBF16, {64, 50, 2}),
                                          b.in(kF16, {50, 32}, Fill::mask(0.5)), s64);
          });
}

// Fills in types/shapes from a dry build of the case's graph.
void describe_case(OpTestCase& c) {
    Context in, g;
    CaseBuilder b(in, g);
    Tensor* root = c.build(b);
    const Tensor* subject = root->op == c.op ? root : nullptr;
    if (!subject) {
        Graph gr;
        gr.build_forward(root);
        for (const Tensor* n : gr.nodes) {
            if (n->op == c.op) subject = n;
        }
    }
    FERRY_ASSERT(subject);
    std::string types, shapes;
    for (int i = 0; i < kMaxSrc; i++) {
        const Tensor* s = subject->src[i];
        if (!s) continue;
        if (!types.empty()) {
            types += c.op == Op::CPY ? "->" : ",";
            shapes += ",";
        }
        types += type_name(s->type);
        shapes += dims(s);
        if (!s->is_contiguous()) shapes += "(nc)";
    }
    c.types = types;
    c.shapes = shapes;
}

bool ieq(const std::string& a, const char* b) {
    return strcasecmp(a.c_str(), b) == 0;
}

}  // namespace

std::vector<OpTestCase> make_op_tests(const std::string& filter) {
    Table T;
    add_copy_cases(T);
    add_layout_cases(T);
    add_rows_cases(T);
    add_elementwise_cases(T);
    add_reduction_cases(T);
    add_mul_mat_cases(T);
    add_attention_cases(T);

    // Comma-separated tokens: an op name selects that op's cases; any other token selects the
    // cases whose name contains it (case-insensitive).
    auto lower = [](std::string s) {
        for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        return s;
    };
    std::vector<std::string> tokens;
    for (size_t start = 0; start < filter.size();) {
        const size_t comma = filter.find(',', start);
        const size_t end = comma == std::string::npos ? filter.size() : comma;
        if (end > start) tokens.push_back(filter.substr(start, end - start));
        start = end + 1;
    }
    std::vector<OpTestCase> out;
    for (OpTestCase& c : T.cases) {
        bool keep = tokens.empty();
        const std::string lname = lower(c.name);
        for (const std::string& tok : tokens) {
            if (op_from_name(tok.c_str()).has_value()) {
                keep |= ieq(tok, op_name(c.op));
            } else {
                keep |= lname.find(lower(tok)) != std::string::npos;
            }
        }
        if (!keep) continue;
        describe_case(c);
        out.push_back(std::move(c));
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Running one case.

OpTestResult run_op_test(const OpTestCase& c, Backend* backend) {
    OpTestResult r;
    r.bound = c.max_nmse;
    auto fail = [&](const std::string& msg) {
        r.passed = false;
        r.message = msg;
        return r;
    };
    Device* dev = backend->device();
    Context in_ctx, g_ctx;
    CaseBuilder b(in_ctx, g_ctx);
    Tensor* root = c.build(b);
    root->flags |= kTensorOutput;
    const Tensor* read = b.read_tensor() ? b.read_tensor() : root;

    Graph g;
    g.build_forward(root);
    for (const Tensor* n : g.nodes) {
        if (!dev->supports_op(n)) {
            r.supported = false;
            return fail(strfmt("device %s does not support %s %s", dev->name(), op_name(n->op),
                               describe(n).c_str()));
        }
    }

    BufferType* bt = dev->buffer_type();
    Expected<std::unique_ptr<Buffer>> in_buf = allocate_context_tensors(in_ctx, bt);
    if (!in_buf) return fail("allocating inputs: " + in_buf.message());
    GraphAllocator galloc(bt);
    if (Status st = galloc.allocate(g); !st) return fail("allocating the graph: " + st.message());
    // Views whose owner already had storage (in-place writes into inputs) when the allocator
    // had nothing else to place.
    for (Tensor* n : g.nodes) {
        if (n->view_src && !n->buffer && n->view_src->buffer) init_view(n);
    }

    RefEval ref;
    for (size_t i = 0; i < b.inputs().size(); i++) {
        const CaseBuilder::Input& in = b.inputs()[i];
        const std::vector<uint8_t> bytes =
            make_input_bytes(in.t, in.fill, c.seed ^ (0x9e3779b97f4a7c15ull * (i + 1)));
        if (Status st = backend->set_tensor_async(in.t, bytes.data(), 0, bytes.size()); !st) {
            return fail("setting input: " + st.message());
        }
        if (Status st = ref.set_leaf(in.t, bytes.data(), bytes.size()); !st) {
            return fail(st.message());
        }
    }

    // Inputs, compute and the read go through the backend's stream; the read is ordered
    // after the compute by the stream and complete once synchronize() returns.
    if (Status st = backend->compute(g); !st) return fail(st.message());
    std::vector<uint8_t> got_bytes(read->nbytes());
    if (Status st = backend->get_tensor_async(read, got_bytes.data(), 0, got_bytes.size()); !st) {
        return fail("reading the output: " + st.message());
    }
    if (Status st = backend->synchronize(); !st) return fail(st.message());
    // The bytes read are contiguous: decode them as a contiguous tensor of read's shape.
    Tensor shape = *read;
    shape.view_src = nullptr;
    set_contiguous_strides(&shape);
    Expected<std::vector<double>> got = decode_tensor(&shape, got_bytes.data(), got_bytes.size());
    if (!got) return fail(got.message());
    r.output = got_bytes;

    if (Status st = ref.run(g); !st) return fail(st.message());
    Expected<std::vector<double>> want = ref.values(read);
    if (!want) return fail(want.message());
    if (got->size() != want->size()) return fail("output size differs from the reference");

    double err = 0.0, sum = 0.0, worst = -1.0;
    size_t worst_i = 0, mismatches = 0;
    for (size_t i = 0; i < got->size(); i++) {
        const double o = (*got)[i], w = (*want)[i];
        if (!std::isfinite(o) || !std::isfinite(w)) {
            if (o == w) continue;  // e.g. both -inf
            return fail(strfmt("element %zu: got %g, want %g", i, o, w));
        }
        const double d = (o - w) * (o - w);
        err += d;
        sum += w * w;
        if (d > worst) {
            worst = d;
            worst_i = i;
        }
        if (o != w) mismatches++;
    }
    r.nmse = sum > 0 ? err / sum : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    const size_t n0 = static_cast<size_t>(read->ne[0]);
    const bool integer = read->type == Type::I32;
    if (integer ? mismatches != 0 : !(r.nmse <= r.bound)) {
        return fail(
            strfmt("NMSE %.3g > bound %.3g (%zu of %zu elements differ; worst: element "
                   "[%zu, row %zu] got %.9g, want %.9g)",
                   r.nmse, r.bound, mismatches, got->size(), worst_i % n0, worst_i / n0,
                   (*got)[worst_i], (*want)[worst_i]));
    }
    // An NMSE averaged over N elements hides one wrong element among many. No element may be
    // off by more than kOutlier * sqrt(bound) * max(|ref|, rms(ref)): kOutlier = 10 is far in
    // the tail of any legitimate error spread (whose per-element RMS is <= sqrt(bound)).
    constexpr double kOutlier = 10.0;
    const double rms = got->empty() ? 0.0 : std::sqrt(sum / static_cast<double>(got->size()));
    for (size_t i = 0; i < got->size() && !integer; i++) {
        const double o = (*got)[i], w = (*want)[i];
        if (!std::isfinite(w)) continue;
        const double allowed = kOutlier * std::sqrt(r.bound) * std::max(std::fabs(w), rms);
        if (std::fabs(o - w) > allowed) {
            return fail(
                strfmt("element [%zu, row %zu] got %.9g, want %.9g: off by more than "
                       "%g (10 sqrt(bound) max(|ref|, rms %.3g)) although NMSE %.3g is "
                       "within the bound",
                       i % n0, i / n0, o, w, allowed, rms, r.nmse));
        }
    }
    r.passed = true;
    return r;
}

}  // namespace ferry::testing
