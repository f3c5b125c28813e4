#include "batchcast/consumer/consumer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "batchcast/common/endpoint.h"
#include "batchcast/common/error.h"
#include "batchcast/ring/ring.h"

namespace batchcast {

using Clock = std::chrono::steady_clock;

// The consumer's connection: a DEALER socket served by one I/O thread, the
// mapped ring, and the queue of releases coming from tensor deleters on any
// thread. Tensors keep it (and so the mapping) alive through their tokens.
class Channel : public ReleaseSink {
 public:
  Channel(std::string name, std::string endpoint, uint32_t flags)
      : name_(std::move(name)), context_(1), dealer_(context_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::linger, 1000);
    dealer_.set(zmq::sockopt::sndhwm, 0);
    dealer_.set(zmq::sockopt::rcvhwm, 0);
    dealer_.connect(endpoint);
    std::string hello = protocol::encode(protocol::Hello{::getpid(), flags});
    dealer_.send(zmq::buffer(hello), zmq::send_flags::dontwait);
    io_ = std::thread([this] { serve(); });
  }

  ~Channel() override { shutdown(); }

  void release(uint64_t seq) override {
    std::lock_guard<std::mutex> lock(mu_);
    held_ -= 1;
    if (closed_) return;
    releases_.push_back(seq);
    wakeup_.notify();
  }

