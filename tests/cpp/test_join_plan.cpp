// The join plan, in-process: seeded random joins (now, at an epoch's start,
// catching up, as groups), leaves and resumes (plain and begun mid-epoch,
// into the epoch in progress or the one that ended last, with the producer
// still holding the batches or not) over epochs, with and without drop_last,
// repeated samples and a last epoch, checked against a model of what every
// trainer must see — each of its own epochs the whole epoch, each sample as
// often as the loader has it, in positions without gaps — and of where each
// newcomer must start; and the errors for what cannot be served.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/producer/join_plan.h"

using namespace batchcast;

namespace {

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> slice(const std::vector<int64_t>& v, int64_t lo, int64_t hi) {
  return std::vector<int64_t>(v.begin() + lo, v.begin() + hi);
}

// One trainer (a group's ranks share it): what it has of its epoch in progress.
struct Trainer {
  std::vector<uint64_t> ids;
  Frame frame;
  bool active = true;
  bool finished = false;      // was told its last epoch ended
  int64_t own_epoch = 0;      // the epoch of its own it fills (it began in the producer's of that number)
  std::vector<int64_t> own;   // its samples of that epoch, in order
  int64_t next_index = 0;     // the index its next batch must have (-1: resumed, not followed)
  int64_t whole = 0;          // whole epochs of its own it got
};

struct Scenario {
  int64_t distinct, repeats, batch;
  bool drop_last;
  int64_t epochs;  // -1: until stopped (the model runs 6)
  int64_t window;  // catch_up_window
};

// A `held` for start() that must not be asked.
bool never_asked(const Replay& r) {
  ADD_FAILURE() << "start() asked whether epoch " << r.epoch << " from sample " << r.position << " is held";
  return false;
}

// Runs one seeded scenario; returns the whole epochs of their own that trainers
// joined mid-epoch got (checked each).
int64_t run(uint32_t seed, const Scenario& sc) {
  std::mt19937 rng(seed);
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  const int64_t n = sc.distinct * sc.repeats;
  const int64_t spe = sc.drop_last ? n / sc.batch * sc.batch : n;
  const int64_t bpe = (spe + sc.batch - 1) / sc.batch;
  const int64_t epochs = sc.epochs < 0 ? 6 : sc.epochs;
  JoinPlanOptions options;
  options.join_now = true;
  options.samples_per_epoch = spe;
  options.batches_per_epoch = bpe;
  options.epochs = sc.epochs;
  options.catch_up_window = sc.window;
  JoinPlan plan(options);
  std::map<int64_t, std::vector<int64_t>> steered_at;  // producer epoch -> the positions it was steered by
  std::vector<Trainer> trainers;
  std::vector<Trainer> resumable;  // left mid-way through an epoch of their own begun mid-epoch
  std::map<int64_t, std::vector<int64_t>> epoch_samples;  // producer epoch -> its first spe samples, sorted
  uint64_t next_id = 1;
  int64_t checked_mid = 0;
  std::vector<int64_t> last;
  const std::string where = "seed " + std::to_string(seed);
  using History = std::vector<std::pair<int64_t, std::vector<int64_t>>>;  // an epoch's batches (position, samples)
  History history, ended;  // the epoch in progress's, the last ended one's

  // A framed batch (or part of one) to a trainer: continues its epoch without gaps.
  auto feed = [&](Trainer& t, const Framed& f, const std::vector<int64_t>& samples) {
    ASSERT_TRUE(f.broken.empty()) << where << ": " << f.broken;
    ASSERT_EQ(f.epoch, t.own_epoch) << where;
    const int64_t have = static_cast<int64_t>(t.own.size());
    const int64_t n_samples = static_cast<int64_t>(samples.size());
    ASSERT_LE(f.position, have) << where << ": a gap in its epoch";
    if (f.position + n_samples <= have) return;  // it had those already (resumed past them)
    if (t.next_index >= 0) {
      ASSERT_EQ(f.index, t.next_index) << where;
      t.next_index += 1;
    }
    for (int64_t i = have - f.position; i < n_samples; ++i) t.own.push_back(samples[i]);
    if (!f.ends_epoch) return;
    ASSERT_EQ(static_cast<int64_t>(t.own.size()), spe) << where;
    ASSERT_EQ(sorted(t.own), epoch_samples.at(t.own_epoch)) << where << ": epoch " << t.own_epoch << " of a trainer joined at "
                                                          << t.frame.joined_at;
    t.whole += 1;
    checked_mid += 1;
    t.own.clear();
    t.own_epoch += 1;
    t.next_index = 0;
    if (f.last) {
      t.finished = true;
      t.active = false;
      for (uint64_t id : t.ids) plan.left(id);
    }
  };

  // The replay a start gave: the batches of its epoch from the one holding
  // its position through `through`, framed in the trainer's epochs.
  auto replay_to = [&](Trainer& t, const Replay& r, int64_t e) {
    const History& h = r.epoch == e ? history : ended;
    ASSERT_TRUE(r.epoch == e || r.epoch == e - 1) << where;
    ASSERT_EQ(r.through, static_cast<int64_t>(h.size())) << where << ": a replay through every batch served";
    for (int64_t k = 0; k < r.through; ++k) {
      const auto& [p, samples] = h[k];
      if (p + static_cast<int64_t>(samples.size()) <= r.position) continue;
      const Framed f = plan.frame(t.frame, r.epoch, k, p, static_cast<int64_t>(samples.size()));
      if (!f.in_epochs) continue;  // past its last epoch
      feed(t, f, samples);
      if (::testing::Test::HasFatalFailure()) return;
    }
    if (!r.with_end) return;  // the end of a whole-epoch trainer's epoch, as the producer's
    ASSERT_EQ(t.frame.joined_at, 0) << where;
    ASSERT_EQ(sorted(t.own), epoch_samples.at(r.epoch)) << where;
    t.own.clear();
    t.next_index = 0;
    t.own_epoch += 1;
    t.whole += 1;
  };

  for (int64_t e = 0; e < epochs; ++e) {
    std::vector<int64_t> present;
    for (const Trainer& t : trainers) {
      if (t.active && t.frame.joined_at > 0) present.push_back(t.frame.joined_at);
    }
    std::sort(present.begin(), present.end());
    present.erase(std::unique(present.begin(), present.end()), present.end());
    const std::vector<int64_t> steered = plan.steer(e);
    EXPECT_EQ(steered, present) << where;
    steered_at[e] = steered;

    // The loader's fresh order: `repeats` permutations of the distinct samples.
    std::vector<int64_t> fresh;
    for (int64_t r = 0; r < sc.repeats; ++r) {
      std::vector<int64_t> p(sc.distinct);
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), rng);
      fresh.insert(fresh.end(), p.begin(), p.end());
    }
    const std::vector<int64_t> order = plan.order(fresh);
    EXPECT_EQ(sorted(order), sorted(fresh)) << where;
    std::vector<int64_t> cuts;
    for (int64_t p : steered) if (p < n) cuts.push_back(p);
    if (cuts.empty()) {
      EXPECT_EQ(order, fresh) << where << ": nobody joined mid-epoch: the loader's own order";
    } else if (!last.empty()) {
      cuts.push_back(spe);
      cuts.push_back(n);
      int64_t lo = 0;
      for (int64_t hi : cuts) {  // each block the same samples as in the last epoch
        if (hi <= lo) continue;
        EXPECT_EQ(sorted(slice(order, lo, hi)), sorted(slice(last, lo, hi))) << where << " block " << lo << ".." << hi;
        lo = hi;
      }
    }
    last = order;
    epoch_samples[e] = sorted(slice(order, 0, spe));
    plan.on_epoch_begin(e);

