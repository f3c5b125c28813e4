#include "batchcast/consumer/consumer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "batchcast/common/endpoint.h"
#include "batchcast/common/error.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/ring/ring.h"

namespace batchcast {

using Clock = std::chrono::steady_clock;

// The consumer's connection: a DEALER socket served by one I/O thread, the
// ring mapped once (host memory, or a GPU allocation opened once with CUDA
// IPC), and the queue of releases coming from tensor deleters on any thread.
// Tensors keep it (and so the mapping) alive through their tokens; it says
// Bye when the consumer closes and Unmapped once nothing references the ring.
class Channel : public ReleaseSink {
 public:
  Channel(std::string name, std::string endpoint, uint32_t flags)
      : name_(std::move(name)), context_(1), dealer_(context_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::linger, 1000);
    dealer_.set(zmq::sockopt::sndhwm, 0);
    dealer_.set(zmq::sockopt::rcvhwm, 0);
    dealer_.connect(endpoint);
    std::string hello = protocol::encode(protocol::Hello{::getpid(), flags});
    dealer_.send(zmq::buffer(hello), zmq::send_flags::dontwait);
    io_ = std::thread([this] { serve(); });
  }

  ~Channel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    wakeup_.notify();
    if (io_.joinable()) io_.join();
    dealer_.close();
    context_.close();
  }

  // GPU ring: record where the streams let go of the slot; the waiter sends
  // the release once the GPU is past it. Never throws (runs in deleters).
  // `waiter_` is read unlocked: it exists while any token does (held_ > 0).
  void release(uint64_t seq, const std::optional<c10::Stream>& stream) noexcept override {
    if (stream && waiter_) {
      void* event = nullptr;
      void* first = nullptr;
      c10::impl::VirtualGuardImpl gpu(c10::DeviceType::CUDA);
      try {
        event = waiter_->acquire();
        // The batch was taken on `stream`; it may have been used since on the
        // stream current here (a prefetching pattern): cover both.
        const c10::Stream current = gpu.getStream(stream->device());
        if (current != *stream) {
          first = waiter_->acquire();
          gpu.record(&first, *stream, stream->device_index(), c10::EventFlag::PYTORCH_DEFAULT);
          gpu.block(first, current);
          waiter_->discard(first);  // re-recording it later cannot affect this wait
        }
        gpu.record(&event, current, current.device_index(), c10::EventFlag::PYTORCH_DEFAULT);
        waiter_->add(seq, event);
        return;
      } catch (...) {
        // CUDA is failing (the process is exiting?): wait for the stream if it
        // still can, rather than hand back memory the GPU may still read.
        if (event != nullptr) waiter_->discard(event);
        try {
          gpu.synchronizeStream(*stream);
        } catch (...) {
        }
      }
    }
    released(seq);
  }

  std::shared_ptr<ReleaseToken> hold(uint64_t seq, std::shared_ptr<Channel> self,
                                     std::optional<c10::Stream> stream = std::nullopt) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ += 1;
    if (taken_ > 0) taken_ -= 1;
    return std::make_shared<ReleaseToken>(seq, std::move(self), stream);
  }

  // Waits for Welcome. Throws ProducerLost on timeout, Refused when refused.
  protocol::Welcome await_welcome(double timeout, const std::string& endpoint) {
    std::unique_lock<std::mutex> lock(mu_);
    bool answered = changed_.wait_for(lock, std::chrono::duration<double>(timeout),
                                      [&] { return welcome_ || !refusal_.empty() || !lost_.empty(); });
    if (!refusal_.empty()) throw Refused(refusal_);
    if (!lost_.empty()) throw ProducerLost(lost_);
    if (!answered) {
      throw ProducerLost("no batchcast producer named '" + name_ + "' answered within " +
                         std::to_string(static_cast<int>(timeout)) + " s (at " + endpoint +
                         "); start the producer first, or pass a longer timeout");
    }
    return *welcome_;
  }

  // The next message for the caller. Throws ProducerLost when the producer is gone.
  protocol::Message wait_message() {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return !inbox_.empty() || !lost_.empty() || !evicted_.empty(); };
    auto since = Clock::now();
    while (!changed_.wait_for(lock, std::chrono::seconds(1), ready)) {
      // Holding (nearly) the whole ring stalls the producer, and so this wait.
      if (!warned_ && welcome_ && held_ >= welcome_->slots - 1 &&
          Clock::now() - since > std::chrono::seconds(5)) {
        warned_ = true;
        std::fprintf(stderr,
                     "batchcast: consumer of '%s' has waited 5 s for a batch while this process "
                     "still references %lld batches of the producer's ring (it holds %lld); the "
                     "producer cannot reuse them until they are freed. Keep .clone()s of batches "
                     "you store, not the batches themselves.\n",
                     name_.c_str(), static_cast<long long>(held_),
                     static_cast<long long>(welcome_->slots));
      }
    }
    if (!evicted_.empty()) throw Evicted(evicted_);
    if (!lost_.empty()) throw ProducerLost(lost_);
    protocol::Message m = std::move(inbox_.front());
    inbox_.pop_front();
    if (std::holds_alternative<protocol::Announcement>(m)) taken_ += 1;  // until hold()
    if (std::holds_alternative<protocol::Finished>(m)) {
      done_ = true;  // nothing follows it: the ring can be let go once unreferenced
      wakeup_.notify();
    }
    return m;
  }

  struct RingView {
    const std::byte* base = nullptr;
    const cuda::ImportedRing* gpu = nullptr;
  };
  RingView ring() {
    std::lock_guard<std::mutex> lock(mu_);
    if (gpu_) return RingView{gpu_->data(), gpu_.get()};
    return RingView{region_ ? region_->data() : nullptr, nullptr};
  }

  // Stop taking batches (Consumer::close). Batches already handed out stay
  // valid; what was announced but not taken is released now.
  void leave() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (leaving_) return;
      leaving_ = true;
      for (const auto& m : inbox_) {
        if (const auto* a = std::get_if<protocol::Announcement>(&m)) releases_.push_back(a->seq);
      }
      inbox_.clear();
    }
    wakeup_.notify();
  }

  int64_t dropped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_;
  }
  int64_t held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  int64_t received() const {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }
  std::pair<int64_t, int64_t> ipc_opens() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {memory_opens_, event_opens_};
  }

 private:
  void released(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ -= 1;
    releases_.push_back(seq);
    wakeup_.notify();
  }

  void serve() {
    zmq::pollitem_t items[] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, wakeup_.fd(), ZMQ_POLLIN, 0}};
    std::optional<Clock::time_point> dead_since;
    bool bye_sent = false, unmapped_sent = false;
    while (true) {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
      if (items[1].revents & ZMQ_POLLIN) wakeup_.drain();
      receive_all();
      bool quit, say_bye, unmap;
      int64_t producer_pid;
      {
        std::lock_guard<std::mutex> lock(mu_);
        quit = quit_;
        if (quit) leaving_ = true;
        say_bye = leaving_ && !bye_sent;
        // Nothing references the ring and nothing more will (we left, or the
        // producer finished or evicted us and no announcement is still
        // queued): close it, so that the producer may free a GPU ring.
        const bool no_more = leaving_ || done_ || (finished_ && !announcement_queued() && taken_ == 0);
        unmap = !unmapped_sent && (quit || (no_more && held_ == 0 &&
                                            (!waiter_ || waiter_->pending() == 0)));
        producer_pid = welcome_ ? welcome_->producer_pid : 0;
      }
      if (say_bye) {
        send(protocol::Bye{});
        bye_sent = true;
      }
      if (unmap) unmap_ring();  // waits for the waiter: outside mu_
      std::vector<uint64_t> releases;
      {
        std::lock_guard<std::mutex> lock(mu_);
        releases.swap(releases_);
      }
      if (!releases.empty()) send(protocol::Release{std::move(releases)});
      if (unmap) {
        send(protocol::Unmapped{});
        unmapped_sent = true;
      }
      if (quit) return;
      // The producer's process is the liveness signal. Messages it sent just
      // before exiting may still be in flight: give them a moment.
      if (producer_pid > 0 && !finished_ && !process_alive(producer_pid)) {
        if (!dead_since) dead_since = Clock::now();
        if (Clock::now() - *dead_since > std::chrono::milliseconds(500)) {
          std::lock_guard<std::mutex> lock(mu_);
          if (lost_.empty()) {
            lost_ = "batchcast producer '" + name_ + "' (pid " + std::to_string(producer_pid) +
                    ") exited or was killed before finishing; restart it and this consumer";
          }
          changed_.notify_all();
        }
      }
    }
  }

  void unmap_ring() {
    std::unique_ptr<cuda::ReleaseWaiter> waiter;
    std::unique_ptr<cuda::ImportedRing> gpu;
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiter = std::move(waiter_);
      gpu = std::move(gpu_);
    }
    waiter.reset();  // its thread may still be finishing a release: it takes mu_
    gpu.reset();
  }

  void send(const protocol::Message& m) {
    std::string bytes = protocol::encode(m);
    try {
      dealer_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
  }

  void receive_all() {
    while (true) {
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(dealer_, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (parts.size() != 1) {
        dropped_ += 1;
        continue;
      }
      try {
        accept(protocol::decode(parts[0].data(), parts[0].size()));
      } catch (const MalformedMessage&) {
        dropped_ += 1;
      } catch (const Error& e) {  // mapping the ring failed (SystemError, CudaError)
        lost_ = std::string("cannot map the ring of producer '") + name_ + "': " + e.what();
      }
      changed_.notify_all();
    }
  }

  // Under mu_.
  void open_ring(const protocol::Ring& ring) {
    if (ring.on_gpu() && welcome_->producer_pid == ::getpid()) {
      throw CudaError("a consumer cannot map a GPU ring of a producer in its own process (CUDA IPC "
                      "handles open only in other processes); run the producer in another process");
    }
    if (ring.on_gpu()) {
      gpu_ = std::make_unique<cuda::ImportedRing>(ring.gpu_uuid, ring.memory_handle, ring.bytes,
                                                  ring.event_handles);
      memory_opens_ += 1;  // one ring allocation
      event_opens_ += gpu_->events();
      waiter_ = std::make_unique<cuda::ReleaseWaiter>(gpu_->device(),
                                                      [this](uint64_t seq) { released(seq); });
    } else {
      region_.emplace(SharedRegion::open(welcome_->producer_pid, ring.fd, ring.bytes));
    }
  }

  bool ring_open() const { return region_.has_value() || gpu_ != nullptr; }

  // Under mu_.
  bool announcement_queued() const {
    for (const auto& m : inbox_) {
      if (std::holds_alternative<protocol::Announcement>(m)) return true;
    }
    return false;
  }

  // Under mu_. Handles connection-level messages here; queues the rest.
  void accept(protocol::Message m) {
    if (auto* w = std::get_if<protocol::Welcome>(&m)) {
      if (welcome_) throw MalformedMessage("second welcome");
      welcome_ = *w;
      if (w->ring.exists()) open_ring(w->ring);
    } else if (auto* e = std::get_if<protocol::Evicted>(&m)) {
      if (!welcome_) throw MalformedMessage("eviction before welcome");
      evicted_ = e->reason;
      finished_ = true;  // no liveness checks any more: we are not a member
    } else if (auto* r = std::get_if<protocol::Refuse>(&m)) {
      refusal_ = r->reason.empty() ? "the producer refused this consumer" : r->reason;
    } else if (auto* ready = std::get_if<protocol::RingReady>(&m)) {
      if (welcome_ && ring_open() && welcome_->ring.exists() && welcome_->ring.bytes == ready->ring.bytes &&
          welcome_->ring.fd == ready->ring.fd && welcome_->ring.memory_handle == ready->ring.memory_handle) {
        return;  // joined between the ring's creation and its announcement: already open
      }
      if (!welcome_ || ring_open() || ready->ring.gpu_uuid != welcome_->ring.gpu_uuid) {
        throw MalformedMessage("unexpected ring");
      }
      welcome_->ring = ready->ring;
      if (!leaving_) open_ring(ready->ring);
    } else if (auto* a = std::get_if<protocol::Announcement>(&m)) {
      if (!ring_open()) throw MalformedMessage("announcement before the ring");
      const uint64_t size = gpu_ ? gpu_->size() : region_->size();
      for (const auto& leaf : a->leaves) {
        if (const auto* t = std::get_if<protocol::TensorLeaf>(&leaf)) {
          if (t->offset > size || t->nbytes() > size - t->offset) {
            throw MalformedMessage("tensor outside the ring");
          }
        }
      }
      if (gpu_ ? (a->event < 0 || a->event >= gpu_->events()) : a->event != -1) {
        throw MalformedMessage("bad slot event");
      }
      received_ += 1;
      if (leaving_) {
        releases_.push_back(a->seq);  // announced while we left: not ours to keep
        return;
      }
      inbox_.push_back(std::move(m));
    } else if (std::holds_alternative<protocol::Heartbeat>(m)) {
    } else if (std::holds_alternative<protocol::EpochEnd>(m) ||
               std::holds_alternative<protocol::LoaderFailed>(m) ||
               std::holds_alternative<protocol::Finished>(m)) {
      if (!welcome_) throw MalformedMessage("message before welcome");
      if (std::holds_alternative<protocol::Finished>(m)) finished_ = true;
      if (!leaving_) inbox_.push_back(std::move(m));
    } else {
      throw MalformedMessage(std::string("unexpected ") + protocol::kind_name(m));
    }
  }

  std::string name_;
  zmq::context_t context_;
  zmq::socket_t dealer_;
  Wakeup wakeup_;
  std::thread io_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::optional<protocol::Welcome> welcome_;
  std::optional<SharedRegion> region_;
  std::unique_ptr<cuda::ImportedRing> gpu_;
  std::unique_ptr<cuda::ReleaseWaiter> waiter_;
  std::deque<protocol::Message> inbox_;
  std::vector<uint64_t> releases_;
  std::string refusal_;
  std::string lost_;
  std::string evicted_;
  bool leaving_ = false;  // the consumer closed: Bye, and take nothing more
  bool quit_ = false;     // the channel is being destroyed
  bool done_ = false;     // the caller took Finished: no batch will come
  bool warned_ = false;
  std::atomic<bool> finished_{false};
  int64_t dropped_ = 0;
  int64_t held_ = 0;
  int64_t taken_ = 0;  // announcements handed to the caller, not yet held
  int64_t received_ = 0;
  int64_t memory_opens_ = 0;
  int64_t event_opens_ = 0;
};

Consumer::Consumer(ConsumerOptions options)
    : options_(std::move(options)), rebatcher_(options_.batch_size, options_.drop_last) {
  validate_name(options_.name);
  if (options_.timeout <= 0) throw InvalidArgument("timeout must be positive (seconds)");
  std::string endpoint = endpoint_for(runtime_dir(options_.runtime_dir), options_.name);
  channel_ = std::make_shared<Channel>(options_.name, endpoint,
                                       options_.catch_up ? protocol::Hello::kCatchUp : 0u);
  try {
    protocol::Welcome w = channel_->await_welcome(options_.timeout, endpoint);
    next_epoch_ = w.first_epoch;
    // The ring has room for slots+1 loader batches; holding at most this many
    // pending (plus the batch the caller holds) always leaves the producer one.
    rebatcher_.set_max_pending(std::max<int64_t>(0, (w.slots - 2) / 2));
    samples_per_epoch_ = w.samples_per_epoch;
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
  if (!at::hasCUDA()) {
    throw CudaError("producer '" + options_.name + "' serves from GPU " + cuda::uuid_text(ring.gpu_uuid) +
                    " but the torch in this process has no CUDA support; install a CUDA build of "
                    "torch here");
  }
  ring_device_ = cuda::visible_device(ring.gpu_uuid);
  const c10::Device ring_device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ring_device_));
  if (want == Placement::Host) {
    transfer_ = Transfer::DeviceToHost;
    device_ = c10::kCPU;
  } else if (want == Placement::Auto || options_.cuda_device == ring_device_) {
    transfer_ = Transfer::View;
    device_ = ring_device;
  } else {
    transfer_ = cuda::can_access_peer(options_.cuda_device, ring_device_) ? Transfer::Peer
                                                                          : Transfer::HostStaged;
    device_ = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(options_.cuda_device));
  }
}

