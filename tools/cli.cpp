#include "cli.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry::cli {

namespace {
std::vector<Command>& table() {
    static std::vector<Command> t;
    return t;
}
}  // namespace

void register_command(const Command& c) {
    table().push_back(c);
}
const std::vector<Command>& commands() {
    return table();
}

Args::Args(int argc, char** argv) {
    for (int i = 1; i < argc; i++) args_.emplace_back(argv[i]);
    used_.assign(args_.size(), false);
}

namespace {
bool name_matches(const std::string& arg, const char* name, std::string* inline_value) {
    const size_t n = std::strlen(name);
    if (arg == name) return true;
    if (arg.size() > n && arg.compare(0, n, name) == 0 && arg[n] == '=' && name[1] == '-') {
        *inline_value = arg.substr(n + 1);
        return true;
    }
    return false;
}
}  // namespace

bool Args::flag(std::initializer_list<const char*> names) {
    bool found = false;
    for (size_t i = 0; i < args_.size(); i++) {
        if (used_[i]) continue;
        for (const char* n : names) {
            if (args_[i] == n) {
                used_[i] = true;
                found = true;
            }
        }
    }
    return found;
}

std::vector<std::string> Args::values(std::initializer_list<const char*> names) {
    std::vector<std::string> out;
    for (size_t i = 0; i < args_.size(); i++) {
        if (used_[i]) continue;
        for (const char* n : names) {
            std::string inl;
            if (!name_matches(args_[i], n, &inl)) continue;
            used_[i] = true;
            if (args_[i] != n) {
                out.push_back(inl);
            } else if (i + 1 < args_.size()) {
                used_[i + 1] = true;
                out.push_back(args_[i + 1]);
                i++;
            } else if (error_.empty()) {
                error_ = std::string("option ") + n + " needs a value";
            }
            break;
        }
    }
    return out;
}

std::optional<std::string> Args::value(std::initializer_list<const char*> names) {
    std::vector<std::string> v = values(names);
    if (v.empty()) return std::nullopt;
    return v.back();
}

std::optional<long long> Args::integer(std::initializer_list<const char*> names) {
    std::optional<std::string> v = value(names);
    if (!v) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || errno != 0) {
        if (error_.empty())
            error_ = std::string("option ") + *names.begin() + ": '" + *v + "' is not an integer";
        return std::nullopt;
    }
    return x;
}

std::optional<double> Args::number(std::initializer_list<const char*> names) {
    std::optional<std::string> v = value(names);
    if (!v) return std::nullopt;
    char* end = nullptr;
    double x = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0') {
        if (error_.empty())
            error_ = std::string("option ") + *names.begin() + ": '" + *v + "' is not a number";
        return std::nullopt;
    }
    return x;
}

std::vector<std::string> Args::positional() {
    std::vector<std::string> out;
    for (size_t i = 0; i < args_.size(); i++) {
        if (!used_[i] && (args_[i].empty() || args_[i][0] != '-')) {
            used_[i] = true;
            out.push_back(args_[i]);
        }
    }
    return out;
}

Status Args::finish() {
    if (!error_.empty()) return Status::error(error_);
    for (size_t i = 0; i < args_.size(); i++) {
        if (!used_[i]) return Status::errorf("unknown argument '%s'", args_[i].c_str());
    }
    return Status::ok();
}

int fail(const char* cmd, const std::string& message) {
    std::fprintf(stderr, "ferry %s: %s\n", cmd, message.c_str());
    return 1;
}

}  // namespace ferry::cli
