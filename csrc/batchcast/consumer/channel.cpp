#include "batchcast/consumer/channel.h"

#include <unistd.h>

#include "batchcast/common/error.h"
#include "batchcast/common/threads.h"
#include "batchcast/transport/socket.h"

namespace batchcast {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTick = std::chrono::milliseconds(100);
// Messages a producer sent just before exiting may still be in flight.
constexpr auto kProducerGrace = std::chrono::milliseconds(500);

// Marks the trainer as inside take()/join(), where it drains the socket itself.
class Inside {
 public:
  explicit Inside(std::atomic<bool>& flag) : flag_(flag) { flag_ = true; }
  ~Inside() { flag_ = false; }

 private:
  std::atomic<bool>& flag_;
};

}  // namespace

std::shared_ptr<Channel> Channel::connect(ChannelOptions options) {
  std::shared_ptr<Channel> channel(new Channel(std::move(options)));
  channel->watchdog_ = start_background_thread([c = channel.get()] { c->watch(); });
  return channel;
}

Channel::Channel(ChannelOptions options)
    : options_(std::move(options)), context_(1), dealer_(context_, zmq::socket_type::dealer) {
  dealer_.set(zmq::sockopt::linger, 1000);
  dealer_.set(zmq::sockopt::sndhwm, 0);
  dealer_.set(zmq::sockopt::rcvhwm, 0);
  dealer_.connect(options_.endpoint);
  socket_fd_ = dealer_.get(zmq::sockopt::fd);
  protocol::Hello hello;
  hello.pid = ::getpid();
  hello.flags = options_.catch_up ? protocol::Hello::kCatchUp : 0u;
  hello.batch_size = options_.batch_size;
  hello.group = options_.group;
  hello.rank = options_.rank;
  hello.world_size = options_.world_size;
  hello.resume_epoch = options_.resume_epoch;
  hello.resume_position = options_.resume_position;
  send(hello);
}

Channel::~Channel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  watch_wakeup_.notify();
  if (watchdog_.joinable()) watchdog_.join();
  // No token is alive (each keeps the channel): nothing of the ring is used.
  std::unique_ptr<MappedRing> ring;
  bool tell = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ring = std::move(ring_);
    tell = phase_ != Phase::Unmapped;
    phase_ = Phase::Unmapped;
  }
  ring.reset();
  if (tell) send(protocol::Unmapped{});  // the producer forgets us and whatever we never took
  // Give those last words a moment to leave, unless nobody is there to hear.
  bool gone = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone = finished_ || error_ != nullptr || !welcome_;
  }
  dealer_.set(zmq::sockopt::linger, gone ? 0 : 200);
  dealer_.close();
  context_.close();
}

protocol::Welcome Channel::join(double timeout) {
  Inside inside(trainer_inside_);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout));
  auto last_interrupt = Clock::now();
  while (true) {
    pump();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_) std::rethrow_exception(error_);
      if (welcome_) return *welcome_;
    }
    if (Clock::now() >= deadline) {
      throw ProducerLost("no batchcast producer named '" + options_.name + "' answered within " +
                         std::to_string(static_cast<int>(timeout)) + " s (at " + options_.endpoint +
                         "); start the producer first, or pass a longer timeout");
    }
    interrupt_check(last_interrupt);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    transport::wait_readable({socket_fd_, wakeup_.fd()},
                             std::max(std::chrono::milliseconds(1), std::min(left, kTick)));
    wakeup_.drain();
  }
}

protocol::Message Channel::take() {
  Inside inside(trainer_inside_);
  auto last_interrupt = Clock::now();
  while (true) {
    pump();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_) std::rethrow_exception(error_);
      if (!inbox_.empty()) {
        protocol::Message m = std::move(inbox_.front());
        inbox_.pop_front();
        if (std::holds_alternative<protocol::Announcement>(m)) taken_ += 1;
        return m;
      }
    }
    interrupt_check(last_interrupt);
    transport::wait_readable({socket_fd_, wakeup_.fd()}, kTick);
    wakeup_.drain();
  }
}

