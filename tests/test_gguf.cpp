// GGUF reader and writer: byte-for-byte round trips of the fixture files, dequantized
// checksums of every fixture tensor against the reference (dequant-checks.json), a generated
// corpus of corrupt files (each must fail with a message naming the field, never crash), and
// writer behaviour (layout, alignment, errors, atomic replacement).

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/json.h"
#include "ferry/gguf.h"
#include "ferry/types.h"

namespace ferry {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

const char* const kFixtureNames[] = {
    "tiny-llama-f32.gguf",  "tiny-llama-f16.gguf",    "tiny-llama-q8_0.gguf",
    "tiny-llama-q6_k.gguf", "tiny-llama-q5_k_m.gguf", "tiny-llama-q4_k_m.gguf",
    "tiny-llama-q4_1.gguf", "tiny-llama-q4_0.gguf",
};

std::string fixture_path(const std::string& name) {
    return std::string(FERRY_FIXTURES_DIR) + "/tiny-llama/" + name;
}

std::vector<uint8_t> read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::string temp_path(const std::string& name) {
    return ::testing::TempDir() + "ferry_test_gguf_" + std::to_string(::getpid()) + "_" + name;
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// Parses bytes that must be rejected; returns the message (which must name the input).
std::string reject(const std::vector<uint8_t>& bytes, const std::string& name = "bad.gguf") {
    auto f = GgufFile::from_memory(bytes.data(), bytes.size(), name);
    EXPECT_FALSE(f.has_value()) << name << ": accepted a corrupt file";
    if (f) return std::string();
    EXPECT_EQ(f.message().rfind(name + ": ", 0), 0u) << f.message();
    return f.message();
}

#define EXPECT_REJECTED(bytes, ...)                                                     \
    do {                                                                                \
        const std::string msg_ = reject(bytes);                                         \
        for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__}) {        \
            EXPECT_TRUE(contains(msg_, part_)) << "'" << part_ << "' not in: " << msg_; \
        }                                                                               \
    } while (0)

void put_u32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
    std::memcpy(&b[at], &v, 4);
}
void put_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
    std::memcpy(&b[at], &v, 8);
}
uint64_t get_u64(const std::vector<uint8_t>& b, size_t at) {
    uint64_t v;
    std::memcpy(&v, &b[at], 8);
    return v;
}

// Position of a GGUF string (u64 length + bytes) equal to s, searching from `from`.
size_t find_gguf_string(const std::vector<uint8_t>& b, const std::string& s, size_t from = 0) {
    std::vector<uint8_t> pat(8 + s.size());
    const uint64_t n = s.size();
    std::memcpy(pat.data(), &n, 8);
    std::memcpy(pat.data() + 8, s.data(), s.size());
    auto it =
        std::search(b.begin() + static_cast<std::ptrdiff_t>(from), b.end(), pat.begin(), pat.end());
    EXPECT_NE(it, b.end()) << "string '" << s << "' not found";
    return static_cast<size_t>(it - b.begin());
}

// A raw little-endian GGUF encoder that writes whatever it is told (for corrupt inputs).
struct Raw {
    std::vector<uint8_t> b;
    Raw& u8(uint8_t v) {
        b.push_back(v);
        return *this;
    }
    Raw& u16(uint16_t v) { return put(&v, 2); }
    Raw& u32(uint32_t v) { return put(&v, 4); }
    Raw& u64(uint64_t v) { return put(&v, 8); }
    Raw& f32(float v) { return put(&v, 4); }
    Raw& str(const std::string& s) {
        u64(s.size());
        return put(s.data(), s.size());
    }
    Raw& put(const void* p, size_t n) {
        // resize + memcpy: GCC 12 at -O3 misreads vector::insert of a small range as an
        // overflow (-Wstringop-overflow) when the CPU lacks AVX-512.
        const size_t at = b.size();
        b.resize(at + n);
        if (n) std::memcpy(b.data() + at, p, n);
        return *this;
    }
};

struct RawTensor {
    std::string name;
    uint32_t n_dims;
    std::vector<uint64_t> ne;
    uint32_t type;
    uint64_t offset;
};

// A small file in raw form: every field can be set to anything.
struct RawFile {
    uint32_t version = 3;
    bool override_counts = false;
    uint64_t tensor_count = 0, kv_count = 0;
    std::vector<Raw> kvs;  // fully encoded (key, type, value)
    std::vector<RawTensor> tensors;
    uint64_t alignment = 32;  // used for the padding only
    uint64_t data_size = 0;

    std::vector<uint8_t> bytes() const {
        Raw r;
        r.put("GGUF", 4).u32(version);
        r.u64(override_counts ? tensor_count : tensors.size());
        r.u64(override_counts ? kv_count : kvs.size());
        for (const Raw& kv : kvs) r.put(kv.b.data(), kv.b.size());
        for (const RawTensor& t : tensors) {
            r.str(t.name).u32(t.n_dims);
            for (uint64_t v : t.ne) r.u64(v);
            r.u32(t.type).u64(t.offset);
        }
        while (r.b.size() % alignment) r.u8(0);
        for (uint64_t k = 0; k < data_size; k++) r.u8(static_cast<uint8_t>(k * 7 + 1));
        return r.b;
    }
};

Raw kv_u32(const std::string& key, uint32_t v) {
    Raw r;
    r.str(key).u32(4).u32(v);
    return r;
}
Raw kv_str(const std::string& key, const std::string& v) {
    Raw r;
    r.str(key).u32(8).str(v);
    return r;
}

// Valid base: a string kv, an f32 [8] tensor at 0 (32 bytes) and a q8_0 [32, 2] one at 32
// (68 bytes), 128 bytes of data.
RawFile base_file() {
    RawFile f;
    f.kvs.push_back(kv_str("general.architecture", "llama"));
    f.kvs.push_back(kv_u32("x.count", 7));
    f.tensors.push_back({"a", 1, {8}, 0, 0});
    f.tensors.push_back({"b", 2, {32, 2}, 8, 32});
    f.data_size = 128;
    return f;
}

// Neumaier-compensated sum in long double: effectively exact for these sizes, so the test's
// own rounding stays far below the 1e-9 tolerance whatever order the reference summed in.
struct Sum {
    long double s = 0, c = 0;
    void add(long double x) {
        const long double t = s + x;
        if (std::fabs(s) >= std::fabs(x)) {
            c += (s - t) + x;
        } else {
            c += (x - t) + s;
        }
        s = t;
    }
    double value() const { return static_cast<double>(s + c); }
};

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// ---------------------------------------------------------------------------------------------
// Fixtures: structure, byte-for-byte round trip, dequantized checksums

class GgufFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufFixture, Structure) {
    auto f = GgufFile::open(fixture_path(GetParam()));
    ASSERT_TRUE(f.has_value()) << f.message();
    const GgufFile& g = *f.value();
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.alignment(), 32u);
    EXPECT_EQ(g.tensors().size(), 39u);
    EXPECT_EQ(g.data_offset() % 32, 0u);
    EXPECT_EQ(g.get_string("general.architecture").value(), "llama");
    EXPECT_EQ(g.get_int("llama.embedding_length").value(), 256);
    EXPECT_EQ(g.get_int("llama.block_count").value(), 4);
    EXPECT_NEAR(g.get_float("llama.attention.layer_norm_rms_epsilon").value(), 1e-5, 1e-12);
    EXPECT_TRUE(g.get_bool("tokenizer.ggml.add_bos_token").value());
    auto tokens = g.get_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.has_value()) << tokens.message();
    EXPECT_EQ(tokens.value()->elem_type, GgufValueType::STRING);
    EXPECT_EQ(tokens.value()->arr.size(), 1024u);
    EXPECT_EQ(tokens.value()->arr[1].s, "<s>");
    const GgufTensorInfo* t = g.find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->ne[0], 256);
    EXPECT_EQ(t->ne[1], 256);
    EXPECT_EQ(g.find_tensor("nope"), nullptr);
    // Missing keys and wrong types are named.
    auto missing = g.get_int("llama.nope");
    ASSERT_FALSE(missing.has_value());
    EXPECT_TRUE(contains(missing.message(), "'llama.nope'")) << missing.message();
    auto wrong = g.get_int("general.architecture");
    ASSERT_FALSE(wrong.has_value());
    EXPECT_TRUE(contains(wrong.message(), "'general.architecture'")) << wrong.message();
    EXPECT_TRUE(contains(wrong.message(), "string")) << wrong.message();
}

TEST_P(GgufFixture, RoundTripIsByteForByte) {
    const std::string path = fixture_path(GetParam());
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.has_value()) << f.message();
    const std::vector<uint8_t> original = read_all(path);
    ASSERT_EQ(original.size(), f.value()->file_size());
    const GgufWriter w = gguf_writer_from(*f.value());
    const std::vector<uint8_t> bytes = w.to_bytes();
    ASSERT_EQ(bytes.size(), original.size());
    EXPECT_TRUE(bytes == original);
    // And through a file.
    const std::string out = temp_path(GetParam());
    ASSERT_TRUE(w.write(out).is_ok());
    EXPECT_TRUE(read_all(out) == original);
    EXPECT_NE(::access((out + ".tmp").c_str(), F_OK), 0);
    std::remove(out.c_str());
}

TEST_P(GgufFixture, DequantizedTensorsMatchReference) {
    auto checks = json::parse_file(fixture_path("dequant-checks.json"));
    ASSERT_TRUE(checks.has_value()) << checks.message();
    const json::Value& list = checks.value()["files"][GetParam()];
    ASSERT_TRUE(list.is_array()) << "no checks for " << GetParam();

    auto f = GgufFile::open(fixture_path(GetParam()));
    ASSERT_TRUE(f.has_value()) << f.message();
    const GgufFile& g = *f.value();

    // The reference lists exactly the file's tensors.
    ASSERT_EQ(list.size(), g.tensors().size());
    std::vector<std::string> seen;
    for (const json::Value& c : list.as_array()) {
        const std::string& name = c["name"].as_string();
        SCOPED_TRACE(std::string(GetParam()) + " " + name);
        ASSERT_EQ(std::count(seen.begin(), seen.end(), name), 0) << "listed twice";
        seen.push_back(name);
        const GgufTensorInfo* t = g.find_tensor(name);
        ASSERT_NE(t, nullptr) << "tensor missing from the file";
        EXPECT_EQ(lower(c["type"].as_string()), lower(type_name(t->type)));
        ASSERT_EQ(c["ne"].size(), static_cast<size_t>(t->n_dims));
        for (int d = 0; d < t->n_dims; d++) {
            EXPECT_EQ(c["ne"].at(static_cast<size_t>(d)).as_number(),
                      static_cast<double>(t->ne[d]));
        }

        const int64_t ne0 = t->ne[0];
        const int64_t nrows = t->ne[1] * t->ne[2] * t->ne[3];
        const size_t rs = row_size(t->type, ne0);
        std::vector<float> row(static_cast<size_t>(ne0));
        Sum sum, sumsq;
        std::vector<float> first;
        for (int64_t r = 0; r < nrows; r++) {
            const uint8_t* src = g.tensor_data(*t) + static_cast<size_t>(r) * rs;
            Status st = to_float_row(t->type, src, row.data(), ne0);
            ASSERT_TRUE(st.is_ok()) << st.message();
            for (float v : row) {
                sum.add(v);
                sumsq.add(static_cast<long double>(v) * v);
                if (first.size() < 16) first.push_back(v);
            }
        }
        const double want_sum = c["sum"].as_number();
        const double want_sumsq = c["sumsq"].as_number();
        EXPECT_LE(std::fabs(sum.value() - want_sum), 1e-9 * std::fabs(want_sum))
            << "sum " << sum.value() << " vs " << want_sum;
        EXPECT_LE(std::fabs(sumsq.value() - want_sumsq), 1e-9 * std::fabs(want_sumsq))
            << "sumsq " << sumsq.value() << " vs " << want_sumsq;
        ASSERT_EQ(c["first16"].size(), first.size());
        for (size_t k = 0; k < first.size(); k++) {
            EXPECT_EQ(first[k], static_cast<float>(c["first16"].at(k).as_number()))
                << "element " << k;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(TinyLlama, GgufFixture, ::testing::ValuesIn(kFixtureNames),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                             std::string s = info.param;
                             s = s.substr(11, s.size() - 16);  // between "tiny-llama-" and ".gguf"
                             for (char& c : s) {
                                 if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                             }
                             return s;
                         });

TEST(GgufFixtures, ReferenceCoversAllEightFiles) {
    auto checks = json::parse_file(fixture_path("dequant-checks.json"));
    ASSERT_TRUE(checks.has_value()) << checks.message();
    EXPECT_EQ(checks.value()["files"].size(), std::size(kFixtureNames));
    for (const char* name : kFixtureNames) {
        EXPECT_TRUE(checks.value()["files"].contains(name)) << name;
    }
}

// ---------------------------------------------------------------------------------------------
// Corruption corpus from a real fixture

class GgufCorruptFixture : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        bytes_ = new std::vector<uint8_t>(read_all(fixture_path("tiny-llama-q4_0.gguf")));
    }
    static void TearDownTestSuite() {
        delete bytes_;
        bytes_ = nullptr;
    }
    static std::vector<uint8_t>* bytes_;
    std::vector<uint8_t> copy() const { return *bytes_; }
    size_t data_offset() const {
        auto f = GgufFile::from_memory(bytes_->data(), bytes_->size(), "q4_0");
        EXPECT_TRUE(f.has_value());
        return f.value()->data_offset();
    }
};
std::vector<uint8_t>* GgufCorruptFixture::bytes_ = nullptr;

