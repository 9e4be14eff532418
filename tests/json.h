// A small JSON reader and writer (RFC 8259).
//
// Values are plain trees: objects keep their members in file order (a vector of pairs) and
// look keys up by linear search, which is what configuration, tokenizer and test-oracle files
// need. Numbers are doubles, converted exactly (correctly rounded) from their decimal text.
// Strings are UTF-8; \uXXXX escapes (with surrogate pairs) are decoded, and invalid UTF-8, lone
// surrogates, unescaped control characters and duplicate object keys are errors.
//
// Parse errors name the line and column (1-based; columns count bytes) of the offending byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ferry/status.h"

namespace ferry::json {

enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };

// "null", "bool", "number", "string", "array", "object".
const char* kind_name(Kind k);

struct Value {
    using Member = std::pair<std::string, Value>;

    Kind kind = Kind::Null;
    bool boolean = false;
    double number = 0.0;
    std::string string;
    std::vector<Value> array;    // elements, when kind == Array
    std::vector<Member> object;  // members in order, when kind == Object

    Value() = default;
    Value(std::nullptr_t) {}                         // NOLINT: implicit by design
    Value(bool b) : kind(Kind::Bool), boolean(b) {}  // NOLINT
    template <class T,
              std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, int> = 0>
    Value(T v) : kind(Kind::Number), number(static_cast<double>(v)) {}  // NOLINT
    Value(const char* s) : kind(Kind::String), string(s) {}             // NOLINT
    Value(std::string s) : kind(Kind::String), string(std::move(s)) {}  // NOLINT
    Value(std::string_view s) : kind(Kind::String), string(s) {}        // NOLINT
    static Value make_array() {
        Value v;
        v.kind = Kind::Array;
        return v;
    }
    static Value make_object() {
        Value v;
        v.kind = Kind::Object;
        return v;
    }

    bool is_null() const { return kind == Kind::Null; }
    bool is_bool() const { return kind == Kind::Bool; }
    bool is_number() const { return kind == Kind::Number; }
    bool is_string() const { return kind == Kind::String; }
    bool is_array() const { return kind == Kind::Array; }
    bool is_object() const { return kind == Kind::Object; }
    // A number with no fractional part that fits in int64.
    bool is_integer() const;

    // Lenient accessors: a value of another kind yields false / 0 / "" / an empty list, so
    // lookups can be chained (v["a"]["b"].at(3).as_number()); use is_* or find() where a
    // missing value must be told apart from a default one.
    bool as_bool() const { return kind == Kind::Bool && boolean; }
    double as_number() const { return kind == Kind::Number ? number : 0.0; }
    // The number truncated toward zero and clamped to the int64 range (0 for NaN / non-numbers).
    int64_t as_int() const;
    const std::string& as_string() const;
    const std::vector<Value>& as_array() const;
    const std::vector<Member>& as_object() const;

    // Elements of an array or members of an object; 0 for other kinds.
    size_t size() const;
    // Array element i, or a null value when out of range or not an array.
    const Value& at(size_t i) const;
    // Object member `key` (first match), or a null value when missing or not an object.
    const Value& operator[](std::string_view key) const;
    // Object member `key`, or nullptr when missing or not an object.
    const Value* find(std::string_view key) const;
    bool contains(std::string_view key) const { return find(key) != nullptr; }

    // Builders. push_back turns a null value into an array; set turns a null value into an
    // object and replaces an existing member of the same key. Both return the stored value.
    Value& push_back(Value v);
    Value& set(std::string_view key, Value v);

    // Structural equality (numbers compare with ==; object member order matters).
    bool operator==(const Value& o) const;
};

// Parses one JSON document (surrounding whitespace allowed; a leading UTF-8 BOM is skipped).
Expected<Value> parse(std::string_view text);
// Reads and parses a file; errors are prefixed with the path.
Expected<Value> parse_file(const std::string& path);

// Serializes a value. indent < 0: compact; otherwise pretty-printed with `indent` spaces per
// level. Numbers use %.17g (round-trip exact); NaN and infinities, which JSON cannot express,
// are written as null. Strings are escaped minimally (", \, control characters); other UTF-8
// passes through unchanged.
std::string dump(const Value& v, int indent = -1);

}  // namespace ferry::json
