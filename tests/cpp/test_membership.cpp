// The producer's membership rules, in-process and without I/O: join, leave,
// crash, evict, late join (next epoch, catch-up), lockstep, keeping, unmap,
// and seeded random kills — each a sequence of events and the messages and
// freed slots that must come out.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "batchcast/producer/membership.h"

using namespace batchcast;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kRun = 0x5eed;  // the run of every Harness's producer

// Drives a Membership and records what it says, peer by peer.
struct Harness {
  explicit Harness(MembershipOptions options = {})
      : m(
            [&] {
              if (options.name.empty()) options.name = "p";
              if (options.producer_pid == 0) options.producer_pid = 1;
              if (options.run == 0) options.run = kRun;
              return options;
            }(),
            slots) {}

  std::multiset<uint64_t> freed;
  SlotLedger slots{[this](uint64_t seq) { freed.insert(seq); }};
  Membership m;
  Clock::time_point now = Clock::time_point{} + 1h;
  std::map<std::string, std::vector<protocol::Message>> got;
  std::vector<Report> reports;
  std::set<int64_t> dead;
  uint64_t next_seq = 1;
  int64_t epoch = -1;
  int64_t index = 0;
  int64_t position = 0;

  void take(Actions a) {
    for (const auto& s : a.sends) got[s.peer].push_back(protocol::decode(s.bytes->data(), s.bytes->size()));
    slots.check();
    for (auto& r : a.reports) reports.push_back(r);
  }
  void say(const std::string& peer, const protocol::Message& msg) {
    std::string bytes = protocol::encode(msg);
    take(m.on_message(peer, bytes.data(), bytes.size()));
  }
  void hello(const std::string& peer, int64_t pid, bool catch_up = false) {
    say(peer, protocol::Hello{pid, catch_up ? protocol::Hello::kCatchUp : 0u});
  }
  void release(const std::string& peer, std::vector<uint64_t> seqs) { say(peer, protocol::Release{seqs}); }
  void rank(const std::string& peer, int64_t pid, const std::string& group, int32_t r, int32_t world,
            int64_t batch_size = 4) {
    protocol::Hello h;
    h.pid = pid;
    h.batch_size = batch_size;
    h.group = group;
    h.rank = r;
    h.world_size = world;
    say(peer, h);
  }
  // A state saved in run `run` of the producer (by default this one's).
  void resume(const std::string& peer, int64_t pid, int64_t e, int64_t pos, uint64_t run = kRun) {
    protocol::Hello h;
    h.pid = pid;
    h.resume_epoch = e;
    h.resume_position = pos;
    h.resume_run = run;
    say(peer, h);
  }
  void begin(int64_t e) {
    epoch = e;
    index = 0;
    position = 0;
    take(m.on_epoch_begin(e));
  }
  uint64_t batch(int64_t samples = 1) {
    protocol::Announcement a;
    a.epoch = epoch;
    a.index = index++;
    a.seq = next_seq++;
    a.samples = samples;
    a.position = position;
    position += samples;
    slots.reserve(a.seq);  // as the producer does: written, then announced
    slots.write(a.seq);
    slots.queue(a.seq);
    take(m.on_batch(a, now));
    return a.seq;
  }
  void end() { take(m.on_epoch_end(protocol::EpochEnd{epoch, position, index})); }
  void sweep(bool waiting = false) {
    take(m.on_sweep([&](int64_t pid) { return dead.count(pid) == 0; }, waiting, now));
  }
  // A sweep while the producer waits for space, `blocked` the consumers whose
  // trainers wait for their next batch.
  void sweep_blocked(const std::set<std::string>& blocked) {
    take(m.on_sweep([&](int64_t pid) { return dead.count(pid) == 0; }, true, now,
                    [&](const std::string& peer) { return blocked.count(peer) != 0; }));
  }

  template <typename T>
  std::vector<T> of(const std::string& peer) const {
    std::vector<T> out;
    auto it = got.find(peer);
    if (it == got.end()) return out;
    for (const auto& msg : it->second) {
      if (const auto* x = std::get_if<T>(&msg)) out.push_back(*x);
    }
    return out;
  }
  std::vector<uint64_t> seqs(const std::string& peer) const {
    std::vector<uint64_t> out;
    for (const auto& a : of<protocol::Announcement>(peer)) out.push_back(a.seq);
    return out;
  }
  bool said(const std::string& text) const {
    return std::any_of(reports.begin(), reports.end(),
                       [&](const Report& r) { return r.message.find(text) != std::string::npos; });
  }
};

MembershipOptions with(int64_t slots, int64_t window = 0, double straggler = 0) {
  MembershipOptions o;
  o.slots = slots;
  o.plan.catch_up_window = window;
  o.straggler_timeout = straggler;
  return o;
}

}  // namespace

TEST(Membership, AConsumerJoiningBeforeTheFirstBatchTakesPartInThatEpoch) {
  Harness h;
  h.begin(0);
  h.hello("a", 10);
  ASSERT_EQ(h.of<protocol::Welcome>("a").size(), 1u);
  EXPECT_EQ(h.of<protocol::Welcome>("a")[0].first_epoch, 0);
  uint64_t s = h.batch();
  h.hello("b", 11);  // after the first batch: the next epoch
  EXPECT_EQ(h.of<protocol::Welcome>("b")[0].first_epoch, 1);
  h.batch();
  h.end();
  EXPECT_EQ(h.seqs("a"), (std::vector<uint64_t>{s, s + 1}));
  EXPECT_TRUE(h.seqs("b").empty());
  EXPECT_TRUE(h.of<protocol::EpochEnd>("b").empty());  // not its epoch
  h.begin(1);
  uint64_t t = h.batch();
  EXPECT_EQ(h.seqs("b"), (std::vector<uint64_t>{t}));
  EXPECT_EQ(h.m.counters().joins, 2);
  EXPECT_TRUE(h.said("consumer pid 11 of producer 'p' joined (first epoch 1)"));
}