TEST_F(GgufCorruptFixture, TheUncorruptedFileParses) {
    auto f = GgufFile::from_memory(bytes_->data(), bytes_->size(), "q4_0");
    ASSERT_TRUE(f.has_value()) << f.message();
}

TEST_F(GgufCorruptFixture, TruncatedAnywhere) {
    const size_t header = data_offset();
    const size_t size = bytes_->size();
    std::vector<size_t> cuts;
    for (size_t n = 0; n < header; n++) cuts.push_back(n);  // every byte of the header region
    for (size_t n = header; n < size; n += 4099) cuts.push_back(n);
    for (size_t n = size - 64; n < size; n++) cuts.push_back(n);
    for (size_t n : cuts) {
        std::vector<uint8_t> b(bytes_->begin(), bytes_->begin() + static_cast<std::ptrdiff_t>(n));
        const std::string msg = reject(b);
        const bool clear = contains(msg, "file ends at") || contains(msg, "exceeds the") ||
                           contains(msg, "past the end") || contains(msg, "too small") ||
                           contains(msg, "truncated");
        ASSERT_TRUE(clear) << "cut at " << n << ": " << msg;
        if (n >= header) {
            ASSERT_TRUE(contains(msg, "tensor '")) << msg;
        }
    }
}

TEST_F(GgufCorruptFixture, BadMagicAndVersion) {
    auto b = copy();
    b[0] = 'X';
    EXPECT_REJECTED(b, "magic", "not a GGUF file");
    for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) {
        b = copy();
        put_u32(b, 4, v);
        EXPECT_REJECTED(b, "version", std::to_string(v).c_str());
    }
    b = copy();
    put_u32(b, 4, 0x03000000u);
    EXPECT_REJECTED(b, "big-endian");
    b = copy();
    put_u32(b, 4, 2);  // version 2 has the same layout and is accepted
    auto f = GgufFile::from_memory(b.data(), b.size(), "v2");
    ASSERT_TRUE(f.has_value()) << f.message();
    EXPECT_EQ(f.value()->version(), 2u);
}

TEST_F(GgufCorruptFixture, AbsurdCounts) {
    for (uint64_t n : {uint64_t{1} << 62, ~uint64_t{0}, uint64_t{1} << 32, uint64_t{200000}}) {
        auto b = copy();
        put_u64(b, 8, n);
        EXPECT_REJECTED(b, "tensor_count", std::to_string(n).c_str(), "corrupt");
        b = copy();
        put_u64(b, 16, n);
        EXPECT_REJECTED(b, "kv_count", std::to_string(n).c_str(), "corrupt");
    }
    // Plausible but wrong counts fail further on, in whatever they misread.
    auto b = copy();
    put_u64(b, 8, 40);
    EXPECT_REJECTED(b, "tensor");
    b = copy();
    put_u64(b, 16, 28);
    reject(b);
}

TEST_F(GgufCorruptFixture, CorruptMetadata) {
    // First kv: key "general.architecture" at 24, value type at 52, string value at 56.
    ASSERT_EQ(find_gguf_string(*bytes_, "general.architecture"), 24u);
    auto b = copy();
    put_u64(b, 24, uint64_t{1} << 62);
    EXPECT_REJECTED(b, "kv #0", "key", "string length 4611686018427387904");
    b = copy();
    put_u32(b, 52, 13);
    EXPECT_REJECTED(b, "'general.architecture'", "unknown value type 13");
    b = copy();
    put_u32(b, 52, 0xFFFFFFFFu);
    EXPECT_REJECTED(b, "'general.architecture'", "unknown value type 4294967295");
    b = copy();
    put_u64(b, 56, uint64_t{1} << 62);
    EXPECT_REJECTED(b, "'general.architecture'", "string length");
    b = copy();
    put_u64(b, 56, b.size());
    EXPECT_REJECTED(b, "'general.architecture'", "string length");

    // The token array: key, type 9, element type 8, count.
    const size_t tok = find_gguf_string(*bytes_, "tokenizer.ggml.tokens");
    const size_t arr = tok + 8 + std::strlen("tokenizer.ggml.tokens");
    ASSERT_EQ(get_u64(*bytes_, arr + 8), 1024u);
    for (uint64_t n : {uint64_t{1} << 62, ~uint64_t{0}, uint64_t{1} << 40}) {
        b = copy();
        put_u64(b, arr + 8, n);
        EXPECT_REJECTED(b, "'tokenizer.ggml.tokens'", "array count");
    }
    b = copy();
    put_u32(b, arr + 4, 13);
    EXPECT_REJECTED(b, "'tokenizer.ggml.tokens'", "unknown array element type 13");
    // An element's string length: the first token's.
    b = copy();
    put_u64(b, arr + 16, uint64_t{1} << 62);
    EXPECT_REJECTED(b, "'tokenizer.ggml.tokens'", "element 0", "string length");
    // Elements read as u64 instead of strings make a different but still consistent parse up
    // to the point where something breaks: it must fail cleanly, not crash.
    b = copy();
    put_u32(b, arr + 4, 10);
    reject(b);

    // A bool that is neither 0 nor 1.
    const size_t bos = find_gguf_string(*bytes_, "tokenizer.ggml.add_bos_token");
    const size_t val = bos + 8 + std::strlen("tokenizer.ggml.add_bos_token") + 4;
    ASSERT_EQ((*bytes_)[val], 1);
    b = copy();
    b[val] = 2;
    EXPECT_REJECTED(b, "'tokenizer.ggml.add_bos_token'", "bool value 2");

    // A second kv renamed to the first's key.
    const size_t type_key = find_gguf_string(*bytes_, "general.type");
    b = copy();
    std::memcpy(&b[type_key + 8], "general.name", 12);
    EXPECT_REJECTED(b, "'general.name'", "duplicate key");
}

