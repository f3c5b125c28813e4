#include "batchcast/producer/producer.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iterator>

#include <zmq_addon.hpp>

#include "batchcast/common/error.h"

namespace batchcast {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr auto kLivenessPeriod = std::chrono::milliseconds(200);

// A leaf's room in pinned staging: 256-byte aligned, as DMA likes it.
uint64_t staged_size(uint64_t bytes) { return (bytes + 255) / 256 * 256; }
// Holder id for slots kept for catch-up joins; ZeroMQ routing ids are never empty.
const std::string kRetention;

}  // namespace

Producer::Producer(ProducerOptions options)
    : options_(std::move(options)), context_(1), router_(context_, zmq::socket_type::router) {
  validate_name(options_.name);
  if (options_.slots < 2) throw InvalidArgument("slots must be at least 2");
  if (options_.catch_up_window < 0) options_.catch_up_window = options_.slots / 2;
  if (options_.catch_up_window > options_.slots / 2) {
    throw InvalidArgument("catch_up_window must be at most slots / 2 (" +
                          std::to_string(options_.slots / 2) + "); raise slots");
  }
  if (options_.cuda_device >= 0) {
    if (!cuda::built()) (void)cuda::device_uuid(options_.cuda_device);  // throws: no CUDA transport
    int visible = cuda::device_count();
    if (options_.cuda_device >= visible) {
      throw CudaError("cannot serve from cuda:" + std::to_string(options_.cuda_device) + ": this process sees " +
                      std::to_string(visible) + " GPU(s)");
    }
    ring_.gpu_uuid = cuda::device_uuid(options_.cuda_device);
  }
  if (!(options_.linger >= 0)) throw InvalidArgument("linger must be >= 0 seconds");
  dir_ = runtime_dir(options_.runtime_dir);
  endpoint_ = endpoint_for(dir_, options_.name);
  lock_ = std::make_unique<NameLock>(dir_, options_.name);
  router_.set(zmq::sockopt::router_mandatory, 1);
  router_.set(zmq::sockopt::sndhwm, 0);
  router_.set(zmq::sockopt::rcvhwm, 0);
  router_.set(zmq::sockopt::linger, 2000);
  router_.bind(endpoint_);
  io_ = std::thread([this] { serve(); });
}

Producer::~Producer() { close(); }

void Producer::close() {
  std::lock_guard<std::mutex> closing(close_mu_);
  if (closed_) return;
  closed_ = true;
  stop();
  {
    // Whatever way this producer ends, its consumers hear of it: mid-epoch they
    // raise ProducerLost instead of waiting on a live process forever.
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) {
      finished_ = true;
      outbox_.push_back(Outgoing{Route::Finish, -1, 0,
                                 protocol::encode(protocol::Finished{epochs_done_})});
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return publishing_ == 0; });  // stop() ended every wait
  }
  if (ring_.on_gpu()) await_unmapped();
  quit_io_ = true;
  wakeup_.notify();
  if (io_.joinable()) io_.join();
  gpu_.reset();
  router_.close();
  context_.close();
  lock_.reset();  // the name is free again
}

// Freeing GPU memory that another process still maps is undefined behaviour in
// CUDA IPC, so a GPU ring outlives its producer object until every consumer
// that was given it has unmapped it or exited.
void Producer::await_unmapped() {
  std::unique_lock<std::mutex> lock(mu_);
  auto mapped = [&] {
    std::vector<int64_t> pids;
    for (const auto& [peer, m] : members_) {
      if (m.mapped) pids.push_back(m.pid);
    }
    for (const auto& [peer, pid] : evicted_importers_) pids.push_back(pid);
    return pids;
  };
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.linger));
  bool told = false;
  while (!mapped().empty()) {
    Clock::time_point next = std::min<Clock::time_point>(deadline, Clock::now() + std::chrono::seconds(5));
    changed_.wait_until(lock, next);
    auto pids = mapped();
    if (pids.empty()) break;
    std::string list;
    for (int64_t pid : pids) list += (list.empty() ? "" : ", ") + std::to_string(pid);
    if (Clock::now() >= deadline) {
      std::fprintf(stderr,
                   "batchcast: producer '%s': freeing its GPU ring after %.0f s (linger) although "
                   "consumer pid(s) %s still map it; their batches are no longer valid\n",
                   options_.name.c_str(), options_.linger, list.c_str());
      return;
    }
    if (!told) {
      told = true;
      std::fprintf(stderr,
                   "batchcast: producer '%s' is waiting for consumer pid(s) %s to free the batches "
                   "they hold before freeing its GPU ring (at most %.0f s)\n",
                   options_.name.c_str(), list.c_str(), options_.linger);
    }
  }
}

