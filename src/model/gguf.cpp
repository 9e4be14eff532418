#include "ferry/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <unordered_set>

namespace ferry {

// Values are copied out of the file with memcpy, which is only correct on a little-endian host.
static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kWriteVersion = 3;
constexpr size_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;
// Tensor names must fit Tensor::name (63 bytes + NUL); llama.cpp enforces the same bound.
constexpr size_t kMaxTensorName = 63;
// Arrays of arrays are legal; nesting is bounded so a hostile file cannot exhaust the stack.
constexpr int kMaxArrayDepth = 8;
// Each metadata value costs a GgufValue (~100 bytes) in memory however small its encoding
// (1 byte for a u8): bound the total so a file cannot make the reader allocate ~100x its size.
// Real files hold well under a million (vocabularies of 256k tokens plus merges).
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 24;
// Smallest encodings, used to reject counts before anything is allocated for them.
constexpr size_t kMinKvBytes = 8 + 4 + 1;              // key length, value type, 1-byte value
constexpr size_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

const char* value_type_name(uint32_t t) {
    static const char* const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return t < std::size(names) ? names[t] : "unknown";
}

bool valid_value_type(uint32_t t) {
    return t <= static_cast<uint32_t>(GgufValueType::FLOAT64);
}

// Bytes of a fixed-size value; 0 for strings and arrays.
size_t scalar_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL:
            return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16:
            return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32:
            return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64:
            return 8;
        case GgufValueType::STRING:
        case GgufValueType::ARRAY:
            return 0;
    }
    return 0;
}

// Smallest possible encoding of one value of type t.
size_t min_value_size(GgufValueType t) {
    if (t == GgufValueType::STRING) return 8;     // length
    if (t == GgufValueType::ARRAY) return 4 + 8;  // element type, count
    return scalar_size(t);
}

struct FileType {
    uint32_t value;
    const char* name;
    bool one_type;  // a file of `type` alone (not a mixture)
    Type type;
};

constexpr FileType kFileTypes[] = {
    {0, "F32", true, Type::F32},        {1, "F16", true, Type::F16},
    {2, "Q4_0", true, Type::Q4_0},      {3, "Q4_1", true, Type::Q4_1},
    {7, "Q8_0", true, Type::Q8_0},      {8, "Q5_0", true, Type::Q5_0},
    {9, "Q5_1", true, Type::Q5_1},      {10, "Q2_K", true, Type::Q2_K},
    {11, "Q3_K_S", true, Type::Q3_K},   {12, "Q3_K_M", false, Type::Q3_K},
    {13, "Q3_K_L", false, Type::Q3_K},  {14, "Q4_K_S", true, Type::Q4_K},
    {15, "Q4_K_M", false, Type::Q4_K},  {16, "Q5_K_S", true, Type::Q5_K},
    {17, "Q5_K_M", false, Type::Q5_K},  {18, "Q6_K", true, Type::Q6_K},
    {25, "IQ4_NL", true, Type::IQ4_NL}, {30, "IQ4_XS", true, Type::IQ4_XS},
    {32, "BF16", true, Type::BF16},     {38, "MXFP4_MOE", true, Type::MXFP4},
};

}  // namespace

uint32_t gguf_file_type(Type t) {
    for (const FileType& f : kFileTypes) {
        if (f.one_type && f.type == t) return f.value;
    }
    return 0;
}

const char* gguf_file_type_name(int64_t ft) {
    for (const FileType& f : kFileTypes) {
        if (f.value == ft) return f.name;
    }
    return nullptr;
}

bool gguf_is_integer(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::UINT16:
        case GgufValueType::INT16:
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
            return true;
        default:
            return false;
    }
}

