// Errors as values: Status and Expected<T>.
//
// Every public and wire boundary returns one of these. A failed Status carries a message that
// names the thing at fault (file, tensor, field, op, value); callers add context with
// Status::context() as the error travels outward.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace ferry {

// printf-style formatting into a std::string.
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrfmt(const char* fmt, va_list ap);

// What kind of failure a Status reports, so callers decide by code, never by message text.
enum class ErrorCode : uint8_t {
    Ok = 0,
    Failed,           // anything not covered below
    InvalidArgument,  // bad input: a shape, a type, a value, a file's contents
    OutOfMemory,      // an allocation (host or device) failed
    Unsupported,      // the device or build cannot do this
    ConnectionLost,   // the transport to a remote device is gone
    Cancelled,        // the work was stopped before it finished
};
const char* error_code_name(ErrorCode c);

class [[nodiscard]] Status {
  public:
    Status() = default;  // success
    static Status ok() { return Status(); }
    static Status error(std::string msg) { return error(ErrorCode::Failed, std::move(msg)); }
    static Status error(ErrorCode code, std::string msg) {
        Status s;
        s.code_ = code == ErrorCode::Ok ? ErrorCode::Failed : code;
        s.msg_ = std::move(msg);
        return s;
    }
    static Status errorf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
    static Status errorf(ErrorCode code, const char* fmt, ...)
        __attribute__((format(printf, 2, 3)));

    bool is_ok() const { return code_ == ErrorCode::Ok; }
    explicit operator bool() const { return is_ok(); }
    ErrorCode code() const { return code_; }
    const std::string& message() const { return msg_; }

    // Prefixes the message with "what: " (no-op on success); keeps the code.
    Status context(const std::string& what) const {
        if (is_ok()) return *this;
        return error(code_, what + ": " + msg_);
    }

  private:
    ErrorCode code_ = ErrorCode::Ok;
    std::string msg_;
};

// A value or the Status explaining why there is none.
template <class T>
class [[nodiscard]] Expected {
  public:
    Expected(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
    Expected(Status s) : v_(std::move(s)) {}     // NOLINT: must be a failed status

    bool has_value() const { return v_.index() == 0; }
    explicit operator bool() const { return has_value(); }
    T& value() & { return std::get<0>(v_); }
    T&& value() && { return std::get<0>(std::move(v_)); }
    const T& value() const& { return std::get<0>(v_); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    const Status& status() const {
        static const Status ok_status;
        return has_value() ? ok_status : std::get<1>(v_);
    }
    const std::string& message() const { return status().message(); }

  private:
    std::variant<T, Status> v_;
};

}  // namespace ferry

// Returns early from the enclosing function when `expr` (a Status) failed.
#define FERRY_TRY(expr)                     \
    do {                                    \
        ::ferry::Status ferry_st_ = (expr); \
        if (!ferry_st_) return ferry_st_;   \
    } while (0)

// Internal invariant (never for data that came from outside the process).
#define FERRY_ASSERT(cond)                                            \
    do {                                                              \
        if (!(cond)) ::ferry::assert_fail(__FILE__, __LINE__, #cond); \
    } while (0)

namespace ferry {
[[noreturn]] void assert_fail(const char* file, int line, const char* cond);
}
