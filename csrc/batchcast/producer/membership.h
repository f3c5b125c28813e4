// Who the consumers are and which ring slots each one holds: the producer's
// membership rules as a state machine without I/O (no ZeroMQ, no CUDA, no
// clock of its own). It takes events — a message from a peer, the next item of
// the producer's stream, a liveness sweep — and returns what to send to whom
// and what to report; who holds which slot it records in the producer's slot
// ledger (slot_ledger.h), which frees a slot once nobody holds it. The
// producer's I/O loop only moves bytes; tests drive this class directly.
//
// The rules:
// - Join: a consumer that says Hello before an epoch's first batch takes part
//   in that epoch, otherwise it starts at the next one. With catch-up, it gets
//   the current epoch from its start while the epoch's first batches are still
//   retained (catch_up_window). Joining now (while the producer steers its
//   loader's order, join_now), it gets the next batch: its epochs are
//   its own, each from its join position p of one producer epoch to p of the
//   next. Where every newcomer starts (these, and resumes), where its epochs
//   lie and how a batch looks in them is the join plan's (join_plan.h): this
//   gathers the held batches it names (newcomers.cpp) and sends what it
//   says. With a finite number of epochs,
//   its last epoch is the last whole one: then it is told Finished.
// - Lockstep: a slot is free once every consumer it was announced to has
//   released it (and the catch-up window no longer retains it).
// - Leave: Bye means "send nothing more"; the slots the consumer still
//   references stay held until it releases them. Unmapped means it references
//   nothing and has closed its mapping of the ring.
// - Crash: a consumer whose process is gone is dropped with everything it held.
// - Keeping: each consumer may pin a share of the ring with batches it keeps
//   (pin_budget); beyond that it takes private copies, so what consumers keep
//   never fills the ring and never counts as lagging behind.
// - Stragglers: while the producer waits for space, a consumer that has left
//   a batch unreleased longer than straggler_timeout — one it has not moved
//   past, so not a batch it keeps — is evicted: it gets nothing more, and
//   frees what it does not reference. A consumer holding only the newest
//   batch it was sent is waiting for the producer, not the other way round:
//   it is evicted only when nobody else can be waited for (no consumer
//   behind, none leaving with slots still to give back).
// - Groups: the ranks of a consumer group (a data-parallel trial) each get
//   the whole stream and take their own part of it; the group starts when
//   all its ranks are present (GroupReady: its first epoch), counts as one
//   consumer, and ends when one of its ranks goes: the others are told
//   (GroupBroken) and get nothing more. A new group of the name can form
//   once the old one is broken.
// - Resume: a consumer (or group) that asks to continue epoch e at sample
//   position s gets it exactly while the producer still holds every batch of
//   e from the one holding s on; otherwise positions from s of the next pass.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "batchcast/common/fields.h"
#include "batchcast/common/report.h"
#include "batchcast/producer/groups.h"
#include "batchcast/producer/holdup.h"
#include "batchcast/producer/join_plan.h"
#include "batchcast/producer/slot_ledger.h"
#include "batchcast/protocol/message.h"

