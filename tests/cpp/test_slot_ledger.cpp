// The slot ledger, in-process: every transition of a slot's life, the events
// that do not fit a state, and seeded random event sequences checked against
// a model of what must hold — no slot freed while held, none lost, none
// leased or freed twice.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "batchcast/producer/slot_ledger.h"

using namespace batchcast;
using State = SlotLedger::State;

namespace {

struct Harness {
  std::vector<uint64_t> freed;  // in the order the ledger freed them
  SlotLedger ledger{[this](uint64_t seq) { freed.push_back(seq); }};

  void announce(uint64_t seq, std::set<std::string> holders, bool retained = false) {
    ledger.reserve(seq);
    ledger.write(seq);
    ledger.queue(seq);
    ledger.deliver(seq, std::move(holders), retained, SlotLedger::Clock::time_point{}, nullptr, 0);
    ledger.check();
  }
};

}  // namespace

TEST(SlotLedger, APublishedSlotGoesReservedWritingQueuedHeldAndIsFreedByItsLastHolder) {
  Harness h;
  h.ledger.reserve(1);
  EXPECT_EQ(h.ledger.state(1), State::Reserved);
  h.ledger.write(1);
  EXPECT_EQ(h.ledger.state(1), State::Writing);
  h.ledger.queue(1);
  EXPECT_EQ(h.ledger.state(1), State::Queued);
  h.ledger.deliver(1, {"a", "b"}, false, {}, nullptr, 0);
  EXPECT_EQ(h.ledger.state(1), State::Held);
  h.ledger.check();
  EXPECT_TRUE(h.ledger.release(1, "a"));
  EXPECT_TRUE(h.freed.empty());  // b still holds it
  EXPECT_FALSE(h.ledger.release(1, "a"));  // a second release changes nothing
  EXPECT_TRUE(h.freed.empty());
  EXPECT_TRUE(h.ledger.release(1, "b"));
  EXPECT_EQ(h.freed, std::vector<uint64_t>{1});
  EXPECT_FALSE(h.ledger.contains(1));
  EXPECT_EQ(h.ledger.freed(), 1);
  h.ledger.check();
}

TEST(SlotLedger, ALeasedSlotIsWrittenByItsPublishOrComesBackUnused) {
  Harness h;
  h.ledger.lease(1);
  h.ledger.lease(2);
  EXPECT_EQ(h.ledger.count(State::Leased), 2);
  h.ledger.write(1);
  h.ledger.queue(1);
  h.ledger.abandon(2);  // the worker died: the lease goes back
  EXPECT_EQ(h.freed, std::vector<uint64_t>{2});
  EXPECT_EQ(h.ledger.count(State::Leased), 0);
  EXPECT_EQ(h.ledger.state(1), State::Queued);
}

TEST(SlotLedger, WhereALeasedSlotLiesIsKeptWhileItIsLeased) {
  Harness h;
  h.ledger.lease(3, SlotLedger::Place{{0, 4096}, -1});
  h.ledger.lease(4, SlotLedger::Place{{8192, 12288}, -1});
  ASSERT_NE(h.ledger.leased(3), nullptr);
  EXPECT_EQ(h.ledger.leased(3)->offsets, (std::vector<uint64_t>{0, 4096}));
  EXPECT_EQ(h.ledger.leases(), (std::vector<uint64_t>{3, 4}));
  h.ledger.write(3);  // its publish claimed it
  EXPECT_EQ(h.ledger.leased(3), nullptr);
  h.ledger.abandon(4);
  EXPECT_EQ(h.ledger.leased(4), nullptr);
  EXPECT_TRUE(h.ledger.leases().empty());
  h.ledger.check();
}

TEST(SlotLedger, ASlotNobodyWasSentIsFreedAsItIsDelivered) {
  Harness h;
  h.announce(1, {});
  EXPECT_EQ(h.freed, std::vector<uint64_t>{1});
}

TEST(SlotLedger, ARetainedSlotStaysUntilRetentionEndsAndItsHoldersRelease) {
  Harness h;
  h.announce(1, {}, /*retained=*/true);
  EXPECT_TRUE(h.freed.empty());
  h.ledger.add_holder(1, "late");  // a consumer catching up holds it too
  h.ledger.unretain(1);
  EXPECT_TRUE(h.freed.empty());
  h.ledger.release(1, "late");
  EXPECT_EQ(h.freed, std::vector<uint64_t>{1});
}

TEST(SlotLedger, ACrashedConsumerFreesEveryonesShareOfWhatItHeld) {
  Harness h;
  h.announce(1, {"a"});
  h.announce(2, {"a", "b"});
  h.announce(3, {"b"});
  h.ledger.release_all("a");
  EXPECT_EQ(h.freed, std::vector<uint64_t>{1});  // 2 is still b's
  EXPECT_TRUE(h.ledger.holds_any("b"));
  EXPECT_FALSE(h.ledger.holds_any("a"));
  h.ledger.release_all("b");
  EXPECT_EQ(h.freed, (std::vector<uint64_t>{1, 2, 3}));
}

