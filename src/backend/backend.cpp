#include "ferry/backend.h"

#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>

namespace ferry {

const char* device_type_name(DeviceType t) {
    switch (t) {
        case DeviceType::CPU:
            return "CPU";
        case DeviceType::GPU:
            return "GPU";
        case DeviceType::ACCEL:
            return "ACCEL";
        case DeviceType::REMOTE:
            return "REMOTE";
    }
    return "?";
}

Status Buffer::check_range(const Tensor* t, size_t offset, size_t size) const {
    if (t->buffer != this) return Status::errorf("tensor '%s' is not in this buffer", t->name);
    size_t end = 0;
    if (__builtin_add_overflow(t->offs, offset, &end) || __builtin_add_overflow(end, size, &end) ||
        end > this->size()) {
        return Status::errorf("tensor '%s': range [%zu, +%zu) past its buffer of %zu bytes",
                              t->name, offset, size, this->size());
    }
    return Status::ok();
}

Status Backend::set_tensor_async(Tensor* t, const void* src, size_t offset, size_t size) {
    if (!t->buffer) return Status::errorf("tensor '%s' has no buffer", t->name);
    return t->buffer->set_tensor(t, src, offset, size);
}

Status Backend::set_tensors_async(std::span<const TensorWrite> writes) {
    for (const TensorWrite& w : writes) FERRY_TRY(set_tensor_async(w.t, w.src, w.offset, w.size));
    return Status::ok();
}

Status Backend::get_tensor_async(const Tensor* t, void* dst, size_t offset, size_t size) {
    if (!t->buffer) return Status::errorf("tensor '%s' has no buffer", t->name);
    return t->buffer->get_tensor(t, dst, offset, size);
}

namespace {

std::mutex g_reg_mutex;
std::vector<std::unique_ptr<Registry>>& regs() {
    static std::vector<std::unique_ptr<Registry>> r;
    return r;
}

}  // namespace

void register_registry(std::unique_ptr<Registry> reg) {
    std::lock_guard<std::mutex> lock(g_reg_mutex);
    regs().push_back(std::move(reg));
}

std::vector<Registry*> registries() {
    std::lock_guard<std::mutex> lock(g_reg_mutex);
    std::vector<Registry*> out;
    for (auto& r : regs()) out.push_back(r.get());
    return out;
}

std::vector<Device*> all_devices() {
    std::vector<Device*> out;
    for (Registry* r : registries()) {
        for (Device* d : r->devices()) out.push_back(d);
    }
    return out;
}

Device* find_device(const std::string& name) {
    for (Device* d : all_devices()) {
        if (name == d->name()) return d;
    }
    return nullptr;
}

DeviceMemory host_memory() {
    std::ifstream f("/proc/meminfo");
    DeviceMemory m;
    std::string key, unit;
    size_t kib = 0;
    while (f >> key >> kib >> unit) {
        if (key == "MemAvailable:") m.free = kib * 1024;
        if (key == "MemTotal:") m.total = kib * 1024;
    }
    return m;
}

Device* cpu_device() {
    // Registries are only ever added, so the first CPU device found stays the answer.
    static std::atomic<Device*> cpu{nullptr};
    if (Device* d = cpu.load(std::memory_order_acquire)) return d;
    for (Device* d : all_devices()) {
        if (d->type() == DeviceType::CPU) {
            cpu.store(d, std::memory_order_release);
            return d;
        }
    }
    return nullptr;
}

Status tensor_set(Tensor* t, const void* src, size_t size) {
    if (!t->buffer) return Status::errorf("tensor %s has no storage", describe(t).c_str());
    if (size != t->nbytes()) {
        return Status::errorf("tensor %s holds %zu bytes, %zu given", describe(t).c_str(),
                              t->nbytes(), size);
    }
    return t->buffer->set_tensor(t, src, 0, size);
}

Status tensor_get(const Tensor* t, void* dst, size_t size) {
    if (!t->buffer) return Status::errorf("tensor %s has no storage", describe(t).c_str());
    if (size != t->nbytes()) {
        return Status::errorf("tensor %s holds %zu bytes, %zu asked for", describe(t).c_str(),
                              t->nbytes(), size);
    }
    return t->buffer->get_tensor(t, dst, 0, size);
}

}  // namespace ferry
