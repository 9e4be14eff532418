// GGUF reading (memory-mapped, fully validated) and writing.
//
// Every count, length, offset and size read from a file is checked against the file's size
// before use; errors name the file and the field (key, tensor) at fault.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry {

enum class GgufValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};

// True for the eight integer value types (not BOOL).
bool gguf_is_integer(GgufValueType t);

// general.file_type, llama.cpp's file-type enum (a public enum of the GGUF ecosystem): the value
// for a file whose weights are all of type t (its _S form for a K type; 0, F32, for a type the
// enum has no value for), and a value's name (nullptr for one it does not know).
uint32_t gguf_file_type(Type t);
const char* gguf_file_type_name(int64_t ft);

// One metadata value. Arrays hold elements of a single type (arrays of arrays are allowed by
// the format and supported).
struct GgufValue {
    GgufValueType type = GgufValueType::UINT8;
    // Scalars: integers (all widths, bool) in i/u, floats in f; strings in s. A value read from
    // a file has both i and u set where it fits the other's range (else that one is 0); the
    // writer writes unsigned types and bool from u, signed types from i.
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0.0;
    std::string s;
    GgufValueType elem_type = GgufValueType::UINT8;  // for ARRAY
    std::vector<GgufValue> arr;
};

struct GgufKV {
    std::string key;
    GgufValue value;
};

struct GgufTensorInfo {
    std::string name;
    Type type = Type::F32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};
    uint64_t offset = 0;  // relative to the start of the data section
    size_t nbytes = 0;
};

class GgufFile {
  public:
    // Maps and validates the whole file: header, metadata, tensor infos (names unique, types
    // known, dims <= 4, sizes consistent, offsets aligned, ranges inside the file and not
    // overlapping).
    static Expected<std::unique_ptr<GgufFile>> open(const std::string& path);
    // Same, over bytes in memory (copied); `name` is used in error messages.
    static Expected<std::unique_ptr<GgufFile>> from_memory(const void* data, size_t size,
                                                           const std::string& name);
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    size_t alignment() const { return alignment_; }
    const std::vector<GgufKV>& kvs() const { return kvs_; }
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

    const GgufKV* find_kv(const std::string& key) const;
    const GgufTensorInfo* find_tensor(const std::string& name) const;

    // Typed metadata getters: fail with a message naming the key when it is missing or of
    // another type. Integer getters accept any integer type whose value fits.
    Expected<std::string> get_string(const std::string& key) const;
    Expected<int64_t> get_int(const std::string& key) const;
    Expected<double> get_float(const std::string& key) const;
    Expected<bool> get_bool(const std::string& key) const;
    Expected<const GgufValue*> get_array(const std::string& key) const;

    // The whole file and its data section (mapped read-only).
    const uint8_t* file_data() const { return base_; }
    size_t file_size() const { return size_; }
    size_t data_offset() const { return data_offset_; }
    const uint8_t* tensor_data(const GgufTensorInfo& t) const {
        return base_ + data_offset_ + t.offset;
    }
    // Whether the bytes are a mapping of the file (rather than a copy in memory).
    bool is_mapped() const { return map_ != nullptr; }
    // Drops the mapped pages that lie wholly inside [p, p + n) from this process (they stay in
    // the page cache and come back on the next access): after tensors were copied elsewhere,
    // so that they are not counted twice in the process's memory. No-op unless mapped.
    void release_pages(const uint8_t* p, size_t n) const;

  private:
    GgufFile() = default;
    Status parse();
    std::string path_;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    void* map_ = nullptr;         // mmap region (nullptr when owned_ holds the bytes)
    std::vector<uint8_t> owned_;  // for from_memory
    uint32_t version_ = 0;
    size_t alignment_ = 32;
    size_t data_offset_ = 0;
    std::vector<GgufKV> kvs_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t> tensor_index_;
};

// Builds a GGUF file (version 3): metadata in insertion order, tensor infos in insertion order,
// zero padding up to the alignment after the tensor infos, then the data section. Unless placed
// explicitly (add_tensor_at), each tensor's data starts at the first multiple of the alignment
// after every tensor added before it; the data section ends at a multiple of the alignment.
class GgufWriter {
  public:
    // Data alignment (a power of two; default 32). Also sets the "general.alignment" kv (u32),
    // which the file must carry when the alignment is not 32; adding that kv with add_kv sets
    // the alignment likewise. Changing it re-places every tensor added so far, packed in
    // insertion order (explicit offsets and a set data size are dropped).
    void set_alignment(size_t a);
    size_t alignment() const { return alignment_; }
    // Adds a metadata entry; a key added twice keeps its first position and its latest value.
    // Integers are written from `u` for unsigned types and bool, from `i` for signed types.
    void add_kv(const std::string& key, GgufValue v);
    void add_string(const std::string& key, const std::string& v);
    void add_u32(const std::string& key, uint32_t v);
    void add_i32(const std::string& key, int32_t v);
    void add_f32(const std::string& key, float v);
    void add_bool(const std::string& key, bool v);
    void add_string_array(const std::string& key, const std::vector<std::string>& v);
    void add_f32_array(const std::string& key, const std::vector<float>& v);
    void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
    // Data is copied; nbytes must equal the tensor's byte size for its type and shape. Fails
    // (naming the tensor) on a duplicate or over-long name, a non-storage type, more than 4
    // dims, a negative dim, or a row length that is not a multiple of the block size.
    Status add_tensor(const std::string& name, Type type, int n_dims, const int64_t* ne,
                      const void* data, size_t nbytes);
    // Same, with the data placed at `offset` bytes into the data section: a multiple of the
    // alignment, not overlapping any tensor added so far. Gaps are zero-filled. Reproduces
    // existing layouts (gguf_writer_from).
    Status add_tensor_at(const std::string& name, Type type, int n_dims, const int64_t* ne,
                         const void* data, size_t nbytes, uint64_t offset);
    // Size of the data section in bytes (reproduces a file's trailing bytes after its last
    // tensor); zeros fill it after the last tensor. Values below the end of the furthest
    // tensor are raised to it. By default: that end rounded up to the alignment.
    void set_data_size(uint64_t n) {
        data_size_ = n;
        has_data_size_ = true;
    }
    // Writes the whole file (to path.tmp, then renamed over path).
    Status write(const std::string& path) const;
    std::vector<uint8_t> to_bytes() const;

  private:
    size_t alignment_ = 32;
    uint64_t data_size_ = 0;
    bool has_data_size_ = false;
    uint64_t data_end_ = 0;  // end of the furthest tensor data added so far
    std::vector<GgufKV> kvs_;
    struct T {
        GgufTensorInfo info;
        std::vector<uint8_t> data;
    };
    std::vector<T> tensors_;
    std::map<std::string, size_t> tensor_index_;
    std::map<uint64_t, uint64_t> ranges_;  // offset -> end, for non-empty tensors
    bool any_explicit_ = false;            // some tensor was placed with add_tensor_at

    Status check_tensor(const std::string& name, Type type, int n_dims, const int64_t* ne,
                        size_t nbytes, GgufTensorInfo* info) const;
    void apply_alignment(size_t a);
    Status place(T&& t, bool explicit_offset);
    uint64_t data_size() const;
    template <class Sink>
    void serialize(Sink& sink) const;
};

// Copies a file's metadata and tensors into a writer (for round trips and rewriting). The
// writer keeps the file's tensor order, data offsets and alignment and the size of its data
// section, so writing it reproduces a version-3 file byte for byte whenever the file's padding
// bytes are zeros (as every writer makes them).
GgufWriter gguf_writer_from(const GgufFile& f);

}  // namespace ferry