TEST(Membership, ASlotIsFreeOnlyOnceEveryConsumerReleasedIt) {
  Harness h;
  h.hello("a", 10);
  h.hello("b", 11);
  h.begin(0);
  uint64_t s = h.batch();
  h.release("a", {s});
  EXPECT_TRUE(h.freed.empty());  // lockstep: b still holds it
  h.release("b", {s});
  EXPECT_EQ(h.freed, (std::multiset<uint64_t>{s}));
  h.release("b", {s});  // late duplicates change nothing
  EXPECT_EQ(h.freed.count(s), 1u);
}

TEST(Membership, ABatchNobodyTakesIsFreeAtOnce) {
  Harness h;
  h.begin(0);
  uint64_t s = h.batch();
  EXPECT_EQ(h.freed, (std::multiset<uint64_t>{s}));
}

TEST(Membership, ByeStopsSendingButKeepsWhatTheConsumerStillReferences) {
  Harness h;
  h.hello("a", 10);
  h.hello("b", 11);
  h.begin(0);
  uint64_t s1 = h.batch();
  h.say("a", protocol::Bye{});
  EXPECT_EQ(h.m.active(), 1);
  uint64_t s2 = h.batch();
  EXPECT_EQ(h.seqs("a"), (std::vector<uint64_t>{s1}));  // nothing after Bye
  h.release("b", {s1, s2});
  EXPECT_EQ(h.freed.count(s1), 0u);  // a's tensors still use it
  EXPECT_EQ(h.m.consumers().size(), 2u);
  h.release("a", {s1});
  EXPECT_EQ(h.freed.count(s1), 1u);
  EXPECT_EQ(h.m.consumers().size(), 1u);  // forgotten once it holds nothing
  EXPECT_EQ(h.m.counters().leaves, 1);
}

TEST(Membership, UnmappedFreesWhatTheConsumerNeverTook) {
  Harness h;
  h.hello("a", 10);
  h.begin(0);
  uint64_t s1 = h.batch(), s2 = h.batch();
  h.say("a", protocol::Unmapped{});
  EXPECT_EQ(h.freed, (std::multiset<uint64_t>{s1, s2}));
  EXPECT_TRUE(h.m.consumers().empty());
  EXPECT_EQ(h.m.counters().leaves, 1);
}

TEST(Membership, ACrashedConsumerIsDroppedWithEverythingItHeld) {
  Harness h;
  h.hello("a", 10);
  h.hello("b", 11);
  h.begin(0);
  uint64_t s1 = h.batch(), s2 = h.batch();
  h.release("b", {s1, s2});
  h.sweep();
  EXPECT_TRUE(h.freed.empty());
  h.dead.insert(10);
  h.sweep();
  EXPECT_EQ(h.freed, (std::multiset<uint64_t>{s1, s2}));
  EXPECT_EQ(h.m.counters().crashes, 1);
  EXPECT_EQ(h.m.active(), 1);
  EXPECT_TRUE(h.said("consumer pid 10 of producer 'p' exited without leaving"));
  uint64_t s3 = h.batch();
  EXPECT_EQ(h.seqs("b").back(), s3);
}

TEST(Membership, CatchUpJoinsGetTheCurrentEpochWhileItsStartIsRetained) {
  Harness h(with(8, /*window=*/2));
  h.hello("first", 10);
  h.begin(0);
  uint64_t s1 = h.batch();
  h.release("first", {s1});
  EXPECT_TRUE(h.freed.empty());  // retained for catch-up joins
  h.hello("late", 11, /*catch_up=*/true);
  EXPECT_EQ(h.of<protocol::Welcome>("late")[0].first_epoch, 0);
  EXPECT_EQ(h.seqs("late"), (std::vector<uint64_t>{s1}));  // replayed
  uint64_t s2 = h.batch();
  uint64_t s3 = h.batch();  // past the window: retention ends
  EXPECT_EQ(h.seqs("late"), (std::vector<uint64_t>{s1, s2, s3}));
  h.hello("too-late", 12, /*catch_up=*/true);
  EXPECT_EQ(h.of<protocol::Welcome>("too-late")[0].first_epoch, 1);
  EXPECT_TRUE(h.said("consumer pid 12 joined epoch 0 of producer 'p' after its first 2 batches"));
  h.release("late", {s1});
  EXPECT_EQ(h.freed.count(s1), 1u);
}

TEST(Membership, AStragglerIsEvictedOnlyWhileTheProducerWaits) {
  Harness h(with(8, 0, /*straggler=*/1.0));
  h.hello("fast", 10);
  h.hello("slow", 11);
  h.begin(0);
  uint64_t s1 = h.batch(), s2 = h.batch();
  h.release("fast", {s1, s2});
  h.now += 5s;
  h.sweep(/*waiting=*/false);
  EXPECT_TRUE(h.of<protocol::Evicted>("slow").empty());
  h.sweep(/*waiting=*/true);
  ASSERT_EQ(h.of<protocol::Evicted>("slow").size(), 1u);
  EXPECT_NE(h.of<protocol::Evicted>("slow")[0].reason.find("straggler_timeout=1"), std::string::npos);
  EXPECT_EQ(h.m.counters().evictions, 1);
  // It gets nothing more, and what it references stays held until it lets go.
  uint64_t s3 = h.batch();
  EXPECT_EQ(h.seqs("slow"), (std::vector<uint64_t>{s1, s2}));
  EXPECT_EQ(h.freed.count(s1), 0u);
  h.release("slow", {s1, s2});
  EXPECT_EQ(h.freed.count(s1), 1u);
  EXPECT_EQ(h.seqs("fast").back(), s3);
}

