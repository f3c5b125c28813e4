#include "batchcast/producer/producer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cxxabi.h>

#include <cerrno>
#include <cstring>


#include "batchcast/common/error.h"
#include "batchcast/common/json.h"
#include "batchcast/common/threads.h"
#include "batchcast/protocol/dtype.h"
#include "batchcast/transport/socket.h"

namespace batchcast {
namespace {

constexpr auto kSweepPeriod = std::chrono::milliseconds(200);
constexpr auto kWaitSlice = std::chrono::milliseconds(100);

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Where newcomers start, as the join plan takes it: whether the epochs asked
// for can be served, and consumers started mid-epoch, is its to say (it
// throws InvalidArgument).
JoinPlanOptions plan_options(const ProducerOptions& options) {
  JoinPlanOptions plan;
  plan.join_any_time = options.join_any_time;
  plan.samples_per_epoch = options.samples_per_epoch;
  plan.batches_per_epoch = options.batches_per_epoch;
  plan.epochs = options.epochs;
  plan.catch_up_window = options.catch_up_window.value_or(0);
  return JoinPlan::checked(plan);
}

ProducerOptions checked(ProducerOptions options) {
  validate_name(options.name);
  if (options.slots < 2) throw InvalidArgument("slots must be at least 2");
  if (!options.catch_up_window) options.catch_up_window = options.slots / 2;
  if (*options.catch_up_window < 0 || *options.catch_up_window > options.slots / 2) {
    throw InvalidArgument("catch_up_window must be at most slots / 2 (" +
                          std::to_string(options.slots / 2) + "); raise slots");
  }
  if (!(options.linger >= 0)) throw InvalidArgument("linger must be >= 0 seconds");
  if (options.straggler_timeout && !(*options.straggler_timeout > 0)) {
    throw InvalidArgument("straggler_timeout must be None (wait for the slowest) or > 0 seconds");
  }
  plan_options(options);  // before anything is made
  return options;
}

MembershipOptions membership_options(const ProducerOptions& options, protocol::Ring ring) {
  MembershipOptions m;
  m.name = options.name;
  m.producer_pid = ::getpid();
  m.slots = options.slots;
  m.straggler_timeout = options.straggler_timeout.value_or(0);
  m.ring = std::move(ring);
  m.loader = options.loader;
  m.plan = plan_options(options);
  return m;
}

}  // namespace

Producer::Producer(ProducerOptions options)
    : options_(checked(std::move(options))),
      context_(1),
      router_(context_, zmq::socket_type::router),
      ring_(Ring::create(RingOptions{options_.name, options_.cuda_device, options_.slots,
                                     options_.ring_bytes})),
      // Under mu_, as every call of the ledger: the one place ring space comes back.
      slots_([this](uint64_t seq) {
        if (ring_) ring_->release(seq);  // (after close(), a lease may still come back)
        freed_since_sweep_ = true;
        signals_->space.notify_all();
      }),
      membership_(membership_options(options_, ring_->description()), slots_) {
  dir_ = runtime_dir(options_.runtime_dir);
  endpoint_ = endpoint_for(dir_, options_.name);
  lock_ = std::make_unique<NameLock>(dir_, options_.name);
  router_.set(zmq::sockopt::router_mandatory, 1);
  router_.set(zmq::sockopt::sndhwm, 0);
  router_.set(zmq::sockopt::rcvhwm, 0);
  router_.set(zmq::sockopt::linger, 2000);
  router_.bind(endpoint_);
  int bell[2];
  if (::pipe2(bell, O_NONBLOCK | O_CLOEXEC) != 0) throw SystemError("pipe for the producer's bell", errno);
  bell_read_ = Fd(bell[0]);
  bell_ = Fd(bell[1]);
  stats_.ring_device = ring_->device();
  stats_.name = options_.name;
  stats_.pid = ::getpid();
  io_ = start_background_thread("batchcast-io", [this] { serve(); });
}

Producer::~Producer() {
  if (!born_.here()) {
    // A forked child's copy (a DataLoader worker, say): the I/O thread, the
    // socket, the name, the ring and the consumers' mailboxes are the
    // parent's, and so are the condition variables its threads wait on
    // (common/fork.h).
    leave_behind(io_);
    leave_behind(router_);
    leave_behind(context_);
    leave_behind(lock_);
    leave_behind(ring_);
    leave_behind(links_);
    leave_behind(signals_);
    return;
  }
  // Not interruptible: a destructor must not raise (the interrupt hook would
  // raise KeyboardInterrupt), and whatever it waits for is bounded by linger.
  try {
    close(/*interruptible=*/false);
  } catch (...) {  // (close's own errors: nobody is left to raise them to)
  }
}

void Producer::tell(const Report& report) const {
  if (options_.reporter) options_.reporter(report);
}

template <typename Done>
bool Producer::wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, double timeout,
                    Done done) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                         timeout < 0 ? 1e9 : timeout));
  auto last_interrupt = Clock::now();
  while (true) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    cv.wait_until(lock, std::min(deadline, Clock::now() + kWaitSlice));
    if (options_.interrupt && Clock::now() - last_interrupt >= kWaitSlice) {
      last_interrupt = Clock::now();
      lock.unlock();
      try {
        options_.interrupt();
      } catch (...) {
        lock.lock();
        throw;
      }
      lock.lock();
    }
  }
}

