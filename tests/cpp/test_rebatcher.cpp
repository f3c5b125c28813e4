// Rebatching: every sample exactly once, in order, for any loader and
// consumer batch sizes; views when contiguous; releases tied to lifetime.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include "batchcast/tensor/aten.h"

#include <numeric>
#include <set>

#include "batchcast/common/error.h"
#include "batchcast/consumer/layout.h"
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

// The dataset index a producer names for the sample at stream position `id`
// (a permutation, as a shuffling sampler's).
int64_t dataset_index(int64_t id) { return (id * 7919 + 13) % 100003; }

// A fake ring of int64 sample ids: loader batch k holds ids [start, start+n)
// laid out back to back, as the producer's lanes do.
struct FakeRing {
  std::vector<int64_t> memory = std::vector<int64_t>(1 << 16);
  std::shared_ptr<CountingSink> sink = std::make_shared<CountingSink>();
  int64_t next_id = 0;
  uint64_t next_offset = 0;
  uint64_t seq = 0;
  bool indexed = false;  // the producer sends dataset indices (dataset_index of each id)

  LoaderBatch make(int64_t n, int64_t epoch = 0, bool gap = false) {
    if (gap) next_offset += 64;
    Announcement a;
    a.epoch = epoch;
    a.index = static_cast<int64_t>(seq);
    a.seq = ++seq;
    a.samples = n;
    a.position = next_id;  // ids are stream positions
    a.layout = "L";
    for (int64_t i = 0; i < n; ++i) {
      if (indexed) a.indices.push_back(dataset_index(next_id));
      memory[next_offset / 8 + static_cast<uint64_t>(i)] = next_id++;
    }
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

// A leaf as a tensor (a view of the ring made one).
at::Tensor aten_of(const ViewLeaf& leaf) {
  if (const auto* view = std::get_if<RingView>(&leaf)) return to_aten(to_tensor(*view));
  return to_aten(std::get<Tensor>(leaf));
}

std::vector<int64_t> ids(const ViewBatch& b) {
  auto t = aten_of(b.leaves[0]);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// Each sample of a batch comes with its identity: the dataset index the
// producer sent, else its position in the producer's epoch (the id its
// tensor holds; padding samples keep the identity of the sample they repeat).
void expect_identities(const ViewBatch& b, bool indexed) {
  std::vector<int64_t> want = ids(b);
  if (indexed) {
    for (int64_t& id : want) id = dataset_index(id);
  }
  ASSERT_EQ(b.indices, want);
  ASSERT_EQ(b.indexed, indexed);
}

}  // namespace

TEST(Rebatcher, ExactlyOnceInOrderForManySizes) {
  for (int64_t loader : {1, 3, 7, 32}) {
    for (int64_t consumer : {1, 2, 5, 7, 32, 33, 100}) {
      for (int64_t total : {0, 1, 10, 101}) {
        for (bool drop_last : {false, true}) {
          FakeRing ring;
          ring.indexed = (loader + consumer + total) % 2 == 1;
          Rebatcher r(consumer, drop_last);
          std::vector<int64_t> seen;
          std::vector<std::size_t> sizes;
          auto drain = [&](std::optional<ViewBatch> b) {
            while (b) {
              expect_identities(*b, ring.indexed);
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
          if (auto rest = r.flush(total)) drain(std::move(rest));
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

// A caller that does not hand identities out (the binding's plain next())
// skips composing them; a batch asked for them after such batches still gets
// its own, whether they are dataset indices or positions.
TEST(Rebatcher, IdentitiesAreComposedOnlyWhenAsked) {
  for (bool indexed : {false, true}) {
    FakeRing ring;
    ring.indexed = indexed;
    Rebatcher r(5, false);
    std::vector<int64_t> seen;
    int64_t popped = 0;
    auto drain = [&] {
      while (true) {
        const bool asked = popped % 2 == 1;
        auto b = r.pop(asked);
        if (!b) break;
        popped += 1;
        if (asked) {
          expect_identities(*b, indexed);
        } else {
          EXPECT_TRUE(b->indices.empty());
          EXPECT_EQ(b->indexed, indexed);  // what the identities would be is said either way
        }
        auto v = ids(*b);
        seen.insert(seen.end(), v.begin(), v.end());
      }
    };
    for (int i = 0; i < 8; ++i) {
      r.push(ring.make(3));  // batches of 5 span two loader batches
      drain();
    }
    auto rest = r.flush(24, /*identities=*/true);
    ASSERT_TRUE(rest);
    expect_identities(*rest, indexed);
    auto v = ids(*rest);
    seen.insert(seen.end(), v.begin(), v.end());
    std::vector<int64_t> want(24);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(seen, want);
    EXPECT_EQ(popped, 4);
  }
}

// A consumer that joined mid-epoch (its epochs begin at sample 8 of the
// producer's 20) counts stream positions in its own epochs; a sample known by
// position is known by the producer's position all the same: its own 0..11
// are the producer's 8..19, its 12..19 the producer's 0..7 of the next epoch.
TEST(Rebatcher, APositionIdentityIsTheProducersForAConsumerThatJoinedMidEpoch) {
  FakeRing ring;
  Rebatcher r(6, false);
  r.set_joined_at(8);
  r.begin_epoch(20);
  std::vector<int64_t> identities;
  for (int i = 0; i < 5; ++i) {
    r.push(ring.make(4));  // own positions 0..19, four at a time
    while (auto b = r.pop(/*identities=*/true)) {
      EXPECT_FALSE(b->indexed);
      identities.insert(identities.end(), b->indices.begin(), b->indices.end());
    }
  }
  auto rest = r.flush(20, /*identities=*/true);
  ASSERT_TRUE(rest);
  identities.insert(identities.end(), rest->indices.begin(), rest->indices.end());
  std::vector<int64_t> want;
  for (int64_t p = 8; p < 20; ++p) want.push_back(p);
  for (int64_t p = 0; p < 8; ++p) want.push_back(p);
  EXPECT_EQ(identities, want);
}

TEST(Rebatcher, ContiguousSpansAreViewsAndHoldTheirSlots) {
  FakeRing ring;
  Rebatcher r(6, false);
  r.push(ring.make(4));
  r.push(ring.make(4));
  auto b = r.pop();
  ASSERT_TRUE(b);
  auto t = aten_of(b->leaves[0]);
  EXPECT_EQ(t.data_ptr<int64_t>(), ring.memory.data());  // a view, not a copy
  EXPECT_EQ(r.stats().views, 1);
  EXPECT_EQ(r.stats().copies, 0);
  EXPECT_TRUE(ring.sink->released.count(1) == 0);
  b.reset();
  EXPECT_TRUE(ring.sink->released.count(1) == 0) << "the tensor still references slot 1";
  r.clear();  // the rebatcher lets go of slot 2's last 2 samples
  EXPECT_EQ(ring.sink->released.count(2), 0u) << "the tensor spans slot 2 too";
  t = at::Tensor();
  EXPECT_EQ(ring.sink->released.count(1), 1u);  // released when the last view died
  EXPECT_EQ(ring.sink->released.count(2), 1u);
}

TEST(Rebatcher, AViewOfOneSlotIsReleasedWithItsTensorOnly) {
  FakeRing ring;
  Rebatcher r(4, false);
  r.push(ring.make(4));
  auto b = r.pop();
  ASSERT_TRUE(b);
  ASSERT_TRUE(std::holds_alternative<RingView>(b->leaves[0]));
  RingView view = std::get<RingView>(b->leaves[0]);  // what a binding exports holds the slot
  b.reset();
  EXPECT_EQ(ring.sink->released.count(1), 0u);
  view = RingView{};
  EXPECT_EQ(ring.sink->released.count(1), 1u);
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
    ring.indexed = consumer != 9;
    Rebatcher r(consumer, false);
    r.set_max_pending(1);
    std::vector<int64_t> seen;
    for (int i = 0; i < 20; ++i) {
      r.push(ring.make(4));
      ASSERT_LE(ring.seq - ring.sink->released.size(), 2u) << "B=" << consumer;
      while (auto b = r.pop()) {
        expect_identities(*b, ring.indexed);  // spilled samples keep theirs
        auto v = ids(*b);
        auto names = std::get<Items>(b->leaves[1]).values;
        for (std::size_t k = 0; k < v.size(); ++k) ASSERT_EQ(names[k], std::to_string(v[k]));
        seen.insert(seen.end(), v.begin(), v.end());
      }
    }
    if (auto rest = r.flush(80)) {
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

// A consumer batch never joins loader batches of different structures: it
// would hand out one leaf's values under another's name. Where the layouts
// of the batches it would join differ, the error says what changed and where.
TEST(Rebatcher, RefusesToJoinLoaderBatchesWhoseStructureChanged) {
  const std::string xy = R"(["d",["x","y"],[["T",0],["S",1,false]]])";
  struct Case {
    std::string later;
    std::string says;
  };
  const std::vector<Case> cases = {
      {R"(["d",["x","z"],[["T",0],["S",1,false]]])", "the dict's keys ['x', 'y'] became ['x', 'z']"},
      {R"(["d",["y","x"],[["S",1,false],["T",0]]])", "the dict's keys ['x', 'y'] became ['y', 'x']"},
      {R"(["t",[["T",0],["S",1,false]]])", "at batch: a dict with keys ['x', 'y'] became a tuple of 2 items"},
      {R"(["d",["x","y"],[["T",0],["S",1,true]]])", "at batch['y']: a per-sample list became a per-sample tuple"},
      {"not a layout", "its structure description changed"},
  };
  for (const Case& c : cases) {
    FakeRing ring;
    Rebatcher r(6, false);
    auto first = ring.make(4);
    first.announcement.layout = xy;
    auto later = ring.make(4);
    later.announcement.layout = c.later;
    r.push(std::move(first));
    r.push(std::move(later));
    try {
      r.pop();
      FAIL() << "joined " << xy << " with " << c.later;
    } catch (const RebatchError& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("loader batch 1 of epoch 0 with loader batch 0"), std::string::npos)
          << e.what();
    }
  }
  // Batches of one structure, and a change where no consumer batch spans it, are fine.
  FakeRing ring;
  Rebatcher r(4, false);
  for (const std::string& l : {xy, xy, std::string(R"(["t",[["T",0],["S",1,false]]])")}) {
    auto b = ring.make(4);
    b.announcement.layout = l;
    r.push(std::move(b));
  }
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(r.pop().has_value());
}

TEST(Layout, SaysWhatChangedAndWhereALeafSits) {
  using layout::describe_change;
  EXPECT_FALSE(describe_change(R"(["T",0])", R"(["T",0])"));
  EXPECT_FALSE(describe_change(R"(["T", 0])", R"(["T",0])")) << "the same structure, written otherwise";
  EXPECT_EQ(*describe_change(R"(["d",["a"],[["v",3]]])", R"(["d",["a"],[["v",4]]])"),
            "at batch['a']: the value 3 became 4 (a value beside the samples, not one per sample)");
  EXPECT_EQ(*describe_change(R"(["l",[["z",1,"int64"]]])", R"(["l",[["z",2,"int64"]]])"),
            "at batch[0]: a 0-d tensor holding 1 (int64) became one holding 2 (int64) (a 0-d tensor is one "
            "value beside the samples, not one per sample)");
  EXPECT_EQ(*describe_change(R"(["n","m","P",["a","b"],[["T",0],["T",1]]])",
                             R"(["n","m","Q",["a","b"],[["T",0],["T",1]]])"),
            "at batch: a namedtuple P(a, b) became a namedtuple Q(a, b)");
  EXPECT_EQ(*describe_change(R"(["n","m","P",["a","b"],[["T",0],["v",null]]])",
                             R"(["n","m","P",["a","b"],[["T",0],["v","it's"]]])"),
            R"(at batch.b: the value None became 'it\'s' (a value beside the samples, not one per sample))");
  EXPECT_EQ(*describe_change(R"(["d",[1,"k"],[["T",0],["l",[["T",1]]]]])",
                             R"(["d",[1,"k"],[["T",0],["l",[["S",1,false]]]]])"),
            "at batch['k'][0]: a tensor became a per-sample list");
  EXPECT_EQ(layout::leaf_path(R"(["d",[1,"k"],[["T",0],["n","m","P",["img"],[["T",1]]]]])", 1),
            "batch['k'].img");
  EXPECT_EQ(layout::leaf_path(R"(["d",[1,"k"],[["T",0],["T",1]]])", 0), "batch[1]");
  EXPECT_EQ(layout::leaf_path("L", 2), "leaf 2");
  // Nothing a producer could send makes the reader fail otherwise than by saying so.
  const std::string deep(100000, '[');
  EXPECT_TRUE(describe_change(deep, "[]"));
  EXPECT_EQ(layout::leaf_path(deep, 0), "leaf 0");
  for (const char* odd : {"", "[", "[\"", "[\"T\",", "[\"d\",[\"a\"],[]]", "]", "[1 2]"}) {
    EXPECT_TRUE(describe_change(odd, R"(["T",0])")) << odd;
    EXPECT_EQ(layout::leaf_path(odd, 0), "leaf 0") << odd;
  }
}

namespace {

// What rank r of a group of W (batch B) must get from an epoch of N samples:
// of each window of W * B samples the r-th B; the last, partial window
// (unless drop_last) padded up to a multiple of W with the epoch's first
// samples (cyclically) and split into W equal parts.
std::vector<std::vector<int64_t>> reference(int64_t N, int64_t W, int64_t B, int64_t r, bool drop_last) {
  std::vector<std::vector<int64_t>> out;
  const int64_t window = W * B;
  const int64_t full = N / window;
  for (int64_t k = 0; k < full; ++k) {
    std::vector<int64_t> b(static_cast<std::size_t>(B));
    std::iota(b.begin(), b.end(), k * window + r * B);
    out.push_back(b);
  }
  const int64_t rest = N - full * window;
  if (rest > 0 && !drop_last) {
    const int64_t part = (rest + W - 1) / W;
    const int64_t head = std::min(W - 1, N);
    std::vector<int64_t> padded;
    for (int64_t i = full * window; i < N; ++i) padded.push_back(i);
    for (int64_t p = 0; static_cast<int64_t>(padded.size()) < part * W; ++p) padded.push_back(p % head);
    out.emplace_back(padded.begin() + r * part, padded.begin() + (r + 1) * part);
  }
  return out;
}

}  // namespace

TEST(Rebatcher, GroupRanksTakeDisjointPartsWithEqualCountsAndPaddedTails) {
  for (int64_t W : {1, 2, 3, 4}) {
    for (int64_t B : {1, 3, 5}) {
      for (int64_t L : {1, 4, 7}) {
        for (int64_t N : {0, 1, 2, 5, 17, 30, 61}) {
          for (bool drop_last : {false, true}) {
            for (bool known : {true, false}) {
              std::multiset<int64_t> together;
              for (int64_t r = 0; r < W; ++r) {
                FakeRing ring;
                ring.indexed = (N + L) % 2 == 1;
                Rebatcher reb(B, drop_last, GroupRank{static_cast<int32_t>(r), static_cast<int32_t>(W)});
                reb.set_max_pending(2);
                reb.begin_epoch(known ? N : -1);
                std::vector<std::vector<int64_t>> got;
                auto drain = [&](std::optional<ViewBatch> b) {
                  while (b) {
                    expect_identities(*b, ring.indexed);  // the padded tail repeats identities too
                    auto v = ids(*b);
                    auto names = std::get<Items>(b->leaves[1]).values;
                    ASSERT_EQ(names.size(), v.size());
                    for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(names[i], std::to_string(v[i]));
                    got.push_back(v);
                    b = reb.pop();
                  }
                };
                for (int64_t done = 0; done < N; done += L) {
                  reb.push(ring.make(std::min(L, N - done)));
                  drain(reb.pop());
                  // Slots held: what a window needs, never the whole epoch.
                  ASSERT_LE(ring.seq - ring.sink->released.size(), 4u)
                      << "W=" << W << " B=" << B << " L=" << L << " N=" << N << " r=" << r;
                }
                drain(reb.flush(N));
                const auto want = reference(N, W, B, r, drop_last);
                ASSERT_EQ(got, want) << "W=" << W << " B=" << B << " L=" << L << " N=" << N << " r=" << r
                                     << " drop_last=" << drop_last << " known=" << known;
                ASSERT_EQ(static_cast<int64_t>(got.size()), reb.batches_for(N));
                std::size_t taken = 0;
                for (const auto& b : got) taken += b.size();
                ASSERT_EQ(static_cast<int64_t>(taken), reb.samples_for(N));  // its share, as len() says
                for (const auto& b : got) together.insert(b.begin(), b.end());
                ASSERT_EQ(ring.sink->released.size(), ring.seq);  // every slot back once
                ASSERT_EQ(reb.position(), N);
              }
              // Together the ranks saw the epoch once (plus the padding).
              if (!drop_last) {
                for (int64_t i = 0; i < N; ++i) ASSERT_GE(together.count(i), 1u) << i;
                ASSERT_LT(static_cast<int64_t>(together.size()), N + W);
              }
            }
          }
        }
      }
    }
  }
}

TEST(Rebatcher, AResumedEpochStartsAtItsPosition) {
  for (int64_t skip : {0, 1, 5, 8, 19, 20, 25}) {
    FakeRing ring;
    Rebatcher r(3, false);
    r.begin_epoch(20, skip);
    std::vector<int64_t> seen;
    for (int i = 0; i < 5; ++i) {
      r.push(ring.make(4));
      EXPECT_LE(r.position(), std::max<int64_t>(skip, 4 * (i + 1)));
      while (auto b = r.pop()) {
        auto v = ids(*b);
        seen.insert(seen.end(), v.begin(), v.end());
      }
    }
    if (auto rest = r.flush(20)) {
      auto v = ids(*rest);
      seen.insert(seen.end(), v.begin(), v.end());
    }
    std::vector<int64_t> want;
    for (int64_t i = skip; i < 20; ++i) want.push_back(i);
    EXPECT_EQ(seen, want) << "skip=" << skip;
    EXPECT_EQ(ring.sink->released.size(), ring.seq);
  }
}

TEST(Rebatcher, AGroupPositionIsWhereItsNextWindowStarts) {
  FakeRing ring;
  Rebatcher r(2, false, GroupRank{1, 2});  // windows of 4: rank 1 takes [2, 4) of each
  r.begin_epoch(12, 4);                    // resumed after its first window
  r.push(ring.make(6));                    // 0..5: resent from the batch holding position 4
  EXPECT_EQ(r.position(), 4);
  EXPECT_FALSE(r.pop());                   // its part of window [4, 8) is [6, 8)
  r.push(ring.make(6));                    // 6..11
  auto b = r.pop();
  ASSERT_TRUE(b);
  EXPECT_EQ(ids(*b), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(r.position(), 8);
  auto last = r.pop();
  ASSERT_TRUE(last);
  EXPECT_EQ(ids(*last), (std::vector<int64_t>{10, 11}));
  EXPECT_FALSE(r.flush(12));
  EXPECT_EQ(r.position(), 12);
}

// Samples of variable length: loader batches padded (with 0) to their own
// longest; a consumer batch joining two of different widths gets that leaf
// padded to the widest (rounded up), values and the loader's own padding
// kept, the pad value after; one inside a loader batch stays a view.
TEST(Rebatcher, JoinedLoaderBatchesOfDifferentLengthsAreRepaddedWithTheDeclaredValue) {
  std::vector<int64_t> memory(4096, 0);
  auto sink = std::make_shared<CountingSink>();
  uint64_t offset = 0, seq = 0;
  int64_t next = 0;
  auto make = [&](int64_t n, int64_t width) {  // row i: 100*id + 1.. for 1 + id % width values, then 0
    Announcement a;
    a.index = static_cast<int64_t>(seq);
    a.seq = ++seq;
    a.samples = n;
    a.position = next;
    a.layout = "L";
    for (int64_t r = 0; r < n; ++r, ++next) {
      for (int64_t c = 0; c < 1 + next % width; ++c) memory[offset / 8 + r * width + c] = 100 * next + c + 1;
    }
    a.leaves.push_back(TensorLeaf{DType::Int64, {n, width}, offset});
    offset += static_cast<uint64_t>(n * width) * 8;
    return LoaderBatch{a, reinterpret_cast<const std::byte*>(memory.data()), std::make_shared<ReleaseToken>(a.seq, sink)};
  };
  for (int64_t multiple : {1, 4}) {
    Rebatcher r(3, false);
    Padding padding;
    padding.every = -1;
    padding.multiple_of = multiple;
    r.set_padding(padding);
    r.begin_epoch(6);
    r.push(make(2, 3));  // ids 0, 1: width 3
    r.push(make(4, 5));  // ids 2..5: width 5
    auto first = r.pop();  // ids 0, 1, 2: joins widths 3 and 5
    auto second = r.pop();  // ids 3, 4, 5: inside the second loader batch
    ASSERT_TRUE(first && second);
    const at::Tensor a = aten_of(first->leaves[0]);
    const int64_t width = multiple == 1 ? 5 : 8;
    ASSERT_EQ(a.sizes(), (std::vector<int64_t>{3, width}));
    for (int64_t id = 0; id < 3; ++id) {
      const int64_t loader_width = id < 2 ? 3 : 5;
      for (int64_t c = 0; c < width; ++c) {
        const int64_t want = c < 1 + id % loader_width ? 100 * id + c + 1 : c < loader_width ? 0 : -1;
        EXPECT_EQ(a[id][c].item<int64_t>(), want) << "id " << id << " column " << c;
      }
    }
    EXPECT_EQ(aten_of(second->leaves[0]).sizes(), (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(r.stats().repadded, 1);
    EXPECT_EQ(r.stats().views, 1);  // the second batch
    EXPECT_TRUE(std::holds_alternative<RingView>(second->leaves[0]));  // a view of the ring
    next = 0;
  }
  // Undeclared: the error says how to declare it.
  Rebatcher plain(3, false);
  plain.begin_epoch(6);
  plain.push(make(2, 3));
  plain.push(make(4, 5));
  try {
    plain.pop();
    ADD_FAILURE() << "no error";
  } catch (const RebatchError& e) {
    EXPECT_NE(std::string(e.what()).find("declare its pad value"), std::string::npos) << e.what();
  }
  Padding bad;
  bad.multiple_of = 0;
  EXPECT_THROW(plain.set_padding(bad), InvalidArgument);
}