// The consumer that is behind is evicted, not the one waiting for the next
// batch while it still holds its last; and while the evicted one has not yet
// given back what it had queued, nobody else is evicted in its place.
TEST(Membership, OnlyAConsumerThatIsBehindIsAStraggler) {
  Harness h(with(8, 0, /*straggler=*/0.5));
  h.hello("fast", 10);
  h.hello("slow", 11);
  h.begin(0);
  std::vector<uint64_t> sent;
  for (int i = 0; i < 4; ++i) sent.push_back(h.batch());
  h.release("fast", {sent[0], sent[1], sent[2]});  // it works on sent[3], the newest
  h.now += 1s;
  h.sweep(/*waiting=*/true);
  ASSERT_EQ(h.of<protocol::Evicted>("slow").size(), 1u);
  EXPECT_TRUE(h.of<protocol::Evicted>("fast").empty());
  // The evicted one has not read its eviction yet: its slots are still held.
  h.now += 5s;
  h.sweep(/*waiting=*/true);
  EXPECT_TRUE(h.of<protocol::Evicted>("fast").empty()) << "evicted in the straggler's place";
  EXPECT_EQ(h.m.counters().evictions, 1);
  // It gives them back; a consumer that then stops, holding its newest batch
  // while the producer still waits, is waited for only so long.
  h.release("slow", sent);
  h.now += 1s;
  h.sweep(/*waiting=*/true);
  EXPECT_EQ(h.of<protocol::Evicted>("fast").size(), 1u);
}

TEST(Membership, AConsumerKeepingOldBatchesIsNotAStraggler) {
  Harness h(with(8, 0, /*straggler=*/1.0));
  h.hello("keeper", 10);
  h.begin(0);
  uint64_t kept = h.batch();
  for (int i = 0; i < 5; ++i) h.release("keeper", {h.batch()});  // moves on past `kept`
  h.now += 10s;
  h.sweep(/*waiting=*/true);
  EXPECT_TRUE(h.of<protocol::Evicted>("keeper").empty());
  auto info = h.m.consumers();
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].slots_held, 1);
  EXPECT_EQ(info[0].slots_pinned, 1);
  EXPECT_EQ(h.freed.count(kept), 0u);
}

TEST(Membership, ThePinBudgetIsAnEqualShareOfTheRoomForKeptBatches) {
  Harness h(with(16));
  EXPECT_EQ(h.m.pin_budget(), 12);  // a share of 16, less 4 for noticing late
  h.hello("a", 10);
  EXPECT_EQ(h.of<protocol::Welcome>("a")[0].pin_budget, 12);
  h.hello("b", 11);
  EXPECT_EQ(h.m.pin_budget(), 4);
  for (int pid = 12; pid < 15; ++pid) h.hello("c" + std::to_string(pid), pid);
  EXPECT_EQ(h.m.pin_budget(), 0);  // five consumers: each takes copies as soon as it keeps
  h.begin(0);
  h.batch();
  EXPECT_EQ(h.of<protocol::Announcement>("a").back().pin_budget, 0);
}

TEST(Membership, AGpuRingIsMappedUntilEveryImporterUnmappedOrDied) {
  MembershipOptions o = with(4);
  o.ring.gpu_uuid = std::string(16, 'g');  // a GPU ring, not created yet
  Harness h(o);
  h.hello("a", 10);
  h.hello("b", 11);
  EXPECT_TRUE(h.m.ring_importers().empty());
  protocol::Ring ring = o.ring;
  ring.bytes = 4096;
  ring.memory_handle = std::string(64, 'm');
  ring.event_handles = {std::string(64, 'e')};
  h.take(h.m.on_ring(ring));
  EXPECT_EQ(h.of<protocol::RingReady>("a").size(), 1u);
  EXPECT_EQ(h.m.ring_importers(), (std::vector<int64_t>{10, 11}));
  h.say("a", protocol::Bye{});
  EXPECT_EQ(h.m.ring_importers().size(), 2u);  // Bye is not Unmapped
  h.say("a", protocol::Unmapped{});
  EXPECT_EQ(h.m.ring_importers(), (std::vector<int64_t>{11}));
  h.dead.insert(11);
  h.sweep();
  EXPECT_TRUE(h.m.ring_importers().empty());
  h.hello("c", 12);  // joins with the ring existing: mapped from its Welcome
  EXPECT_EQ(h.m.ring_importers(), (std::vector<int64_t>{12}));
}

TEST(Membership, AHostRingIsAwaitedUntilEveryConsumerGivenItSaidItMappedIt) {
  Harness h(with(4));  // a host ring, not created yet
  h.hello("a", 10);
  h.hello("b", 11);
  h.hello("c", 12);
  EXPECT_TRUE(h.m.ring_unmapped_yet().empty());  // nobody was given a ring
  protocol::Ring ring;
  ring.fd = 7;
  ring.bytes = 4096;
  h.take(h.m.on_ring(ring));
  EXPECT_EQ(h.m.ring_unmapped_yet(), (std::vector<int64_t>{10, 11, 12}));
  h.say("a", protocol::Mapped{});
  EXPECT_EQ(h.m.ring_unmapped_yet(), (std::vector<int64_t>{11, 12}));
  h.say("b", protocol::Bye{});  // leaving: owed nothing more
  EXPECT_EQ(h.m.ring_unmapped_yet(), (std::vector<int64_t>{12}));
  h.dead.insert(12);
  h.sweep();
  EXPECT_TRUE(h.m.ring_unmapped_yet().empty());
  h.hello("d", 13);  // given the ring in its Welcome
  EXPECT_EQ(h.m.ring_unmapped_yet(), (std::vector<int64_t>{13}));
  h.say("d", protocol::Mapped{});
  h.say("d", protocol::Mapped{});  // said twice: harmless
  EXPECT_TRUE(h.m.ring_unmapped_yet().empty());
  EXPECT_EQ(h.m.counters().dropped_messages, 0);
  EXPECT_TRUE(h.m.ring_importers().empty());  // a host ring has no GPU importers
}

