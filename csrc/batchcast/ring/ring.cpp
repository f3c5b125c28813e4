#include "batchcast/ring/ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "batchcast/common/error.h"

namespace batchcast {
namespace {
constexpr uint64_t kPage = 4096;
uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }
}  // namespace

SharedRegion SharedRegion::create(std::size_t bytes, const std::string& label) {
  SharedRegion r;
  r.fd_ = Fd(::memfd_create(("batchcast:" + label).c_str(), MFD_CLOEXEC));
  if (!r.fd_.valid()) throw SystemError("memfd_create", errno);
  if (::ftruncate(r.fd_.get(), static_cast<off_t>(bytes)) != 0) {
    throw SystemError("cannot size shared ring to " + std::to_string(bytes) + " bytes", errno);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd_.get(), 0);
  if (p == MAP_FAILED) throw SystemError("mmap of shared ring", errno);
  r.mapping_ = Mapping(p, bytes);
  // Fault every page in now: writes into fresh MAP_SHARED pages run ~10x
  // slower than memcpy. Touching also makes a short tmpfs fail here, not later.
  std::memset(p, 0, bytes);
  return r;
}

SharedRegion SharedRegion::open(long producer_pid, int fd, std::size_t bytes) {
  SharedRegion r;
  std::string path = "/proc/" + std::to_string(producer_pid) + "/fd/" + std::to_string(fd);
  r.fd_ = Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!r.fd_.valid()) throw SystemError("cannot open the producer's ring at " + path, errno);
  off_t actual = ::lseek(r.fd_.get(), 0, SEEK_END);
  if (actual < 0 || static_cast<std::size_t>(actual) < bytes) {
    throw MalformedMessage("ring at " + path + " is smaller than announced");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, r.fd_.get(), 0);
  if (p == MAP_FAILED) throw SystemError("mmap of the producer's ring", errno);
  r.mapping_ = Mapping(p, bytes);
  r.mapping_.guard_writes();
  r.fd_.reset();  // the mapping keeps the memory alive
  return r;
}

LaneAllocator::LaneAllocator(const std::vector<uint64_t>& lane_capacities) {
  for (uint64_t cap : lane_capacities) {
    Lane lane;
    lane.base = total_;
    lane.capacity = round_up(cap == 0 ? 1 : cap, kPage);
    total_ += lane.capacity;
    lanes_.push_back(lane);
  }
}

std::optional<uint64_t> LaneAllocator::place(std::size_t index, uint64_t size,
                                             uint64_t align) const {
  const Lane& lane = lanes_[index];
  uint64_t start = round_up(lane.head, align);
  if (lane.live == 0) {  // empty: anywhere
    if (start + size <= lane.capacity) return start;
    return uint64_t{0};
  }
  // The oldest unreclaimed allocation in this lane bounds the free space.
  uint64_t tail = lane.head;
  for (const Record& r : slots_) {
    if (r.sizes[index] > 0) {
      tail = r.offsets[index];
      break;
    }
  }
  if (tail < lane.head) {  // live data in [tail, head)
    if (start + size <= lane.capacity) return start;  // after the live data
    if (size <= tail) return uint64_t{0};             // wrap to the front
    return std::nullopt;
  }
  if (tail > lane.head) {  // wrapped: free space is [head, tail)
    if (start + size <= tail) return start;
    return std::nullopt;
  }
  return std::nullopt;  // tail == head with live data: full
}

std::optional<LaneAllocator::Slot> LaneAllocator::try_allocate(const std::vector<uint64_t>& bytes,
                                                               const std::vector<uint64_t>& align) {
  if (bytes.size() != lanes_.size() || align.size() != lanes_.size()) {
    throw RebatchError("loader batch has " + std::to_string(bytes.size()) +
                       " tensors but the ring was laid out for " + std::to_string(lanes_.size()) +
                       "; a loader must yield the same structure every batch");
  }
  Record rec;
  rec.sizes = bytes;
  rec.offsets.resize(lanes_.size());
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    if (bytes[i] > lanes_[i].capacity) {
      throw InvalidArgument("a batch tensor of " + std::to_string(bytes[i]) +
                            " bytes does not fit its ring lane of " +
                            std::to_string(lanes_[i].capacity) +
                            " bytes (sized from the first batch); pass a larger ring_bytes");
    }
    auto at = bytes[i] == 0 ? std::optional<uint64_t>(lanes_[i].head) : place(i, bytes[i], align[i]);
    if (!at) return std::nullopt;
    rec.offsets[i] = *at;
  }
  Slot slot{next_seq_++, {}};
  rec.seq = slot.seq;
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    lanes_[i].head = rec.offsets[i] + bytes[i];
    lanes_[i].live += bytes[i];
    slot.offsets.push_back(lanes_[i].base + rec.offsets[i]);
  }
  slots_.push_back(std::move(rec));
  return slot;
}

bool LaneAllocator::release(uint64_t seq) {
  bool found = false;
  for (Record& r : slots_) {
    if (r.seq == seq && !r.released) {
      r.released = true;
      found = true;
      break;
    }
  }
  while (!slots_.empty() && slots_.front().released) {
    for (std::size_t i = 0; i < lanes_.size(); ++i) lanes_[i].live -= slots_.front().sizes[i];
    slots_.pop_front();
  }
  return found;
}

std::vector<uint64_t> LaneAllocator::in_flight_seqs() const {
  std::vector<uint64_t> out;
  for (const Record& r : slots_) {
    if (!r.released) out.push_back(r.seq);
  }
  return out;
}

}  // namespace batchcast
