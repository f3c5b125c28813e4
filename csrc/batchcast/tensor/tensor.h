// Tensors in the core: torch's stable ABI (torch::stable::Tensor over the C
// shim), so that one build of batchcast runs with every torch release from
// the floor it is compiled for (TORCH_TARGET_VERSION, set in CMakeLists.txt)
// on. Nothing here may use at::/c10:: API outside torch/headeronly: the build
// fails if it does. What the stable API lacks is written here, small: the
// join of pieces along dim 0, the serial strided copy into host memory, the
// current CUDA stream and whether this torch has CUDA, dtype names.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/DeviceType.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace batchcast {

using Tensor = torch::stable::Tensor;
using Device = torch::stable::Device;
using ScalarType = torch::headeronly::ScalarType;
using DeviceType = torch::headeronly::DeviceType;

inline Device cpu_device() { return Device(DeviceType::CPU); }
inline Device cuda_device(int index) { return Device(DeviceType::CUDA, static_cast<int32_t>(index)); }
// "cpu", "cuda:1".
std::string device_text(const Device& device);

std::vector<int64_t> shape_of(const Tensor& t);
// The strides (in elements) of a contiguous tensor of this shape.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);
// The same, written to strides[0, ndim).
void contiguous_strides(const int64_t* shape, std::size_t ndim, int64_t* strides);
uint64_t nbytes(const Tensor& t);
// Its memory is exactly its values, back to back: its bytes can be copied as
// they are. (Tensors reach the core through DLPack, which carries no lazy
// conjugate or negative bit: the binding resolves those first.)
bool plain_bytes(const Tensor& t);

// A contiguous tensor over memory torch does not own. `release` runs once,
// when torch frees the tensor's storage, on whatever thread drops the last
// reference (never needing Python's GIL).
Tensor wrap(void* data, const std::vector<int64_t>& shape, ScalarType dtype, const Device& device,
            std::function<void()> release);
// The same with the strides (in elements) given.
Tensor wrap_strided(void* data, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                    ScalarType dtype, const Device& device, std::function<void()> release);
// A contiguous tensor borrowing memory that the caller keeps alive while it is used.
Tensor borrow(void* data, const std::vector<int64_t>& shape, ScalarType dtype, const Device& device);

Tensor empty(const std::vector<int64_t>& shape, ScalarType dtype, const Device& device);
Tensor full(const std::vector<int64_t>& shape, double value, ScalarType dtype, const Device& device);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
// dst.copy_(src) (across devices: on the current stream).
void copy_into(Tensor& dst, const Tensor& src);
// A contiguous copy on the same device.
Tensor clone(const Tensor& t);
// A copy on `device` (blocking for the host).
Tensor copy_to(const Tensor& t, const Device& device);
// The pieces, one after another along dim 0, in one new tensor on their device.
Tensor cat_rows(const std::vector<Tensor>& pieces);
// Writes t's elements, row-major, at `dst` (host memory of nbytes(t) bytes),
// in the calling thread: one memcpy for a contiguous CPU tensor, a strided
// walk for another CPU tensor, torch's copy for one on a GPU. torch's
// parallel copy would hand the work to OpenMP threads that then spin for
// milliseconds after every batch, taking the CPUs the loader's workers need.
void copy_to_host(std::byte* dst, const Tensor& t);

// "float32", "int64", ... as torch names them.
std::string dtype_name(ScalarType dtype);

// Whether the torch in this process is a CUDA build (libtorch_cuda is loaded).
bool torch_has_cuda();
// torch's current CUDA stream of `device` (a cudaStream_t); throws
// CudaError without a CUDA build of torch.
void* current_cuda_stream(int device);

}  // namespace batchcast
