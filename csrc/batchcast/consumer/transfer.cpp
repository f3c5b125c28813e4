// How a consumer's batches get where it wants them (its Transfer): decided
// once at join (place), then each loader batch received as views of the ring
// or one copy to where it goes (receive; a private copy while kept batches
// pin more than the consumer's share of the ring), and handed out as private
// copies where views must not be (hand_out, private_copy).
#include "batchcast/consumer/consumer.h"

#include <cstring>
#include <set>

#include "batchcast/common/error.h"
#include "batchcast/consumer/channel.h"
#include "batchcast/cuda/runtime.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/protocol/dtype.h"

namespace batchcast {


// Decides once, at join, where batches go and how they get there.
void Consumer::place(const protocol::Ring& ring) {
  const Placement want = options_.placement;
  if (want == Placement::Cuda &&
      (options_.cuda_device < 0 || options_.cuda_device >= cuda::device_count())) {
    throw CudaError("consumer of '" + options_.name + "' asked for cuda:" +
                    std::to_string(options_.cuda_device) + " but this process sees " +
                    std::to_string(cuda::device_count()) + " GPU(s)");
  }
  if (!ring.on_gpu()) {
    if (want == Placement::Cuda) {
      throw InvalidArgument("producer '" + options_.name +
                            "' serves batches from host shared memory; a consumer on cuda:" +
                            std::to_string(options_.cuda_device) +
                            " needs a producer with device='cuda' (one copy to the GPU shared by "
                            "all), or use device='cpu' here and move batches yourself");
    }
    transfer_ = Transfer::SharedMemory;
    device_ = cpu_device();
    return;
  }
  if (!cuda::device_memory_on_host() && !torch_has_cuda()) {
    throw CudaError("producer '" + options_.name + "' serves from GPU " + cuda::uuid_text(ring.gpu_uuid) +
                    " but the torch in this process has no CUDA support; install a CUDA build of "
                    "torch here");
  }
  // Tensors on a GPU; where device memory is host memory (the simulated
  // device of the tests), CPU tensors.
  auto gpu = [](int index) {
    return cuda::device_memory_on_host() ? cpu_device() : cuda_device(index);
  };
  const int ring_device = cuda::visible_device(ring.gpu_uuid);
  ring_device_ = ring_device;
  if (want == Placement::Host) {
    transfer_ = Transfer::DeviceToHost;
    device_ = cpu_device();
  } else if (want == Placement::Auto || options_.cuda_device == ring_device) {
    transfer_ = Transfer::View;
    device_ = gpu(ring_device);
  } else {
    transfer_ = cuda::can_access_peer(options_.cuda_device, ring_device) ? Transfer::Peer
                                                                         : Transfer::HostStaged;
    device_ = gpu(options_.cuda_device);
  }
}

// Ring slots this process references for batches it keeps: every slot held
// except those of the batch handed out last, those still pending here, and
// the incoming one. A training loop holds none; a script that stores its
// batches holds more with every step.
int64_t Consumer::pinned_beyond(uint64_t incoming) const {
  std::set<uint64_t> kept = channel_->referenced();
  kept.erase(incoming);
  for (uint64_t seq : rebatcher_.pending_slots()) kept.erase(seq);
  for (uint64_t seq : rebatcher_.last_batch_slots()) kept.erase(seq);
  return static_cast<int64_t>(kept.size());
}

// One loader batch of the current epoch: views where it lies, or one copy to
// where this consumer wants it — or, while the batches this process keeps pin
// more than its share of the ring, a private copy, so that its slot goes back
// at once and keeping never stalls the producer or the other consumers.
void Consumer::receive(protocol::Announcement& a) {
  MappedRing& ring = channel_->ring();
  auto token = channel_->hold(a.seq);  // first: whatever throws below, the slot is released
  if (auto stream = ring.ready(a.event)) token->set_stream(*stream);
  pin_budget_ = a.pin_budget;
  const bool moved = transfer_ != Transfer::SharedMemory && transfer_ != Transfer::View;
  const int64_t pinned = moved ? 0 : pinned_beyond(a.seq);
  const bool keeping = pinned > pin_budget_;
  if (!moved && !keeping) {
    push(LoaderBatch{std::move(a), ring.base(), std::move(token), {}, ring.device()});
    return;
  }
  if (keeping && !warned_keeping_ && options_.reporter) {
    warned_keeping_ = true;
    options_.reporter(Report{
        Report::Level::Warning, "KeptBatches",
        "consumer of '" + options_.name + "' keeps earlier batches that pin " + std::to_string(pinned) +
            (pinned == 1 ? " slot" : " slots") + " of the producer's shared ring (its share: " +
            std::to_string(pin_budget_) +
            "); so that nobody waits for them, further batches are private copies (one memcpy "
            "each) until those are freed. Keep .clone()s of what you store (e.g. x.clone()), not "
            "the batches themselves"});
  }
  // One copy per loader batch, issued on the current stream of the ring's
  // device when it is a GPU; the slot goes back once that copy is done.
  LoaderBatch batch;
  batch.device = device_;
  for (const auto& leaf : a.leaves) {
    if (const auto* t = std::get_if<protocol::TensorLeaf>(&leaf)) {
      Tensor view = borrow(const_cast<std::byte*>(ring.base() + t->offset), t->shape,
                           protocol::from_wire(t->dtype), ring.device());
      batch.owned.push_back(copy_to(view, device_));
    } else {
      batch.owned.emplace_back();
    }
  }
  (keeping ? private_copies_ : transfers_) += 1;
  token.reset();
  batch.announcement = std::move(a);
  push(std::move(batch));
}

// Counts a batch going to the caller, first made private where it must be:
// its views of the ring become copies of their own (the slots then go back
// as soon as the copy is done).
std::optional<ViewBatch> Consumer::hand_out(std::optional<ViewBatch> batch) {
  if (!batch) return batch;
  batches_ += 1;
  samples_ += batch->samples;
  if (batch->samples > 0) indexed_ = batch->indexed;
  if (copy_out_) {
    bool copied = false;
    for (ViewLeaf& leaf : batch->leaves) {
      auto* view = std::get_if<RingView>(&leaf);
      if (view == nullptr) continue;
      leaf = private_copy(to_tensor(std::move(*view)));
      copied = true;
    }
    batch_copies_ += copied ? 1 : 0;
  }
  return batch;
}

// A copy of a view of the ring, ordered after what made its slot readable:
// on a GPU, queued on the current stream (which waits on the slot's event);
// where device memory is host memory (the simulated device), a copy run in
// that stream's order. Either way the slot goes back only once the stream is past
// the copy: the view's release is ordered on that stream after it.
Tensor Consumer::private_copy(const Tensor& view) const {
  if (transfer_ == Transfer::View && cuda::device_memory_on_host()) {
    // Its memory is freed in stream order, as the caching allocator's is.
    cuda::Runtime* rt = &cuda::runtime();  // (chosen once, never destroyed)
    const cuda::Stream stream = rt->current_stream();
    const void* from = view.data_ptr();
    const std::size_t bytes = nbytes(view);
    void* memory = rt->stream_alloc(bytes);
    Tensor out = wrap(memory, shape_of(view), view.scalar_type(), view.device(),
                      [rt, memory, stream] { rt->stream_free(memory, stream); });
    rt->launch_host_function(stream, [memory, from, bytes] { std::memcpy(memory, from, bytes); });
    return out;
  }
  if (view.is_cpu()) {
    // One memcpy in this thread (views of the ring are contiguous): torch's
    // parallel copy would wake OpenMP threads that then spin for milliseconds.
    // Into memory a freed copy had (fresh pages fault in at a tenth of memcpy's speed).
    const std::size_t bytes = nbytes(view);
    void* memory = copy_memory_->take(bytes);
    std::memcpy(memory, view.data_ptr(), bytes);
    return wrap(memory, shape_of(view), view.scalar_type(), view.device(),
                [pool = copy_memory_, memory, bytes] { pool->give_back(memory, bytes); });
  }
  return clone(view);  // on the current stream
}

}  // namespace batchcast
