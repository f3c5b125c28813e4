// The producer: publishes each loader batch once into the ring and announces
// it. A short coordinator over three parts a reader can find by name:
// the Ring (ring/ring.h: where batches live), the SlotLedger
// (producer/slot_ledger.h: what each slot is doing; the one place a slot is
// freed), the Membership (producer/membership.h: who gets what) and one I/O thread
// that moves bytes between them and the consumers (their mailboxes for the
// per-batch traffic, the socket for the rest: mailbox/mailbox.h). The caller (the
// Python package, or a C++ program) drives epochs from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "batchcast/common/batch.h"
#include "batchcast/common/endpoint.h"
#include "batchcast/common/fields.h"
#include "batchcast/common/fork.h"
#include "batchcast/common/report.h"
#include "batchcast/mailbox/mailbox.h"
#include "batchcast/mailbox/ordering.h"
#include "batchcast/producer/membership.h"
#include "batchcast/producer/slot_ledger.h"
#include "batchcast/protocol/message.h"
#include "batchcast/ring/ring.h"

namespace batchcast {

// Every option of a producer: X(type, name, default). The fields, visit(), the
// Python binding's keywords and defaults, and its stub come from this list.
#define BATCHCAST_PRODUCER_OPTIONS(X)                                                         \
  X(std::string, name, "")                                                                    \
  X(std::string, runtime_dir, "")      /* empty: the per-user default */                      \
  X(int64_t, slots, 8)                 /* the ring holds this many batches like the first */  \
  X(uint64_t, ring_bytes, 0)           /* lower bound on the ring's size */                   \
  X(int64_t, samples_per_epoch, -1)    /* -1 unknown; learned after the first epoch */        \
  X(int64_t, batches_per_epoch, -1)    /* loader batches per epoch; -1 unknown */             \
  /* Evict a consumer that leaves a batch unconsumed this many seconds while the    */        \
  /* producer waits for ring space; none: wait for the slowest.                     */        \
  X(std::optional<double>, straggler_timeout, std::nullopt)                                   \
  /* First batches of each epoch kept for catch-up joins; none: slots / 2. */                 \
  X(std::optional<int64_t>, catch_up_window, std::nullopt)                                    \
  X(int, cuda_device, -1)              /* >= 0: the ring is GPU memory on this device */      \
  X(double, linger, 30.0) /* GPU ring: seconds close() waits for consumers to unmap it */     \
  /* What the loader is (its type, length, batch size, seed when known): told to    */        \
  /* consumers, whose saved state says which loader it belongs to.                  */        \
  X(std::string, loader, "")                                                                  \
  /* The caller orders each epoch as order_epoch says (it steers its loader's   */          \
  /* order): consumers may join mid-epoch and start with the next batch.         */          \
  X(bool, join_now, false)                                                               \
  X(int64_t, epochs, -1)               /* epochs it will serve; -1: until stopped */

struct ProducerOptions {
  BATCHCAST_FIELDS(BATCHCAST_PRODUCER_OPTIONS)
  Reporter reporter;               // where events and warnings go (none: nowhere)
  // Called about every 100 ms on the caller's thread while a call blocks; it
  // may throw to abandon the call (the Python binding checks for signals).
  std::function<void()> interrupt;

