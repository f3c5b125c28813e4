// A consumer's connection to its producer: one DEALER socket, the mailbox
// (mailbox/mailbox.h: announcements in, releases out, through shared memory),
// the ring mapped once, the messages waiting to be taken, and the slots this
// process still references. Tensors keep the channel (and so the mapping) alive through
// their release tokens.
//
// Threads. The trainer's thread does the work of a batch itself: take()
// reads the mailbox and a tensor's deleter puts its Release there, so the
// common case (a batch already announced) involves no hand-off between
// threads and no system call; take() sleeps only when nothing is there. A
// watchdog thread does what nobody else is there to do while the trainer is
// away: take in messages, notice the producer's process is gone, let go of
// the ring once nothing references it. While this consumer is a member and
// the producer's process can be watched (a pidfd: readable once it exits),
// the watchdog sleeps until that happens or for a second at most; otherwise
// (joining, leaving, draining, the producer gone) it wakes every 100 ms.
//
// The consumer's rules (phases, validation, which slots are held) are the
// Session's; the channel does what it asks: sends, maps, unmaps, wakes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "batchcast/common/endpoint.h"
#include "batchcast/common/fork.h"
#include "batchcast/consumer/mapped_ring.h"
#include "batchcast/mailbox/mailbox.h"
#include "batchcast/mailbox/ordering.h"
#include "batchcast/consumer/rebatcher.h"
#include "batchcast/consumer/session.h"
#include "batchcast/protocol/message.h"

namespace batchcast {

struct ChannelOptions {
  std::string name;      // the producer's
  std::string endpoint;  // where it listens
  bool catch_up = false;
  bool join_now = false;
  int64_t batch_size = 0;  // told to the producer, for its status (0: the loader's)
  std::string group;       // a consumer group's name, this rank and the world size (0: none)
  int32_t rank = 0;
  int32_t world_size = 0;
  int64_t resume_epoch = -1;  // >= 0: continue that epoch at resume_position
  int64_t resume_position = 0;
  int64_t resume_joined_at = 0;
  uint64_t resume_run = 0;
  MappedRing::ReleaseAfter release_after = MappedRing::ReleaseAfter::Stream;
  // Called about every 100 ms while take() or join() blocks; may throw.
  std::function<void()> interrupt;
};

struct ChannelStats {
  int64_t received = 0;         // announcements received
  int64_t dropped_messages = 0;  // malformed messages and mailbox records
  int64_t slots_held = 0;       // slots referenced by this process
  bool mailbox = false;         // batches come through the mailbox
  int64_t ipc_memory_opens = 0;  // over the channel's life
  int64_t ipc_event_opens = 0;
  uint64_t ring_address = 0;    // where the ring is mapped here (0: not, or no longer, mapped)
  uint64_t ring_bytes = 0;
};

class Channel final : public ReleaseSink, public std::enable_shared_from_this<Channel> {
 public:
  using Phase = Session::Phase;

  // Connects and says Hello.
  static std::shared_ptr<Channel> connect(ChannelOptions options);
  ~Channel() override;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Waits up to `timeout` seconds for Welcome (the ring is mapped by then if
  // it exists). Throws ProducerLost on timeout, Refused, or whatever mapping
  // the ring threw (CudaError, SystemError).
  protocol::Welcome join(double timeout);

  // The next Announcement, EpochEnd, LoaderFailed, Finished, GroupReady or
  // GroupBroken, in order; blocks until there is one, calling `waiting`
  // with the seconds waited so far about every 100 ms. Throws the channel's
  // first error.
  StreamMessage take(const std::function<void(double)>& waiting = {});

  // Ownership of a taken announcement's slot: the token's last owner releases it.
  std::shared_ptr<ReleaseToken> hold(uint64_t seq);
  // A taken announcement that will not be used: its slot goes back at once.
  void release_now(uint64_t seq);
  // The mapped ring; valid while a token of it is alive.
  MappedRing& ring();

  // The consumer closed: send Bye, take nothing more, release what is queued.
  void leave();

  // ReleaseSink: the last token over `seq` died (any thread). Never throws.
  void release(uint64_t seq, const std::optional<cuda::StreamRef>& stream) noexcept override;

  Phase phase() const;
  ChannelStats stats() const;
  // Slots referenced by tokens right now (not those only waiting for the GPU
  // to pass them: those are not kept, so they never count against the pin budget).
  std::set<uint64_t> referenced() const;

 private:
  explicit Channel(ChannelOptions options);
  void watch();                         // the watchdog thread
  // Takes in what the mailbox (and the socket, if asked or expected) has;
  // sends what is queued.
  void pump(bool socket);
  void read_socket(bool look);          // under socket_mu_
  void read_mailbox();                  // under socket_mu_
  void on_frame(const std::string& frame);  // under socket_mu_: a message, in the producer's order
  void act(SessionActions actions);     // under mu_: maps, queues sends, wakes (never unmaps)
  void tick();                          // the session's periodic rules; unmaps once drained
  std::chrono::milliseconds watch_period() const;  // under mu_: how long the watchdog may sleep
  void open_ring(const protocol::Ring& ring);  // under mu_
  void released(uint64_t seq) noexcept;  // the slot may go back to the producer
  void flush() noexcept;                // takes socket_mu_, sends what is queued
  void send_outbox();                   // under socket_mu_
  void interrupt_check(std::chrono::steady_clock::time_point& last);

  ChannelOptions options_;

  // Lock order: socket_mu_ before mu_. Neither is held while a token dies
  // or the mapping closes.
  std::mutex socket_mu_;
  zmq::context_t context_;
  zmq::socket_t dealer_;
  int socket_fd_ = -1;  // ZMQ_FD: readable when the socket may have news
  Wakeup wakeup_;       // wakes a trainer blocked in take()
  // Under socket_mu_ (set once, also under mu_): the mailbox, and its order
  // with the messages too large for it, which come over the socket.
  std::unique_ptr<Mailbox> mailbox_;
  Inbox inbox_;
  // Under socket_mu_: Bye went out. Releases follow it on the socket from
  // then on: through the mailbox they would reach the producer before the
  // Bye, and free its ring for batches announced to a consumer that is gone
  // (a producer serving for ever would load on for nobody).
  bool said_bye_ = false;
  std::atomic<int64_t> mailbox_dropped_{0};
  Wakeup watch_wakeup_;

  mutable std::mutex mu_;
  Session session_;
  std::unique_ptr<MappedRing> ring_;
  std::vector<protocol::Message> outbox_;  // to the producer, sent by whoever holds the socket next
  Fd producer_watch_;            // the producer's pidfd, once welcomed (invalid: none to be had)
  bool producer_watched_ = false;  // tried to get it
  bool producer_exited_ = false;   // it was readable: the process is gone
  int64_t memory_opens_ = 0;  // CUDA IPC handles opened, over the channel's life
  int64_t event_opens_ = 0;
  bool quit_ = false;

  std::atomic<bool> trainer_inside_{false};  // a trainer is in take() or join()
  std::thread watchdog_;
  Birthplace born_;  // a forked child's copy touches nothing of the parent's
};

}  // namespace batchcast