namespace {

bool is_signed_type(GgufValueType t) {
    return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
           t == GgufValueType::INT64;
}

uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

// Quotes a name from a file for an error message: printable ASCII as is, other bytes as \xNN,
// long names shortened.
std::string quoted(const std::string& s) {
    std::string out = "'";
    const size_t limit = 96;
    for (size_t i = 0; i < s.size() && i < limit; i++) {
        const uint8_t c = static_cast<uint8_t>(s[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += static_cast<char>(c);
        } else {
            out += strfmt("\\x%02x", c);
        }
    }
    if (s.size() > limit) {
        out += strfmt("...' (%zu bytes)", s.size());
    } else {
        out += "'";
    }
    return out;
}

void set_unsigned(GgufValue* v, uint64_t x) {
    v->u = x;
    v->i = x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? static_cast<int64_t>(x)
                                                                           : 0;
}

void set_signed(GgufValue* v, int64_t x) {
    v->i = x;
    v->u = x >= 0 ? static_cast<uint64_t>(x) : 0;
}

// Bounds-checked reads over the file's bytes. Every failure names the field and the offset.
class Cursor {
  public:
    Cursor(const uint8_t* p, size_t n) : p_(p), n_(n) {}
    size_t pos() const { return pos_; }
    size_t left() const { return n_ - pos_; }
    size_t size() const { return n_; }

    Status need(size_t k, const char* what) const {
        if (k <= left()) return Status::ok();
        return Status::errorf("%s: needs %zu bytes at offset %zu but the file ends at %zu", what, k,
                              pos_, n_);
    }
    template <class V>
    Status read(V* out, const char* what) {
        FERRY_TRY(need(sizeof(V), what));
        std::memcpy(out, p_ + pos_, sizeof(V));
        pos_ += sizeof(V);
        return Status::ok();
    }
    Status read_string(std::string* out, const char* what) {
        uint64_t len = 0;
        FERRY_TRY(read(&len, what));
        if (len > left()) {
            return Status::errorf(
                "%s: string length %" PRIu64
                " exceeds the %zu bytes left in the file (length field at offset %zu)",
                what, len, left(), pos_ - 8);
        }
        out->assign(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
        pos_ += static_cast<size_t>(len);
        return Status::ok();
    }

  private:
    const uint8_t* p_;
    size_t n_;
    size_t pos_ = 0;
};

Status read_value(Cursor& c, GgufValueType type, GgufValue* out, int depth, uint64_t* budget) {
    out->type = type;
    switch (type) {
        case GgufValueType::UINT8: {
            uint8_t v = 0;
            FERRY_TRY(c.read(&v, "u8 value"));
            set_unsigned(out, v);
            return Status::ok();
        }
        case GgufValueType::INT8: {
            int8_t v = 0;
            FERRY_TRY(c.read(&v, "i8 value"));
            set_signed(out, v);
            return Status::ok();
        }
        case GgufValueType::UINT16: {
            uint16_t v = 0;
            FERRY_TRY(c.read(&v, "u16 value"));
            set_unsigned(out, v);
            return Status::ok();
        }
        case GgufValueType::INT16: {
            int16_t v = 0;
            FERRY_TRY(c.read(&v, "i16 value"));
            set_signed(out, v);
            return Status::ok();
        }
        case GgufValueType::UINT32: {
            uint32_t v = 0;
            FERRY_TRY(c.read(&v, "u32 value"));
            set_unsigned(out, v);
            return Status::ok();
        }
        case GgufValueType::INT32: {
            int32_t v = 0;
            FERRY_TRY(c.read(&v, "i32 value"));
            set_signed(out, v);
            return Status::ok();
        }
        case GgufValueType::UINT64: {
            uint64_t v = 0;
            FERRY_TRY(c.read(&v, "u64 value"));
            set_unsigned(out, v);
            return Status::ok();
        }
        case GgufValueType::INT64: {
            int64_t v = 0;
            FERRY_TRY(c.read(&v, "i64 value"));
            set_signed(out, v);
            return Status::ok();
        }
        case GgufValueType::FLOAT32: {
            float v = 0;
            FERRY_TRY(c.read(&v, "f32 value"));
            out->f = v;
            return Status::ok();
        }
        case GgufValueType::FLOAT64: {
            double v = 0;
            FERRY_TRY(c.read(&v, "f64 value"));
            out->f = v;
            return Status::ok();
        }
        case GgufValueType::BOOL: {
            uint8_t v = 0;
            FERRY_TRY(c.read(&v, "bool value"));
            if (v > 1) {
                return Status::errorf("bool value %u at offset %zu is not 0 or 1", v, c.pos() - 1);
            }
            set_unsigned(out, v);
            return Status::ok();
        }
        case GgufValueType::STRING:
            return c.read_string(&out->s, "string value");
        case GgufValueType::ARRAY:
            break;
    }
    if (depth >= kMaxArrayDepth) {
        return Status::errorf("arrays nested more than %d deep (at offset %zu)", kMaxArrayDepth,
                              c.pos());
    }
    uint32_t et = 0;
    FERRY_TRY(c.read(&et, "array element type"));
    if (!valid_value_type(et)) {
        return Status::errorf("unknown array element type %u (at offset %zu)", et, c.pos() - 4);
    }
    const auto elem_type = static_cast<GgufValueType>(et);
    uint64_t n = 0;
    FERRY_TRY(c.read(&n, "array count"));
    const size_t min_size = min_value_size(elem_type);
    if (n > c.left() / min_size) {
        return Status::errorf("array count %" PRIu64
                              " of %s elements (at least %zu bytes each) exceeds the %zu bytes "
                              "left in the file (count at offset %zu): the count is corrupt or the "
                              "file is truncated",
                              n, value_type_name(et), min_size, c.left(), c.pos() - 8);
    }
    if (n > *budget) {
        return Status::errorf("array count %" PRIu64
                              " (at offset %zu) takes the metadata past %" PRIu64 " values",
                              n, c.pos() - 8, kMaxMetadataValues);
    }
    *budget -= n;
    out->elem_type = elem_type;
    out->arr.resize(static_cast<size_t>(n));
    for (uint64_t k = 0; k < n; k++) {
        Status st = read_value(c, elem_type, &out->arr[k], depth + 1, budget);
        if (!st) return st.context(strfmt("element %" PRIu64, k));
    }
    return Status::ok();
}

// Rules shared by the reader and the writer for one tensor's description. Fills info->ne
// (padded with 1s) and info->nbytes.
Status check_tensor_shape(const std::string& name, uint32_t type_id, int64_t n_dims,
                          const int64_t* ne, GgufTensorInfo* info) {
    if (name.empty()) return Status::error("empty tensor name");
    if (name.size() > kMaxTensorName) {
        return Status::errorf("name is %zu bytes long (at most %zu allowed)", name.size(),
                              kMaxTensorName);
    }
    if (n_dims < 0 || n_dims > kMaxDims) {
        return Status::errorf("n_dims %lld is out of range (at most %d)",
                              static_cast<long long>(n_dims), kMaxDims);
    }
    const TypeTraits* tr = type_traits_or_null(type_id);
    if (!tr) return Status::errorf("unknown type id %u", type_id);
    if (!tr->is_storage)
        return Status::errorf("type %s (id %u) is not a storage type", tr->name, type_id);
    info->name = name;
    info->type = static_cast<Type>(type_id);
    info->n_dims = static_cast<int>(n_dims);
    // The product of the non-zero dims must fit in int64, so that no partial product (rows,
    // planes) overflows anywhere, even for a tensor with a zero dim.
    int64_t prod = 1;
    for (int d = 0; d < kMaxDims; d++) {
        const int64_t v = d < n_dims ? ne[d] : 1;
        if (v < 0) {
            return Status::errorf("dimension %d is negative (%lld)", d, static_cast<long long>(v));
        }
        info->ne[d] = v;
        if (v == 0) continue;
        if (prod > std::numeric_limits<int64_t>::max() / v) {
            return Status::errorf("element count overflows (dimension %d is %lld)", d,
                                  static_cast<long long>(v));
        }
        prod *= v;
    }
    Expected<size_t> row = row_size_checked(info->type, info->ne[0]);
    if (!row) return row.status().context("dimension 0");
    const uint64_t rows = static_cast<uint64_t>(info->ne[1] * info->ne[2] * info->ne[3]);
    if (rows != 0 && *row > std::numeric_limits<size_t>::max() / rows) {
        return Status::error("byte size overflows");
    }
    info->nbytes = *row * static_cast<size_t>(rows);
    return Status::ok();
}

std::string shape_str(const GgufTensorInfo& t) {
    std::string s = "[";
    for (int d = 0; d < t.n_dims; d++) {
        if (d) s += ", ";
        s += strfmt("%lld", static_cast<long long>(t.ne[d]));
    }
    return s + "]";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reading

Expected<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::errorf("%s: cannot open: %s", path.c_str(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        return Status::errorf("%s: cannot stat: %s", path.c_str(), std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        return Status::errorf("%s: not a regular file", path.c_str());
    }
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = path;
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ > 0) {
        void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            return Status::errorf("%s: cannot map %zu bytes: %s", path.c_str(), f->size_,
                                  std::strerror(e));
        }
        f->map_ = m;
        f->base_ = static_cast<const uint8_t*>(m);
    }
    ::close(fd);  // the mapping keeps the file open
    Status s = f->parse();
    if (!s) return s.context(path);
    return f;
}

void GgufFile::release_pages(const uint8_t* p, size_t n) const {
    if (!map_ || p < base_ || n > size_ || p - base_ > static_cast<ptrdiff_t>(size_ - n)) return;
    // madvise works on whole pages: only those entirely inside the range.
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t start = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
    if (end > start) (void)::madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
}

Expected<std::unique_ptr<GgufFile>> GgufFile::from_memory(const void* data, size_t size,
                                                          const std::string& name) {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = name;
    if (size > 0) {
        f->owned_.assign(static_cast<const uint8_t*>(data),
                         static_cast<const uint8_t*>(data) + size);
    }
    f->base_ = f->owned_.data();
    f->size_ = size;
    Status s = f->parse();
    if (!s) return s.context(name);
    return f;
}

GgufFile::~GgufFile() {
    if (map_) ::munmap(map_, size_);
}

Status GgufFile::parse() {
    Cursor c(base_, size_);
    if (size_ < 4) {
        return Status::errorf("file is too small to be GGUF (%zu bytes; the header needs 24)",
                              size_);
    }
    if (std::memcmp(base_, kMagic, 4) != 0) {
        return Status::errorf("bad magic %02x %02x %02x %02x (expected \"GGUF\"): not a GGUF file",
                              base_[0], base_[1], base_[2], base_[3]);
    }
    uint32_t magic_skip = 0;
    FERRY_TRY(c.read(&magic_skip, "magic"));
    FERRY_TRY(c.read(&version_, "version"));
    if (version_ != 2 && version_ != 3) {
        if (version_ == 0x02000000u || version_ == 0x03000000u) {
            return Status::errorf("version: big-endian GGUF files are not supported");
        }
        return Status::errorf("version: unsupported GGUF version %u (expected 2 or 3)", version_);
    }
    uint64_t tensor_count = 0, kv_count = 0;
    FERRY_TRY(c.read(&tensor_count, "tensor_count"));
    FERRY_TRY(c.read(&kv_count, "kv_count"));
    // Counts are checked against the bytes that follow before anything is reserved for them.
    // (A count too large for the bytes left is either corrupt or the file was cut short.)
    if (kv_count > c.left() / kMinKvBytes) {
        return Status::errorf("kv_count %" PRIu64
                              " needs at least %zu bytes per kv but only %zu bytes follow the "
                              "header: the count is corrupt or the file is truncated",
                              kv_count, kMinKvBytes, c.left());
    }
    if (tensor_count > c.left() / kMinTensorInfoBytes) {
        return Status::errorf("tensor_count %" PRIu64
                              " needs at least %zu bytes per tensor info but only %zu bytes "
                              "follow the header: the count is corrupt or the file is truncated",
                              tensor_count, kMinTensorInfoBytes, c.left());
    }
    if (kv_count * kMinKvBytes + tensor_count * kMinTensorInfoBytes > c.left()) {
        return Status::errorf(
            "kv_count %" PRIu64 " and tensor_count %" PRIu64 " need at least %" PRIu64
            " bytes but only %zu bytes follow the header: a count is corrupt "
            "or the file is truncated",
            kv_count, tensor_count, kv_count * kMinKvBytes + tensor_count * kMinTensorInfoBytes,
            c.left());
    }

    // Metadata.
    kvs_.reserve(static_cast<size_t>(kv_count));
    std::unordered_set<std::string> keys;
    uint64_t budget = kMaxMetadataValues;
    for (uint64_t k = 0; k < kv_count; k++) {
        GgufKV kv;
        Status st = c.read_string(&kv.key, "key");
        if (!st) return st.context(strfmt("kv #%" PRIu64, k));
        const std::string where = strfmt("kv #%" PRIu64 " %s", k, quoted(kv.key).c_str());
        if (!keys.insert(kv.key).second) {
            return Status::errorf("%s: duplicate key", where.c_str());
        }
        uint32_t type = 0;
        st = c.read(&type, "value type");
        if (!st) return st.context(where);
        if (!valid_value_type(type)) {
            return Status::errorf("%s: unknown value type %u (at offset %zu)", where.c_str(), type,
                                  c.pos() - 4);
        }
        if (budget == 0) {
            return Status::errorf("%s: metadata holds more than %" PRIu64 " values", where.c_str(),
                                  kMaxMetadataValues);
        }
        budget--;
        st = read_value(c, static_cast<GgufValueType>(type), &kv.value, 0, &budget);
        if (!st) return st.context(where);
        kvs_.push_back(std::move(kv));
    }

    alignment_ = kDefaultAlignment;
    if (const GgufKV* a = find_kv("general.alignment")) {
        if (a->value.type != GgufValueType::UINT32) {
            return Status::errorf("kv 'general.alignment': type is %s, expected u32",
                                  value_type_name(static_cast<uint32_t>(a->value.type)));
        }
        if (a->value.u == 0 || !std::has_single_bit(a->value.u)) {
            return Status::errorf(
                "kv 'general.alignment': alignment %" PRIu64 " is not a power of two", a->value.u);
        }
        alignment_ = static_cast<size_t>(a->value.u);
    }

    // Tensor infos.
    tensors_.reserve(static_cast<size_t>(tensor_count));
    for (uint64_t k = 0; k < tensor_count; k++) {
        std::string name;
        Status st = c.read_string(&name, "name");
        if (!st) return st.context(strfmt("tensor #%" PRIu64, k));
        const std::string where = "tensor " + quoted(name);
        uint32_t n_dims = 0;
        st = c.read(&n_dims, "n_dims");
        if (!st) return st.context(where);
        if (n_dims > static_cast<uint32_t>(kMaxDims)) {
            return Status::errorf("%s: n_dims %u is out of range (at most %d)", where.c_str(),
                                  n_dims, kMaxDims);
        }
        int64_t ne[kMaxDims] = {1, 1, 1, 1};
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t v = 0;
            st = c.read(&v, "ne");
            if (!st) return st.context(where);
            if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                return Status::errorf("%s: dimension %u is negative (%lld)", where.c_str(), d,
                                      static_cast<long long>(static_cast<int64_t>(v)));
            }
            ne[d] = static_cast<int64_t>(v);
        }
        uint32_t type = 0;
        st = c.read(&type, "type");
        if (!st) return st.context(where);
        uint64_t offset = 0;
        st = c.read(&offset, "offset");
        if (!st) return st.context(where);

        GgufTensorInfo info;
        st = check_tensor_shape(name, type, n_dims, ne, &info);
        if (!st) return st.context(where);
        if (offset % alignment_ != 0) {
            return Status::errorf("%s: data offset %" PRIu64
                                  " is not a multiple of the alignment %zu",
                                  where.c_str(), offset, alignment_);
        }
        info.offset = offset;
        if (!tensor_index_.emplace(info.name, tensors_.size()).second) {
            return Status::errorf("%s: duplicate tensor name", where.c_str());
        }
        tensors_.push_back(std::move(info));
    }

    // Data section: starts at the first multiple of the alignment after the tensor infos.
    const size_t header_end = c.pos();
    data_offset_ = static_cast<size_t>(align_up(header_end, alignment_));
    if (tensors_.empty()) return Status::ok();
    if (data_offset_ > size_) {
        return Status::errorf(
            "data section starts at offset %zu (tensor infos end at %zu, "
            "alignment %zu), past the end of the file (size %zu)",
            data_offset_, header_end, alignment_, size_);
    }
    const uint64_t data_size = size_ - data_offset_;
    for (const GgufTensorInfo& t : tensors_) {
        if (t.offset > data_size || t.nbytes > data_size - t.offset) {
            return Status::errorf("tensor %s: data [offset %" PRIu64
                                  ", %zu bytes] extends past the end of the file (data section "
                                  "at %zu, file size %zu)",
                                  quoted(t.name).c_str(), t.offset, t.nbytes, data_offset_, size_);
        }
    }
    std::vector<const GgufTensorInfo*> by_offset;
    by_offset.reserve(tensors_.size());
    for (const GgufTensorInfo& t : tensors_) {
        if (t.nbytes > 0) by_offset.push_back(&t);
    }
    std::sort(
        by_offset.begin(), by_offset.end(),
        [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < by_offset.size(); k++) {
        const GgufTensorInfo* a = by_offset[k - 1];
        const GgufTensorInfo* b = by_offset[k];
        if (a->offset + a->nbytes > b->offset) {
            return Status::errorf("tensor %s: data [offset %" PRIu64
                                  ", %zu bytes] overlaps tensor %s [offset %" PRIu64 ", %zu bytes]",
                                  quoted(b->name).c_str(), b->offset, b->nbytes,
                                  quoted(a->name).c_str(), a->offset, a->nbytes);
        }
    }
    return Status::ok();
}

const GgufKV* GgufFile::find_kv(const std::string& key) const {
    for (const GgufKV& kv : kvs_) {
        if (kv.key == key) return &kv;
    }
    return nullptr;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status missing_key(const std::string& path, const std::string& key) {
    return Status::errorf("%s: metadata key '%s' is missing", path.c_str(), key.c_str());
}

Status wrong_type(const std::string& path, const std::string& key, GgufValueType got,
                  const char* want) {
    return Status::errorf("%s: metadata key '%s' has type %s, expected %s", path.c_str(),
                          key.c_str(), value_type_name(static_cast<uint32_t>(got)), want);
}

}  // namespace

Expected<std::string> GgufFile::get_string(const std::string& key) const {
    const GgufKV* kv = find_kv(key);
    if (!kv) return missing_key(path_, key);
    if (kv->value.type != GgufValueType::STRING) {
        return wrong_type(path_, key, kv->value.type, "string");
    }
    return kv->value.s;
}

Expected<int64_t> GgufFile::get_int(const std::string& key) const {
    const GgufKV* kv = find_kv(key);
    if (!kv) return missing_key(path_, key);
    const GgufValue& v = kv->value;
    if (!gguf_is_integer(v.type)) return wrong_type(path_, key, v.type, "an integer");
    if (is_signed_type(v.type)) return v.i;
    if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Status::errorf("%s: metadata key '%s': value %" PRIu64 " does not fit in int64",
                              path_.c_str(), key.c_str(), v.u);
    }
    return static_cast<int64_t>(v.u);
}

Expected<double> GgufFile::get_float(const std::string& key) const {
    const GgufKV* kv = find_kv(key);
    if (!kv) return missing_key(path_, key);
    if (kv->value.type != GgufValueType::FLOAT32 && kv->value.type != GgufValueType::FLOAT64) {
        return wrong_type(path_, key, kv->value.type, "f32 or f64");
    }
    return kv->value.f;
}

Expected<bool> GgufFile::get_bool(const std::string& key) const {
    const GgufKV* kv = find_kv(key);
    if (!kv) return missing_key(path_, key);
    if (kv->value.type != GgufValueType::BOOL)
        return wrong_type(path_, key, kv->value.type, "bool");
    return kv->value.u != 0;
}

Expected<const GgufValue*> GgufFile::get_array(const std::string& key) const {
    const GgufKV* kv = find_kv(key);
    if (!kv) return missing_key(path_, key);
    if (kv->value.type != GgufValueType::ARRAY) {
        return wrong_type(path_, key, kv->value.type, "array");
    }
    return &kv->value;
}

// ---------------------------------------------------------------------------------------------
// Writing

void GgufWriter::apply_alignment(size_t a) {
    FERRY_ASSERT(a > 0 && std::has_single_bit(a) && a <= std::numeric_limits<uint32_t>::max());
    if (a == alignment_) return;
    alignment_ = a;
    if (tensors_.empty()) return;
    // Offsets chosen for the old alignment may be misaligned now: re-place every tensor, packed
    // in insertion order. A preserved layout (explicit offsets, data size) no longer applies.
    std::vector<T> old = std::move(tensors_);
    tensors_.clear();
    tensor_index_.clear();
    ranges_.clear();
    data_end_ = 0;
    any_explicit_ = false;
    has_data_size_ = false;
    for (T& t : old) {
        Status st = place(std::move(t), false);
        FERRY_ASSERT(st.is_ok());
    }
}

void GgufWriter::set_alignment(size_t a) {
    FERRY_ASSERT(a > 0 && std::has_single_bit(a) && a <= std::numeric_limits<uint32_t>::max());
    bool have_kv = false;
    for (const GgufKV& kv : kvs_) have_kv |= kv.key == "general.alignment";
    if (have_kv || a != kDefaultAlignment) add_u32("general.alignment", static_cast<uint32_t>(a));
    apply_alignment(a);
}

void GgufWriter::add_kv(const std::string& key, GgufValue v) {
    if (key == "general.alignment") {
        // A file's alignment is this kv; keep the layout in step with it.
        FERRY_ASSERT(v.type == GgufValueType::UINT32);
        apply_alignment(static_cast<size_t>(v.u));
    }
    for (GgufKV& kv : kvs_) {
        if (kv.key == key) {
            kv.value = std::move(v);
            return;
        }
    }
    kvs_.push_back(GgufKV{key, std::move(v)});
}

void GgufWriter::add_string(const std::string& key, const std::string& v) {
    GgufValue x;
    x.type = GgufValueType::STRING;
    x.s = v;
    add_kv(key, std::move(x));
}

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
    GgufValue x;
    x.type = GgufValueType::UINT32;
    set_unsigned(&x, v);
    add_kv(key, std::move(x));
}

