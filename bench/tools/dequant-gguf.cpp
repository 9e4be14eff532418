// Rewrites a GGUF with every block-format tensor dequantized to F32 (reference dequantizer).
#include <cstdio>
#include <vector>

#include "ferry/gguf.h"
#include "ferry/types.h"
using namespace ferry;
int main(int argc, char** argv) {
    auto f = GgufFile::open(argv[1]);
    if (!f) {
        std::fprintf(stderr, "%s\n", f.message().c_str());
        return 1;
    }
    GgufWriter w;
    for (const GgufKV& kv : (*f)->kvs()) w.add_kv(kv.key, kv.value);
    for (const GgufTensorInfo& t : (*f)->tensors()) {
        const uint8_t* p = (*f)->tensor_data(t);
        if (t.type == Type::F32 || !is_quantized(t.type)) {
            Status st = w.add_tensor(t.name, t.type, t.n_dims, t.ne, p, t.nbytes);
            if (!st) {
                std::fprintf(stderr, "%s\n", st.message().c_str());
                return 1;
            }
            continue;
        }
        int64_t n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
        std::vector<float> v(n);
        Status st = to_float_row(t.type, p, v.data(), n);
        if (!st) {
            std::fprintf(stderr, "%s\n", st.message().c_str());
            return 1;
        }
        std::printf("%s %s -> f32\n", t.name.c_str(), type_name(t.type));
        st = w.add_tensor(t.name, Type::F32, t.n_dims, t.ne, v.data(), n * 4);
        if (!st) {
            std::fprintf(stderr, "%s\n", st.message().c_str());
            return 1;
        }
    }
    Status st = w.write(argv[2]);
    if (!st) {
        std::fprintf(stderr, "%s\n", st.message().c_str());
        return 1;
    }
}