TEST_F(GgufCorruptFixture, CorruptTensorInfo) {
    // First tensor info: "output.weight", n_dims 2, ne [256, 1024], type 2 (q4_0), offset 0.
    const size_t info0 = find_gguf_string(*bytes_, "output.weight");
    const size_t nd = info0 + 8 + 13;
    const size_t ne0 = nd + 4, ne1 = ne0 + 8, type = ne1 + 8, off = type + 4;
    ASSERT_EQ(get_u64(*bytes_, ne0), 256u);
    ASSERT_EQ(get_u64(*bytes_, ne1), 1024u);
    ASSERT_EQ(get_u64(*bytes_, off), 0u);

    auto b = copy();
    put_u64(b, info0, uint64_t{1} << 62);
    EXPECT_REJECTED(b, "tensor #0", "name", "string length");
    for (uint32_t n : {5u, 8u, 0xFFFFFFFFu}) {
        b = copy();
        put_u32(b, nd, n);
        EXPECT_REJECTED(b, "'output.weight'", "n_dims", std::to_string(n).c_str());
    }
    b = copy();
    put_u64(b, ne0, static_cast<uint64_t>(-256));
    EXPECT_REJECTED(b, "'output.weight'", "dimension 0 is negative");
    b = copy();
    put_u64(b, ne1, ~uint64_t{0});
    EXPECT_REJECTED(b, "'output.weight'", "dimension 1 is negative");
    b = copy();
    put_u64(b, ne0, uint64_t{1} << 40);
    put_u64(b, ne1, uint64_t{1} << 40);
    EXPECT_REJECTED(b, "'output.weight'", "overflow");
    b = copy();
    put_u64(b, ne0, 100);  // not a multiple of the q4_0 block size 32
    EXPECT_REJECTED(b, "'output.weight'", "block size");
    b = copy();
    put_u64(b, ne1, 1024 * 1024);  // far more data than the file holds
    EXPECT_REJECTED(b, "'output.weight'", "extends past the end of the file");
    for (uint32_t t : {4u, 5u, 99u, 0xFFFFFFFFu}) {
        b = copy();
        put_u32(b, type, t);
        EXPECT_REJECTED(b, "'output.weight'", "unknown type id", std::to_string(t).c_str());
    }
    b = copy();
    put_u32(b, type, 15);
    EXPECT_REJECTED(b, "'output.weight'", "not a storage type");
    b = copy();
    put_u64(b, off, 16);
    EXPECT_REJECTED(b, "'output.weight'", "offset 16", "alignment 32");
    b = copy();
    put_u64(b, off, uint64_t{1} << 62);
    EXPECT_REJECTED(b, "'output.weight'", "extends past the end of the file");
    b = copy();
    put_u64(b, off, ~uint64_t{31});
    EXPECT_REJECTED(b, "'output.weight'", "extends past the end of the file");
    // Moved onto the data of the next tensor.
    const size_t next = find_gguf_string(*bytes_, "output_norm.weight", off);
    const size_t next_off = next + 8 + 18 + 4 + 8 + 4;
    b = copy();
    put_u64(b, off, get_u64(*bytes_, next_off));
    EXPECT_REJECTED(b, "overlaps", "'output.weight'", "'output_norm.weight'");
    // A tensor renamed to another's name (same length, so nothing moves).
    const size_t k0 = find_gguf_string(*bytes_, "blk.0.attn_k.weight", info0);
    b = copy();
    b[k0 + 8 + 4] = '1';
    EXPECT_REJECTED(b, "'blk.1.attn_k.weight'", "duplicate tensor name");
}

// ---------------------------------------------------------------------------------------------
// Corruption corpus from small raw files

TEST(GgufCorrupt, RawBaseFileIsValid) {
    const auto bytes = base_file().bytes();
    auto f = GgufFile::from_memory(bytes.data(), bytes.size(), "base");
    ASSERT_TRUE(f.has_value()) << f.message();
    EXPECT_EQ(f.value()->tensors().size(), 2u);
    EXPECT_EQ(f.value()->tensors()[1].nbytes, 68u);
}

