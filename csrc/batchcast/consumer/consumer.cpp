#include "batchcast/consumer/consumer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "batchcast/common/endpoint.h"
#include "batchcast/common/error.h"
#include "batchcast/consumer/channel.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/protocol/dtype.h"

namespace batchcast {

Consumer::Consumer(ConsumerOptions options)
    : options_(std::move(options)), rebatcher_(options_.batch_size, options_.drop_last) {
  validate_name(options_.name);
  if (!(options_.timeout > 0)) throw InvalidArgument("timeout must be positive (seconds)");
  const std::string endpoint = endpoint_for(runtime_dir(options_.runtime_dir), options_.name);
  channel_ = Channel::connect(ChannelOptions{options_.name, endpoint, options_.catch_up,
                                             options_.batch_size.value_or(0), options_.release_after,
                                             options_.interrupt});
  try {
    protocol::Welcome w = channel_->join(options_.timeout);
    next_epoch_ = w.first_epoch;
    // The ring has room for slots+1 loader batches in flight; holding at most
    // this many pending (plus the batch the caller holds) always leaves the
    // producer one.
    rebatcher_.set_max_pending(std::max<int64_t>(0, (w.slots - 2) / 2));
    samples_per_epoch_ = w.samples_per_epoch;
    loader_batches_per_epoch_ = w.batches_per_epoch;
    pin_budget_ = w.pin_budget;
    id_ = w.consumer_id;
    place(w.ring);
  } catch (...) {
    channel_->leave();
    throw;
  }
}

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
    device_ = c10::kCPU;
    return;
  }
  if (!cuda::simulating() && !at::hasCUDA()) {
    throw CudaError("producer '" + options_.name + "' serves from GPU " + cuda::uuid_text(ring.gpu_uuid) +
                    " but the torch in this process has no CUDA support; install a CUDA build of "
                    "torch here");
  }
  // Tensors on a GPU; on the simulated device (tests), whose memory is host
  // memory, CPU tensors.
  auto gpu = [](int index) {
    return cuda::simulating() ? c10::Device(c10::kCPU)
                             : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
  };
  const int ring_device = cuda::visible_device(ring.gpu_uuid);
  ring_device_ = ring_device;
  if (want == Placement::Host) {
    transfer_ = Transfer::DeviceToHost;
    device_ = c10::kCPU;
  } else if (want == Placement::Auto || options_.cuda_device == ring_device) {
    transfer_ = Transfer::View;
    device_ = gpu(ring_device);
  } else {
    transfer_ = cuda::can_access_peer(options_.cuda_device, ring_device) ? Transfer::Peer
                                                                         : Transfer::HostStaged;
    device_ = gpu(options_.cuda_device);
  }
}

Consumer::~Consumer() {
  close();
  channel_.reset();  // the channel itself lives on while handed-out tensors do
}

void Consumer::close() {
  rebatcher_.clear();
  if (channel_) channel_->leave();
  in_epoch_ = false;
  finished_ = true;
}

int64_t Consumer::samples_per_epoch() const { return samples_per_epoch_; }

int64_t Consumer::batches_per_epoch() const {
  if (!options_.batch_size) return loader_batches_per_epoch_;
  if (samples_per_epoch_ < 0) return -1;
  const int64_t b = *options_.batch_size;
  return options_.drop_last ? samples_per_epoch_ / b : (samples_per_epoch_ + b - 1) / b;
}

int64_t Consumer::begin_epoch() {
  while (in_epoch_) {
    (void)next();  // drain what is left of an epoch the caller left early
  }
  rebatcher_.clear();
  mid_epoch_ = false;
  epoch_ = next_epoch_++;
  in_epoch_ = !finished_;
  return epoch_;
}

std::optional<Batch> Consumer::next() {
  if (!in_epoch_) return std::nullopt;
  // GPU: torch's device guards inside find the ring's device current, so they
  // switch nothing; the caller's thread is left as it was.
  std::optional<cuda::DeviceScope> scope;
  if (ring_device_ >= 0) scope.emplace(ring_device_);
  while (true) {
    if (auto b = rebatcher_.pop()) {
      batches_ += 1;
      samples_ += b->samples;
      return b;
    }
    protocol::Message m = channel_->take();
    if (auto* a = std::get_if<protocol::Announcement>(&m)) {
      if (a->epoch != epoch_) {
        channel_->release_now(a->seq);  // not ours
        continue;
      }
      mid_epoch_ = true;
      receive(*a);
    } else if (auto* end = std::get_if<protocol::EpochEnd>(&m)) {
      if (end->epoch != epoch_) continue;
      samples_per_epoch_ = end->samples;
      loader_batches_per_epoch_ = end->batches;
      in_epoch_ = false;
      auto rest = rebatcher_.flush();
      if (rest) {
        batches_ += 1;
        samples_ += rest->samples;
      }
      return rest;
    } else if (auto* failed = std::get_if<protocol::LoaderFailed>(&m)) {
      in_epoch_ = false;
      rebatcher_.clear();
      throw LoaderError("the loader of batchcast producer '" + options_.name +
                        "' raised: " + failed->message);
    } else if (std::holds_alternative<protocol::Finished>(m)) {
      const bool started = rebatcher_.buffered() > 0 || mid_epoch_;
      in_epoch_ = false;
      finished_ = true;
      rebatcher_.clear();
      if (started) {
        throw ProducerLost("batchcast producer '" + options_.name +
                           "' stopped before the end of epoch " + std::to_string(epoch_));
      }
      return std::nullopt;
    }
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
    rebatcher_.push(LoaderBatch{std::move(a), ring.base(), std::move(token), {}, ring.device()});
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
      auto options = at::TensorOptions().dtype(protocol::from_wire(t->dtype)).device(ring.device());
      at::Tensor view = at::from_blob(const_cast<std::byte*>(ring.base() + t->offset), t->shape,
                                      [](void*) {}, options, ring.device());
      batch.owned.push_back(view.to(view.options().device(device_), /*non_blocking=*/false, /*copy=*/true));
    } else {
      batch.owned.emplace_back();
    }
  }
  (keeping ? private_copies_ : transfers_) += 1;
  token.reset();
  batch.announcement = std::move(a);
  rebatcher_.push(std::move(batch));
}

ConsumerStats Consumer::stats() const {
  ConsumerStats s;
  const ChannelStats c = channel_->stats();
  s.id = id_;
  s.epoch = epoch_;
  s.batches = batches_;
  s.samples = samples_;
  s.loader_batches = c.received;
  s.views = rebatcher_.stats().views;
  s.copies = rebatcher_.stats().copies;
  s.spills = rebatcher_.stats().spills;
  s.private_copies = private_copies_;
  s.slots_held = c.slots_held;
  s.slots_pinned = std::max<int64_t>(0, pinned_beyond(0));
  s.pin_budget = pin_budget_;
  s.dropped_messages = c.dropped_messages;
  s.device = device_.str();
  static constexpr const char* kTransfers[] = {"shared-memory", "view", "peer", "host-staged",
                                               "device-to-host"};
  s.transfer = kTransfers[static_cast<int>(transfer_)];
  s.ipc_memory_opens = c.ipc_memory_opens;
  s.ipc_event_opens = c.ipc_event_opens;
  s.transfers = transfers_;
  s.ring_address = c.ring_address;
  s.ring_bytes = c.ring_bytes;
  return s;
}

}  // namespace batchcast
