// The `ferry` command line: a table of subcommands (one file each, tools/cmd_*.cpp, registering
// themselves with FERRY_COMMAND) and the argument parser shared by all of them.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "ferry/llama.h"
#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry {
class Device;
}

namespace ferry::cli {

struct Command {
    const char* name;
    const char* summary;
    int (*fn)(int argc, char** argv);  // argv[0] is the subcommand name
};

void register_command(const Command& c);
const std::vector<Command>& commands();

struct CommandRegistrar {
    explicit CommandRegistrar(const Command& c) { register_command(c); }
};

#define FERRY_COMMAND(ident, name, summary, fn) \
    static ::ferry::cli::CommandRegistrar ferry_cmd_##ident({name, summary, fn})

// "ferry 0.1.0 (...)": what `ferry --version` prints.
std::string version_string();

// One option a command accepts, as it declares it in its table.
struct OptionSpec {
    // Its names: "-x" (one character after '-') and/or "--long-name". All name one option.
    std::vector<const char*> names;
    // The value's name in --help ("PATH", "N"); nullptr: a flag, which takes no value.
    const char* arg = nullptr;
    // One line of help ("\n" starts another, indented under the first).
    const char* help = "";
};

// The command line of one subcommand. The constructor scans argv[1..] once, left to right
// (getopt_long): each argument is an option of `options` (or -h/--help, always declared), the
// value of the option just before it, or a positional argument. An option that takes a value
// takes the next argument whatever it looks like (`-p -m` is the prompt "-m", `-n -1` is -1),
// or the rest of its own argument (`-n5`, `--n-predict=5`); "--" ends the options. A long name
// may be abbreviated to any unambiguous prefix (getopt's rule). Given twice, an option's last
// value wins (values() returns all of them).
//
// Errors (an unknown option, a missing value, a value given to a flag, a malformed number,
// an unexpected positional argument) are kept and returned by finish(), the first one first.
// The accessors then read what the scan found; an accessor whose names are not in the table
// is a bug in the command, which finish() reports ahead of everything else.
class Args {
  public:
    // `command`: "run"; `usage`: the text --help prints above the option list (a usage line
    // and a description, each line ending in '\n').
    Args(const char* command, const char* usage, std::vector<OptionSpec> options, int argc,
         char** argv);

    // -h or --help was given; print_help() prints `usage` and the option table to `out`.
    bool help() const { return help_; }
    void print_help(FILE* out = stdout) const;

    bool flag(std::initializer_list<const char*> names);
    std::optional<std::string> value(std::initializer_list<const char*> names);  // the last
    std::vector<std::string> values(std::initializer_list<const char*> names);   // repeatable
    // Typed values: a malformed value is remembered and reported by finish().
    std::optional<long long> integer(std::initializer_list<const char*> names);
    std::optional<double> number(std::initializer_list<const char*> names);
    // The positional arguments, in order. A command that never asks for them takes none:
    // finish() then reports the first as unexpected.
    std::vector<std::string> positional();
    Status finish();

  private:
    int spec_index(std::initializer_list<const char*> names);  // -1: not declared (bug_ set)

    const char* command_;
    const char* usage_;
    std::vector<OptionSpec> specs_;
    struct Given {
        int spec;
        std::string value;
    };
    std::vector<Given> given_;  // in command-line order
    std::vector<std::string> positional_;
    bool positional_read_ = false;
    bool help_ = false;
    std::string error_;  // the first error found by the scan or a typed accessor
    std::string bug_;    // an accessor or table mistake of the command itself
};

// --remote ADDR... and --device NAME: connects to each server (registering its devices), then
// returns the device named by --device, else the first device of the first server, else
// nullptr (the CPU).
Expected<Device*> pick_device(const std::vector<std::string>& remotes,
                              const std::optional<std::string>& device_name);
// Where a model runs, for the commands that load one (run, bench, logits): --remote ADDR
// (repeatable), -d/--device NAME[,NAME...], --n-gpu-layers/-ngl N, --tensor-split/-ts A,B...
std::vector<OptionSpec> placement_options();
// A command's own options followed by placement_options().
std::vector<OptionSpec> with_placement(std::vector<OptionSpec> own);
struct Placement {
    std::vector<std::string> remotes;
    std::optional<std::string> devices;
    std::optional<long long> n_gpu_layers;
    std::optional<std::string> tensor_split;
    std::string cache_dir;  // --cache-dir: compiled graphs of graph compilers (SessionOptions)
};
// Reads those options (before Args::finish()).
Placement read_placement(Args& args);
// Connects to each --remote and fills `mo`: the devices to offload to, the number of layers
// and their split.
Status apply_placement(const Placement& p, ModelOptions* mo);

// --kv-type: f16 (default), f32 or bf16.
Expected<Type> parse_kv_type(const std::optional<std::string>& s);

// Loads a model: a GGUF file, or the demo model compiled into the binary when `path` is its
// name (embedded_demo_model().name, the default of `ferry run`).
Expected<std::unique_ptr<LlamaModel>> load_model(const std::string& path, const ModelOptions& opts);

// Prints "ferry <cmd>: message" to stderr and returns 1.
int fail(const char* cmd, const std::string& message);

}  // namespace ferry::cli
