// The membership (membership.h): messages from consumers, the producer's
// stream handed to each member, leaving, liveness and stragglers. Newcomers
// are newcomers.cpp.
#include "batchcast/producer/membership.h"

#include <algorithm>

#include "batchcast/common/error.h"

namespace batchcast {

Membership::Membership(MembershipOptions options, SlotLedger& slots)
    : options_(std::move(options)),
      slots_(slots),
      plan_(options_.plan),
      groups_(options_.name),
      holdup_(options_.name, options_.slots, options_.straggler_timeout) {}

std::string Membership::who(const Member& m) const {
  return "consumer pid " + std::to_string(m.pid) + " of producer '" + options_.name + "'";
}

void Membership::report(Actions& out, Report::Level level, std::string message) const {
  out.reports.push_back(Report{level, {}, std::move(message)});
}

int64_t Membership::active() const {
  int64_t n = 0;
  std::set<uint64_t> groups;
  for (const auto& [peer, m] : members_) {
    if (m.leaving || m.waiting_for_group) continue;
    if (m.group != 0) {
      groups.insert(m.group);
    } else {
      n += 1;
    }
  }
  return n + static_cast<int64_t>(groups.size());
}

int64_t Membership::taking() const {
  int64_t n = 0;
  for (const auto& [peer, m] : members_) n += (m.leaving || m.waiting_for_group) ? 0 : 1;
  return n;
}

// The ring has room for `slots` batches that consumers keep, besides those in
// flight; each consumer present gets an equal share. A consumer notices that
// it keeps batches only once it holds one beyond the batch it works on, so it
// may overshoot its budget by up to two batches' slots (at most 4): the
// budget leaves that much of its share free.
int32_t Membership::pin_budget() const {
  const int64_t n = std::max<int64_t>(taking(), 1);  // every rank of a group keeps its own
  return static_cast<int32_t>(std::max<int64_t>(0, options_.slots / n - 4));
}

int64_t Membership::kept_slots() const {
  int64_t kept = 0;
  for (const auto& [seq, hold] : slots_.held()) {
    for (const auto& peer : hold.holders) {
      if (seq < members_.at(peer).released_upto) {
        kept += 1;
        break;
      }
    }
  }
  return kept;
}

std::vector<int64_t> Membership::ring_unmapped_yet() const {
  std::vector<int64_t> pids;
  for (const auto& [peer, m] : members_) {
    if (m.unread_ring && !m.leaving) pids.push_back(m.pid);
  }
  return pids;
}

std::vector<int64_t> Membership::ring_importers() const {
  std::vector<int64_t> pids;
  for (const auto& [peer, m] : members_) {
    if (m.mapped) pids.push_back(m.pid);
  }
  return pids;
}

std::vector<ConsumerInfo> Membership::consumers() const {
  std::vector<ConsumerInfo> out;
  for (const auto& [peer, m] : members_) {
    ConsumerInfo info;
    info.id = m.id;
    info.pid = m.pid;
    info.batch_size = m.batch_size;
    info.first_epoch = m.waiting_for_group ? -1 : m.frame.first_epoch;
    info.joined_at = m.frame.joined_at;
    info.batches_sent = m.batches_sent;
    info.stall_seconds = m.stall_seconds;
    info.holding_up = !holding_up_.empty() && holding_up_ == peer;
    info.leaving = m.leaving;
    if (m.hello.in_group()) {
      info.group = m.hello.group;
      info.rank = m.hello.rank;
      info.world_size = m.hello.world_size;
      info.waiting_for_group = m.waiting_for_group;
    }
    for (const auto& [seq, hold] : slots_.held()) {
      if (hold.holders.count(peer) == 0) continue;
      info.slots_held += 1;
      info.slots_pinned += seq < m.released_upto ? 1 : 0;
    }
    info.lag = info.slots_held - info.slots_pinned;
    out.push_back(info);
  }
  return out;
}

void Actions::merge(Actions other) {
  for (auto& s : other.sends) sends.push_back(std::move(s));
  for (auto& r : other.reports) reports.push_back(std::move(r));
  for (auto& p : other.status_requests) status_requests.push_back(std::move(p));
  members_changed = members_changed || other.members_changed;
}

void Membership::send(Actions& out, const std::string& peer, std::shared_ptr<const std::string> bytes) {
  out.sends.push_back(Actions::Send{peer, std::move(bytes)});
}

// To every member that still takes messages and, with epoch >= 0, takes part in it.
void Membership::broadcast(Actions& out, const protocol::Message& message, int64_t epoch) {
  auto bytes = std::make_shared<const std::string>(protocol::encode(message));
  for (const auto& [peer, m] : members_) {
    if (m.leaving || (epoch >= 0 && !m.takes_part_in(epoch))) continue;
    send(out, peer, bytes);
  }
}

std::shared_ptr<const std::string> Membership::encode_batch(protocol::Announcement batch) const {
  batch.pin_budget = pin_budget();
  return std::make_shared<const std::string>(protocol::encode(batch));
}

// ---- messages from consumers ----------------------------------------------

Actions Membership::on_message(const std::string& peer, const void* data, std::size_t size) {
  Actions out;
  protocol::Message msg;
  try {
    msg = protocol::decode(data, size);
  } catch (const protocol::VersionMismatch& e) {
    refuse(out, peer,
           "producer '" + options_.name + "' speaks batchcast protocol " +
               std::to_string(protocol::kVersion) + " but this consumer speaks " +
               std::to_string(e.version()) + "; install the same batchcast version on both");
    return out;
  } catch (const MalformedMessage&) {
    counters_.dropped_messages += 1;
    return out;
  }
  namespace pr = protocol;
  auto member = members_.find(peer);
  const bool known = member != members_.end();
  auto dropped = [&](const auto&) { counters_.dropped_messages += 1; };
  std::visit(
      pr::Exhaustive{
          [&](pr::StatusRequest&) { out.status_requests.push_back(peer); },  // from anyone
          [&](pr::Hello& hello) {
            if (known || hello.pid <= 0) {
              counters_.dropped_messages += 1;
            } else {
              join(peer, hello, out);
            }
          },
          // From members only; the late words of a consumer already
          // forgotten are expected, and ignored.
          [&](pr::Release& release) {
            if (!known) return;
            Member& m = member->second;
            for (uint64_t seq : release.seqs) {
              if (slots_.is_held(seq)) m.released_upto = std::max(m.released_upto, seq);
              slots_.release(seq, peer);
            }
            forget_if_done(peer, out);
          },
          [&](pr::Bye&) {
            if (!known) return;
            Member& m = member->second;
            if (!m.leaving) {
              stop(m, out);
              counters_.leaves += 1;
              out.members_changed = true;
              report(out, Report::Level::Info, who(m) + " left");
              break_group(peer, "left", out);
            }
            forget_if_done(peer, out);
          },
          [&](pr::Mapped&) {
            if (!known) return;
            Member& m = member->second;
            if (m.unread_ring) {
              m.unread_ring = false;
              out.members_changed = true;  // a closing producer may be waiting for this
            }
          },
          [&](pr::Unmapped&) {
            if (!known) return;
            // It references nothing: what it still holds are announcements it never took.
            Member& m = member->second;
            if (!m.leaving) {
              counters_.leaves += 1;
              report(out, Report::Level::Info, who(m) + " left");
              break_group(peer, "left", out);
            }
            remove(peer, Departure::Unmapped, out);
          },
          // What producers send: never to a producer.
          [&](pr::Heartbeat& x) { dropped(x); },
          [&](pr::Welcome& x) { dropped(x); },
          [&](pr::Refuse& x) { dropped(x); },
          [&](pr::Announcement& x) { dropped(x); },
          [&](pr::EpochEnd& x) { dropped(x); },
          [&](pr::LoaderFailed& x) { dropped(x); },
          [&](pr::Finished& x) { dropped(x); },
          [&](pr::RingReady& x) { dropped(x); },
          [&](pr::Evicted& x) { dropped(x); },
          [&](pr::Status& x) { dropped(x); },
          [&](pr::GroupReady& x) { dropped(x); },
          [&](pr::GroupBroken& x) { dropped(x); },
          [&](pr::MailboxReady& x) { dropped(x); },
      },
      msg);
  return out;
}

Actions Membership::on_malformed() {
  counters_.dropped_messages += 1;
  return {};
}

void Membership::refuse(Actions& out, const std::string& peer, std::string reason) {
  counters_.refused += 1;
  send(out, peer, std::make_shared<const std::string>(protocol::encode(protocol::Refuse{std::move(reason)})));
}

// A batch to one member, framed in its epochs (as the join plan says), and
// its own epoch's end after it; false if it is not one of its epochs'.
bool Membership::hand(Actions& out, const std::string& peer, Member& m,
                      const std::shared_ptr<const protocol::Announcement>& batch,
                      std::map<int64_t, std::shared_ptr<const std::string>>& encoded) {
  const protocol::Announcement& a = *batch;
  const Framed f = plan_.frame(m.frame, a.epoch, a.index, a.position, a.samples);
  if (!f.in_epochs) return false;
  if (!f.broken.empty()) {  // it alone cannot go on
    send(out, peer, std::make_shared<const std::string>(protocol::encode(protocol::LoaderFailed{f.epoch, f.broken})));
    report(out, Report::Level::Notice, who(m) + ": " + f.broken);
    stop(m, out);
    return false;
  }
  auto& bytes = encoded[m.frame.joined_at];
  if (!bytes) {
    protocol::Announcement framed = a;
    framed.epoch = f.epoch;
    framed.position = f.position;
    framed.index = f.index;
    bytes = encode_batch(std::move(framed));
  }
  m.batches_sent += 1;
  m.sent_upto = std::max(m.sent_upto, a.seq);
  send(out, peer, bytes);
  if (!f.ends_epoch) return true;
  send(out, peer, std::make_shared<const std::string>(protocol::encode(
                      protocol::EpochEnd{f.epoch, plan_.samples_per_epoch(), plan_.batches_per_epoch()})));
  if (f.last) {  // its last whole epoch: nothing more comes to it
    send(out, peer, std::make_shared<const std::string>(protocol::encode(protocol::Finished{f.epoch + 1, false})));
    stop(m, out);
  }
  return true;
}

void Membership::stop(Member& m, Actions& out) {
  m.leaving = true;
  plan_.left(m.id);
  out.members_changed = true;
}

// A rank went (`what`: left, exited, was evicted). A forming group only loses
// that rank; a complete one is over: every other rank is told and gets
// nothing more, so none of them waits for the missing one.
void Membership::break_group(const std::string& peer, const std::string& what, Actions& out) {
  auto member = members_.find(peer);
  if (member == members_.end() || member->second.group == 0) return;
  const protocol::Hello& hello = member->second.hello;
  const auto g = groups_.rank_went(member->second.group, hello.rank);
  if (!g) return;  // forming (it only lost that rank), or broken already
  // (every rank's epochs are the group's: the same own epoch for each)
  const int64_t epoch = plan_.own_epoch(member->second.frame);
  const std::string reason =
      "rank " + std::to_string(hello.rank) + " (pid " + std::to_string(member->second.pid) +
      ") of consumer group '" + g->name + "' of batchcast producer '" + options_.name + "' " + what +
      "; from epoch " + std::to_string(epoch) +
      " the group's other ranks get no more batches (they would wait for it forever). Restart the "
      "whole group (torchrun's --max-restarts does); a restarted group starts at the next epoch";
  auto bytes = std::make_shared<const std::string>(protocol::encode(protocol::GroupBroken{epoch, reason}));
  for (const auto& [rank, other] : g->ranks) {
    auto m = members_.find(other);
    if (other == peer || m == members_.end() || m->second.leaving) continue;
    send(out, other, bytes);
    stop(m->second, out);
  }
  counters_.groups_broken += 1;
  out.members_changed = true;
  report(out, what == "left" ? Report::Level::Info : Report::Level::Notice,
         "consumer group '" + g->name + "' of producer '" + options_.name + "' ended: rank " +
             std::to_string(hello.rank) + " " + what);
}

// A member that said goodbye is forgotten once it holds nothing (and has
// unmapped a GPU ring); until then its slots stay its own.
void Membership::forget_if_done(const std::string& peer, Actions& out) {
  auto m = members_.find(peer);
  if (m == members_.end() || !m->second.leaving || m->second.mapped) return;
  if (slots_.holds_any(peer)) return;
  members_.erase(m);
  out.members_changed = true;
}

void Membership::remove(const std::string& peer, Departure how, Actions& out) {
  auto m = members_.find(peer);
  if (m == members_.end()) return;
  if (how == Departure::Crashed) {
    counters_.crashes += 1;
    report(out, Report::Level::Notice, who(m->second) + " exited without leaving; what it held is freed");
    break_group(peer, "exited without leaving", out);
  }
  plan_.left(m->second.id);
  members_.erase(m);
  out.members_changed = true;
  slots_.release_all(peer);
}

// ---- the producer's stream --------------------------------------------------

Actions Membership::on_ring(const protocol::Ring& ring) {
  Actions out;
  options_.ring = ring;
  for (auto& [peer, m] : members_) {
    if (!m.leaving && ring.on_gpu()) m.mapped = true;
    if (!m.leaving) m.unread_ring = true;
  }
  broadcast(out, protocol::RingReady{ring});
  return out;
}

Actions Membership::on_epoch_begin(int64_t epoch) {
  plan_.on_epoch_begin(epoch);  // newcomers may still join this epoch until its first batch
  return {};
}

Actions Membership::on_batch(protocol::Announcement batch, Clock::time_point now) {
  Actions out;
  if (batch.epoch != plan_.epoch_in_progress()) end_retention();
  const int64_t position = plan_.on_batch(batch.epoch, batch.index, batch.samples);
  const int64_t epoch = batch.epoch;
  const bool retained = plan_.retains_batch();
  if (!retained) end_retention();
  auto shared = std::make_shared<const protocol::Announcement>(std::move(batch));
  if (retained) retained_.push_back(shared->seq);
  std::set<std::string> holders;
  std::map<int64_t, std::shared_ptr<const std::string>> encoded;  // by where members' epochs begin
  for (auto& [peer, m] : members_) {
    if (m.leaving || !m.takes_part_in(epoch)) continue;
    if (hand(out, peer, m, shared, encoded)) holders.insert(peer);
  }
  slots_.deliver(shared->seq, std::move(holders), retained, now, shared, position);
  return out;
}

Actions Membership::on_epoch_end(const protocol::EpochEnd& end) {
  Actions out;
  end_retention();
  last_end_ = end;
  const std::string broken = plan_.on_epoch_end(end.epoch, end.samples, end.batches);
  auto bytes = std::make_shared<const std::string>(protocol::encode(end));
  for (auto& [peer, m] : members_) {
    if (m.leaving || !m.takes_part_in(end.epoch)) continue;
    if (m.frame.joined_at == 0) {
      send(out, peer, bytes);
    } else if (!broken.empty()) {  // its epochs span the producer's: one of another length breaks them
      send(out, peer, std::make_shared<const std::string>(
                          protocol::encode(protocol::LoaderFailed{plan_.own_epoch(m.frame), broken})));
      stop(m, out);
    }
  }
  return out;
}

Actions Membership::on_loader_failed(const protocol::LoaderFailed& failed) {
  Actions out;
  broadcast(out, failed);
  return out;
}

Actions Membership::on_finished(const protocol::Finished& finished) {
  Actions out;
  finished_ = std::make_shared<const std::string>(protocol::encode(finished));
  for (const auto& [peer, m] : members_) {
    if (!m.leaving) send(out, peer, finished_);
  }
  return out;
}

void Membership::end_retention() {
  auto retained = std::move(retained_);
  retained_.clear();
  for (uint64_t seq : retained) {
    slots_.unretain(seq);
  }
}

// ---- liveness and stragglers ------------------------------------------------

Actions Membership::on_sweep(const std::function<bool(int64_t)>& alive, bool waiting_for_space,
                             Clock::time_point now, const std::function<bool(const std::string&)>& waits) {
  Actions out;
  std::vector<std::string> dead;
  for (const auto& [peer, m] : members_) {
    if (!alive(m.pid)) dead.push_back(peer);
  }
  for (const auto& peer : dead) remove(peer, Departure::Crashed, out);
  const double since_last = last_sweep_ ? std::chrono::duration<double>(now - *last_sweep_).count() : 0;
  last_sweep_ = now;
  holding_up_.clear();
  if (!waiting_for_space) {
    holdup_.not_waiting();
    return out;
  }
  const Holdup::Verdict v = holdup_.judge(
      slots_,
      [this](const std::string& peer) {
        const Member& m = members_.at(peer);
        return HolderFacts{m.pid, m.released_upto, m.sent_upto, m.leaving};
      },
      waits, now);
  if (!v.stuck.empty()) report(out, Report::Level::Notice, v.stuck_log);
  for (const auto& e : v.stuck) evict(e.peer, e.reason, e.logged, e.why_for_group, out);
  if (out.members_changed || v.waited_for.empty()) return out;  // evicted (or crashed): look again next time
  holding_up_ = v.waited_for;
  members_.at(v.waited_for).stall_seconds += since_last;
  if (v.straggler) evict(v.straggler->peer, v.straggler->reason, v.straggler->logged, v.straggler->why_for_group, out);
  return out;
}

// It gets nothing more. What it references stays valid: the consumer
// releases everything else when it reads this, and the rest when freed.
void Membership::evict(const std::string& peer, const std::string& reason, const std::string& logged,
                       const std::string& why_for_group, Actions& out) {
  Member& m = members_.at(peer);
  const std::string told = "batchcast producer '" + options_.name + "' evicted this consumer (pid " +
                           std::to_string(m.pid) + "): " + reason;
  send(out, peer, std::make_shared<const std::string>(protocol::encode(protocol::Evicted{told})));
  stop(m, out);
  counters_.evictions += 1;
  break_group(peer, "was evicted (" + why_for_group + ")", out);
  report(out, Report::Level::Notice, who(m) + " was evicted: " + logged);
}

}  // namespace batchcast
