// The consumer's rules, in-process and without I/O: what a consumer sends,
// maps and hands out for each message and local event — join, validation of
// every message, leaving, finishing, draining, the producer lost, groups and
// a late ring.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/consumer/session.h"

using namespace batchcast;
namespace pr = protocol;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kProducerPid = 4242;
constexpr uint64_t kRingBytes = 1 << 20;

pr::Ring host_ring() {
  pr::Ring r;
  r.fd = 7;
  r.bytes = kRingBytes;
  return r;
}

pr::Announcement batch(uint64_t seq, int64_t index = 0, uint64_t offset = 0, int64_t rows = 4) {
  pr::Announcement a;
  a.epoch = 0;
  a.index = index;
  a.seq = seq;
  a.samples = rows;
  pr::TensorLeaf t;
  t.dtype = pr::DType::Float32;
  t.shape = {rows, 8};
  t.offset = offset;
  a.leaves.emplace_back(t);
  return a;
}

// Drives a Session as a Channel would (mapping at once when asked) and
// records what it sends.
struct Harness {
  explicit Harness(int32_t world_size = 0) : s([&] {
    SessionOptions o;
    o.name = "p";
    o.hello.pid = 99;
    o.hello.world_size = world_size;
    o.hello.group = world_size > 0 ? "g" : "";
    return o;
  }()) {
    act(s.start());
  }

  Session s;
  std::vector<pr::Message> sent;
  int maps = 0;
  int mailboxes = 0;
  int unmaps = 0;
  bool news = false;
  int32_t ring_events = 0;
  Clock::time_point now = Clock::time_point{} + 1h;

  void act(SessionActions a) {
    news = news || a.news;
    if (a.mailbox) mailboxes += 1;
    if (a.map) {
      maps += 1;
      SessionActions more = s.on_mapped(RingExtent{a.map->bytes, ring_events});
      a.map.reset();
      a.merge(std::move(more));
    }
    if (a.unmap) {
      unmaps += 1;
      s.on_unmapped();
    }
    for (auto& m : a.sends) sent.push_back(std::move(m));
  }
  void say(const pr::Message& m) {
    const std::string bytes = pr::encode(m);
    act(s.on_message(bytes.data(), bytes.size()));
  }
  void welcome(pr::Ring ring = host_ring()) {
    pr::Welcome w;
    w.producer_pid = kProducerPid;
    w.run = 7;
    w.ring = std::move(ring);
    w.consumer_id = 1;
    w.slots = 8;
    say(w);
  }
  void tick(bool producer_alive = true, int64_t in_flight = 0) {
    act(s.on_tick([&](int64_t pid) { return pid != kProducerPid || producer_alive; }, now, in_flight));
  }
  // Kinds sent, in order.
  std::vector<pr::Kind> kinds() const {
    std::vector<pr::Kind> k;
    for (const auto& m : sent) k.push_back(std::visit([](const auto& x) { return pr::kind_of<std::decay_t<decltype(x)>>(); }, m));
    return k;
  }
  // Every seq released, in order.
  std::vector<uint64_t> released() const {
    std::vector<uint64_t> seqs;
    for (const auto& m : sent) {
      if (const auto* r = std::get_if<pr::Release>(&m)) seqs.insert(seqs.end(), r->seqs.begin(), r->seqs.end());
    }
    return seqs;
  }
  uint64_t taken_seq() {
    auto m = s.take();
    EXPECT_TRUE(m.has_value());
    if (!m) return 0;
    const auto* a = std::get_if<pr::Announcement>(&*m);
    EXPECT_NE(a, nullptr);
    return a ? a->seq : 0;
  }
};

using K = pr::Kind;

}  // namespace

TEST(Session, SaysHelloThenMapsTheRingItIsWelcomedTo) {
  Harness h;
  ASSERT_EQ(h.kinds(), (std::vector<K>{K::Hello}));
  EXPECT_EQ(std::get<pr::Hello>(h.sent[0]).pid, 99);
  EXPECT_EQ(h.s.phase(), Session::Phase::Joining);
  h.welcome();
  EXPECT_EQ(h.s.phase(), Session::Phase::Member);
  EXPECT_EQ(h.maps, 1);
  EXPECT_EQ(h.kinds(), (std::vector<K>{K::Hello, K::Mapped}));
  EXPECT_FALSE(h.s.take().has_value());
}