bool Producer::wait_for_consumers(int64_t count, double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return stopping_ || active_members() >= count; };
  if (timeout_seconds < 0) {
    changed_.wait(lock, ready);
  } else if (!changed_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), ready)) {
    return false;
  }
  if (stopping_) throw Stopped("producer stopped");
  return true;
}

void Producer::begin_epoch(int64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch_ = epoch;
    epoch_batches_ = 0;
    epoch_samples_ = 0;
  }
  enqueue(Outgoing{Route::EpochBegin, epoch, 0, {}});
}

void Producer::create_ring(const std::vector<uint64_t>& leaf_bytes) {
  uint64_t total = 0;
  for (uint64_t b : leaf_bytes) total += b;
  // One batch more than asked: a lane's FIFO can waste up to a batch at its wrap.
  const uint64_t slots = static_cast<uint64_t>(options_.slots) + 1;
  double scale = 1.0;
  if (total > 0 && options_.ring_bytes > total * slots) {
    scale = static_cast<double>(options_.ring_bytes) / static_cast<double>(total * slots);
  }
  std::vector<uint64_t> capacities;
  for (uint64_t b : leaf_bytes) {
    capacities.push_back(static_cast<uint64_t>(static_cast<double>(b * slots) * scale));
  }
  LaneAllocator lanes(capacities);
  protocol::Ring ring = ring_;
  ring.bytes = std::max<uint64_t>(lanes.total_bytes(), 1);
  // Built aside and kept only once complete: a failure leaves no half ring.
  if (options_.cuda_device >= 0) {
    // Twice as many events as slots: smaller later batches can put more in flight.
    const int events = static_cast<int>(2 * slots);
    auto gpu = std::make_unique<cuda::DeviceRing>(options_.cuda_device, ring.bytes, events);
    ring.memory_handle = gpu->memory_handle();
    ring.event_handles = gpu->event_handles();
    gpu_ = std::move(gpu);
    for (int e = events - 1; e >= 0; --e) free_events_.push_back(e);
  } else {
    SharedRegion region = SharedRegion::create(lanes.total_bytes(), options_.name);
    ring.fd = region.fd();
    region_.emplace(std::move(region));
  }
  ring_ = std::move(ring);
  lanes_.emplace(std::move(lanes));
  stats_.ring_bytes = lanes_->total_bytes();
  outbox_.push_back(Outgoing{Route::Ring, -1, 0, protocol::encode(protocol::RingReady{ring_})});
  wakeup_.notify();
}

