// A consumer's rules as a state machine without I/O (no ZeroMQ, no mapping,
// no threads, no clock of its own), the counterpart of the producer's
// Membership. It takes decoded events — a message from the producer, the ring
// mapped or not, a batch taken, a slot no longer referenced, the producer's
// process gone — and returns what to do: what to send, the ring to map or
// unmap, whether a waiting trainer has news. The Channel around it keeps the
// socket, the mapping, the watchdog and the lock; tests drive this class
// directly.
//
// Phases, in order (never backwards):
//   Joining  Hello sent, no Welcome yet.
//   Member   receives announcements.
//   Leaving  takes no more: the consumer closed (Bye), failed, was evicted,
//            or the producer finished. Slots still referenced stay held.
//   Drained  leaving, and nothing of the ring is referenced, queued or in
//            flight: the mapping may be closed.
//   Unmapped the mapping is closed and the producer told (Unmapped).
// Errors (producer lost, evicted, refused, a mapping that failed) are kept as
// the first exception and rethrown unchanged by take().
//
// The rules:
// - Every message is validated: a kind a consumer never receives, a second
//   Welcome or mailbox, anything but Refuse before the Welcome, an announcement before
//   the ring is mapped, a tensor outside the ring or a slot event the ring
//   does not have is dropped and counted, never trusted.
// - What arrives after the consumer started leaving is not handed out; an
//   announcement among it is released at once (it is not ours to keep).
// - A slot is held from the producer from its announcement until it is
//   released: queued, taken, referenced by tensors, or waiting for the GPU to
//   pass it (releasing: still held, but kept by nothing here).
// - The producer's process gone for longer than a grace period (messages sent
//   just before it exited may still be in flight) fails the session with
//   ProducerLost.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "batchcast/protocol/message.h"

namespace batchcast {

// What the session hands the trainer: the messages of the producer's stream
// (the rest it handles itself). A kind added here does not compile until the
// consumer handles it (Consumer::await_group, Consumer::take_next).
using StreamMessage = std::variant<protocol::Announcement, protocol::EpochEnd, protocol::LoaderFailed,
                                   protocol::Finished, protocol::GroupReady, protocol::GroupBroken>;

struct SessionOptions {
  std::string name;       // the producer's, for messages
  protocol::Hello hello;  // what this consumer says first (its pid, group, resume)
};

// What announcements are checked against once the ring is mapped.
struct RingExtent {
  uint64_t bytes = 0;
  int32_t events = 0;  // slot events an announcement may name (0: host memory, none)
};

// What one event asks of the Channel, done in this order.
struct SessionActions {
  // Map this ring now, then report on_mapped() or on_failed().
  std::optional<protocol::Ring> map;
  // Open this mailbox now (every later message comes through it, and the
  // releases go back through it); on failure report on_failed().
  std::optional<protocol::MailboxReady> mailbox;
  // Close the mapping now (nothing references it), then report on_unmapped().
  bool unmap = false;
  // To the producer, in order, after the mapping is done.
  std::vector<protocol::Message> sends;
  // take() has something new, or the session failed: wake a waiting trainer.
  bool news = false;

  void merge(SessionActions other);
};

class Session {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Phase { Joining, Member, Leaving, Drained, Unmapped };
  // How long the producer's process may be gone before the session fails.
  static constexpr std::chrono::milliseconds kProducerGrace{500};

  explicit Session(SessionOptions options);

  // The Hello.
  SessionActions start();

  // A message from the producer (raw bytes, validated here).
  SessionActions on_message(const void* data, std::size_t size);
  // Something that is not even one frame.
  SessionActions on_malformed();
  // The ring asked for by `map` is mapped here.
  SessionActions on_mapped(RingExtent ring);
  // An error to give the trainer (mapping failed, a thread failed): the
  // first one wins, and the session leaves.
  SessionActions on_failed(std::exception_ptr error);
  // The mapping asked to close by `unmap` is closed.
  void on_unmapped();

  // The trainer: the next Announcement, EpochEnd, LoaderFailed, Finished,
  // GroupReady or GroupBroken, in order, or nothing yet. Throws the first error.
  std::optional<StreamMessage> take();
  // A taken announcement's slot is now referenced by tensors.
  void hold(uint64_t seq);
  // A taken announcement that will not be used: its slot goes back at once.
  SessionActions release_now(uint64_t seq);
  // The last reference to `seq` died; the slot may still wait for the GPU.
  void unreferenced(uint64_t seq);
  // The slot may go back to the producer.
  SessionActions on_released(uint64_t seq);
  // The consumer closed: say Bye, take nothing more, release what is queued.
  SessionActions leave();

  // Periodically: the producer's liveness (alive(pid)), and whether the
  // mapping can close (`releases_in_flight`: releases still waiting for the GPU).
  SessionActions on_tick(const std::function<bool(int64_t pid)>& alive, Clock::time_point now,
                         int64_t releases_in_flight);
  // The channel closes: the mapping goes, and the producer is told unless it was.
  SessionActions close();

  Phase phase() const { return phase_; }
  const std::optional<protocol::Welcome>& welcome() const { return welcome_; }
  // Finished, failed, or never answered: last words need not wait to be heard.
  bool producer_gone() const { return finished_ || error_ != nullptr || !welcome_; }
  bool failed() const { return error_ != nullptr; }
  // Throws the first error, if any.
  void rethrow_if_failed() const {
    if (error_) std::rethrow_exception(error_);
  }
  int64_t received() const { return received_; }
  int64_t dropped() const { return dropped_; }
  // Slots referenced by tensors (not those only waiting for the GPU to pass
  // them: kept by nothing, they never count against the pin budget).
  const std::set<uint64_t>& referenced() const { return referenced_; }
  // Slots held from the producer by tensors or the GPU.
  int64_t slots_held() const { return static_cast<int64_t>(referenced_.size() + releasing_.size()); }

 private:
  void accept(protocol::Message& m, SessionActions& out);
  void queue_group_message(StreamMessage m);
  void start_leaving(SessionActions& out);
  void fail(std::exception_ptr error, SessionActions& out);

  SessionOptions options_;
  Phase phase_ = Phase::Joining;
  std::optional<protocol::Welcome> welcome_;
  std::optional<RingExtent> ring_;  // mapped
  bool mailbox_given_ = false;
  std::deque<StreamMessage> inbox_;
  std::set<uint64_t> referenced_;
  std::set<uint64_t> releasing_;
  int64_t taken_ = 0;  // announcements handed out by take(), not yet held or released
  std::exception_ptr error_;
  bool finished_ = false;  // the producer said Finished
  int64_t received_ = 0;
  int64_t dropped_ = 0;
  std::optional<Clock::time_point> producer_gone_since_;
};

}  // namespace batchcast
