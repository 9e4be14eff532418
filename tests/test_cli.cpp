// The command line as a user meets it: `ferry run` with no arguments, help, unknown commands.
#include <gtest/gtest.h>

#include <string>

#include "shell.h"

namespace {

using Output = ferry::testing::ShellResult;

// Runs ferry from /tmp (not the source tree: the demo model must come from the binary
// itself) and returns its stdout and exit status.
Output run(const std::string& args) {
    return ferry::testing::run_shell("cd /tmp && " + std::string(FERRY_BIN) + " " + args +
                                     " 2>/dev/null");
}

}  // namespace

TEST(Cli, RunWithNoArgumentsUsesTheEmbeddedModel) {
    Output o = run("run -n 16");
    EXPECT_EQ(o.rc, 0);
    EXPECT_GT(o.out.size(), 16u) << o.out;
}

TEST(Cli, GreedyRunOfTheDemoModelContinuesLikeTheOracle) {
    // reference.json, prompt 0: the float64 oracle's greedy continuation begins so; the Q8_0
    // demo model agrees on these tokens.
    Output o = run("run -p 'The quick brown fox' -n 24 --temp 0");
    ASSERT_EQ(o.rc, 0);
    EXPECT_EQ(o.out.rfind("imum implementation was added. 3. If you can use the", 0), 0u) << o.out;
}

TEST(Cli, UnknownCommandAndArgumentFail) {
    EXPECT_NE(run("no-such-command").rc, 0);
    EXPECT_NE(run("run --no-such-flag").rc, 0);
    EXPECT_NE(run("run -m /nonexistent.gguf").rc, 0);
    EXPECT_EQ(run("help").rc, 0);
}
