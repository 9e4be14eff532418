// A reader of Hugging Face safetensors files: an 8-byte little-endian header length N, N bytes
// of JSON {"name": {"dtype": D, "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
// {...}}, then the data region the offsets index (row-major, little-endian).
//
// Everything in the header is checked before any data is read: the header fits in the file,
// every tensor's byte range lies inside the data region and matches its shape and dtype, and
// ranges do not overlap. Errors name the file and the tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry {

enum class StDtype : uint8_t { F32, F16, BF16 };

struct StTensor {
    std::string name;
    StDtype dtype = StDtype::F32;
    std::vector<int64_t> shape;  // outermost first, as the file lists it (PyTorch order)
    uint64_t nelements = 0;
    const uint8_t* data = nullptr;  // into the file's mapping; nbytes() bytes
    uint64_t nbytes() const;
};

// "F32", "F16", "BF16".
const char* st_dtype_name(StDtype d);

class SafetensorsFile {
  public:
    // Maps and parses a file. Other dtypes (I64, F64, F8...) are an error naming the tensor.
    static Expected<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
    // Parses bytes the caller keeps alive for the object's lifetime; `name` names them in
    // errors (for tests and fuzzing).
    static Expected<std::unique_ptr<SafetensorsFile>> from_memory(const uint8_t* data, size_t size,
                                                                  const std::string& name);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    const std::vector<StTensor>& tensors() const { return tensors_; }
    const StTensor* find(const std::string& name) const;

    // Converts element i of t to float (F16 and BF16 widen exactly).
    static void to_f32(const StTensor& t, float* dst, uint64_t first, uint64_t n);

  private:
    SafetensorsFile() = default;
    Status parse(const uint8_t* bytes, uint64_t size);
    std::string path_;
    void* map_ = nullptr;
    size_t size_ = 0;
    std::vector<StTensor> tensors_;
};

}  // namespace ferry