double Producer::publish(const Batch& batch) {
  auto start = Clock::now();
  double waited = 0;
  std::vector<uint64_t> bytes, align;
  for (const Leaf& leaf : batch.leaves) {
    if (const auto* t = std::get_if<at::Tensor>(&leaf)) {
      if (t->dim() == 0 || t->size(0) != batch.samples) {
        throw InvalidArgument("every tensor in a batch needs dim 0 = " +
                              std::to_string(batch.samples) + " samples");
      }
      if (options_.cuda_device >= 0 && !t->device().is_cpu()) {
        throw InvalidArgument("a producer serving from cuda:" + std::to_string(options_.cuda_device) +
                              " copies batches from host memory, but this batch has a tensor on " +
                              t->device().str() + "; let the loader return CPU tensors");
      }
      (void)to_wire(t->scalar_type());
      bytes.push_back(static_cast<uint64_t>(t->numel()) * t->element_size());
      align.push_back(t->element_size());
    } else if (static_cast<int64_t>(std::get<Items>(leaf).values.size()) != batch.samples) {
      throw InvalidArgument("every per-sample list in a batch needs " +
                            std::to_string(batch.samples) + " items");
    }
  }

  std::optional<LaneAllocator::Slot> slot;
  int event = -1;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) throw Stopped("producer stopped");
    if (!lanes_) create_ring(bytes);
    auto wait_start = Clock::now();
    waiting_for_space_ = true;
    changed_.wait(lock, [&] {
      if (stopping_) return true;
      if (gpu_ && free_events_.empty()) return false;
      slot = lanes_->try_allocate(bytes, align);
      return slot.has_value();
    });
    waiting_for_space_ = false;
    waited = seconds_since(wait_start);
    stats_.wait_seconds += waited;
    if (stopping_) throw Stopped("producer stopped");
    if (gpu_) {
      event = free_events_.back();
      free_events_.pop_back();
      slot_events_[slot->seq] = event;
    }
    publishing_ += 1;  // close() waits for this copy before freeing the ring
  }
  struct Done {
    Producer* p;
    ~Done() {
      std::lock_guard<std::mutex> lock(p->mu_);
      p->publishing_ -= 1;
      p->changed_.notify_all();
    }
  } done{this};
  try {
    return copy_and_announce(batch, *slot, event, bytes, start, waited);
  } catch (...) {
    // Nothing was announced: the slot and its event go back. A GPU copy may
    // be half queued; wait for it so that its staging buffer can be reused.
    if (gpu_) {
      try {
        gpu_->synchronize();
      } catch (const Error&) {
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    free_slot(slot->seq);
    changed_.notify_all();
    throw;
  }
}

double Producer::copy_and_announce(const Batch& batch, const LaneAllocator::Slot& slot, int event,
                                   const std::vector<uint64_t>& bytes, Clock::time_point start,
                                   double waited) {
  protocol::Announcement ann;
  ann.seq = slot.seq;
  ann.event = event;
  // GPU ring: leaves are gathered into pinned staging, then copied on the
  // ring's stream; the call returns while the copy runs.
  std::byte* staged = nullptr;
  uint64_t staged_at = 0;
  if (gpu_) {
    uint64_t total = 0;
    for (uint64_t b : bytes) total += staged_size(b);
    staged = gpu_->staging(std::max<uint64_t>(total, 256));
  }
  ann.samples = batch.samples;
  ann.layout = batch.layout;
  std::size_t lane = 0;
  for (const Leaf& leaf : batch.leaves) {
    if (const auto* t = std::get_if<at::Tensor>(&leaf)) {
      uint64_t offset = slot.offsets[lane++];
      if (t->numel() > 0 && gpu_) {
        const uint64_t n = static_cast<uint64_t>(t->numel()) * t->element_size();
        at::from_blob(staged + staged_at, t->sizes(), at::TensorOptions().dtype(t->scalar_type()))
            .copy_(*t);
        gpu_->copy_in(staged + staged_at, offset, n);
        staged_at += staged_size(n);
      } else if (t->numel() > 0) {
        at::Tensor dst = at::from_blob(region_->data() + offset, t->sizes(),
                                       at::TensorOptions().dtype(t->scalar_type()));
        dst.copy_(*t);
      }
      ann.leaves.push_back(protocol::TensorLeaf{to_wire(t->scalar_type()), t->sizes().vec(), offset});
    } else {
      const auto& items = std::get<Items>(leaf);
      ann.leaves.push_back(protocol::ListLeaf{items.kind, items.values});
    }
  }

  if (gpu_) gpu_->commit(event);

  std::lock_guard<std::mutex> lock(mu_);
  ann.epoch = epoch_;
  ann.index = epoch_batches_++;
  epoch_samples_ += batch.samples;
  stats_.batches_published += 1;
  for (uint64_t b : bytes) stats_.bytes_published += static_cast<int64_t>(b);
  stats_.publish_seconds += seconds_since(start) - waited;
  outbox_.push_back(Outgoing{Route::Batch, ann.epoch, ann.seq, protocol::encode(ann)});
  wakeup_.notify();
  return waited;
}

void Producer::end_epoch() {
  std::lock_guard<std::mutex> lock(mu_);
  protocol::EpochEnd end{epoch_, epoch_samples_, epoch_batches_};
  if (options_.samples_per_epoch < 0) options_.samples_per_epoch = epoch_samples_;
  epochs_done_ += 1;
  outbox_.push_back(Outgoing{Route::EpochEnd, epoch_, 0, protocol::encode(end)});
  wakeup_.notify();
}

void Producer::fail(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  outbox_.push_back(Outgoing{Route::Everyone, epoch_, 0,
                             protocol::encode(protocol::LoaderFailed{std::max<int64_t>(epoch_, 0), message})});
  wakeup_.notify();
}

void Producer::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  outbox_.push_back(Outgoing{Route::Finish, -1, 0, protocol::encode(protocol::Finished{epochs_done_})});
  wakeup_.notify();
  // Return once the I/O thread has handed everything to ZeroMQ.
  changed_.wait_for(lock, std::chrono::seconds(5), [&] { return outbox_.empty(); });
}

