// The ring: one memfd-backed shared memory region, divided into one lane per
// leaf of the loader's batches. Each lane is a FIFO byte ring, so a leaf of
// consecutive loader batches lies back to back in memory and a consumer batch
// that spans them is still a single view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "batchcast/common/fd.h"

namespace batchcast {

// A memfd and its mapping. Nothing appears in /dev/shm, and the memory goes
// away with the last process that maps it, whatever way that process exits.
class SharedRegion {
 public:
  // Producer side: read-write, pages faulted in once here so that writes
  // later run at memcpy speed.
  static SharedRegion create(std::size_t bytes, const std::string& label);
  // Consumer side: reopen the producer's memfd through /proc and map it
  // read-only (batches are shared; writing into one would corrupt the others).
  static SharedRegion open(long producer_pid, int fd, std::size_t bytes);

  std::byte* data() const { return mapping_.data(); }
  std::size_t size() const { return mapping_.size(); }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
  Mapping mapping_;
};

// Pure bookkeeping of where each loader batch's leaves go; knows nothing of
// memory. Slots are freed in any order but space is reclaimed in FIFO order.
class LaneAllocator {
 public:
  struct Slot {
    uint64_t seq;
    std::vector<uint64_t> offsets;  // absolute byte offsets, one per lane
  };

  explicit LaneAllocator(const std::vector<uint64_t>& lane_capacities);

  std::size_t lanes() const { return lanes_.size(); }
  uint64_t total_bytes() const { return total_; }
  uint64_t lane_capacity(std::size_t lane) const { return lanes_[lane].capacity; }

  // nullopt while the ring is too full; InvalidArgument if a leaf can never
  // fit its lane. `align` is each leaf's element size.
  std::optional<Slot> try_allocate(const std::vector<uint64_t>& bytes,
                                   const std::vector<uint64_t>& align);
  // Marks a slot free; returns false for an unknown or already freed seq.
  bool release(uint64_t seq);
  std::size_t in_flight() const { return slots_.size(); }
  std::vector<uint64_t> in_flight_seqs() const;

 private:
  struct Lane {
    uint64_t base = 0;
    uint64_t capacity = 0;
    uint64_t head = 0;  // relative to base
    uint64_t live = 0;  // bytes of slots not yet reclaimed
  };
  struct Record {
    uint64_t seq;
    std::vector<uint64_t> offsets;  // relative to lane base
    std::vector<uint64_t> sizes;
    bool released = false;
  };
  std::optional<uint64_t> place(std::size_t lane, uint64_t size, uint64_t align) const;

  std::vector<Lane> lanes_;
  std::deque<Record> slots_;
  uint64_t total_ = 0;
  uint64_t next_seq_ = 1;
};

}  // namespace batchcast
