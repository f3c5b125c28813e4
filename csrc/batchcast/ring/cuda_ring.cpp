// A ring in GPU memory: one cudaMalloc, exported once with CUDA IPC, with an
// interprocess event per slot. Each batch costs one host-to-device copy on the
// ring's own stream: straight from the loader's tensors when they are pinned
// (pin_memory=True) or were written by a loader worker into the ring's pinned
// host mirror, else through pinned staging.
//
// The mirror (open_host_memory) is a memfd of the ring's size at the same
// offsets, registered with the device. A worker writes a batch there only into
// a slot the producer leased, that is a slot every consumer has let go of; the
// batch's copy goes from its mirror offsets to the same ring offsets. So no
// wait is needed before a worker writes: if a copy from the mirror is still
// queued for an earlier batch at those offsets, nobody reads that batch any
// more, and whatever it copies there is overwritten on the same stream by the
// copy of the batch the worker writes, before any consumer of that batch may
// read it (consumers wait for its slot event).

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/cuda/runtime.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/ring/ring.h"
#include "batchcast/ring/shared_region.h"

namespace batchcast {
namespace {

// A leaf's room in pinned staging: 256-byte aligned, as DMA likes it.
uint64_t staged_size(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

class CudaRing final : public Ring {
 public:
  explicit CudaRing(RingOptions options) : Ring(std::move(options)) {
    if (!cuda::built()) (void)cuda::device_uuid(options_.cuda_device);  // throws: no CUDA transport
    const int visible = cuda::device_count();
    if (options_.cuda_device >= visible) {
      throw CudaError("cannot serve from cuda:" + std::to_string(options_.cuda_device) +
                      ": this process sees " + std::to_string(visible) + " GPU(s)");
    }
    description_.gpu_uuid = cuda::device_uuid(options_.cuda_device);
  }

  ~CudaRing() override {
    drain();
    mirror_.reset();  // unpinned before it is unmapped, no copy reading it
  }

  std::string device() const override { return "cuda:" + std::to_string(options_.cuda_device); }
  bool unmap_before_free() const override { return true; }
  int64_t direct_copies() const override { return direct_copies_; }

  bool open_host_memory() override {
    if (mirror_) return true;
    if (!memory_) return false;
    mirror_.emplace(options_.cuda_device, SharedRegion::create(memory_->size(), options_.label + "-workers"));
    return true;
  }
  std::byte* host_memory() override { return mirror_ ? mirror_->region.data() : nullptr; }
  int host_fd() const override { return mirror_ ? mirror_->region.fd() : -1; }

  void check(const Batch& batch) const override {
    for (const Leaf& leaf : batch.leaves) {
      const auto* t = std::get_if<Tensor>(&leaf);
      if (t != nullptr && !t->device().is_cpu()) {
        throw InvalidArgument("a producer serving from " + device() +
                              " copies batches from host memory, but this batch has a tensor on " +
                              device_text(t->device()) + "; let the loader return CPU tensors");
      }
    }
  }

  uint64_t write(const Batch& batch, const RingSlot& slot, bool /*in_place: copied from the mirror*/) override {
    // The copies and event records below, and torch's is_pinned(), run with
    // the ring's device current: in a thread with no current context (a
    // loader thread that never used the GPU) the runtime would otherwise bind
    // one implicitly (its current device's, maybe another GPU) and leave it
    // current. The scope puts the caller's context back as it was.
    cuda::DeviceScope scope(options_.cuda_device);
    struct Leg {  // one tensor leaf's copy into the slot
      const Tensor* t;
      uint64_t offset;
      bool direct;
    };
    std::vector<Leg> legs;
    uint64_t to_stage = 0;
    std::size_t lane = 0;
    for (const Leaf& leaf : batch.leaves) {
      const auto* t = std::get_if<Tensor>(&leaf);
      if (t == nullptr) continue;
      const uint64_t offset = slot.offsets[lane++];
      if (t->numel() == 0) continue;
      const Leg& leg = legs.emplace_back(Leg{t, offset, direct(*t, offset)});
      if (!leg.direct) to_stage += staged_size(nbytes(*t));
    }
    // staging() waits until this buffer's previous copies are done, and with
    // them the copies straight from the pinned tensors kept beside it.
    const int buffer = memory_->staging_index();
    std::byte* staged = memory_->staging(std::max<uint64_t>(to_stage, 256));
    sources_[buffer].clear();
    uint64_t staged_at = 0;
    uint64_t host_copied = 0;
    for (const auto& [t, offset, is_direct] : legs) {
      const uint64_t n = nbytes(*t);
      if (is_direct) {
        memory_->copy_in(static_cast<const std::byte*>(t->data_ptr()), offset, n);
        sources_[buffer].push_back(*t);  // alive until the copy is done
        direct_copies_ += 1;
      } else {
        copy_to_host(staged + staged_at, *t);
        memory_->copy_in(staged + staged_at, offset, n);
        staged_at += staged_size(n);
        host_copied += n;
      }
    }
    memory_->record_slot(slot.event);
    memory_->finish_staging();
    return host_copied;  // into staging; direct copies are the GPU's own
  }

  void drain() noexcept override {
    if (!memory_) return;
    try {
      cuda::DeviceScope scope(options_.cuda_device, /*checked=*/false);  // as in write()
      memory_->synchronize();
    } catch (const Error&) {
    }
    for (auto& kept : sources_) kept.clear();
  }

 protected:
  int events_per_slot() const override { return 1; }

  void allocate_memory(uint64_t bytes, int events) override {
    auto memory = std::make_unique<cuda::DeviceRing>(options_.cuda_device, bytes, events);
    std::string handle = memory->memory_handle();
    std::vector<std::string> event_handles = memory->event_handles();
    memory_ = std::move(memory);
    description_.memory_handle = std::move(handle);
    description_.event_handles = std::move(event_handles);
    description_.bytes = bytes;
  }

 private:
  // Copied without staging: pinned host memory, laid out as the ring wants
  // it. In the mirror only at the slot's own place (`offset`): anywhere else
  // there a worker may write another batch before the queued copy reads it.
  bool direct(const Tensor& t, uint64_t offset) const {
    if (!plain_bytes(t)) return false;
    const auto* p = static_cast<const std::byte*>(t.data_ptr());
    if (mirror_ && p >= mirror_->region.data() && p < mirror_->region.data() + mirror_->region.size()) {
      return p == mirror_->region.data() + offset;
    }
    return cuda::runtime().is_pinned(p);
  }

  // The pinned host mirror: a memfd registered with the device while it lives.
  struct Mirror {
    int device;
    SharedRegion region;
    Mirror(int d, SharedRegion r) : device(d), region(std::move(r)) {
      cuda::DeviceScope scope(device);
      cuda::runtime().host_register(region.data(), region.size());
    }
    Mirror(const Mirror&) = delete;
    Mirror& operator=(const Mirror&) = delete;
    ~Mirror() {
      try {
        cuda::DeviceScope scope(device, /*checked=*/false);
        cuda::runtime().host_unregister(region.data());
      } catch (const Error&) {
      }
    }
  };

  std::unique_ptr<cuda::DeviceRing> memory_;
  std::optional<Mirror> mirror_;  // after memory_: unpinned and unmapped before the ring is freed
  std::vector<Tensor> sources_[2];  // pinned loader tensors being copied, per staging buffer
  std::atomic<int64_t> direct_copies_{0};  // written by the publisher, read by stats()
};

}  // namespace

std::unique_ptr<Ring> make_cuda_ring(const RingOptions& options) {
  return std::make_unique<CudaRing>(options);
}

}  // namespace batchcast
