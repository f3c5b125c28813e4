// What a producer publishes and a consumer receives: a flat list of leaves
// (tensors with dim 0 = samples, or per-sample value lists) plus an opaque
// layout string that the Python package uses to rebuild the user's structure.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "batchcast/protocol/message.h"

namespace batchcast {

using protocol::ListKind;

struct Items {
  ListKind kind = ListKind::Text;
  std::vector<std::string> values;
};

using Leaf = std::variant<at::Tensor, Items>;

struct Batch {
  int64_t epoch = 0;
  int64_t samples = 0;
  std::string layout;
  std::vector<Leaf> leaves;
};

// Wire dtype <-> torch dtype. Throws InvalidArgument for dtypes batchcast cannot share.
protocol::DType to_wire(c10::ScalarType type);
c10::ScalarType from_wire(protocol::DType type);

}  // namespace batchcast
