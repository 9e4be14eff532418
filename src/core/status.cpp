#include "ferry/status.h"

#include <cstdio>
#include <cstdlib>

namespace ferry {

std::string vstrfmt(const char* fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return fmt;
    std::string s(static_cast<size_t>(n), '\0');
    std::vsnprintf(s.data(), s.size() + 1, fmt, ap);
    return s;
}

std::string strfmt(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    return s;
}

Status Status::errorf(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    return error(std::move(s));
}

Status Status::errorf(ErrorCode code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    return error(code, std::move(s));
}

const char* error_code_name(ErrorCode c) {
    switch (c) {
        case ErrorCode::Ok:
            return "ok";
        case ErrorCode::Failed:
            return "failed";
        case ErrorCode::InvalidArgument:
            return "invalid argument";
        case ErrorCode::OutOfMemory:
            return "out of memory";
        case ErrorCode::Unsupported:
            return "unsupported";
        case ErrorCode::ConnectionLost:
            return "connection lost";
        case ErrorCode::Cancelled:
            return "cancelled";
    }
    return "?";
}

void assert_fail(const char* file, int line, const char* cond) {
    std::fprintf(stderr, "ferry: internal error at %s:%d: assertion failed: %s\n", file, line,
                 cond);
    std::abort();
}

}  // namespace ferry
