// What the producer's own files (producer.cpp, publishing.cpp, io_thread.cpp,
// stats.cpp) share and nothing else needs: how long a blocked call waits
// between looks at its interrupt, the seconds since a moment, and
// Producer::wait, the template every blocking call waits with.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "batchcast/producer/producer.h"

namespace batchcast {

constexpr auto kWaitSlice = std::chrono::milliseconds(100);

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

template <typename Done>
bool Producer::wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, double timeout,
                    Done done) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                         timeout < 0 ? 1e9 : timeout));
  auto last_interrupt = Clock::now();
  while (true) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    cv.wait_until(lock, std::min(deadline, Clock::now() + kWaitSlice));
    if (options_.interrupt && Clock::now() - last_interrupt >= kWaitSlice) {
      last_interrupt = Clock::now();
      lock.unlock();
      try {
        options_.interrupt();
      } catch (...) {
        lock.lock();
        throw;
      }
      lock.lock();
    }
  }
}

}  // namespace batchcast
