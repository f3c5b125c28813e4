// For programs that build against full LibTorch (at::Tensor, torch::nn):
// batchcast's tensors (torch::stable::Tensor) as at::Tensor and back, sharing
// the same tensor (no copy). batchcast itself never includes this header: its
// library uses the stable ABI only. A program that includes it is tied to the
// torch release it is compiled against, as any LibTorch program is.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include "batchcast/tensor/tensor.h"

namespace batchcast {

inline at::Tensor to_aten(const Tensor& tensor) {
  return *torch::aot_inductor::tensor_handle_to_tensor_pointer(tensor.get());
}

inline Tensor from_aten(at::Tensor tensor) {
  return Tensor(torch::aot_inductor::new_tensor_handle(std::move(tensor)));
}

}  // namespace batchcast
