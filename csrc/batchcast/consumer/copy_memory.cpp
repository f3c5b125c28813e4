// CopyMemory (copy_memory.h): aligned host blocks for private copies, the
// last few freed kept for the next copy of the same size.
#include "batchcast/consumer/copy_memory.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace batchcast {

void* CopyMemory::take(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second == bytes) {
        void* p = it->first;
        free_.erase(it);
        return p;
      }
    }
  }
  void* p = nullptr;
  if (::posix_memalign(&p, 64, std::max<std::size_t>(bytes, 1)) != 0) throw std::bad_alloc();
  return p;
}

void CopyMemory::give_back(void* memory, std::size_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < kKept) {
    free_.emplace_back(memory, bytes);
    return;
  }
  // Full: the oldest goes (sizes change rarely; what is kept is the recent).
  std::free(free_.front().first);
  free_.erase(free_.begin());
  free_.emplace_back(memory, bytes);
}

CopyMemory::~CopyMemory() {
  for (auto& [p, bytes] : free_) std::free(p);
}

}  // namespace batchcast
