// The producer's life: making it (options checked, name taken, socket bound,
// I/O thread started), its phases, and its end (close(), and the waits for
// consumers to map or unmap the ring before it goes). What it publishes is in
// publishing.cpp, the I/O thread in io_thread.cpp, what it reports in stats.cpp.
#include "batchcast/producer/producer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cxxabi.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "batchcast/common/error.h"
#include "batchcast/common/threads.h"
#include "batchcast/producer/internal.h"

namespace batchcast {
namespace {

// Where newcomers start, as the join plan takes it: whether the epochs asked
// for can be served, and consumers started mid-epoch, is its to say (it
// throws InvalidArgument).
JoinPlanOptions plan_options(const ProducerOptions& options) {
  JoinPlanOptions plan;
  plan.join_now = options.join_now;
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

// A number for this run of the producer, unlike any other run's: a state a
// consumer saved names it, so a resume can tell a restarted producer.
uint64_t new_run() {
  std::random_device device;
  uint64_t run = 0;
  while (run == 0) run = (static_cast<uint64_t>(device()) << 32) ^ device() ^ static_cast<uint64_t>(::getpid());
  return run;
}

MembershipOptions membership_options(const ProducerOptions& options, protocol::Ring ring) {
  MembershipOptions m;
  m.name = options.name;
  m.producer_pid = ::getpid();
  m.run = new_run();
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

}  // namespace batchcast
