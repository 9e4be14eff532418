// libFuzzer target for the GGUF reader: any bytes must parse or fail cleanly. A file that
// parses has every value and every tensor byte touched (so out-of-range views show up under
// ASan), and rewriting it must give a file that parses to the same content and rewrites to
// the same bytes (the writer reproduces whatever the reader accepts).
//
//   build/fuzz/tests/fuzz_gguf -max_total_time=60 fuzz-corpus/gguf

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ferry/gguf.h"

namespace {

volatile uint64_t g_sink;

uint64_t touch(const ferry::GgufValue& v) {
    uint64_t h = static_cast<uint64_t>(v.type) ^ static_cast<uint64_t>(v.i) ^ v.u;
    uint64_t bits;
    std::memcpy(&bits, &v.f, 8);
    h ^= bits;
    for (char c : v.s) h = h * 31 + static_cast<uint8_t>(c);
    for (const ferry::GgufValue& e : v.arr) h = h * 7 + touch(e);
    return h;
}

void check(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto f = ferry::GgufFile::from_memory(data, size, "fuzz.gguf");
    if (!f) {
        check(!f.message().empty());
        return 0;
    }
    const ferry::GgufFile& g = *f.value();
    check(g.data_offset() % g.alignment() == 0);
    uint64_t h = g.version() + g.alignment();
    for (const ferry::GgufKV& kv : g.kvs()) {
        h ^= touch(kv.value) + kv.key.size();
        check(g.find_kv(kv.key) == &kv);
        // Typed getters must answer (value or error) for every key.
        auto s = g.get_string(kv.key);
        auto i = g.get_int(kv.key);
        auto d = g.get_float(kv.key);
        auto b = g.get_bool(kv.key);
        auto a = g.get_array(kv.key);
        h += s.has_value() + i.has_value() + d.has_value() + b.has_value() + a.has_value();
    }
    for (const ferry::GgufTensorInfo& t : g.tensors()) {
        check(g.find_tensor(t.name) == &t);
        check(t.offset % g.alignment() == 0);
        check(g.data_offset() + t.offset + t.nbytes <= g.file_size());
        if (t.nbytes > 0) {
            const uint8_t* p = g.tensor_data(t);
            h += p[0] + p[t.nbytes - 1] + p[t.nbytes / 2];
        }
        h += static_cast<uint64_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
    }
    g_sink = h;

    // Rewrite: the result must parse, and rewriting that must give identical bytes. (A file
    // with no tensors may declare a huge alignment that its end never reaches; the writer would
    // faithfully pad up to it, so such files are not rewritten here.)
    if (g.data_offset() > g.file_size() + (1u << 20)) return 0;
    const std::vector<uint8_t> once = ferry::gguf_writer_from(g).to_bytes();
    auto f2 = ferry::GgufFile::from_memory(once.data(), once.size(), "rewritten.gguf");
    check(f2.has_value());
    const ferry::GgufFile& g2 = *f2.value();
    check(g2.kvs().size() == g.kvs().size() && g2.tensors().size() == g.tensors().size());
    for (size_t k = 0; k < g.tensors().size(); k++) {
        const ferry::GgufTensorInfo& a = g.tensors()[k];
        const ferry::GgufTensorInfo& b = g2.tensors()[k];
        check(a.name == b.name && a.type == b.type && a.offset == b.offset && a.nbytes == b.nbytes);
        check(std::memcmp(g.tensor_data(a), g2.tensor_data(b), a.nbytes) == 0);
    }
    const std::vector<uint8_t> twice = ferry::gguf_writer_from(g2).to_bytes();
    check(once == twice);
    return 0;
}
