// Flags shared by the commands that load a model: --remote, --device, --kv-type.
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
