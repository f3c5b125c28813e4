// The producer's I/O thread: it hands the stream to the membership and
// carries what the membership sends to the consumers (their mailboxes for the
// per-batch traffic, the socket for the rest), collects their releases and
// messages, and sweeps for the dead and the stuck every kSweepPeriod.
#include "batchcast/producer/producer.h"

#include <chrono>

#include "batchcast/common/endpoint.h"
#include "batchcast/transport/socket.h"

namespace batchcast {
namespace {

constexpr auto kSweepPeriod = std::chrono::milliseconds(200);

}  // namespace

void Producer::serve() {
  try {
    serve_until_quit();
  } catch (...) {
    // Nothing escapes this thread: the error fails the caller's next call.
    std::lock_guard<std::mutex> lock(mu_);
    io_error_ = std::current_exception();
    if (phase_ == Phase::Serving) phase_ = Phase::Stopping;
    wake_all();
  }
}

void Producer::serve_until_quit() {
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wakeup_.fd(), ZMQ_POLLIN, 0},
                             {nullptr, bell_read_.get(), ZMQ_POLLIN, 0}};
  auto last_sweep = Clock::now();
  std::vector<zmq::message_t> frames;  // [peer routing id, body]
  while (true) {
    const bool sleep = sleep_ready();
    transport::poll(items, 3, sleep ? kSweepPeriod : std::chrono::milliseconds(0));
    if (items[1].revents & ZMQ_POLLIN) wakeup_.drain();
    if (items[2].revents & ZMQ_POLLIN) Mailbox::empty_bell(bell_read_.get());
    collect_releases(nullptr);
    while (transport::try_receive(router_, frames)) {
      Actions actions;
      if (frames.size() == 2) {
        // What the consumer put in its mailbox before this message comes first.
        const std::string peer = frames[0].to_string();
        collect_releases(&peer);
        std::lock_guard<std::mutex> lock(mu_);
        actions = membership_.on_message(peer, frames[1].data(), frames[1].size());
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        actions = membership_.on_malformed();
      }
      apply(std::move(actions));
    }
    while (true) {
      Actions actions;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stream_.empty()) break;
        actions = deliver(stream_.front());
        stream_.pop_front();
      }
      apply(std::move(actions));
    }
    signals_->drained.notify_all();
    if (Clock::now() - last_sweep >= kSweepPeriod) {
      last_sweep = Clock::now();
      Actions actions;
      {
        std::lock_guard<std::mutex> lock(mu_);
        // Slots that just went back may not have reached the waiting
        // publish yet: it is not waiting on anyone until it has tried them.
        // A trainer blocked in take() says so in its mailbox (it sleeps there).
        auto waits = [this](const std::string& peer) {
          auto link = links_.find(peer);
          return link != links_.end() && link->second.mailbox && link->second.mailbox->consumer_waits();
        };
        actions = membership_.on_sweep([](int64_t pid) { return process_alive(pid); },
                                       waiting_for_space_ && !freed_since_sweep_, last_sweep, waits);
        freed_since_sweep_ = false;
        // Releases change what counts as kept (room the ring makes): try again.
        if (waiting_for_space_) signals_->space.notify_all();
      }
      apply(std::move(actions));
    }
    if (quit_io_) return;
  }
}

// Before sleeping: each mailbox is told whether to ring (while a publish
// waits for space, or a message for room in it), then looked at once more.
bool Producer::sleep_ready() {
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting = waiting_for_space_;
  }
  bool sleep = true;
  for (auto& [peer, link] : links_) {
    if (link.mailbox->producer_sleeps(waiting, !link.outbox.empty())) sleep = false;  // releases are there
    if (!link.outbox.empty()) {
      post_pending(link);  // room may have come before the flag was up
      if (link.outbox.empty()) sleep = false;
    }
  }
  return sleep;
}

