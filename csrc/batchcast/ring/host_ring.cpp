// A ring in host shared memory (a memfd): the producer writes each batch with
// one memcpy per tensor; consumers map it read-only, once.
#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/common/threads.h"
#include "batchcast/ring/ring.h"
#include "batchcast/ring/shared_region.h"

namespace batchcast {
namespace {

class HostRing final : public Ring {
 public:
  explicit HostRing(RingOptions options) : Ring(std::move(options)) {}

  std::string device() const override { return "cpu"; }

  void check(const Batch&) const override {}

  uint64_t write(const Batch& batch, const RingSlot& slot, bool in_place) override {
    if (in_place) return 0;  // a loader worker wrote it here
    uint64_t copied = 0;
    std::size_t lane = 0;
    for (const Leaf& leaf : batch.leaves) {
      const auto* t = std::get_if<Tensor>(&leaf);
      if (t == nullptr) continue;
      std::byte* dst = region_->data() + slot.offsets[lane++];
      if (t->numel() == 0) continue;
      copy_to_host(dst, *t);
      copied += nbytes(*t);
    }
    return copied;
  }

  std::byte* host_memory() override { return region_ ? region_->data() : nullptr; }
  int host_fd() const override { return region_ ? region_->fd() : -1; }

  ~HostRing() override {
    if (prefault_.joinable()) prefault_.join();
  }

 protected:
  // Pages are faulted in by a background thread, so the first batch need not
  // wait for the whole ring; a write that gets to a page first faults it
  // itself. Where the kernel cannot populate without writing, it is done here,
  // before any batch is written.
  void prepare(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) override {
    if (ranges.empty()) return;
    if (!region_->populate(ranges.front().first, std::min<uint64_t>(ranges.front().second, 4096))) {
      for (const auto& [offset, bytes] : ranges) region_->fault_in(offset, bytes);
      return;
    }
    if (prefault_.joinable()) prefault_.join();  // (a ring prepared again: one thread at a time)
    prefault_ = start_background_thread("batchcast-fault", [region = &*region_, ranges] {
      for (const auto& [offset, bytes] : ranges) region->populate(offset, bytes);
    });
  }

  void allocate_memory(uint64_t bytes, int) override {
    region_.emplace(SharedRegion::create(bytes, options_.label));
    description_.fd = region_->fd();
    description_.bytes = bytes;
  }

 private:
  std::optional<SharedRegion> region_;
  std::thread prefault_;  // declared after region_: joined before it is unmapped
};

}  // namespace

std::unique_ptr<Ring> make_host_ring(const RingOptions& options) {
  return std::make_unique<HostRing>(options);
}

}  // namespace batchcast