void Channel::interrupt_check(Clock::time_point& last) {
  if (!options_.interrupt || Clock::now() - last < kTick) return;
  last = Clock::now();
  options_.interrupt();
}

std::shared_ptr<ReleaseToken> Channel::hold(uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    referenced_.insert(seq);
    taken_ -= 1;
  }
  return std::make_shared<ReleaseToken>(seq, shared_from_this());
}

void Channel::release_now(uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    taken_ -= 1;
  }
  send_releases({seq});
}

MappedRing& Channel::ring() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ring_) throw ProducerLost("the ring of batchcast producer '" + options_.name + "' is not mapped");
  return *ring_;
}

void Channel::leave() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    start_leaving();
  }
  flush();
  watch_wakeup_.notify();  // it may be drained already: let the ring go soon
}

// Under mu_. Nothing more is taken: say Bye (once), and release the
// announcements queued, which are not ours to keep.
void Channel::start_leaving() {
  if (phase_ == Phase::Joining || phase_ == Phase::Member) {
    phase_ = Phase::Leaving;
    outbox_.push_back(protocol::Bye{});
  }
  std::vector<uint64_t> release;
  for (const auto& m : inbox_) {
    if (const auto* a = std::get_if<protocol::Announcement>(&m)) release.push_back(a->seq);
  }
  inbox_.clear();
  if (!release.empty()) outbox_.push_back(protocol::Release{std::move(release)});
}

void Channel::flush() noexcept {
  try {
    std::lock_guard<std::mutex> socket(socket_mu_);
    send_outbox();
  } catch (...) {
  }
}

// Under socket_mu_.
void Channel::send_outbox() {
  std::vector<protocol::Message> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(outbox_);
  }
  for (const auto& m : out) transport::try_send(dealer_, {protocol::encode(m)});
}

void Channel::release(uint64_t seq, const std::optional<cuda::StreamRef>& stream) noexcept {
  MappedRing* ring = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ring = ring_.get();  // not unmapped while `seq` is referenced or releasing
    // A GPU release completes later (once the streams are past the slot), in a
    // training loop a step or more later. Until then the slot is not kept by
    // anyone here: counted as kept, it would make every batch a private copy.
    if (referenced_.erase(seq) > 0) releasing_.insert(seq);
  }
  if (ring != nullptr) {
    ring->release(seq, stream);  // calls released(seq), maybe later
  } else {
    released(seq);
  }
}

void Channel::released(uint64_t seq) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    referenced_.erase(seq);
    releasing_.erase(seq);
  }
  send_releases({seq});
}

void Channel::send_releases(std::vector<uint64_t> seqs) noexcept {
  if (!seqs.empty()) send(protocol::Release{std::move(seqs)});
}

void Channel::send(const protocol::Message& message) noexcept {
  try {
    const std::string bytes = protocol::encode(message);
    std::lock_guard<std::mutex> socket(socket_mu_);
    transport::try_send(dealer_, {bytes});
    // A send may consume the socket's pending read signal: if something can
    // be received now, make sure a waiting trainer looks.
    if (transport::readable(dealer_)) wakeup_.notify();
  } catch (...) {
    // The socket is failing (the process is exiting): the producer notices
    // this consumer is gone through its liveness sweep.
  }
}

void Channel::pump() {
  bool added = false;
  {
    std::lock_guard<std::mutex> socket(socket_mu_);
    std::vector<zmq::message_t> frames;
    while (transport::try_receive(dealer_, frames)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (frames.size() != 1) {
        dropped_ += 1;
        continue;
      }
      const std::size_t before = inbox_.size();
      try {
        accept(protocol::decode(frames[0].data(), frames[0].size()));
      } catch (const MalformedMessage&) {
        dropped_ += 1;
      } catch (...) {  // mapping the ring failed: CudaError, SystemError
        fail(std::current_exception());
      }
      added = added || inbox_.size() != before;
    }
    send_outbox();
  }
  // Taken in by the watchdog while a trainer may be about to wait: wake it.
  if (added && !trainer_inside_) wakeup_.notify();
}