TEST(Membership, AConsumerJoiningAFinishedProducerIsToldAtOnce) {
  Harness h;
  h.begin(0);
  h.batch();
  h.end();
  h.take(h.m.on_finished(protocol::Finished{1}));
  h.hello("late", 10);
  ASSERT_EQ(h.got["late"].size(), 2u);
  EXPECT_TRUE(std::holds_alternative<protocol::Welcome>(h.got["late"][0]));
  EXPECT_EQ(std::get<protocol::Finished>(h.got["late"][1]).epochs, 1);
}

TEST(Membership, BadWordsAreDroppedAndOtherVersionsRefused) {
  Harness h;
  h.take(h.m.on_message("x", "garbage", 7));
  EXPECT_EQ(h.m.counters().dropped_messages, 1);
  const uint16_t version = protocol::kVersion + 1;
  std::string other = protocol::encode(protocol::Hello{10, 0}, version);
  h.take(h.m.on_message("x", other.data(), other.size()));
  EXPECT_EQ(h.m.counters().refused, 1);
  ASSERT_EQ(h.of<protocol::Refuse>("x").size(), 1u);
  EXPECT_NE(h.of<protocol::Refuse>("x")[0].reason.find("speaks " + std::to_string(version)),
            std::string::npos);
  h.hello("a", 10);
  h.hello("a", 10);  // twice
  h.say("stranger", protocol::Release{{1, 2}});  // late words of nobody: ignored, not counted
  h.say("a", protocol::Welcome{});               // a producer's message from a consumer
  EXPECT_EQ(h.m.counters().dropped_messages, 3);
  EXPECT_EQ(h.m.counters().joins, 1);
}

// Consumers that join, consume at random paces, keep batches and are killed
// at random points: every slot is freed exactly once, never while a living
// consumer that was sent it still holds it, and each survivor receives every
// batch of each epoch it takes part in, in order.
class RandomKills : public ::testing::TestWithParam<int> {};

TEST_P(RandomKills, SurvivorsGetEverythingAndEverySlotIsFreedOnce) {
  std::mt19937 rng(static_cast<unsigned>(GetParam()));
  Harness h(with(4, /*window=*/1, /*straggler=*/0));
  struct Peer {
    int64_t pid;
    std::vector<uint64_t> unreleased;
    bool dead = false;
    bool survivor = false;
  };
  std::map<std::string, Peer> peers;
  int64_t next_pid = 100;
  auto add = [&](bool survivor) {
    std::string name = "c" + std::to_string(next_pid);
    peers[name] = Peer{next_pid, {}, false, survivor};
    h.hello(name, next_pid++, rng() % 2 == 0);
  };
  add(true);
  add(true);
  std::map<uint64_t, std::set<std::string>> sent_to;  // seq -> peers it was sent to
  for (int epoch = 0; epoch < 3; ++epoch) {
    h.begin(epoch);
    for (int b = 0; b < 40; ++b) {
      if (rng() % 10 == 0) add(false);
      uint64_t seq = h.batch();
      for (auto& [name, p] : peers) {
        auto sent = h.seqs(name);
        if (!sent.empty() && sent.back() == seq) {
          p.unreleased.push_back(seq);
          sent_to[seq].insert(name);
        }
      }
      for (auto& [name, p] : peers) {
        if (p.dead) continue;
        if (!p.survivor && rng() % 8 == 0) {  // killed, whatever it holds
          p.dead = true;
          h.dead.insert(p.pid);
          continue;
        }
        // Release a random prefix (in order), sometimes keeping one back.
        std::size_t n = rng() % (p.unreleased.size() + 1);
        std::vector<uint64_t> out(p.unreleased.begin(), p.unreleased.begin() + static_cast<long>(n));
        p.unreleased.erase(p.unreleased.begin(), p.unreleased.begin() + static_cast<long>(n));
        if (!out.empty()) h.release(name, out);
      }
      if (rng() % 3 == 0) h.sweep();
      // Never freed while a living peer it was sent to still holds it.
      for (uint64_t seq : h.freed) {
        for (const auto& name : sent_to[seq]) {
          const Peer& p = peers[name];
          bool holds = std::find(p.unreleased.begin(), p.unreleased.end(), seq) != p.unreleased.end();
          ASSERT_FALSE(holds && !p.dead) << "slot " << seq << " freed while " << name << " holds it";
        }
      }
    }
    h.end();
  }
  h.sweep();
  for (auto& [name, p] : peers) {
    if (!p.dead) h.release(name, p.unreleased);
  }
  h.sweep();
  // Every slot announced was freed, exactly once.
  for (uint64_t seq = 1; seq < h.next_seq; ++seq) EXPECT_EQ(h.freed.count(seq), 1u) << "slot " << seq;
  // The two survivors were there from the start: every batch, in order, per epoch.
  for (auto& [name, p] : peers) {
    if (!p.survivor) continue;
    auto got = h.of<protocol::Announcement>(name);
    ASSERT_EQ(got.size(), 120u) << name;
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].epoch, static_cast<int64_t>(i / 40));
      EXPECT_EQ(got[i].index, static_cast<int64_t>(i % 40));
    }
    EXPECT_EQ(h.of<protocol::EpochEnd>(name).size(), 3u);
  }
  EXPECT_GE(h.m.counters().crashes, 1);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomKills, ::testing::Range(0, 8));

// ---- consumer groups ---------------------------------------------------------

