// The `ferry` command line: a table of subcommands (one file each, tools/cmd_*.cpp, registering
// themselves with FERRY_COMMAND) and a small argument parser shared by all of them.
#pragma once

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

// Parses "-x VALUE", "--long VALUE", "--long=VALUE" and boolean flags. Each accessor consumes
// what it matched; finish() reports anything left over as an unknown argument.
class Args {
  public:
    Args(int argc, char** argv);  // skips argv[0]

    bool flag(std::initializer_list<const char*> names);
    std::optional<std::string> value(std::initializer_list<const char*> names);
    std::vector<std::string> values(std::initializer_list<const char*> names);  // repeatable
    // Typed values: a malformed value is remembered and reported by finish().
    std::optional<long long> integer(std::initializer_list<const char*> names);
    std::optional<double> number(std::initializer_list<const char*> names);
    // Remaining positional arguments (those not starting with '-').
    std::vector<std::string> positional();
    Status finish();

  private:
    std::vector<std::string> args_;
    std::vector<bool> used_;
    std::string error_;
};

// --remote ADDR... and --device NAME: connects to each server (registering its devices), then
// returns the device named by --device, else the first device of the first server, else
// nullptr (the CPU).
Expected<Device*> pick_device(const std::vector<std::string>& remotes,
                              const std::optional<std::string>& device_name);
// --kv-type: f16 (default), f32 or bf16.
Expected<Type> parse_kv_type(const std::optional<std::string>& s);

// Loads a model: a GGUF file, or the demo model compiled into the binary when `path` is its
// name (embedded_demo_model().name, the default of `ferry run`).
Expected<std::unique_ptr<LlamaModel>> load_model(const std::string& path, const ModelOptions& opts);

// Prints "ferry <cmd>: message" to stderr and returns 1.
int fail(const char* cmd, const std::string& message);

}  // namespace ferry::cli