void GgufWriter::add_i32(const std::string& key, int32_t v) {
    GgufValue x;
    x.type = GgufValueType::INT32;
    set_signed(&x, v);
    add_kv(key, std::move(x));
}

void GgufWriter::add_f32(const std::string& key, float v) {
    GgufValue x;
    x.type = GgufValueType::FLOAT32;
    x.f = v;
    add_kv(key, std::move(x));
}

void GgufWriter::add_bool(const std::string& key, bool v) {
    GgufValue x;
    x.type = GgufValueType::BOOL;
    set_unsigned(&x, v ? 1 : 0);
    add_kv(key, std::move(x));
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
    GgufValue x;
    x.type = GgufValueType::ARRAY;
    x.elem_type = GgufValueType::STRING;
    x.arr.resize(v.size());
    for (size_t k = 0; k < v.size(); k++) {
        x.arr[k].type = GgufValueType::STRING;
        x.arr[k].s = v[k];
    }
    add_kv(key, std::move(x));
}

void GgufWriter::add_f32_array(const std::string& key, const std::vector<float>& v) {
    GgufValue x;
    x.type = GgufValueType::ARRAY;
    x.elem_type = GgufValueType::FLOAT32;
    x.arr.resize(v.size());
    for (size_t k = 0; k < v.size(); k++) {
        x.arr[k].type = GgufValueType::FLOAT32;
        x.arr[k].f = v[k];
    }
    add_kv(key, std::move(x));
}