namespace batchcast {

struct MembershipOptions {
  std::string name;               // the producer's name, for messages
  int64_t producer_pid = 0;
  uint64_t run = 0;               // this run of the producer (Welcome::run), never 0
  int64_t slots = 8;              // loader batches the ring is sized for
  double straggler_timeout = 0;   // seconds; 0: never evict
  protocol::Ring ring;            // where the ring is (a GPU's UUID) before it exists
  std::string loader;             // the loader's description, for resuming consumers
  JoinPlanOptions plan;           // where newcomers start: epochs, their lengths, catch-up, joining now
};

// What the producer knows of one consumer (in its stats and `batchcast status`).
#define BATCHCAST_CONSUMER_INFO(X)                                                               \
  X(uint64_t, id, 0)                                                                             \
  X(int64_t, pid, 0)                                                                             \
  X(int64_t, batch_size, 0)    /* its own (0: the loader's batches as they are) */               \
  X(int64_t, first_epoch, 0)                                                                     \
  X(int64_t, joined_at, 0) /* joined mid-epoch: where its epochs begin in the producer's */   \
  X(int64_t, slots_held, 0)    /* slots it has not released (announced, queued or referenced) */ \
  X(int64_t, slots_pinned, 0)  /* of those, slots it has moved past: batches it keeps */         \
  X(int64_t, lag, 0)           /* of those, batches sent that it has not consumed yet */         \
  X(int64_t, batches_sent, 0)                                                                    \
  X(double, stall_seconds, 0)  /* time the producer waited for ring space because of it */       \
  X(bool, holding_up, false)   /* the producer waits for ring space because of it, now */        \
  X(bool, leaving, false)      /* said goodbye or was evicted: gets nothing more */              \
  X(std::string, group, "")    /* its consumer group ("" none), rank and world size */           \
  X(int32_t, rank, 0)                                                                            \
  X(int32_t, world_size, 0)                                                                      \
  X(bool, waiting_for_group, false) /* its group is not complete yet: gets no batches */

struct ConsumerInfo {
  BATCHCAST_FIELDS(BATCHCAST_CONSUMER_INFO)
  BATCHCAST_VISIT(BATCHCAST_CONSUMER_INFO)
};

// The membership's counters (also the producer's statistics of those names).
#define BATCHCAST_MEMBERSHIP_COUNTERS(X)                                           \
  X(int64_t, joins, 0)                                                             \
  X(int64_t, leaves, 0)            /* said goodbye */                              \
  X(int64_t, crashes, 0)           /* vanished without goodbye */                  \
  X(int64_t, evictions, 0)         /* stragglers removed (straggler_timeout) */    \
  X(int64_t, refused, 0)           /* other protocol versions */                   \
  X(int64_t, dropped_messages, 0)  /* malformed or unexpected */                   \
  X(int64_t, groups_broken, 0)     /* consumer groups ended by a rank that went */ \
  X(int64_t, resumed, 0)           /* consumers (or groups) that resumed exactly */\
  X(int64_t, resumed_next_pass, 0) /* ... the rest of their epoch from the next pass */

struct MembershipCounters {
  BATCHCAST_FIELDS(BATCHCAST_MEMBERSHIP_COUNTERS)
  BATCHCAST_VISIT(BATCHCAST_MEMBERSHIP_COUNTERS)
};

// What one event asks of the I/O loop and of the ring.
struct Actions {
  struct Send {
    std::string peer;
    std::shared_ptr<const std::string> bytes;
    bool welcome = false;  // the peer's Welcome: what follows may take another way
    uint64_t consumer_id = 0;  // with welcome: the id it gave the consumer
  };
  std::vector<Send> sends;
  std::vector<Report> reports;
  std::vector<std::string> status_requests;  // peers that asked what the producer is doing
  bool members_changed = false;  // a consumer joined or went: wake whoever waits on that

  void merge(Actions other);  // `other`'s, after these
};

class Membership {
 public:
  using Clock = std::chrono::steady_clock;

  // Who holds which slot is recorded in `slots` (the producer's ledger,
  // which frees a slot once nobody holds it); it must outlive this.
  Membership(MembershipOptions options, SlotLedger& slots);

  // A message from a peer (raw bytes, validated here): Hello, Release, Bye,
  // Unmapped. Anything else is dropped and counted; another protocol version
  // is refused with a message that says what to do.
  Actions on_message(const std::string& peer, const void* data, std::size_t size);

  // The producer's stream, in the order consumers must see it.
  Actions on_ring(const protocol::Ring& ring);  // the ring exists now
  Actions on_epoch_begin(int64_t epoch);
  Actions on_batch(protocol::Announcement batch, Clock::time_point now);
  Actions on_epoch_end(const protocol::EpochEnd& end);
  Actions on_loader_failed(const protocol::LoaderFailed& failed);
  Actions on_finished(const protocol::Finished& finished);

  // Periodically: consumers whose process is gone are dropped; while the
  // producer waits for ring space, a straggler is evicted, and a ring that
  // cannot move at all (`waits(peer)`: that consumer's trainer is blocked
  // waiting for its next batch; none given: unknown) is resolved (stuck()).
  Actions on_sweep(const std::function<bool(int64_t pid)>& alive, bool waiting_for_space,
                   Clock::time_point now, const std::function<bool(const std::string&)>& waits = {});
  // While the ring stands still that way: who holds what ("" otherwise).
  const std::string& stuck() const { return holdup_.stuck(); }

  // A message that is not even two frames (a peer id and a body).
  Actions on_malformed();

  // Whether `peer` is a member (not forgotten yet).
  bool knows(const std::string& peer) const { return members_.count(peer) != 0; }
  // Consumers that have not said goodbye; a complete group counts once, a
  // forming one not at all.
  int64_t active() const;
  // The producer waits for `count` consumers before it begins (0: no more):
  // newcomers are told, to say what they wait for.
  void set_awaiting(int64_t count) { awaiting_ = count; }
  int64_t awaiting() const { return awaiting_; }
  // Processes that may still map the ring (GPU: it may be freed only after
  // each of them has unmapped it or exited).
  std::vector<int64_t> ring_importers() const;
  // Consumers (not leaving) given the ring that have not said they mapped it:
  // a host ring must stay open to them (they reopen it through /proc).
  std::vector<int64_t> ring_unmapped_yet() const;
  std::vector<ConsumerInfo> consumers() const;
  const MembershipCounters& counters() const { return counters_; }
  int32_t pin_budget() const;
  // Slots some consumer holds and has moved past: batches kept, which the
  // ring makes room for beside the flow (Ring::try_reserve).
  int64_t kept_slots() const;
  int64_t slots_held() const { return static_cast<int64_t>(slots_.held().size()); }
  // Where the consumers present joined mid-epoch (sorted, > 0): the producer
  // keeps the samples before each the same set in its next epoch. Called as
  // an epoch begins (nothing of the last one still to deliver), which records
  // them as that epoch's (a resume into it is exact only at one of them).
  std::vector<int64_t> steer_epoch(int64_t epoch) { return plan_.steer(epoch); }
  // The producer's order of the epoch steered last (JoinPlan::order).
  std::vector<int64_t> order_epoch(std::vector<int64_t> fresh) { return plan_.order(std::move(fresh)); }