// Under mu_ (and socket_mu_). Connection-level messages are handled here;
// the rest is queued for take().
void Channel::accept(protocol::Message m) {
  namespace pr = protocol;
  auto unexpected = [](const auto& message) {
    using T = std::decay_t<decltype(message)>;
    throw MalformedMessage(std::string("unexpected ") + pr::kind_name(pr::kind_of<T>()));
  };
  auto needs_welcome = [&](const char* what) {
    if (!welcome_) throw MalformedMessage(std::string(what) + " before welcome");
  };
  std::visit(
      pr::Exhaustive{
          [&](pr::Welcome& w) {
            if (welcome_) throw MalformedMessage("second welcome");
            welcome_ = w;
            if (phase_ != Phase::Joining) return;  // left before the answer came
            phase_ = Phase::Member;
            if (w.ring.exists()) open_ring(w.ring);
          },
          [&](pr::Evicted& e) {
            needs_welcome("eviction");
            fail(std::make_exception_ptr(Evicted(e.reason)));
          },
          [&](pr::Refuse& r) {
            fail(std::make_exception_ptr(
                Refused(r.reason.empty() ? "the producer refused this consumer" : r.reason)));
          },
          [&](pr::RingReady& ready) {
            if (welcome_ && ring_ && welcome_->ring.exists() &&
                welcome_->ring.bytes == ready.ring.bytes && welcome_->ring.fd == ready.ring.fd &&
                welcome_->ring.memory_handle == ready.ring.memory_handle) {
              return;  // joined between the ring's creation and its announcement: already open
            }
            if (!welcome_ || ring_ || ready.ring.gpu_uuid != welcome_->ring.gpu_uuid) {
              throw MalformedMessage("unexpected ring");
            }
            welcome_->ring = ready.ring;
            if (phase_ == Phase::Member) open_ring(ready.ring);
          },
          [&](pr::Announcement& a) {
            if (!ring_) {
              if (phase_ != Phase::Member && welcome_) release_later(a.seq);  // left before the ring came
              throw MalformedMessage("announcement before the ring");
            }
            for (const auto& leaf : a.leaves) {
              if (const auto* t = std::get_if<pr::TensorLeaf>(&leaf)) {
                if (t->offset > ring_->size() || t->nbytes() > ring_->size() - t->offset) {
                  throw MalformedMessage("tensor outside the ring");
                }
              }
            }
            if (ring_->events() > 0 ? (a.event < 0 || a.event >= ring_->events()) : a.event != -1) {
              throw MalformedMessage("bad slot event");
            }
            received_ += 1;
            if (phase_ != Phase::Member) {
              release_later(a.seq);  // announced while we left: not ours to keep
              return;
            }
            inbox_.push_back(std::move(m));
          },
          [&](pr::Heartbeat&) {},
          [&](pr::GroupReady&) { queue_group_message(std::move(m)); },
          [&](pr::GroupBroken&) { queue_group_message(std::move(m)); },
          [&](pr::EpochEnd&) {
            needs_welcome("epoch end");
            if (phase_ == Phase::Member) inbox_.push_back(std::move(m));
          },
          [&](pr::LoaderFailed&) {
            needs_welcome("loader failure");
            if (phase_ == Phase::Member) inbox_.push_back(std::move(m));
          },
          [&](pr::Finished&) {
            needs_welcome("finish");
            if (phase_ == Phase::Member) inbox_.push_back(std::move(m));
            finished_ = true;
            if (phase_ == Phase::Member) phase_ = Phase::Leaving;  // nothing more will come
          },
          // What consumers send, and the status exchange: never to a consumer.
          [&](pr::Hello& x) { unexpected(x); },
          [&](pr::Release& x) { unexpected(x); },
          [&](pr::Bye& x) { unexpected(x); },
          [&](pr::Unmapped& x) { unexpected(x); },
          [&](pr::Mapped& x) { unexpected(x); },
          [&](pr::StatusRequest& x) { unexpected(x); },
          [&](pr::Status& x) { unexpected(x); },
      },
      m);
}

// Under mu_.
void Channel::queue_group_message(protocol::Message m) {
  if (!welcome_ || options_.world_size == 0) {
    throw MalformedMessage("group message to a consumer of no group");
  }
  if (phase_ == Phase::Member) inbox_.push_back(std::move(m));
}