TEST(Membership, AGroupStartsOnceEveryRankIsThereAndCountsAsOneConsumer) {
  Harness h;
  h.begin(0);
  h.rank("r0", 10, "job", 0, 2);
  ASSERT_EQ(h.of<protocol::Welcome>("r0").size(), 1u);
  EXPECT_EQ(h.of<protocol::Welcome>("r0")[0].first_epoch, -1);  // until its group is complete
  EXPECT_EQ(h.m.active(), 0);  // a forming group is nobody yet (min_consumers waits)
  h.hello("solo", 12);
  EXPECT_EQ(h.m.active(), 1);
  uint64_t first = h.batch();  // epoch 0 began without the group
  EXPECT_TRUE(h.seqs("r0").empty());
  h.rank("r1", 11, "job", 1, 2);
  for (const char* r : {"r0", "r1"}) {
    ASSERT_EQ(h.of<protocol::GroupReady>(r).size(), 1u) << r;
    EXPECT_EQ(h.of<protocol::GroupReady>(r)[0].first_epoch, 1) << r;
  }
  EXPECT_EQ(h.m.active(), 2);  // the group once, beside the whole-stream consumer
  h.batch();
  h.end();
  EXPECT_TRUE(h.seqs("r0").empty());
  EXPECT_TRUE(h.of<protocol::EpochEnd>("r1").empty());
  h.begin(1);
  uint64_t s = h.batch();
  EXPECT_EQ(h.seqs("r0"), (std::vector<uint64_t>{s}));  // every rank gets the whole stream
  EXPECT_EQ(h.seqs("r1"), (std::vector<uint64_t>{s}));
  EXPECT_EQ(h.seqs("solo"), (std::vector<uint64_t>{first, first + 1, s}));
  // Lockstep: the slot is free once every rank and the other consumer let go.
  h.release("r0", {s});
  h.release("solo", {first, first + 1, s});
  EXPECT_EQ(h.freed.count(s), 0u);
  h.release("r1", {s});
  EXPECT_EQ(h.freed.count(s), 1u);
}

TEST(Membership, RanksThatDisagreeOrRepeatAreRefusedWithTheReason) {
  Harness h;
  h.rank("r0", 10, "job", 0, 2);
  h.rank("again", 11, "job", 0, 2);
  ASSERT_EQ(h.of<protocol::Refuse>("again").size(), 1u);
  EXPECT_NE(h.of<protocol::Refuse>("again")[0].reason.find("rank 0 is already there (consumer pid 10)"),
            std::string::npos)
      << h.of<protocol::Refuse>("again")[0].reason;
  h.rank("wide", 12, "job", 1, 3);
  ASSERT_EQ(h.of<protocol::Refuse>("wide").size(), 1u);
  EXPECT_NE(h.of<protocol::Refuse>("wide")[0].reason.find("world_size is 3"), std::string::npos);
  h.rank("big", 13, "job", 1, 2, /*batch_size=*/8);
  ASSERT_EQ(h.of<protocol::Refuse>("big").size(), 1u);
  EXPECT_NE(h.of<protocol::Refuse>("big")[0].reason.find("batch_size is 8"), std::string::npos);
  h.rank("r1", 14, "job", 1, 2);
  EXPECT_EQ(h.of<protocol::GroupReady>("r1").size(), 1u);
  EXPECT_EQ(h.m.counters().refused, 3);
}

TEST(Membership, ARankThatDiesEndsTheGroupForTheOthersAndNobodyElse) {
  Harness h;
  h.rank("r0", 10, "job", 0, 2);
  h.rank("r1", 11, "job", 1, 2);
  h.hello("solo", 12);
  h.begin(0);
  uint64_t a = h.batch();
  h.dead.insert(10);
  h.sweep();
  ASSERT_EQ(h.of<protocol::GroupBroken>("r1").size(), 1u);
  const auto broken = h.of<protocol::GroupBroken>("r1")[0];
  EXPECT_EQ(broken.epoch, 0);
  EXPECT_NE(broken.reason.find("rank 0 (pid 10) of consumer group 'job'"), std::string::npos) << broken.reason;
  EXPECT_NE(broken.reason.find("exited"), std::string::npos) << broken.reason;
  EXPECT_TRUE(h.of<protocol::GroupBroken>("solo").empty());
  uint64_t b = h.batch();
  EXPECT_EQ(h.seqs("r1"), (std::vector<uint64_t>{a}));  // nothing more for the group
  EXPECT_EQ(h.seqs("solo"), (std::vector<uint64_t>{a, b}));
  EXPECT_EQ(h.m.active(), 1);
  EXPECT_EQ(h.m.counters().groups_broken, 1);
  // What the remaining rank still holds stays held until it lets go.
  h.release("solo", {a, b});
  EXPECT_EQ(h.freed.count(a), 0u);
  EXPECT_EQ(h.freed.count(b), 1u);
  h.say("r1", protocol::Unmapped{});
  EXPECT_EQ(h.freed.count(a), 1u);
}

TEST(Membership, ARankLeavingBetweenEpochsEndsTheGroupFromTheNextEpoch) {
  Harness h;
  h.rank("r0", 10, "job", 0, 2);
  h.rank("r1", 11, "job", 1, 2);
  h.begin(0);
  h.batch();
  h.end();
  h.say("r0", protocol::Bye{});
  ASSERT_EQ(h.of<protocol::GroupBroken>("r1").size(), 1u);
  EXPECT_EQ(h.of<protocol::GroupBroken>("r1")[0].epoch, 1);  // epoch 0 was whole
}