void Producer::collect_releases(const std::string* only) {
  std::vector<std::pair<std::string, std::string>> frames;  // (peer, frame)
  std::string frame;
  int64_t dropped = 0;
  auto take = [&](const std::string& peer, Link& link) {
    post_pending(link);
    while (true) {
      const auto r = link.mailbox->collect(frame);
      if (r == FrameQueue::Pop::Empty) break;
      // Only releases come this way; anything else is dropped and counted.
      if (r != FrameQueue::Pop::Frame || protocol::peek_kind(frame.data(), frame.size()) != protocol::Kind::Release) {
        dropped += 1;
        continue;
      }
      frames.emplace_back(peer, std::move(frame));
    }
  };
  if (only != nullptr) {
    auto link = links_.find(*only);
    if (link != links_.end()) take(link->first, link->second);
  } else {
    for (auto& [peer, link] : links_) take(peer, link);
  }
  if (frames.empty() && dropped == 0) return;
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (; dropped > 0; --dropped) actions.merge(membership_.on_malformed());
    for (const auto& [peer, f] : frames) actions.merge(membership_.on_message(peer, f.data(), f.size()));
  }
  apply(std::move(actions));
}

void Producer::open_mailbox(const std::string& peer, uint64_t consumer_id) {
  try {
    auto mailbox = Mailbox::create(options_.name, bell_.get(), consumer_id);
    transport::try_send(router_, {peer, protocol::encode(mailbox->description())});
    links_[peer].mailbox = std::move(mailbox);
  } catch (const Error& e) {
    // Out of file descriptors or memory: this consumer gets everything over the socket.
    Report r;
    r.level = Report::Level::Notice;
    r.message = std::string("a consumer gets its batches over the socket (no mailbox: ") + e.what() + ")";
    tell(r);
  }
}

// In order (mailbox/ordering.h): once something waits for room, what
// follows waits behind it; a message too large for the mailbox goes over the
// socket now, its marker in its place.
void Producer::post(Link& link, const std::string& peer, const std::shared_ptr<const std::string>& bytes) {
  if (link.outbox.enqueue(bytes, FrameQueue::largest_frame(Mailbox::kToConsumerBytes))) {
    transport::try_send(router_, {peer, *bytes});  // the consumer holds it until it meets the marker
    over_socket_ += 1;
  }
  post_pending(link);
}

void Producer::post_pending(Link& link) {
  link.outbox.flush([&](const std::string& message) { return link.mailbox->post(message); },
                    [&] { return link.mailbox->post_marker(); });
}

void Producer::forget_links() {
  std::vector<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [peer, link] : links_) {
      if (!membership_.knows(peer)) gone.push_back(peer);
    }
  }
  for (const auto& peer : gone) links_.erase(peer);
}

Actions Producer::deliver(StreamItem& item) {
  return std::visit(
      [&](auto& it) -> Actions {
        using T = std::decay_t<decltype(it)>;
        if constexpr (std::is_same_v<T, EpochBegin>) return membership_.on_epoch_begin(it.epoch);
        if constexpr (std::is_same_v<T, protocol::RingReady>) return membership_.on_ring(it.ring);
        if constexpr (std::is_same_v<T, protocol::Announcement>) {
          return membership_.on_batch(std::move(it), Clock::now());
        }
        if constexpr (std::is_same_v<T, protocol::EpochEnd>) return membership_.on_epoch_end(it);
        if constexpr (std::is_same_v<T, protocol::LoaderFailed>) return membership_.on_loader_failed(it);
        if constexpr (std::is_same_v<T, protocol::Finished>) return membership_.on_finished(it);
      },
      item);
}

void Producer::apply(Actions actions) {
  for (const auto& send : actions.sends) {
    auto link = links_.find(send.peer);
    if (link != links_.end()) {
      post(link->second, send.peer, send.bytes);
      continue;
    }
    // False: the peer's connection is gone; the liveness sweep removes it.
    transport::try_send(router_, {send.peer, *send.bytes});
    if (send.welcome) open_mailbox(send.peer, send.consumer_id);
  }
  if (actions.members_changed) forget_links();
  if (actions.members_changed) signals_->members.notify_all();
  for (const Report& r : actions.reports) tell(r);
  if (!actions.status_requests.empty()) {
    const std::string status = protocol::encode(protocol::Status{status_json()});
    for (const auto& peer : actions.status_requests) transport::try_send(router_, {peer, status});
  }
}

}  // namespace batchcast