void Producer::rethrow_io_error() const {
  if (io_error_) std::rethrow_exception(io_error_);
}

bool Producer::stopping() const {
  return phase_ == Phase::Stopping || phase_ == Phase::Stopped || phase_ == Phase::Closed;
}

void Producer::check_serving(const char* what) const {
  if (phase_ == Phase::Serving) return;
  if (phase_ == Phase::Served) {
    throw InvalidArgument(std::string(what) + ": producer '" + options_.name +
                          "' has ended its stream (finish() or fail() was called); nothing can "
                          "follow it: make a new Producer to serve again");
  }
  throw Stopped("producer stopped");
}

void Producer::end_stream(Phase next) {
  // Served: every epoch it was asked for went out (or the loader failed);
  // else it was stopped or closed first.
  stream_.push_back(protocol::Finished{epochs_done_, next != Phase::Served});
  wakeup_.notify();
  phase_ = next;
}

void Producer::wake_all() {
  signals_->space.notify_all();
  signals_->members.notify_all();
  signals_->drained.notify_all();
  wakeup_.notify();
}

Producer::Phase Producer::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

void Producer::close() { close(/*interruptible=*/true); }

void Producer::close(bool interruptible) {
  if (!born_.here()) return;  // a forked child's copy: serving is the parent's (common/fork.h)
  std::lock_guard<std::mutex> closing(close_mu_);
  // The stream's end went out before close(): consumers are owed what they were sent.
  bool served = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (phase_ == Phase::Closed) return;
    served = phase_ == Phase::Served || phase_ == Phase::Stopped;
    // Whatever way this producer ends, its consumers hear of it: mid-epoch they
    // raise ProducerLost instead of waiting on a live process forever.
    if (phase_ == Phase::Serving || phase_ == Phase::Stopping) end_stream(Phase::Closed);
    phase_ = Phase::Closed;
    wake_all();  // every blocked call ends
    signals_->drained.wait(lock, [&] { return publishing_ == 0; });
  }
  // From here on the producer is Closed: whatever ends the waits below (an
  // exception, or the thread itself ended at the interpreter's exit), the I/O
  // thread is joined and the ring, the socket and the name are let go. (A
  // joinable std::thread left for the destructor would be std::terminate.)
  struct LetGo {
    Producer* p;
    ~LetGo() { p->let_go(); }
  } guard{this};
  std::exception_ptr interrupted;
  if (ring_->unmap_before_free()) {
    await_unmapped();
  } else if (served) {
    interrupted = await_mapped(interruptible);
  }
  if (interrupted) std::rethrow_exception(interrupted);  // (LetGo lets go first)
}

