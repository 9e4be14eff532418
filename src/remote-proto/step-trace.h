// FERRY_STEP_TRACE=DIR: a process's remote frames as timestamped events, for lining a client's
// decode step up with its server's (bench/tools/step-trace.py): both sides stamp the same
// clock (steady_clock, CLOCK_MONOTONIC: one clock for every process of a host), and each
// connection writes its events to DIR/ROLE-PID-N.txt when it ends ("T_NS KIND CMD" a line).
// Off (no clock read, nothing kept) without the variable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remote-proto/transport.h"

namespace ferry::remote {

class StepTrace {
  public:
    // Kinds: what happened when. Client: 'S' a send of frames, 'H' a reply's header read, 'E'
    // the reply all in. Server: 'H' a request's header read, 'D' the request handled, 'R' its
    // reply sent, 'Q' a decode step queued ahead before the wait for the step before (the
    // read's cmd); a progressive reply's first piece 'F', each later piece 'P', the last 'L',
    // its stripe 0 sent by the connection itself '0', every stripe sent 'A'. A stripe lane
    // (StripeLanes, a trace of its own): 'w' a send of bytes in place begins, 's' it returned,
    // 'r' a transfer's stripe all received.
    explicit StepTrace(const char* role);
    ~StepTrace();
    StepTrace(const StepTrace&) = delete;
    StepTrace& operator=(const StepTrace&) = delete;
    void ev(char kind, uint16_t cmd) {
        if (on_ && events_.size() < kMaxEvents) events_.push_back({now_ns(), kind, cmd});
    }

  private:
    static constexpr size_t kMaxEvents = 1u << 20;
    struct Event {
        int64_t t;
        char kind;
        uint16_t cmd;
    };
    bool on_ = false;
    std::string path_;
    std::vector<Event> events_;
};

}  // namespace ferry::remote
