// The command line as a user meets it: real runs of the built `ferry` binary. Covers the
// commands' option parsing (left to right, values that look like options, missing values,
// unknown options, -n -1), --version, --help, and flags that mean one thing everywhere.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/gguf.h"
#include "ferry/status.h"
#include "shell.h"

namespace {

using Output = ferry::testing::ShellResult;

// Runs ferry from /tmp (not the source tree: the demo model must come from the binary
// itself) and returns its stdout and exit status.
Output run(const std::string& args) {
    return ferry::testing::run_shell("cd /tmp && " + std::string(FERRY_BIN) + " " + args +
                                     " 2>/dev/null");
}

// The same with stderr appended to stdout (messages and timings).
Output run_all(const std::string& args) {
    return ferry::testing::run_shell("cd /tmp && " + std::string(FERRY_BIN) + " " + args + " 2>&1");
}

// The command names `ferry help` lists (two-space indent, then the name).
std::vector<std::string> command_names() {
    std::vector<std::string> names;
    std::istringstream in(run("help").out);
    std::string line;
    bool in_list = false;
    while (std::getline(in, line)) {
        if (line == "commands:") {
            in_list = true;
        } else if (in_list && line.rfind("  ", 0) == 0) {
            names.push_back(line.substr(2, line.find(' ', 2) - 2));
        } else if (in_list) {
            break;
        }
    }
    return names;
}

long long number_after(const std::string& text, const std::string& pattern) {
    std::smatch m;
    if (!std::regex_search(text, m, std::regex(pattern))) return -1;
    return std::stoll(m[1].str());
}

std::string temp_dir() {
    char tmpl[] = "/tmp/ferry-cli-XXXXXX";
    const char* d = mkdtemp(tmpl);
    return d ? d : "/tmp";
}

long long file_size(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
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
    EXPECT_NE(run("").rc, 0);  // no command: the usage, and a failure
}

TEST(Cli, OptionsAreReadLeftToRightAndAValueMayStartWithADash) {
    // -p takes the next argument whatever it looks like, so the prompt is "-m" and -n 2 is
    // still -n 2 (the old parser, reading options in the order the code asked for them,
    // failed here with "unknown argument '2'").
    Output a = run_all("run -p -m -n 2 --temp 0");
    ASSERT_EQ(a.rc, 0) << a.out;
    EXPECT_EQ(number_after(a.out, "generated (\\d+) tokens"), 2) << a.out;
    // The same request spelled other ways gives the same text.
    Output b = run("run -n 2 --temp 0 -p -m");
    Output c = run("run --prompt=-m --n-predict=2 --temp=0");
    Output d = run("run -n 7 -n2 --temp 0 -p-m");  // given twice, the last value wins
    ASSERT_EQ(b.rc, 0);
    EXPECT_EQ(a.out.substr(0, a.out.find('\n')), b.out.substr(0, b.out.find('\n')));
    EXPECT_EQ(b.out, c.out);
    EXPECT_EQ(b.out, d.out);
    // A prompt of "-m" is not the prompt of the default run.
    EXPECT_NE(b.out, run("run -n 2 --temp 0").out);
}

TEST(Cli, VersionIsPrintedByTheFlagAndTheCommand) {
    Output a = run("--version");
    Output b = run("version");
    ASSERT_EQ(a.rc, 0);
    ASSERT_EQ(b.rc, 0);
    EXPECT_TRUE(std::regex_search(a.out, std::regex("^ferry [0-9]+\\.[0-9]+\\.[0-9]+"))) << a.out;
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(run("version --bogus").rc, 0);
}

TEST(Cli, EveryCommandHasHelpAndNamesAnUnknownOption) {
    const std::vector<std::string> cmds = command_names();
    ASSERT_GE(cmds.size(), 9u) << run("help").out;
    for (const std::string& c : cmds) {
        SCOPED_TRACE(c);
        Output h = run(c + " --help");
        EXPECT_EQ(h.rc, 0);
        EXPECT_EQ(h.out.rfind("usage: ferry " + c, 0), 0u) << h.out;
        EXPECT_NE(h.out.find("-h, --help"), std::string::npos) << h.out;
        EXPECT_EQ(run("help " + c).out, h.out);
        EXPECT_EQ(run(c + " -h").out, h.out);
        // The unknown option is reported (not a command's undeclared option, which the
        // parser reports first: this also checks every option a command reads is declared).
        Output u = run_all(c + " --no-such-option");
        EXPECT_EQ(u.rc, 1);
        EXPECT_NE(u.out.find("ferry " + c + ": unknown option '--no-such-option'"),
                  std::string::npos)
            << u.out;
    }
}

TEST(Cli, BadOptionsAreNamedInTheError) {
    struct Case {
        const char* args;
        const char* message;
    };
    const Case cases[] = {
        {"run -n", "option -n, --n-predict needs a value"},
        {"run --model", "option -m, --model needs a value"},
        {"run -m", "option -m, --model needs a value"},
        {"bench -m x.gguf -r", "option -r, --repetitions needs a value"},
        {"run --mmap=yes", "option --mmap takes no value"},
        {"run -x", "unknown option '-x'"},
        {"run --top 5", "option '--top' is ambiguous (--top-k, --top-p)"},
        {"run -n two", "option -n: 'two' is not an integer"},
        {"run --temp 0.5x", "option --temp: '0.5x' is not a number"},
        {"run extra", "unexpected argument 'extra'"},
        {"tokenize -m x.gguf -p hi -- --pieces", "unexpected argument '--pieces'"},
        {"run -n -2", "-n -2: give a token count, or -1 for no limit"},
        {"bench -m x.gguf -n -1", "-n -1: must be 0 or more"},
        {"bench -m x.gguf --format csv", "--format csv: not md or json"},
        {"bench -m x.gguf -p 512 -c 100", "-c 100: must be 528 (the longer test's tokens + 16)"},
        {"run -d NoSuchDevice -n 1", "no device named 'NoSuchDevice'"},
        {"test-ops --device NoSuchDevice", "no device named 'NoSuchDevice'"},
    };
    for (const Case& c : cases) {
        Output o = run_all(c.args);
        EXPECT_EQ(o.rc, 1) << c.args << ": " << o.out;
        EXPECT_NE(o.out.find(c.message), std::string::npos) << c.args << ": " << o.out;
    }
}

TEST(Cli, NMinusOneGeneratesUntilTheContextIsFull) {
    // Greedy from this prompt, the demo model does not end the text within 32 tokens, so -1
    // runs to the full context: every position is filled and one more token is sampled from
    // the last one's logits.
    Output o = run_all("run -c 32 -n -1 --temp 0 -p Hello");
    ASSERT_EQ(o.rc, 0) << o.out;
    EXPECT_NE(o.out.find("context of 32 tokens is full"), std::string::npos) << o.out;
    const long long prompt = number_after(o.out, "prompt (\\d+) tokens");
    const long long generated = number_after(o.out, "generated (\\d+) tokens");
    ASSERT_GT(prompt, 0) << o.out;
    EXPECT_EQ(generated, 32 - prompt + 1) << o.out;
    // A count stops earlier, as before.
    Output n = run_all("run -c 32 -n 3 --temp 0 -p Hello");
    EXPECT_EQ(number_after(n.out, "generated (\\d+) tokens"), 3) << n.out;
}

TEST(Cli, OutputAndDeviceMeanOneThingAcrossCommands) {
    const std::string dir = temp_dir();
    const std::string model = dir + "/tiny.gguf";
    // -o is the output file of gen-model, logits and bench.
    Output g = run_all("gen-model --preset tiny --type q8_0 -o " + model);
    ASSERT_EQ(g.rc, 0) << g.out;
    ASSERT_GT(file_size(model), 0);
    Output l = run_all("logits -m " + model + " --tokens 1,2,3 -d CPU -o " + dir + "/l.bin");
    ASSERT_EQ(l.rc, 0) << l.out;
    const long long n_vocab = number_after(l.out, "wrote 3 x (\\d+) logits");
    ASSERT_GT(n_vocab, 0) << l.out;
    EXPECT_EQ(file_size(dir + "/l.bin"), 3 * n_vocab * 4);
    // --out, the older name, still works.
    ASSERT_EQ(run("logits -m " + model + " --tokens 1,2,3 --out " + dir + "/l2.bin").rc, 0);
    EXPECT_EQ(file_size(dir + "/l2.bin"), 3 * n_vocab * 4);
    Output b = run("bench -m " + model + " -p 4 -n 2 -c 64 -r 1 --device CPU --format json -o " +
                   dir + "/b.json");
    ASSERT_EQ(b.rc, 0);
    EXPECT_EQ(b.out, "");  // the results went to the file
    std::ifstream f(dir + "/b.json");
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_EQ(text.str().rfind("[\n", 0), 0u) << text.str();
    EXPECT_NE(text.str().find("\"test\": \"tg2\""), std::string::npos) << text.str();
    // (The GPU's memory in use is a GPU's alone: 0 on the CPU.)
    EXPECT_NE(text.str().find("\"device_used_bytes\": 0}"), std::string::npos) << text.str();
    // tg's weights a token, from the file's tensors: all of them but the token embeddings,
    // of which one row (the tiny preset has an output matrix of its own); times its tokens/s.
    ferry::Expected<std::unique_ptr<ferry::GgufFile>> gf = ferry::GgufFile::open(model);
    ASSERT_TRUE(gf) << gf.message();
    ASSERT_NE((*gf)->find_tensor("output.weight"), nullptr);
    uint64_t step_bytes = 0;
    for (const ferry::GgufTensorInfo& t : (*gf)->tensors()) {
        step_bytes +=
            t.name == "token_embd.weight" ? t.nbytes / static_cast<size_t>(t.ne[1]) : t.nbytes;
    }
    std::string pp_line, tg_line, line;
    for (std::istringstream lines(text.str()); std::getline(lines, line);) {
        if (line.find("\"test\": \"pp4\"") != std::string::npos) pp_line = line;
        if (line.find("\"test\": \"tg2\"") != std::string::npos) tg_line = line;
    }
    EXPECT_EQ(pp_line.find("weight_bytes"), std::string::npos) << "only tg reads them a token";
    EXPECT_EQ(number_after(tg_line, "\"weight_bytes_per_token\": (\\d+)"),
              static_cast<long long>(step_bytes))
        << tg_line;
    std::smatch tg;
    ASSERT_TRUE(std::regex_search(
        tg_line, tg, std::regex("\"avg_ts\": ([0-9.]+).*\"weight_bytes_per_s\": ([0-9]+)")))
        << tg_line;
    const double rate = std::stod(tg[2].str());
    EXPECT_NEAR(rate, static_cast<double>(step_bytes) * std::stod(tg[1].str()), 1.0 + 1e-4 * rate);
    // The table's line says the same in GB and GB/s.
    Output md = run("bench -m " + model + " -p 0 -n 2 -c 64 -r 1 --device CPU");
    ASSERT_EQ(md.rc, 0) << md.out;
    EXPECT_NE(md.out.find(ferry::strfmt("weights read a token: %.2f MB; tg2 ",
                                        static_cast<double>(step_bytes) / 1e6)),
              std::string::npos)
        << md.out;
    // --device names the device in test-ops too; --backend and -b are its older names.
    Output d = run("test-ops --device CPU --op scale");
    ASSERT_EQ(d.rc, 0) << d.out;
    EXPECT_NE(d.out.find(" passed, 0 failed"), std::string::npos) << d.out;
    EXPECT_EQ(run("test-ops --backend CPU --op scale").out, d.out);
    EXPECT_EQ(run("test-ops -b CPU --op scale").out, d.out);
    EXPECT_EQ(run("test-ops -d CPU --op scale").out, d.out);
    // Repeated, it tests each device named, in order: here the CPU twice, so every case line
    // appears twice and the counts double.
    Output twice = run("test-ops -d CPU --backend CPU --op scale");
    ASSERT_EQ(twice.rc, 0) << twice.out;
    auto count_lines = [](const std::string& s, const std::string& prefix) {
        size_t n = 0;
        for (size_t at = 0; (at = s.find("\n" + prefix, at)) != std::string::npos; at++) n++;
        return n + (s.rfind(prefix, 0) == 0 ? 1 : 0);
    };
    const size_t once = count_lines(d.out, "CPU ");
    ASSERT_GT(once, 0u) << d.out;
    EXPECT_EQ(count_lines(twice.out, "CPU "), 2 * once) << twice.out;
    EXPECT_NE(twice.out.find(std::to_string(2 * once) + " passed, 0 failed"), std::string::npos)
        << twice.out;
    ferry::testing::run_shell("rm -rf " + dir);
}