void Producer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  wakeup_.notify();
}

void Producer::enqueue(Outgoing out) {
  std::lock_guard<std::mutex> lock(mu_);
  outbox_.push_back(std::move(out));
  wakeup_.notify();
}

int64_t Producer::consumer_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_members();
}

int64_t Producer::active_members() const {
  int64_t n = 0;
  for (const auto& [peer, m] : members_) n += m.leaving ? 0 : 1;
  return n;
}

ProducerStats Producer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ProducerStats s = stats_;
  s.ring_device = options_.cuda_device >= 0 ? "cuda:" + std::to_string(options_.cuda_device) : "cpu";
  s.slots_in_use = lanes_ ? static_cast<int64_t>(lanes_->in_flight_seqs().size()) : 0;
  for (const auto& [peer, m] : members_) {
    ConsumerInfo info{m.id, m.pid, m.first_epoch, 0, m.batches_sent, m.leaving};
    for (const auto& [seq, hold] : held_) info.slots_held += static_cast<int64_t>(hold.holders.count(peer));
    s.consumers.push_back(info);
  }
  return s;
}

// ---- I/O thread ---------------------------------------------------------

void Producer::serve() {
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wakeup_.fd(), ZMQ_POLLIN, 0}};
  auto last_check = Clock::now();
  while (true) {
    zmq::poll(items, 2, kLivenessPeriod);
    if (items[1].revents & ZMQ_POLLIN) wakeup_.drain();
    while (true) {
      std::vector<zmq::message_t> parts;  // [peer routing id, body]
      if (!zmq::recv_multipart(router_, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
      std::lock_guard<std::mutex> lock(mu_);
      if (parts.size() != 2) {
        stats_.dropped_messages += 1;
        continue;
      }
      handle(parts[0].to_string(), parts[1].data(), parts[1].size());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!outbox_.empty()) {
        deliver(outbox_.front());
        outbox_.pop_front();
      }
      if (Clock::now() - last_check >= kLivenessPeriod) {
        last_check = Clock::now();
        check_liveness();
        evict_stragglers();
      }
    }
    changed_.notify_all();
    if (quit_io_) break;
  }
}

void Producer::send_to(const std::string& peer, const std::string& bytes) {
  try {
    router_.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    router_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // EHOSTUNREACH: the peer's connection is gone; liveness removes it.
  }
}

