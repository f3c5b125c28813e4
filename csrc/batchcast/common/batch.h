// What a producer publishes and a consumer receives: a flat list of leaves
// (tensors with dim 0 = samples, or per-sample value lists) plus an opaque
// layout string that the Python package uses to rebuild the user's structure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "batchcast/common/items.h"
#include "batchcast/tensor/tensor.h"

namespace batchcast {

// A leaf that is a view of the producer's shared ring, described rather than
// made a tensor: contiguous memory at `data` on `device`. `keep` holds the
// ring slots it spans: they are not reused while it, or a tensor made of it,
// lives. A binding hands it to its language's tensors directly (DLPack),
// without a tensor in between; to_tensor() makes it the core's tensor.
struct RingView {
  void* data = nullptr;
  std::vector<int64_t> shape;
  ScalarType dtype = ScalarType::Byte;
  Device device = cpu_device();
  std::shared_ptr<const void> keep;
};

// The tensor over the view's memory; the slots go back when torch frees it.
inline Tensor to_tensor(RingView view) {
  return wrap(view.data, view.shape, view.dtype, view.device, [keep = std::move(view.keep)] {});
}

template <typename LeafType>
struct BatchOf {
  int64_t epoch = 0;
  int64_t samples = 0;
  std::string layout;
  std::vector<LeafType> leaves;
  // Which samples these are. Published: each sample's index in the loader's
  // dataset where the producer knows it, else empty. Received: each sample's
  // identity, its dataset index where the producer sent them (`indexed`),
  // else its position in the producer's epoch; empty from
  // Consumer::next_views(false), which does not compose them.
  std::vector<int64_t> indices;
  bool indexed = false;
};

using Leaf = std::variant<Tensor, Items>;
using Batch = BatchOf<Leaf>;

// A received batch whose views of the ring are still descriptions
// (Consumer::next_views(), for bindings).
using ViewLeaf = std::variant<Tensor, Items, RingView>;
using ViewBatch = BatchOf<ViewLeaf>;

// Its views made tensors.
inline Batch materialize(ViewBatch batch) {
  Batch out{batch.epoch, batch.samples, std::move(batch.layout), {}, std::move(batch.indices), batch.indexed};
  out.leaves.reserve(batch.leaves.size());
  for (ViewLeaf& leaf : batch.leaves) {
    if (auto* view = std::get_if<RingView>(&leaf)) {
      out.leaves.emplace_back(to_tensor(std::move(*view)));
    } else if (auto* tensor = std::get_if<Tensor>(&leaf)) {
      out.leaves.emplace_back(std::move(*tensor));
    } else {
      out.leaves.emplace_back(std::move(std::get<Items>(leaf)));
    }
  }
  return out;
}

}  // namespace batchcast