  BATCHCAST_VISIT(BATCHCAST_PRODUCER_OPTIONS)
};

// What a producer did so far (Producer::stats(), and `batchcast status`).
#define BATCHCAST_PRODUCER_STATS(X)                                                           \
  X(std::string, name, "")                                                                    \
  X(int64_t, pid, 0)                                                                          \
  X(double, uptime_seconds, 0)                                                                \
  X(int64_t, epoch, -1)         /* in progress (or last begun) */                             \
  X(int64_t, epochs_done, 0)                                                                  \
  X(int64_t, epoch_batches, 0)  /* published in the epoch in progress (or last begun) */        \
  /* The loader's batches per epoch: its len(), else learned when the first ends; -1 unknown */ \
  X(int64_t, batches_per_epoch, -1)                                                           \
  X(int64_t, batches_published, 0)                                                            \
  X(int64_t, samples_published, 0)                                                            \
  X(int64_t, bytes_published, 0)                                                              \
  X(double, publish_seconds, 0) /* copying into the ring and announcing */                    \
  X(double, wait_seconds, 0)    /* waiting for ring space (the slowest consumer) */           \
  X(double, loader_seconds, 0)  /* between publishes within an epoch: the loader */           \
  /* What the producer waits for right now ("loader", "consumers" for ring space,   */        \
  /* "joins" for consumers_wanted consumers before it begins, or "") and for how    */        \
  /* long so far (the counters above grow only when a wait ends).                   */        \
  X(std::string, waiting_for, "")                                                             \
  X(double, waiting_seconds, 0)                                                               \
  /* The loader's worker processes alive, as the producer last noted them (a      */        \
  /* DataLoader's; none: it has no workers, or none is running)                   */        \
  X(std::vector<int64_t>, loader_workers, {})                                                 \
  X(int64_t, consumers_wanted, 0)                                                             \
  BATCHCAST_MEMBERSHIP_COUNTERS(X)                                                            \
  X(uint64_t, ring_bytes, 0)                                                                  \
  X(std::string, ring_device, "") /* "cpu" or "cuda:N" */                                     \
  /* GPU ring: tensors copied straight from pinned loader memory */                           \
  X(int64_t, direct_copies, 0)                                                                \
  /* Host bytes the producer copied into the ring (or a GPU ring's staging), and    */        \
  /* batches that needed no copy: a loader worker wrote them in place.              */        \
  X(int64_t, bytes_copied, 0)                                                                 \
  X(int64_t, batches_in_place, 0)                                                             \
  X(int64_t, leases_out, 0) /* slots reserved for loader workers right now */                 \
  /* leases that came back unused: batches a worker could not write in place    */            \
  /* (larger than the first, a collate's odd output) or never sent back          */            \
  X(int64_t, leases_returned, 0)                                                              \
  /* Messages too large for a consumer's mailbox, sent over the socket in their     */        \
  /* place (a marker in the mailbox keeps their order).                             */        \
  X(int64_t, messages_over_socket, 0)                                                         \
  X(int64_t, slots_in_use, 0)                                                                 \
  X(int32_t, pin_budget, 0) /* slots each consumer may pin with batches it keeps */           \
  /* While the ring is full and every consumer holding a slot waits for its next    */        \
  /* batch (nothing can move): who holds what; the keepers are evicted after a while */       \
  X(std::string, stuck, "")                                                                   \
  X(std::vector<ConsumerInfo>, consumers, {})

struct ProducerStats {
  BATCHCAST_FIELDS(BATCHCAST_PRODUCER_STATS)
  BATCHCAST_VISIT(BATCHCAST_PRODUCER_STATS)
};

class Producer {
 public:
  // Validates the options, takes the name (NameInUse if a live producer has
  // it) and starts listening. Throws InvalidArgument, NameInUse, CudaError.
  explicit Producer(ProducerOptions options);
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;
  ~Producer();

  // The loader's worker processes alive now (for stats() and the status).
  void note_loader_workers(std::vector<int64_t> pids);

  // Blocks until `count` consumers are present. False on timeout (seconds < 0:
  // no timeout). Throws Stopped when stop() is called meanwhile.
  bool wait_for_consumers(int64_t count, double timeout_seconds);

  // The stream, in order: epochs of batches, then finish() or fail(). Each
  // throws Stopped once stopped, and InvalidArgument once served (nothing
  // more can follow the stream's end).
  // begin_epoch records where the consumers present joined mid-epoch: the
  // positions the epoch is ordered by (see order_epoch). Everything
  // published before has reached the consumers' queues by then, so nobody
  // joins the last epoch after its return.
  void begin_epoch(int64_t epoch);
  // With join_now, after begin_epoch: the epoch's order of samples
  // (dataset indices), given the loader's fresh one (JoinPlan::order).
  // Throws InvalidArgument when the sampler changed what an epoch holds.
  std::vector<int64_t> order_epoch(std::vector<int64_t> fresh);
  // Copies the batch into the ring (waiting for space) and announces it;
  // returns the seconds spent waiting for space. Throws Stopped, and
  // InvalidArgument for a batch that cannot be shared. With `lease`, the
  // batch goes to that leased slot (see lease()): with `in_place`, a loader
  // worker wrote it there and nothing is copied (InvalidArgument if it does
  // not lie there); otherwise it is copied into the lease, or, if it does
  // not fit, into a slot of its own and the lease goes back after the copy.
  double publish(const Batch& batch, std::optional<uint64_t> lease = std::nullopt, bool in_place = false);