 private:
  struct Member {
    uint64_t id = 0;
    int64_t pid = 0;
    int64_t batch_size = 0;
    Frame frame;                 // where its epochs lie in the producer's
    double stall_seconds = 0;
    int64_t batches_sent = 0;
    uint64_t released_upto = 0;  // highest slot it released: held slots below it are kept
    uint64_t sent_upto = 0;      // highest slot announced to it: holding only that, it waits for us
    bool leaving = false;
    bool mapped = false;         // was given a GPU ring it has not said it unmapped
    bool unread_ring = false;    // was given the ring and has not said it mapped it
    protocol::Hello hello;       // as it joined (group, rank, resume)
    uint64_t group = 0;          // its group's id; 0: none
    bool waiting_for_group = false;

    bool takes_part_in(int64_t epoch) const { return frame.first_epoch <= epoch; }
  };
  // Where a newcomer (or a group, once complete) starts: the join plan's
  // word, with the held batches it gets first.
  struct Start {
    StartPoint point;
    std::vector<std::shared_ptr<const protocol::Announcement>> batches;  // held ones to send
    std::optional<protocol::EpochEnd> end;  // resumed into an epoch that has ended: its end too
    protocol::Resume resume() const;
  };
  enum class Departure { Unmapped, Crashed };

  void join(const std::string& peer, const protocol::Hello& hello, Actions& out);
  uint64_t admit_to_group(const std::string& peer, const protocol::Hello& hello, Actions& out);
  void start_group(uint64_t id, Actions& out);
  Start start_for(const protocol::Hello& hello, uint32_t flags, Actions& out);
  bool held(const Replay& replay, std::vector<std::shared_ptr<const protocol::Announcement>>& batches) const;
  // A batch to one member: framed in its epochs, its own epoch's end after it.
  bool hand(Actions& out, const std::string& peer, Member& m,
            const std::shared_ptr<const protocol::Announcement>& batch,
            std::map<int64_t, std::shared_ptr<const std::string>>& encoded);
  void begin(const std::string& peer, Member& member, const Start& start, Actions& out);
  void break_group(const std::string& peer, const std::string& what, Actions& out);
  void refuse(Actions& out, const std::string& peer, std::string reason);
  void send(Actions& out, const std::string& peer, std::shared_ptr<const std::string> bytes);
  void broadcast(Actions& out, const protocol::Message& message, int64_t epoch = -1);
  std::shared_ptr<const std::string> encode_batch(protocol::Announcement batch) const;
  int64_t taking() const;  // member processes that get batches (each rank of a group)
  void forget_if_done(const std::string& peer, Actions& out);
  void remove(const std::string& peer, Departure how, Actions& out);
  // Tells the consumer `reason`, logs `logged`; its group breaks.
  // It gets nothing more (its join position goes).
  void stop(Member& m, Actions& out);
  void evict(const std::string& peer, const std::string& reason, const std::string& logged,
             const std::string& why_for_group, Actions& out);
  void end_retention();
  void report(Actions& out, Report::Level level, std::string message) const;
  std::string who(const Member& m) const;

  MembershipOptions options_;
  std::map<std::string, Member> members_;  // by ZeroMQ routing id
  SlotLedger& slots_;                       // who holds each delivered slot
  JoinPlan plan_;                            // where each member's epochs begin; where the stream is
  std::vector<uint64_t> retained_;          // the current epoch's first batches (their slots)
  bool told_cannot_join_now_ = false;
  std::optional<protocol::EpochEnd> last_end_;  // of the last epoch that ended
  ConsumerGroups groups_;                   // forming or complete; a broken group leaves
  int64_t awaiting_ = 0;
  uint64_t next_id_ = 1;
  std::shared_ptr<const std::string> finished_;  // Finished, for consumers joining later
  std::optional<Clock::time_point> last_sweep_;
  std::string holding_up_;  // the member the last sweep found the producer waiting for
  Holdup holdup_;           // who holds the ring up, while the producer waits for space
  MembershipCounters counters_;
};

}  // namespace batchcast