TEST(GgufCorrupt, TinyInputs) {
    EXPECT_REJECTED(std::vector<uint8_t>{}, "too small");
    EXPECT_REJECTED(std::vector<uint8_t>({'G', 'G', 'U'}), "too small");
    EXPECT_REJECTED(std::vector<uint8_t>({'G', 'G', 'U', 'F'}), "version");
    EXPECT_REJECTED(std::vector<uint8_t>({'G', 'G', 'U', 'F', 3, 0, 0, 0}), "tensor_count");
    EXPECT_REJECTED(std::vector<uint8_t>({'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}),
                    "kv_count");
    // The smallest valid file: no kvs, no tensors.
    RawFile empty;
    const auto b = empty.bytes();
    auto f = GgufFile::from_memory(b.data(), b.size(), "empty");
    ASSERT_TRUE(f.has_value()) << f.message();
    EXPECT_TRUE(f.value()->tensors().empty());
}

TEST(GgufCorrupt, TruncatedSmallFile) {
    const auto full = base_file().bytes();
    // Tensor b ends 100 bytes into the 128-byte data section; shorter files are all corrupt.
    const size_t end = full.size() - 28;
    for (size_t n = 0; n < end; n++) {
        std::vector<uint8_t> b(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
        reject(b);
    }
}

TEST(GgufCorrupt, Dims) {
    RawFile f = base_file();
    f.tensors[0] = {"a", 5, {8, 1, 1, 1, 1}, 0, 0};
    EXPECT_REJECTED(f.bytes(), "'a'", "n_dims 5");
    f = base_file();
    f.tensors[1].ne = {32, uint64_t{1} << 63};
    EXPECT_REJECTED(f.bytes(), "'b'", "dimension 1 is negative");
    f = base_file();
    f.tensors[1] = {"b", 4, {32, uint64_t{1} << 20, uint64_t{1} << 20, uint64_t{1} << 30}, 8, 32};
    EXPECT_REJECTED(f.bytes(), "'b'", "overflow");
    // A zero dim does not hide an overflowing product of the others.
    f = base_file();
    f.tensors[1] = {"b", 4, {0, uint64_t{1} << 40, uint64_t{1} << 40, 1}, 8, 32};
    EXPECT_REJECTED(f.bytes(), "'b'", "overflow");
    // Zero-sized tensors are fine, even at the end of the data.
    f = base_file();
    f.tensors.push_back({"z", 2, {0, 5}, 0, 128});
    const auto ok = f.bytes();
    auto g = GgufFile::from_memory(ok.data(), ok.size(), "zero");
    ASSERT_TRUE(g.has_value()) << g.message();
    EXPECT_EQ(g.value()->find_tensor("z")->nbytes, 0u);
    // n_dims 0 is a scalar.
    f = base_file();
    f.tensors[0] = {"a", 0, {}, 0, 0};
    const auto scalar = f.bytes();
    g = GgufFile::from_memory(scalar.data(), scalar.size(), "scalar");
    ASSERT_TRUE(g.has_value()) << g.message();
    EXPECT_EQ(g.value()->find_tensor("a")->nbytes, 4u);
}

TEST(GgufCorrupt, Names) {
    RawFile f = base_file();
    f.tensors[1].name = "a";
    EXPECT_REJECTED(f.bytes(), "'a'", "duplicate tensor name");
    f = base_file();
    f.tensors[1].name = "";
    EXPECT_REJECTED(f.bytes(), "empty tensor name");
    f = base_file();
    f.tensors[1].name = std::string(64, 'n');
    EXPECT_REJECTED(f.bytes(), "name is 64 bytes long");
    f = base_file();
    f.tensors[1].name = std::string("bad\x01\xff", 5);
    f.tensors[1].offset = 3;
    EXPECT_REJECTED(f.bytes(), "'bad\\x01\\xff'");
    f = base_file();
    f.kvs.push_back(kv_u32("x.count", 8));
    EXPECT_REJECTED(f.bytes(), "'x.count'", "duplicate key");
}

TEST(GgufCorrupt, Types) {
    RawFile f = base_file();
    // 4, 5: Q4_2 / Q4_3 (removed from GGUF); 9: Q8_1; 16: IQ2_XXS; 31: removed.
    for (uint32_t t : {4u, 5u, 9u, 16u, 31u, 1000u}) {
        f.tensors[1].type = t;
        EXPECT_REJECTED(f.bytes(), "'b'", "unknown type id");
    }
    f.tensors[1].type = 15;
    EXPECT_REJECTED(f.bytes(), "'b'", "not a storage type");
    // A newer block format with a row its block does not divide: half a Q3_K super-block.
    f = base_file();
    f.tensors[1] = {"b", 1, {128}, static_cast<uint32_t>(Type::Q3_K), 32};
    f.data_size = 32 + 1024;
    EXPECT_REJECTED(f.bytes(), "'b'", "not a multiple of the q3_K block size 256");
    // Every storage type is accepted at a compatible shape.
    int n = 0;
    const Type* ts = storage_types(&n);
    for (int k = 0; k < n; k++) {
        f = base_file();
        f.tensors[1] = {"b", 1, {256}, static_cast<uint32_t>(ts[k]), 32};
        f.data_size = 32 + 1024;
        const auto b = f.bytes();
        auto g = GgufFile::from_memory(b.data(), b.size(), "t");
        EXPECT_TRUE(g.has_value()) << type_name(ts[k]) << ": " << g.message();
    }
}

TEST(GgufCorrupt, Values) {
    RawFile f = base_file();
    Raw kv;
    kv.str("k").u32(13).u32(0);
    f.kvs.push_back(kv);
    EXPECT_REJECTED(f.bytes(), "'k'", "unknown value type 13");

    f = base_file();
    kv = Raw();
    kv.str("k").u32(7).u8(255);
    f.kvs.push_back(kv);
    EXPECT_REJECTED(f.bytes(), "'k'", "bool value 255");

    f = base_file();
    kv = Raw();
    kv.str("k").u32(9).u32(7).u64(3).u8(1).u8(0).u8(3);
    f.kvs.push_back(kv);
    EXPECT_REJECTED(f.bytes(), "'k'", "element 2", "bool value 3");

    f = base_file();
    kv = Raw();
    kv.str("k").u32(9).u32(0).u64(uint64_t{1} << 62);
    f.kvs.push_back(kv);
    EXPECT_REJECTED(f.bytes(), "'k'", "array count");

    // Arrays of strings / arrays cost at least 8 / 12 bytes each: counts that fit as bytes but
    // not as elements fail before anything is allocated.
    f = base_file();
    kv = Raw();
    kv.str("k").u32(9).u32(8).u64(100);
    f.kvs.push_back(kv);
    EXPECT_REJECTED(f.bytes(), "'k'", "array count 100");

    f = base_file();
    kv = Raw();
    kv.str("k").u32(9).u32(99).u64(0);
    f.kvs.push_back(kv);
    EXPECT_REJECTED(f.bytes(), "'k'", "unknown array element type 99");

    // Nested arrays: two levels are fine, deep nesting is refused.
    f = base_file();
    kv = Raw();
    kv.str("nested").u32(9).u32(9).u64(2);
    kv.u32(4).u64(1).u32(11);
    kv.u32(8).u64(2).str("x").str("yz");
    f.kvs.push_back(kv);
    auto bytes = f.bytes();
    auto g = GgufFile::from_memory(bytes.data(), bytes.size(), "nested");
    ASSERT_TRUE(g.has_value()) << g.message();
    const GgufValue* nested = g.value()->get_array("nested").value();
    ASSERT_EQ(nested->arr.size(), 2u);
    EXPECT_EQ(nested->arr[0].elem_type, GgufValueType::UINT32);
    EXPECT_EQ(nested->arr[0].arr[0].u, 11u);
    EXPECT_EQ(nested->arr[1].arr[1].s, "yz");

    f = base_file();
    kv = Raw();
    kv.str("deep").u32(9);
    for (int d = 0; d < 100; d++) kv.u32(9).u64(1);
    kv.u32(0).u64(0);
    f.kvs.push_back(kv);
    EXPECT_REJECTED(f.bytes(), "'deep'", "nested");
}

TEST(GgufCorrupt, Alignment) {
    for (uint32_t a : {0u, 3u, 48u, 0x80000001u}) {
        RawFile f = base_file();
        f.kvs.push_back(kv_u32("general.alignment", a));
        EXPECT_REJECTED(f.bytes(), "general.alignment", "not a power of two");
    }
    RawFile f = base_file();
    Raw kv;
    kv.str("general.alignment").u32(10).u64(32);  // u64, not u32
    f.kvs.push_back(kv);
    EXPECT_REJECTED(f.bytes(), "general.alignment", "expected u32");

    // A valid larger alignment moves the data section and constrains offsets.
    f = base_file();
    f.kvs.push_back(kv_u32("general.alignment", 64));
    f.alignment = 64;
    f.tensors[1].offset = 64;
    f.data_size = 192;
    auto bytes = f.bytes();
    auto g = GgufFile::from_memory(bytes.data(), bytes.size(), "a64");
    ASSERT_TRUE(g.has_value()) << g.message();
    EXPECT_EQ(g.value()->alignment(), 64u);
    EXPECT_EQ(g.value()->data_offset() % 64, 0u);
    f.tensors[1].offset = 32;
    f.data_size = 256;
    EXPECT_REJECTED(f.bytes(), "'b'", "offset 32", "alignment 64");
}

TEST(GgufCorrupt, DataRanges) {
    RawFile f = base_file();
    f.tensors[1].offset = 64;  // 64 + 68 > 128
    EXPECT_REJECTED(f.bytes(), "'b'", "data [offset 64, 68 bytes]",
                    "extends past the end of the file");
    f = base_file();
    f.data_size = 99;  // file ends inside b
    f.tensors[1].offset = 32;
    EXPECT_REJECTED(f.bytes(), "'b'", "extends past the end");
    f = base_file();
    f.tensors[1].offset = 0;  // on top of a
    EXPECT_REJECTED(f.bytes(), "overlaps", "'a'", "'b'");
    f = base_file();
    f.tensors[0].ne = {16};  // a grows to 64 bytes, into b at 32
    EXPECT_REJECTED(f.bytes(), "overlaps");
    f = base_file();
    f.tensors[1].offset = 33;
    EXPECT_REJECTED(f.bytes(), "'b'", "offset 33", "not a multiple of the alignment");
    // The data section itself lies past the end of the file.
    f = base_file();
    f.data_size = 0;
    auto b = f.bytes();
    while (b.size() % 32 == 0) b.pop_back();
    EXPECT_REJECTED(b, "data section starts at");
}

// ---------------------------------------------------------------------------------------------
// Writer

std::vector<uint8_t> iota_bytes(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t k = 0; k < n; k++) v[k] = static_cast<uint8_t>(seed + k * 13);
    return v;
}

TEST(GgufWriter, WritesWhatItIsGiven) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_u32("u", 4000000000u);
    w.add_i32("i", -5);
    w.add_f32("f", 0.25f);
    w.add_bool("b", true);
    w.add_string_array("sa", {"a", "", "c\xe2\x96\x81"});
    w.add_f32_array("fa", {1.5f, -2.0f});
    w.add_i32_array("ia", {});
    GgufValue u64;
    u64.type = GgufValueType::UINT64;
    u64.u = ~uint64_t{0};
    w.add_kv("u64", u64);
    GgufValue f64;
    f64.type = GgufValueType::FLOAT64;
    f64.f = 0.1;
    w.add_kv("f64", f64);
    w.add_i32("i", -6);  // replaces, keeps position

    const int64_t ne_a[] = {8};
    const int64_t ne_b[] = {32, 3};
    const auto da = iota_bytes(32, 1);
    const auto db = iota_bytes(3 * 34, 2);
    ASSERT_TRUE(w.add_tensor("a", Type::F32, 1, ne_a, da.data(), da.size()).is_ok());
    ASSERT_TRUE(w.add_tensor("b", Type::Q8_0, 2, ne_b, db.data(), db.size()).is_ok());

    const std::string path = temp_path("writer.gguf");
    ASSERT_TRUE(w.write(path).is_ok());
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.has_value()) << f.message();
    const GgufFile& g = *f.value();
    ASSERT_EQ(g.kvs().size(), 10u);
    EXPECT_EQ(g.kvs()[2].key, "i");
    EXPECT_EQ(g.get_int("i").value(), -6);
    EXPECT_EQ(g.get_int("u").value(), 4000000000);
    EXPECT_FALSE(g.get_int("u64").has_value());  // does not fit in int64
    EXPECT_TRUE(contains(g.get_int("u64").message(), "'u64'"));
    EXPECT_EQ(g.find_kv("u64")->value.u, ~uint64_t{0});
    EXPECT_EQ(g.get_float("f").value(), 0.25);
    EXPECT_EQ(g.get_float("f64").value(), 0.1);
    EXPECT_FALSE(g.get_float("i").has_value());
    EXPECT_TRUE(g.get_bool("b").value());
    EXPECT_FALSE(g.get_bool("u").has_value());
    const GgufValue* sa = g.get_array("sa").value();
    ASSERT_EQ(sa->arr.size(), 3u);
    EXPECT_EQ(sa->arr[2].s, "c\xe2\x96\x81");
    EXPECT_EQ(g.get_array("fa").value()->arr[1].f, -2.0);
    EXPECT_EQ(g.get_array("ia").value()->elem_type, GgufValueType::INT32);
    EXPECT_TRUE(g.get_array("ia").value()->arr.empty());
    EXPECT_FALSE(g.get_array("sa").value() == nullptr);
    EXPECT_FALSE(g.get_string("u").has_value());

    const GgufTensorInfo* a = g.find_tensor("a");
    const GgufTensorInfo* b = g.find_tensor("b");
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->offset, 0u);
    EXPECT_EQ(b->offset, 32u);
    EXPECT_EQ(b->nbytes, db.size());
    EXPECT_EQ(std::memcmp(g.tensor_data(*a), da.data(), da.size()), 0);
    EXPECT_EQ(std::memcmp(g.tensor_data(*b), db.data(), db.size()), 0);
    // The data section ends at a multiple of the alignment (102 bytes of b padded to 128).
    EXPECT_EQ(g.file_size() - g.data_offset(), 32u + 128u);
    // Padding is zeros.
    for (size_t k = g.data_offset() + 32 + db.size(); k < g.file_size(); k++) {
        EXPECT_EQ(g.file_data()[k], 0) << k;
    }
    EXPECT_TRUE(gguf_writer_from(g).to_bytes() == w.to_bytes());
    std::remove(path.c_str());
}

