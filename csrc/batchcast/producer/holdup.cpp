#include "batchcast/producer/holdup.h"

#include <map>

namespace batchcast {

Holdup::Holdup(std::string producer, int64_t slots, double straggler_timeout)
    : producer_(std::move(producer)), slots_(slots), straggler_timeout_(straggler_timeout) {}

void Holdup::not_waiting() {
  stuck_since_.reset();
  stuck_.clear();
}

Holdup::Verdict Holdup::judge(const SlotLedger& slots, const std::function<HolderFacts(const std::string&)>& facts,
                              const std::function<bool(const std::string&)>& waits, Clock::time_point now) {
  Verdict v;
  check_stuck(slots, facts, waits, now, v);
  if (!v.stuck.empty()) return v;
  std::string slowest, waiting;
  Clock::time_point oldest = now, waiting_since = now;
  bool coming_back = false;
  for (const auto& [seq, hold] : slots.held()) {
    for (const auto& peer : hold.holders) {
      const HolderFacts m = facts(peer);
      if (seq < m.released_upto) continue;
      if (m.leaving) {
        coming_back = true;
      } else if (seq >= m.sent_upto) {
        if (hold.since < waiting_since) {
          waiting = peer;
          waiting_since = hold.since;
        }
      } else if (hold.since < oldest) {
        slowest = peer;
        oldest = hold.since;
      }
    }
  }
  if (slowest.empty() && !coming_back) {
    slowest = waiting;
    oldest = waiting_since;
  }
  v.waited_for = slowest;
  if (slowest.empty()) return v;
  const double held = std::chrono::duration<double>(now - oldest).count();
  if (straggler_timeout_ > 0 && held >= straggler_timeout_) {
    const std::string s = std::to_string(static_cast<int>(held));
    v.straggler = Eviction{slowest,
                           "it left a batch unconsumed for " + s + " s while the others waited (straggler_timeout=" +
                               std::to_string(straggler_timeout_) + " s); consume faster, or raise the timeout",
                           "it left a batch unconsumed for " + s + " s (straggler_timeout)", "straggler_timeout"};
  }
  return v;
}

void Holdup::check_stuck(const SlotLedger& slots, const std::function<HolderFacts(const std::string&)>& facts,
                         const std::function<bool(const std::string&)>& waits, Clock::time_point now, Verdict& v) {
  struct Holding {
    int64_t pid = 0;
    int64_t held = 0;
    int64_t kept = 0;
  };
  std::map<std::string, Holding> holding;
  bool standing = static_cast<bool>(waits) && !slots.held().empty();
  for (const auto& [seq, hold] : slots.held()) {
    for (const auto& peer : hold.holders) {
      const HolderFacts m = facts(peer);
      Holding& h = holding[peer];
      h.pid = m.pid;
      h.held += 1;
      h.kept += seq < m.released_upto ? 1 : 0;
      standing = standing && !m.leaving;
    }
  }
  for (const auto& [peer, h] : holding) standing = standing && waits(peer);
  if (!standing || holding.empty()) {
    stuck_.clear();  // someone may still let go; the clock goes on while nothing is freed
    return;
  }
  if (!stuck_since_) stuck_since_ = now;
  std::string who, largest;
  int64_t most = -1;
  for (const auto& [peer, h] : holding) {
    who += (who.empty() ? "" : ", ") + std::string("pid ") + std::to_string(h.pid) + " holds " +
           std::to_string(h.held) + (h.held == 1 ? " slot" : " slots") +
           (h.kept > 0 ? " (" + std::to_string(h.kept) + " of batches it keeps)" : std::string());
    if (h.held > most) {
      most = h.held;
      largest = peer;
    }
  }
  stuck_ = "the ring is full and every consumer waits for its next batch: " + who;
  const double seconds = std::chrono::duration<double>(now - *stuck_since_).count();
  if (seconds < kStuckSeconds) return;
  v.stuck_log = "producer '" + producer_ + "' cannot go on: " + stuck_ + " (of " + std::to_string(slots_) +
                " slots); evicting the consumers that keep batches";
  std::vector<std::string> victims;
  for (const auto& [peer, h] : holding) {
    if (h.kept > 0) victims.push_back(peer);
  }
  if (victims.empty()) victims.push_back(largest);
  for (const auto& peer : victims) {
    const Holding& h = holding.at(peer);
    const std::string why = "its trainer references " + std::to_string(h.held) + " of the ring's slots (" +
                            std::to_string(h.kept) +
                            " of them batches it keeps) while every consumer waits for the next batch and "
                            "the ring is full, so nothing could move";
    const std::string fix = h.kept > 0 ? "keep .clone()s of the batches you store (e.g. x.clone()), not the "
                                         "batches themselves, or serve with more slots (slots=" +
                                             std::to_string(slots_) + " now)"
                                       : "serve with more slots (slots=" + std::to_string(slots_) +
                                             " now), or use a smaller batch size";
    v.stuck.push_back(Eviction{peer, why + "; " + fix, why, "its batches held the ring full"});
  }
  stuck_since_.reset();
  stuck_.clear();
}

}  // namespace batchcast
