#include "batchcast/consumer/channel.h"

#include <cerrno>

#include <unistd.h>

#include "batchcast/common/error.h"
#include "batchcast/common/threads.h"
#include "batchcast/transport/socket.h"

namespace batchcast {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTick = std::chrono::milliseconds(100);
// The watchdog's longest sleep while nothing is expected of it (a member,
// its producer's exit watched): a message the trainer is not there to take
// (a ring announced while it is away) waits at most this long.
constexpr auto kQuietTick = std::chrono::milliseconds(1000);

SessionOptions session_options(const ChannelOptions& options) {
  SessionOptions s;
  s.name = options.name;
  s.hello.pid = ::getpid();
  s.hello.flags = (options.catch_up ? protocol::Hello::kCatchUp : 0u) |
                  (options.join_now ? protocol::Hello::kJoinNow : 0u);
  s.hello.batch_size = options.batch_size;
  s.hello.group = options.group;
  s.hello.rank = options.rank;
  s.hello.world_size = options.world_size;
  s.hello.resume_epoch = options.resume_epoch;
  s.hello.resume_position = options.resume_position;
  s.hello.resume_joined_at = options.resume_joined_at;
  s.hello.resume_run = options.resume_run;
  return s;
}

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
  channel->watchdog_ = start_background_thread("batchcast-watch", [c = channel.get()] { c->watch(); });
  return channel;
}

Channel::Channel(ChannelOptions options)
    : options_(std::move(options)),
      context_(1),
      dealer_(context_, zmq::socket_type::dealer),
      session_(session_options(options_)) {
  dealer_.set(zmq::sockopt::linger, 1000);
  dealer_.set(zmq::sockopt::sndhwm, 0);
  dealer_.set(zmq::sockopt::rcvhwm, 0);
  dealer_.connect(options_.endpoint);
  socket_fd_ = dealer_.get(zmq::sockopt::fd);
  {
    std::lock_guard<std::mutex> lock(mu_);
    act(session_.start());
  }
  flush();
}

Channel::~Channel() {
  if (!born_.here()) {
    // A forked child's copy: the watchdog, the socket, the mailbox and the
    // mapping are the parent's (common/fork.h).
    leave_behind(watchdog_);
    leave_behind(dealer_);
    leave_behind(context_);
    leave_behind(mailbox_);
    leave_behind(ring_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  watch_wakeup_.notify();
  if (watchdog_.joinable()) watchdog_.join();
  // No token is alive (each keeps the channel): nothing of the ring is used.
  std::unique_ptr<MappedRing> ring;
  SessionActions last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = session_.close();
    ring = std::move(ring_);
  }
  ring.reset();
  bool gone = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_.on_unmapped();
    for (auto& m : last.sends) outbox_.push_back(std::move(m));  // Unmapped, after the mapping closed
    gone = session_.producer_gone();
  }
  flush();
  // Give those last words a moment to leave, unless nobody is there to hear.
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
    pump(/*socket=*/true);
    {
      std::lock_guard<std::mutex> lock(mu_);
      session_.rethrow_if_failed();
      if (session_.welcome()) return *session_.welcome();
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

StreamMessage Channel::take(const std::function<void(double)>& waiting) {
  Inside inside(trainer_inside_);
  const auto started = Clock::now();
  auto last_interrupt = started;
  while (true) {
    pump(/*socket=*/false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto m = session_.take()) return std::move(*m);
    }
    interrupt_check(last_interrupt);
    if (waiting) waiting(std::chrono::duration<double>(Clock::now() - started).count());
    int bell = -1;
    bool socket = true;
    {
      std::lock_guard<std::mutex> lock(socket_mu_);
      if (mailbox_) {
        if (!mailbox_->consumer_sleeps()) continue;  // something came meanwhile
        bell = mailbox_->consumer_bell();
        socket = inbox_.expects_socket();  // otherwise nothing is expected there
      }
    }
    transport::wait_readable({socket ? socket_fd_ : -1, wakeup_.fd(), bell}, kTick);
    wakeup_.drain();
    if (bell >= 0) {
      std::lock_guard<std::mutex> lock(socket_mu_);
      mailbox_->consumer_woke();
    }
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
    session_.hold(seq);
  }
  return std::make_shared<ReleaseToken>(seq, shared_from_this());
}

void Channel::release_now(uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    act(session_.release_now(seq));
  }
  flush();
}

