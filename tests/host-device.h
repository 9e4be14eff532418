// A test device that is not the CPU (so a model's weights are uploaded into its buffers, not
// mapped, and a schedule has two backends) but runs the CPU kernels on host memory; a subclass
// may look at every graph before it runs (seen).
#pragma once

#include <memory>
#include <string>

#include "backends/cpu/cpu-backend.h"
#include "ferry/backend.h"

namespace ferry::test {

class HostKernelDevice : public Device {
  public:
    explicit HostKernelDevice(std::string name) : name_(std::move(name)) {}
    const char* name() const override { return name_.c_str(); }
    std::string description() const override { return "test device"; }
    DeviceType type() const override { return DeviceType::GPU; }
    DeviceMemory memory() const override { return cpu_device()->memory(); }
    DeviceCaps caps() const override { return {}; }
    BufferType* buffer_type() override { return cpu::host_buffer_type(); }
    bool supports_op(const Tensor* node) override { return cpu_device()->supports_op(node); }
    bool supports_buffer_type(const BufferType* t) override { return t->is_host(); }
    Expected<std::unique_ptr<Backend>> make_backend(const BackendOptions& = {}) override {
        return std::unique_ptr<Backend>(new Stream(this));
    }

  protected:
    virtual void seen(const Graph& g) { (void)g; }

  private:
    class Stream : public Backend {
      public:
        explicit Stream(HostKernelDevice* d) : dev_(d), cpu_(cpu::make_cpu_backend(2)) {}
        const char* name() const override { return dev_->name(); }
        Device* device() const override { return dev_; }
        Status compute(Graph& g) override {
            dev_->seen(g);
            return cpu_->compute(g);
        }
        void set_n_threads(int n) override { cpu_->set_n_threads(n); }

      private:
        HostKernelDevice* dev_;
        std::unique_ptr<Backend> cpu_;
    };
    std::string name_;
};

}  // namespace ferry::test
