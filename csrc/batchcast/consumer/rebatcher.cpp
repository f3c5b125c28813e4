#include "batchcast/consumer/rebatcher.h"

#include <ATen/ATen.h>

#include <sstream>

#include "batchcast/common/error.h"
#include "batchcast/protocol/dtype.h"

namespace batchcast {
namespace {

using protocol::from_wire;

struct Piece {
  const LoaderBatch* batch;
  int64_t start;
  int64_t count;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (std::size_t i = 1; i < shape.size(); ++i) s << (i > 1 ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

}  // namespace

Rebatcher::Rebatcher(std::optional<int64_t> batch_size, bool drop_last)
    : batch_size_(batch_size), drop_last_(drop_last) {
  if (batch_size_ && *batch_size_ <= 0) throw InvalidArgument("batch_size must be a positive int");
}

std::vector<uint64_t> Rebatcher::pending_slots() const {
  std::vector<uint64_t> out;
  for (const LoaderBatch& b : pending_) {
    if (!b.spilled()) out.push_back(b.token->seq());
  }
  return out;
}

void Rebatcher::push(LoaderBatch batch) {
  if (batch.announcement.samples == 0) return;  // nothing to hand out; token releases now
  buffered_ += batch.announcement.samples;
  pending_.push_back(std::move(batch));
  if (batch_size_ && buffered_ < *batch_size_) {
    int64_t in_ring = 0;
    for (const LoaderBatch& b : pending_) in_ring += b.spilled() ? 0 : 1;
    if (in_ring > max_pending_) spill();
  }
}

void Rebatcher::spill() {
  for (std::size_t k = 0; k < pending_.size(); ++k) {
    LoaderBatch& b = pending_[k];
    if (b.spilled()) continue;
    const int64_t used = k == 0 ? front_used_ : 0;
    const int64_t left = b.announcement.samples - used;
    LoaderBatch copy;
    copy.announcement = b.announcement;
    copy.announcement.samples = left;
    for (std::size_t j = 0; j < b.announcement.leaves.size(); ++j) {
      if (const auto* t = std::get_if<protocol::TensorLeaf>(&b.announcement.leaves[j])) {
        std::vector<int64_t> shape = t->shape;
        uint64_t row = t->nbytes() / static_cast<uint64_t>(std::max<int64_t>(shape[0], 1));
        shape[0] = left;
        auto options = at::TensorOptions().dtype(from_wire(t->dtype)).device(b.device);
        auto* at_row = const_cast<std::byte*>(b.base + t->offset + static_cast<uint64_t>(used) * row);
        copy.owned.push_back(at::from_blob(at_row, shape, [](void*) {}, options, b.device).clone());
        std::get<protocol::TensorLeaf>(copy.announcement.leaves[j]).shape[0] = left;
      } else {
        auto& items = std::get<protocol::ListLeaf>(copy.announcement.leaves[j]).items;
        items.erase(items.begin(), items.begin() + used);
        copy.owned.emplace_back();  // keeps leaf indices aligned
      }
    }
    copy.device = b.device;
    b = std::move(copy);  // without the token: the slot can be released
    if (k == 0) front_used_ = 0;
  }
  stats_.spills += 1;
}

std::optional<Batch> Rebatcher::pop() {
  if (!batch_size_) {  // forward: one loader batch, whole
    if (pending_.empty()) return std::nullopt;
    return take(pending_.front().announcement.samples - front_used_);
  }
  if (buffered_ < *batch_size_) return std::nullopt;
  return take(*batch_size_);
}

std::optional<Batch> Rebatcher::flush() {
  std::optional<Batch> out;
  if (buffered_ > 0 && !drop_last_) out = take(buffered_);
  clear();
  return out;
}

void Rebatcher::clear() {
  pending_.clear();
  front_used_ = 0;
  buffered_ = 0;
}

Batch Rebatcher::take(int64_t n) {
  std::vector<Piece> pieces;
  int64_t need = n;
  int64_t used = front_used_;
  for (const LoaderBatch& b : pending_) {
    int64_t count = std::min(need, b.announcement.samples - used);
    pieces.push_back(Piece{&b, used, count});
    need -= count;
    used = 0;
    if (need == 0) break;
  }

  last_slots_.clear();
  for (const Piece& p : pieces) {
    if (!p.batch->spilled()) last_slots_.push_back(p.batch->token->seq());
  }
  const protocol::Announcement& first = pieces.front().batch->announcement;
  Batch out;
  out.epoch = first.epoch;
  out.samples = n;
  out.layout = first.layout;
  for (std::size_t j = 0; j < first.leaves.size(); ++j) {
    for (const Piece& p : pieces) {
      const auto& leaves = p.batch->announcement.leaves;
      if (leaves.size() != first.leaves.size() || leaves[j].index() != first.leaves[j].index()) {
        throw RebatchError("loader batch " + std::to_string(p.batch->announcement.index) +
                           " has a different structure from loader batch " +
                           std::to_string(first.index) + "; a loader must yield one structure");
      }
    }
    if (const auto* t0 = std::get_if<protocol::TensorLeaf>(&first.leaves[j])) {
      const uint64_t elem = protocol::element_size(t0->dtype);
      uint64_t row = elem;
      for (std::size_t d = 1; d < t0->shape.size(); ++d) row *= static_cast<uint64_t>(t0->shape[d]);
      bool any_spilled = false;
      auto start_of = [&](const Piece& p) {
        const auto& t = std::get<protocol::TensorLeaf>(p.batch->announcement.leaves[j]);
        const std::byte* first_row =
            p.batch->spilled() ? static_cast<const std::byte*>(p.batch->owned[j].data_ptr())
                               : p.batch->base + t.offset;
        return const_cast<std::byte*>(first_row + static_cast<uint64_t>(p.start) * row);
      };
      for (const Piece& p : pieces) any_spilled |= p.batch->spilled();
      bool contiguous = true;
      const std::byte* expect = nullptr;
      for (const Piece& p : pieces) {
        const auto& t = std::get<protocol::TensorLeaf>(p.batch->announcement.leaves[j]);
        if (t.dtype != t0->dtype ||
            !std::equal(t.shape.begin() + 1, t.shape.end(), t0->shape.begin() + 1, t0->shape.end())) {
          throw RebatchError(
              "cannot rebatch tensor leaf " + std::to_string(j) + ": loader batch " +
              std::to_string(first.index) + " has samples of shape " + shape_text(t0->shape) + " " +
              protocol::dtype_name(t0->dtype) + " but loader batch " +
              std::to_string(p.batch->announcement.index) + " has " + shape_text(t.shape) + " " +
              protocol::dtype_name(t.dtype) +
              "; use a consumer batch_size equal to the loader's, or make sample shapes uniform");
        }
        if (expect != nullptr && start_of(p) != expect) contiguous = false;
        expect = start_of(p) + static_cast<uint64_t>(p.count) * row;
      }
      std::vector<int64_t> shape = t0->shape;
      const c10::Device device = pieces.front().batch->device;
      auto options = at::TensorOptions().dtype(from_wire(t0->dtype)).device(device);
      if (pieces.size() == 1 && any_spilled) {  // spilled samples: a view of the private copy
        out.leaves.emplace_back(
            pieces[0].batch->owned[j].narrow(0, pieces[0].start, pieces[0].count));
      } else if (contiguous && !any_spilled) {
        // One view over every piece; it keeps each piece's slot until freed.
        std::vector<std::shared_ptr<ReleaseToken>> tokens;
        for (const Piece& p : pieces) tokens.push_back(p.batch->token);
        shape[0] = n;
        out.leaves.emplace_back(at::from_blob(
            start_of(pieces.front()), shape, [tokens = std::move(tokens)](void*) {}, options, device));
        stats_.views += 1;
      } else {
        std::vector<at::Tensor> parts;
        for (const Piece& p : pieces) {
          shape[0] = p.count;
          if (p.batch->spilled()) {
            parts.push_back(p.batch->owned[j].narrow(0, p.start, p.count));
          } else {  // borrowed, copied below
            parts.push_back(at::from_blob(start_of(p), shape, [](void*) {}, options, p.batch->device));
          }
        }
        out.leaves.emplace_back(at::cat(parts));
        stats_.copies += 1;
      }
    } else {
      const auto& l0 = std::get<protocol::ListLeaf>(first.leaves[j]);
      Items items{l0.kind, {}};
      items.values.reserve(static_cast<std::size_t>(n));
      for (const Piece& p : pieces) {
        const auto& l = std::get<protocol::ListLeaf>(p.batch->announcement.leaves[j]);
        items.values.insert(items.values.end(), l.items.begin() + p.start,
                            l.items.begin() + p.start + p.count);
      }
      out.leaves.emplace_back(std::move(items));
    }
  }

  // Advance past what was handed out; fully used loader batches drop their token.
  int64_t left = n;
  while (left > 0) {
    int64_t avail = pending_.front().announcement.samples - front_used_;
    if (left >= avail) {
      left -= avail;
      pending_.pop_front();
      front_used_ = 0;
    } else {
      front_used_ += left;
      left = 0;
    }
  }
  buffered_ -= n;
  return out;
}

}  // namespace batchcast