TEST(SlotLedger, EventsThatDoNotFitASlotsStateAreErrorsNamingTheSlot) {
  Harness h;
  h.ledger.lease(7);
  try {
    h.ledger.lease(7);
    FAIL() << "a slot leased twice";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("slot 7 leased while leased"), std::string::npos) << e.what();
  }
  EXPECT_THROW(h.ledger.reserve(7), std::logic_error);
  EXPECT_THROW(h.ledger.queue(7), std::logic_error);  // not written yet
  EXPECT_THROW(h.ledger.write(8), std::logic_error);  // free
  h.announce(9, {"a"});
  EXPECT_THROW(h.ledger.abandon(9), std::logic_error);  // announced: only its holders free it
  EXPECT_THROW(h.ledger.write(9), std::logic_error);
  EXPECT_THROW(h.ledger.add_holder(7, "b"), std::logic_error);  // not delivered
  EXPECT_FALSE(h.ledger.release(7, "a"));  // a consumer's release of what it does not hold
  EXPECT_FALSE(h.ledger.release(42, "a"));
  EXPECT_TRUE(h.freed.empty());
  h.ledger.check();
}

// Random event sequences against a model: each step picks an event that a
// producer and its consumers could cause (including late and repeated
// releases), applies it to the ledger and to the model, and checks that the
// ledger freed exactly the slots the model says are free now — never one
// still held, retained or being written — and each once.
TEST(SlotLedger, RandomEventsNeverFreeAHeldSlotAndLoseNone) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    Harness h;
    struct Model {
      State state;
      std::set<std::string> holders;
      bool retained = false;
    };
    std::map<uint64_t, Model> live;
    std::set<uint64_t> freed_model;
    const std::vector<std::string> peers{"a", "b", "c"};
    uint64_t next = 1;
    auto pick = [&](auto pred) -> uint64_t {
      std::vector<uint64_t> out;
      for (const auto& [seq, m] : live) {
        if (pred(m)) out.push_back(seq);
      }
      if (out.empty()) return 0;
      return out[std::uniform_int_distribution<std::size_t>(0, out.size() - 1)(rng)];
    };
    auto settle = [&](uint64_t seq) {
      auto it = live.find(seq);
      if (it->second.state == State::Held && it->second.holders.empty() && !it->second.retained) {
        live.erase(it);
        freed_model.insert(seq);
      }
    };
    for (int step = 0; step < 400; ++step) {
      const int event = std::uniform_int_distribution<int>(0, 10)(rng);
      const std::string peer = peers[std::uniform_int_distribution<std::size_t>(0, peers.size() - 1)(rng)];
      uint64_t seq = 0;
      switch (event) {
        case 0:
          h.ledger.reserve(next);
          live[next++] = {State::Reserved};
          break;
        case 1:
          h.ledger.lease(next);
          live[next++] = {State::Leased};
          break;
        case 2:
          if ((seq = pick([](const Model& m) { return m.state == State::Reserved || m.state == State::Leased; }))) {
            h.ledger.write(seq);
            live[seq].state = State::Writing;
          }
          break;
        case 3:
          if ((seq = pick([](const Model& m) { return m.state == State::Writing; }))) {
            h.ledger.queue(seq);
            live[seq].state = State::Queued;
          }
          break;
        case 4:
          if ((seq = pick([](const Model& m) {
                 return m.state == State::Reserved || m.state == State::Leased || m.state == State::Writing;
               }))) {
            h.ledger.abandon(seq);
            live.erase(seq);
            freed_model.insert(seq);
          }
          break;
        case 5:
          if ((seq = pick([](const Model& m) { return m.state == State::Queued; }))) {
            std::set<std::string> holders;
            for (const auto& p : peers) {
              if (rng() % 2) holders.insert(p);
            }
            const bool retained = rng() % 3 == 0;
            h.ledger.deliver(seq, holders, retained, {}, nullptr, 0);
            live[seq] = {State::Held, holders, retained};
            settle(seq);
          }
          break;
        case 6:
        case 7: {  // a release, possibly of a slot the peer does not hold, or a freed one
          seq = std::uniform_int_distribution<uint64_t>(1, next)(rng);
          const bool holds = live.count(seq) && live[seq].holders.count(peer);
          EXPECT_EQ(h.ledger.release(seq, peer), holds);
          if (holds) {
            live[seq].holders.erase(peer);
            settle(seq);
          }
          break;
        }
        case 8:
          h.ledger.release_all(peer);
          for (auto it = live.begin(); it != live.end();) {
            auto nxt = std::next(it);
            if (it->second.holders.erase(peer)) settle(it->first);
            it = nxt;
          }
          break;
        case 9:
          if ((seq = pick([](const Model& m) { return m.state == State::Held && m.retained; }))) {
            h.ledger.unretain(seq);
            live[seq].retained = false;
            settle(seq);
          }
          break;
        case 10:
          if ((seq = pick([](const Model& m) { return m.state == State::Held; }))) {
            h.ledger.add_holder(seq, peer);
            live[seq].holders.insert(peer);
          }
          break;
      }
      h.ledger.check();
      // Freed exactly what the model freed, each once.
      std::set<uint64_t> freed(h.freed.begin(), h.freed.end());
      ASSERT_EQ(freed.size(), h.freed.size()) << "seed " << seed << ": a slot freed twice";
      ASSERT_EQ(freed, freed_model) << "seed " << seed << " step " << step;
      for (const auto& [s, m] : live) {
        ASSERT_TRUE(h.ledger.contains(s)) << "seed " << seed << ": slot " << s << " lost";
        ASSERT_EQ(h.ledger.state(s), m.state) << "seed " << seed << ": slot " << s;
      }
      ASSERT_EQ(h.ledger.size(), static_cast<int64_t>(live.size()));
    }
  }
}
