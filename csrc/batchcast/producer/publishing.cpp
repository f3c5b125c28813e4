// What the producer publishes, in the stream's order: epochs begun and
// ordered, batches validated, given a slot (waiting for room), written into
// the ring and announced; leases of slots for loader workers to write into;
// the epoch's end, the loader's failure, the stream's end (finish, stop).
#include "batchcast/producer/producer.h"

#include <algorithm>
#include <chrono>

#include "batchcast/common/error.h"
#include "batchcast/producer/internal.h"
#include "batchcast/protocol/dtype.h"

namespace batchcast {

void Producer::begin_epoch(int64_t epoch) {
  std::unique_lock<std::mutex> lock(mu_);
  check_serving("begin_epoch");
  // The last epoch's batches and end reach the membership first: whoever
  // joins from here on starts at this epoch, whole.
  wait(lock, signals_->drained, -1, [&] { return stream_.empty() || io_error_ != nullptr || stopping(); });
  rethrow_io_error();
  if (stopping()) throw Stopped("producer stopped");
  epoch_ = epoch;
  epoch_batches_ = 0;
  epoch_samples_ = 0;
  last_publish_end_ = Clock::now();
  membership_.steer_epoch(epoch);
  stream_.push_back(EpochBegin{epoch});
  wakeup_.notify();
}

std::vector<int64_t> Producer::order_epoch(std::vector<int64_t> fresh) {
  std::lock_guard<std::mutex> lock(mu_);
  return membership_.order_epoch(std::move(fresh));
}

Producer::Layout Producer::validate(const Batch& batch) const {
  Layout layout;
  for (const Leaf& leaf : batch.leaves) {
    if (const auto* t = std::get_if<Tensor>(&leaf)) {
      if (t->dim() == 0 || t->size(0) != batch.samples) {
        throw InvalidArgument("every tensor in a batch needs dim 0 = " + std::to_string(batch.samples) +
                              " samples");
      }
      (void)protocol::to_wire(t->scalar_type());
      layout.bytes.push_back(static_cast<uint64_t>(t->numel()) * t->element_size());
      layout.align.push_back(t->element_size());
    } else if (static_cast<int64_t>(std::get<Items>(leaf).values.size()) != batch.samples) {
      throw InvalidArgument("every per-sample list in a batch needs " + std::to_string(batch.samples) +
                            " items");
    }
  }
  if (!batch.indices.empty() && static_cast<int64_t>(batch.indices.size()) != batch.samples) {
    throw InvalidArgument("a batch of " + std::to_string(batch.samples) + " samples names " +
                          std::to_string(batch.indices.size()) + " sample indices (give one per sample, or none)");
  }
  ring_->check(batch);
  return layout;
}

void Producer::note_loader_time() {
  if (last_publish_end_) {  // since the last batch went out: the loader's time
    stats_.loader_seconds += seconds_since(*last_publish_end_);
    last_publish_end_.reset();
  }
}

RingSlot Producer::reserve(const Layout& layout, const Batch& batch, double& waited) {
  std::unique_lock<std::mutex> lock(mu_);
  rethrow_io_error();
  note_loader_time();
  check_serving("publish");
  if (!ring_->allocated()) {
    ring_->allocate(layout.bytes);  // sized from the first batch
    first_ = layout;
    stats_.ring_bytes = ring_->bytes();
    stream_.push_back(protocol::RingReady{ring_->description()});
  }
  ring_->check_fits(layout.bytes, batch);
  RingSlot slot = wait_for_slot(lock, layout, waited, /*lease=*/false);
  slots_.write(slot.seq);
  publishing_ += 1;  // close() waits for this write before freeing the ring
  return slot;
}

RingSlot Producer::wait_for_slot(std::unique_lock<std::mutex>& lock, const Layout& layout,
                                 double& waited, bool lease) {
  std::optional<RingSlot> slot;
  const auto wait_start = Clock::now();
  waiting_for_space_ = true;
  waiting_since_ = wait_start;
  bool told = false;
  try {
    wait(lock, signals_->space, -1, [&] {
      if (!slot && phase_ == Phase::Serving) {
        slot = ring_->try_reserve(layout.bytes, layout.align, membership_.kept_slots());
        if (slot && lease) slots_.lease(slot->seq, SlotLedger::Place{slot->offsets, slot->event});
        if (slot && !lease) slots_.reserve(slot->seq);
      }
      if (!slot && !told) {
        // Releases wait in the mailboxes until the I/O thread looks: from
        // now on it asks the consumers to ring it.
        told = true;
        wakeup_.notify();
      }
      return slot.has_value() || phase_ != Phase::Serving;
    });
  } catch (...) {
    waiting_for_space_ = false;
    if (slot) slots_.abandon(slot->seq);
    throw;
  }
  waiting_for_space_ = false;
  waited = seconds_since(wait_start);
  stats_.wait_seconds += waited;
  if (phase_ != Phase::Serving) {  // stopped, or the stream ended from another thread
    if (slot) slots_.abandon(slot->seq);
    rethrow_io_error();
    check_serving("publish");
  }
  return std::move(*slot);
}

double Producer::publish(const Batch& batch, std::optional<uint64_t> lease, bool in_place) {
  const auto start = Clock::now();
  const Layout layout = validate(batch);
  double waited = 0;
  std::optional<RingSlot> leased;
  if (in_place && !lease) throw InvalidArgument("publish: a batch written in place names no lease");
  if (lease) leased = claim_lease(*lease, batch, layout, in_place);
  // A lease the batch could not use stays reserved until the copy out of it
  // is done, so nothing else is written over what is being copied.
  struct Unused {
    Producer* p;
    bool give_back;
    uint64_t seq;
    ~Unused() {
      if (give_back) p->return_lease(seq);
    }
  } unused{this, lease.has_value() && !leased.has_value(), lease.value_or(0)};
  RingSlot slot = leased ? std::move(*leased) : reserve(layout, batch, waited);
  struct Done {  // whatever happens below, close() may go on afterwards
    Producer* p;
    ~Done() {
      std::lock_guard<std::mutex> lock(p->mu_);
      p->publishing_ -= 1;
      p->signals_->drained.notify_all();
    }
  } done{this};
  uint64_t copied = 0;
  try {
    copied = ring_->write(batch, slot, in_place);
  } catch (...) {
    // Nothing was announced: the slot goes back once no copy into it is queued.
    ring_->drain();
    std::lock_guard<std::mutex> lock(mu_);
    slots_.abandon(slot.seq);
    throw;
  }
  announce(batch, slot, layout, start, waited, copied, in_place);
  return waited;
}

std::optional<RingSlot> Producer::claim_lease(uint64_t seq, const Batch& batch, const Layout& layout,
                                              bool in_place) {
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_io_error();
  const SlotLedger::Place* place = slots_.leased(seq);
  if (place == nullptr) throw InvalidArgument("publish names lease " + std::to_string(seq) + ", which is not out");
  RingSlot slot{seq, place->offsets, place->event};
  // Copied into its lease if every tensor fits its lane there; else into a
  // slot of its own (the lease goes back after the copy).
  bool fits = layout.bytes.size() == slot.offsets.size();
  for (std::size_t lane = 0; fits && lane < layout.bytes.size(); ++lane) {
    if (layout.bytes[lane] > first_.bytes[lane] || slot.offsets[lane] % layout.align[lane] != 0) fits = false;
  }
  if (in_place) {
    // The caller says a loader worker wrote it into this lease: it must lie
    // exactly there (a worker only writes what fits its lease).
    const std::byte* base = ring_->host_memory();
    std::size_t lane = 0;
    for (const Leaf& leaf : batch.leaves) {
      const auto* t = std::get_if<Tensor>(&leaf);
      if (t == nullptr) continue;
      const bool there = fits && base != nullptr && t->is_cpu() && plain_bytes(*t) &&
                         (t->numel() == 0 || static_cast<const std::byte*>(t->data_ptr()) == base + slot.offsets[lane]);
      if (!there) {
        throw InvalidArgument("publish: the batch said to be written in lease " + std::to_string(seq) +
                              " does not lie there (tensor " + std::to_string(lane) + ")");
      }
      lane += 1;
    }
  } else if (!fits) {
    return std::nullopt;
  }
  note_loader_time();
  check_serving("publish");
  slots_.write(seq);
  publishing_ += 1;  // close() waits for this write before freeing the ring
  return slot;
}

std::optional<Producer::Lease> Producer::lease(int64_t limit) {
  std::unique_lock<std::mutex> lock(mu_);
  rethrow_io_error();
  check_serving("lease");
  if (!ring_->allocated() || !ring_->open_host_memory()) return std::nullopt;
  if (slots_.count(SlotLedger::State::Leased) >= limit) return std::nullopt;
  // Waits for room as a publish would: the batches before this one are out
  // (or leased), so consumers free what this waits for.
  double waited = 0;
  RingSlot slot = wait_for_slot(lock, first_, waited, /*lease=*/true);
  if (last_publish_end_) {  // the wait was for consumers, not for the loader
    *last_publish_end_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(waited));
  }
  Lease out{slot.seq, slot.offsets, first_.bytes, ring_->host_fd(), ring_->bytes()};
  return out;
}