MappedRing& Channel::ring() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ring_) throw ProducerLost("the ring of batchcast producer '" + options_.name + "' is not mapped");
  return *ring_;
}

void Channel::leave() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    act(session_.leave());
  }
  flush();
  watch_wakeup_.notify();  // it may be drained already: let the ring go soon
}

void Channel::release(uint64_t seq, const std::optional<cuda::StreamRef>& stream) noexcept {
  MappedRing* ring = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ring = ring_.get();  // not unmapped while `seq` is referenced or releasing
    session_.unreferenced(seq);
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
    act(session_.on_released(seq));
  }
  flush();
}

// Under mu_ (and socket_mu_ when a message is handled: only then can it
// ask for the mailbox).
void Channel::act(SessionActions a) {
  if (a.mailbox) {
    try {
      mailbox_ = Mailbox::open(*a.mailbox, session_.welcome()->producer_pid, session_.welcome()->consumer_id);
    } catch (const SystemError& e) {
      // Gone from the producer (ENOENT): it closed while this consumer joined.
      std::exception_ptr failure = std::current_exception();
      if (e.code() == ENOENT) {
        failure = std::make_exception_ptr(ProducerLost(
            "batchcast producer '" + options_.name + "' (pid " + std::to_string(session_.welcome()->producer_pid) +
            ") was stopped or closed while this consumer joined it, before the consumer could open its "
            "mailbox"));
      }
      a.merge(session_.on_failed(failure));
    } catch (...) {  // MalformedMessage
      a.merge(session_.on_failed(std::current_exception()));
    }
    a.mailbox.reset();
  }
  if (a.map) {
    SessionActions next;
    try {
      open_ring(*a.map);
      next = session_.on_mapped(RingExtent{ring_->size(), ring_->events()});
    } catch (...) {  // CudaError, SystemError, ProducerLost
      next = session_.on_failed(std::current_exception());
    }
    a.map.reset();
    a.merge(std::move(next));
  }
  for (auto& m : a.sends) outbox_.push_back(std::move(m));
  if (a.news && (!trainer_inside_ || session_.failed())) wakeup_.notify();
  if (!producer_watched_ && session_.welcome()) {
    producer_watched_ = true;
    producer_watch_ = watch_process(session_.welcome()->producer_pid);
    watch_wakeup_.notify();  // the watchdog sleeps on it from now on
  }
}

// Under mu_.
void Channel::open_ring(const protocol::Ring& ring) {
  const int64_t pid = session_.welcome()->producer_pid;
  try {
    ring_ = MappedRing::open(ring, pid, [this](uint64_t seq) { released(seq); }, options_.release_after);
  } catch (const SystemError&) {
    if (process_alive(pid)) throw;
    throw ProducerLost("producer pid " + std::to_string(pid) +
                       " exited before this consumer could map its ring (a finished producer waits "
                       "`linger` seconds for that); the batches it sent are lost");
  }
  memory_opens_ += ring_->ipc_memory_opens();  // kept after the mapping is closed
  event_opens_ += ring_->ipc_event_opens();
}

void Channel::flush() noexcept {
  try {
    std::lock_guard<std::mutex> socket(socket_mu_);
    send_outbox();
  } catch (...) {
    // The socket is failing (the process is exiting): the producer notices
    // this consumer is gone through its liveness sweep.
  }
}

// Under socket_mu_.
void Channel::send_outbox() {
  std::vector<protocol::Message> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(outbox_);
  }
  if (out.empty()) return;
  bool on_socket = false;
  for (const auto& m : out) {
    const std::string bytes = protocol::encode(m);
    // Releases through the mailbox (one too large for it: the socket; the
    // producer reads the mailbox before any socket message from here), until
    // the Bye: after it, on the socket, so that none overtakes it.
    if (mailbox_ && !said_bye_ && std::holds_alternative<protocol::Release>(m) &&
        mailbox_->send(bytes) == FrameQueue::Push::Done) {
      continue;
    }
    const bool sent = transport::try_send(dealer_, {bytes});
    if (sent && std::holds_alternative<protocol::Bye>(m)) said_bye_ = true;
    on_socket = true;
  }
  // A send may consume the socket's pending read signal: if something can
  // be received now, make sure a waiting trainer looks.
  if (on_socket && transport::readable(dealer_)) wakeup_.notify();
}