void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
    GgufValue x;
    x.type = GgufValueType::ARRAY;
    x.elem_type = GgufValueType::INT32;
    x.arr.resize(v.size());
    for (size_t k = 0; k < v.size(); k++) {
        x.arr[k].type = GgufValueType::INT32;
        set_signed(&x.arr[k], v[k]);
    }
    add_kv(key, std::move(x));
}

Status GgufWriter::check_tensor(const std::string& name, Type type, int n_dims, const int64_t* ne,
                                size_t nbytes, GgufTensorInfo* info) const {
    const std::string where = "tensor " + quoted(name);
    if (n_dims > 0 && ne == nullptr)
        return Status::errorf("%s: no dimensions given", where.c_str());
    Status st = check_tensor_shape(name, static_cast<uint32_t>(type), n_dims, ne, info);
    if (!st) return st.context(where);
    if (tensor_index_.count(name))
        return Status::errorf("%s: duplicate tensor name", where.c_str());
    if (nbytes != info->nbytes) {
        return Status::errorf("%s: %zu bytes of data given, but a %s %s tensor has %zu",
                              where.c_str(), nbytes, type_name(type), shape_str(*info).c_str(),
                              info->nbytes);
    }
    return Status::ok();
}

Status GgufWriter::place(T&& t, bool explicit_offset) {
    GgufTensorInfo& info = t.info;
    if (!explicit_offset) info.offset = align_up(data_end_, alignment_);
    const uint64_t end = info.offset + info.nbytes;
    if (explicit_offset) {
        const std::string where = "tensor " + quoted(info.name);
        if (info.offset % alignment_ != 0) {
            return Status::errorf("%s: data offset %" PRIu64
                                  " is not a multiple of the alignment %zu",
                                  where.c_str(), info.offset, alignment_);
        }
        if (end < info.offset) {
            return Status::errorf("%s: data offset %" PRIu64 " overflows", where.c_str(),
                                  info.offset);
        }
        if (info.nbytes > 0) {
            auto next = ranges_.upper_bound(info.offset);
            if (next != ranges_.end() && next->first < end) {
                return Status::errorf("%s: data [offset %" PRIu64
                                      ", %zu bytes] overlaps data at offset %" PRIu64,
                                      where.c_str(), info.offset, info.nbytes, next->first);
            }
            if (next != ranges_.begin() && std::prev(next)->second > info.offset) {
                return Status::errorf(
                    "%s: data [offset %" PRIu64 ", %zu bytes] overlaps data at offset %" PRIu64,
                    where.c_str(), info.offset, info.nbytes, std::prev(next)->first);
            }
        }
        any_explicit_ = true;
    }
    if (info.nbytes > 0) ranges_[info.offset] = end;
    data_end_ = std::max(data_end_, end);
    tensor_index_[info.name] = tensors_.size();
    tensors_.push_back(std::move(t));
    return Status::ok();
}