TEST(Membership, ARestartedGroupFormsBesideTheOldOneAndStartsAtTheNextEpoch) {
  Harness h;
  h.rank("r0", 10, "job", 0, 2);
  h.rank("r1", 11, "job", 1, 2);
  h.begin(0);
  h.batch();
  // torchrun restarts the group: the new ranks may come before the old ones are noticed gone.
  h.rank("n0", 20, "job", 0, 2);
  EXPECT_TRUE(h.of<protocol::Refuse>("n0").empty());
  h.dead.insert(10);
  h.dead.insert(11);
  h.sweep();
  h.rank("n1", 21, "job", 1, 2);
  ASSERT_EQ(h.of<protocol::GroupReady>("n1").size(), 1u);
  EXPECT_EQ(h.of<protocol::GroupReady>("n1")[0].first_epoch, 1);
  EXPECT_EQ(h.m.active(), 1);
  h.batch();
  EXPECT_TRUE(h.seqs("n0").empty());  // epoch 0 is not theirs
  h.end();
  h.begin(1);
  uint64_t s = h.batch();
  EXPECT_EQ(h.seqs("n0"), (std::vector<uint64_t>{s}));
  EXPECT_EQ(h.seqs("n1"), (std::vector<uint64_t>{s}));
}

// ---- resume ------------------------------------------------------------------

TEST(Membership, AResumeIsExactWhileTheProducerStillHoldsThePosition) {
  Harness h;
  h.hello("a", 10);
  h.begin(0);
  uint64_t s0 = h.batch(4);  // positions 0..3
  uint64_t s1 = h.batch(4);  // 4..7
  uint64_t s2 = h.batch(4);  // 8..11
  h.release("a", {s0});      // a is past the first batch: it is gone
  h.resume("b", 11, 0, 6);
  const auto w = h.of<protocol::Welcome>("b").at(0);
  EXPECT_EQ(w.first_epoch, 0);
  EXPECT_EQ(w.resume, protocol::Resume::Exact);
  EXPECT_EQ(w.resume_position, 6);
  EXPECT_EQ(h.seqs("b"), (std::vector<uint64_t>{s1, s2}));  // from the batch holding 6
  uint64_t s3 = h.batch(4);
  EXPECT_EQ(h.seqs("b"), (std::vector<uint64_t>{s1, s2, s3}));
  h.release("a", {s1, s2, s3});
  EXPECT_EQ(h.freed.count(s1), 0u);  // b holds it too now
  h.release("b", {s1});
  EXPECT_EQ(h.freed.count(s1), 1u);
  EXPECT_EQ(h.m.counters().resumed, 1);
}

TEST(Membership, AResumeTheProducerCannotServeGetsTheNextPassAndSaysSo) {
  Harness h;
  h.hello("a", 10);
  h.begin(0);
  uint64_t s0 = h.batch(4);
  uint64_t s1 = h.batch(4);
  h.release("a", {s0, s1});  // nobody holds epoch 0's batches any more
  h.batch(4);
  h.resume("b", 11, 0, 2);
  const auto w = h.of<protocol::Welcome>("b").at(0);
  EXPECT_EQ(w.first_epoch, 1);
  EXPECT_EQ(w.resume, protocol::Resume::NextPass);
  EXPECT_EQ(w.resume_position, 2);
  EXPECT_TRUE(h.seqs("b").empty());
  EXPECT_TRUE(h.said("resumes epoch 0 at sample 2, which the producer no longer holds"));
  EXPECT_EQ(h.m.counters().resumed_next_pass, 1);
}

TEST(Membership, AResumeIntoAnEpochNotBegunIsExact) {
  Harness h;
  h.hello("a", 10);
  h.begin(0);
  h.batch(4);
  h.end();
  h.resume("b", 11, 1, 0);  // saved between epochs: epoch 1 from its start
  const auto w = h.of<protocol::Welcome>("b").at(0);
  EXPECT_EQ(w.first_epoch, 1);
  EXPECT_EQ(w.resume, protocol::Resume::Exact);
  h.begin(1);
  uint64_t s = h.batch(4);
  EXPECT_EQ(h.seqs("b"), (std::vector<uint64_t>{s}));
}

// ---- joining now (join_now) ----------------------------------------------

namespace {

MembershipOptions any_time(int64_t samples, int64_t batches, int64_t epochs = -1) {
  MembershipOptions o = with(16);
  o.plan.samples_per_epoch = samples;
  o.plan.batches_per_epoch = batches;
  o.plan.join_now = true;
  o.plan.epochs = epochs;
  return o;
}

void join_now(Harness& h, const std::string& peer, int64_t pid) {
  h.say(peer, protocol::Hello{pid, protocol::Hello::kJoinNow});
}

// What one consumer was sent, in order: "e<epoch>:<position>+<samples>" per
// batch, "end<epoch>" per EpochEnd, "finished" for Finished.
std::vector<std::string> story(const Harness& h, const std::string& peer) {
  std::vector<std::string> out;
  auto it = h.got.find(peer);
  if (it == h.got.end()) return out;
  for (const auto& msg : it->second) {
    if (const auto* a = std::get_if<protocol::Announcement>(&msg)) {
      out.push_back("e" + std::to_string(a->epoch) + ":" + std::to_string(a->position) + "+" +
                    std::to_string(a->samples) + "#" + std::to_string(a->index));
    } else if (const auto* e = std::get_if<protocol::EpochEnd>(&msg)) {
      out.push_back("end" + std::to_string(e->epoch) + "/" + std::to_string(e->samples));
    } else if (std::get_if<protocol::Finished>(&msg)) {
      out.push_back("finished");
    }
  }
  return out;
}

}  // namespace

