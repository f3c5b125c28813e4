// The simulated device's streams and events (simulated_runtime.h says what
// it models), for its runtime (simulated_runtime.cpp) only: a stream is an
// ordered queue run by a thread of its own; an event's state lives in shared
// memory, so that other processes' streams can wait on it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "batchcast/common/threads.h"

namespace batchcast::cuda::simulated {

// An event's state, in shared memory so that other processes can wait on it:
// how many times it was recorded, and up to which record its stream has run.
struct EventState {
  std::atomic<uint32_t> recorded{0};
  std::atomic<uint32_t> completed{0};
};
static_assert(sizeof(EventState) == 8 && std::atomic<uint32_t>::is_always_lock_free);

struct SimEvent {
  EventState* state = nullptr;
  int64_t owner = 0;  // the process whose streams complete it
  int index = -1;     // in its owner's table
  bool imported = false;
};

// Record `record` of the event has run: its waiters go on.
void complete(EventState* e, uint32_t record);
// Blocks until record `record` of the event has completed. A record of a
// process that is gone never will: the wait ends then (its work was abandoned
// with its context).
void wait_for(const SimEvent& e, uint32_t record);

// A stream: an ordered queue of operations run by a thread of its own.
class SimStream {
 public:
  using Delay = std::function<void()>;
  explicit SimStream(Delay delay) : delay_(std::move(delay)) {
    thread_ = start_background_thread("batchcast-sim", [this] { run(); });
  }
  ~SimStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    changed_.notify_all();
    thread_.join();  // after what is queued has run
  }

  void push(std::function<void()> op, bool delayed) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(op), delayed});
      ++queued_;
    }
    changed_.notify_all();
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = queued_;
    changed_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  struct Op {
    std::function<void()> run;
    bool delayed;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      changed_.wait(lock, [&] { return quit_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Op op = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (op.delayed) delay_();
      try {
        op.run();
      } catch (...) {  // a test's host function; the stream goes on
      }
      op.run = nullptr;  // whatever it captured goes before it counts as done
      lock.lock();
      ++done_;
      changed_.notify_all();
    }
  }

  Delay delay_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Op> queue_;
  uint64_t queued_ = 0;
  uint64_t done_ = 0;
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace batchcast::cuda::simulated
