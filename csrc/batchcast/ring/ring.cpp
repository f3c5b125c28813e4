#include "batchcast/ring/ring.h"

#include <algorithm>
#include <cmath>
#include <cstdio>


#include "batchcast/common/error.h"
#include "batchcast/protocol/dtype.h"

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
  double scale = 1.0;  // min_bytes: a larger ring, for more in flight or larger batches
  if (total > 0 && options_.min_bytes > total * slots) {
    scale = static_cast<double>(options_.min_bytes) / static_cast<double>(total * slots);
  }
  // Each lane holds all that for batches up to `growth` times the first.
  const double growth = std::max(kGrowth, scale);
  std::vector<uint64_t> capacities;
  first_bytes_ = leaf_bytes;
  largest_.clear();
  for (uint64_t b : leaf_bytes) {
    capacities.push_back(static_cast<uint64_t>(static_cast<double>(b * slots) * growth));
    largest_.push_back(static_cast<uint64_t>(static_cast<double>(b) * growth));
  }
  // Batches go to the flow's share of each lane while they fit there: the
  // first batch's size (times scale) for `slots` + 1 of them. The room for
  // kept batches and for larger batches is used (and so touched) only when
  // needed.
  const double flow_share =
      static_cast<double>(options_.slots + 1) * scale / (static_cast<double>(slots) * growth);
  LaneAllocator lanes(capacities, flow_share);
  for (std::size_t i = 0; i < largest_.size(); ++i) {  // lanes are whole pages: room for a little more
    largest_[i] = std::max(largest_[i], lanes.lane_capacity(i) / slots);
  }
  // Twice as many events as slots: smaller later batches can put more in flight.
  const int events = events_per_slot() * static_cast<int>(2 * slots);
  allocate_memory(std::max<uint64_t>(lanes.total_bytes(), 1), events);  // fills description_
  std::vector<std::pair<uint64_t, uint64_t>> used_first;
  for (std::size_t i = 0; i < lanes.lanes(); ++i) used_first.emplace_back(lanes.lane_base(i), lanes.lane_preferred(i));
  prepare(used_first);
  lanes_.emplace(std::move(lanes));
  if (events > 0) events_.emplace(events);
}

namespace {
std::string mib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}
}  // namespace

void Ring::check_fits(const std::vector<uint64_t>& bytes, const Batch& batch) const {
  if (!lanes_ || bytes.size() != largest_.size()) return;  // the allocator says what is wrong
  double worst = 0;
  std::size_t lane = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] <= largest_[i]) continue;
    const double ratio = static_cast<double>(bytes[i]) / static_cast<double>(std::max<uint64_t>(first_bytes_[i], 1));
    if (ratio > worst) {
      worst = ratio;
      lane = i;
    }
  }
  if (worst == 0) return;
  // The tensor in that lane, for its shape.
  std::string shape;
  std::size_t k = 0;
  for (const Leaf& leaf : batch.leaves) {
    const auto* t = std::get_if<Tensor>(&leaf);
    if (t == nullptr) continue;
    if (k++ != lane) continue;
    std::string dims;
    for (int64_t d : t->sizes()) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    shape = " of shape [" + dims + "] " + protocol::dtype_name(protocol::to_wire(t->scalar_type()));
  }
  uint64_t total = 0;
  for (uint64_t b : first_bytes_) total += b;
  const double growth = static_cast<double>(largest_[lane]) / static_cast<double>(std::max<uint64_t>(first_bytes_[lane], 1));
  const double want = std::ceil(worst * 1.25);  // some room beyond this batch
  const uint64_t slots = 2 * static_cast<uint64_t>(options_.slots) + 1;
  uint64_t ring_bytes = static_cast<uint64_t>(static_cast<double>(total * slots) * want);
  if (total == 0) {  // the first batch was empty: size the ring from this one
    for (uint64_t b : bytes) ring_bytes += b * slots * 2;
  }
  // One decimal, rounded apart (up for the batch, down for the ring), so that
  // the two never read as the same figure.
  char ratio_text[64];
  std::snprintf(ratio_text, sizeof ratio_text, "%.1fx", std::ceil(worst * 10) / 10);
  char growth_text[64];
  std::snprintf(growth_text, sizeof growth_text, "%.1fx", std::floor(growth * 10) / 10);
  const std::string pass = "Pass ring_bytes=" + std::to_string(ring_bytes) + " (batchcast serve --ring-bytes " +
                           std::to_string(ring_bytes) + ")";
  if (first_bytes_[lane] == 0) {
    throw InvalidArgument("its tensor " + std::to_string(lane) + shape + " holds " + mib(bytes[lane]) +
                          ", but the ring was sized from the first batch, in which that tensor was empty. " + pass +
                          ", or do not begin with an empty batch");
  }
  throw InvalidArgument(
      "its tensor " + std::to_string(lane) + shape + " holds " + mib(bytes[lane]) + ", " + ratio_text +
      " that tensor of the first batch (" + mib(first_bytes_[lane]) + "), and the ring, sized from the first "
      "batch, takes batches up to " + growth_text + " it. " + pass + " for batches up to " +
      std::to_string(static_cast<int64_t>(want)) + "x the first, or make the first batch the largest "
      "(sort by length, or pad to a fixed size)");
}

int64_t Ring::kept_room() const { return std::max(options_.slots, kMinKeptRoom); }

std::optional<RingSlot> Ring::try_reserve(const std::vector<uint64_t>& bytes,
                                          const std::vector<uint64_t>& align, int64_t kept) {
  if (events_ && events_->available() == 0) return std::nullopt;
  // Lanes are rounded up to pages, so small batches would fit by the hundred:
  // the count keeps the producer within the ring's batches of the slowest.
  const int64_t room = options_.slots + 1 + std::clamp(kept, options_.slots, kept_room());
  if (static_cast<int64_t>(lanes_->in_flight()) >= room) return std::nullopt;
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
