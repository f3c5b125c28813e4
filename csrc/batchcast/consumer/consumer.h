// The consumer: joins a producer by name and yields batches of its own size,
// epoch by epoch. A short coordinator over the Channel (consumer/channel.h:
// the connection and the mapped ring) and the Rebatcher. Usable from C++
// alone. The Python Consumer (python/batchcast/consumer.py) adds what is
// Python's: the option objects, DataLoader conventions, transforms, state.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include <utility>

#include "batchcast/common/batch.h"
#include "batchcast/common/fields.h"
#include "batchcast/common/report.h"
#include "batchcast/consumer/copy_memory.h"
#include "batchcast/consumer/lifecycle.h"
#include "batchcast/consumer/mapped_ring.h"
#include "batchcast/consumer/rebatcher.h"
#include "batchcast/protocol/message.h"

namespace batchcast {

class Channel;

// Where a consumer wants its batches.
enum class Placement {
  Auto,  // where the producer puts them: host shared memory, or the producer's GPU
  Host,  // host memory (from a GPU producer: one device-to-host copy per loader batch)
  Cuda,  // GPU `cuda_device`: views on the producer's GPU, else one peer copy
};

// Every option of a consumer: X(type, name, default). The fields, visit(), the
// Python binding's keywords and defaults, and its stub come from this list.
#define BATCHCAST_CONSUMER_OPTIONS(X)                                                      \
  X(std::string, name, "")                                                                 \
  /* samples per batch; none: the producer's loader batches as they are */                \
  X(std::optional<int64_t>, batch_size, std::nullopt)                                      \
  X(bool, drop_last, false)                                                                \
  X(double, timeout, 30.0) /* seconds to wait for the producer to answer */               \
  X(bool, catch_up, false) /* joining mid-epoch: that epoch from its start, if retained */ \
  /* joining mid-epoch: start with the next batch, epochs of its own from there     */    \
  /* (when the producer can keep each one the whole dataset; else the next epoch)   */    \
  X(bool, join_now, false)                                                                 \
  X(std::string, runtime_dir, "") /* empty: the per-user default */                        \
  X(Placement, placement, Placement::Auto)                                                 \
  X(int, cuda_device, -1) /* with Placement::Cuda */                                       \
  /* GPU batches: a slot goes back once the streams that used the batch are past   */     \
  /* it (Stream), or once the whole device is (Device: batches also used on side  */      \
  /* streams)                                                                      */     \
  X(MappedRing::ReleaseAfter, release_after, MappedRing::ReleaseAfter::Stream)             \
  /* One rank of a consumer group (world_size > 0): of each world_size *            */    \
  /* batch_size consecutive samples of the stream this rank takes the rank-th       */    \
  /* batch_size; the group starts once every rank is present.                       */    \
  X(std::string, group, "")                                                                \
  X(int32_t, rank, 0)                                                                      \
  X(int32_t, world_size, 0)                                                                \
  /* Resume (resume_epoch >= 0): continue the producer's epoch resume_epoch at      */    \
  /* sample position resume_position of its stream (a saved position()).            */    \
  X(int64_t, resume_epoch, -1)                                                             \
  X(int64_t, resume_position, 0)                                                           \
  X(int64_t, resume_joined_at, 0) /* the saved epochs began there in the producer's */       \
  X(uint64_t, resume_run, 0) /* the producer's run it was saved in (stats; 0: unknown) */ \
  /* An epoch asked for after the producer served all its epochs: empty (true), or  */    \
  /* EpochsExhausted (false: a training loop must not quietly get nothing).         */    \
  X(bool, empty_past_last_epoch, false)                                                    \
  /* Seconds next() waits for its next batch with nothing from the producer        */    \
  /* meanwhile before it raises Stalled (0: waits for ever).                         */    \
  X(double, stall_timeout, 0.0)                                                            \
  /* Batches the caller may modify: each batch handed out is a private copy (else  */     \
  /* a view of shared memory: read-only on the host).                               */    \
  X(bool, writable, false)                                                                 \
  /* A GPU ring's batches as zero-copy views of the producer's memory, which every  */    \
  /* consumer on that GPU shares and none may modify (CUDA IPC maps it writable:    */    \
  /* nothing stops an in-place op). Without it, each batch is a private copy on     */    \
  /* the GPU, made on the current stream.                                           */    \
  X(bool, shared_gpu_views, false)                                                         \
  /* Re-padding, where one batch joins samples of loader batches padded to      */        \
  /* different lengths: each named leaf's pad value (Padding), one for every     */        \
  /* other tensor leaf, and the multiple padded dimensions are rounded up to.   */        \
  X(PadLeaves, pad_leaves, {})                                                             \
  X(std::optional<double>, pad_every, std::nullopt)                                        \
  X(int64_t, pad_multiple_of, 1)

struct ConsumerOptions {
  BATCHCAST_FIELDS(BATCHCAST_CONSUMER_OPTIONS)
  Reporter reporter;        // where warnings go (none: nowhere)
  // Called about every 100 ms on the caller's thread while a call blocks; it
  // may throw to abandon the call (the Python binding checks for signals).
  std::function<void()> interrupt;

