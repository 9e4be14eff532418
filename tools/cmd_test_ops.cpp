// ferry test-ops: runs the op test suite (src/testing/op-tests.h) on one or every device and
// compares each case with the float64 reference.
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "ferry/backend.h"
#include "ferry/op-tests.h"
#include "ferry/remote.h"

namespace ferry::cli {
namespace {

int cmd_test_ops(int argc, char** argv) {
    Args args("test-ops",
              "usage: ferry test-ops [options]\n"
              "  Runs every op test case on a device and compares it with the float64 "
              "reference.\n"
              "  Prints one line per case and, last, `N passed, M failed`; exits 1 if any "
              "failed.\n",
              {
                  {{"-d", "--device", "--backend", "-b"},
                   "NAME",
                   "device to test, as listed by `ferry devices` (repeatable; default:\n"
                   "every device); --backend and -b are older names of this option"},
                  {{"--op"},
                   "NAME",
                   "only cases of these ops (comma-separated), or whose name\n"
                   "contains NAME"},
                  {{"-t", "--threads"}, "N", "threads for CPU-side work"},
                  {{"--remote"},
                   "ADDR",
                   "connect to a `ferry serve` (unix:PATH or tcp:HOST:PORT) first;\n"
                   "its devices are named ADDR/NAME (repeatable)"},
                  {{"-v", "--verbose"},
                   nullptr,
                   "also print each case's bound justification and failure details"},
              },
              argc, argv);
    if (args.help()) {
        args.print_help();
        return 0;
    }
    const std::vector<std::string> device_names = args.values({"-d", "--device"});
    const std::string filter = args.value({"--op"}).value_or("");
    const std::optional<long long> threads = args.integer({"-t", "--threads"});
    const std::vector<std::string> remotes = args.values({"--remote"});
    const bool verbose = args.flag({"-v", "--verbose"});
    if (Status st = args.finish(); !st) return fail("test-ops", st.message());

    for (const std::string& addr : remotes) {
        if (Status st = remote_connect(addr); !st) {
            return fail("test-ops", "--remote " + addr + ": " + st.message());
        }
    }

    std::vector<Device*> devices;
    for (const std::string& name : device_names) {
        Device* d = find_device(name);
        if (!d) {
            std::string known;
            for (Device* x : all_devices())
                known += std::string(known.empty() ? "" : ", ") + x->name();
            return fail("test-ops", "no device named '" + name + "' (devices: " + known + ")");
        }
        devices.push_back(d);
    }
    if (device_names.empty()) devices = all_devices();

    const std::vector<testing::OpTestCase> cases = testing::make_op_tests(filter);
    if (cases.empty()) return fail("test-ops", "no test case matches --op " + filter);

    int passed = 0, failed = 0, skipped = 0;
    for (Device* dev : devices) {
        Expected<std::unique_ptr<Backend>> be = dev->make_backend();
        if (!be) {
            std::printf("%s: cannot create a backend: %s\n", dev->name(), be.message().c_str());
            failed += static_cast<int>(cases.size());
            continue;
        }
        if (threads) (*be)->set_n_threads(static_cast<int>(*threads));
        // The CPU is every graph's last resort: it must run every op. Other devices may decline
        // an op (supports_op), which the scheduler handles by falling back.
        const bool must_support = dev->type() == DeviceType::CPU;
        for (const testing::OpTestCase& c : cases) {
            const testing::OpTestResult r = testing::run_op_test(c, be->get());
            const char* verdict = r.passed ? "OK" : "FAIL";
            if (!r.passed && !r.supported && !must_support) verdict = "SKIP";
            std::printf("%-8s %-15s %-42s %-18s %-44s nmse=%-10.3g bound=%-8.2g %s\n", dev->name(),
                        op_name(c.op), c.name.c_str(), c.types.c_str(), c.shapes.c_str(), r.nmse,
                        r.bound, verdict);
            if (!r.passed && (verbose || r.supported || must_support)) {
                std::printf("    %s\n", r.message.c_str());
            }
            if (verbose) std::printf("    bound: %s\n", c.bound_note);
            std::fflush(stdout);
            if (r.passed) {
                passed++;
            } else if (verdict[0] == 'S') {
                skipped++;
            } else {
                failed++;
            }
        }
    }
    if (skipped) std::printf("%d skipped (op not supported by the device)\n", skipped);
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

}  // namespace
FERRY_COMMAND(test_ops, "test-ops", "compare every op on a device with the float64 reference",
              cmd_test_ops);
}  // namespace ferry::cli
