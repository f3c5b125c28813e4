// The producer core: owns the ring, the ROUTER socket and the membership, and
// publishes each loader batch once. The caller (the Python package, or a C++
// program) drives epochs and hands over batches; one I/O thread does the rest.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "batchcast/common/batch.h"
#include "batchcast/common/endpoint.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/protocol/message.h"
#include "batchcast/ring/ring.h"

namespace batchcast {

struct ProducerOptions {
  std::string name;
  std::string runtime_dir;        // empty: the per-user default
  int64_t slots = 8;              // the ring holds this many batches the size of the first
  uint64_t ring_bytes = 0;        // lower bound on the ring's size
  int64_t samples_per_epoch = -1; // -1 unknown; learned after the first epoch
  double straggler_timeout = 0;   // > 0: evict a consumer holding the oldest slot this
                                  // long while the producer waits for ring space
  int64_t catch_up_window = -1;   // first batches of each epoch kept for catch-up
                                  // joins; -1: slots / 2, 0: none
  int cuda_device = -1;           // >= 0: the ring is GPU memory on this device
  double linger = 30.0;           // GPU ring: seconds the destructor waits for consumers
                                  // to unmap it before freeing it
};

struct ConsumerInfo {
  uint64_t id = 0;
  int64_t pid = 0;
  int64_t first_epoch = 0;
  int64_t slots_held = 0;
  int64_t batches_sent = 0;
  bool leaving = false;           // said goodbye; still holds slots (its tensors are alive)
};

struct ProducerStats {
  int64_t batches_published = 0;
  int64_t bytes_published = 0;
  double publish_seconds = 0;     // copying into the ring and announcing
  double wait_seconds = 0;        // waiting for ring space (the slowest consumer)
  int64_t joins = 0;
  int64_t leaves = 0;             // said goodbye
  int64_t crashes = 0;            // vanished without goodbye
  int64_t evictions = 0;          // stragglers removed (straggler_timeout)
  int64_t refused = 0;            // other protocol versions
  int64_t dropped_messages = 0;   // malformed or unexpected
  uint64_t ring_bytes = 0;
  std::string ring_device;        // "cpu" or "cuda:N"
  int64_t slots_in_use = 0;
  std::vector<ConsumerInfo> consumers;
};

class Producer {
 public:
  explicit Producer(ProducerOptions options);
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;
  ~Producer();

  // Blocks until `count` consumers are present. False on timeout (seconds < 0:
  // no timeout). Throws Stopped when stop() is called meanwhile.
  bool wait_for_consumers(int64_t count, double timeout_seconds);

  void begin_epoch(int64_t epoch);
  // Copies the batch into the ring (waiting for space) and announces it.
  // Returns the seconds spent waiting for space. Throws Stopped,
  // InvalidArgument for unsharable batches.
  double publish(const Batch& batch);
  void end_epoch();
  // The loader raised: every consumer gets a LoaderError with this message.
  void fail(const std::string& message);
  // No more epochs; consumers finish what they hold and then stop.
  void finish();
  // Safe from any thread: wakes and fails every blocked call.
  void stop();
  // Stops, tells consumers, and frees everything (the destructor does this too).
  // A GPU ring is freed once every consumer has let go of it, or after `linger`.
  void close();

  ProducerStats stats() const;
  std::string endpoint() const { return endpoint_; }
  int64_t consumer_count() const;

 private:
  struct Member {
    uint64_t id;
    int64_t pid;
    int64_t first_epoch;
    int64_t batches_sent = 0;
    bool leaving = false;  // said Bye: gets nothing more, keeps what it holds
    bool mapped = false;   // was given a GPU ring it has not said it unmapped
  };
  // Who holds an announced slot, and since when.
  struct SlotHold {
    std::set<std::string> holders;
    std::chrono::steady_clock::time_point since;
  };
  // What the I/O thread sends, in order, and to whom.
  enum class Route { EpochBegin, Batch, EpochEnd, Ring, Finish, Everyone };
  struct Outgoing {
    Route route;
    int64_t epoch = -1;
    uint64_t seq = 0;
    std::string bytes;
  };

  void serve();
  void handle(const std::string& peer, const void* data, std::size_t size);
  void deliver(Outgoing& out);
  void send_to(const std::string& peer, const std::string& bytes);
  enum class Departure { Gone, Crashed, Evicted };
  void remove_member(const std::string& peer, Departure how);
  void drop_holder(uint64_t seq, const std::string& peer);
  void free_if_unheld(std::map<uint64_t, SlotHold>::iterator slot);
  void free_slot(uint64_t seq);
  void forget_if_done(const std::string& peer);
  int64_t active_members() const;
  void await_unmapped();
  void check_liveness();
  void end_retention();
  void evict_stragglers();
  void enqueue(Outgoing out);
  void create_ring(const std::vector<uint64_t>& leaf_bytes);
  double copy_and_announce(const Batch& batch, const LaneAllocator::Slot& slot, int event,
                           const std::vector<uint64_t>& bytes, std::chrono::steady_clock::time_point start,
                           double waited);

  ProducerOptions options_;
  std::string dir_;
  std::unique_ptr<NameLock> lock_;
  std::string endpoint_;
  zmq::context_t context_;
  zmq::socket_t router_;
  Wakeup wakeup_;

  mutable std::mutex mu_;
  std::condition_variable changed_;  // members, ring space, stop
  std::map<std::string, Member> members_;
  std::map<uint64_t, SlotHold> held_;  // announced slots not yet released by everyone
  bool waiting_for_space_ = false;
  // The current epoch's first batches, kept for consumers that join late in
  // catch-up mode: (seq, encoded announcement), while the epoch is within the window.
  std::vector<std::pair<uint64_t, std::string>> retained_;
  int64_t delivered_epoch_ = -1;  // epoch in progress, as delivered; -1 between epochs
  int64_t delivered_in_epoch_ = 0;
  std::deque<Outgoing> outbox_;
  std::optional<SharedRegion> region_;
  std::unique_ptr<cuda::DeviceRing> gpu_;
  int64_t publishing_ = 0;                // publish() calls between slot and announcement
  std::map<std::string, int64_t> evicted_importers_;  // evicted, may still map the GPU ring: pid
  std::vector<int> free_events_;          // GPU ring: slot events not in use
  std::map<uint64_t, int> slot_events_;   // GPU ring: seq -> its slot event
  protocol::Ring ring_;                   // as described to consumers
  std::optional<LaneAllocator> lanes_;
  int64_t epoch_ = -1;
  int64_t epoch_batches_ = 0;
  int64_t epoch_samples_ = 0;
  int64_t epochs_done_ = 0;
  int64_t next_joinable_epoch_ = 0;  // I/O thread's view, in announcement order
  uint64_t next_member_id_ = 1;
  ProducerStats stats_;
  bool stopping_ = false;
  bool finished_ = false;  // Finished was queued
  std::string finished_bytes_;  // Finished, once delivered
  std::atomic<bool> quit_io_{false};
  std::mutex close_mu_;
  bool closed_ = false;
  std::thread io_;
};

}  // namespace batchcast
