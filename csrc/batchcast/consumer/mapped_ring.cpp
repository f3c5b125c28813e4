#include "batchcast/consumer/mapped_ring.h"

#include <unistd.h>

#include "batchcast/common/error.h"
#include "batchcast/cuda/runtime.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/ring/shared_region.h"

namespace batchcast {
namespace {

class HostMapping final : public MappedRing {
 public:
  HostMapping(const protocol::Ring& ring, int64_t producer_pid, Released released)
      : region_(SharedRegion::open(producer_pid, ring.fd, ring.bytes)), released_(std::move(released)) {
    base_ = region_.data();
    size_ = region_.size();
  }

  Device device() const override { return cpu_device(); }
  std::optional<cuda::StreamRef> ready(int32_t) override { return std::nullopt; }
  void release(uint64_t seq, const std::optional<cuda::StreamRef>&) noexcept override { released_(seq); }

 private:
  SharedRegion region_;
  Released released_;
};

// The stream a consumer's batches are used on: torch's current stream of the
// device on a GPU; the runtime's current stream of the thread where device
// memory is host memory (the simulated device), for which torch has none.
cuda::Stream current_stream(int device) {
  cuda::Runtime& rt = cuda::runtime();
  if (rt.device_memory_on_host()) return rt.current_stream();
  return static_cast<cuda::Stream>(current_cuda_stream(device));
}

// Every call on the GPU runs inside a cuda::DeviceScope of the ring's device:
// torch's guards then switch nothing, so they never create a context on
// another GPU, and the caller's thread is left as it was.
class CudaMapping final : public MappedRing {
 public:
  CudaMapping(const protocol::Ring& ring, Released released, ReleaseAfter after)
      : released_(std::move(released)), after_(after) {
    if (!cuda::device_memory_on_host() && !torch_has_cuda()) {
      throw CudaError("the producer serves from GPU " + cuda::uuid_text(ring.gpu_uuid) +
                      " but the torch in this process has no CUDA support; install a CUDA build "
                      "of torch here");
    }
    memory_ = std::make_unique<cuda::ImportedRing>(ring.gpu_uuid, ring.memory_handle, ring.bytes,
                                                   ring.event_handles);
    memory_opens_ = 1;  // one ring allocation
    event_opens_ = memory_->events();
    waiter_ = std::make_unique<cuda::ReleaseWaiter>(memory_->device(), released_);
    base_ = memory_->data();
    size_ = memory_->size();
  }

  ~CudaMapping() override {
    waiter_.reset();  // waits for what is pending: its thread calls released_
    memory_.reset();
  }

  // Where device memory is host memory (the simulated device): CPU tensors.
  Device device() const override {
    if (cuda::device_memory_on_host()) return cpu_device();
    return cuda_device(memory_->device());
  }
  int events() const override { return memory_->events(); }

  std::optional<cuda::StreamRef> ready(int32_t event) override {
    const int device = memory_->device();
    cuda::DeviceScope scope(device);
    const cuda::Stream stream = current_stream(device);
    cuda::runtime().stream_wait(stream, memory_->event(event));
    return cuda::StreamRef{device, stream};
  }

  // The slot was used on `stream` (current when it was taken) and maybe since
  // on the stream current here (a prefetching pattern): cover both.
  void release(uint64_t seq, const std::optional<cuda::StreamRef>& stream) noexcept override {
    if (!stream) {
      released_(seq);
      return;
    }
    if (after_ == ReleaseAfter::Device) {
      waiter_->add(seq, nullptr);
      return;
    }
    void* event = nullptr;
    try {
      cuda::DeviceScope scope(stream->device);
      cuda::Runtime& rt = cuda::runtime();
      event = waiter_->acquire();
      const cuda::Stream current = current_stream(stream->device);
      if (current != stream->stream) {
        void* first = waiter_->acquire();
        rt.event_record(first, stream->stream);
        rt.stream_wait(current, first);
        waiter_->discard(first);  // re-recording it later cannot affect this wait
      }
      rt.event_record(event, current);
      waiter_->add(seq, event);
      return;
    } catch (...) {
      // CUDA is failing (the process is exiting?): wait for the stream if it
      // still can, rather than hand back memory the GPU may still read.
      if (event != nullptr) waiter_->discard(event);
      try {
        cuda::DeviceScope scope(stream->device, /*checked=*/false);
        cuda::runtime().stream_synchronize(stream->stream);
      } catch (...) {
      }
    }
    released_(seq);
  }

  int64_t releases_in_flight() const override { return waiter_->pending(); }

 private:
  Released released_;
  ReleaseAfter after_;
  std::unique_ptr<cuda::ImportedRing> memory_;
  std::unique_ptr<cuda::ReleaseWaiter> waiter_;
};

}  // namespace

std::unique_ptr<MappedRing> MappedRing::open(const protocol::Ring& ring, int64_t producer_pid,
                                             Released released, ReleaseAfter after) {
  if (!ring.on_gpu()) return std::make_unique<HostMapping>(ring, producer_pid, std::move(released));
  if (producer_pid == ::getpid()) {
    throw CudaError("a consumer cannot map a GPU ring of a producer in its own process (CUDA IPC "
                    "handles open only in other processes); run the producer in another process");
  }
  return std::make_unique<CudaMapping>(ring, std::move(released), after);
}

}  // namespace batchcast
