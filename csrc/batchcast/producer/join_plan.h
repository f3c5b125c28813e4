// Where each trainer's epochs begin: the producer's join plan, without I/O.
//
// A trainer that joins mid-epoch, after sample position p of the producer's
// epoch e, starts with the next batch: its epochs are its own, positions
// p..M of epoch e then 0..p of epoch e + 1, and so on (its frame). Each is
// the whole dataset exactly when the samples before p are the same set in
// consecutive epochs. So while trainers joined mid-epoch are present, the
// producer keeps each *block* of its order — the samples between two
// consecutive join positions — the same set as in the epoch before, in the
// loader's fresh order filtered to the block (order()). With nobody joined
// mid-epoch there is one block: the order is the loader's own, exactly. A
// join position goes when its last trainer leaves: its blocks merge.
//
// The plan follows the stream as consumers see it (on_batch, on_epoch_end)
// and answers, once each: where a newcomer starts — the next epoch, the
// current one caught up, the next batch (joining now), a resumed epoch, plain
// or begun mid-epoch — and which held batches it gets first (start); how a
// loader batch looks in a trainer's own epochs (frame); which epoch of its own
// is in progress (own_epoch); and the producer's order of an epoch (steer,
// then order). Every call is made under
// the producer's lock; invariants are checked where they are used and broken
// ones throw (InvalidArgument for what a caller passed, std::logic_error for
// the plan's own).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace batchcast {

struct JoinPlanOptions {
  // The producer keeps its loader's order in blocks, so trainers may join
  // mid-epoch. Needs both lengths below.
  bool join_now = false;
  int64_t samples_per_epoch = -1;  // -1: learned when the first epoch ends
  int64_t batches_per_epoch = -1;
  int64_t epochs = -1;             // epochs the producer serves; -1: until stopped
  // A newcomer that asks to catch up gets the current epoch from its start
  // while no more than this many of its batches were served (the producer
  // retains them); later, it starts at the next epoch.
  int64_t catch_up_window = 0;
};

// Where one trainer's epochs lie in the producer's.
struct Frame {
  int64_t first_epoch = 0;
  int64_t joined_at = 0;        // its epochs begin at this sample position of the producer's (0: with them)
  int64_t joined_at_index = 0;  // ... which is where this loader batch begins
  int64_t last_epoch = std::numeric_limits<int64_t>::max();  // its last epoch (then Finished)

  bool operator==(const Frame&) const = default;
};

// A loader batch (or its epoch's end) as one trainer sees it.
struct Framed {
  bool in_epochs = false;  // it belongs to one of the trainer's epochs: send it
  int64_t epoch = 0;       // the trainer's epoch, index and sample position
  int64_t index = 0;
  int64_t position = 0;
  bool ends_epoch = false;  // the trainer's epoch ends after it (send its EpochEnd)
  bool last = false;        // ... and that was its last epoch (send Finished)
  std::string broken;       // not empty: the batch spans where its epochs begin (why)
};

// What a newcomer asks for (its Hello; for a group, what every rank asked).
struct StartRequest {
  bool catch_up = false;        // the epoch in progress from its start (within catch_up_window)
  bool join_now = false;        // the next batch: its epochs its own (join_now)
  int64_t resume_epoch = -1;    // resuming its epoch of that number (-1: not resuming) ...
  int64_t resume_position = 0;  // ... at this sample position of it ...
  int64_t resume_joined_at = 0;    // ... an epoch of its own begun at this sample of the producer's (0: with them)
  // ... saved while this run of the producer served. A state of another run
  // (a producer since restarted, or unknown) names positions of that run's
  // passes: only an epoch's start or end is a place in this run's.
  bool saved_in_this_run = false;
};

// Batches of the producer's stream a newcomer gets first, from what the
// producer still holds: epoch `epoch`'s, from the one holding sample
// `position` through its batch `through` - 1.
struct Replay {
  int64_t epoch = 0;
  int64_t position = 0;
  int64_t through = 0;
  bool with_end = false;  // that epoch has ended, and its end is the newcomer's: send it too

  bool operator==(const Replay&) const = default;
};

// Where a newcomer starts, and anything it asked for that it does not get.
struct StartPoint {
  enum class Resumed { No, Exact, NextPass };
  Frame frame;
  Resumed resumed = Resumed::No;
  int64_t position = 0;         // resuming: the sample position of its own epoch it continues at
                                // (next pass: of its first epoch)
  std::optional<Replay> replay;  // held batches it gets first (catch-up, resume)
  bool caught_up_too_late = false;  // asked to catch up past catch_up_window: starts at the next epoch
  std::string why_not_now;          // asked to join now where the loader's order is not the producer's
                                    // to keep: why (it starts at the next epoch)
  bool other_run = false;           // resumed mid-epoch from a state of another run: the next pass
};

class JoinPlan {
 public:
  // Throws InvalidArgument for options that cannot be served.
  explicit JoinPlan(JoinPlanOptions options);
  // The options as a plan takes them (InvalidArgument otherwise), without one.
  static JoinPlanOptions checked(JoinPlanOptions options);

