// libFuzzer target for the safetensors reader (the input of `ferry convert`): any bytes must
// parse or fail cleanly with a message naming the file. A file that parses has every tensor
// byte read back as floats (so a range outside the input shows up under ASan).
//
//   build/fuzz/tests/fuzz_safetensors -max_total_time=60 fuzz-corpus/safetensors

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "model/safetensors.h"

namespace {

volatile float g_sink;

void check(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto f = ferry::SafetensorsFile::from_memory(data, size, "fuzz.safetensors");
    if (!f) {
        check(f.message().find("fuzz.safetensors") != std::string::npos);
        return 0;
    }
    std::vector<float> buf;
    for (const ferry::StTensor& t : (*f)->tensors()) {
        check(t.data >= data && t.data + t.nbytes() <= data + size);
        buf.resize(static_cast<size_t>(t.nelements));
        ferry::SafetensorsFile::to_f32(t, buf.data(), 0, t.nelements);
        float s = 0;
        for (float v : buf) s += v;
        g_sink = s;
    }
    return 0;
}