bool Producer::lease_out(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.contains(seq) && slots_.state(seq) == SlotLedger::State::Leased;
}

int64_t Producer::return_leases() {
  std::vector<uint64_t> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = slots_.leases();
  }
  for (uint64_t seq : out) return_lease(seq);
  return static_cast<int64_t>(out.size());
}

void Producer::return_lease(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slots_.leased(seq) == nullptr) return;
  slots_.abandon(seq);
  stats_.leases_returned += 1;
}

std::pair<std::byte*, uint64_t> Producer::host_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {ring_->host_memory(), ring_->bytes()};
}

void Producer::announce(const Batch& batch, const RingSlot& slot, const Layout& layout,
                        Clock::time_point start, double waited, uint64_t copied, bool in_place) {
  protocol::Announcement a;
  a.seq = slot.seq;
  a.event = slot.event;
  a.samples = batch.samples;
  a.layout = batch.layout;
  a.indices = batch.indices;
  std::size_t lane = 0;
  for (const Leaf& leaf : batch.leaves) {
    if (const auto* t = std::get_if<Tensor>(&leaf)) {
      a.leaves.push_back(
          protocol::TensorLeaf{protocol::to_wire(t->scalar_type()), shape_of(*t), slot.offsets[lane++]});
    } else {
      const auto& items = std::get<Items>(leaf);
      a.leaves.push_back(protocol::ListLeaf{items.kind, items.values});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  a.epoch = epoch_;
  a.index = epoch_batches_++;
  a.position = epoch_samples_;
  epoch_samples_ += batch.samples;
  stats_.batches_published += 1;
  stats_.samples_published += batch.samples;
  for (uint64_t b : layout.bytes) stats_.bytes_published += static_cast<int64_t>(b);
  stats_.bytes_copied += static_cast<int64_t>(copied);
  if (in_place) stats_.batches_in_place += 1;
  stats_.publish_seconds += seconds_since(start) - waited;
  last_publish_end_ = Clock::now();
  slots_.queue(a.seq);
  stream_.push_back(std::move(a));
  wakeup_.notify();
}

void Producer::end_epoch() {
  std::lock_guard<std::mutex> lock(mu_);
  check_serving("end_epoch");
  epochs_done_ += 1;
  if (first_epoch_batches_ < 0) first_epoch_batches_ = epoch_batches_;
  last_publish_end_.reset();
  stream_.push_back(protocol::EpochEnd{epoch_, epoch_samples_, epoch_batches_});
  wakeup_.notify();
}

void Producer::end_stream(Phase next) {
  // Served: every epoch it was asked for went out (or the loader failed);
  // else it was stopped or closed first.
  stream_.push_back(protocol::Finished{epochs_done_, next != Phase::Served});
  wakeup_.notify();
  phase_ = next;
}
void Producer::fail(const std::string& message, protocol::LoaderFailed::Cause cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ != Phase::Serving && phase_ != Phase::Stopping) return;  // the stream has ended already
  stream_.push_back(protocol::LoaderFailed{std::max<int64_t>(epoch_, 0), message, cause});
  end_stream(phase_ == Phase::Serving ? Phase::Served : Phase::Stopped);
}

void Producer::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (phase_ != Phase::Serving && phase_ != Phase::Stopping) return;  // the stream has ended already
  end_stream(phase_ == Phase::Serving ? Phase::Served : Phase::Stopped);
  // Return once the I/O thread has handed everything to ZeroMQ.
  wait(lock, signals_->drained, 5.0, [&] { return stream_.empty() || io_error_ != nullptr; });
}

void Producer::stop() {
  if (!born_.here()) return;  // a forked child's copy: serving is the parent's
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ == Phase::Serving) phase_ = Phase::Stopping;
  wake_all();
}

void Producer::enqueue(StreamItem item) {
  std::lock_guard<std::mutex> lock(mu_);
  stream_.push_back(std::move(item));
  wakeup_.notify();
}

}  // namespace batchcast
