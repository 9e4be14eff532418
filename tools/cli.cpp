#include "cli.h"

#include <getopt.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#ifndef FERRY_VERSION
#define FERRY_VERSION "unknown"
#endif
#ifndef FERRY_BUILD_TYPE
#define FERRY_BUILD_TYPE ""
#endif

namespace ferry::cli {

namespace {
std::vector<Command>& table() {
    static std::vector<Command> t;
    return t;
}

bool is_short_name(const char* n) {
    return n[0] == '-' && n[1] != '\0' && n[1] != '-' && n[2] == '\0';
}
bool is_long_name(const char* n) {
    return n[0] == '-' && n[1] == '-' && n[2] != '\0' && n[3] != '\0' && !std::strchr(n, '=');
}
// llama.cpp's single-dash names of several letters (-ngl, -ts): aliases of a long name.
bool is_dash_alias(const char* n) {
    return n[0] == '-' && n[1] != '\0' && n[1] != '-' && n[2] != '\0' && !std::strchr(n, '=');
}

// "-m, --model": how an option is named in messages and --help.
std::string display_names(const OptionSpec& s) {
    std::string out;
    for (const char* n : s.names) out += (out.empty() ? "" : ", ") + std::string(n);
    return out;
}
}  // namespace

void register_command(const Command& c) {
    table().push_back(c);
}
const std::vector<Command>& commands() {
    return table();
}

std::string version_string() {
    std::string s = std::string("ferry ") + FERRY_VERSION;
    std::string build = FERRY_BUILD_TYPE;
#if defined(__clang__)
    build += std::string(build.empty() ? "" : ", ") + "clang " + __clang_version__;
#elif defined(__GNUC__)
    build += std::string(build.empty() ? "" : ", ") + "g++ " + __VERSION__;
#endif
    if (!build.empty()) s += " (" + build + ")";
    return s;
}

Args::Args(const char* command, const char* usage, std::vector<OptionSpec> options, int argc,
           char** argv)
    : command_(command), usage_(usage), specs_(std::move(options)) {
    specs_.push_back({{"-h", "--help"}, nullptr, "show this help"});
    const int help_index = static_cast<int>(specs_.size()) - 1;

    // getopt_long's tables. "-" first: positional arguments come back in order (code 1), so
    // the scan is strictly left to right whatever POSIXLY_CORRECT says; ":" next: a missing
    // value returns ':' rather than '?'. Long options return 256 + their spec's index.
    std::string shortopts = "-:";
    int short_spec[256];
    for (int& x : short_spec) x = -1;
    std::vector<option> longopts;
    // Single-dash aliases (-ngl) become their option's long name before getopt sees them,
    // where they stand as an option (not as the value of the option before).
    std::vector<std::pair<std::string, std::string>> aliases;  // "-ngl" -> "--n-gpu-layers"
    for (const OptionSpec& s : specs_) {
        const char* long_name = nullptr;
        for (const char* n : s.names) {
            if (is_long_name(n) && !long_name) long_name = n;
        }
        for (const char* n : s.names) {
            if (!is_short_name(n) && !is_long_name(n) && is_dash_alias(n)) {
                if (!long_name)
                    bug_ = std::string("alias ") + n + " needs a --long name beside it";
                else
                    aliases.emplace_back(n, long_name);
            }
        }
    }
    std::vector<std::string> translated;
    std::vector<char*> argv2;
    if (!aliases.empty()) {
        bool value_next = false;
        for (int i = 0; i < argc; i++) {
            std::string a = argv[i];
            bool is_value = value_next;
            value_next = false;
            if (i > 0 && !is_value) {
                for (const auto& [alias, long_name] : aliases) {
                    if (a == alias)
                        a = long_name;
                    else if (a.rfind(alias + "=", 0) == 0)
                        a = long_name + a.substr(alias.size());
                }
                // Does this option take the next argument as its value?
                for (const OptionSpec& s : specs_) {
                    if (!s.arg) continue;
                    for (const char* n : s.names) {
                        if (a == n) value_next = true;
                    }
                }
            }
            translated.push_back(a);
        }
        for (std::string& s : translated) argv2.push_back(s.data());
        argv2.push_back(nullptr);
        argv = argv2.data();
    }
    for (size_t i = 0; i < specs_.size(); i++) {
        const OptionSpec& s = specs_[i];
        const int has_arg = s.arg ? required_argument : no_argument;
        for (const char* n : s.names) {
            if (!is_short_name(n) && !is_long_name(n) && is_dash_alias(n)) continue;
            if (is_short_name(n)) {
                const auto c = static_cast<unsigned char>(n[1]);
                if (short_spec[c] >= 0 || c == ':' || c == '?' || c == '-') {
                    bug_ = std::string("option ") + n + " is declared twice or is not a name";
                }
                short_spec[c] = static_cast<int>(i);
                shortopts += static_cast<char>(c);
                if (s.arg) shortopts += ':';
            } else if (is_long_name(n)) {
                longopts.push_back({n + 2, has_arg, nullptr, 256 + static_cast<int>(i)});
            } else {
                bug_ = std::string("option name '") + n + "' is neither -x nor --long-name";
            }
        }
    }
    longopts.push_back({nullptr, 0, nullptr, 0});

    auto note = [&](std::string msg) {
        if (error_.empty()) error_ = std::move(msg);
    };
    opterr = 0;  // errors are ours to word
    optind = 0;  // glibc: 0 starts a fresh scan
    for (;;) {
        const int c = getopt_long(argc, argv, shortopts.c_str(), longopts.data(), nullptr);
        if (c == -1) break;
        if (c == 1) {
            positional_.emplace_back(optarg);
        } else if (c == ':') {
            const int i = optopt >= 256 ? optopt - 256 : short_spec[optopt & 255];
            note("option " +
                 (i >= 0 ? display_names(specs_[static_cast<size_t>(i)])
                         : std::string(1, static_cast<char>(optopt))) +
                 " needs a value (" + (i >= 0 ? specs_[static_cast<size_t>(i)].arg : "") + ")");
        } else if (c == '?') {
            if (optopt >= 256) {
                note("option " + display_names(specs_[static_cast<size_t>(optopt - 256)]) +
                     " takes no value");
            } else if (optopt != 0) {
                note(std::string("unknown option '-") + static_cast<char>(optopt) + "'");
            } else {
                // An unknown or ambiguous long option: getopt has stepped past it.
                std::string text = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
                text = text.substr(0, text.find('='));
                int matches = 0;
                std::string which;
                for (const option& o : longopts) {
                    if (o.name && std::strncmp(o.name, text.c_str() + 2, text.size() - 2) == 0) {
                        matches++;
                        which += std::string(which.empty() ? "" : ", ") + "--" + o.name;
                    }
                }
                if (matches > 1) {
                    note("option '" + text + "' is ambiguous (" + which + ")");
                } else {
                    note("unknown option '" + text + "'");
                }
            }
        } else {
            const int i = c >= 256 ? c - 256 : short_spec[c & 255];
            if (i < 0) continue;  // cannot happen: getopt returns declared characters only
            if (i == help_index) help_ = true;
            given_.push_back({i, optarg && specs_[static_cast<size_t>(i)].arg ? optarg : ""});
        }
    }
    for (int k = optind; k > 0 && k < argc; k++) positional_.emplace_back(argv[k]);  // after --
    if (!error_.empty()) error_ += std::string(" (see `ferry ") + command_ + " --help`)";
}

void Args::print_help(FILE* out) const {
    std::fputs(usage_, out);
    std::fputs("options:\n", out);
    for (const OptionSpec& s : specs_) {
        std::string left = "  ";
        // A long-only option lines up with the long names of the others.
        if (!s.names.empty() && !is_short_name(s.names.front())) left += "    ";
        left += display_names(s);
        if (s.arg) left += std::string(" ") + s.arg;
        constexpr size_t kColumn = 28;
        std::string text = s.help;
        if (left.size() + 2 > kColumn) {
            std::fprintf(out, "%s\n%*s", left.c_str(), static_cast<int>(kColumn), "");
        } else {
            std::fprintf(out, "%-*s", static_cast<int>(kColumn), left.c_str());
        }
        size_t at = 0;
        for (;;) {
            const size_t nl = text.find('\n', at);
            std::fprintf(out, "%s\n", text.substr(at, nl - at).c_str());
            if (nl == std::string::npos) break;
            std::fprintf(out, "%*s", static_cast<int>(kColumn), "");
            at = nl + 1;
        }
    }
}

int Args::spec_index(std::initializer_list<const char*> names) {
    int found = -1;
    for (const char* n : names) {
        int here = -1;
        for (size_t i = 0; i < specs_.size() && here < 0; i++) {
            for (const char* d : specs_[i].names) {
                if (std::strcmp(d, n) == 0) here = static_cast<int>(i);
            }
        }
        if (here < 0 || (found >= 0 && here != found)) {
            if (bug_.empty()) {
                bug_ = std::string("internal error: `ferry ") + command_ + "` reads option " + n +
                       " without declaring it (or with another option's names)";
            }
            return -1;
        }
        found = here;
    }
    return found;
}

bool Args::flag(std::initializer_list<const char*> names) {
    const int i = spec_index(names);
    for (const Given& g : given_) {
        if (g.spec == i) return true;
    }
    return false;
}

std::vector<std::string> Args::values(std::initializer_list<const char*> names) {
    const int i = spec_index(names);
    std::vector<std::string> out;
    for (const Given& g : given_) {
        if (g.spec == i) out.push_back(g.value);
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
    errno = 0;
    double x = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0' || errno != 0) {
        if (error_.empty())
            error_ = std::string("option ") + *names.begin() + ": '" + *v + "' is not a number";
        return std::nullopt;
    }
    return x;
}

std::vector<std::string> Args::positional() {
    positional_read_ = true;
    return positional_;
}

Status Args::finish() {
    if (!bug_.empty()) return Status::error(bug_);
    if (!error_.empty()) return Status::error(error_);
    if (!positional_read_ && !positional_.empty()) {
        return Status::errorf("unexpected argument '%s' (see `ferry %s --help`)",
                              positional_.front().c_str(), command_);
    }
    return Status::ok();
}

int fail(const char* cmd, const std::string& message) {
    std::fprintf(stderr, "ferry %s: %s\n", cmd, message.c_str());
    return 1;
}

}  // namespace ferry::cli