Status GgufWriter::add_tensor(const std::string& name, Type type, int n_dims, const int64_t* ne,
                              const void* data, size_t nbytes) {
    T t;
    FERRY_TRY(check_tensor(name, type, n_dims, ne, nbytes, &t.info));
    if (nbytes > 0) {
        const auto* p = static_cast<const uint8_t*>(data);
        t.data.assign(p, p + nbytes);
    }
    return place(std::move(t), false);
}

Status GgufWriter::add_tensor_at(const std::string& name, Type type, int n_dims, const int64_t* ne,
                                 const void* data, size_t nbytes, uint64_t offset) {
    T t;
    FERRY_TRY(check_tensor(name, type, n_dims, ne, nbytes, &t.info));
    t.info.offset = offset;
    if (nbytes > 0) {
        const auto* p = static_cast<const uint8_t*>(data);
        t.data.assign(p, p + nbytes);
    }
    return place(std::move(t), true);
}

uint64_t GgufWriter::data_size() const {
    if (has_data_size_) return std::max(data_size_, data_end_);
    return align_up(data_end_, alignment_);
}

namespace {

struct VectorSink {
    std::vector<uint8_t>* out;
    void put(const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        out->insert(out->end(), b, b + n);
    }
    void zeros(uint64_t n) { out->resize(out->size() + static_cast<size_t>(n), 0); }
};

struct FileSink {
    std::FILE* f;
    bool ok = true;
    void put(const void* p, size_t n) {
        if (ok && n > 0 && std::fwrite(p, 1, n, f) != n) ok = false;
    }
    void zeros(uint64_t n) {
        static const uint8_t z[4096] = {};
        while (n > 0) {
            const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof(z)));
            put(z, k);
            n -= k;
        }
    }
};

