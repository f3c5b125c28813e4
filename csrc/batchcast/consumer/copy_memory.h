// CopyMemory: the host memory a consumer's private copies of batches live in
// (Consumer::private_copy), kept and reused as copies are freed. No torch.
#pragma once

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace batchcast {

// Host memory for private copies of batches, reused: a copy freed by the
// trainer gives its memory back for the next one of the same size, whose
// pages are then already faulted in. Keeps a few; shared with the copies'
// deleters, so it outlives the consumer while they live.
class CopyMemory {
 public:
  ~CopyMemory();
  void* take(std::size_t bytes);
  void give_back(void* memory, std::size_t bytes) noexcept;

 private:
  static constexpr std::size_t kKept = 4;
  std::mutex mu_;
  std::vector<std::pair<void*, std::size_t>> free_;
};

}  // namespace batchcast