  // A slot reserved for a batch like the first, for a loader worker to write
  // into (at `offsets`, at most `bytes` per tensor leaf) in the ring's host
  // memory: a host ring itself, or a GPU ring's pinned host mirror (made by
  // the first lease; Ring::open_host_memory), from which publish() copies it
  // to the GPU. Waits for room as publish() does. nullopt (at once) before
  // the ring exists or while `limit` leases are out. A lease ends with the
  // publish() that names it or with return_lease(). Throws Stopped, and
  // CudaError where a GPU ring's mirror cannot be pinned.
  struct Lease {
    uint64_t seq = 0;
    std::vector<uint64_t> offsets;
    std::vector<uint64_t> bytes;
    int32_t fd = -1;          // the memory: /proc/<producer pid>/fd/<fd> ...
    uint64_t ring_bytes = 0;  // ... of this size
  };
  std::optional<Lease> lease(int64_t limit);
  // The leased slot goes back unused (nothing may write into it any more).
  void return_lease(uint64_t seq);
  // Whether lease `seq` is out (the slot ledger says it is leased).
  bool lease_out(uint64_t seq) const;
  // Every lease still out goes back (no worker writes any more: the epoch's
  // iterator ended). Returns how many.
  int64_t return_leases();
  // The producer's mapping of the memory leases are in, and its size
  // (nullptr before the first lease).
  std::pair<std::byte*, uint64_t> host_memory() const;
  void end_epoch();
  // The loader raised (or yielded a batch that cannot be shared: `cause`):
  // every consumer gets a LoaderError with this message, and the stream ends
  // there.
  void fail(const std::string& message,
            protocol::LoaderFailed::Cause cause = protocol::LoaderFailed::Cause::LoaderRaised);
  // No more epochs; consumers finish what they hold and then stop. After
  // stop(), it still tells consumers the stream ended (they raise
  // ProducerLost mid-epoch). Idempotent.
  void finish();
  // Safe from any thread: wakes and fails every blocked call.
  void stop();
  // Stops, tells consumers, and frees everything (the destructor does this
  // too). A GPU ring is freed once every consumer has let go of it, or after
  // `linger` seconds.
  void close();

  // The producer's life, in order (never backwards):
  //   Serving   epochs are published.
  //   Stopping  stop() (or a failed I/O thread) before the stream's end:
  //             every blocked call ends with Stopped; nothing more is published.
  //   Stopped   stopping, and consumers were told the stream ended (finish()).
  //   Served    the stream's end went out after its last batch (finish()) or
  //             the loader's error (fail()).
  //   Closed    close() began: consumers were told, the ring goes. Having
  //             told them before (Stopped, Served), it keeps a host ring open
  //             until each consumer given it has mapped it (at most linger):
  //             they are owed what they were sent.
  // stop() once the stream has ended changes nothing: there is nothing to stop.
  enum class Phase { Serving, Stopping, Stopped, Served, Closed };
  Phase phase() const;

  ProducerStats stats() const;
  std::string endpoint() const { return endpoint_; }
  int64_t consumer_count() const;

 private:
  using Clock = std::chrono::steady_clock;
  // What the I/O thread hands to the membership, in the order consumers see it.
  struct EpochBegin {
    int64_t epoch;
  };
  using StreamItem = std::variant<EpochBegin, protocol::RingReady, protocol::Announcement,
                                  protocol::EpochEnd, protocol::LoaderFailed, protocol::Finished>;
  struct Layout {  // byte size and alignment of each tensor leaf
    std::vector<uint64_t> bytes;
    std::vector<uint64_t> align;
  };

  // publish(): validate -> reserve -> write -> announce.
  Layout validate(const Batch& batch) const;
  RingSlot reserve(const Layout& layout, const Batch& batch, double& waited);
  // A slot for `layout` (waiting for room), in the ledger as leased or reserved.
  RingSlot wait_for_slot(std::unique_lock<std::mutex>& lock, const Layout& layout, double& waited,
                         bool lease);
  std::optional<RingSlot> claim_lease(uint64_t seq, const Batch& batch, const Layout& layout, bool in_place);
  void note_loader_time();  // under mu_: the time since the last publish was the loader's
  void announce(const Batch& batch, const RingSlot& slot, const Layout& layout,
                Clock::time_point start, double waited, uint64_t copied, bool in_place);

