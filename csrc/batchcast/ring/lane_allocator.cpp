#include "batchcast/ring/lane_allocator.h"

#include <algorithm>
#include <string>

#include "batchcast/common/error.h"

namespace batchcast {
namespace {
constexpr uint64_t kPage = 4096;
uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }
}  // namespace

LaneAllocator::LaneAllocator(const std::vector<uint64_t>& lane_capacities, double preferred_share) {
  for (uint64_t cap : lane_capacities) {
    Lane lane;
    lane.base = total_;
    lane.capacity = round_up(cap == 0 ? 1 : cap, kPage);
    lane.preferred = std::min(
        lane.capacity, round_up(static_cast<uint64_t>(static_cast<double>(lane.capacity) * preferred_share), kPage));
    total_ += lane.capacity;
    lanes_.push_back(std::move(lane));
  }
}

// First fit going forward from the head, around the lane once: it jumps over
// whatever is in use, so one long-held slot costs its own space and no more.
std::optional<uint64_t> LaneAllocator::place(const Lane& lane, uint64_t size, uint64_t align,
                                             uint64_t limit) {
  const uint64_t origin = std::min(lane.head, limit);
  uint64_t start = round_up(origin, align);
  bool wrapped = false;
  while (true) {
    if (start + size > limit) {
      if (wrapped) return std::nullopt;
      wrapped = true;
      start = 0;
    }
    if (wrapped && start >= origin) return std::nullopt;  // back where we began: full
    auto next = lane.live.upper_bound(start);             // first slot starting after `start`
    if (next != lane.live.begin()) {
      auto before = std::prev(next);
      if (before->second > start) {  // `start` lies inside a slot in use
        start = round_up(before->second, align);
        continue;
      }
    }
    if (next != lane.live.end() && next->first < start + size) {
      start = round_up(next->second, align);
      continue;
    }
    return start;
  }
}

std::optional<LaneAllocator::Slot> LaneAllocator::try_allocate(const std::vector<uint64_t>& bytes,
                                                               const std::vector<uint64_t>& align) {
  if (bytes.size() != lanes_.size() || align.size() != lanes_.size()) {
    throw RebatchError("loader batch has " + std::to_string(bytes.size()) +
                       " tensors but the ring was laid out for " + std::to_string(lanes_.size()) +
                       "; a loader must yield the same structure every batch");
  }
  Record rec{std::vector<uint64_t>(lanes_.size()), bytes};
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    if (bytes[i] > lanes_[i].capacity) {
      throw InvalidArgument("a batch tensor of " + std::to_string(bytes[i]) +
                            " bytes does not fit its ring lane of " +
                            std::to_string(lanes_[i].capacity) +
                            " bytes (sized from the first batch); pass a larger ring_bytes");
    }
    const Lane& lane = lanes_[i];
    const uint64_t a = std::max<uint64_t>(align[i], 1);
    auto at = bytes[i] == 0 ? std::optional<uint64_t>(std::min(lane.head, lane.capacity))
                            : place(lane, bytes[i], a, lane.preferred);
    if (!at && bytes[i] > 0 && lane.preferred < lane.capacity) at = place(lane, bytes[i], a, lane.capacity);
    if (!at) return std::nullopt;
    rec.starts[i] = *at;
  }
  Slot slot{next_seq_++, {}};
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    if (bytes[i] > 0) {
      lane.live.emplace(rec.starts[i], rec.starts[i] + bytes[i]);
      lane.head = rec.starts[i] + bytes[i];
    }
    slot.offsets.push_back(lane.base + rec.starts[i]);
  }
  slots_.emplace(slot.seq, std::move(rec));
  return slot;
}

bool LaneAllocator::release(uint64_t seq) {
  auto slot = slots_.find(seq);
  if (slot == slots_.end()) return false;
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    if (slot->second.sizes[i] > 0) lanes_[i].live.erase(slot->second.starts[i]);
  }
  slots_.erase(slot);
  return true;
}

}  // namespace batchcast
