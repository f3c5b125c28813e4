// The ring's lanes: back-to-back batches, wrap, reuse only after release,
// slots held long as holes that allocation skips, and the shared memory
// region itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <deque>

#include "batchcast/common/error.h"
#include "batchcast/ring/lane_allocator.h"
#include "batchcast/ring/shared_region.h"

using namespace batchcast;

TEST(LaneAllocator, ConsecutiveBatchesAreBackToBack) {
  LaneAllocator lanes({4096 * 4, 4096});
  auto a = lanes.try_allocate({1000, 40}, {4, 8});
  auto b = lanes.try_allocate({1000, 40}, {4, 8});
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->offsets[0], 0u);
  EXPECT_EQ(b->offsets[0], 1000u);  // lane 0 contiguous
  EXPECT_EQ(a->offsets[1], 4096u * 4);
  EXPECT_EQ(b->offsets[1], 4096u * 4 + 40);
  EXPECT_NE(a->seq, b->seq);
}

TEST(LaneAllocator, NeverReusesUnreleasedSpace) {
  LaneAllocator lanes({4096});
  std::vector<LaneAllocator::Slot> slots;
  while (auto s = lanes.try_allocate({1000}, {1})) slots.push_back(*s);
  ASSERT_EQ(slots.size(), 4u);  // 4 x 1000 in 4096
  // Freeing a later slot frees its space, whatever is still held before it.
  EXPECT_TRUE(lanes.release(slots[2].seq));
  auto hole = lanes.try_allocate({1000}, {1});
  ASSERT_TRUE(hole);
  EXPECT_EQ(hole->offsets[0], 2000u);  // where slot 2 was; slots 0, 1, 3 untouched
  EXPECT_FALSE(lanes.try_allocate({1000}, {1}));
  EXPECT_TRUE(lanes.release(slots[0].seq));
  auto again = lanes.try_allocate({1000}, {1});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->offsets[0], 0u);
  EXPECT_FALSE(lanes.try_allocate({1000}, {1}));  // slot 1 still live at 1000
  EXPECT_FALSE(lanes.release(slots[2].seq));      // double release is refused
  EXPECT_FALSE(lanes.release(12345));
}

TEST(LaneAllocator, ASlotHeldForeverIsAHoleNotAWall) {
  // A consumer keeps the first batch; the others go round and round past it.
  LaneAllocator lanes({4096});
  auto kept = lanes.try_allocate({1000}, {1});
  ASSERT_TRUE(kept);
  std::deque<LaneAllocator::Slot> flowing;
  int back_to_back = 0;
  for (int i = 0; i < 1000; ++i) {
    auto s = lanes.try_allocate({1000}, {1});
    ASSERT_TRUE(s) << "batch " << i << " found no room beside the kept slot";
    EXPECT_TRUE(s->offsets[0] >= 1000u) << "overlaps the kept slot";
    if (!flowing.empty() && s->offsets[0] == flowing.back().offsets[0] + 1000) back_to_back += 1;
    flowing.push_back(*s);
    if (flowing.size() == 2) {  // two in flight, released in order
      EXPECT_TRUE(lanes.release(flowing.front().seq));
      flowing.pop_front();
    }
  }
  EXPECT_GT(back_to_back, 400);  // consecutive batches stay contiguous except at a wrap
}

TEST(LaneAllocator, AllocationsNeverOverlapLiveOnes) {
  LaneAllocator lanes({8192});
  std::vector<std::pair<uint64_t, std::pair<uint64_t, uint64_t>>> live;  // seq, [begin, end)
  uint64_t seed = 7;
  for (int i = 0; i < 20000; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t size = 1 + (seed >> 33) % 3000;
    if (auto s = lanes.try_allocate({size}, {1})) {
      for (const auto& [seq, range] : live) {
        bool overlap = s->offsets[0] < range.second && range.first < s->offsets[0] + size;
        ASSERT_FALSE(overlap) << "iteration " << i;
      }
      ASSERT_LE(s->offsets[0] + size, 8192u);
      live.push_back({s->seq, {s->offsets[0], s->offsets[0] + size}});
    }
    if (!live.empty() && ((seed >> 20) % 3 == 0 || live.size() > 5)) {
      std::size_t k = (seed >> 40) % live.size();
      lanes.release(live[k].first);
      live.erase(live.begin() + static_cast<long>(k));
    }
  }
}

TEST(LaneAllocator, TheRoomBeyondThePreferredShareIsUsedOnlyWhenNeeded) {
  LaneAllocator lanes({4096 * 4}, 0.5);  // batches stay in the first 8 KiB while they fit
  EXPECT_EQ(lanes.lane_preferred(0), 8192u);
  std::deque<LaneAllocator::Slot> flowing;
  for (int i = 0; i < 100; ++i) {  // two in flight, as consumers keep up
    auto s = lanes.try_allocate({1000}, {1});
    ASSERT_TRUE(s);
    EXPECT_LE(s->offsets[0] + 1000, 8192u) << "batch " << i << " went past the preferred share";
    flowing.push_back(*s);
    if (flowing.size() == 2) {
      lanes.release(flowing.front().seq);
      flowing.pop_front();
    }
  }
  int beyond = 0, held = static_cast<int>(flowing.size());
  while (auto s = lanes.try_allocate({1000}, {1})) {  // now nothing is released: use it all
    beyond += s->offsets[0] + 1000 > 8192 ? 1 : 0;
    held += 1;
  }
  EXPECT_EQ(held, 16);
  EXPECT_EQ(beyond, 8);
}

TEST(LaneAllocator, TooLargeIsAClearError) {
  LaneAllocator lanes({4096});
  EXPECT_THROW(lanes.try_allocate({5000}, {1}), InvalidArgument);
  EXPECT_THROW(lanes.try_allocate({10, 10}, {1, 1}), Error);  // structure changed
}

TEST(SharedRegion, ASecondMappingSeesWrites) {
  auto region = SharedRegion::create(1 << 20, "test");
  std::memcpy(region.data() + 100, "batchcast", 9);
  auto view = SharedRegion::open(::getpid(), region.fd(), 1 << 20);
  EXPECT_EQ(std::memcmp(view.data() + 100, "batchcast", 9), 0);
  std::memcpy(region.data() + 100, "BATCHCAST", 9);
  EXPECT_EQ(std::memcmp(view.data() + 100, "BATCHCAST", 9), 0);
  EXPECT_THROW(SharedRegion::open(::getpid(), region.fd(), 2 << 20), Error);  // larger than real
}