TEST(GgufWriter, RejectsBadTensors) {
    GgufWriter w;
    const auto data = iota_bytes(4096, 3);
    const int64_t ne8[] = {8};
    ASSERT_TRUE(w.add_tensor("a", Type::F32, 1, ne8, data.data(), 32).is_ok());
    auto err = [&](Status s, const char* part) {
        ASSERT_FALSE(s.is_ok()) << part;
        EXPECT_TRUE(contains(s.message(), part)) << s.message();
    };
    err(w.add_tensor("a", Type::F32, 1, ne8, data.data(), 32), "duplicate tensor name");
    err(w.add_tensor("c", Type::F32, 1, ne8, data.data(), 31), "31 bytes of data given");
    err(w.add_tensor("c", Type::Q4_0, 1, ne8, data.data(), 18), "block size");
    err(w.add_tensor("c", Type::Q8_K, 1, ne8, data.data(), 32), "not a storage type");
    const int64_t ne5[] = {1, 1, 1, 1, 1};
    err(w.add_tensor("c", Type::F32, 5, ne5, data.data(), 4), "n_dims");
    const int64_t neg[] = {8, -1};
    err(w.add_tensor("c", Type::F32, 2, neg, data.data(), 32), "negative");
    err(w.add_tensor(std::string(64, 'x'), Type::F32, 1, ne8, data.data(), 32), "64 bytes");
    err(w.add_tensor("", Type::F32, 1, ne8, data.data(), 32), "empty");
    // Explicit placement.
    err(w.add_tensor_at("c", Type::F32, 1, ne8, data.data(), 32, 16), "alignment");
    err(w.add_tensor_at("c", Type::F32, 1, ne8, data.data(), 32, 0), "overlaps");
    const int64_t ne16[] = {16};
    ASSERT_TRUE(w.add_tensor_at("c", Type::F32, 1, ne16, data.data(), 64, 128).is_ok());
    err(w.add_tensor_at("d", Type::F32, 1, ne16, data.data(), 64, 96), "overlaps");
    err(w.add_tensor_at("d", Type::F32, 1, ne16, data.data(), 64, 160), "overlaps");
    ASSERT_TRUE(w.add_tensor_at("d", Type::F32, 1, ne16, data.data(), 64, 32).is_ok());
    // An implicitly placed tensor goes after the furthest one.
    ASSERT_TRUE(w.add_tensor("e", Type::F32, 1, ne8, data.data(), 32).is_ok());
    const auto bytes = w.to_bytes();
    auto g = GgufFile::from_memory(bytes.data(), bytes.size(), "w");
    ASSERT_TRUE(g.has_value()) << g.message();
    EXPECT_EQ(g.value()->find_tensor("c")->offset, 128u);
    EXPECT_EQ(g.value()->find_tensor("d")->offset, 32u);
    EXPECT_EQ(g.value()->find_tensor("e")->offset, 192u);
    EXPECT_EQ(g.value()->tensors()[1].name, "c");  // insertion order
}

