#include "json.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_set>

namespace ferry::json {

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::Null:
            return "null";
        case Kind::Bool:
            return "bool";
        case Kind::Number:
            return "number";
        case Kind::String:
            return "string";
        case Kind::Array:
            return "array";
        case Kind::Object:
            return "object";
    }
    return "?";
}

namespace {

const Value& null_value() {
    static const Value v;
    return v;
}

}  // namespace

bool Value::is_integer() const {
    if (kind != Kind::Number || !std::isfinite(number)) return false;
    if (std::trunc(number) != number) return false;
    // 2^63 is exactly representable; anything >= it does not fit.
    return number >= -9223372036854775808.0 && number < 9223372036854775808.0;
}

int64_t Value::as_int() const {
    if (kind != Kind::Number || std::isnan(number)) return 0;
    if (number >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
    if (number < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(number);
}

const std::string& Value::as_string() const {
    static const std::string empty;
    return kind == Kind::String ? string : empty;
}

const std::vector<Value>& Value::as_array() const {
    static const std::vector<Value> empty;
    return kind == Kind::Array ? array : empty;
}

const std::vector<Value::Member>& Value::as_object() const {
    static const std::vector<Member> empty;
    return kind == Kind::Object ? object : empty;
}

size_t Value::size() const {
    if (kind == Kind::Array) return array.size();
    if (kind == Kind::Object) return object.size();
    return 0;
}

const Value& Value::at(size_t i) const {
    if (kind != Kind::Array || i >= array.size()) return null_value();
    return array[i];
}

const Value* Value::find(std::string_view key) const {
    if (kind != Kind::Object) return nullptr;
    for (const Member& m : object) {
        if (m.first == key) return &m.second;
    }
    return nullptr;
}

const Value& Value::operator[](std::string_view key) const {
    const Value* v = find(key);
    return v ? *v : null_value();
}

Value& Value::push_back(Value v) {
    if (kind == Kind::Null) kind = Kind::Array;
    FERRY_ASSERT(kind == Kind::Array);
    array.push_back(std::move(v));
    return array.back();
}

Value& Value::set(std::string_view key, Value v) {
    if (kind == Kind::Null) kind = Kind::Object;
    FERRY_ASSERT(kind == Kind::Object);
    for (Member& m : object) {
        if (m.first == key) {
            m.second = std::move(v);
            return m.second;
        }
    }
    object.emplace_back(std::string(key), std::move(v));
    return object.back().second;
}

bool Value::operator==(const Value& o) const {
    if (kind != o.kind) return false;
    switch (kind) {
        case Kind::Null:
            return true;
        case Kind::Bool:
            return boolean == o.boolean;
        case Kind::Number:
            return number == o.number;
        case Kind::String:
            return string == o.string;
        case Kind::Array:
            return array == o.array;
        case Kind::Object:
            return object == o.object;
    }
    return false;
}

// ---------------------------------------------------------------------------------------------
// Parser: recursive descent over the bytes, with a depth limit so hostile input cannot exhaust
// the stack.

namespace {

constexpr int kMaxDepth = 512;

class Parser {
  public:
    explicit Parser(std::string_view text) : s_(text) {}

    Expected<Value> run() {
        if (s_.size() >= 3 && static_cast<uint8_t>(s_[0]) == 0xEF &&
            static_cast<uint8_t>(s_[1]) == 0xBB && static_cast<uint8_t>(s_[2]) == 0xBF) {
            pos_ = 3;
        }
        Value v;
        skip_ws();
        if (!parse_value(v, 0)) return err_;
        skip_ws();
        if (pos_ != s_.size()) {
            fail("unexpected %s after the end of the document", describe_here().c_str());
            return err_;
        }
        return v;
    }

  private:
    std::string_view s_;
    size_t pos_ = 0;
    Status err_;

    bool at_end() const { return pos_ >= s_.size(); }
    char peek() const { return s_[pos_]; }

    // Line and column (1-based) of byte offset `at`.
    void locate(size_t at, size_t* line, size_t* col) const {
        size_t l = 1, line_start = 0;
        for (size_t i = 0; i < at && i < s_.size(); i++) {
            if (s_[i] == '\n') {
                l++;
                line_start = i + 1;
            }
        }
        *line = l;
        *col = at - line_start + 1;
    }

    bool fail_v(size_t at, const char* fmt, va_list ap) {
        const std::string msg = vstrfmt(fmt, ap);
        size_t line, col;
        locate(at, &line, &col);
        err_ = Status::errorf("line %zu, column %zu: %s", line, col, msg.c_str());
        return false;
    }
    __attribute__((format(printf, 3, 4))) bool fail_at(size_t at, const char* fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        fail_v(at, fmt, ap);
        va_end(ap);
        return false;
    }
    __attribute__((format(printf, 2, 3))) bool fail(const char* fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        fail_v(pos_, fmt, ap);
        va_end(ap);
        return false;
    }

    std::string describe_here() const {
        if (at_end()) return "end of input";
        const uint8_t c = static_cast<uint8_t>(peek());
        if (c >= 0x20 && c < 0x7f) return strfmt("character '%c'", c);
        return strfmt("byte 0x%02x", c);
    }

    void skip_ws() {
        while (!at_end()) {
            const char c = peek();
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
            pos_++;
        }
    }

    bool literal(const char* word) {
        const size_t n = std::strlen(word);
        if (s_.substr(pos_, n) != word) {
            return fail("invalid literal (expected '%s')", word);
        }
        pos_ += n;
        return true;
    }

    bool parse_value(Value& out, int depth) {
        if (at_end()) return fail("unexpected end of input (expected a value)");
        switch (peek()) {
            case '{':
                return parse_object(out, depth);
            case '[':
                return parse_array(out, depth);
            case '"':
                out.kind = Kind::String;
                return parse_string(out.string);
            case 't':
                out = Value(true);
                return literal("true");
            case 'f':
                out = Value(false);
                return literal("false");
            case 'n':
                out = Value();
                return literal("null");
            default:
                if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number(out);
                return fail("unexpected %s (expected a value)", describe_here().c_str());
        }
    }

    bool parse_object(Value& out, int depth) {
        if (depth >= kMaxDepth) return fail("nesting deeper than %d levels", kMaxDepth);
        out = Value::make_object();
        pos_++;  // '{'
        skip_ws();
        if (!at_end() && peek() == '}') {
            pos_++;
            return true;
        }
        std::unordered_set<std::string> seen;
        for (;;) {
            skip_ws();
            if (at_end() || peek() != '"') {
                return fail("unexpected %s (expected a string key)", describe_here().c_str());
            }
            const size_t key_pos = pos_;
            std::string key;
            if (!parse_string(key)) return false;
            if (!seen.insert(key).second) {
                return fail_at(key_pos, "duplicate object key \"%s\"", key.c_str());
            }
            skip_ws();
            if (at_end() || peek() != ':') {
                return fail("unexpected %s (expected ':')", describe_here().c_str());
            }
            pos_++;
            skip_ws();
            Value v;
            if (!parse_value(v, depth + 1)) return false;
            out.object.emplace_back(std::move(key), std::move(v));
            skip_ws();
            if (at_end()) return fail("unexpected end of input (expected ',' or '}')");
            if (peek() == ',') {
                pos_++;
                continue;
            }
            if (peek() == '}') {
                pos_++;
                return true;
            }
            return fail("unexpected %s (expected ',' or '}')", describe_here().c_str());
        }
    }

    bool parse_array(Value& out, int depth) {
        if (depth >= kMaxDepth) return fail("nesting deeper than %d levels", kMaxDepth);
        out = Value::make_array();
        pos_++;  // '['
        skip_ws();
        if (!at_end() && peek() == ']') {
            pos_++;
            return true;
        }
        for (;;) {
            skip_ws();
            Value v;
            if (!parse_value(v, depth + 1)) return false;
            out.array.push_back(std::move(v));
            skip_ws();
            if (at_end()) return fail("unexpected end of input (expected ',' or ']')");
            if (peek() == ',') {
                pos_++;
                continue;
            }
            if (peek() == ']') {
                pos_++;
                return true;
            }
            return fail("unexpected %s (expected ',' or ']')", describe_here().c_str());
        }
    }

    static bool is_digit(char c) { return c >= '0' && c <= '9'; }

    bool parse_number(Value& out) {
        // Validate the RFC 8259 grammar first: from_chars alone would accept forms JSON does
        // not (leading '+', "inf", hex) and reject none of "01" or "1.".
        const size_t start = pos_;
        size_t p = pos_;
        if (p < s_.size() && s_[p] == '-') p++;
        if (p >= s_.size() || !is_digit(s_[p])) {
            return fail_at(p, "invalid number (expected a digit)");
        }
        if (s_[p] == '0') {
            p++;
            if (p < s_.size() && is_digit(s_[p])) {
                return fail_at(p, "invalid number (leading zeros are not allowed)");
            }
        } else {
            while (p < s_.size() && is_digit(s_[p])) p++;
        }
        if (p < s_.size() && s_[p] == '.') {
            p++;
            if (p >= s_.size() || !is_digit(s_[p])) {
                return fail_at(p, "invalid number (expected a digit after '.')");
            }
            while (p < s_.size() && is_digit(s_[p])) p++;
        }
        if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
            p++;
            if (p < s_.size() && (s_[p] == '+' || s_[p] == '-')) p++;
            if (p >= s_.size() || !is_digit(s_[p])) {
                return fail_at(p, "invalid number (expected a digit in the exponent)");
            }
            while (p < s_.size() && is_digit(s_[p])) p++;
        }
        const char* first = s_.data() + start;
        const char* last = s_.data() + p;
        double d = 0.0;
        // from_chars is correctly rounded and locale-independent (strtod depends on LC_NUMERIC).
        auto r = std::from_chars(first, last, d);
        if (r.ec == std::errc::result_out_of_range) {
            // Overflow is an error (JSON has no infinity); underflow is not: let strtod give the
            // nearest subnormal or zero.
            std::string tmp(first, last);
            errno = 0;
            d = std::strtod(tmp.c_str(), nullptr);
            if (std::isinf(d)) {
                return fail_at(start, "number %s is out of range for a double", tmp.c_str());
            }
        } else if (r.ec != std::errc() || r.ptr != last) {
            return fail_at(start, "invalid number");
        }
        out = Value(d);
        pos_ = p;
        return true;
    }

    bool hex4(uint32_t* out) {
        if (s_.size() - pos_ < 4) {
            return fail("unexpected end of input in a \\u escape (expected 4 hex digits)");
        }
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) {
            const char c = s_[pos_];
            uint32_t d;
            if (c >= '0' && c <= '9') {
                d = static_cast<uint32_t>(c - '0');
            } else if (c >= 'a' && c <= 'f') {
                d = static_cast<uint32_t>(c - 'a' + 10);
            } else if (c >= 'A' && c <= 'F') {
                d = static_cast<uint32_t>(c - 'A' + 10);
            } else {
                return fail("invalid hex digit %s in a \\u escape", describe_here().c_str());
            }
            v = v * 16 + d;
            pos_++;
        }
        *out = v;
        return true;
    }

    static void append_utf8(std::string& s, uint32_t cp) {
        if (cp < 0x80) {
            s += static_cast<char>(cp);
        } else if (cp < 0x800) {
            s += static_cast<char>(0xC0 | (cp >> 6));
            s += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            s += static_cast<char>(0xE0 | (cp >> 12));
            s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            s += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            s += static_cast<char>(0xF0 | (cp >> 18));
            s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            s += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    // Length of the well-formed UTF-8 sequence at pos_ (Unicode table 3-7), 0 if ill-formed.
    size_t utf8_len() const {
        const size_t left = s_.size() - pos_;
        const auto b = [&](size_t i) { return static_cast<uint8_t>(s_[pos_ + i]); };
        const uint8_t c = b(0);
        const auto cont = [&](size_t i, uint8_t lo, uint8_t hi) {
            return i < left && b(i) >= lo && b(i) <= hi;
        };
        if (c < 0x80) return 1;
        if (c >= 0xC2 && c <= 0xDF) return cont(1, 0x80, 0xBF) ? 2 : 0;
        if (c == 0xE0) return cont(1, 0xA0, 0xBF) && cont(2, 0x80, 0xBF) ? 3 : 0;
        if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
            return cont(1, 0x80, 0xBF) && cont(2, 0x80, 0xBF) ? 3 : 0;
        }
        if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2, 0x80, 0xBF) ? 3 : 0;
        if (c == 0xF0) {
            return cont(1, 0x90, 0xBF) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF) ? 4 : 0;
        }
        if (c >= 0xF1 && c <= 0xF3) {
            return cont(1, 0x80, 0xBF) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF) ? 4 : 0;
        }
        if (c == 0xF4) {
            return cont(1, 0x80, 0x8F) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF) ? 4 : 0;
        }
        return 0;
    }

    bool parse_string(std::string& out) {
        const size_t open = pos_;
        pos_++;  // '"'
        out.clear();
        for (;;) {
            if (at_end()) return fail_at(open, "unterminated string");
            const char c = peek();
            if (c == '"') {
                pos_++;
                return true;
            }
            if (static_cast<uint8_t>(c) < 0x20) {
                return fail("unescaped control character 0x%02x in a string",
                            static_cast<unsigned>(c));
            }
            if (c != '\\') {
                const size_t n = utf8_len();
                if (n == 0) return fail("invalid UTF-8 in a string");
                out.append(s_.data() + pos_, n);
                pos_ += n;
                continue;
            }
            const size_t esc = pos_;
            pos_++;
            if (at_end()) return fail_at(open, "unterminated string");
            const char e = peek();
            pos_++;
            switch (e) {
                case '"':
                    out += '"';
                    break;
                case '\\':
                    out += '\\';
                    break;
                case '/':
                    out += '/';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'n':
                    out += '\n';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'u': {
                    uint32_t cp = 0;
                    if (!hex4(&cp)) return false;
                    if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        return fail_at(esc, "unpaired low surrogate \\u%04X", cp);
                    }
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (s_.substr(pos_, 2) != "\\u") {
                            return fail_at(esc,
                                           "high surrogate \\u%04X is not followed by a low "
                                           "surrogate",
                                           cp);
                        }
                        pos_ += 2;
                        uint32_t lo = 0;
                        if (!hex4(&lo)) return false;
                        if (lo < 0xDC00 || lo > 0xDFFF) {
                            return fail_at(esc,
                                           "high surrogate \\u%04X is followed by \\u%04X, not a "
                                           "low surrogate",
                                           cp, lo);
                        }
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    append_utf8(out, cp);
                    break;
                }
                default:
                    pos_ = esc;
                    return fail("invalid escape sequence '\\%c'",
                                (static_cast<uint8_t>(e) >= 0x20 && e != 0x7f) ? e : '?');
            }
        }
    }
};