void Producer::let_go() noexcept {
  quit_io_ = true;
  wakeup_.notify();
  if (io_.joinable()) io_.join();
  try {
    if (ring_) ring_->drain();
  } catch (...) {  // (a CUDA error while the ring is freed: nothing is left to tell)
  }
  ring_.reset();
  router_.close();
  context_.close();
  lock_.reset();  // the name is free again
}

// Consumers reopen a host ring through /proc/<this pid>/fd, so a producer that
// has served its last batch keeps the ring's file open until every consumer
// given the ring has mapped it (or left, or died), at most `linger` seconds:
// else a consumer slower to take its first batch than the producer to serve
// the rest would lose everything. Normally no wait: a consumer maps the ring
// within 0.1 s of being told of it. An interrupt (Ctrl-C) ends the wait; it is
// raised once the producer is closed.
std::exception_ptr Producer::await_mapped(bool interruptible) {
  {
    // The membership learns whom the ring was sent to as the I/O thread hands
    // it the stream (the ring, the batches, the end): first let it catch up.
    std::unique_lock<std::mutex> lock(mu_);
    signals_->drained.wait_for(lock, std::chrono::seconds(5), [&] { return stream_.empty() || io_error_ != nullptr; });
  }
  return await_consumers(
      [this] { return membership_.ring_unmapped_yet(); }, kWaitSlice,
      [this](const std::string& pids) {
        return "producer '" + options_.name + "' has served everything and waits for consumer pid(s) " + pids +
               " to map its ring before closing it (at most " + std::to_string(static_cast<int>(options_.linger)) +
               " s)";
      },
      [this](const std::string& pids) {
        return "producer '" + options_.name + "': closing its ring after " +
               std::to_string(static_cast<int>(options_.linger)) + " s (linger) although consumer pid(s) " + pids +
               " never mapped it; they cannot read the batches they were sent. Keep consumers iterating (or "
               "closed) until the producer ends, or raise linger";
      },
      interruptible);
}

// Freeing GPU memory that another process still maps is undefined behaviour
// in CUDA IPC, so such a ring outlives its producer object until every
// consumer that was given it has unmapped it or exited (not interruptible).
void Producer::await_unmapped() {
  await_consumers(
      [this] { return membership_.ring_importers(); }, Clock::duration::zero(),
      [this](const std::string& pids) {
        return "producer '" + options_.name + "' is waiting for consumer pid(s) " + pids +
               " to free the batches they hold before freeing its GPU ring (at most " +
               std::to_string(static_cast<int>(options_.linger)) + " s)";
      },
      [this](const std::string& pids) {
        return "producer '" + options_.name + "': freeing its GPU ring after " +
               std::to_string(static_cast<int>(options_.linger)) + " s (linger) although consumer pid(s) " + pids +
               " still map it; their batches are no longer valid. Let consumers drop their batches before the "
               "producer ends, or raise linger";
      },
      /*interruptible=*/false);
}

// Waits, at most `linger`, until `pending()` (consumer pids, under mu_) is
// empty: says whom it waits for once the wait is longer than `notice_after`,
// and warns (Linger) when it gives up. An interrupt ends an interruptible wait
// and is returned.
std::exception_ptr Producer::await_consumers(const std::function<std::vector<int64_t>()>& pending,
                                             Clock::duration notice_after,
                                             const std::function<std::string(const std::string&)>& notice,
                                             const std::function<std::string(const std::string&)>& warning,
                                             bool interruptible) {
  std::unique_lock<std::mutex> lock(mu_);
  auto pid_list = [&] {
    std::string list;
    for (int64_t pid : pending()) list += (list.empty() ? "" : ", ") + std::to_string(pid);
    return list;
  };
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(options_.linger));
  auto last_interrupt = started;
  bool told = false;
  while (!pending().empty() && !io_error_) {
    if (Clock::now() >= deadline) {
      Report r{Report::Level::Warning, "Linger", warning(pid_list())};
      lock.unlock();
      tell(r);
      return nullptr;
    }
    if (!told && Clock::now() - started >= notice_after) {
      told = true;
      Report r{Report::Level::Notice, {}, notice(pid_list())};
      lock.unlock();
      tell(r);
      lock.lock();
    }
    signals_->members.wait_until(lock, std::min(deadline, Clock::now() + kWaitSlice));
    if (interruptible && options_.interrupt && Clock::now() - last_interrupt >= kWaitSlice) {
      last_interrupt = Clock::now();
      lock.unlock();
      try {
        options_.interrupt();
      } catch (abi::__forced_unwind&) {
        throw;  // the thread is being ended (pthread_exit): never swallowed
      } catch (...) {
        return std::current_exception();
      }
      lock.lock();
    }
  }
  return nullptr;
}

