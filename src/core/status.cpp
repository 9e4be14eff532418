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

void assert_fail(const char* file, int line, const char* cond) {
    std::fprintf(stderr, "ferry: internal error at %s:%d: assertion failed: %s\n", file, line,
                 cond);
    std::abort();
}

}  // namespace ferry