    history.clear();
    for (int64_t k = 0; k < bpe; ++k) {
      const int64_t pos = k * sc.batch;
      // ---- joins ----
      if (chance(0.25)) {
        StartRequest ask;
        ask.catch_up = chance(0.3);
        ask.join_now = chance(0.7);
        std::optional<Replay> asked;
        const StartPoint p = plan.start(ask, [&](const Replay& r) {
          asked = r;
          return true;
        });
        EXPECT_TRUE(p.why_not_now.empty()) << where;
        EXPECT_EQ(p.resumed, StartPoint::Resumed::No);
        Trainer t;
        t.frame = p.frame;
        const bool catching = ask.catch_up && k > 0;
        const bool now = !catching && ask.join_now && k > 0 && (sc.epochs < 0 || e + 1 < sc.epochs);
        EXPECT_EQ(p.caught_up_too_late, catching && k > sc.window) << where;
        if (catching && k <= sc.window) {  // the epoch in progress, from its start
          EXPECT_EQ(p.frame, (Frame{e, 0, 0})) << where;
          EXPECT_EQ(p.replay, (Replay{e, 0, k, false})) << where;
          EXPECT_EQ(asked, p.replay) << where;
        } else if (now) {
          EXPECT_FALSE(p.replay) << where;
          EXPECT_EQ(p.frame.first_epoch, e);
          EXPECT_EQ(p.frame.joined_at, pos);
          EXPECT_EQ(p.frame.joined_at_index, k);
          EXPECT_EQ(p.frame.last_epoch, sc.epochs < 0 ? std::numeric_limits<int64_t>::max() : sc.epochs - 2);
        } else {
          EXPECT_FALSE(p.replay) << where;
          EXPECT_EQ(p.frame, (Frame{k == 0 ? e : e + 1, 0, 0})) << where;
        }
        t.own_epoch = t.frame.first_epoch;
        const int ranks = chance(0.3) ? 2 + static_cast<int>(rng() % 2) : 1;
        for (int r = 0; r < ranks; ++r) t.ids.push_back(next_id++);
        for (uint64_t id : t.ids) plan.joined(id, t.frame);
        if (p.replay) replay_to(t, *p.replay, e);
        if (::testing::Test::HasFatalFailure()) return checked_mid;
        trainers.push_back(t);
      }
      // ---- leaves (a group's rank going ends the group) ----
      for (Trainer& t : trainers) {
        if (!t.active || !chance(0.3 / static_cast<double>(bpe))) continue;
        t.active = false;
        plan.left(t.ids[chance(0.5) ? 0 : t.ids.size() - 1]);
        for (uint64_t id : t.ids) plan.left(id);
        if (!t.own.empty()) resumable.push_back(t);
      }
      // ---- resumes from a saved position ----
      if (!resumable.empty() && chance(0.3)) {
        Trainer t = resumable.back();
        resumable.pop_back();
        const int64_t q = t.frame.joined_at;
        const int64_t rp = static_cast<int64_t>(t.own.size());
        const bool still_held = chance(0.75);
        // A state saved in another run of the producer (one restarted since):
        // its position is no place in this run's passes.
        const bool this_run = chance(0.8);
        StartRequest ask;
        ask.resume_epoch = t.own_epoch;
        ask.resume_position = rp;
        ask.resume_joined_at = q;
        ask.saved_in_this_run = this_run;
        std::optional<Replay> asked;
        const StartPoint p = plan.start(ask, [&](const Replay& r) {
          asked = r;
          return still_held;
        });
        EXPECT_EQ(p.other_run, !this_run) << where;
        // Where its position lies in the producer's stream, and whether the
        // stream can give it from there: the epoch in progress (not served
        // yet, or held), the next one (not begun), the one that ended last
        // (held).
        const int64_t at_epoch = t.own_epoch + (q + rp >= spe ? 1 : 0);
        const int64_t at = (q + rp) % spe;
        const int64_t served = std::min(k * sc.batch, spe);
        std::optional<Replay> want;
        bool servable = false;
        if (k > 0 && at_epoch == e) {
          servable = at >= served || still_held;
          if (at < served) want = Replay{e, at, k, false};
        } else if (at_epoch == (k > 0 ? e + 1 : e)) {
          servable = true;
        } else if (k == 0 && at_epoch == e - 1) {
          servable = still_held;
          want = Replay{e - 1, at, bpe, q == 0};
        }
        // Begun mid-epoch: the order it saw kept where its epochs run on
        // into the producer's next ones (each begun so far steered by its
        // join position; those not begun will be).
        bool kept = true;
        for (int64_t x = t.own_epoch + 1; x <= e && q > 0; ++x) {
          kept = kept && std::binary_search(steered_at[x].begin(), steered_at[x].end(), q);
        }
        EXPECT_EQ(asked, kept && this_run ? want : std::nullopt) << where;
        const bool exact = this_run && kept && servable;
        EXPECT_EQ(p.resumed, exact ? StartPoint::Resumed::Exact : StartPoint::Resumed::NextPass) << where;
        EXPECT_EQ(p.position, rp) << where;
        if (exact) {
          EXPECT_EQ(p.replay, want) << where;
          EXPECT_EQ(p.frame.first_epoch, t.own_epoch) << where;
          EXPECT_EQ(p.frame.joined_at, q) << where;
          t.frame = p.frame;
          t.active = true;
          t.next_index = -1;
          t.ids = {next_id++};
          plan.joined(t.ids[0], t.frame);
          if (p.replay) replay_to(t, *p.replay, e);
          if (::testing::Test::HasFatalFailure()) return checked_mid;
          trainers.push_back(t);
        } else {  // the next pass, with the producer's epochs
          EXPECT_FALSE(p.replay) << where;
          EXPECT_EQ(p.frame, plan.next_epoch_frame()) << where;
        }
      }
      // ---- the batch ----
      const std::vector<int64_t> samples = slice(order, pos, std::min(pos + sc.batch, spe));
      EXPECT_EQ(plan.on_batch(e, k, static_cast<int64_t>(samples.size())), pos) << where;
      history.emplace_back(pos, samples);
      for (Trainer& t : trainers) {
        if (!t.active) continue;
        const Framed f = plan.frame(t.frame, e, k, pos, static_cast<int64_t>(samples.size()));
        const int64_t own = pos < t.frame.joined_at ? e - 1 : e;
        EXPECT_EQ(f.in_epochs, own >= t.frame.first_epoch && own <= t.frame.last_epoch) << where;
        if (!f.in_epochs) continue;
        feed(t, f, samples);
        if (::testing::Test::HasFatalFailure()) return checked_mid;
        if (t.active) EXPECT_EQ(plan.own_epoch(t.frame), t.own_epoch) << where;
      }
    }
    EXPECT_EQ(plan.on_epoch_end(e, spe, bpe), "") << where;
    ended = history;
    for (Trainer& t : trainers) {  // the producer's end is the end of whole-epoch trainers' epochs
      if (!t.active || t.frame.joined_at != 0 || t.own_epoch != e) continue;
      EXPECT_EQ(sorted(t.own), epoch_samples.at(e)) << where;
      t.own.clear();
      t.next_index = 0;
      t.own_epoch += 1;
      t.whole += 1;
    }
  }
  if (sc.epochs >= 0) {  // a last epoch: every trainer joined mid-epoch that stayed was told it ended
    for (const Trainer& t : trainers) {
      if (t.frame.joined_at > 0 && t.active) ADD_FAILURE() << where << ": a trainer joined at " << t.frame.joined_at << " was not finished";
      if (t.finished) EXPECT_EQ(t.own_epoch, sc.epochs - 1) << where;
    }
  }
  return checked_mid;
}

}  // namespace