TEST(GgufWriter, Alignment) {
    GgufWriter w;
    w.add_string("general.architecture", "x");
    const auto data = iota_bytes(256, 5);
    const int64_t ne[] = {5};
    ASSERT_TRUE(w.add_tensor("a", Type::F32, 1, ne, data.data(), 20).is_ok());
    ASSERT_TRUE(w.add_tensor("b", Type::F32, 1, ne, data.data(), 20).is_ok());
    w.set_alignment(128);  // re-places the tensors already added
    EXPECT_EQ(w.alignment(), 128u);
    auto bytes = w.to_bytes();
    auto g = GgufFile::from_memory(bytes.data(), bytes.size(), "a128");
    ASSERT_TRUE(g.has_value()) << g.message();
    EXPECT_EQ(g.value()->alignment(), 128u);
    EXPECT_EQ(g.value()->get_int("general.alignment").value(), 128);
    EXPECT_EQ(g.value()->data_offset() % 128, 0u);
    EXPECT_EQ(g.value()->find_tensor("b")->offset, 128u);
    EXPECT_EQ(bytes.size() % 128, 0u);
    EXPECT_TRUE(gguf_writer_from(*g.value()).to_bytes() == bytes);

    // Changing the alignment of a copied layout re-packs it.
    GgufWriter copy = gguf_writer_from(*g.value());
    copy.set_alignment(256);
    bytes = copy.to_bytes();
    g = GgufFile::from_memory(bytes.data(), bytes.size(), "a256");
    ASSERT_TRUE(g.has_value()) << g.message();
    EXPECT_EQ(g.value()->alignment(), 256u);
    EXPECT_EQ(g.value()->find_tensor("b")->offset, 256u);
    EXPECT_EQ(bytes.size() % 256, 0u);

    // The default alignment adds no kv.
    GgufWriter d;
    d.set_alignment(32);
    bytes = d.to_bytes();
    g = GgufFile::from_memory(bytes.data(), bytes.size(), "a32");
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(g.value()->find_kv("general.alignment"), nullptr);
}

TEST(GgufWriter, PreservesUnusualLayouts) {
    // Gaps, data out of info order, a zero-sized tensor, trailing bytes past the padding, a
    // non-default alignment and every value type: reading and rewriting gives the same bytes.
    RawFile f;
    f.kvs.push_back(kv_u32("general.alignment", 64));
    Raw kv;
    kv.str("all").u32(9).u32(9).u64(13);
    kv.u32(0).u64(1).u8(200);
    kv.u32(1).u64(1).u8(0x80);
    kv.u32(2).u64(1).u16(0xBEEF);
    kv.u32(3).u64(1).u16(0x8001);
    kv.u32(4).u64(1).u32(0xDEADBEEF);
    kv.u32(5).u64(1).u32(0x80000000u);
    kv.u32(6).u64(1).f32(-1.5f);
    kv.u32(7).u64(2).u8(1).u8(0);
    kv.u32(8).u64(1).str("s");
    kv.u32(9).u64(0);
    kv.u32(10).u64(1).u64(~uint64_t{0});
    kv.u32(11).u64(1).u64(uint64_t{1} << 63);
    const double d = -0.1;
    kv.u32(12).u64(1).put(&d, 8);
    f.kvs.push_back(kv);
    f.alignment = 64;
    f.tensors.push_back({"late", 1, {16}, 0, 256});
    f.tensors.push_back({"early", 1, {8}, 1, 0});
    f.tensors.push_back({"empty", 2, {0, 3}, 0, 64});
    f.tensors.push_back({"mid", 1, {32}, 8, 128});
    f.data_size = 256 + 64 + 7;  // 7 bytes past the end of the last tensor
    auto bytes = f.bytes();
    // The raw builder fills the whole data section with a pattern; zero the gaps and the tail,
    // which the writer regenerates as zeros.
    auto g = GgufFile::from_memory(bytes.data(), bytes.size(), "unusual");
    ASSERT_TRUE(g.has_value()) << g.message();
    const size_t base = g.value()->data_offset();
    std::vector<bool> used(bytes.size() - base, false);
    for (const GgufTensorInfo& t : g.value()->tensors()) {
        for (size_t k = 0; k < t.nbytes; k++) used[t.offset + k] = true;
    }
    for (size_t k = 0; k < used.size(); k++) {
        if (!used[k]) bytes[base + k] = 0;
    }
    g = GgufFile::from_memory(bytes.data(), bytes.size(), "unusual");
    ASSERT_TRUE(g.has_value()) << g.message();
    EXPECT_EQ(g.value()->find_tensor("early")->nbytes, 16u);
    const GgufValue* all = g.value()->get_array("all").value();
    ASSERT_EQ(all->arr.size(), 13u);
    EXPECT_EQ(all->arr[1].arr[0].i, -128);
    EXPECT_EQ(all->arr[2].arr[0].u, 0xBEEFu);
    EXPECT_EQ(all->arr[3].arr[0].i, -32767);
    EXPECT_EQ(all->arr[5].arr[0].i, INT32_MIN);
    EXPECT_EQ(all->arr[5].arr[0].u, 0u);  // negative: no unsigned mirror
    EXPECT_EQ(all->arr[10].arr[0].u, ~uint64_t{0});
    EXPECT_EQ(all->arr[10].arr[0].i, 0);  // too large for the signed mirror
    EXPECT_EQ(all->arr[11].arr[0].i, INT64_MIN);
    EXPECT_EQ(all->arr[12].arr[0].f, -0.1);
    const auto again = gguf_writer_from(*g.value()).to_bytes();
    ASSERT_EQ(again.size(), bytes.size());
    EXPECT_TRUE(again == bytes);
}