TEST(Membership, AConsumerJoiningNowGetsTheNextBatchAndEpochsOfItsOwn) {
  Harness h(any_time(12, 3));  // batches of 4
  h.hello("whole", 10);
  h.begin(0);
  h.batch(4);
  join_now(h, "late", 11);
  const auto w = h.of<protocol::Welcome>("late").at(0);
  EXPECT_EQ(w.first_epoch, 0);
  EXPECT_EQ(w.joined_at, 4);
  EXPECT_TRUE(h.said("joined (first epoch 0, from its sample 4"));
  h.batch(4);
  h.batch(4);
  h.end();
  EXPECT_EQ(h.m.steer_epoch(1), (std::vector<int64_t>{4}));
  h.begin(1);
  h.batch(4);
  h.batch(4);
  // Framed from where it joined: its epoch 0 is the producer's 4..12 of 0 and 0..4 of 1.
  EXPECT_EQ(story(h, "late"), (std::vector<std::string>{"e0:0+4#0", "e0:4+4#1", "e0:8+4#2", "end0/12",
                                                        "e1:0+4#0"}));
  // The whole-stream consumer's stream is as ever.
  EXPECT_EQ(story(h, "whole"), (std::vector<std::string>{"e0:0+4#0", "e0:4+4#1", "e0:8+4#2", "end0/12",
                                                         "e1:0+4#0", "e1:4+4#1"}));
  for (const ConsumerInfo& c : h.m.consumers()) EXPECT_EQ(c.joined_at, c.pid == 11 ? 4 : 0);
}

TEST(Membership, JoinPositionsGoWithTheirConsumers) {
  Harness h(any_time(12, 3));
  h.hello("whole", 10);
  h.begin(0);
  h.batch(4);
  join_now(h, "a", 11);
  h.batch(4);
  join_now(h, "b", 12);
  join_now(h, "c", 13);  // the same place: one position
  EXPECT_EQ(h.m.steer_epoch(0), (std::vector<int64_t>{4, 8}));
  h.say("a", protocol::Bye{});
  EXPECT_EQ(h.m.steer_epoch(0), (std::vector<int64_t>{8}));
  h.dead.insert(12);
  h.dead.insert(13);
  h.sweep();
  EXPECT_TRUE(h.m.steer_epoch(0).empty());
}

TEST(Membership, JoiningNowBetweenEpochsOrWithoutSteeringStartsAtTheNextEpoch) {
  Harness h(any_time(12, 3));
  h.hello("whole", 10);
  h.begin(0);
  h.batch(4);
  h.batch(4);
  h.batch(4);
  join_now(h, "after-last-batch", 11);  // every batch of the epoch delivered: the next, whole
  h.end();
  join_now(h, "between", 12);
  for (const char* peer : {"after-last-batch", "between"}) {
    EXPECT_EQ(h.of<protocol::Welcome>(peer).at(0).first_epoch, 1) << peer;
    EXPECT_EQ(h.of<protocol::Welcome>(peer).at(0).joined_at, 0) << peer;
  }
  MembershipOptions fixed = any_time(12, 3);
  fixed.plan.join_now = false;  // an order the producer cannot steer
  Harness g(fixed);
  g.hello("whole", 10);
  g.begin(0);
  g.batch(4);
  join_now(g, "x", 11);
  join_now(g, "y", 12);
  EXPECT_EQ(g.of<protocol::Welcome>("x").at(0).first_epoch, 1);
  EXPECT_EQ(g.of<protocol::Welcome>("x").at(0).joined_at, 0);
  EXPECT_EQ(std::count_if(g.reports.begin(), g.reports.end(),
                          [](const Report& r) { return r.message.find("cannot start consumers mid-epoch") !=
                                                       std::string::npos; }),
            1);  // said once
}

TEST(Membership, WithALastEpochALateJoinerGetsItsLastWholeEpochThenFinished) {
  Harness h(any_time(8, 2, /*epochs=*/3));
  h.hello("whole", 10);
  h.begin(0);
  h.batch(4);
  join_now(h, "late", 11);  // its epochs: 0 (ends in the producer's 1) and 1 (ends in 2)
  h.batch(4);
  h.end();
  h.begin(1);
  h.batch(4);
  h.batch(4);
  h.end();
  h.begin(2);
  uint64_t last_for_it = h.batch(4);
  uint64_t after = h.batch(4);
  h.end();
  EXPECT_EQ(story(h, "late"),
            (std::vector<std::string>{"e0:0+4#0", "e0:4+4#1", "end0/8", "e1:0+4#0", "e1:4+4#1", "end1/8",
                                      "finished"}));
  EXPECT_EQ(h.seqs("late").back(), last_for_it);
  EXPECT_EQ(h.m.active(), 1);  // it gets nothing more: the producer may stop for nobody
  (void)after;
  // Joining in the last epoch: no whole epoch of its own is left, it waits for the next (none).
  Harness g(any_time(8, 2, /*epochs=*/1));
  g.hello("whole", 10);
  g.begin(0);
  g.batch(4);
  join_now(g, "late", 11);
  EXPECT_EQ(g.of<protocol::Welcome>("late").at(0).first_epoch, 1);
}

TEST(Membership, AGroupJoiningNowStartsWhereItsLastRankCame) {
  Harness h(any_time(12, 3));
  h.hello("whole", 10);
  h.begin(0);
  h.batch(4);
  protocol::Hello r0{20, protocol::Hello::kJoinNow, 4, "g", 0, 2};
  protocol::Hello r1{21, protocol::Hello::kJoinNow, 4, "g", 1, 2};
  h.say("r0", r0);
  h.batch(4);
  EXPECT_TRUE(h.seqs("r0").empty());  // waits for its group
  h.say("r1", r1);
  for (const char* peer : {"r0", "r1"}) {
    const auto ready = h.of<protocol::GroupReady>(peer).at(0);
    EXPECT_EQ(ready.first_epoch, 0);
    EXPECT_EQ(ready.joined_at, 8);
  }
  h.batch(4);
  h.end();
  h.begin(1);
  h.batch(4);
  h.batch(4);
  EXPECT_EQ(story(h, "r1"), (std::vector<std::string>{"e0:0+4#0", "e0:4+4#1", "e0:8+4#2", "end0/12"}));
  // A rank leaving mid-epoch of its own ends the group from that epoch of its own.
  h.say("r0", protocol::Bye{});
  EXPECT_EQ(h.of<protocol::GroupBroken>("r1").at(0).epoch, 1);
}

