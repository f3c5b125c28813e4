// A consumer's mailbox: the per-batch traffic between a producer and one
// consumer, through memory they share, so that a batch announced and a slot
// released cost no system call and no thread hand-off in the common case.
// ZeroMQ keeps the control plane (join, welcome, leave, status, the CUDA IPC
// handles in Welcome and RingReady).
//
// One memfd per consumer, created by the producer beside the ring and
// reopened by the consumer through /proc/<producer pid>/fd (as a host ring
// is), holding two FrameQueues (frame_queue.h):
//   to the consumer   every message the producer sends it after Welcome, in
//                     order (one too large for the queue goes over the socket,
//                     a Marker holding its place);
//   to the producer   the consumer's Release messages (a release that does
//                     not fit goes over the socket: releases commute).
// The producer reads a consumer's releases before any socket message from it,
// so Bye and Unmapped never overtake a release sent before them.
//
// Waking. A side that is about to sleep says so in a flag beside the queues,
// then looks at its queue once more; the other side, after publishing,
// looks at the flag and only then writes a byte to the sleeper's bell (a
// pipe: poll()-able beside the socket). Both steps are sequentially
// consistent, so either the sleeper sees the frame or the writer sees the
// flag: no wake-up is lost, and a side that is awake is never rung. The
// producer asks to be rung only for what it waits on: a release while a
// publish waits for ring space, room while a message waits for it in the
// queue; otherwise releases wait in the queue until it next looks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "batchcast/common/fd.h"
#include "batchcast/mailbox/frame_queue.h"
#include "batchcast/protocol/message.h"

namespace batchcast {

class Mailbox {
 public:
  static constexpr uint64_t kToConsumerBytes = 1u << 20;
  static constexpr uint64_t kToProducerBytes = 256u << 10;

  // Producer side: a new mailbox for consumer `owner` (its id); `producer_bell`
  // is the pipe (an end of it that stays open in this process) a consumer
  // writes to wake the producer.
  static std::unique_ptr<Mailbox> create(const std::string& label, int producer_bell, uint64_t owner);
  // What the consumer is told (MailboxReady).
  protocol::MailboxReady description() const;
  // Consumer side: opens the mailbox `ready` describes, in process
  // `producer_pid`, for consumer `owner`. Throws SystemError (cannot open it)
  // or MalformedMessage (not a mailbox, or another consumer's: the producer
  // reused the descriptor's number for another's mailbox meanwhile).
  static std::unique_ptr<Mailbox> open(const protocol::MailboxReady& ready, long producer_pid, uint64_t owner);

  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // ---- producer side
  // A message to the consumer (rings it if it sleeps). TooLarge: send it
  // another way, after post_marker().
  FrameQueue::Push post(const std::string& frame);
  FrameQueue::Push post_marker();
  // The next frame the consumer sent, or Empty.
  FrameQueue::Pop collect(std::string& out);
  // Whether the consumer's trainer sleeps waiting for a message (it said so
  // before sleeping; a message posted since wakes it).
  bool consumer_waits() const;
  // Whether the producer wants to be rung when the consumer releases a slot
  // (a publish waits for space), or when it makes room in the queue to it (a
  // message waits for room); true returned: a release is there already (do
  // not sleep).
  bool producer_sleeps(bool for_releases, bool for_room);

  // ---- consumer side
  FrameQueue::Pop receive(std::string& out);
  // A frame to the producer (rings it if it asked).
  FrameQueue::Push send(const std::string& frame);
  // After taking frames: the producer may be waiting for the room.
  void made_room();
  // About to sleep: false if a frame is there already (do not sleep).
  bool consumer_sleeps();
  // Woke up: no longer asleep; empties the bell.
  void consumer_woke();
  // Readable when the producer rings.
  int consumer_bell() const { return consumer_bell_.get(); }

  // Reads a (non-blocking) bell empty.
  static void empty_bell(int bell);

  int64_t dropped() const { return to_consumer_.dropped() + to_producer_.dropped(); }

 private:
  struct Shared;
  Mailbox() = default;
  void attach(uint64_t to_consumer, uint64_t to_producer);
  static constexpr uint32_t kForReleases = 1;
  static constexpr uint32_t kForRoom = 2;
  static void ring(int bell);
  void ring_producer(uint32_t reason);
  FrameQueue::Push rang_consumer(FrameQueue::Push pushed);

  Fd memory_;
  Mapping mapping_;
  Shared* shared_ = nullptr;
  FrameQueue to_consumer_;
  FrameQueue to_producer_;
  // Producer: the consumer's bell, both ends (the read end stays open so that
  // a write never meets a closed pipe); consumer: its bell's read side, and
  // the producer's bell opened read-write for the same reason.
  Fd consumer_bell_;
  Fd consumer_bell_write_;
  Fd producer_bell_;
  int producer_bell_number_ = -1;  // producer side: the fd the consumer reopens
};

}  // namespace batchcast
