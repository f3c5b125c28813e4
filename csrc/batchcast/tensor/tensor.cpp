#include "batchcast/tensor/tensor.h"

#include <dlfcn.h>

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "batchcast/common/error.h"

namespace batchcast {

void contiguous_strides(const int64_t* shape, std::size_t ndim, int64_t* strides) {
  int64_t stride = 1;
  for (std::size_t d = ndim; d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
  }
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  contiguous_strides(shape.data(), shape.size(), strides.data());
  return strides;
}

namespace {

// Copies `count` elements of `size` bytes, `stride` elements apart, to `dst` back to back.
void gather(std::byte* dst, const std::byte* src, int64_t count, int64_t stride, std::size_t size) {
  const std::size_t step = static_cast<std::size_t>(stride) * size;
  switch (size) {  // fixed sizes: one load and store each
    case 1:
      for (int64_t i = 0; i < count; ++i, src += step) std::memcpy(dst + i, src, 1);
      return;
    case 2:
      for (int64_t i = 0; i < count; ++i, src += step) std::memcpy(dst + 2 * i, src, 2);
      return;
    case 4:
      for (int64_t i = 0; i < count; ++i, src += step) std::memcpy(dst + 4 * i, src, 4);
      return;
    case 8:
      for (int64_t i = 0; i < count; ++i, src += step) std::memcpy(dst + 8 * i, src, 8);
      return;
    default:
      for (int64_t i = 0; i < count; ++i, src += step) std::memcpy(dst + size * i, src, size);
  }
}

// aoti_torch_get_current_cuda_stream(device_index, &stream), from
// libtorch_cuda when this process has it: a CPU build of torch has none, and
// batchcast links none, so one binary serves both.
using CurrentStream = int32_t (*)(int32_t, void**);

CurrentStream current_stream_function() {
  static const CurrentStream function = [] {
    void* symbol = nullptr;
    if (void* library = ::dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD)) {
      symbol = ::dlsym(library, "aoti_torch_get_current_cuda_stream");
    }
    if (symbol == nullptr) symbol = ::dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
    return reinterpret_cast<CurrentStream>(symbol);
  }();
  return function;
}

}  // namespace

std::string device_text(const Device& device) {
  if (device.is_cpu()) return "cpu";
  if (device.is_cuda()) return "cuda:" + std::to_string(device.index());
  return "device type " + std::to_string(static_cast<int>(device.type()));
}

std::vector<int64_t> shape_of(const Tensor& t) {
  const auto sizes = t.sizes();
  return std::vector<int64_t>(sizes.begin(), sizes.end());
}

