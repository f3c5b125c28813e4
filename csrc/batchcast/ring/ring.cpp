#include "batchcast/ring/ring.h"

#include <algorithm>

#include "batchcast/common/error.h"

namespace batchcast {

std::unique_ptr<Ring> make_host_ring(const RingOptions& options);
std::unique_ptr<Ring> make_cuda_ring(const RingOptions& options);

std::unique_ptr<Ring> Ring::create(const RingOptions& options) {
  if (options.slots < 2) throw InvalidArgument("slots must be at least 2");
  return options.cuda_device >= 0 ? make_cuda_ring(options) : make_host_ring(options);
}

void Ring::allocate(const std::vector<uint64_t>& leaf_bytes) {
  uint64_t total = 0;
  for (uint64_t b : leaf_bytes) total += b;
  // `slots` batches in flight, one more because a lane can waste up to a batch
  // at its wrap, and `slots` more for batches consumers keep (see
  // Membership::pin_budget): kept batches are holes the flow goes around.
  const uint64_t slots = 2 * static_cast<uint64_t>(options_.slots) + 1;
  double scale = 1.0;
  if (total > 0 && options_.min_bytes > total * slots) {
    scale = static_cast<double>(options_.min_bytes) / static_cast<double>(total * slots);
  }
  std::vector<uint64_t> capacities;
  for (uint64_t b : leaf_bytes) {
    capacities.push_back(static_cast<uint64_t>(static_cast<double>(b * slots) * scale));
  }
  // Batches go to the flow's share of each lane while they fit there; the
  // room for kept batches is used (and so touched) only when needed.
  const double flow_share = static_cast<double>(options_.slots + 1) / static_cast<double>(slots);
  LaneAllocator lanes(capacities, flow_share);
  // Twice as many events as slots: smaller later batches can put more in flight.
  const int events = events_per_slot() * static_cast<int>(2 * slots);
  allocate_memory(std::max<uint64_t>(lanes.total_bytes(), 1), events);  // fills description_
  std::vector<std::pair<uint64_t, uint64_t>> used_first;
  for (std::size_t i = 0; i < lanes.lanes(); ++i) used_first.emplace_back(lanes.lane_base(i), lanes.lane_preferred(i));
  prepare(used_first);
  lanes_.emplace(std::move(lanes));
  if (events > 0) events_.emplace(events);
}

std::optional<RingSlot> Ring::try_reserve(const std::vector<uint64_t>& bytes,
                                          const std::vector<uint64_t>& align) {
  if (events_ && events_->available() == 0) return std::nullopt;
  // Lanes are rounded up to pages, so small batches would fit by the hundred:
  // the count keeps the producer within the ring's batches of the slowest.
  if (lanes_->in_flight() >= static_cast<std::size_t>(2 * options_.slots + 1)) return std::nullopt;
  auto slot = lanes_->try_allocate(bytes, align);
  if (!slot) return std::nullopt;
  RingSlot out{slot->seq, std::move(slot->offsets), -1};
  if (events_) {
    BorrowedEvent event = *events_->borrow();
    out.event = event.index();
    slot_events_.emplace(out.seq, std::move(event));
  }
  return out;
}

void Ring::release(uint64_t seq) {
  if (lanes_) lanes_->release(seq);
  slot_events_.erase(seq);  // its event goes back to the pool
}

}  // namespace batchcast
