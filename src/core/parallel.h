// Work split over threads by item: for loops whose items are independent (rows quantized one by
// one), so that what they produce does not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "ferry/status.h"

namespace ferry {

// Runs fn(i) for every i in [0, n) on min(n_threads, n) threads (thread t takes t, t + nth, ...;
// one thread runs on the caller's). A thread stops at its first error; the result is the error
// of the lowest-numbered thread that had one.
template <class Fn>
Status parallel_items(int64_t n, int n_threads, Fn&& fn) {
    const int nth = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n_threads, n)));
    std::vector<Status> results(static_cast<size_t>(nth));
    auto run = [&](int t) {
        for (int64_t i = t; i < n; i += nth) {
            Status st = fn(i);
            if (!st) {
                results[static_cast<size_t>(t)] = st;
                return;
            }
        }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < nth; t++) threads.emplace_back(run, t);
    run(0);
    for (std::thread& th : threads) th.join();
    for (Status& st : results) FERRY_TRY(st);
    return Status::ok();
}

}  // namespace ferry