TEST(JoinPlan, RandomJoinsLeavesGroupsAndResumesKeepEveryEpochOfEveryTrainerWhole) {
  int64_t checked = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 pick(seed * 7919u);
    Scenario sc;
    sc.distinct = 10 + static_cast<int64_t>(pick() % 120);
    sc.repeats = pick() % 5 == 0 ? 2 : 1;  // RandomSampler(num_samples = 2n): samples repeat
    sc.batch = 1 + static_cast<int64_t>(pick() % 9);
    sc.drop_last = pick() % 2 == 0;
    sc.epochs = pick() % 3 == 0 ? 2 + static_cast<int64_t>(pick() % 4) : -1;
    if (sc.distinct * sc.repeats < sc.batch) sc.batch = 1;
    sc.window = static_cast<int64_t>(pick() % 6);
    checked += run(seed, sc);
    if (HasFailure()) {
      FAIL() << "seed " << seed << ": " << sc.distinct << "x" << sc.repeats << " samples, batch " << sc.batch
             << (sc.drop_last ? ", drop_last" : "") << ", epochs " << sc.epochs << ", catch-up window " << sc.window;
    }
  }
  EXPECT_GT(checked, 300);  // the model checked many epochs of trainers joined mid-epoch
}

TEST(JoinPlan, NobodyJoinedMidEpochIsTheLoadersOwnOrderAndBlocksMergeWhenTheyLeave) {
  JoinPlan plan(JoinPlanOptions{true, 8, 2, -1});
  std::vector<int64_t> a{3, 1, 4, 0, 5, 2, 7, 6};
  plan.steer(0);
  EXPECT_EQ(plan.order(a), a);
  plan.joined(1, Frame{0, 4, 1});
  EXPECT_EQ(plan.steer(1), std::vector<int64_t>{4});
  std::vector<int64_t> b{0, 1, 2, 3, 4, 5, 6, 7};
  // {3, 1, 4, 0} stay the first four, in b's order; then the rest in b's order.
  EXPECT_EQ(plan.order(b), (std::vector<int64_t>{0, 1, 3, 4, 2, 5, 6, 7}));
  plan.left(1);
  EXPECT_EQ(plan.steer(2), std::vector<int64_t>{});
  EXPECT_EQ(plan.order(a), a);
}

