#include "batchcast/consumer/session.h"

#include <utility>

#include "batchcast/common/error.h"

namespace batchcast {

void SessionActions::merge(SessionActions other) {
  if (other.map) map = std::move(other.map);
  if (other.mailbox) mailbox = std::move(other.mailbox);
  unmap = unmap || other.unmap;
  for (auto& m : other.sends) sends.push_back(std::move(m));
  news = news || other.news;
}

namespace {

// Releases go out in as few messages as possible: a seq joins the last
// Release queued if it is the last thing queued.
void release_later(SessionActions& out, uint64_t seq) {
  if (!out.sends.empty()) {
    if (auto* r = std::get_if<protocol::Release>(&out.sends.back())) {
      r->seqs.push_back(seq);
      return;
    }
  }
  out.sends.push_back(protocol::Release{{seq}});
}

}  // namespace

Session::Session(SessionOptions options) : options_(std::move(options)) {}

SessionActions Session::start() {
  SessionActions out;
  out.sends.push_back(options_.hello);
  return out;
}

SessionActions Session::on_message(const void* data, std::size_t size) {
  SessionActions out;
  try {
    protocol::Message m = protocol::decode(data, size);
    const std::size_t before = inbox_.size();
    accept(m, out);
    out.news = out.news || inbox_.size() != before;
  } catch (const MalformedMessage&) {
    dropped_ += 1;  // what was decided before the fault (a release) still goes out
  }
  return out;
}

SessionActions Session::on_malformed() {
  dropped_ += 1;
  return {};
}

// Connection-level messages are handled here; the rest is queued for take().
// One handler per kind: a new kind does not compile until it has one here.
void Session::accept(protocol::Message& m, SessionActions& out) {
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
            if (w.ring.exists()) out.map = w.ring;
          },
          [&](pr::Evicted& e) {
            needs_welcome("eviction");
            fail(std::make_exception_ptr(Evicted(e.reason)), out);
          },
          [&](pr::Refuse& r) {
            fail(std::make_exception_ptr(
                     Refused(r.reason.empty() ? "the producer refused this consumer" : r.reason)),
                 out);
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
            if (phase_ == Phase::Member) out.map = ready.ring;
          },
          [&](pr::Announcement& a) {
            if (!ring_) {
              // Left before the ring came: not ours to keep. Once unmapped,
              // the producer has forgotten this consumer and what it held.
              if (phase_ == Phase::Leaving && welcome_) release_later(out, a.seq);
              throw MalformedMessage(phase_ == Phase::Unmapped || phase_ == Phase::Drained
                                         ? "announcement after unmapping"
                                         : "announcement before the ring");
            }
            for (const auto& leaf : a.leaves) {
              if (const auto* t = std::get_if<pr::TensorLeaf>(&leaf)) {
                if (t->offset > ring_->bytes || t->nbytes() > ring_->bytes - t->offset) {
                  throw MalformedMessage("tensor outside the ring");
                }
              }
            }
            if (ring_->events > 0 ? (a.event < 0 || a.event >= ring_->events) : a.event != -1) {
              throw MalformedMessage("bad slot event");
            }
            received_ += 1;
            if (phase_ != Phase::Member) {
              release_later(out, a.seq);  // announced while we left: not ours to keep
              return;
            }
            inbox_.push_back(std::move(a));
          },
          [&](pr::MailboxReady& ready) {
            needs_welcome("mailbox");
            if (mailbox_given_) throw MalformedMessage("second mailbox");
            mailbox_given_ = true;
            // Opened even when leaving: what was sent through it is released.
            if (phase_ != Phase::Drained && phase_ != Phase::Unmapped) out.mailbox = ready;
          },
          [&](pr::Heartbeat&) {},
          [&](pr::GroupReady& ready) { queue_group_message(std::move(ready)); },
          [&](pr::GroupBroken& broken) { queue_group_message(std::move(broken)); },
          [&](pr::EpochEnd& end) {
            needs_welcome("epoch end");
            if (phase_ == Phase::Member) inbox_.push_back(std::move(end));
          },
          [&](pr::LoaderFailed& failed) {
            needs_welcome("loader failure");
            if (phase_ == Phase::Member) inbox_.push_back(std::move(failed));
          },
          [&](pr::Finished& finished) {
            needs_welcome("finish");
            finished_ = true;
            if (phase_ == Phase::Member) {
              inbox_.push_back(std::move(finished));
              phase_ = Phase::Leaving;  // nothing more will come
            }
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

void Session::queue_group_message(StreamMessage m) {
  if (!welcome_ || options_.hello.world_size == 0) {
    throw MalformedMessage("group message to a consumer of no group");
  }
  if (phase_ == Phase::Member) inbox_.push_back(std::move(m));
}

SessionActions Session::on_mapped(RingExtent ring) {
  SessionActions out;
  ring_ = ring;
  out.sends.push_back(protocol::Mapped{});  // a finished producer may be waiting for it
  return out;
}

SessionActions Session::on_failed(std::exception_ptr error) {
  SessionActions out;
  fail(std::move(error), out);
  return out;
}

void Session::on_unmapped() {
  ring_.reset();
  phase_ = Phase::Unmapped;
}

// Whatever the error, this consumer takes nothing more.
void Session::fail(std::exception_ptr error, SessionActions& out) {
  if (!error_) error_ = std::move(error);
  start_leaving(out);
  out.news = true;
}

// Nothing more is taken: say Bye (once), and release the announcements
// queued, which are not ours to keep.
void Session::start_leaving(SessionActions& out) {
  if (phase_ == Phase::Joining || phase_ == Phase::Member) {
    phase_ = Phase::Leaving;
    out.sends.push_back(protocol::Bye{});
  }
  bool first = true;
  for (const auto& m : inbox_) {
    if (const auto* a = std::get_if<protocol::Announcement>(&m)) {
      if (first) out.sends.push_back(protocol::Release{});  // a Release of its own, after the Bye
      first = false;
      release_later(out, a->seq);
    }
  }
  inbox_.clear();
}

std::optional<StreamMessage> Session::take() {
  if (error_) std::rethrow_exception(error_);
  if (inbox_.empty()) return std::nullopt;
  StreamMessage m = std::move(inbox_.front());
  inbox_.pop_front();
  if (std::holds_alternative<protocol::Announcement>(m)) taken_ += 1;
  return m;
}

void Session::hold(uint64_t seq) {
  referenced_.insert(seq);
  taken_ -= 1;
}

SessionActions Session::release_now(uint64_t seq) {
  taken_ -= 1;
  SessionActions out;
  release_later(out, seq);
  return out;
}

void Session::unreferenced(uint64_t seq) {
  // A GPU release completes later (once the streams are past the slot), in a
  // training loop a step or more later. Until then the slot is not kept by
  // anyone here: counted as kept, it would make every batch a private copy.
  if (referenced_.erase(seq) > 0) releasing_.insert(seq);
}

SessionActions Session::on_released(uint64_t seq) {
  referenced_.erase(seq);
  releasing_.erase(seq);
  SessionActions out;
  release_later(out, seq);
  return out;
}

SessionActions Session::leave() {
  SessionActions out;
  start_leaving(out);
  return out;
}

SessionActions Session::on_tick(const std::function<bool(int64_t pid)>& alive, Clock::time_point now,
                                int64_t releases_in_flight) {
  SessionActions out;
  // The producer's process is the liveness signal (a reply could be late
  // for many reasons; a dead process is dead).
  if (phase_ == Phase::Member && welcome_ && !error_ && !alive(welcome_->producer_pid)) {
    if (!producer_gone_since_) producer_gone_since_ = now;
    if (now - *producer_gone_since_ > kProducerGrace) {
      fail(std::make_exception_ptr(ProducerLost(
               "batchcast producer '" + options_.name + "' (pid " +
               std::to_string(welcome_->producer_pid) +
               ") exited or was killed before finishing; restart it and this consumer")),
           out);
    }
  } else {
    producer_gone_since_.reset();
  }
  // Leaving, with nothing referenced, queued or in flight: close the mapping
  // and tell the producer, which may then free a GPU ring.
  if (phase_ == Phase::Leaving && referenced_.empty() && releasing_.empty() && taken_ == 0 &&
      releases_in_flight == 0) {
    for (const auto& m : inbox_) {
      if (std::holds_alternative<protocol::Announcement>(m)) return out;
    }
    phase_ = Phase::Drained;
    out.unmap = true;
    out.sends.push_back(protocol::Unmapped{});
  }
  return out;
}

SessionActions Session::close() {
  SessionActions out;
  if (phase_ != Phase::Unmapped) {
    out.unmap = true;
    out.sends.push_back(protocol::Unmapped{});  // the producer forgets us and whatever we never took
  }
  phase_ = Phase::Drained;
  return out;
}

}  // namespace batchcast
