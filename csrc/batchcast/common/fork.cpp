#include "batchcast/common/fork.h"

#include <atomic>

#include <pthread.h>

namespace batchcast {
namespace {

std::atomic<uint64_t> generation{0};

void forked_child() { generation.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

uint64_t process_generation() noexcept {
  // Installed before the first object asks where it is made: every fork after
  // that is counted.
  static const bool installed = pthread_atfork(nullptr, nullptr, forked_child) == 0;
  (void)installed;
  return generation.load(std::memory_order_relaxed);
}

}  // namespace batchcast