void Producer::handle(const std::string& peer, const void* data, std::size_t size) {
  protocol::Message msg;
  try {
    msg = protocol::decode(data, size);
  } catch (const protocol::VersionMismatch& e) {
    stats_.refused += 1;
    send_to(peer, protocol::encode(protocol::Refuse{
                      std::string("producer '") + options_.name + "' speaks batchcast protocol " +
                      std::to_string(protocol::kVersion) + " but this consumer speaks " +
                      std::to_string(e.version()) + "; install the same batchcast version on both"}));
    return;
  } catch (const MalformedMessage&) {
    stats_.dropped_messages += 1;
    return;
  }
  auto member = members_.find(peer);
  if (const auto* hello = std::get_if<protocol::Hello>(&msg)) {
    if (member != members_.end() || hello->pid <= 0) {
      stats_.dropped_messages += 1;
      return;
    }
    Member m{next_member_id_++, hello->pid, next_joinable_epoch_};
    // Catch-up: join the current epoch from its start while all of its
    // batches so far are retained; else fall back to the next epoch.
    bool catch_up = (hello->flags & protocol::Hello::kCatchUp) != 0 && delivered_epoch_ >= 0;
    if (catch_up && static_cast<int64_t>(retained_.size()) == delivered_in_epoch_) {
      m.first_epoch = delivered_epoch_;
    } else if (catch_up) {
      std::fprintf(stderr,
                   "batchcast: producer '%s': consumer pid %lld joined epoch %lld after its first "
                   "%lld batches (catch_up_window); it starts at epoch %lld\n",
                   options_.name.c_str(), static_cast<long long>(hello->pid),
                   static_cast<long long>(delivered_epoch_),
                   static_cast<long long>(options_.catch_up_window),
                   static_cast<long long>(m.first_epoch));
    }
    members_.emplace(peer, m);
    stats_.joins += 1;
    protocol::Welcome w;
    w.producer_pid = ::getpid();
    w.ring = ring_;
    members_[peer].mapped = ring_.on_gpu() && ring_.exists();
    w.consumer_id = m.id;
    w.first_epoch = m.first_epoch;
    w.samples_per_epoch = options_.samples_per_epoch;
    w.slots = options_.slots;
    send_to(peer, protocol::encode(w));
    if (!finished_bytes_.empty()) {  // nothing more will come: say so at once
      send_to(peer, finished_bytes_);
      return;
    }
    if (m.first_epoch == delivered_epoch_) {
      for (const auto& [seq, bytes] : retained_) {
        held_[seq].holders.insert(peer);
        members_[peer].batches_sent += 1;
        send_to(peer, bytes);
      }
    }
    return;
  }
  if (member == members_.end()) {
    if (std::holds_alternative<protocol::Unmapped>(msg)) evicted_importers_.erase(peer);
    // Late words of a consumer already forgotten (it unmapped, was evicted or
    // timed out) are expected; anything else is not.
    if (!std::holds_alternative<protocol::Release>(msg) && !std::holds_alternative<protocol::Bye>(msg) &&
        !std::holds_alternative<protocol::Unmapped>(msg)) {
      stats_.dropped_messages += 1;
    }
    return;
  }
  if (const auto* release = std::get_if<protocol::Release>(&msg)) {
    for (uint64_t seq : release->seqs) drop_holder(seq, peer);
  } else if (std::holds_alternative<protocol::Bye>(msg)) {
    if (!member->second.leaving) stats_.leaves += 1;
    member->second.leaving = true;
    forget_if_done(peer);
  } else if (std::holds_alternative<protocol::Unmapped>(msg)) {
    // It references nothing: holds left are announcements it never took.
    if (!member->second.leaving) stats_.leaves += 1;
    remove_member(peer, Departure::Gone);
  } else {
    stats_.dropped_messages += 1;
  }
}

void Producer::deliver(Outgoing& out) {
  switch (out.route) {
    case Route::EpochBegin:  // newcomers may still join this epoch until its first batch
      next_joinable_epoch_ = std::max(next_joinable_epoch_, out.epoch);
      break;
    case Route::Batch: {
      if (next_joinable_epoch_ <= out.epoch) next_joinable_epoch_ = out.epoch + 1;
      if (out.epoch != delivered_epoch_) {
        end_retention();
        delivered_epoch_ = out.epoch;
        delivered_in_epoch_ = 0;
      }
      delivered_in_epoch_ += 1;
      if (delivered_in_epoch_ > options_.catch_up_window) end_retention();
      auto slot = held_.emplace(out.seq, SlotHold{{}, Clock::now()}).first;
      if (delivered_in_epoch_ <= options_.catch_up_window) {
        retained_.emplace_back(out.seq, out.bytes);
        slot->second.holders.insert(kRetention);
      }
      for (auto& [peer, m] : members_) {
        if (m.first_epoch > out.epoch || m.leaving) continue;
        slot->second.holders.insert(peer);
        m.batches_sent += 1;
        send_to(peer, out.bytes);
      }
      free_if_unheld(slot);
      break;
    }
    case Route::EpochEnd:
      end_retention();
      delivered_epoch_ = -1;  // no epoch in progress: every newcomer gets the next
      delivered_in_epoch_ = 0;
      next_joinable_epoch_ = std::max(next_joinable_epoch_, out.epoch + 1);
      for (auto& [peer, m] : members_) {
        if (m.first_epoch <= out.epoch && !m.leaving) send_to(peer, out.bytes);
      }
      break;
    case Route::Finish:
      finished_bytes_ = out.bytes;  // for consumers that join later
      [[fallthrough]];
    case Route::Ring:
    case Route::Everyone:  // LoaderFailed
      for (auto& [peer, m] : members_) {
        if (m.leaving) continue;
        if (out.route == Route::Ring && ring_.on_gpu()) m.mapped = true;
        send_to(peer, out.bytes);
      }
      break;
  }
}