template <class Sink>
struct CountingSink {
    Sink* sink;
    uint64_t count = 0;
    void put(const void* p, size_t n) {
        sink->put(p, n);
        count += n;
    }
};

template <class Sink, class V>
void put_pod(Sink& s, V v) {
    s.put(&v, sizeof(v));
}

template <class Sink>
void put_string(Sink& s, const std::string& str) {
    put_pod(s, static_cast<uint64_t>(str.size()));
    s.put(str.data(), str.size());
}

template <class Sink>
void put_value(Sink& s, GgufValueType type, const GgufValue& v) {
    switch (type) {
        case GgufValueType::UINT8:
            put_pod(s, static_cast<uint8_t>(v.u));
            break;
        case GgufValueType::INT8:
            put_pod(s, static_cast<int8_t>(v.i));
            break;
        case GgufValueType::UINT16:
            put_pod(s, static_cast<uint16_t>(v.u));
            break;
        case GgufValueType::INT16:
            put_pod(s, static_cast<int16_t>(v.i));
            break;
        case GgufValueType::UINT32:
            put_pod(s, static_cast<uint32_t>(v.u));
            break;
        case GgufValueType::INT32:
            put_pod(s, static_cast<int32_t>(v.i));
            break;
        case GgufValueType::UINT64:
            put_pod(s, static_cast<uint64_t>(v.u));
            break;
        case GgufValueType::INT64:
            put_pod(s, static_cast<int64_t>(v.i));
            break;
        case GgufValueType::FLOAT32:
            put_pod(s, static_cast<float>(v.f));
            break;
        case GgufValueType::FLOAT64:
            put_pod(s, static_cast<double>(v.f));
            break;
        case GgufValueType::BOOL:
            put_pod(s, static_cast<uint8_t>(v.u != 0 ? 1 : 0));
            break;
        case GgufValueType::STRING:
            put_string(s, v.s);
            break;
        case GgufValueType::ARRAY:
            put_pod(s, static_cast<uint32_t>(v.elem_type));
            put_pod(s, static_cast<uint64_t>(v.arr.size()));
            for (const GgufValue& e : v.arr) put_value(s, v.elem_type, e);
            break;
    }
}

}  // namespace

