// A consumer's life across the trainer's epochs, in one state: what begin()
// and next() do is decided by which state it is in (std::visit, every state
// handled), and only the transitions below change it. No I/O, no torch: the
// Consumer does the reading and the rebatching, tests drive this directly.
// (The protocol's side — joining, leaving, unmapping — is the Session's.)
//
//   Grouping   a rank of a consumer group before its group is complete
//              (GroupReady: -> Between)
//   Between    no epoch under way: begin() starts the next
//   InEpoch    handing out the current epoch; `arrived`: a loader batch of
//              it has come (the producer serves it)
//   Ended      the producer's stream ended (Finished). `past_end`: the
//              current epoch is one it never serves (next() says why: an
//              error, or an empty epoch where asked for); otherwise the
//              current epoch was cut short and already ended (ProducerLost).
//              Every epoch begun later is past the end.
//   Broken     the consumer's group broke: every call raises that error
//   Closed     close(): epochs are empty (past the end, if the stream's end
//              was known)
//
// Beside the state, why epochs end, as the producer said it (the consumer's
// errors quote it): how the stream ended, the loader's failure, a group
// broken from a later epoch on, an epoch the trainer left early.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <variant>

#include "batchcast/protocol/message.h"

namespace batchcast {

class Lifecycle {
 public:
  struct Grouping {};
  struct Between {};
  struct InEpoch {
    bool arrived = false;
  };
  struct Ended {
    bool past_end = true;
  };
  struct Broken {
    std::exception_ptr error;
  };
  struct Closed {};
  using State = std::variant<Grouping, Between, InEpoch, Ended, Broken, Closed>;

  // A consumer of a group whose group is not complete yet starts Grouping.
  explicit Lifecycle(bool grouping);

  const State& state() const { return state_; }
  static const char* name(const State& state);
  bool in_epoch() const { return std::holds_alternative<InEpoch>(state_); }
  bool grouping() const { return std::holds_alternative<Grouping>(state_); }
  // A loader batch of the current epoch has come.
  bool arrived() const;
  // The producer serves no more epochs to it (or it closed).
  bool finished() const;

  // Why epochs end (none: not said).
  struct Left {  // an epoch the trainer left unfinished, for the error that may follow
    int64_t epoch = 0;
    int64_t batches = 0;
  };
  const std::optional<protocol::Finished>& stream_end() const { return end_; }
  const std::optional<protocol::LoaderFailed>& loader_failure() const { return failed_; }
  const std::optional<protocol::GroupBroken>& group_broken() const { return broken_; }
  const std::optional<Left>& left() const { return left_; }

  // Transitions; one a state cannot take is a std::logic_error naming both.
  void group_ready();  // Grouping -> Between
  // The next epoch begins: Between -> InEpoch; Ended -> Ended (past its end);
  // Closed -> Ended past the end if the stream's end is known, else Closed.
  void begin(bool stream_end_known);
  void begin() { begin(end_.has_value()); }
  void batch_arrived();  // InEpoch
  void epoch_ended();    // InEpoch -> Between
  // The loader failed: the epoch under way (if any) ends; Grouping stays.
  // Every later epoch raises `failed`.
  void loader_failed(protocol::LoaderFailed failed = {});
  // The producer's stream ended (`end`). `started`: the current epoch had
  // begun to arrive (it is cut short); else it is past the end.
  void stream_ended(bool started, protocol::Finished end = {});
  // The group broke from epoch `broken.epoch` on, after the one under way.
  void group_breaks(protocol::GroupBroken broken) { broken_ = std::move(broken); }
  // The trainer left the epoch under way after `batches` batches.
  void left_early(int64_t epoch, int64_t batches) { left_ = Left{epoch, batches}; }
  void broke(std::exception_ptr error);  // any state -> Broken
  void close();  // -> Closed, but Ended and Broken stay what they are

 private:
  [[noreturn]] void refuse(const char* event) const;
  State state_;
  std::optional<protocol::Finished> end_;
  std::optional<protocol::LoaderFailed> failed_;
  std::optional<protocol::GroupBroken> broken_;
  std::optional<Left> left_;
};

}  // namespace batchcast
