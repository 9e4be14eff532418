// Running a command line from a test: its exit status and standard output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace ferry::testing {

struct ShellResult {
    int rc = -1;  // exit status; -1 when it did not exit normally or could not start
    std::string out;
};

inline ShellResult run_shell(const std::string& cmd) {
    ShellResult r;
    FILE* f = popen(cmd.c_str(), "r");
    if (!f) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) r.out.append(buf, n);
    const int st = pclose(f);
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

}  // namespace ferry::testing
