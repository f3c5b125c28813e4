#include "batchcast/producer/slot_ledger.h"

#include <stdexcept>
#include <utility>

namespace batchcast {

namespace {

std::string slot_name(uint64_t seq) { return "slot " + std::to_string(seq); }

}  // namespace

const char* SlotLedger::name(State state) {
  switch (state) {
    case State::Reserved: return "reserved";
    case State::Leased: return "leased";
    case State::Writing: return "writing";
    case State::Queued: return "queued";
    case State::Held: return "held";
  }
  return "?";
}

SlotLedger::SlotLedger(std::function<void(uint64_t)> on_free) : on_free_(std::move(on_free)) {}

void SlotLedger::reserve(uint64_t seq) {
  if (!slots_.emplace(seq, State::Reserved).second) {
    throw std::logic_error("slot ledger: " + slot_name(seq) + " reserved while " + name(slots_.at(seq)));
  }
}

void SlotLedger::lease(uint64_t seq, Place place) {
  if (!slots_.emplace(seq, State::Leased).second) {
    throw std::logic_error("slot ledger: " + slot_name(seq) + " leased while " + name(slots_.at(seq)));
  }
  leased_.emplace(seq, std::move(place));
}

void SlotLedger::lease(uint64_t seq) { lease(seq, Place{}); }

const SlotLedger::Place* SlotLedger::leased(uint64_t seq) const {
  auto it = leased_.find(seq);
  return it == leased_.end() ? nullptr : &it->second;
}

std::vector<uint64_t> SlotLedger::leases() const {
  std::vector<uint64_t> out;
  for (const auto& [seq, place] : leased_) out.push_back(seq);
  return out;
}

void SlotLedger::move(uint64_t seq, State from_a, State from_b, State to, const char* event) {
  auto it = slots_.find(seq);
  if (it == slots_.end()) throw std::logic_error("slot ledger: " + slot_name(seq) + " " + event + " while free");
  if (it->second != from_a && it->second != from_b) {
    throw std::logic_error("slot ledger: " + slot_name(seq) + " " + event + " while " + name(it->second));
  }
  it->second = to;
}

void SlotLedger::write(uint64_t seq) {
  move(seq, State::Reserved, State::Leased, State::Writing, "written");
  leased_.erase(seq);
}

void SlotLedger::queue(uint64_t seq) { move(seq, State::Writing, State::Writing, State::Queued, "queued"); }

void SlotLedger::abandon(uint64_t seq) {
  auto it = slots_.find(seq);
  if (it == slots_.end() || it->second == State::Queued || it->second == State::Held) {
    throw std::logic_error("slot ledger: " + slot_name(seq) + " abandoned while " +
                           (it == slots_.end() ? "free" : name(it->second)) + " (only unannounced slots can be)");
  }
  free(seq);
}

void SlotLedger::deliver(uint64_t seq, std::set<std::string> holders, bool retained, Clock::time_point since,
                         std::shared_ptr<const protocol::Announcement> batch, int64_t position) {
  move(seq, State::Queued, State::Queued, State::Held, "delivered");
  auto it = held_.emplace(seq, Held{std::move(holders), retained, since, std::move(batch), position}).first;
  free_if_unheld(it);
}

void SlotLedger::add_holder(uint64_t seq, const std::string& holder) {
  auto it = held_.find(seq);
  if (it == held_.end()) throw std::logic_error("slot ledger: " + slot_name(seq) + " given to a newcomer while not held");
  it->second.holders.insert(holder);
}

bool SlotLedger::release(uint64_t seq, const std::string& holder) {
  auto it = held_.find(seq);
  if (it == held_.end() || it->second.holders.erase(holder) == 0) return false;
  free_if_unheld(it);
  return true;
}

void SlotLedger::release_all(const std::string& holder) {
  for (auto it = held_.begin(); it != held_.end();) {
    auto next = std::next(it);
    if (it->second.holders.erase(holder) != 0) free_if_unheld(it);
    it = next;
  }
}

void SlotLedger::unretain(uint64_t seq) {
  auto it = held_.find(seq);
  if (it == held_.end()) return;  // freed meanwhile cannot be: retained slots are not freed
  it->second.retained = false;
  free_if_unheld(it);
}

void SlotLedger::free_if_unheld(std::map<uint64_t, Held>::iterator it) {
  if (!it->second.holders.empty() || it->second.retained) return;
  const uint64_t seq = it->first;
  held_.erase(it);
  free(seq);
}

void SlotLedger::free(uint64_t seq) {
  slots_.erase(seq);
  leased_.erase(seq);
  freed_ += 1;
  if (on_free_) on_free_(seq);
}

SlotLedger::State SlotLedger::state(uint64_t seq) const {
  auto it = slots_.find(seq);
  if (it == slots_.end()) throw std::logic_error("slot ledger: " + slot_name(seq) + " is free");
  return it->second;
}

bool SlotLedger::is_held(uint64_t seq) const { return held_.count(seq) != 0; }

bool SlotLedger::holds_any(const std::string& holder) const {
  for (const auto& [seq, h] : held_) {
    if (h.holders.count(holder) != 0) return true;
  }
  return false;
}

int64_t SlotLedger::count(State state) const {
  int64_t n = 0;
  for (const auto& [seq, s] : slots_) n += s == state ? 1 : 0;
  return n;
}

void SlotLedger::check() const {
  for (const auto& [seq, s] : slots_) {
    const bool has_record = held_.count(seq) != 0;
    if ((s == State::Held) != has_record) {
      throw std::logic_error("slot ledger: " + slot_name(seq) + " is " + name(s) +
                             (has_record ? " with" : " without") + " a held record");
    }
    const bool has_place = leased_.count(seq) != 0;
    if ((s == State::Leased) != has_place) {
      throw std::logic_error("slot ledger: " + slot_name(seq) + " is " + name(s) +
                             (has_place ? " with" : " without") + " a lease's place");
    }
  }
  if (leased_.size() > slots_.size()) throw std::logic_error("slot ledger: a lease's place for a free slot");
  for (const auto& [seq, h] : held_) {
    if (slots_.count(seq) == 0) throw std::logic_error("slot ledger: a held record for free " + slot_name(seq));
    if (h.holders.empty() && !h.retained) {
      throw std::logic_error("slot ledger: " + slot_name(seq) + " is held by nobody and not retained");
    }
  }
}

}  // namespace batchcast