// Under mu_.
void Channel::open_ring(const protocol::Ring& ring) {
  try {
    ring_ = MappedRing::open(
        ring, welcome_->producer_pid, [this](uint64_t seq) { released(seq); }, options_.release_after);
  } catch (const SystemError&) {
    if (process_alive(welcome_->producer_pid)) throw;
    throw ProducerLost("producer pid " + std::to_string(welcome_->producer_pid) +
                       " exited before this consumer could map its ring (a finished producer waits "
                       "`linger` seconds for that); the batches it sent are lost");
  }
  memory_opens_ += ring_->ipc_memory_opens();  // kept after the mapping is closed
  event_opens_ += ring_->ipc_event_opens();
  outbox_.push_back(protocol::Mapped{});  // a finished producer may be waiting for it
}

// Under mu_.
void Channel::release_later(uint64_t seq) {
  if (!outbox_.empty()) {
    if (auto* r = std::get_if<protocol::Release>(&outbox_.back())) {
      r->seqs.push_back(seq);
      return;
    }
  }
  outbox_.push_back(protocol::Release{{seq}});
}

// Under mu_. Whatever the error, this consumer takes nothing more.
void Channel::fail(std::exception_ptr error) {
  if (!error_) error_ = std::move(error);
  start_leaving();
  wakeup_.notify();
  watch_wakeup_.notify();  // sends what start_leaving queued
}

void Channel::watch() {
  while (true) {
    try {
      transport::wait_readable({watch_wakeup_.fd()}, kTick);
      watch_wakeup_.drain();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (quit_) return;
      }
      if (!trainer_inside_) {
        pump();
      } else {
        flush();
      }
      check_producer();
      unmap_if_drained();
    } catch (...) {
      // Nothing escapes this thread: the trainer gets the error.
      std::lock_guard<std::mutex> lock(mu_);
      fail(std::current_exception());
    }
  }
}

// The producer's process is the liveness signal (a reply could be late for
// many reasons; a dead process is dead).
void Channel::check_producer() {
  int64_t pid = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ != Phase::Member || !welcome_ || error_) {
      producer_gone_since_.reset();
      return;
    }
    pid = welcome_->producer_pid;
  }
  const bool alive = process_alive(pid);
  std::lock_guard<std::mutex> lock(mu_);
  if (alive || phase_ != Phase::Member) {
    producer_gone_since_.reset();
    return;
  }
  if (!producer_gone_since_) producer_gone_since_ = Clock::now();
  if (Clock::now() - *producer_gone_since_ > kProducerGrace) {
    fail(std::make_exception_ptr(
        ProducerLost("batchcast producer '" + options_.name + "' (pid " + std::to_string(pid) +
                     ") exited or was killed before finishing; restart it and this consumer")));
  }
}

// Leaving, with nothing referenced, queued or in flight: close the mapping and
// tell the producer, which may then free a GPU ring.
void Channel::unmap_if_drained() {
  std::unique_ptr<MappedRing> ring;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ != Phase::Leaving || !referenced_.empty() || !releasing_.empty() || taken_ != 0) return;
    for (const auto& m : inbox_) {
      if (std::holds_alternative<protocol::Announcement>(m)) return;
    }
    if (ring_ && ring_->releases_in_flight() > 0) return;
    phase_ = Phase::Drained;
    ring = std::move(ring_);
  }
  ring.reset();  // outside mu_: a GPU mapping's waiter thread may still take it
  send(protocol::Unmapped{});
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = Phase::Unmapped;
}

Channel::Phase Channel::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

std::set<uint64_t> Channel::referenced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return referenced_;
}

ChannelStats Channel::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ChannelStats s;
  s.received = received_;
  s.dropped_messages = dropped_;
  s.slots_held = static_cast<int64_t>(referenced_.size() + releasing_.size());
  s.ipc_memory_opens = memory_opens_;
  s.ipc_event_opens = event_opens_;
  if (ring_) {
    s.ring_address = reinterpret_cast<uint64_t>(ring_->base());
    s.ring_bytes = ring_->size();
  }
  return s;
}

}  // namespace batchcast
