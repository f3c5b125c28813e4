// Rebatching: every sample exactly once, in order, for any loader and
// consumer batch sizes; views when contiguous; releases tied to lifetime.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <numeric>
#include <set>

#include "batchcast/common/error.h"
#include "batchcast/consumer/rebatcher.h"

using namespace batchcast;
using protocol::Announcement;
using protocol::DType;
using protocol::TensorLeaf;

namespace {

struct CountingSink : ReleaseSink {
  std::multiset<uint64_t> released;
  void release(uint64_t seq, const std::optional<cuda::StreamRef>&) noexcept override { released.insert(seq); }
};

// A fake ring of int64 sample ids: loader batch k holds ids [start, start+n)
// laid out back to back, as the producer's lanes do.
struct FakeRing {
  std::vector<int64_t> memory = std::vector<int64_t>(1 << 16);
  std::shared_ptr<CountingSink> sink = std::make_shared<CountingSink>();
  int64_t next_id = 0;
  uint64_t next_offset = 0;
  uint64_t seq = 0;

  LoaderBatch make(int64_t n, int64_t epoch = 0, bool gap = false) {
    if (gap) next_offset += 64;
    Announcement a;
    a.epoch = epoch;
    a.index = static_cast<int64_t>(seq);
    a.seq = ++seq;
    a.samples = n;
    a.layout = "L";
    for (int64_t i = 0; i < n; ++i) memory[next_offset / 8 + static_cast<uint64_t>(i)] = next_id++;
    a.leaves.push_back(TensorLeaf{DType::Int64, {n}, next_offset});
    a.leaves.push_back(protocol::ListLeaf{protocol::ListKind::Text, {}});
    for (int64_t i = 0; i < n; ++i) {
      std::get<protocol::ListLeaf>(a.leaves[1]).items.push_back(std::to_string(next_id - n + i));
    }
    next_offset += static_cast<uint64_t>(n) * 8;
    return LoaderBatch{a, reinterpret_cast<const std::byte*>(memory.data()),
                       std::make_shared<ReleaseToken>(a.seq, sink)};
  }
};

std::vector<int64_t> ids(const Batch& b) {
  auto t = std::get<at::Tensor>(b.leaves[0]);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

}  // namespace

TEST(Rebatcher, ExactlyOnceInOrderForManySizes) {
  for (int64_t loader : {1, 3, 7, 32}) {
    for (int64_t consumer : {1, 2, 5, 7, 32, 33, 100}) {
      for (int64_t total : {0, 1, 10, 101}) {
        for (bool drop_last : {false, true}) {
          FakeRing ring;
          Rebatcher r(consumer, drop_last);
          std::vector<int64_t> seen;
          std::vector<std::size_t> sizes;
          auto drain = [&](std::optional<Batch> b) {
            while (b) {
              auto v = ids(*b);
              auto names = std::get<Items>(b->leaves[1]).values;
              ASSERT_EQ(names.size(), v.size());
              for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(names[i], std::to_string(v[i]));
              sizes.push_back(v.size());
              seen.insert(seen.end(), v.begin(), v.end());
              b = r.pop();
            }
          };
          for (int64_t done = 0; done < total; done += loader) {
            r.push(ring.make(std::min(loader, total - done)));
            drain(r.pop());
          }
          if (auto rest = r.flush()) drain(std::move(rest));
          int64_t expect = drop_last ? total / consumer * consumer : total;
          std::vector<int64_t> want(static_cast<std::size_t>(expect));
          std::iota(want.begin(), want.end(), 0);
          ASSERT_EQ(seen, want) << "L=" << loader << " B=" << consumer << " N=" << total;
          for (std::size_t i = 0; i + 1 < sizes.size(); ++i) ASSERT_EQ(sizes[i], std::size_t(consumer));
          // Everything handed out has been dropped: every slot is released once.
          ASSERT_EQ(ring.sink->released.size(), ring.seq);
        }
      }
    }
  }
}

TEST(Rebatcher, ContiguousSpansAreViewsAndHoldTheirSlots) {
  FakeRing ring;
  Rebatcher r(6, false);
  r.push(ring.make(4));
  r.push(ring.make(4));
  auto b = r.pop();
  ASSERT_TRUE(b);
  auto t = std::get<at::Tensor>(b->leaves[0]);
  EXPECT_EQ(t.data_ptr<int64_t>(), ring.memory.data());  // a view, not a copy
  EXPECT_EQ(r.stats().views, 1);
  EXPECT_EQ(r.stats().copies, 0);
  EXPECT_TRUE(ring.sink->released.count(1) == 0);
  b.reset();
  EXPECT_TRUE(ring.sink->released.count(1) == 0) << "the tensor still references slot 1";
  t = at::Tensor();
  EXPECT_EQ(ring.sink->released.count(1), 1u);  // released when the last view died
  EXPECT_EQ(ring.sink->released.count(2), 0u);  // 2 samples of slot 2 still pending
  r.clear();
  EXPECT_EQ(ring.sink->released.count(2), 1u);
}

TEST(Rebatcher, NonContiguousSpansAreCopied) {
  FakeRing ring;
  Rebatcher r(6, false);
  r.push(ring.make(4));
  r.push(ring.make(4, 0, /*gap=*/true));
  auto b = r.pop();
  ASSERT_TRUE(b);
  EXPECT_EQ(ids(*b), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(r.stats().copies, 1);
  EXPECT_EQ(ring.sink->released.count(1), 1u);  // the copy holds nothing
}

TEST(Rebatcher, SpillingBoundsHeldSlotsAndKeepsEverySample) {
  // B much larger than L with at most 1 pending slot: pending samples are
  // copied out, so no more than 2 slots are ever held, and nothing is lost.
  for (int64_t consumer : {5, 9, 30}) {
    FakeRing ring;
    Rebatcher r(consumer, false);
    r.set_max_pending(1);
    std::vector<int64_t> seen;
    for (int i = 0; i < 20; ++i) {
      r.push(ring.make(4));
      ASSERT_LE(ring.seq - ring.sink->released.size(), 2u) << "B=" << consumer;
      while (auto b = r.pop()) {
        auto v = ids(*b);
        auto names = std::get<Items>(b->leaves[1]).values;
        for (std::size_t k = 0; k < v.size(); ++k) ASSERT_EQ(names[k], std::to_string(v[k]));
        seen.insert(seen.end(), v.begin(), v.end());
      }
    }
    if (auto rest = r.flush()) {
      auto v = ids(*rest);
      seen.insert(seen.end(), v.begin(), v.end());
    }
    std::vector<int64_t> want(80);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(seen, want) << "B=" << consumer;
    if (consumer > 8) EXPECT_GT(r.stats().spills, 0) << "B=" << consumer;  // needs 3+ batches
  }
}

TEST(Rebatcher, MismatchedSampleShapesAreAClearError) {
  FakeRing ring;
  Rebatcher r(6, false);
  r.push(ring.make(4));
  auto other = ring.make(4);
  std::get<TensorLeaf>(other.announcement.leaves[0]).dtype = DType::Float64;
  r.push(std::move(other));
  try {
    r.pop();
    FAIL() << "rebatched float64 with int64";
  } catch (const RebatchError& e) {
    EXPECT_NE(std::string(e.what()).find("int64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos) << e.what();
  }
}
