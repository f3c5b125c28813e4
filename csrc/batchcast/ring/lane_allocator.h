// Where each loader batch's leaves go in the ring: pure bookkeeping, no
// memory. The ring is divided into one lane per tensor leaf, and each lane is
// filled front to back and wraps around, so the same leaf of consecutive
// loader batches lies back to back and a consumer batch spanning them is a
// single view. Slots are freed in any order; a slot that stays in use (a batch
// a consumer keeps) is a hole the next allocations skip, never a wall.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace batchcast {

class LaneAllocator {
 public:
  struct Slot {
    uint64_t seq;
    std::vector<uint64_t> offsets;  // absolute byte offsets, one per lane
  };

  // Each capacity is rounded up to a page. Allocation stays within the first
  // `preferred_share` of each lane while it fits there, and uses the rest only
  // when held slots leave no room: memory that is never needed is never touched.
  explicit LaneAllocator(const std::vector<uint64_t>& lane_capacities, double preferred_share = 1.0);

  std::size_t lanes() const { return lanes_.size(); }
  uint64_t total_bytes() const { return total_; }
  uint64_t lane_base(std::size_t lane) const { return lanes_[lane].base; }
  uint64_t lane_capacity(std::size_t lane) const { return lanes_[lane].capacity; }
  uint64_t lane_preferred(std::size_t lane) const { return lanes_[lane].preferred; }

  // nullopt while no lane position fits; RebatchError when the batch has
  // another number of tensors than the ring's lanes, InvalidArgument if a leaf
  // can never fit its lane. `align` is each leaf's element size.
  std::optional<Slot> try_allocate(const std::vector<uint64_t>& bytes,
                                   const std::vector<uint64_t>& align);
  // Marks a slot free; false for an unknown or already freed seq.
  bool release(uint64_t seq);
  std::size_t in_flight() const { return slots_.size(); }

 private:
  struct Lane {
    uint64_t base = 0;
    uint64_t capacity = 0;
    uint64_t preferred = 0;              // where allocation wraps while it can
    uint64_t head = 0;                   // next position to try, relative to base
    std::map<uint64_t, uint64_t> live;   // [start, end) of slots in use, relative
  };
  struct Record {
    std::vector<uint64_t> starts;  // relative, per lane
    std::vector<uint64_t> sizes;
  };
  static std::optional<uint64_t> place(const Lane& lane, uint64_t size, uint64_t align,
                                       uint64_t limit);

  std::vector<Lane> lanes_;
  std::map<uint64_t, Record> slots_;
  uint64_t total_ = 0;
  uint64_t next_seq_ = 1;
};

}  // namespace batchcast
