// What a producer publishes and a consumer receives: a flat list of leaves
// (tensors with dim 0 = samples, or per-sample value lists) plus an opaque
// layout string that the Python package uses to rebuild the user's structure.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "batchcast/common/items.h"
#include "batchcast/tensor/tensor.h"

namespace batchcast {

using Leaf = std::variant<Tensor, Items>;

struct Batch {
  int64_t epoch = 0;
  int64_t samples = 0;
  std::string layout;
  std::vector<Leaf> leaves;
  // Which samples these are. Published: each sample's index in the loader's
  // dataset where the producer knows it, else empty. Received: each sample's
  // identity, its dataset index where the producer sent them (`indexed`),
  // else its position in the producer's epoch.
  std::vector<int64_t> indices;
  bool indexed = false;
};

}  // namespace batchcast