template <class Sink>
void GgufWriter::serialize(Sink& sink) const {
    // Counts the header bytes, to know how much padding precedes the data section.
    CountingSink<Sink> counting{&sink};
    counting.put(kMagic, 4);
    put_pod(counting, kWriteVersion);
    put_pod(counting, static_cast<uint64_t>(tensors_.size()));
    put_pod(counting, static_cast<uint64_t>(kvs_.size()));
    for (const GgufKV& kv : kvs_) {
        put_string(counting, kv.key);
        put_pod(counting, static_cast<uint32_t>(kv.value.type));
        put_value(counting, kv.value.type, kv.value);
    }
    for (const T& t : tensors_) {
        put_string(counting, t.info.name);
        put_pod(counting, static_cast<uint32_t>(t.info.n_dims));
        for (int d = 0; d < t.info.n_dims; d++)
            put_pod(counting, static_cast<uint64_t>(t.info.ne[d]));
        put_pod(counting, static_cast<uint32_t>(t.info.type));
        put_pod(counting, t.info.offset);
    }
    const uint64_t header_end = counting.count;
    sink.zeros(align_up(header_end, alignment_) - header_end);

    // Data in offset order, gaps zero-filled.
    std::vector<const T*> order;
    order.reserve(tensors_.size());
    for (const T& t : tensors_) {
        if (t.info.nbytes > 0) order.push_back(&t);
    }
    std::sort(order.begin(), order.end(),
              [](const T* a, const T* b) { return a->info.offset < b->info.offset; });
    uint64_t at = 0;
    for (const T* t : order) {
        FERRY_ASSERT(t->info.offset >= at);
        sink.zeros(t->info.offset - at);
        sink.put(t->data.data(), t->data.size());
        at = t->info.offset + t->data.size();
    }
    sink.zeros(data_size() - at);
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
    std::vector<uint8_t> out;
    VectorSink sink{&out};
    serialize(sink);
    return out;
}