  BATCHCAST_VISIT(BATCHCAST_CONSUMER_OPTIONS)
};

// What a consumer did so far (Consumer::stats()).
#define BATCHCAST_CONSUMER_STATS(X)                                                          \
  X(uint64_t, id, 0)                                                                         \
  X(int64_t, epoch, -1)                                                                      \
  /* joined mid-epoch: its epochs begin at this sample of the producer's (0: they  */        \
  /* are the producer's)                                                            */       \
  X(int64_t, joined_at, 0)                                                              \
  X(int64_t, batches, 0)          /* handed to the caller */                                 \
  X(int64_t, samples, 0)                                                                     \
  /* how the last batch's samples are known: "dataset index" (the producer said), */         \
  /* "position" (in the producer's epoch), "" before the first batch               */        \
  X(std::string, sample_identity, "")                                                        \
  X(int64_t, loader_batches, 0)   /* announcements received */                               \
  X(int64_t, views, 0)            /* tensors that are views of shared memory */              \
  X(int64_t, copies, 0)           /* tensors concatenated across a ring wrap or a spill */   \
  X(int64_t, spills, 0)           /* times pending samples were copied out of the ring */    \
  X(int64_t, repadded, 0)         /* batches with a leaf re-padded (one copy of it each) */  \
  X(int64_t, private_copies, 0)   /* loader batches copied: kept batches pinned our share */ \
  /* batches handed out as private copies of shared memory (writable, or GPU     */          \
  /* batches without shared_gpu_views)                                            */         \
  X(int64_t, batch_copies, 0)                                                                \
  X(int64_t, slots_held, 0)       /* ring slots this process still references */             \
  X(int64_t, slots_pinned, 0)     /* of those, slots of batches kept beyond the current */   \
  X(int32_t, pin_budget, 0)       /* slots it may pin before taking private copies */        \
  X(int64_t, dropped_messages, 0) /* malformed or unexpected messages ignored */             \
  /* whether announcements and releases go through the mailbox in shared memory  */          \
  /* (false: over the socket; the producer could not give one)                    */         \
  X(bool, mailbox, false)                                                                    \
  X(std::string, device, "")      /* where batches are handed out: "cpu", "cuda:N" */        \
  X(int64_t, ring_device, -1)     /* the producer's GPU as numbered here (-1: host ring) */  \
  /* how loader batches get there: "shared-memory" (host views), "view" (GPU      */         \
  /* views, zero copies), "peer" (one GPU-to-GPU copy), "host-staged" (one copy   */         \
  /* through host memory), "device-to-host" (one copy to host memory)             */         \
  X(std::string, transfer, "")                                                               \
  X(int64_t, ipc_memory_opens, 0) /* CUDA IPC memory handles opened (one per ring) */        \
  X(int64_t, ipc_event_opens, 0)  /* CUDA IPC event handles opened (once, at join) */        \
  X(int64_t, transfers, 0)        /* loader batches copied to this consumer's device */      \
  X(uint64_t, ring_address, 0)    /* where the ring is mapped here (0: not mapped) */        \
  X(uint64_t, ring_bytes, 0)                                                                 \
  X(std::string, loader, "")      /* the producer's description of its loader */             \
  X(uint64_t, run, 0)             /* the producer's run it joined (for resuming) */          \
  /* how it resumed: "" (it did not), "exact", or "next-pass" (the producer no    */         \
  /* longer held its position, or was restarted since: those positions of the     */         \
  /* next pass instead)                                                           */         \
  X(std::string, resumed, "")

struct ConsumerStats {
  BATCHCAST_FIELDS(BATCHCAST_CONSUMER_STATS)
  BATCHCAST_VISIT(BATCHCAST_CONSUMER_STATS)
};

class Consumer {
 public:
  // Connects and waits up to options.timeout for the producer. Throws
  // ProducerLost on timeout, Refused on a protocol mismatch, InvalidArgument
  // for bad options, CudaError when the producer's GPU cannot be used here.
  explicit Consumer(ConsumerOptions options);
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;
  ~Consumer();