  std::shared_ptr<ReleaseToken> hold(uint64_t seq, std::shared_ptr<Channel> self) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ += 1;
    return std::make_shared<ReleaseToken>(seq, std::move(self));
  }

  // Waits for Welcome. Throws ProducerLost on timeout, Refused when refused.
  protocol::Welcome await_welcome(double timeout, const std::string& endpoint) {
    std::unique_lock<std::mutex> lock(mu_);
    bool answered = changed_.wait_for(lock, std::chrono::duration<double>(timeout),
                                      [&] { return welcome_ || !refusal_.empty() || !lost_.empty(); });
    if (!refusal_.empty()) throw Refused(refusal_);
    if (!lost_.empty()) throw ProducerLost(lost_);
    if (!answered) {
      throw ProducerLost("no batchcast producer named '" + name_ + "' answered within " +
                         std::to_string(static_cast<int>(timeout)) + " s (at " + endpoint +
                         "); start the producer first, or pass a longer timeout");
    }
    return *welcome_;
  }

  // The next message for the caller. Throws ProducerLost when the producer is gone.
  protocol::Message wait_message() {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return !inbox_.empty() || !lost_.empty() || !evicted_.empty(); };
    auto since = Clock::now();
    while (!changed_.wait_for(lock, std::chrono::seconds(1), ready)) {
      // Holding (nearly) the whole ring stalls the producer, and so this wait.
      if (!warned_ && welcome_ && held_ >= welcome_->slots - 1 &&
          Clock::now() - since > std::chrono::seconds(5)) {
        warned_ = true;
        std::fprintf(stderr,
                     "batchcast: consumer of '%s' has waited 5 s for a batch while this process "
                     "still references %lld batches of the producer's ring (it holds %lld); the "
                     "producer cannot reuse them until they are freed. Keep .clone()s of batches "
                     "you store, not the batches themselves.\n",
                     name_.c_str(), static_cast<long long>(held_),
                     static_cast<long long>(welcome_->slots));
      }
    }
    if (!evicted_.empty()) throw Evicted(evicted_);
    if (!lost_.empty()) throw ProducerLost(lost_);
    protocol::Message m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }

  const std::byte* ring_base() {
    std::lock_guard<std::mutex> lock(mu_);
    return region_ ? region_->data() : nullptr;
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    wakeup_.notify();
    if (io_.joinable()) io_.join();
    dealer_.close();
    context_.close();
  }

  int64_t dropped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_;
  }
  int64_t held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  int64_t received() const {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }

 private:
  void serve() {
    zmq::pollitem_t items[] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, wakeup_.fd(), ZMQ_POLLIN, 0}};
    std::optional<Clock::time_point> dead_since;
    while (true) {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
      if (items[1].revents & ZMQ_POLLIN) wakeup_.drain();
      receive_all();
      std::vector<uint64_t> releases;
      bool closing;
      int64_t producer_pid;
      {
        std::lock_guard<std::mutex> lock(mu_);
        releases.swap(releases_);
        closing = closed_;
        producer_pid = welcome_ ? welcome_->producer_pid : 0;
      }
      if (!releases.empty()) send(protocol::Release{std::move(releases)});
      if (closing) {
        send(protocol::Bye{});
        return;
      }
      // The producer's process is the liveness signal. Messages it sent just
      // before exiting may still be in flight: give them a moment.
      if (producer_pid > 0 && !finished_ && !process_alive(producer_pid)) {
        if (!dead_since) dead_since = Clock::now();
        if (Clock::now() - *dead_since > std::chrono::milliseconds(500)) {
          std::lock_guard<std::mutex> lock(mu_);
          if (lost_.empty()) {
            lost_ = "batchcast producer '" + name_ + "' (pid " + std::to_string(producer_pid) +
                    ") exited or was killed before finishing; restart it and this consumer";
          }
          changed_.notify_all();
        }
      }
    }
  }

  void send(const protocol::Message& m) {
    std::string bytes = protocol::encode(m);
    try {
      dealer_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
  }

  void receive_all() {
    while (true) {
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(dealer_, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (parts.size() != 1) {
        dropped_ += 1;
        continue;
      }
      try {
        accept(protocol::decode(parts[0].data(), parts[0].size()));
      } catch (const MalformedMessage&) {
        dropped_ += 1;
      } catch (const SystemError& e) {
        lost_ = std::string("cannot map the ring of producer '") + name_ + "': " + e.what();
      }
      changed_.notify_all();
    }
  }

  // Under mu_. Handles connection-level messages here; queues the rest.
  void accept(protocol::Message m) {
    if (auto* w = std::get_if<protocol::Welcome>(&m)) {
      if (welcome_) throw MalformedMessage("second welcome");
      if (w->ring_fd >= 0) region_.emplace(SharedRegion::open(w->producer_pid, w->ring_fd, w->ring_bytes));
      welcome_ = *w;
    } else if (auto* e = std::get_if<protocol::Evicted>(&m)) {
      if (!welcome_) throw MalformedMessage("eviction before welcome");
      evicted_ = e->reason;
      finished_ = true;  // no liveness checks any more: we are not a member
    } else if (auto* r = std::get_if<protocol::Refuse>(&m)) {
      refusal_ = r->reason.empty() ? "the producer refused this consumer" : r->reason;
    } else if (auto* ring = std::get_if<protocol::RingReady>(&m)) {
      if (!welcome_ || region_) throw MalformedMessage("unexpected ring");
      region_.emplace(SharedRegion::open(welcome_->producer_pid, ring->ring_fd, ring->ring_bytes));
    } else if (auto* a = std::get_if<protocol::Announcement>(&m)) {
      if (!region_) throw MalformedMessage("announcement before the ring");
      for (const auto& leaf : a->leaves) {
        if (const auto* t = std::get_if<protocol::TensorLeaf>(&leaf)) {
          if (t->offset > region_->size() || t->nbytes() > region_->size() - t->offset) {
            throw MalformedMessage("tensor outside the ring");
          }
        }
      }
      received_ += 1;
      inbox_.push_back(std::move(m));
    } else if (std::holds_alternative<protocol::Heartbeat>(m)) {
    } else if (std::holds_alternative<protocol::EpochEnd>(m) ||
               std::holds_alternative<protocol::LoaderFailed>(m) ||
               std::holds_alternative<protocol::Finished>(m)) {
      if (!welcome_) throw MalformedMessage("message before welcome");
      if (std::holds_alternative<protocol::Finished>(m)) finished_ = true;
      inbox_.push_back(std::move(m));
    } else {
      throw MalformedMessage(std::string("unexpected ") + protocol::kind_name(m));
    }
  }

  std::string name_;
  zmq::context_t context_;
  zmq::socket_t dealer_;
  Wakeup wakeup_;
  std::thread io_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::optional<protocol::Welcome> welcome_;
  std::optional<SharedRegion> region_;
  std::deque<protocol::Message> inbox_;
  std::vector<uint64_t> releases_;
  std::string refusal_;
  std::string lost_;
  std::string evicted_;
  bool closed_ = false;
  bool warned_ = false;
  std::atomic<bool> finished_{false};
  int64_t dropped_ = 0;
  int64_t held_ = 0;
  int64_t received_ = 0;
};

Consumer::Consumer(ConsumerOptions options)
    : options_(std::move(options)), rebatcher_(options_.batch_size, options_.drop_last) {
  validate_name(options_.name);
  if (options_.timeout <= 0) throw InvalidArgument("timeout must be positive (seconds)");
  std::string endpoint = endpoint_for(runtime_dir(options_.runtime_dir), options_.name);
  channel_ = std::make_shared<Channel>(options_.name, endpoint,
                                       options_.catch_up ? protocol::Hello::kCatchUp : 0u);
  try {
    protocol::Welcome w = channel_->await_welcome(options_.timeout, endpoint);
    next_epoch_ = w.first_epoch;
    // The ring has room for slots+1 loader batches; holding at most this many
    // pending (plus the batch the caller holds) always leaves the producer one.
    rebatcher_.set_max_pending(std::max<int64_t>(0, (w.slots - 2) / 2));
    samples_per_epoch_ = w.samples_per_epoch;
    id_ = w.consumer_id;
  } catch (...) {
    channel_->shutdown();
    throw;
  }
}

Consumer::~Consumer() { close(); }

void Consumer::close() {
  rebatcher_.clear();
  if (channel_) channel_->shutdown();
}

int64_t Consumer::samples_per_epoch() const { return samples_per_epoch_; }

int64_t Consumer::batches_per_epoch() const {
  if (samples_per_epoch_ < 0) return -1;
  int64_t b = options_.batch_size;
  return options_.drop_last ? samples_per_epoch_ / b : (samples_per_epoch_ + b - 1) / b;
}

int64_t Consumer::begin_epoch() {
  while (in_epoch_) {
    (void)next();  // drain what is left of an epoch the caller left early
  }
  rebatcher_.clear();
  mid_epoch_ = false;
  epoch_ = next_epoch_++;
  in_epoch_ = !finished_;
  return epoch_;
}

std::optional<Batch> Consumer::next() {
  if (!in_epoch_) return std::nullopt;
  while (true) {
    if (auto b = rebatcher_.pop()) {
      batches_ += 1;
      samples_ += b->samples;
      return b;
    }
    protocol::Message m = channel_->wait_message();
    if (auto* a = std::get_if<protocol::Announcement>(&m)) {
      auto token = channel_->hold(a->seq, channel_);
      if (a->epoch != epoch_) continue;  // not ours: the token releases it at once
      mid_epoch_ = true;
      rebatcher_.push(LoaderBatch{std::move(*a), channel_->ring_base(), std::move(token), {}});
    } else if (auto* end = std::get_if<protocol::EpochEnd>(&m)) {
      if (end->epoch != epoch_) continue;
      samples_per_epoch_ = end->samples;
      in_epoch_ = false;
      auto rest = rebatcher_.flush();
      if (rest) {
        batches_ += 1;
        samples_ += rest->samples;
      }
      return rest;
    } else if (auto* failed = std::get_if<protocol::LoaderFailed>(&m)) {
      in_epoch_ = false;
      rebatcher_.clear();
      throw LoaderError("the loader of batchcast producer '" + options_.name +
                        "' raised: " + failed->message);
    } else if (std::holds_alternative<protocol::Finished>(m)) {
      bool started = rebatcher_.buffered() > 0 || mid_epoch_;
      in_epoch_ = false;
      finished_ = true;
      rebatcher_.clear();
      if (started) {
        throw ProducerLost("batchcast producer '" + options_.name +
                           "' stopped before the end of epoch " + std::to_string(epoch_));
      }
      return std::nullopt;
    }
  }
}

ConsumerStats Consumer::stats() const {
  ConsumerStats s;
  s.id = id_;
  s.epoch = epoch_;
  s.batches = batches_;
  s.samples = samples_;
  s.loader_batches = channel_->received();
  s.views = rebatcher_.stats().views;
  s.copies = rebatcher_.stats().copies;
  s.spills = rebatcher_.stats().spills;
  s.slots_held = channel_->held();
  s.dropped_messages = channel_->dropped();
  return s;
}

}  // namespace batchcast
