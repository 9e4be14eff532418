#include "remote-proto/step-trace.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace ferry::remote {

namespace {
std::atomic<int> g_traces{0};
}

StepTrace::StepTrace(const char* role) {
    const char* dir = std::getenv("FERRY_STEP_TRACE");
    if (!dir || !*dir) return;
    on_ = true;
    path_ = std::string(dir) + "/" + role + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(g_traces.fetch_add(1)) + ".txt";
    events_.reserve(1u << 16);
}

StepTrace::~StepTrace() {
    if (!on_ || events_.empty()) return;
    // Written under another name and renamed: a reader sees the whole file or none.
    const std::string tmp = path_ + ".part";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) {
        std::fprintf(stderr, "ferry: step trace %s: cannot write\n", tmp.c_str());
        return;
    }
    for (const Event& e : events_) {
        std::fprintf(f, "%lld %c %u\n", static_cast<long long>(e.t), e.kind,
                     static_cast<unsigned>(e.cmd));
    }
    if (std::fclose(f) != 0 || std::rename(tmp.c_str(), path_.c_str()) != 0) {
        std::fprintf(stderr, "ferry: step trace %s: cannot write\n", path_.c_str());
    }
}

}  // namespace ferry::remote