TEST(GgufWriter, ReplacesAMappedInputSafely) {
    // Rewriting a file over itself while it is mapped: the new file is written beside it and
    // renamed into place, so the open mapping keeps the old bytes.
    const std::string path = temp_path("self.gguf");
    GgufWriter w;
    w.add_string("general.name", "one");
    const auto data = iota_bytes(64, 9);
    const int64_t ne[] = {16};
    ASSERT_TRUE(w.add_tensor("t", Type::F32, 1, ne, data.data(), 64).is_ok());
    ASSERT_TRUE(w.write(path).is_ok());
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.has_value()) << f.message();
    GgufWriter w2 = gguf_writer_from(*f.value());
    w2.add_string("general.name", "two, a longer name that moves the data section");
    ASSERT_TRUE(w2.write(path).is_ok());
    EXPECT_EQ(f.value()->get_string("general.name").value(), "one");
    EXPECT_EQ(std::memcmp(f.value()->tensor_data(f.value()->tensors()[0]), data.data(), 64), 0);
    auto f2 = GgufFile::open(path);
    ASSERT_TRUE(f2.has_value()) << f2.message();
    EXPECT_EQ(f2.value()->get_string("general.name").value(),
              "two, a longer name that moves the data section");
    EXPECT_EQ(std::memcmp(f2.value()->tensor_data(f2.value()->tensors()[0]), data.data(), 64), 0);
    std::remove(path.c_str());

    // A write that cannot happen reports the path and leaves nothing behind.
    Status s = w.write("/nonexistent-dir/x.gguf");
    ASSERT_FALSE(s.is_ok());
    EXPECT_TRUE(contains(s.message(), "/nonexistent-dir/x.gguf.tmp")) << s.message();
}

TEST(GgufOpen, Errors) {
    auto f = GgufFile::open("/nonexistent/model.gguf");
    ASSERT_FALSE(f.has_value());
    EXPECT_TRUE(contains(f.message(), "/nonexistent/model.gguf: cannot open")) << f.message();
    f = GgufFile::open(::testing::TempDir());
    ASSERT_FALSE(f.has_value());
    EXPECT_TRUE(contains(f.message(), "not a regular file")) << f.message();
    const std::string empty = temp_path("empty.gguf");
    { std::ofstream(empty, std::ios::binary).flush(); }
    f = GgufFile::open(empty);
    ASSERT_FALSE(f.has_value());
    EXPECT_TRUE(contains(f.message(), empty + ": file is too small")) << f.message();
    std::remove(empty.c_str());
    // Errors from a mapped file name it too.
    const std::string bad = temp_path("bad.gguf");
    {
        RawFile r = base_file();
        r.tensors[1].offset = 64;
        const auto b = r.bytes();
        std::ofstream(bad, std::ios::binary)
            .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    }
    f = GgufFile::open(bad);
    ASSERT_FALSE(f.has_value());
    EXPECT_TRUE(contains(f.message(), bad + ": tensor 'b': data [offset 64, 68 bytes] extends "
                                            "past the end of the file"))
        << f.message();
    std::remove(bad.c_str());
}

// general.file_type, one table both ways: the values of llama.cpp's public file-type enum for a
// file of one weight type (a K type's is its _S form), each value's name starting with the
// type's, the _M mixtures named but never a single type's value, and 0 / nullptr elsewhere.
TEST(GgufFileType, ValuesAndNamesAgree) {
    const std::pair<Type, uint32_t> known[] = {
        {Type::F32, 0},     {Type::F16, 1},     {Type::Q4_0, 2},  {Type::Q4_1, 3},
        {Type::Q8_0, 7},    {Type::Q5_0, 8},    {Type::Q5_1, 9},  {Type::Q2_K, 10},
        {Type::Q3_K, 11},   {Type::Q4_K, 14},   {Type::Q5_K, 16}, {Type::Q6_K, 18},
        {Type::IQ4_NL, 25}, {Type::IQ4_XS, 30}, {Type::BF16, 32}, {Type::MXFP4, 38},
    };
    for (const auto& [t, v] : known) {
        EXPECT_EQ(gguf_file_type(t), v) << type_name(t);
        const char* name = gguf_file_type_name(v);
        ASSERT_NE(name, nullptr) << v;
        std::string upper = type_name(t);
        for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        EXPECT_EQ(std::string(name).rfind(upper, 0), 0u) << name << " for " << upper;
    }
    EXPECT_STREQ(gguf_file_type_name(15), "Q4_K_M");
    EXPECT_STREQ(gguf_file_type_name(17), "Q5_K_M");
    EXPECT_EQ(gguf_file_type_name(4), nullptr);  // a value the enum retired
    EXPECT_EQ(gguf_file_type_name(-1), nullptr);
    EXPECT_EQ(gguf_file_type(Type::I32), 0u);
}

}  // namespace
}  // namespace ferry
