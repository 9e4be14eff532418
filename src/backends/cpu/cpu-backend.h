// The CPU backend: host buffers, a thread pool, and the dispatch over CPU kernels.
#pragma once

#include <map>
#include <memory>

#include "backends/cpu/simd/simd.h"
#include "ferry/backend.h"

namespace ferry::cpu {

// A host buffer: owns aligned memory, or wraps caller memory (buffer_from_host_ptr).
//
// Weights in it may be repacked in place (CpuDevice::prepare_weights, see simd.h's repacked
// layout): the buffer records each repacked tensor (its bytes: the full groups of 8 rows), so
// that the kernels know the layout and every other reader still sees the GGUF bytes: get_tensor
// and copy_tensor unpack, and a write (set_tensor, memset_tensor, copy_tensor into it, clear)
// that touches a repacked tensor first puts it back into the GGUF layout and forgets it.
class HostBuffer : public Buffer {
  public:
    struct Repacked {
        const simd::RepackedKernels* rk;
        int64_t n;     // elements per row
        int64_t rows;  // rows of the tensor (the last rows % 8 keep the GGUF layout)
        size_t bytes;  // bytes repacked: (rows / 8) groups
        // Rows in repacked groups; the rows from here on are GGUF rows.
        int64_t grouped_rows() const { return rows / simd::kRepackRows * simd::kRepackRows; }
        // Writes row r < grouped_rows() in the GGUF layout; mat: the weight's first byte, nb1
        // its GGUF row stride (a group starts at its first row's offset).
        void unpack_row(const uint8_t* mat, size_t nb1, int64_t r, void* out) const {
            const int64_t g0 = r / simd::kRepackRows * simd::kRepackRows;
            rk->unpack_row(mat + static_cast<size_t>(g0) * nb1, n, static_cast<int>(r - g0), out);
        }
    };
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

    // Repacks tensor t (a contiguous matrix of at least 8 rows in this buffer, of rk's type)
    // in place; *done tells whether it did (false: caller memory that cannot be written).
    Status repack(Tensor* t, const simd::RepackedKernels* rk, bool* done);
    // The record of t when t is exactly a repacked tensor (same start, type and shape), else
    // nullptr; *partial (may be null) is set when t overlaps repacked bytes otherwise (a view
    // into a repacked weight, which no kernel reads).
    const Repacked* repacked(const Tensor* t, bool* partial) const;

  private:
    // Puts every repacked tensor overlapping bytes [begin, end) back into the GGUF layout.
    void restore(size_t begin, size_t end);
    // dst[0, end - begin) = GGUF bytes [begin, end) (dst holds the raw bytes already).
    void unpack_range(size_t begin, size_t end, uint8_t* dst) const;
    BufferType* type_;
    void* base_;
    size_t size_;
    Owner owner_;
    size_t map_len_;
    std::map<size_t, Repacked> repacked_;  // by offset
};

// The repacked record of t when t lives in a host buffer and is exactly a repacked tensor;
// nullptr otherwise. *partial as for HostBuffer::repacked.
const HostBuffer::Repacked* repacked_weight(const Tensor* t, bool* partial = nullptr);

// Host memory buffer type (64-byte aligned). Shared by every device that can read host memory.
BufferType* host_buffer_type();

// Creates a CPU backend with n_threads threads (<= 0: the number of cores).
std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace ferry::cpu