Consumer::~Consumer() {
  close();
  rebatcher_.clear();
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
  if (samples_per_epoch_ < 0) return -1;
  int64_t b = options_.batch_size;
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
  while (true) {
    if (auto b = rebatcher_.pop()) {
      batches_ += 1;
      samples_ += b->samples;
      return b;
    }
    protocol::Message m = channel_->wait_message();
    if (auto* a = std::get_if<protocol::Announcement>(&m)) {
      if (a->epoch != epoch_) {
        channel_->hold(a->seq, channel_);  // not ours: the token releases it at once
        continue;
      }
      mid_epoch_ = true;
      receive(*a);
    } else if (auto* end = std::get_if<protocol::EpochEnd>(&m)) {
      if (end->epoch != epoch_) continue;
      samples_per_epoch_ = end->samples;
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
      bool started = rebatcher_.buffered() > 0 || mid_epoch_;
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

// One loader batch of the current epoch: views where it lies, or one copy to
// where this consumer wants it. GPU ordering: the caller's current stream
// waits on the slot's event (the producer's copy); no device-wide sync.
void Consumer::receive(protocol::Announcement& a) {
  Channel::RingView ring = channel_->ring();
  if (transfer_ == Transfer::SharedMemory) {
    auto token = channel_->hold(a.seq, channel_);
    rebatcher_.push(LoaderBatch{std::move(a), ring.base, std::move(token), {}, c10::kCPU});
    return;
  }
  // The token first: whatever throws below, the slot is released.
  auto token = channel_->hold(a.seq, channel_);
  if (ring.gpu == nullptr) throw ProducerLost("the GPU ring of producer '" + options_.name + "' is closed");
  c10::impl::VirtualGuardImpl gpu(c10::DeviceType::CUDA);
  const c10::Device ring_device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ring_device_));
  const c10::Stream stream = gpu.getStream(ring_device);
  token->set_stream(stream);
  gpu.block(ring.gpu->event(a.event), stream);
  if (transfer_ == Transfer::View) {
    rebatcher_.push(LoaderBatch{std::move(a), ring.base, std::move(token), {}, ring_device});
    return;
  }
  // One copy per loader batch, issued on the ring device's current stream;
  // the slot is released once that stream is past the copy.
  LoaderBatch batch;
  batch.device = device_;
  for (const auto& leaf : a.leaves) {
    if (const auto* t = std::get_if<protocol::TensorLeaf>(&leaf)) {
      auto options = at::TensorOptions().dtype(from_wire(t->dtype)).device(ring_device);
      at::Tensor view = at::from_blob(const_cast<std::byte*>(ring.base + t->offset), t->shape,
                                      [](void*) {}, options, ring_device);
      batch.owned.push_back(view.to(device_));  // to host: synchronous
    } else {
      batch.owned.emplace_back();
    }
  }
  transfers_ += 1;
  token.reset();  // released once the stream is past the copy (to host: already done)
  batch.announcement = std::move(a);
  rebatcher_.push(std::move(batch));
}

ConsumerStats Consumer::stats() const {
  ConsumerStats s;
  s.id = id_;
  s.epoch = epoch_;
  s.batches = batches_;
  s.samples = samples_;
  s.loader_batches = channel_->received();
  s.views = rebatcher_.stats().views;
  s.copies = rebatcher_.stats().copies;
  s.spills = rebatcher_.stats().spills;
  s.slots_held = channel_->held();
  s.dropped_messages = channel_->dropped();
  s.device = device_.str();
  static constexpr const char* kTransfers[] = {"shared-memory", "view", "peer", "host-staged",
                                               "device-to-host"};
  s.transfer = kTransfers[static_cast<int>(transfer_)];
  std::tie(s.ipc_memory_opens, s.ipc_event_opens) = channel_->ipc_opens();
  s.transfers = transfers_;
  return s;
}

}  // namespace batchcast