bool Producer::wait_for_consumers(int64_t count, double timeout_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (membership_.active() >= count) {  // (the common case: once per batch while serving for ever)
    rethrow_io_error();
    if (stopping()) throw Stopped("producer stopped");
    return true;
  }
  // Mid-epoch (the loader paused for nobody): the wait is not the loader's time.
  const bool mid_epoch = last_publish_end_.has_value();
  note_loader_time();
  membership_.set_awaiting(count);  // newcomers hear why they wait
  bool ready = false;
  try {
    ready = wait(lock, signals_->members, timeout_seconds,
                 [&] { return stopping() || membership_.active() >= count; });
  } catch (...) {
    membership_.set_awaiting(0);
    throw;
  }
  membership_.set_awaiting(0);
  if (mid_epoch) last_publish_end_ = Clock::now();
  rethrow_io_error();
  if (stopping()) throw Stopped("producer stopped");
  return ready;
}

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

void Producer::note_loader_workers(std::vector<int64_t> pids) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.loader_workers = std::move(pids);
}

int64_t Producer::consumer_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return membership_.active();
}

ProducerStats Producer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ProducerStats s = stats_;
  s.uptime_seconds = seconds_since(started_);
  if (waiting_for_space_) {
    s.waiting_for = "consumers";
    s.waiting_seconds = seconds_since(waiting_since_);
  } else if (membership_.awaiting() > 0) {
    s.waiting_for = "joins";
    s.consumers_wanted = membership_.awaiting();
  } else if (last_publish_end_) {
    s.waiting_for = "loader";
    s.waiting_seconds = seconds_since(*last_publish_end_);
  }
  s.epoch = epoch_;
  s.epochs_done = epochs_done_;
  s.epoch_batches = epoch_batches_;
  s.batches_per_epoch = options_.batches_per_epoch >= 0 ? options_.batches_per_epoch : first_epoch_batches_;
  const MembershipCounters& c = membership_.counters();
#define BATCHCAST_COPY_COUNTER(type, name, init) s.name = c.name;
  BATCHCAST_MEMBERSHIP_COUNTERS(BATCHCAST_COPY_COUNTER)
#undef BATCHCAST_COPY_COUNTER
  s.messages_over_socket = over_socket_.load();
  s.leases_out = slots_.count(SlotLedger::State::Leased);
  if (ring_) {
    s.slots_in_use = ring_->slots_in_use();
    s.direct_copies = ring_->direct_copies();
  }
  s.pin_budget = membership_.pin_budget();
  s.stuck = membership_.stuck();
  s.consumers = membership_.consumers();
  return s;
}

// ---- I/O thread ---------------------------------------------------------

void Producer::serve() {
  try {
    serve_until_quit();
  } catch (...) {
    // Nothing escapes this thread: the error fails the caller's next call.
    std::lock_guard<std::mutex> lock(mu_);
    io_error_ = std::current_exception();
    if (phase_ == Phase::Serving) phase_ = Phase::Stopping;
    wake_all();
  }
}

