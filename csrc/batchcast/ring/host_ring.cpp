// A ring in host shared memory (a memfd): the producer writes each batch with
// one memcpy per tensor; consumers map it read-only, once.
#include <ATen/ATen.h>

#include <optional>

#include "batchcast/common/error.h"
#include "batchcast/ring/ring.h"
#include "batchcast/ring/shared_region.h"

namespace batchcast {
namespace {

class HostRing final : public Ring {
 public:
  explicit HostRing(RingOptions options) : Ring(std::move(options)) {}

  std::string device() const override { return "cpu"; }

  void check(const Batch&) const override {}

  void write(const Batch& batch, const RingSlot& slot) override {
    std::size_t lane = 0;
    for (const Leaf& leaf : batch.leaves) {
      const auto* t = std::get_if<at::Tensor>(&leaf);
      if (t == nullptr) continue;
      const uint64_t offset = slot.offsets[lane++];
      if (t->numel() == 0) continue;
      at::from_blob(region_->data() + offset, t->sizes(), at::TensorOptions().dtype(t->scalar_type()))
          .copy_(*t);
    }
  }

 protected:
  void prepare(uint64_t offset, uint64_t bytes) override { region_->fault_in(offset, bytes); }

  void allocate_memory(uint64_t bytes, int) override {
    region_.emplace(SharedRegion::create(bytes, options_.label));
    description_.fd = region_->fd();
    description_.bytes = bytes;
  }

 private:
  std::optional<SharedRegion> region_;
};

}  // namespace

std::unique_ptr<Ring> make_host_ring(const RingOptions& options) {
  return std::make_unique<HostRing>(options);
}

}  // namespace batchcast
