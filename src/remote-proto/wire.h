// Wire encoding for the remote protocol: a little-endian writer and a bounds-checked reader.
//
// The reader never reads past its input: every get fails (and latches the failure) on
// truncation, so a decoder can read a whole request and check ok() once. Lengths that come
// from outside are checked with overflow-checked arithmetic before they size anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::wire {

// Overflow-checked size arithmetic.
inline bool add_ok(uint64_t a, uint64_t b, uint64_t* out) {
    return !__builtin_add_overflow(a, b, out);
}
inline bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) {
    return !__builtin_mul_overflow(a, b, out);
}
// True when [off, off + size) lies within [0, limit).
inline bool range_ok(uint64_t off, uint64_t size, uint64_t limit) {
    uint64_t end = 0;
    return add_ok(off, size, &end) && end <= limit;
}

// 64-bit FNV-1a over bytes followed by a final avalanche (xorshift-multiply): the graph-table
// hash both sides compute. Not cryptographic: the server compares bytes as well.
uint64_t hash64(const void* data, size_t n);

class Writer {
  public:
    Writer() = default;
    explicit Writer(std::vector<uint8_t>* out) : ext_(out) {}

    void u8(uint8_t v) { put(&v, 1); }
    void u16(uint16_t v) { le(v, 2); }
    void u32(uint32_t v) { le(v, 4); }
    void u64(uint64_t v) { le(v, 8); }
    void i32(int32_t v) { le(static_cast<uint32_t>(v), 4); }
    void i64(int64_t v) { le(static_cast<uint64_t>(v), 8); }
    void bytes(const void* p, size_t n) { put(p, n); }
    // u32 length + bytes.
    void str(std::string_view s) {
        u32(static_cast<uint32_t>(s.size()));
        put(s.data(), s.size());
    }
    // Reserves n bytes and returns where they start (valid until the next write).
    uint8_t* reserve(size_t n) {
        std::vector<uint8_t>& b = buf();
        const size_t at = b.size();
        b.resize(at + n);
        return b.data() + at;
    }
    // Overwrites a u64 previously written at byte position `at`.
    void patch_u64(size_t at, uint64_t v) {
        for (int i = 0; i < 8; i++) buf()[at + i] = static_cast<uint8_t>(v >> (8 * i));
    }

    size_t size() const { return ext_ ? ext_->size() : own_.size(); }
    const uint8_t* data() const { return ext_ ? ext_->data() : own_.data(); }
    std::vector<uint8_t>& buf() { return ext_ ? *ext_ : own_; }
    void clear() { buf().clear(); }

  private:
    void put(const void* p, size_t n) {
        if (n == 0) return;
        std::vector<uint8_t>& b = buf();
        const size_t at = b.size();
        b.resize(at + n);
        std::memcpy(b.data() + at, p, n);
    }
    void le(uint64_t v, int n) {
        uint8_t tmp[8];
        for (int i = 0; i < n; i++) tmp[i] = static_cast<uint8_t>(v >> (8 * i));
        put(tmp, static_cast<size_t>(n));
    }
    std::vector<uint8_t> own_;
    std::vector<uint8_t>* ext_ = nullptr;
};

class Reader {
  public:
    Reader(const void* data, size_t size) : p_(static_cast<const uint8_t*>(data)), size_(size) {}

    bool ok() const { return ok_; }
    size_t remaining() const { return ok_ ? size_ - pos_ : 0; }
    size_t pos() const { return pos_; }
    // Fails the reader (e.g. a decoder that found a bad value); keeps the first reason.
    void fail(const char* why) {
        if (ok_) why_ = why;
        ok_ = false;
    }
    const char* why() const { return why_; }

    uint8_t u8() { return static_cast<uint8_t>(le(1)); }
    uint16_t u16() { return static_cast<uint16_t>(le(2)); }
    uint32_t u32() { return static_cast<uint32_t>(le(4)); }
    uint64_t u64() { return le(8); }
    int32_t i32() { return static_cast<int32_t>(static_cast<uint32_t>(le(4))); }
    int64_t i64() { return static_cast<int64_t>(le(8)); }
    // Returns a pointer to n bytes inside the input, or nullptr (and fails) on truncation.
    const uint8_t* bytes(uint64_t n) {
        if (!ok_ || n > size_ - pos_) {
            fail("truncated");
            return nullptr;
        }
        const uint8_t* at = p_ + pos_;
        pos_ += static_cast<size_t>(n);
        return at;
    }
    // u32 length + bytes; fails when longer than max_len or truncated.
    std::string str(size_t max_len = 4096) {
        const uint32_t n = u32();
        if (n > max_len) {
            fail("string too long");
            return {};
        }
        const uint8_t* b = bytes(n);
        return b ? std::string(reinterpret_cast<const char*>(b), n) : std::string();
    }
    // True when everything was consumed without a failure.
    bool done() const { return ok_ && pos_ == size_; }

  private:
    uint64_t le(int n) {
        if (!ok_ || static_cast<size_t>(n) > size_ - pos_) {
            fail("truncated");
            return 0;
        }
        uint64_t v = 0;
        for (int i = 0; i < n; i++) v |= static_cast<uint64_t>(p_[pos_ + i]) << (8 * i);
        pos_ += static_cast<size_t>(n);
        return v;
    }
    const uint8_t* p_;
    size_t size_;
    size_t pos_ = 0;
    bool ok_ = true;
    const char* why_ = "";
};

}  // namespace ferry::wire