TEST(JoinPlan, ASamplerThatChangesWhatAnEpochHoldsIsAnErrorWhileTrainersJoinedMidEpoch) {
  JoinPlan plan(JoinPlanOptions{true, 4, 2, -1});
  plan.steer(0);
  plan.order({0, 1, 2, 3});
  plan.joined(1, Frame{0, 2, 1});
  plan.steer(1);
  try {
    plan.order({0, 1, 2});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("this epoch has 3 samples, the last had 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Keep the dataset and the sampler"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan.order({0, 1, 2, 5}), InvalidArgument);
  EXPECT_THROW(plan.order({0, 1, 2, 2}), InvalidArgument);
  // Nobody to keep it for: any order goes.
  plan.left(1);
  plan.steer(2);
  EXPECT_EQ(plan.order({9, 8}), (std::vector<int64_t>{9, 8}));
}

TEST(JoinPlan, AnEpochOfAnotherLengthBreaksTheEpochsOfTrainersJoinedMidEpoch) {
  JoinPlan plan(JoinPlanOptions{true, 4, 2, -1});
  plan.on_batch(0, 0, 2);
  plan.on_batch(0, 1, 2);
  EXPECT_EQ(plan.on_epoch_end(0, 4, 2), "");
  plan.on_batch(1, 0, 2);
  const std::string why = plan.on_epoch_end(1, 2, 1);
  EXPECT_NE(why.find("epoch 1 had 2 samples, not 4"), std::string::npos) << why;
}

TEST(JoinPlan, ABatchThatSpansWhereATrainersEpochsBeginBreaksItsEpochsAlone) {
  JoinPlan plan(JoinPlanOptions{true, 12, 3, -1});
  const Frame f{0, 4, 1};
  const Framed moved = plan.frame(f, 1, 0, 0, 6);  // positions 0..5 of epoch 1 span 4
  EXPECT_NE(moved.broken.find("spans sample 4"), std::string::npos) << moved.broken;
  const Framed ends = plan.frame(f, 1, 0, 0, 4);
  EXPECT_TRUE(ends.in_epochs && ends.ends_epoch && !ends.last && ends.broken.empty());
  EXPECT_EQ(ends.epoch, 0);
  EXPECT_EQ(ends.position, 8);
  EXPECT_EQ(ends.index, 2);
}

TEST(JoinPlan, WhatCannotBeServedIsAnErrorAndALoaderItCannotSteerSaysWhy) {
  EXPECT_THROW(JoinPlan(JoinPlanOptions{true, -1, 3, -1}), InvalidArgument);
  EXPECT_THROW(JoinPlan(JoinPlanOptions{false, -2, -1, -1}), InvalidArgument);
  EXPECT_THROW(JoinPlan(JoinPlanOptions{false, -1, -1, -3}), InvalidArgument);
  EXPECT_THROW(JoinPlan(JoinPlanOptions{false, -1, -1, -1, -1}), InvalidArgument);  // catch_up_window
  JoinPlan plan(JoinPlanOptions{false, -1, -1, -1});
  plan.on_batch(0, 0, 4);
  StartRequest now;
  now.join_now = true;
  const StartPoint p = plan.start(now, never_asked);
  EXPECT_EQ(p.frame, (Frame{1, 0, 0}));
  EXPECT_NE(p.why_not_now.find("not its to keep"), std::string::npos);
  EXPECT_THROW(plan.joined(1, Frame{1, 4, 1}), std::logic_error);
  EXPECT_THROW(plan.on_batch(0, 3, 4), std::logic_error);  // not the next batch
}

// A resumed trainer's epoch that runs on into a producer epoch ordered
// without its join position (it had left when that epoch began, or the
// producer is another one) cannot be resumed exactly: the samples before its
// position are another set there.
TEST(JoinPlan, AResumeIsExactOnlyWhereTheOrderKeptItsBlock) {
  for (bool stayed : {true, false}) {
    JoinPlan plan(JoinPlanOptions{true, 8, 2, -1});
    plan.steer(0);
    plan.on_epoch_begin(0);
    plan.on_batch(0, 0, 4);
    StartRequest now;
    now.join_now = true;
    const Frame f = plan.start(now, never_asked).frame;
    EXPECT_EQ(f, (Frame{0, 4, 1}));
    plan.joined(1, f);
    plan.on_batch(0, 1, 4);
    EXPECT_EQ(plan.on_epoch_end(0, 8, 2), "");
    if (!stayed) plan.left(1);
    EXPECT_EQ(plan.steer(1), stayed ? std::vector<int64_t>{4} : std::vector<int64_t>{});
    plan.on_epoch_begin(1);
    auto resume = [&](int64_t position, int64_t offset, std::optional<Replay>& asked) {
      StartRequest r;
      r.resume_epoch = 0;
      r.resume_position = position;
      r.resume_joined_at = offset;
      r.saved_in_this_run = true;
      return plan.start(r, [&](const Replay& replay) {
        asked = replay;
        return true;
      });
    };
    // Its epoch 0 at its sample 6: the producer's epoch 1 at sample 2, not begun.
    std::optional<Replay> asked;
    const StartPoint later = resume(6, 4, asked);
    EXPECT_FALSE(asked);
    EXPECT_EQ(later.resumed, stayed ? StartPoint::Resumed::Exact : StartPoint::Resumed::NextPass);
    EXPECT_EQ(later.position, 6);
    EXPECT_EQ(later.frame, (stayed ? f : Frame{1, 0, 0}));
    // Its epoch 0 at its sample 2: the producer's epoch 0 (ended) at sample 6,
    // its rest held; but it runs on into epoch 1, ordered without its block
    // if it had left.
    const StartPoint ended = resume(2, 4, asked);
    EXPECT_EQ(ended.resumed, stayed ? StartPoint::Resumed::Exact : StartPoint::Resumed::NextPass);
    if (stayed) {
      EXPECT_EQ(asked, (Replay{0, 6, 2, false}));
      EXPECT_EQ(ended.replay, asked);
    } else {
      EXPECT_FALSE(asked);
      EXPECT_FALSE(ended.replay);
    }
    // Not where a loader batch begins: never exact.
    asked.reset();
    EXPECT_EQ(resume(2, 3, asked).resumed, StartPoint::Resumed::NextPass);
    EXPECT_FALSE(asked);
  }
}

// A state saved while another run of the producer served (one restarted
// since, or a state that does not say): a position within an epoch is a place
// in that run's pass, not this one's — the next pass from there, never
// exact, nothing replayed — while an epoch's start or end is a place in any.
TEST(JoinPlan, AStateOfAnotherRunIsExactOnlyBetweenEpochs) {
  JoinPlanOptions o;
  o.join_now = true;
  o.samples_per_epoch = 8;
  o.batches_per_epoch = 2;
  o.catch_up_window = 2;
  JoinPlan plan(o);
  plan.steer(0);
  plan.on_epoch_begin(0);
  plan.on_batch(0, 0, 4);
  for (int64_t offset : {0, 4}) {
    for (int64_t epoch : {0, 3}) {
      const std::string where = "offset " + std::to_string(offset) + " epoch " + std::to_string(epoch);
      StartRequest r;
      r.resume_epoch = epoch;
      r.resume_joined_at = offset;
      r.resume_position = 2;  // within it: the rest of that run's pass is gone
      StartPoint p = plan.start(r, never_asked);
      EXPECT_EQ(p.resumed, StartPoint::Resumed::NextPass) << where;
      EXPECT_TRUE(p.other_run) << where;
      EXPECT_EQ(p.position, 2) << where;
      EXPECT_EQ(p.frame, plan.next_epoch_frame()) << where;
      EXPECT_FALSE(p.replay) << where;
      for (int64_t between : {0, 8}) {  // at its start, or after its last sample: the next epoch, whole
        r.resume_position = between;
        p = plan.start(r, never_asked);
        EXPECT_EQ(p.resumed, StartPoint::Resumed::Exact) << where << " at " << between;
        EXPECT_FALSE(p.other_run) << where;
        EXPECT_EQ(p.position, 0) << where;
        EXPECT_EQ(p.frame, plan.next_epoch_frame()) << where;
        EXPECT_FALSE(p.replay) << where;
      }
    }
  }
  // The same request of this run: its position in the epoch in progress, held.
  StartRequest same;
  same.resume_epoch = 0;
  same.resume_position = 2;
  same.saved_in_this_run = true;
  const StartPoint p = plan.start(same, [](const Replay&) { return true; });
  EXPECT_EQ(p.resumed, StartPoint::Resumed::Exact);
  EXPECT_EQ(p.replay, (Replay{0, 2, 1, false}));
}

// A plain resume (its epochs the producer's): the epoch in progress from its
// position (held, or not served yet), the one that ended last (held, with its
// end), else the same positions of the next pass.
TEST(JoinPlan, APlainResumeIsExactWhileTheStreamStillHasItsPosition) {
  JoinPlanOptions o;
  o.catch_up_window = 1;
  JoinPlan plan(o);
  plan.steer(0);
  plan.on_epoch_begin(0);
  plan.on_batch(0, 0, 4);
  plan.on_batch(0, 1, 4);
  auto resume = [&](int64_t epoch, int64_t position, bool held, std::optional<Replay>& asked) {
    StartRequest r;
    r.resume_epoch = epoch;
    r.resume_position = position;
    r.saved_in_this_run = true;
    asked.reset();
    return plan.start(r, [&](const Replay& replay) {
      asked = replay;
      return held;
    });
  };
  std::optional<Replay> asked;
  StartPoint p = resume(0, 6, true, asked);
  EXPECT_EQ(p.resumed, StartPoint::Resumed::Exact);
  EXPECT_EQ(p.frame, (Frame{0, 0, 0}));
  EXPECT_EQ(p.replay, (Replay{0, 6, 2, false}));
  p = resume(0, 8, true, asked);  // nothing from there served yet
  EXPECT_EQ(p.resumed, StartPoint::Resumed::Exact);
  EXPECT_FALSE(asked);
  p = resume(0, 6, false, asked);  // no longer held
  EXPECT_EQ(p.resumed, StartPoint::Resumed::NextPass);
  EXPECT_EQ(p.frame, (Frame{1, 0, 0}));
  EXPECT_EQ(p.position, 6);
  EXPECT_FALSE(p.replay);
  // Catching up: the epoch in progress only within the window.
  StartRequest catching;
  catching.catch_up = true;
  p = plan.start(catching, never_asked);
  EXPECT_TRUE(p.caught_up_too_late);
  EXPECT_EQ(p.frame, (Frame{1, 0, 0}));

  plan.on_batch(0, 2, 2);
  EXPECT_EQ(plan.on_epoch_end(0, 10, 3), "");
  p = resume(0, 9, true, asked);  // the epoch that ended: its rest and its end
  EXPECT_EQ(p.resumed, StartPoint::Resumed::Exact);
  EXPECT_EQ(p.replay, (Replay{0, 9, 3, true}));
  p = resume(0, 10, true, asked);  // saved after its last sample: the next epoch, from its start
  EXPECT_EQ(p.resumed, StartPoint::Resumed::Exact);
  EXPECT_EQ(p.frame, (Frame{1, 0, 0}));
  EXPECT_EQ(p.position, 0);
  EXPECT_FALSE(asked);
  plan.steer(1);
  plan.on_epoch_begin(1);
  plan.on_batch(1, 0, 4);
  p = resume(0, 9, true, asked);  // another epoch began: the next pass
  EXPECT_EQ(p.resumed, StartPoint::Resumed::NextPass);
  EXPECT_EQ(p.frame, (Frame{2, 0, 0}));
  EXPECT_FALSE(asked);
  p = plan.start(catching, [&](const Replay& r) {
    asked = r;
    return true;
  });
  EXPECT_FALSE(p.caught_up_too_late);
  EXPECT_EQ(p.frame, (Frame{1, 0, 0}));
  EXPECT_EQ(p.replay, (Replay{1, 0, 1, false}));
}