TEST(Membership, AResumeOfAnEpochThatBeganMidEpochIsExactWhileHeldAndItsPositionKept) {
  Harness h(any_time(12, 3));
  h.hello("whole", 10);
  h.begin(0);
  h.batch(4);
  h.batch(4);  // the producer's 0..8 of epoch 0
  // Its epoch 0 began at 4 of the producer's; it took 4 samples and stopped: it resumes at the producer's 8.
  protocol::Hello back{11, protocol::Hello::kJoinNow};
  back.resume_epoch = 0;
  back.resume_position = 4;
  back.resume_joined_at = 4;
  back.resume_run = kRun;
  h.say("back", back);
  const auto w = h.of<protocol::Welcome>("back").at(0);
  EXPECT_EQ(w.resume, protocol::Resume::Exact);
  EXPECT_EQ(w.first_epoch, 0);
  EXPECT_EQ(w.joined_at, 4);
  EXPECT_EQ(w.resume_position, 4);
  h.batch(4);
  EXPECT_EQ(story(h, "back"), (std::vector<std::string>{"e0:4+4#1"}));  // its next sample on
  EXPECT_EQ(h.m.counters().resumed, 1);
  // Its position was no longer kept: the producer's epoch 1 was steered without it.
  h.end();
  h.say("back", protocol::Bye{});
  h.release("back", h.seqs("back"));
  EXPECT_TRUE(h.m.steer_epoch(1).empty());
  h.begin(1);
  protocol::Hello later = back;
  later.pid = 12;
  later.resume_position = 10;  // in the producer's epoch 1, before 4: the blocks moved
  h.say("later", later);
  EXPECT_EQ(h.of<protocol::Welcome>("later").at(0).resume, protocol::Resume::NextPass);
  EXPECT_EQ(h.of<protocol::Welcome>("later").at(0).joined_at, 0);
  EXPECT_TRUE(h.said("no longer holds"));
}

// Nothing can move: the ring is full and every consumer holding a slot waits
// for its next batch. After kStuckSeconds the one keeping batches is evicted
// naming the fix, the log says who holds what; the one only holding the batch
// in hand stays. Not before, and never while someone is not waiting.
TEST(Membership, ARingThatCannotMoveEvictsTheConsumerKeepingBatches) {
  Harness h(with(2));
  h.hello("keeper", 10);
  h.hello("trainer", 11);
  h.begin(0);
  const uint64_t s1 = h.batch(), s2 = h.batch();
  h.release("keeper", {s2});   // keeps s1, moved past it
  h.release("trainer", {s1});  // holds s2: the batch in its hands
  h.sweep_blocked({"keeper"});  // the trainer computes: it may let go
  EXPECT_EQ(h.m.stuck(), "");
  h.sweep_blocked({"keeper", "trainer"});
  EXPECT_NE(h.m.stuck().find("pid 10 holds 1 slot (1 of batches it keeps)"), std::string::npos) << h.m.stuck();
  EXPECT_TRUE(h.of<protocol::Evicted>("keeper").empty());
  h.now += std::chrono::milliseconds(static_cast<int>(Holdup::kStuckSeconds * 1000) + 100);
  h.sweep_blocked({"keeper", "trainer"});
  ASSERT_EQ(h.of<protocol::Evicted>("keeper").size(), 1u);
  const std::string reason = h.of<protocol::Evicted>("keeper")[0].reason;
  EXPECT_NE(reason.find("keep .clone()s"), std::string::npos) << reason;
  EXPECT_NE(reason.find("slots=2"), std::string::npos) << reason;
  EXPECT_TRUE(h.of<protocol::Evicted>("trainer").empty());
  EXPECT_TRUE(h.said("cannot go on"));
  EXPECT_EQ(h.m.stuck(), "");
  // The keeper's trainer lets go: its slot is freed.
  h.release("keeper", {s1});
  EXPECT_EQ(h.freed.count(s1), 1u);
}

// A loader batch that spans where a late joiner's epochs begin (the loader's
// batches moved) ends that consumer's epochs alone, with the reason; the
// producer and every other consumer go on.
TEST(Membership, ABatchSpanningWhereALateJoinersEpochsBeginFailsItAlone) {
  Harness h(any_time(12, 3));  // batches of 4
  h.hello("whole", 10);
  h.begin(0);
  h.batch(4);
  join_now(h, "late", 11);  // its epochs begin at sample 4
  h.batch(4);
  h.batch(4);
  h.end();
  h.begin(1);
  const uint64_t moved = h.batch(6);  // samples 0..5 of epoch 1: spans 4
  const auto failed = h.of<protocol::LoaderFailed>("late");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].message.find("spans sample 4"), std::string::npos) << failed[0].message;
  EXPECT_EQ(failed[0].epoch, 0);
  EXPECT_EQ(h.seqs("late").back(), h.seqs("late").at(1));  // it was not sent the batch
  EXPECT_EQ(h.seqs("whole").back(), moved);                // the others were
  h.batch(6);
  h.end();
  EXPECT_EQ(h.of<protocol::EpochEnd>("whole").size(), 2u);
  EXPECT_EQ(h.m.consumers().size(), 2u);
  EXPECT_TRUE(h.m.consumers().at(1).leaving || h.m.consumers().at(0).leaving);
}