uint64_t nbytes(const Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

bool plain_bytes(const Tensor& t) { return t.is_contiguous(); }

Tensor wrap(void* data, const std::vector<int64_t>& shape, ScalarType dtype, const Device& device,
            std::function<void()> release) {
  return torch::stable::from_blob(data, shape, contiguous_strides(shape), device, dtype,
                                  [release = std::move(release)](void*) { release(); });
}

Tensor wrap_strided(void* data, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                    ScalarType dtype, const Device& device, std::function<void()> release) {
  return torch::stable::from_blob(data, shape, strides, device, dtype,
                                  [release = std::move(release)](void*) { release(); });
}

Tensor borrow(void* data, const std::vector<int64_t>& shape, ScalarType dtype, const Device& device) {
  return torch::stable::from_blob(data, shape, contiguous_strides(shape), device, dtype);
}

Tensor empty(const std::vector<int64_t>& shape, ScalarType dtype, const Device& device) {
  return torch::stable::empty(shape, dtype, std::nullopt, device);
}

Tensor full(const std::vector<int64_t>& shape, double value, ScalarType dtype, const Device& device) {
  return torch::stable::full(shape, value, dtype, std::nullopt, device);
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  Tensor self = t;  // the stable narrow takes a non-const reference; it only reads it
  return torch::stable::narrow(self, dim, start, length);
}

void copy_into(Tensor& dst, const Tensor& src) { torch::stable::copy_(dst, src); }

Tensor clone(const Tensor& t) {
  if (t.is_cpu()) {
    Tensor out = empty(shape_of(t), t.scalar_type(), cpu_device());
    copy_to_host(static_cast<std::byte*>(out.data_ptr()), t);
    return out;
  }
  return torch::stable::contiguous(torch::stable::clone(t));
}

Tensor copy_to(const Tensor& t, const Device& device) {
  return torch::stable::to(t, device, /*non_blocking=*/false, /*copy=*/true);
}

Tensor cat_rows(const std::vector<Tensor>& pieces) {
  if (pieces.empty()) throw InvalidArgument("cat_rows: no pieces");
  std::vector<int64_t> shape = shape_of(pieces.front());
  shape[0] = 0;
  for (const Tensor& p : pieces) shape[0] += p.size(0);
  const Device device = pieces.front().device();
  Tensor out = empty(shape, pieces.front().scalar_type(), device);
  if (device.is_cpu()) {  // in this thread, as copy_to_host
    auto* at = static_cast<std::byte*>(out.data_ptr());
    for (const Tensor& p : pieces) {
      copy_to_host(at, p);
      at += nbytes(p);
    }
    return out;
  }
  int64_t row = 0;
  for (const Tensor& p : pieces) {
    Tensor rows = narrow(out, 0, row, p.size(0));
    copy_into(rows, p);
    row += p.size(0);
  }
  return out;
}

void copy_to_host(std::byte* dst, const Tensor& t) {
  const uint64_t bytes = nbytes(t);
  if (bytes == 0) return;
  if (!t.is_cpu()) {  // torch copies it to the host (waiting for it)
    Tensor out = borrow(dst, shape_of(t), t.scalar_type(), cpu_device());
    copy_into(out, t);
    return;
  }
  const auto* src = static_cast<const std::byte*>(t.data_ptr());
  if (plain_bytes(t)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Strided: the innermost dimensions that are laid out as one block are
  // copied as one run; an odometer walks the others.
  const std::size_t size = t.element_size();
  const std::vector<int64_t> shape = shape_of(t);
  const auto strides_ref = t.strides();
  const std::vector<int64_t> strides(strides_ref.begin(), strides_ref.end());
  int inner = static_cast<int>(shape.size()) - 1;
  int64_t run = 1;  // elements per run
  while (inner >= 0 && (shape[inner] == 1 || strides[inner] == run)) run *= shape[inner--];
  // [0, inner] are walked; when the innermost of them has a stride, its
  // elements are gathered one by one (run == 1) or block by block.
  std::vector<int64_t> index(static_cast<std::size_t>(std::max(inner + 1, 0)), 0);
  const std::size_t run_bytes = static_cast<std::size_t>(run) * size;
  const int64_t outer_count = inner >= 0 ? shape[inner] : 1;
  while (true) {
    const std::byte* from = src;
    for (int d = 0; d < inner; ++d) from += static_cast<std::size_t>(index[d] * strides[d]) * size;
    if (inner < 0) {
      std::memcpy(dst, from, run_bytes);
      return;
    }
    if (run == 1) {
      gather(dst, from, outer_count, strides[inner], size);
      dst += static_cast<std::size_t>(outer_count) * size;
    } else {
      for (int64_t i = 0; i < outer_count; ++i) {
        std::memcpy(dst, from + static_cast<std::size_t>(i * strides[inner]) * size, run_bytes);
        dst += run_bytes;
      }
    }
    int d = inner - 1;
    while (d >= 0 && ++index[d] == shape[d]) index[d--] = 0;
    if (d < 0) return;
  }
}

std::string dtype_name(ScalarType dtype) { return torch::headeronly::toString(dtype); }

bool torch_has_cuda() { return current_stream_function() != nullptr; }

void* current_cuda_stream(int device) {
  const CurrentStream function = current_stream_function();
  if (function == nullptr) {
    throw CudaError("the torch in this process has no CUDA support; install a CUDA build of torch here");
  }
  void* stream = nullptr;
  if (function(static_cast<int32_t>(device), &stream) != 0) {
    throw CudaError("torch could not give its current CUDA stream of device " + std::to_string(device));
  }
  return stream;
}

}  // namespace batchcast
