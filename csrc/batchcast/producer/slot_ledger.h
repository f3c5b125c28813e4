// Every ring slot's life, in one place: the only code that decides a slot is
// free again. No I/O, no memory of its own (the ring's lanes are the space;
// this is who may use it), no clock: tests drive it directly.
//
//   (free) ──reserve──▶ Reserved ──write──▶ Writing ──queue──▶ Queued ──deliver──▶ Held ──▶ (free)
//   (free) ──lease────▶ Leased ───write──▶ ┘
//   Reserved | Leased | Writing ──abandon──▶ (free)     never announced
//
// - Reserved: publish() took the slot to copy a batch into.
// - Leased: a loader worker may be writing a batch into it (where the slot
//   lies in the ring is recorded with it: the worker was told).
// - Writing: publish() is writing (or has written) the batch; nothing else may.
// - Queued: announced, on its way to the consumers (the producer's stream).
// - Held: delivered. Its holders are the consumers it was sent to that have
//   not released it yet (a consumer keeping a batch is one of them); retained
//   means the catch-up window keeps it for consumers that join later. It is
//   free once it has neither.
//
// Each slot is freed exactly once, through the callback given at
// construction (the producer gives the ring its space back there). Events that
// do not fit a slot's state are programming errors (std::logic_error), except
// those a consumer's messages cause: a release of a slot it does not hold is
// ignored (late, repeated or forged releases cannot free anything).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "batchcast/protocol/message.h"

namespace batchcast {

class SlotLedger {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State { Reserved, Leased, Writing, Queued, Held };

  // What a delivered slot carries, and who holds it.
  struct Held {
    std::set<std::string> holders;  // consumers it was sent to that have not released it
    bool retained = false;          // kept for catch-up joins
    Clock::time_point since;        // delivered at
    std::shared_ptr<const protocol::Announcement> batch;  // for consumers that resume into it
    int64_t position = 0;           // samples of its epoch before it
  };

  explicit SlotLedger(std::function<void(uint64_t seq)> on_free);
  SlotLedger(const SlotLedger&) = delete;
  SlotLedger& operator=(const SlotLedger&) = delete;

  // Where a leased slot lies in the ring.
  struct Place {
    std::vector<uint64_t> offsets;  // each tensor leaf's byte offset
    int32_t event = -1;
  };

  // The producer's side. `seq` is the ring's name for a slot it just
  // allocated; a seq already in the ledger is a logic_error (leased twice).
  void reserve(uint64_t seq);
  void lease(uint64_t seq, Place place);
  void lease(uint64_t seq);  // lying nowhere in particular (tests)
  void write(uint64_t seq);  // Reserved or Leased -> Writing (a lease's place is forgotten)
  void queue(uint64_t seq);  // Writing -> Queued
  // Never announced (a failed write, a stop, a lease that came back): free.
  void abandon(uint64_t seq);

  // The membership's side. Queued -> Held by `holders`; free at once if
  // nobody holds it and it is not retained.
  void deliver(uint64_t seq, std::set<std::string> holders, bool retained, Clock::time_point since,
               std::shared_ptr<const protocol::Announcement> batch, int64_t position);
  // A consumer that joins with held batches (catch-up, resume) holds them too.
  void add_holder(uint64_t seq, const std::string& holder);
  // Whether `holder` held it (false changes nothing).
  bool release(uint64_t seq, const std::string& holder);
  // Everything `holder` holds (it crashed, or was forgotten).
  void release_all(const std::string& holder);
  void unretain(uint64_t seq);

  // Queries.
  bool contains(uint64_t seq) const { return slots_.count(seq) != 0; }
  State state(uint64_t seq) const;  // logic_error for a free slot
  bool is_held(uint64_t seq) const;
  bool holds_any(const std::string& holder) const;
  const Place* leased(uint64_t seq) const;  // where it lies, while Leased; else null
  std::vector<uint64_t> leases() const;      // the Leased slots
  const std::map<uint64_t, Held>& held() const { return held_; }  // by seq, oldest first
  int64_t count(State state) const;
  int64_t size() const { return static_cast<int64_t>(slots_.size()); }  // not free
  int64_t freed() const { return freed_; }

  // The ledger's own invariants (tests call it after every event):
  // each slot in one state, a Held slot's record exactly for Held slots (a
  // place exactly for Leased ones), no
  // Held slot without holders or retention. Throws logic_error naming the slot.
  void check() const;

  static const char* name(State state);

 private:
  void move(uint64_t seq, State from_a, State from_b, State to, const char* event);
  void free_if_unheld(std::map<uint64_t, Held>::iterator it);
  void free(uint64_t seq);

  std::function<void(uint64_t)> on_free_;
  std::map<uint64_t, State> slots_;  // every slot not free
  std::map<uint64_t, Held> held_;    // the Held ones
  std::map<uint64_t, Place> leased_; // the Leased ones
  int64_t freed_ = 0;
};

}  // namespace batchcast