  // ---- the stream, as consumers get it ----
  void on_epoch_begin(int64_t epoch);
  // A loader batch of `samples` samples, the index-th of its epoch; returns
  // its sample position in the epoch.
  int64_t on_batch(int64_t epoch, int64_t index, int64_t samples);
  // The epoch ended. Returns "" or, when its length differs from every epoch
  // before while trainers joined mid-epoch are present, why their epochs broke.
  std::string on_epoch_end(int64_t epoch, int64_t samples, int64_t batches);

  int64_t epoch_in_progress() const { return epoch_; }  // -1 between epochs
  int64_t batches_in_epoch() const { return batches_; }
  int64_t samples_in_epoch() const { return samples_; }
  int64_t next_epoch() const { return next_epoch_; }  // the first a newcomer can take part in whole
  int64_t samples_per_epoch() const { return options_.samples_per_epoch; }
  int64_t batches_per_epoch() const { return options_.batches_per_epoch; }
  // Whether the batch on_batch counted last is retained for catch-up joins.
  bool retains_batch() const { return epoch_ >= 0 && batches_ <= options_.catch_up_window; }
  int64_t catch_up_window() const { return options_.catch_up_window; }

  // ---- where a newcomer starts ----
  // Every start is decided here: with nothing asked, the next epoch (the
  // current one while its first batch has not come); catching up, the epoch
  // in progress from its start while it is retained; joining now, the next
  // batch; resuming, its epoch at its position where that can be served
  // exactly — the order it saw kept, and every batch of it from the one
  // holding its position not served yet or still held (`held` says which
  // replays the producer can still give) — else those positions of the next
  // pass. A state saved in another run of the producer resumes exactly only
  // at an epoch's start (or end): else those positions of this run's next
  // pass. A replay it may get is one `held` accepted.
  StartPoint start(const StartRequest& request, const std::function<bool(const Replay&)>& held) const;
  Frame next_epoch_frame() const { return Frame{next_epoch_, 0, 0}; }  // with the producer's, from the next epoch

  // ---- the trainers present and the producer's order ----
  void joined(uint64_t member, const Frame& frame);  // takes part with that frame
  void left(uint64_t member);                        // gets nothing more (idempotent)
  // The join positions of the trainers present (sorted, > 0), recorded as
  // the ones epoch `epoch` is ordered by. Called as it begins, before order().
  std::vector<int64_t> steer(int64_t epoch);
  // The epoch's order: `fresh` (the loader's new order of the last epoch's
  // samples), with the samples between consecutive steered positions kept
  // the same set as in the last epoch, each block in `fresh`'s order (and
  // what an epoch's batches leave out, past samples_per_epoch, kept out).
  // Throws InvalidArgument when `fresh` is not the last epoch's samples in
  // another order while trainers joined mid-epoch are present.
  std::vector<int64_t> order(std::vector<int64_t> fresh);

  // ---- one trainer's view ----
  Framed frame(const Frame& frame, int64_t epoch, int64_t index, int64_t position, int64_t samples) const;
  int64_t own_epoch(const Frame& frame) const;  // its epoch in progress (or its next, between them)

 private:
  // Where a resumed trainer's position lies in the stream, and whether the
  // order it saw is kept there.
  struct ResumePoint {
    Frame frame;           // its frame from now on
    int64_t position = 0;  // the sample position of its own epoch it continues at
    int64_t at_epoch = 0;  // where that is in the producer's stream
    int64_t at_position = 0;
    bool possible = false;  // the order it saw is kept: exact if the stream still has it
  };
  std::optional<Frame> join_now(std::string& why_not) const;
  ResumePoint resume_framed(int64_t epoch, int64_t position, int64_t joined_at) const;
  // Whether the stream can still give sample `position` of epoch `epoch` on:
  // not served yet, or (then `replay`) held.
  bool servable(int64_t epoch, int64_t position, bool own_end, std::optional<Replay>& replay,
                const std::function<bool(const Replay&)>& held) const;

  struct Ended {
    int64_t epoch, samples, batches;
  };
  JoinPlanOptions options_;
  int64_t epoch_ = -1;  // in progress
  int64_t batches_ = 0;
  int64_t samples_ = 0;
  int64_t next_epoch_ = 0;
  int64_t loader_batch_samples_ = 0;  // an epoch's first batch's: every batch's but the last
  std::map<uint64_t, int64_t> joined_at_;  // members present that joined mid-epoch
  std::vector<int64_t> steered_;           // the join positions the last epoch begun was ordered by
  int64_t steered_epoch_ = -1;
  // ... and of the epoch before it (a resume into the epoch that ended last).
  std::map<int64_t, std::vector<int64_t>> steered_by_epoch_;
  std::optional<std::vector<int64_t>> last_order_;
  std::optional<Ended> last_ended_;  // the epoch that ended last
};

}  // namespace batchcast