  // Starts the next epoch and returns its number. An unfinished epoch is left
  // (what is left of it is discarded), except a peek: when the consumer's
  // first epoch handed out one batch and no more (next(iter(loader))), that
  // epoch starts again from its start, the peeked batch included.
  int64_t begin_epoch();
  // The next batch of the current epoch, or nullopt at its end. Throws
  // ProducerLost (also for an epoch the producer was stopped before serving),
  // EpochsExhausted (an epoch after the producer's last), Evicted,
  // LoaderError, RebatchError.
  std::optional<Batch> next();
  // The same, with the leaves that view the producer's ring left as their
  // description (RingView): for a binding that hands them to its own
  // tensors without a tensor in between. identities = false leaves the
  // batch's `indices` empty (what a caller that does not hand them out
  // saves composing).
  std::optional<ViewBatch> next_views(bool identities = true);
  // True once the producer said it serves no more epochs and this one is empty.
  bool finished() const { return life_.finished(); }
  // How samples of variable length are joined (rebatcher.h); before the first
  // batch. Throws InvalidArgument (a leaf it names is checked at the first batch).

  int64_t samples_per_epoch() const;  // -1 while unknown
  int64_t batches_per_epoch() const;  // -1 while unknown
  int64_t own_samples_per_epoch() const;  // of those samples, the ones it takes (a group rank: its part)
  // Where this consumer stands, to resume from: (epoch, stream position of
  // the first sample it has not taken). Between epochs, (next epoch, 0); a
  // group's rank before its group is complete, (-1, 0): wherever it starts.
  std::pair<int64_t, int64_t> position() const;
  void close();
  ConsumerStats stats() const;
  const ConsumerOptions& options() const { return options_; }

 private:
  enum class Transfer { SharedMemory, View, Peer, HostStaged, DeviceToHost };
  void place(const protocol::Ring& ring);
  void receive(protocol::Announcement& a);
  void resume_from(protocol::Resume resume, int64_t first_epoch, int64_t position);
  void await_group();
  [[noreturn]] void fail_group(const protocol::GroupBroken& broken);
  int64_t pinned_beyond(uint64_t incoming) const;
  void push(LoaderBatch batch);
  std::optional<ViewBatch> hand_out(std::optional<ViewBatch> batch);
  Tensor private_copy(const Tensor& view) const;
  std::optional<ViewBatch> past_end();
  std::optional<ViewBatch> take_next(bool identities);  // in an epoch: reads until a batch, or its end
  bool can_restart() const;

  ConsumerOptions options_;
  std::shared_ptr<Channel> channel_;
  Transfer transfer_ = Transfer::SharedMemory;
  Device device_ = cpu_device();  // where batches are handed out
  int ring_device_ = -1;            // the producer's GPU as numbered here; -1: host ring
  int64_t transfers_ = 0;
  int64_t private_copies_ = 0;
  bool copy_out_ = false;           // batches are handed out as private copies
  std::shared_ptr<CopyMemory> copy_memory_ = std::make_shared<CopyMemory>();
  int64_t batch_copies_ = 0;
  int32_t pin_budget_ = 0;
  bool warned_keeping_ = false;
  Rebatcher rebatcher_;
  int64_t epoch_ = -1;       // current epoch, -1 before the first
  int64_t next_epoch_ = 0;
  int64_t first_epoch_ = -1; // the producer's epoch this consumer started at
  int64_t joined_at_ = 0;  // where its epochs begin in the producer's (joined mid-epoch)
  Lifecycle life_{false};    // where it is in its epochs, and why they ended (lifecycle.h)
  int64_t epochs_done_ = 0;  // epochs this consumer was handed to their end
  int64_t epoch_batches_ = 0;  // batches handed out in the current epoch
  // The first epoch's loader batches while it has handed out at most one
  // batch: a peek (next(iter(loader))) gives them back (begin_epoch).
  std::vector<LoaderBatch> replay_;
  bool replaying_ = false;   // replay_ is being kept
  protocol::Welcome joined_;     // what the producer was doing when this consumer joined
  bool told_waiting_ = false;    // said once what its first epoch waits for
  void say_what_it_waits_for(double waited);
  // Throws Stalled once stall_timeout has passed since `since` (the last news).
  void check_stall(std::chrono::steady_clock::time_point since) const;
  uint64_t id_ = 0;
  int64_t samples_per_epoch_ = -1;
  int64_t loader_batches_per_epoch_ = -1;
  int64_t batches_ = 0;
  int64_t samples_ = 0;
  std::optional<bool> indexed_;  // how the last batch's samples are known (none: no batch yet)
  protocol::Resume resume_ = protocol::Resume::None;
  int64_t resume_at_epoch_ = -1;    // the epoch it resumes in, from resume_position_
  int64_t resume_position_ = 0;
  std::string loader_;
  Birthplace born_;
};

}  // namespace batchcast
