// Flags shared by the commands that load a model: --remote, --device, --kv-type.
#include <cmath>
#include <cstdlib>

#include "cli.h"
#include "embedded-model.h"
#include "ferry/backend.h"
#include "ferry/gguf.h"
#include "ferry/remote.h"

namespace ferry::cli {

Expected<Device*> pick_device(const std::vector<std::string>& remotes,
                              const std::optional<std::string>& device_name) {
    for (const std::string& addr : remotes) {
        FERRY_TRY(remote_connect(addr).context("--remote " + addr));
    }
    if (device_name) {
        Device* d = find_device(*device_name);
        if (!d) return Status::errorf("--device: no device named '%s'", device_name->c_str());
        return d;
    }
    if (remotes.empty()) return static_cast<Device*>(nullptr);
    const std::string prefix = remotes.front() + "/";
    for (Device* d : all_devices()) {
        if (std::string(d->name()).rfind(prefix, 0) == 0) return d;
    }
    return Status::errorf("--remote %s: the server lists no devices", remotes.front().c_str());
}

std::vector<OptionSpec> placement_options() {
    return {
        {{"--remote"},
         "ADDR",
         "connect to a `ferry serve` (unix:PATH or tcp:HOST:PORT) and put\n"
         "the weights on its first device (repeatable)"},
        {{"-d", "--device"},
         "NAME[,NAME...]",
         "offload layers to these devices (see `ferry devices`); several\n"
         "split the layers between them (--tensor-split)"},
        {{"--n-gpu-layers", "-ngl"},
         "N",
         "layers to offload to the devices, the last N (default: all);\n"
         "the others run on the CPU"},
        {{"--tensor-split", "-ts"}, "A,B,...", "share of the offloaded layers per device"},
        {{"--cache-dir"},
         "DIR",
         "graph compilers (OPENVINO:*): keep compiled models in DIR, so\n"
         "a second start loads them instead of compiling"},
    };
}

std::vector<OptionSpec> with_placement(std::vector<OptionSpec> own) {
    for (OptionSpec& o : placement_options()) own.push_back(std::move(o));
    return own;
}

Placement read_placement(Args& args) {
    Placement p;
    p.remotes = args.values({"--remote"});
    p.devices = args.value({"-d", "--device"});
    p.n_gpu_layers = args.integer({"--n-gpu-layers"});
    p.tensor_split = args.value({"--tensor-split"});
    p.cache_dir = args.value({"--cache-dir"}).value_or("");
    return p;
}

Status apply_placement(const Placement& p, ModelOptions* mo) {
    const std::vector<std::string>& remotes = p.remotes;
    const std::optional<std::string>& names = p.devices;
    const std::optional<long long>& ngl = p.n_gpu_layers;
    const std::optional<std::string>& split = p.tensor_split;
    for (const std::string& addr : remotes) {
        FERRY_TRY(remote_connect(addr).context("--remote " + addr));
    }
    mo->devices.clear();
    if (names) {
        size_t at = 0;
        while (at <= names->size()) {
            const size_t comma = std::min(names->find(',', at), names->size());
            const std::string name = names->substr(at, comma - at);
            Device* d = find_device(name);
            if (!d) return Status::errorf("--device: no device named '%s'", name.c_str());
            // The CPU is where layers stay, not a device to offload to.
            if (d->type() != DeviceType::CPU || names->find(',') != std::string::npos)
                mo->devices.push_back(d);
            at = comma + 1;
        }
    } else if (!remotes.empty()) {
        Expected<Device*> d = pick_device(remotes, std::nullopt);
        if (!d) return d.status();
        if (*d) mo->devices.push_back(*d);
    }
    if (ngl) {
        if (*ngl < -1 || *ngl > (1 << 20)) {
            return Status::errorf("--n-gpu-layers: %lld is not a layer count (-1: all)", *ngl);
        }
        mo->n_gpu_layers = static_cast<int32_t>(*ngl);
    }
    if (split) {
        size_t at = 0;
        while (at <= split->size()) {
            const size_t comma = std::min(split->find(',', at), split->size());
            const std::string item = split->substr(at, comma - at);
            char* end = nullptr;
            const double v = std::strtod(item.c_str(), &end);
            if (item.empty() || *end != '\0' || !(v >= 0) || !std::isfinite(v)) {
                return Status::errorf("--tensor-split: '%s' is not a non-negative number",
                                      item.c_str());
            }
            mo->tensor_split.push_back(static_cast<float>(v));
            at = comma + 1;
        }
        if (mo->tensor_split.size() != mo->devices.size()) {
            return Status::errorf("--tensor-split: %zu shares for %zu devices (--device)",
                                  mo->tensor_split.size(), mo->devices.size());
        }
    }
    return Status::ok();
}

Expected<Type> parse_kv_type(const std::optional<std::string>& s) {
    if (!s) return Type::F16;
    Expected<Type> t = type_from_name(s->c_str());
    if (!t || (*t != Type::F16 && *t != Type::F32 && *t != Type::BF16)) {
        return Status::errorf("--kv-type: '%s' is not one of f16, f32, bf16", s->c_str());
    }
    return t;
}

Expected<std::unique_ptr<LlamaModel>> load_model(const std::string& path,
                                                 const ModelOptions& opts) {
    const EmbeddedModel demo = embedded_demo_model();
    if (path != demo.name) return LlamaModel::load(path, opts);
    Expected<std::unique_ptr<GgufFile>> f = GgufFile::from_memory(demo.data, demo.size, demo.name);
    if (!f) return f.status();
    return LlamaModel::load(std::move(*f), opts);
}

}  // namespace ferry::cli