void Producer::serve_until_quit() {
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wakeup_.fd(), ZMQ_POLLIN, 0},
                             {nullptr, bell_read_.get(), ZMQ_POLLIN, 0}};
  auto last_sweep = Clock::now();
  std::vector<zmq::message_t> frames;  // [peer routing id, body]
  while (true) {
    const bool sleep = sleep_ready();
    transport::poll(items, 3, sleep ? kSweepPeriod : std::chrono::milliseconds(0));
    if (items[1].revents & ZMQ_POLLIN) wakeup_.drain();
    if (items[2].revents & ZMQ_POLLIN) Mailbox::empty_bell(bell_read_.get());
    collect_releases(nullptr);
    while (transport::try_receive(router_, frames)) {
      Actions actions;
      if (frames.size() == 2) {
        // What the consumer put in its mailbox before this message comes first.
        const std::string peer = frames[0].to_string();
        collect_releases(&peer);
        std::lock_guard<std::mutex> lock(mu_);
        actions = membership_.on_message(peer, frames[1].data(), frames[1].size());
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        actions = membership_.on_malformed();
      }
      apply(std::move(actions));
    }
    while (true) {
      Actions actions;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stream_.empty()) break;
        actions = deliver(stream_.front());
        stream_.pop_front();
      }
      apply(std::move(actions));
    }
    signals_->drained.notify_all();
    if (Clock::now() - last_sweep >= kSweepPeriod) {
      last_sweep = Clock::now();
      Actions actions;
      {
        std::lock_guard<std::mutex> lock(mu_);
        // Slots that just went back may not have reached the waiting
        // publish yet: it is not waiting on anyone until it has tried them.
        // A trainer blocked in take() says so in its mailbox (it sleeps there).
        auto waits = [this](const std::string& peer) {
          auto link = links_.find(peer);
          return link != links_.end() && link->second.mailbox && link->second.mailbox->consumer_waits();
        };
        actions = membership_.on_sweep([](int64_t pid) { return process_alive(pid); },
                                       waiting_for_space_ && !freed_since_sweep_, last_sweep, waits);
        freed_since_sweep_ = false;
        // Releases change what counts as kept (room the ring makes): try again.
        if (waiting_for_space_) signals_->space.notify_all();
      }
      apply(std::move(actions));
    }
    if (quit_io_) return;
  }
}

// Before sleeping: each mailbox is told whether to ring (while a publish
// waits for space, or a message for room in it), then looked at once more.
bool Producer::sleep_ready() {
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting = waiting_for_space_;
  }
  bool sleep = true;
  for (auto& [peer, link] : links_) {
    if (link.mailbox->producer_sleeps(waiting, !link.outbox.empty())) sleep = false;  // releases are there
    if (!link.outbox.empty()) {
      post_pending(link);  // room may have come before the flag was up
      if (link.outbox.empty()) sleep = false;
    }
  }
  return sleep;
}

void Producer::collect_releases(const std::string* only) {
  std::vector<std::pair<std::string, std::string>> frames;  // (peer, frame)
  std::string frame;
  int64_t dropped = 0;
  auto take = [&](const std::string& peer, Link& link) {
    post_pending(link);
    while (true) {
      const auto r = link.mailbox->collect(frame);
      if (r == FrameQueue::Pop::Empty) break;
      // Only releases come this way; anything else is dropped and counted.
      if (r != FrameQueue::Pop::Frame || protocol::peek_kind(frame.data(), frame.size()) != protocol::Kind::Release) {
        dropped += 1;
        continue;
      }
      frames.emplace_back(peer, std::move(frame));
    }
  };
  if (only != nullptr) {
    auto link = links_.find(*only);
    if (link != links_.end()) take(link->first, link->second);
  } else {
    for (auto& [peer, link] : links_) take(peer, link);
  }
  if (frames.empty() && dropped == 0) return;
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (; dropped > 0; --dropped) actions.merge(membership_.on_malformed());
    for (const auto& [peer, f] : frames) actions.merge(membership_.on_message(peer, f.data(), f.size()));
  }
  apply(std::move(actions));
}