void Channel::pump(bool socket) {
  std::lock_guard<std::mutex> lock_socket(socket_mu_);
  read_socket(socket || !mailbox_);
  read_mailbox();
  if (inbox_.expects_socket()) {  // a marker was met: its message may be on the socket already
    read_socket(true);
    read_mailbox();
  }
  send_outbox();
}

// Under socket_mu_. Looking costs ZeroMQ two system calls even when nothing
// is there: once the mailbox is open, only when a marker says something is.
void Channel::read_socket(bool look) {
  if (!look) return;
  std::vector<zmq::message_t> frames;
  while (transport::try_receive(dealer_, frames)) {
    if (mailbox_) {
      // Once there is a mailbox, the socket carries only the messages too
      // large for it: each takes its place where its marker is.
      inbox_.spilled(frames.size() == 1 ? frames[0].to_string() : std::string());
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    act(frames.size() == 1 ? session_.on_message(frames[0].data(), frames[0].size())
                           : session_.on_malformed());
  }
}

// Under socket_mu_.
void Channel::read_mailbox() {
  if (!mailbox_) return;
  const bool took = inbox_.drain([&](std::string& out) { return mailbox_->receive(out); },
                                 [&](const std::string& message) { on_frame(message); });
  mailbox_dropped_.store(mailbox_->dropped(), std::memory_order_relaxed);
  if (took) mailbox_->made_room();  // the producer may wait for it
}

// Under socket_mu_.
void Channel::on_frame(const std::string& frame) {
  std::lock_guard<std::mutex> lock(mu_);
  act(frame.empty() ? session_.on_malformed() : session_.on_message(frame.data(), frame.size()));
}

// Under mu_.
std::chrono::milliseconds Channel::watch_period() const {
  const bool quiet = session_.phase() == Phase::Member && producer_watch_.valid() &&
                     !producer_exited_ && !session_.failed();
  return quiet ? kQuietTick : kTick;
}

void Channel::watch() {
  while (true) {
    try {
      int producer = -1;
      std::chrono::milliseconds period;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (quit_) return;
        if (!producer_exited_) producer = producer_watch_.get();
        period = watch_period();
      }
      transport::wait_readable({watch_wakeup_.fd(), producer}, period);
      watch_wakeup_.drain();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (quit_) return;
        // Readable for good once the process exits: watched no more (the
        // session's grace and its error follow on the short tick).
        if (producer >= 0 && readable_now(producer)) producer_exited_ = true;
      }
      if (!trainer_inside_) {
        pump(/*socket=*/true);
      } else {
        flush();
      }
      tick();
    } catch (...) {
      // Nothing escapes this thread: the trainer gets the error.
      {
        std::lock_guard<std::mutex> lock(mu_);
        act(session_.on_failed(std::current_exception()));
      }
      flush();
    }
  }
}

// The session's periodic rules: the producer's liveness, and once drained,
// the mapping closed before the producer is told (it may then free a GPU ring).
void Channel::tick() {
  std::unique_ptr<MappedRing> ring;
  SessionActions after;
  {
    std::lock_guard<std::mutex> lock(mu_);
    SessionActions a =
        session_.on_tick(process_alive, Clock::now(), ring_ ? ring_->releases_in_flight() : 0);
    if (!a.unmap) {
      act(std::move(a));
    } else {
      ring = std::move(ring_);
      after = std::move(a);
    }
  }
  if (after.unmap) {
    ring.reset();  // outside mu_: a GPU mapping's waiter thread may still take it
    std::lock_guard<std::mutex> lock(mu_);
    session_.on_unmapped();
    after.unmap = false;
    act(std::move(after));
  }
  flush();
}

Channel::Phase Channel::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return session_.phase();
}

std::set<uint64_t> Channel::referenced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return session_.referenced();
}

ChannelStats Channel::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ChannelStats s;
  s.received = session_.received();
  s.dropped_messages = session_.dropped() + mailbox_dropped_.load(std::memory_order_relaxed);
  s.mailbox = mailbox_ != nullptr;
  s.slots_held = session_.slots_held();
  s.ipc_memory_opens = memory_opens_;
  s.ipc_event_opens = event_opens_;
  if (ring_) {
    s.ring_address = reinterpret_cast<uint64_t>(ring_->base());
    s.ring_bytes = ring_->size();
  }
  return s;
}

}  // namespace batchcast
