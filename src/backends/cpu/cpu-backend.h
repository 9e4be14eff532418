// The CPU backend: host buffers, a thread pool, and the dispatch over CPU kernels.
#pragma once

#include <memory>

#include "ferry/backend.h"

namespace ferry::cpu {

// A host buffer: owns aligned memory, or wraps caller memory (buffer_from_host_ptr).
class HostBuffer : public Buffer {
  public:
    // How the memory is released when the buffer goes: not at all (caller memory), free(),
    // or munmap() of map_len bytes.
    enum class Owner { None, Malloc, Mmap };
    HostBuffer(BufferType* type, void* base, size_t size, Owner owner, size_t map_len = 0);
    ~HostBuffer() override;
    BufferType* type() const override { return type_; }
    size_t size() const override { return size_; }
    void* base() const override { return base_; }
    Status set_tensor(Tensor* t, const void* src, size_t offset, size_t size) override;
    Status get_tensor(const Tensor* t, void* dst, size_t offset, size_t size) override;
    Status memset_tensor(Tensor* t, uint8_t value, size_t offset, size_t size) override;
    bool copy_tensor(const Tensor* src, Tensor* dst) override;
    Status clear(uint8_t value) override;

  private:
    Status check_range(const Tensor* t, size_t offset, size_t size) const;
    BufferType* type_;
    void* base_;
    size_t size_;
    Owner owner_;
    size_t map_len_;
};

// Host memory buffer type (64-byte aligned). Shared by every device that can read host memory.
BufferType* host_buffer_type();

// Creates a CPU backend with n_threads threads (<= 0: the number of cores).
std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace ferry::cpu
