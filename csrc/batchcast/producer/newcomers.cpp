// The membership's newcomers: a consumer's Hello admitted (alone, or as a
// rank of a forming group), where it starts — the join plan's word — and the
// held batches it gets first (catch-up, resume). The rest of the membership
// (messages, the stream, liveness) is membership.cpp.
#include <algorithm>
#include <limits>
#include <stdexcept>

#include "batchcast/producer/membership.h"

namespace batchcast {

void Membership::join(const std::string& peer, const protocol::Hello& hello, Actions& out) {
  const uint64_t group = hello.in_group() ? admit_to_group(peer, hello, out) : 0;
  if (hello.in_group() && group == 0) return;  // refused
  Member m;
  m.id = next_id_++;
  m.pid = hello.pid;
  m.batch_size = hello.batch_size;
  m.hello = hello;
  m.group = group;
  m.mapped = options_.ring.on_gpu() && options_.ring.exists();
  m.unread_ring = options_.ring.exists();
  Start start;
  if (group != 0) {  // its first epoch comes with GroupReady, once every rank is here
    m.waiting_for_group = true;
    m.frame.first_epoch = std::numeric_limits<int64_t>::max();
  } else {
    start = start_for(hello, hello.flags, out);
    m.frame = start.point.frame;
    plan_.joined(m.id, m.frame);
  }
  auto& member = members_.emplace(peer, m).first->second;
  counters_.joins += 1;
  out.members_changed = true;
  report(out, Report::Level::Info,
         who(member) +
             (group != 0 ? " joined as rank " + std::to_string(hello.rank) + " of consumer group '" +
                               hello.group + "' (" + std::to_string(hello.world_size) + " ranks)"
                         : " joined (first epoch " + std::to_string(member.frame.first_epoch) +
                               (member.frame.joined_at > 0 ? ", from its sample " + std::to_string(member.frame.joined_at) +
                                                        ": its epochs begin there"
                                                  : std::string()) +
                               ")"));

  protocol::Welcome w;
  w.producer_pid = options_.producer_pid;
  w.run = options_.run;
  w.ring = options_.ring;
  w.consumer_id = member.id;
  w.first_epoch = group != 0 ? -1 : member.frame.first_epoch;
  w.samples_per_epoch = plan_.samples_per_epoch();
  w.batches_per_epoch = plan_.batches_per_epoch();
  w.slots = options_.slots;
  w.pin_budget = pin_budget();
  w.resume = start.resume();
  w.resume_position = start.point.position;
  w.loader = options_.loader;
  constexpr int64_t kMost = std::numeric_limits<int32_t>::max();
  w.producer_epoch = plan_.epoch_in_progress();
  w.consumers_wanted = static_cast<int32_t>(std::min(awaiting_, kMost));
  w.consumers_present = static_cast<int32_t>(std::min(active(), kMost));
  w.joined_at = start.point.frame.joined_at;
  send(out, peer, std::make_shared<const std::string>(protocol::encode(w)));
  out.sends.back().welcome = true;
  out.sends.back().consumer_id = member.id;
  if (group == 0) {
    begin(peer, member, start, out);  // what it resumes or catches up on, even from a finished producer
  } else if (!finished_ && groups_.all_present(group)) {
    start_group(group, out);
  }
  if (finished_) send(out, peer, finished_);  // nothing more will come: say so at once
}

// The forming group of that name this rank joins (a new one if there is
// none); 0 when refused.
uint64_t Membership::admit_to_group(const std::string& peer, const protocol::Hello& hello, Actions& out) {
  std::string refused;
  const uint64_t id = groups_.admit(peer, hello, [this](const std::string& p) { return members_.at(p).pid; }, refused);
  if (id == 0) refuse(out, peer, refused);
  return id;
}

// Every rank is present: the group starts as one consumer, where its rank 0
// asked (its resume position, catch-up if every rank asked for it).
void Membership::start_group(uint64_t id, Actions& out) {
  ConsumerGroups::Group& g = groups_.at(id);
  g.complete = true;
  uint32_t flags = ~0u;  // what every rank asked for
  for (const auto& [rank, peer] : g.ranks) flags &= members_.at(peer).hello.flags;
  const Start start = start_for(members_.at(g.ranks.at(0)).hello, flags, out);
  auto ready = std::make_shared<const std::string>(protocol::encode(
      protocol::GroupReady{start.point.frame.first_epoch, start.resume(), start.point.position, start.point.frame.joined_at}));
  for (const auto& [rank, peer] : g.ranks) {
    Member& m = members_.at(peer);
    m.waiting_for_group = false;
    m.frame = start.point.frame;
    plan_.joined(m.id, m.frame);
    send(out, peer, ready);
    begin(peer, m, start, out);
  }
  out.members_changed = true;
  report(out, Report::Level::Info,
         "consumer group '" + g.name + "' of producer '" + options_.name + "': all " +
             std::to_string(g.world_size) + " ranks are present; it starts at epoch " +
             std::to_string(start.point.frame.first_epoch) +
             (start.point.frame.joined_at > 0 ? " from its sample " + std::to_string(start.point.frame.joined_at) : std::string()));
}

// The held batches of the replay, if every one of them is still held: of its
// epoch, from the one holding its sample position through its batch `through` - 1.
bool Membership::held(const Replay& replay, std::vector<std::shared_ptr<const protocol::Announcement>>& batches) const {
  batches.clear();
  int64_t expect = -1;
  for (const auto& [seq, hold] : slots_.held()) {
    if (!hold.batch || hold.batch->epoch != replay.epoch) continue;
    if (expect < 0) {
      if (replay.position < hold.position || replay.position >= hold.position + hold.batch->samples) continue;
      expect = hold.batch->index;
    }
    if (hold.batch->index != expect) break;  // a batch in between is gone
    batches.push_back(hold.batch);
    expect += 1;
  }
  if (expect == replay.through) return true;
  batches.clear();
  return false;
}

protocol::Resume Membership::Start::resume() const {
  switch (point.resumed) {
    case StartPoint::Resumed::Exact: return protocol::Resume::Exact;
    case StartPoint::Resumed::NextPass: return protocol::Resume::NextPass;
    case StartPoint::Resumed::No: break;
  }
  return protocol::Resume::None;
}

// Where a newcomer starts is the join plan's to say; this gathers the held
// batches it gets first, counts and says what it asked for and does not get.
Membership::Start Membership::start_for(const protocol::Hello& hello, uint32_t flags, Actions& out) {
  StartRequest request;
  request.catch_up = (flags & protocol::Hello::kCatchUp) != 0;
  request.join_now = (flags & protocol::Hello::kJoinNow) != 0;
  request.resume_epoch = hello.resume_epoch;
  request.resume_position = hello.resume_position;
  request.resume_joined_at = hello.resume_joined_at;
  request.saved_in_this_run = hello.resume_run == options_.run;
  std::vector<std::shared_ptr<const protocol::Announcement>> scratch;
  Start s;
  s.point = plan_.start(request, [&](const Replay& r) { return held(r, scratch); });
  const StartPoint& p = s.point;
  if (p.replay) {
    if (!held(*p.replay, s.batches)) throw std::logic_error("membership: a replay the plan took is not held");
    if (p.replay->with_end) s.end = last_end_;
  }
  const std::string pid = "consumer pid " + std::to_string(hello.pid);
  if (p.resumed == StartPoint::Resumed::Exact) {
    counters_.resumed += 1;
  } else if (p.resumed == StartPoint::Resumed::NextPass) {
    counters_.resumed_next_pass += 1;
    report(out, Report::Level::Notice,
           pid + " of producer '" + options_.name + "' resumes epoch " + std::to_string(hello.resume_epoch) +
               " at sample " + std::to_string(p.position) +
               (p.other_run ? ", saved while another run of the producer served (it was restarted since)"
                            : ", which the producer no longer holds") +
               "; it gets positions from " + std::to_string(p.position) + " of epoch " +
               std::to_string(p.frame.first_epoch) + " instead");
  } else if (p.caught_up_too_late) {
    report(out, Report::Level::Notice,
           pid + " joined epoch " + std::to_string(plan_.epoch_in_progress()) + " of producer '" + options_.name +
               "' after its first " + std::to_string(plan_.catch_up_window()) +
               " batches (catch_up_window); it starts at epoch " + std::to_string(p.frame.first_epoch));
  } else if (!p.why_not_now.empty() && !told_cannot_join_now_) {
    told_cannot_join_now_ = true;
    report(out, Report::Level::Info,
           "producer '" + options_.name + "' cannot start consumers mid-epoch (" + p.why_not_now + "); " + pid +
               " and any other joining mid-epoch start at the next epoch");
  }
  return s;
}

// The held batches a newcomer starts with (catch-up, resume): it holds them too.
void Membership::begin(const std::string& peer, Member& member, const Start& start, Actions& out) {
  for (const auto& batch : start.batches) {
    std::map<int64_t, std::shared_ptr<const std::string>> encoded;
    if (member.leaving) break;  // its last epoch ended among them
    if (hand(out, peer, member, batch, encoded)) slots_.add_holder(batch->seq, peer);
  }
  if (start.end) send(out, peer, std::make_shared<const std::string>(protocol::encode(*start.end)));
}

}  // namespace batchcast
