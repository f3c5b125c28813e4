// The consumer's lifecycle, in-process: every transition the Consumer makes,
// the ones a state cannot take, and random event sequences checked against
// what must always hold (a broken group stays broken, an ended stream never
// serves another epoch).
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>

#include "batchcast/consumer/lifecycle.h"

using namespace batchcast;
using L = Lifecycle;

namespace {

template <typename S>
bool is(const L& l) {
  return std::holds_alternative<S>(l.state());
}

}  // namespace

TEST(Lifecycle, AnEpochBeginsArrivesAndEnds) {
  L l(/*grouping=*/false);
  EXPECT_TRUE(is<L::Between>(l));
  l.begin(false);
  EXPECT_TRUE(l.in_epoch() && !l.arrived());
  l.batch_arrived();
  EXPECT_TRUE(l.arrived());
  l.epoch_ended();
  EXPECT_TRUE(is<L::Between>(l));
  EXPECT_FALSE(l.finished());
}

TEST(Lifecycle, AGroupsRankWaitsForItsGroupThenBegins) {
  L l(/*grouping=*/true);
  EXPECT_TRUE(l.grouping());
  EXPECT_THROW(l.begin(false), std::logic_error);  // its group is awaited first
  l.loader_failed();  // raised to the caller; it still waits for its group
  EXPECT_TRUE(l.grouping());
  l.group_ready();
  l.begin(false);
  EXPECT_TRUE(l.in_epoch());
}

TEST(Lifecycle, AStreamEndingBeforeAnEpochArrivedMakesItAndEveryLaterOnePastTheEnd) {
  L l(false);
  l.begin(false);
  l.stream_ended(/*started=*/false);
  ASSERT_TRUE(is<L::Ended>(l));
  EXPECT_TRUE(std::get<L::Ended>(l.state()).past_end);
  EXPECT_TRUE(l.finished());
  l.begin(true);
  EXPECT_TRUE(std::get<L::Ended>(l.state()).past_end);
}

TEST(Lifecycle, AStreamEndingMidEpochCutsItShortAndLaterEpochsArePastTheEnd) {
  L l(false);
  l.begin(false);
  l.batch_arrived();
  l.stream_ended(/*started=*/true);
  EXPECT_FALSE(std::get<L::Ended>(l.state()).past_end);  // this one is over (ProducerLost was raised)
  l.begin(true);
  EXPECT_TRUE(std::get<L::Ended>(l.state()).past_end);
}

TEST(Lifecycle, AGroupsRankToldTheStreamEndedIsPastItsEnd) {
  L l(true);
  l.stream_ended(false);
  EXPECT_TRUE(std::get<L::Ended>(l.state()).past_end);
}

TEST(Lifecycle, TheLoaderFailingEndsTheEpochUnderWay) {
  L l(false);
  l.begin(false);
  l.batch_arrived();
  l.loader_failed();
  EXPECT_TRUE(is<L::Between>(l));
  l.begin(false);  // the next epoch reads on (to the stream's end, which raises the loader's error)
  EXPECT_TRUE(l.in_epoch());
}

TEST(Lifecycle, ABrokenGroupStaysBrokenWhateverFollows) {
  L l(false);
  l.begin(false);
  auto error = std::make_exception_ptr(std::runtime_error("rank 1 left"));
  l.broke(error);
  l.close();
  ASSERT_TRUE(is<L::Broken>(l));
  EXPECT_EQ(std::get<L::Broken>(l.state()).error, error);
  EXPECT_THROW(l.begin(false), std::logic_error);  // the Consumer raises the group's error first
}

TEST(Lifecycle, ClosingEndsEpochsAndKeepsAKnownEnd) {
  L a(false);
  a.begin(false);
  a.close();
  EXPECT_TRUE(is<L::Closed>(a) && a.finished());
  a.begin(/*stream_end_known=*/false);
  EXPECT_TRUE(is<L::Closed>(a));  // empty epochs
  a.begin(/*stream_end_known=*/true);
  EXPECT_TRUE(std::get<L::Ended>(a.state()).past_end);

  L b(false);
  b.begin(false);
  b.stream_ended(false);
  b.close();
  EXPECT_TRUE(std::get<L::Ended>(b.state()).past_end);  // still says why there is nothing
}

TEST(Lifecycle, EventsAStateCannotTakeAreErrorsNamingIt) {
  L l(false);
  try {
    l.epoch_ended();
    FAIL();
  } catch (const std::logic_error& e) {
    EXPECT_EQ(std::string(e.what()), "consumer lifecycle: the epoch ended while between epochs");
  }
  EXPECT_THROW(l.batch_arrived(), std::logic_error);
  EXPECT_THROW(l.group_ready(), std::logic_error);
  l.begin(false);
  EXPECT_THROW(l.begin(false), std::logic_error);  // the epoch under way is drained first
  l.close();
  EXPECT_THROW(l.stream_ended(false), std::logic_error);  // a closed consumer reads nothing more
}

// Random sequences of the events a Consumer can meet; those a state cannot
// take are refused and change nothing. What always holds: Broken is for
// ever; after the stream ended no epoch is under way again; arrived only
// within an epoch; finished exactly when Ended or Closed.
TEST(Lifecycle, RandomEventsKeepItsInvariants) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    L l(rng() % 2 == 0);
    bool broken = false, ended = false;
    for (int step = 0; step < 200; ++step) {
      const L::State before = l.state();
      bool refused = false;
      try {
        switch (std::uniform_int_distribution<int>(0, 8)(rng)) {
          case 0: l.group_ready(); break;
          case 1: l.begin(rng() % 2 == 0); break;
          case 2: l.batch_arrived(); break;
          case 3: l.epoch_ended(); break;
          case 4: l.loader_failed(); break;
          case 5: l.stream_ended(rng() % 2 == 0); break;
          case 6: if (rng() % 8 == 0) l.broke(std::make_exception_ptr(std::runtime_error("x"))); break;
          case 7: if (rng() % 8 == 0) l.close(); break;
          case 8: break;
        }
      } catch (const std::logic_error&) {
        refused = true;
      }
      if (refused) ASSERT_EQ(l.state().index(), before.index()) << "seed " << seed << ": a refused event changed it";
      broken = broken || is<L::Broken>(l);
      ended = ended || is<L::Ended>(l);
      if (broken) ASSERT_TRUE(is<L::Broken>(l)) << "seed " << seed;
      if (ended && !broken) ASSERT_TRUE(is<L::Ended>(l)) << "seed " << seed << ": " << L::name(l.state());
      if (l.arrived()) ASSERT_TRUE(l.in_epoch());
      ASSERT_EQ(l.finished(), is<L::Ended>(l) || is<L::Closed>(l));
    }
  }
}
