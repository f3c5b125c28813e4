// Host memory for a ring: one memfd, mapped read-write by the producer and
// read-only by each consumer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "batchcast/common/fd.h"

namespace batchcast {

// A memfd and its mapping. Nothing appears in /dev/shm, and the memory goes
// away with the last process that maps it, whatever way that process exits.
class SharedRegion {
 public:
  // Producer side: read-write. The part that is used from the start is
  // faulted in ahead of the writes (populate(), else fault_in()): a write into
  // fresh pages costs about three times a copy into warm memory (the kernel
  // zero-fills each page first).
  static SharedRegion create(std::size_t bytes, const std::string& label);
  // By writing zeros: only before anything else is written there.
  void fault_in(std::size_t offset, std::size_t bytes);
  // Without writing (MADV_POPULATE_WRITE): safe beside concurrent writes.
  // False where the kernel cannot (before Linux 5.14).
  bool populate(std::size_t offset, std::size_t bytes);
  // Consumer side: reopen the producer's memfd through /proc and map it
  // read-only (batches are shared; writing into one would corrupt the others),
  // without populating: that would allocate, zero-filled, every page the
  // producer has not written yet (the whole room for kept batches, at join);
  // pages come in as they are read.
  static SharedRegion open(long producer_pid, int fd, std::size_t bytes);

  std::byte* data() const { return mapping_.data(); }
  std::size_t size() const { return mapping_.size(); }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
  Mapping mapping_;
};

}  // namespace batchcast