// The mailbox comes once, after the Welcome; the messages that come through
// it are the same messages, validated the same way.
TEST(Session, OpensTheMailboxItIsGivenOnceAfterTheWelcome) {
  const pr::MailboxReady ready{5, 4096 + 2048, 1024, 1024, 6, 7};
  Harness h;
  h.say(ready);  // before the Welcome: dropped
  EXPECT_EQ(h.mailboxes, 0);
  EXPECT_EQ(h.s.dropped(), 1);
  h.welcome();
  h.say(ready);
  EXPECT_EQ(h.mailboxes, 1);
  h.say(ready);  // a second one: dropped
  EXPECT_EQ(h.mailboxes, 1);
  EXPECT_EQ(h.s.dropped(), 2);
  h.say(batch(3));
  EXPECT_EQ(h.taken_seq(), 3u);
}

TEST(Session, AMailboxGivenAfterLeavingIsStillOpened) {
  // What the producer sent through it before it heard the Bye is released.
  Harness h;
  h.welcome();
  h.act(h.s.leave());
  h.say(pr::MailboxReady{5, 4096 + 2048, 1024, 1024, 6, 7});
  EXPECT_EQ(h.mailboxes, 1);
  h.say(batch(4));
  EXPECT_EQ(h.released(), (std::vector<uint64_t>{4}));
}

TEST(Session, HandsOutBatchesAndEpochEndsInOrder) {
  Harness h;
  h.welcome();
  h.say(batch(1, 0));
  h.say(batch(2, 1, 4 * 8 * 4));
  h.say(pr::EpochEnd{0, 8, 2});
  EXPECT_TRUE(h.news);
  EXPECT_EQ(h.taken_seq(), 1u);
  EXPECT_EQ(h.taken_seq(), 2u);
  auto end = h.s.take();
  ASSERT_TRUE(end && std::holds_alternative<pr::EpochEnd>(*end));
  EXPECT_EQ(std::get<pr::EpochEnd>(*end).batches, 2);
  EXPECT_FALSE(h.s.take().has_value());
  EXPECT_EQ(h.s.received(), 2);
  EXPECT_EQ(h.s.dropped(), 0);
}

TEST(Session, DropsAndCountsWhatItCannotTrust) {
  Harness h;
  h.say(pr::EpochEnd{0, 1, 1});     // before the welcome
  h.say(pr::Evicted{"x"});          // before the welcome
  h.say(batch(1));                  // before the welcome (no ring)
  EXPECT_EQ(h.s.dropped(), 3);
  h.welcome(pr::Ring{});            // no ring yet
  h.say(batch(2));                  // before the ring
  h.say(pr::RingReady{host_ring()});
  ASSERT_EQ(h.maps, 1);
  h.say(batch(3, 0, kRingBytes - 16));    // its 128 bytes reach past the ring
  h.say(batch(4, 0, kRingBytes + 1));     // starts past it
  pr::Announcement bad_event = batch(5);
  bad_event.event = 0;                    // a host ring has no slot events
  h.say(bad_event);
  h.say(pr::Welcome{});                   // a second welcome
  h.say(pr::GroupReady{});                // to a consumer of no group
  h.say(pr::Hello{});                     // what consumers send
  h.say(pr::Release{{1}});
  h.say(pr::StatusRequest{});
  const std::string garbage = "\x01\x02not a message";
  h.act(h.s.on_message(garbage.data(), garbage.size()));
  h.act(h.s.on_malformed());
  EXPECT_EQ(h.s.dropped(), 3 + 11);
  EXPECT_FALSE(h.s.take().has_value());  // nothing of it was handed out
  EXPECT_EQ(h.s.phase(), Session::Phase::Member);
  h.say(batch(6));
  EXPECT_EQ(h.taken_seq(), 6u);          // and it still works
}

