#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "core/json.h"
#include "ferry/types.h"

namespace ferry {

namespace {

// A header larger than this is not a real model's (llama.cpp's and the reference reader's
// limit is also 100 MB); refusing it keeps a hostile length from allocating gigabytes.
constexpr uint64_t kMaxHeader = 100u << 20;

size_t dtype_size(StDtype d) {
    return d == StDtype::F32 ? 4 : 2;
}

}  // namespace

uint64_t StTensor::nbytes() const {
    return nelements * dtype_size(dtype);
}

const char* st_dtype_name(StDtype d) {
    switch (d) {
        case StDtype::F32:
            return "F32";
        case StDtype::F16:
            return "F16";
        case StDtype::BF16:
            return "BF16";
    }
    return "?";
}

SafetensorsFile::~SafetensorsFile() {
    if (map_) munmap(map_, size_);
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
    for (const StTensor& t : tensors_) {
        if (t.name == name) return &t;
    }
    return nullptr;
}

void SafetensorsFile::to_f32(const StTensor& t, float* dst, uint64_t first, uint64_t n) {
    switch (t.dtype) {
        case StDtype::F32:
            std::memcpy(dst, t.data + first * 4, n * 4);
            break;
        case StDtype::F16:
            for (uint64_t i = 0; i < n; i++) {
                fp16_t h;
                std::memcpy(&h, t.data + (first + i) * 2, 2);
                dst[i] = fp16_to_fp32(h);
            }
            break;
        case StDtype::BF16:
            for (uint64_t i = 0; i < n; i++) {
                bf16_t h;
                std::memcpy(&h, t.data + (first + i) * 2, 2);
                dst[i] = bf16_to_fp32(h);
            }
            break;
    }
}

Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
    auto bad = [&](const std::string& what) { return Status::error(path + ": " + what); };
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return bad(std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return bad("not a regular file");
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size == 0) {
        ::close(fd);
        return bad("empty file");
    }
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return bad(std::string("mmap: ") + std::strerror(errno));
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = path;
    f->map_ = map;
    f->size_ = size;
    FERRY_TRY(f->parse(static_cast<const uint8_t*>(map), size));
    return f;
}

Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_memory(const uint8_t* data,
                                                                        size_t size,
                                                                        const std::string& name) {
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = name;
    FERRY_TRY(f->parse(data, size));
    return f;
}

Status SafetensorsFile::parse(const uint8_t* bytes, uint64_t size) {
    const std::string& path = path_;
    auto bad = [&](const std::string& what) { return Status::error(path + ": " + what); };
    if (size < 8) {
        return bad("too short for a safetensors header (" + std::to_string(size) + " bytes)");
    }
    uint64_t n_header = 0;
    for (int i = 7; i >= 0; i--) n_header = (n_header << 8) | bytes[i];
    if (n_header > kMaxHeader || n_header > size - 8) {
        return bad("header length " + std::to_string(n_header) + " exceeds the file (" +
                   std::to_string(size) + " bytes) or the 100 MB limit");
    }
    Expected<json::Value> hdr =
        json::parse(std::string_view(reinterpret_cast<const char*>(bytes + 8), n_header));
    if (!hdr) return Status::error(path + ": header: " + hdr.message());
    if (!hdr->is_object()) return bad("header is not a JSON object");
    const uint8_t* data = bytes + 8 + n_header;
    const uint64_t data_size = size - 8 - n_header;

    struct Range {
        uint64_t begin, end;
        size_t idx;
    };
    std::vector<Range> ranges;
    for (const json::Value::Member& m : hdr->as_object()) {
        if (m.first == "__metadata__") continue;
        const std::string where = "tensor '" + m.first + "'";
        const json::Value& v = m.second;
        if (!v.is_object()) return bad(where + " is not an object");
        const std::string& dt = v["dtype"].as_string();
        StTensor t;
        t.name = m.first;
        if (dt == "F32") {
            t.dtype = StDtype::F32;
        } else if (dt == "F16") {
            t.dtype = StDtype::F16;
        } else if (dt == "BF16") {
            t.dtype = StDtype::BF16;
        } else {
            return bad(where + " has dtype '" + dt + "' (supported: F32, F16, BF16)");
        }
        const json::Value& shape = v["shape"];
        if (!shape.is_array() || shape.size() > 8) {
            return bad(where + ": 'shape' must be an array of at most 8 sizes");
        }
        uint64_t n = 1;
        for (const json::Value& d : shape.as_array()) {
            if (!d.is_integer() || d.as_int() < 0 || d.as_int() > (int64_t{1} << 40)) {
                return bad(where + ": bad size in 'shape'");
            }
            const auto di = static_cast<uint64_t>(d.as_int());
            if (di != 0 && n > (uint64_t{1} << 50) / di) return bad(where + ": shape too large");
            n *= di;
            t.shape.push_back(d.as_int());
        }
        t.nelements = n;
        const json::Value& off = v["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off.at(0).is_integer() ||
            !off.at(1).is_integer() || off.at(0).as_int() < 0 || off.at(1).as_int() < 0) {
            return bad(where + ": 'data_offsets' must be two non-negative integers");
        }
        const auto b = static_cast<uint64_t>(off.at(0).as_int());
        const auto e = static_cast<uint64_t>(off.at(1).as_int());
        if (b > e || e > data_size) {
            return bad(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                       ") outside the data region of " + std::to_string(data_size) + " bytes");
        }
        if (e - b != t.nbytes()) {
            return bad(where + ": " + std::to_string(e - b) + " bytes for " + std::to_string(n) +
                       " elements of " + dt);
        }
        t.data = data + b;
        ranges.push_back({b, e, tensors_.size()});
        tensors_.push_back(std::move(t));
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < ranges.size(); i++) {
        if (ranges[i].begin < ranges[i - 1].end) {
            return bad("tensors '" + tensors_[ranges[i - 1].idx].name + "' and '" +
                       tensors_[ranges[i].idx].name + "' overlap");
        }
    }
    return Status::ok();
}

}  // namespace ferry
