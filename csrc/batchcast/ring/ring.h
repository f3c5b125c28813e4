// The producer's ring: memory allocated once and exported once to every
// consumer, divided into lanes (lane_allocator.h), written one loader batch
// per slot. Where the memory lives — host shared memory or one GPU allocation
// shared over CUDA IPC — is decided once, by Ring::create; the producer never
// asks again.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batchcast/common/batch.h"
#include "batchcast/protocol/message.h"
#include "batchcast/ring/event_pool.h"
#include "batchcast/ring/lane_allocator.h"

namespace batchcast {

struct RingOptions {
  std::string label;       // names the memory (/proc/<pid>/fd shows "batchcast:<label>")
  int cuda_device = -1;    // >= 0: one allocation on this GPU; else host shared memory
  int64_t slots = 8;       // loader batches the ring holds, sized from the first
  uint64_t min_bytes = 0;  // lower bound on its size
};

// A reserved slot: where each tensor leaf of one loader batch goes and, for a
// GPU ring, the event recorded once its copy is done.
struct RingSlot {
  uint64_t seq = 0;
  std::vector<uint64_t> offsets;  // absolute byte offset of each tensor leaf
  int32_t event = -1;
};

class Ring {
 public:
  // Host shared memory, or GPU memory when options.cuda_device >= 0. Throws
  // CudaError when that GPU cannot be used.
  static std::unique_ptr<Ring> create(const RingOptions& options);
  virtual ~Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // What a consumer needs to map the ring; before allocate() only where it
  // will be (a GPU's UUID).
  const protocol::Ring& description() const { return description_; }
  virtual std::string device() const = 0;  // "cpu", "cuda:N"

  // Throws InvalidArgument for a batch this ring cannot take (before any slot
  // is reserved for it).
  virtual void check(const Batch& batch) const = 0;
  bool allocated() const { return lanes_.has_value(); }
  // Later batches may be this many times the first batch's bytes per tensor
  // (padded sequences, variable-length samples) with the same guarantees.
  static constexpr double kGrowth = 4.0;
  // Kept batches the ring counts room for, at least (kept_room()). A keeper
  // pins up to two batches before it is noticed, whatever its budget, so a
  // few keepers of a small ring would take the flow's room; the lanes, laid
  // out for batches up to kGrowth times the first, have the bytes for more
  // batches than they count.
  static constexpr int64_t kMinKeptRoom = 16;
  // Lays the lanes out for batches like this one and allocates the memory,
  // once: room for `slots` in flight, one lost at a wrap, and `slots` kept,
  // of batches up to kGrowth times this one (or more, with min_bytes). Room
  // beyond the first batch's size is touched only once batches grow into it.
  void allocate(const std::vector<uint64_t>& leaf_bytes);
  // Throws InvalidArgument, saying by how much and what to pass, when a
  // batch with these tensor sizes is larger than the lanes are laid out for.
  void check_fits(const std::vector<uint64_t>& bytes, const Batch& batch) const;
  // A slot for a batch with these tensor sizes, or nullopt while it is full.
  // At most `slots` + 1 batches of the flow are in the ring, besides `kept`
  // slots consumers keep (counted up to kept_room(); `slots` always: with
  // nobody keeping, the flow may use that room).
  std::optional<RingSlot> try_reserve(const std::vector<uint64_t>& bytes,
                                      const std::vector<uint64_t>& align, int64_t kept = 0);
  // Slots of kept batches the ring counts room for besides the flow's (while
  // its bytes and, on a GPU, its events last).
  int64_t kept_room() const;
  // Copies the batch's tensor leaves into its slot. A GPU ring queues the copy
  // and records the slot's event after it; the call returns meanwhile.
  // `in_place`: a loader worker wrote the batch into this slot of the ring's
  // host memory: a host ring has nothing to copy, a GPU ring copies it from
  // its pinned mirror. Returns the bytes copied on the host.
  virtual uint64_t write(const Batch& batch, const RingSlot& slot, bool in_place) = 0;
  // Nobody references the slot any more: its space (and event) can be reused.
  void release(uint64_t seq);
  // Waits until no copy into the ring is in flight (before freeing it, or
  // after a failed write).
  virtual void drain() noexcept {}
  // Whether the memory may be freed only after every consumer has unmapped
  // it (CUDA IPC: freeing memory another process maps is undefined; a memfd
  // simply lives on while mapped).
  virtual bool unmap_before_free() const { return false; }

  // Tensors copied into the ring straight from the loader's memory (pinned
  // host tensors into a GPU ring) rather than through staging.
  virtual int64_t direct_copies() const { return 0; }

  // Host shared memory (a memfd) that loader workers write whole batches
  // into, at the ring's own offsets (Producer::lease): a host ring's memory
  // itself; for a GPU ring a pinned host mirror of the ring, from which each
  // such batch's one host-to-device copy goes. open_host_memory() makes it
  // (once, after allocate()) and says whether there is one; it throws
  // CudaError where the mirror cannot be pinned. host_memory() is the
  // producer's mapping of it (nullptr before), host_fd() its memfd.
  virtual bool open_host_memory() { return host_memory() != nullptr; }
  virtual std::byte* host_memory() { return nullptr; }
  virtual int host_fd() const { return -1; }

  uint64_t bytes() const { return lanes_ ? lanes_->total_bytes() : 0; }
  int64_t slots_in_use() const { return lanes_ ? static_cast<int64_t>(lanes_->in_flight()) : 0; }

 protected:
  explicit Ring(RingOptions options) : options_(std::move(options)) {}
  // Allocates `bytes` of memory, and `events` slot events for a ring that
  // needs them, and completes description_.
  virtual void allocate_memory(uint64_t bytes, int events) = 0;
  // Slot events per slot the ring can hold (0: none, as for host memory).
  virtual int events_per_slot() const { return 0; }
  // Makes these (offset, bytes) ranges — the part of the ring used from the
  // start — ready for writing at full speed (host: faults their pages in).
  virtual void prepare(const std::vector<std::pair<uint64_t, uint64_t>>& /*ranges*/) {}

  RingOptions options_;
  protocol::Ring description_;

 private:
  std::optional<LaneAllocator> lanes_;
  std::vector<uint64_t> first_bytes_;  // of each tensor of the first batch
  std::vector<uint64_t> largest_;      // the largest tensor each lane takes
  std::optional<EventPool> events_;
  std::map<uint64_t, BorrowedEvent> slot_events_;  // declared after the pool: returned first
};

}  // namespace batchcast