void Producer::drop_holder(uint64_t seq, const std::string& peer) {
  auto slot = held_.find(seq);
  if (slot == held_.end()) return;
  slot->second.holders.erase(peer);
  free_if_unheld(slot);
  forget_if_done(peer);
}

// A member that said goodbye is forgotten once it holds nothing (and has
// unmapped a GPU ring); until then its slots stay its own.
void Producer::forget_if_done(const std::string& peer) {
  auto m = members_.find(peer);
  if (m == members_.end() || !m->second.leaving || m->second.mapped) return;
  for (const auto& [seq, hold] : held_) {
    if (hold.holders.count(peer)) return;
  }
  members_.erase(m);
}

void Producer::free_if_unheld(std::map<uint64_t, SlotHold>::iterator slot) {
  if (!slot->second.holders.empty()) return;
  free_slot(slot->first);
  held_.erase(slot);
}

// Under mu_: the slot's ring space and, for a GPU ring, its event are free again.
void Producer::free_slot(uint64_t seq) {
  lanes_->release(seq);
  auto event = slot_events_.find(seq);
  if (event != slot_events_.end()) {
    free_events_.push_back(event->second);
    slot_events_.erase(event);
  }
}

void Producer::remove_member(const std::string& peer, Departure how) {
  std::vector<uint64_t> held;
  for (const auto& [seq, hold] : held_) {
    if (hold.holders.count(peer)) held.push_back(seq);
  }
  members_.erase(peer);
  for (uint64_t seq : held) drop_holder(seq, peer);
  switch (how) {
    case Departure::Gone: break;  // counted as a leave when it said so
    case Departure::Crashed: stats_.crashes += 1; break;
    case Departure::Evicted: stats_.evictions += 1; break;
  }
}

void Producer::end_retention() {
  auto retained = std::move(retained_);
  retained_.clear();
  for (const auto& [seq, bytes] : retained) drop_holder(seq, kRetention);
}

void Producer::evict_stragglers() {
  if (options_.straggler_timeout <= 0 || !waiting_for_space_ || held_.empty()) return;
  auto oldest = held_.begin();
  double held = std::chrono::duration<double>(Clock::now() - oldest->second.since).count();
  if (held < options_.straggler_timeout) return;
  std::vector<std::string> slow(oldest->second.holders.begin(), oldest->second.holders.end());
  for (const auto& peer : slow) {
    auto m = members_.find(peer);
    if (m == members_.end()) continue;  // the catch-up retention, not a consumer
    std::string reason = "batchcast producer '" + options_.name + "' evicted this consumer (pid " +
                         std::to_string(m->second.pid) + "): it held a batch for " +
                         std::to_string(static_cast<int>(held)) +
                         " s while the others waited (straggler_timeout=" +
                         std::to_string(options_.straggler_timeout) +
                         " s); consume faster, .clone() batches you keep, or raise the timeout";
    send_to(peer, protocol::encode(protocol::Evicted{reason}));
    // It may still read a GPU ring it mapped: the ring outlives it until it
    // says Unmapped or exits.
    if (m->second.mapped) evicted_importers_[peer] = m->second.pid;
    remove_member(peer, Departure::Evicted);
  }
}

void Producer::check_liveness() {
  std::vector<std::string> dead;
  for (const auto& [peer, m] : members_) {
    if (!process_alive(m.pid)) dead.push_back(peer);
  }
  for (const auto& peer : dead) remove_member(peer, Departure::Crashed);
  for (auto it = evicted_importers_.begin(); it != evicted_importers_.end();) {
    it = process_alive(it->second) ? std::next(it) : evicted_importers_.erase(it);
  }
}

}  // namespace batchcast