  // Waits on `cv` until `done()`, calling options_.interrupt (unlocked) about
  // every 100 ms. Returns false if `timeout` (< 0: none) passed first.
  template <typename Done>
  bool wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, double timeout,
            Done done);
  void enqueue(StreamItem item);
  void rethrow_io_error() const;  // under mu_
  bool stopping() const;          // under mu_: blocked calls end, nothing more is published
  void check_serving(const char* what) const;  // under mu_: throws unless Serving
  void end_stream(Phase next);    // under mu_: queues Finished, moves to `next`
  void wake_all();                // every blocked call looks at the phase again
  void await_unmapped();
  std::exception_ptr await_mapped(bool interruptible);
  void close(bool interruptible);
  void let_go() noexcept;  // joins the I/O thread, frees the ring, the socket and the name (again: nothing)
  std::exception_ptr await_consumers(const std::function<std::vector<int64_t>()>& pending,
                                     Clock::duration notice_after,
                                     const std::function<std::string(const std::string&)>& notice,
                                     const std::function<std::string(const std::string&)>& warning,
                                     bool interruptible);

  // A consumer's mailbox and what waits for room in it (I/O thread only).
  struct Link {
    std::unique_ptr<Mailbox> mailbox;
    Outbox outbox;  // what waits for room in it, in order
  };

  // The I/O thread.
  void serve();
  void open_mailbox(const std::string& peer, uint64_t consumer_id);
  void post(Link& link, const std::string& peer, const std::shared_ptr<const std::string>& bytes);
  static void post_pending(Link& link);
  bool sleep_ready();                              // arms the mailboxes; false: look again first
  void collect_releases(const std::string* peer);  // one consumer's (or every one's) releases
  void forget_links();                             // of consumers the membership forgot
  void serve_until_quit();
  Actions deliver(StreamItem& item);  // under mu_
  void apply(Actions actions);        // sends, reports, wakes
  bool freed_since_sweep_ = false;    // under mu_: slots went back since the last sweep
  void tell(const Report& report) const;
  std::string status_json() const;  // what a StatusRequest gets

  ProducerOptions options_;
  std::string dir_;
  std::unique_ptr<NameLock> lock_;
  std::string endpoint_;
  zmq::context_t context_;
  zmq::socket_t router_;
  Wakeup wakeup_;
  Fd bell_;        // consumers ring it (a pipe's write end, reopened by them) ...
  Fd bell_read_;   // ... and the I/O thread sleeps on this end
  std::map<std::string, Link> links_;  // by peer: consumers given a mailbox
  std::atomic<int64_t> over_socket_{0};  // written by the I/O thread
  std::unique_ptr<Ring> ring_;
  Layout first_;                       // of the first batch: what the ring and leases are sized for

  mutable std::mutex mu_;
  struct Signals {  // (apart: a forked child's copy must not destroy them, common/fork.h)
    std::condition_variable space;    // ring space freed, or stopping
    std::condition_variable members;  // a consumer came or went, or stopping
    std::condition_variable drained;  // the stream was delivered; a publish ended
  };
  std::unique_ptr<Signals> signals_ = std::make_unique<Signals>();
  // Every slot's state; the only code that frees one (it gives the ring its
  // space back). Declared after ring_ and the condition variables it uses.
  SlotLedger slots_;
  Membership membership_;
  std::deque<StreamItem> stream_;
  bool waiting_for_space_ = false;
  Clock::time_point waiting_since_;  // for space, while waiting_for_space_
  int64_t publishing_ = 0;  // publish() calls between reserve and announce
  int64_t epoch_ = -1;
  int64_t epoch_batches_ = 0;
  int64_t epoch_samples_ = 0;
  int64_t epochs_done_ = 0;
  int64_t first_epoch_batches_ = -1;  // batches the first epoch served had (-1: not ended yet)
  Clock::time_point started_ = Clock::now();
  std::optional<Clock::time_point> last_publish_end_;  // within an epoch
  Phase phase_ = Phase::Serving;
  std::exception_ptr io_error_;
  ProducerStats stats_;
  std::atomic<bool> quit_io_{false};
  std::mutex close_mu_;  // a second close() waits for the first
  std::thread io_;
  Birthplace born_;
};

}  // namespace batchcast