// ---------------------------------------------------------------------------------------------
// Writer

void dump_string(std::string& out, const std::string& s) {
    out += '"';
    for (char ch : s) {
        const uint8_t c = static_cast<uint8_t>(ch);
        switch (ch) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\u%04x", c);
                    out += buf;
                } else {
                    out += ch;
                }
        }
    }
    out += '"';
}

void dump_number(std::string& out, double d) {
    if (!std::isfinite(d)) {
        out += "null";
        return;
    }
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", d);
    out += buf;
}

void newline(std::string& out, int indent, int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

void dump_value(std::string& out, const Value& v, int indent, int level) {
    switch (v.kind) {
        case Kind::Null:
            out += "null";
            break;
        case Kind::Bool:
            out += v.boolean ? "true" : "false";
            break;
        case Kind::Number:
            dump_number(out, v.number);
            break;
        case Kind::String:
            dump_string(out, v.string);
            break;
        case Kind::Array:
            out += '[';
            for (size_t i = 0; i < v.array.size(); i++) {
                if (i) out += ',';
                newline(out, indent, level + 1);
                dump_value(out, v.array[i], indent, level + 1);
            }
            if (!v.array.empty()) newline(out, indent, level);
            out += ']';
            break;
        case Kind::Object:
            out += '{';
            for (size_t i = 0; i < v.object.size(); i++) {
                if (i) out += ',';
                newline(out, indent, level + 1);
                dump_string(out, v.object[i].first);
                out += indent < 0 ? ":" : ": ";
                dump_value(out, v.object[i].second, indent, level + 1);
            }
            if (!v.object.empty()) newline(out, indent, level);
            out += '}';
            break;
    }
}

}  // namespace

Expected<Value> parse(std::string_view text) {
    return Parser(text).run();
}

Expected<Value> parse_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::errorf("%s: cannot open: %s", path.c_str(), std::strerror(errno));
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) return Status::errorf("%s: read error", path.c_str());
    const std::string text = std::move(ss).str();
    Expected<Value> v = parse(text);
    if (!v) return v.status().context(path);
    return v;
}

std::string dump(const Value& v, int indent) {
    std::string out;
    dump_value(out, v, indent, 0);
    return out;
}

}  // namespace ferry::json