Status GgufWriter::write(const std::string& path) const {
    // Write beside the target and rename over it: readers never see a half-written file, and a
    // target that is also the (mapped) source stays intact until the new file is complete.
    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) return Status::errorf("%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
    FileSink sink{f};
    serialize(sink);
    int err = sink.ok ? 0 : errno;
    if (std::fflush(f) != 0 && err == 0) err = errno;
    if (err == 0 && ::fsync(fileno(f)) != 0) err = errno;
    if (std::fclose(f) != 0 && err == 0) err = errno;
    if (!sink.ok && err == 0) err = EIO;
    if (err != 0) {
        std::remove(tmp.c_str());
        return Status::errorf("%s: write failed: %s", tmp.c_str(), std::strerror(err));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        err = errno;
        std::remove(tmp.c_str());
        return Status::errorf("%s: cannot rename to %s: %s", tmp.c_str(), path.c_str(),
                              std::strerror(err));
    }
    return Status::ok();
}

GgufWriter gguf_writer_from(const GgufFile& f) {
    GgufWriter w;
    // Metadata first: a general.alignment kv sets the writer's alignment before any tensor.
    for (const GgufKV& kv : f.kvs()) w.add_kv(kv.key, kv.value);
    FERRY_ASSERT(w.alignment() == f.alignment());
    for (const GgufTensorInfo& t : f.tensors()) {
        // The file passed the same checks when it was read, so this cannot fail.
        Status st =
            w.add_tensor_at(t.name, t.type, t.n_dims, t.ne, f.tensor_data(t), t.nbytes, t.offset);
        FERRY_ASSERT(st.is_ok());
    }
    w.set_data_size(f.file_size() > f.data_offset() ? f.file_size() - f.data_offset() : 0);
    return w;
}

}  // namespace ferry
