// Who holds the ring up, while the producer waits for ring space: a judgment
// over who holds which slot (the slot ledger), without I/O and without a
// clock of its own.
//
// - The consumer waited for: the one that has left a batch unreleased the
//   longest, among batches it has not moved past (those it keeps are within
//   its pin budget) and that are not the newest it was sent. One holding only
//   its newest batch waits for the producer itself (a trainer blocked in
//   next() still holds the batch before); it is the one waited for only when
//   nobody is behind and no leaving consumer is about to give slots back (an
//   evicted consumer releases what it queued once it reads its eviction).
//   Past straggler_timeout it is evicted.
// - A ring standing still: every consumer holding a slot is itself blocked
//   waiting for its next batch, so the slots are held by batches its trainer
//   still references (ones it keeps, and the one in hand) and nothing will
//   free them. After kStuckSeconds of that, the consumers that keep batches
//   (or, if none does, the one holding the most) are evicted with what to
//   change; the others go on with the slots they give back.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "batchcast/producer/slot_ledger.h"

namespace batchcast {

// What the judgment needs of one holder.
struct HolderFacts {
  int64_t pid = 0;
  uint64_t released_upto = 0;  // highest slot it released: held slots below it are kept
  uint64_t sent_upto = 0;      // highest slot announced to it
  bool leaving = false;
};

class Holdup {
 public:
  using Clock = SlotLedger::Clock;
  // How long a ring may stand still with every holder waiting before the
  // consumers keeping batches are evicted.
  static constexpr double kStuckSeconds = 2.0;

  struct Eviction {
    std::string peer;
    std::string reason;         // what the consumer is told: why, and what to change
    std::string logged;         // what the producer's log says
    std::string why_for_group;  // what its group's other ranks are told
  };
  struct Verdict {
    std::string waited_for;          // the consumer the producer waits for ("" none)
    std::optional<Eviction> straggler;  // ... evicted past straggler_timeout
    std::vector<Eviction> stuck;     // the ring stood still too long: these go
    std::string stuck_log;           // ... and the log says so
  };

  Holdup(std::string producer, int64_t slots, double straggler_timeout);

  // The producer waits for space now. `waits(peer)`: that consumer's trainer
  // is blocked waiting for its next batch (none given: unknown).
  Verdict judge(const SlotLedger& slots, const std::function<HolderFacts(const std::string&)>& facts,
                const std::function<bool(const std::string&)>& waits, Clock::time_point now);
  // It does not: whatever stood still moves again.
  void not_waiting();
  // While the ring stands still with every holder waiting: who holds what ("" otherwise).
  const std::string& stuck() const { return stuck_; }

 private:
  void check_stuck(const SlotLedger& slots, const std::function<HolderFacts(const std::string&)>& facts,
                   const std::function<bool(const std::string&)>& waits, Clock::time_point now, Verdict& v);

  std::string producer_;
  int64_t slots_;
  double straggler_timeout_;
  std::optional<Clock::time_point> stuck_since_;
  std::string stuck_;
};

}  // namespace batchcast