void Producer::open_mailbox(const std::string& peer, uint64_t consumer_id) {
  try {
    auto mailbox = Mailbox::create(options_.name, bell_.get(), consumer_id);
    transport::try_send(router_, {peer, protocol::encode(mailbox->description())});
    links_[peer].mailbox = std::move(mailbox);
  } catch (const Error& e) {
    // Out of file descriptors or memory: this consumer gets everything over the socket.
    Report r;
    r.level = Report::Level::Notice;
    r.message = std::string("a consumer gets its batches over the socket (no mailbox: ") + e.what() + ")";
    tell(r);
  }
}

// In order (mailbox/ordering.h): once something waits for room, what
// follows waits behind it; a message too large for the mailbox goes over the
// socket now, its marker in its place.
void Producer::post(Link& link, const std::string& peer, const std::shared_ptr<const std::string>& bytes) {
  if (link.outbox.enqueue(bytes, FrameQueue::largest_frame(Mailbox::kToConsumerBytes))) {
    transport::try_send(router_, {peer, *bytes});  // the consumer holds it until it meets the marker
    over_socket_ += 1;
  }
  post_pending(link);
}

void Producer::post_pending(Link& link) {
  link.outbox.flush([&](const std::string& message) { return link.mailbox->post(message); },
                    [&] { return link.mailbox->post_marker(); });
}

void Producer::forget_links() {
  std::vector<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [peer, link] : links_) {
      if (!membership_.knows(peer)) gone.push_back(peer);
    }
  }
  for (const auto& peer : gone) links_.erase(peer);
}

Actions Producer::deliver(StreamItem& item) {
  return std::visit(
      [&](auto& it) -> Actions {
        using T = std::decay_t<decltype(it)>;
        if constexpr (std::is_same_v<T, EpochBegin>) return membership_.on_epoch_begin(it.epoch);
        if constexpr (std::is_same_v<T, protocol::RingReady>) return membership_.on_ring(it.ring);
        if constexpr (std::is_same_v<T, protocol::Announcement>) {
          return membership_.on_batch(std::move(it), Clock::now());
        }
        if constexpr (std::is_same_v<T, protocol::EpochEnd>) return membership_.on_epoch_end(it);
        if constexpr (std::is_same_v<T, protocol::LoaderFailed>) return membership_.on_loader_failed(it);
        if constexpr (std::is_same_v<T, protocol::Finished>) return membership_.on_finished(it);
      },
      item);
}

void Producer::apply(Actions actions) {
  for (const auto& send : actions.sends) {
    auto link = links_.find(send.peer);
    if (link != links_.end()) {
      post(link->second, send.peer, send.bytes);
      continue;
    }
    // False: the peer's connection is gone; the liveness sweep removes it.
    transport::try_send(router_, {send.peer, *send.bytes});
    if (send.welcome) open_mailbox(send.peer, send.consumer_id);
  }
  if (actions.members_changed) forget_links();
  if (actions.members_changed) signals_->members.notify_all();
  for (const Report& r : actions.reports) tell(r);
  if (!actions.status_requests.empty()) {
    const std::string status = protocol::encode(protocol::Status{status_json()});
    for (const auto& peer : actions.status_requests) transport::try_send(router_, {peer, status});
  }
}

std::string Producer::status_json() const {
  const ProducerStats s = stats();
  JsonWriter w;
  w.begin_object();
  w.field("protocol", static_cast<int>(protocol::kVersion));
  w.field("slots", options_.slots);
  w.field("samples_per_epoch", options_.samples_per_epoch);
  s.visit([&](const char* name, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      w.key(name).begin_array();
      for (int64_t v : value) w.value(v);
      w.end_array();
    } else if constexpr (std::is_same_v<T, std::vector<ConsumerInfo>>) {
      w.key(name).begin_array();
      for (const ConsumerInfo& c : value) {
        w.begin_object();
        c.visit([&](const char* k, const auto& v) { w.field(k, v); });
        w.end_object();
      }
      w.end_array();
    } else {
      w.field(name, value);
    }
  });
  w.end_object();
  return w.str();
}

}  // namespace batchcast