TEST(Session, ChecksSlotEventsOfAGpuRing) {
  Harness h;
  h.ring_events = 4;
  h.welcome();
  pr::Announcement a = batch(1);
  a.event = -1;
  h.say(a);
  a.event = 4;
  h.say(a);
  a.event = 3;
  h.say(a);
  EXPECT_EQ(h.s.dropped(), 2);
  EXPECT_EQ(std::get<pr::Announcement>(*h.s.take()).event, 3);
}

TEST(Session, RefusedBeforeTheWelcomeFailsWithTheProducersReason) {
  Harness h;
  h.say(pr::Refuse{"protocol 9 is not this producer's"});
  EXPECT_TRUE(h.s.failed());
  EXPECT_TRUE(h.news);
  EXPECT_EQ(h.kinds(), (std::vector<K>{K::Hello, K::Bye}));
  try {
    h.s.take();
    FAIL() << "take() should throw";
  } catch (const Refused& e) {
    EXPECT_STREQ(e.what(), "protocol 9 is not this producer's");
  }
}

TEST(Session, LeavingSaysByeAndReleasesWhatIsQueuedAndWhatStillComes) {
  Harness h;
  h.welcome();
  h.say(batch(1));
  h.say(batch(2));
  h.say(batch(3));
  EXPECT_EQ(h.taken_seq(), 1u);
  h.s.hold(1);
  h.act(h.s.leave());
  EXPECT_EQ(h.s.phase(), Session::Phase::Leaving);
  EXPECT_EQ(h.kinds(), (std::vector<K>{K::Hello, K::Mapped, K::Bye, K::Release}));
  EXPECT_EQ(h.released(), (std::vector<uint64_t>{2, 3}));
  h.say(batch(4));                      // announced before the producer read the Bye
  h.say(pr::EpochEnd{0, 16, 4});
  EXPECT_EQ(h.released(), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_FALSE(h.s.take().has_value());
  h.act(h.s.leave());                   // a second close says nothing more
  EXPECT_EQ(h.kinds().size(), 5u);
  // Slot 1 is still referenced: the mapping stays.
  h.tick();
  EXPECT_EQ(h.unmaps, 0);
  h.s.unreferenced(1);
  h.act(h.s.on_released(1));
  h.tick();
  EXPECT_EQ(h.unmaps, 1);
  EXPECT_EQ(h.s.phase(), Session::Phase::Unmapped);
  EXPECT_EQ(h.kinds().back(), K::Unmapped);
  EXPECT_EQ(h.released(), (std::vector<uint64_t>{2, 3, 4, 1}));
}

TEST(Session, DrainingWaitsForEverySlotItStillHolds) {
  Harness h;
  h.welcome();
  h.say(batch(1));
  h.say(batch(2));
  h.say(batch(3));
  h.say(pr::Finished{1});
  EXPECT_EQ(h.s.phase(), Session::Phase::Leaving);  // nothing more will come
  EXPECT_TRUE(h.s.producer_gone());
  const uint64_t kept = h.taken_seq();      // referenced by tensors
  h.s.hold(kept);
  const uint64_t gpu = h.taken_seq();       // referenced, then waiting for the GPU
  h.s.hold(gpu);
  const uint64_t unused = h.taken_seq();    // taken, not yet held or released
  h.tick();
  EXPECT_EQ(h.unmaps, 0) << "batches are still queued or taken";
  ASSERT_TRUE(std::holds_alternative<pr::Finished>(*h.s.take()));
  h.act(h.s.release_now(unused));
  h.s.unreferenced(gpu);
  EXPECT_EQ(h.s.referenced(), (std::set<uint64_t>{kept}));
  EXPECT_EQ(h.s.slots_held(), 2);           // the GPU one is still held, kept by nothing
  h.s.unreferenced(kept);
  h.act(h.s.on_released(kept));
  h.tick();
  EXPECT_EQ(h.unmaps, 0) << "slot " << gpu << " waits for the GPU";
  h.act(h.s.on_released(gpu));
  h.tick(true, /*in_flight=*/1);
  EXPECT_EQ(h.unmaps, 0) << "a release is in flight";
  h.tick();
  EXPECT_EQ(h.unmaps, 1);
  EXPECT_EQ(h.released(), (std::vector<uint64_t>{unused, kept, gpu}));
  EXPECT_EQ(h.kinds().back(), K::Unmapped);
  // Closing afterwards does not say Unmapped again.
  const std::size_t said = h.sent.size();
  h.act(h.s.close());
  EXPECT_EQ(h.sent.size(), said);
}

TEST(Session, AProducerGoneLongerThanTheGraceIsLost) {
  Harness h;
  h.welcome();
  h.say(batch(1));
  h.tick(false);
  h.now += Session::kProducerGrace;
  h.tick(false);
  EXPECT_FALSE(h.s.failed()) << "within the grace its last messages may still come";
  h.tick(true);                            // back (a pid check that raced): the clock restarts
  h.now += 10ms;
  h.tick(false);
  h.now += Session::kProducerGrace;
  h.tick(false);
  EXPECT_FALSE(h.s.failed());
  h.now += 1ms;
  h.tick(false);
  ASSERT_TRUE(h.s.failed());
  EXPECT_TRUE(h.news);
  EXPECT_EQ(h.released(), (std::vector<uint64_t>{1}));  // queued: not ours to keep
  try {
    h.s.take();
    FAIL() << "take() should throw";
  } catch (const ProducerLost& e) {
    EXPECT_NE(std::string(e.what()).find("'p' (pid 4242) exited or was killed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.unmaps, 1);  // it held nothing: the mapping went in the same tick
}

TEST(Session, TheFirstErrorWins) {
  Harness h;
  h.welcome();
  h.act(h.s.on_failed(std::make_exception_ptr(CudaError("first"))));
  h.act(h.s.on_failed(std::make_exception_ptr(SystemError("second", 5))));
  EXPECT_THROW(h.s.take(), CudaError);
  EXPECT_EQ(h.kinds(), (std::vector<K>{K::Hello, K::Mapped, K::Bye}));
}

TEST(Session, EvictedAfterTheWelcomeFails) {
  Harness h;
  h.welcome();
  h.say(pr::Evicted{"held slot 3 for 30 s"});
  EXPECT_THROW(h.s.take(), Evicted);
}

TEST(Session, LeftBeforeTheWelcomeCameMapsNothing) {
  Harness h;
  h.act(h.s.leave());
  h.welcome();
  EXPECT_EQ(h.maps, 0);
  h.say(batch(1));                   // before the ring it never mapped: released at once
  EXPECT_EQ(h.released(), (std::vector<uint64_t>{1}));
  h.tick();
  EXPECT_EQ(h.unmaps, 1);
  EXPECT_EQ(h.kinds(), (std::vector<K>{K::Hello, K::Bye, K::Release, K::Unmapped}));
}

TEST(Session, ARingAnnouncedAgainAfterTheWelcomeIsNotMappedTwice) {
  Harness h;
  h.welcome();
  h.say(pr::RingReady{host_ring()});   // joined between its creation and its announcement
  EXPECT_EQ(h.maps, 1);
  EXPECT_EQ(h.s.dropped(), 0);
  pr::Ring other = host_ring();
  other.fd = 8;
  h.say(pr::RingReady{other});         // another ring: never trusted
  EXPECT_EQ(h.maps, 1);
  EXPECT_EQ(h.s.dropped(), 1);
}

TEST(Session, AGroupRankGetsItsGroupsMessages) {
  Harness h(/*world_size=*/2);
  h.welcome();
  pr::GroupReady ready;
  h.say(ready);
  h.say(pr::GroupBroken{});
  EXPECT_TRUE(std::holds_alternative<pr::GroupReady>(*h.s.take()));
  EXPECT_TRUE(std::holds_alternative<pr::GroupBroken>(*h.s.take()));
  EXPECT_EQ(h.s.dropped(), 0);
}

TEST(Session, ClosingUnmapsAndTellsTheProducer) {
  Harness h;
  h.welcome();
  h.act(h.s.close());
  EXPECT_EQ(h.unmaps, 1);
  EXPECT_EQ(h.kinds().back(), K::Unmapped);
  EXPECT_FALSE(h.s.producer_gone());  // it is there to hear the last words
}

// Random sequences of every event a consumer sees, seeded: every slot the
// session accepted goes back to the producer exactly once (released by the
// session itself, or taken and then released), nothing invalid is handed
// out, nothing is handed out after leaving, and Unmapped is said once.
TEST(Session, RandomEventsReleaseEverySlotExactlyOnce) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
    Harness h;
    h.welcome();
    std::set<uint64_t> valid;     // well-formed announcements sent to it
    std::vector<uint64_t> held;   // taken and referenced by "tensors"
    std::set<uint64_t> releasing; // unreferenced, waiting for the "GPU"
    uint64_t next_seq = 1;
    bool left = false;
    for (int step = 0; step < 200; ++step) {
      const int what = static_cast<int>(rng() % 12);
      if (what <= 3) {                      // a batch
        const uint64_t seq = next_seq++;
        // Once it said Unmapped, the producer forgot it and what it held.
        if (h.s.phase() != Session::Phase::Unmapped) valid.insert(seq);
        h.say(batch(seq, static_cast<int64_t>(seq)));
      } else if (what == 4) {               // one that cannot be trusted
        h.say(batch(next_seq++, 0, kRingBytes - 8));
      } else if (what == 5) {
        h.say(pr::EpochEnd{0, 4, 1});
      } else if (what == 6 && h.s.failed()) {
        EXPECT_THROW(h.s.take(), ProducerLost);
      } else if (what == 6) {               // the trainer takes what is there
        while (auto m = h.s.take()) {
          ASSERT_FALSE(left) << "handed out after leaving";
          if (auto* a = std::get_if<pr::Announcement>(&*m)) {
            ASSERT_TRUE(valid.count(a->seq)) << "handed out an invalid announcement";
            if (chance(30)) {
              h.act(h.s.release_now(a->seq));
            } else {
              h.s.hold(a->seq);
              held.push_back(a->seq);
            }
          }
        }
      } else if (what == 7 && !held.empty()) {  // tensors die
        const std::size_t i = rng() % held.size();
        const uint64_t seq = held[i];
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
        h.s.unreferenced(seq);
        if (chance(50)) {
          h.act(h.s.on_released(seq));
        } else {
          releasing.insert(seq);
        }
      } else if (what == 8 && !releasing.empty()) {  // the GPU passes one
        const uint64_t seq = *releasing.begin();
        releasing.erase(releasing.begin());
        h.act(h.s.on_released(seq));
      } else if (what == 9 && chance(10)) {
        h.act(h.s.leave());
        left = true;
      } else if (what == 10 && chance(5)) {
        h.say(pr::Finished{1});  // what came before it is still handed out
      } else if (what == 11) {
        h.now += 100ms;
        h.tick(/*producer_alive=*/!chance(2), static_cast<int64_t>(releasing.size()));
        left = left || h.s.failed();
      }
    }
    // The end: the consumer closes and every tensor dies.
    h.act(h.s.leave());
    while (auto m = h.s.failed() ? std::nullopt : h.s.take()) {  // nothing queued is handed out
      ASSERT_TRUE(std::holds_alternative<pr::Finished>(*m) || std::holds_alternative<pr::EpochEnd>(*m))
          << "an announcement handed out after leaving";
    }
    for (uint64_t seq : held) {
      h.s.unreferenced(seq);
      h.act(h.s.on_released(seq));
    }
    for (uint64_t seq : releasing) h.act(h.s.on_released(seq));
    h.tick(true, 0);
    ASSERT_EQ(h.s.phase(), Session::Phase::Unmapped);
    h.act(h.s.close());
    std::multiset<uint64_t> released;
    for (uint64_t seq : h.released()) released.insert(seq);
    for (uint64_t seq : valid) EXPECT_EQ(released.count(seq), 1u) << "slot " << seq;
    EXPECT_EQ(released.size(), valid.size()) << "released a slot it was never given";
    const std::vector<K> kinds = h.kinds();
    EXPECT_EQ(std::count(kinds.begin(), kinds.end(), K::Unmapped), 1);
    EXPECT_LE(std::count(kinds.begin(), kinds.end(), K::Bye), 1);
  }
}
