// The mailbox's one ordering rule, both sides of it, without I/O: every
// message the producer sends a consumer after Welcome is handled by the
// consumer in the order it was sent. The mailbox carries them; a message too
// large for it goes over the socket instead, and a Marker in the mailbox holds
// its place.
//
// - Producer side, `Outbox`: what waits for room in the mailbox, in order. A
//   message too large for it is sent over the socket at once (enqueue says
//   so) and its marker takes its place in the queue.
// - Consumer side, `Inbox`: reads the mailbox in order; at a marker it stops
//   until the socket has brought that message (`spilled`), handles it, and
//   goes on. The socket carries only such messages once the mailbox is open,
//   and in the order they were sent, so the k-th marker is the k-th of them.
//
// The producer's Link and the consumer's Channel do the I/O these ask for.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "batchcast/mailbox/frame_queue.h"

namespace batchcast {

class Outbox {
 public:
  // Queues a message to the consumer. True: it is too large for the mailbox
  // (over `largest_frame` bytes): send it over the socket now; its marker is
  // queued in its place.
  bool enqueue(std::shared_ptr<const std::string> message, uint64_t largest_frame) {
    const bool over_socket = message->size() > largest_frame;
    queue_.push_back(over_socket ? nullptr : std::move(message));
    return over_socket;
  }
  // Posts what is queued, oldest first, until the mailbox is full:
  // post(message) and post_marker() return the mailbox's Push.
  template <typename Post, typename PostMarker>
  void flush(Post&& post, PostMarker&& post_marker) {
    while (!queue_.empty()) {
      const auto& next = queue_.front();
      const FrameQueue::Push r = next ? post(*next) : post_marker();
      if (r != FrameQueue::Push::Done) return;  // Full: the consumer rings once it made room
      queue_.pop_front();
    }
  }
  bool empty() const { return queue_.empty(); }

 private:
  std::deque<std::shared_ptr<const std::string>> queue_;  // null: a marker
};

class Inbox {
 public:
  // A message that came over the socket once the mailbox was open.
  void spilled(std::string message) { spilled_.push_back(std::move(message)); }
  // A marker was met whose message has not been handled yet: the socket has
  // something for this consumer.
  bool expects_socket() const { return markers_ > 0; }
  // Handles what can be handled in order: receive(frame) takes the mailbox's
  // next record (FrameQueue::Pop), handle(message) takes a message. Stops at
  // an empty mailbox, or at a marker whose message the socket has not brought
  // yet. Returns whether it took any record from the mailbox (the producer
  // may wait for that room).
  template <typename Receive, typename Handle>
  bool drain(Receive&& receive, Handle&& handle) {
    bool took = false;
    while (true) {
      if (markers_ > 0) {
        if (spilled_.empty()) break;  // still on its way over the socket
        std::string m = std::move(spilled_.front());
        spilled_.pop_front();
        markers_ -= 1;
        handle(m);
        continue;
      }
      const FrameQueue::Pop r = receive(frame_);
      if (r == FrameQueue::Pop::Empty) break;
      took = true;
      if (r == FrameQueue::Pop::Marker) {
        markers_ += 1;
      } else {
        handle(frame_);
      }
    }
    return took;
  }

 private:
  std::deque<std::string> spilled_;  // came over the socket, waiting for their markers
  int64_t markers_ = 0;              // markers met whose message has not been handled
  std::string frame_;                // the record being read
};

}  // namespace batchcast
