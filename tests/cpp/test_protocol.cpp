// Encode/decode round trips, and that truncated, oversized, corrupted and
// random input is rejected with MalformedMessage, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "batchcast/protocol/message.h"

using namespace batchcast;
using namespace batchcast::protocol;

namespace {

Announcement sample_announcement() {
  Announcement a;
  a.epoch = 3;
  a.index = 17;
  a.seq = 99;
  a.samples = 4;
  a.layout = R"(["tuple",[["leaf",0],["leaf",1]]])";
  a.leaves.push_back(TensorLeaf{DType::Float32, {4, 3, 8, 8}, 4096});
  a.leaves.push_back(ListLeaf{ListKind::Text, {"a.jpg", "b.jpg", "", "d\xc3\xa9.jpg"}});
  return a;
}

Welcome host_welcome() {
  Welcome w;
  w.producer_pid = 77;
  w.run = 0xfeedf00d12345678;
  w.ring = Ring{5, 1 << 20, {}, {}, {}};
  w.consumer_id = 9;
  w.first_epoch = 2;
  w.samples_per_epoch = 1003;
  w.slots = 8;
  w.joined_at = 96;
  return w;
}

Hello group_hello() {
  Hello h;
  h.pid = 4321;
  h.batch_size = 16;
  h.group = "trial-17";
  h.rank = 2;
  h.world_size = 4;
  h.resume_epoch = 3;
  h.resume_position = 4480;
  h.resume_joined_at = 640;
  h.flags = Hello::kJoinNow;
  return h;
}

Ring gpu_ring(int events) {
  Ring r;
  r.bytes = 1 << 30;
  r.gpu_uuid = std::string(kUuidBytes, '\x5a');
  r.memory_handle = std::string(kHandleBytes, '\x01');
  for (int i = 0; i < events; ++i) r.event_handles.push_back(std::string(kHandleBytes, static_cast<char>(i)));
  return r;
}

}  // namespace

TEST(Protocol, AnnouncementRoundTrip) {
  Announcement a = sample_announcement();
  auto bytes = encode(a);
  EXPECT_LT(bytes.size(), 200u);  // tens of bytes, no payload
  auto b = std::get<Announcement>(decode(bytes.data(), bytes.size()));
  EXPECT_EQ(b.epoch, 3);
  EXPECT_EQ(b.index, 17);
  EXPECT_EQ(b.seq, 99u);
  EXPECT_EQ(b.samples, 4);
  EXPECT_EQ(b.layout, a.layout);
  ASSERT_EQ(b.leaves.size(), 2u);
  const auto& t = std::get<TensorLeaf>(b.leaves[0]);
  EXPECT_EQ(t.dtype, DType::Float32);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{4, 3, 8, 8}));
  EXPECT_EQ(t.offset, 4096u);
  EXPECT_EQ(t.nbytes(), 4u * 3 * 8 * 8 * 4);
  EXPECT_EQ(std::get<ListLeaf>(b.leaves[1]).items, std::get<ListLeaf>(a.leaves[1]).items);
  EXPECT_TRUE(b.indices.empty());  // the producer did not know its samples' dataset indices

  a.indices = {41, 7, -3, int64_t{1} << 40};  // it did: one per sample, any int64
  bytes = encode(a);
  EXPECT_EQ(std::get<Announcement>(decode(bytes.data(), bytes.size())).indices, a.indices);
}

TEST(Protocol, EveryKindRoundTrips) {
  std::vector<Message> all = {Hello{1234, 0, 96},
                              host_welcome(),
                              Refuse{"no"},
                              sample_announcement(),
                              EpochEnd{1, 1003, 32},
                              LoaderFailed{0, "ValueError: bad sample 7"},
                              LoaderFailed{3, "loader batch 2: no tensor", LoaderFailed::Cause::CannotShare},
                              Finished{2},
                              Finished{3, true},
                              Heartbeat{},
                              Release{{1, 2, 3}},
                              Bye{},
                              RingReady{Ring{5, 8192, {}, {}, {}}},
                              RingReady{gpu_ring(18)},
                              protocol::Evicted{"too slow"},
                              Unmapped{},
                              StatusRequest{},
                              protocol::Status{R"({"name":"imagenet","consumers":[]})"},
                              Mapped{},
                              GroupReady{3, Resume::Exact, 4480, 640},
                              GroupBroken{2, "rank 1 exited"},
                              MailboxReady{7, 1u << 20, 1u << 19, 1u << 18, 8, 10},
                              group_hello()};
  ASSERT_EQ(all.size(), std::variant_size_v<Message> + 4);  // RingReady, Hello, LoaderFailed, Finished twice
  for (const auto& m : all) {
    auto bytes = encode(m);
    auto back = decode(bytes.data(), bytes.size());
    EXPECT_EQ(back.index(), m.index()) << kind_name(m);
    EXPECT_EQ(encode(back), bytes) << kind_name(m);
    EXPECT_EQ(peek_kind(bytes.data(), bytes.size()), kind_of(m)) << kind_name(m);
  }
  // Too short for a header, or a kind no message has: none.
  EXPECT_EQ(peek_kind("BCST", 4), Kind::None);
  std::string unknown = encode(Bye{});
  unknown[6] = '\x7f';
  EXPECT_EQ(peek_kind(unknown.data(), unknown.size()), Kind::None);
}

// The numbers are the protocol: what the list makes must never move.
TEST(Protocol, KindNumbersAndNamesComeFromOneList) {
  const std::vector<std::pair<Message, uint16_t>> wire = {
      {Hello{}, 1},          {host_welcome(), 2},  {Refuse{}, 3},     {sample_announcement(), 4},
      {EpochEnd{}, 5},       {LoaderFailed{}, 6},  {Finished{}, 7},   {Heartbeat{}, 8},
      {Release{}, 9},        {Bye{}, 10},          {RingReady{Ring{5, 8192, {}, {}, {}}}, 11},
      {protocol::Evicted{}, 12}, {Unmapped{}, 13}, {StatusRequest{}, 14},
      {protocol::Status{}, 15}, {Mapped{}, 16},    {GroupReady{}, 17}, {GroupBroken{}, 18},
      {MailboxReady{3, 4096, 1024, 1024, 4, 5}, 19}};
  ASSERT_EQ(wire.size(), std::variant_size_v<Message>);
  const char* names[] = {"Hello",     "Welcome",  "Refuse",        "Announcement", "EpochEnd",
                         "LoaderFailed", "Finished", "Heartbeat", "Release",      "Bye",
                         "RingReady", "Evicted",  "Unmapped",      "StatusRequest", "Status",
                         "Mapped",    "GroupReady", "GroupBroken", "MailboxReady"};
  for (std::size_t i = 0; i < wire.size(); ++i) {
    const auto& [m, number] = wire[i];
    std::string bytes = encode(m);
    uint16_t on_wire = 0;
    std::memcpy(&on_wire, bytes.data() + 6, sizeof on_wire);
    EXPECT_EQ(on_wire, number) << kind_name(m);
    EXPECT_EQ(static_cast<uint16_t>(kind_of(m)), number);
    EXPECT_STREQ(kind_name(m), names[i]);
    EXPECT_STREQ(kind_name(static_cast<Kind>(number)), names[i]);
  }
  EXPECT_STREQ(kind_name(Kind::None), "unknown");
  EXPECT_STREQ(kind_name(static_cast<Kind>(20)), "unknown");
  static_assert(kind_of<GroupBroken>() == Kind::GroupBroken);
  // Kinds no list has are refused, by number.
  for (uint16_t unknown : {uint16_t{0}, uint16_t{20}, uint16_t{0xffff}}) {
    std::string bytes = encode(Heartbeat{});
    std::memcpy(bytes.data() + 6, &unknown, sizeof unknown);
    try {
      decode(bytes.data(), bytes.size());
      ADD_FAILURE() << "accepted kind " << unknown;
    } catch (const MalformedMessage& e) {
      EXPECT_EQ(std::string(e.what()), "unknown message kind " + std::to_string(unknown));
    }
  }
}

TEST(Protocol, EveryTruncationIsRejected) {
  std::vector<Message> all = {Hello{1234, 0}, group_hello(), host_welcome(), RingReady{gpu_ring(3)},
                              sample_announcement(), Release{{1, 2, 3}}, EpochEnd{1, 2, 3},
                              GroupReady{1, Resume::NextPass, 8}, GroupBroken{0, "gone"},
                              MailboxReady{3, 4096, 1024, 1024, 4, 5}};
  for (const auto& m : all) {
    auto bytes = encode(m);
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      EXPECT_THROW(decode(bytes.data(), n), MalformedMessage) << kind_name(m) << " cut at " << n;
    }
    bytes.push_back('x');
    EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage) << "trailing byte";
  }
}

TEST(Protocol, OversizedCountsAreRejectedBeforeAllocating) {
  // A release claiming 1M sequence numbers in a 16-byte body.
  std::string bytes = encode(Release{{1}});
  uint32_t huge = 1u << 20;
  std::memcpy(bytes.data() + kHeaderBytes, &huge, sizeof(huge));
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);
  huge = 0xffffffffu;
  std::memcpy(bytes.data() + kHeaderBytes, &huge, sizeof(huge));
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);
}

TEST(Protocol, InconsistentAnnouncementsAreRejected) {
  Announcement a = sample_announcement();
  std::get<TensorLeaf>(a.leaves[0]).shape[0] = 5;  // rows != samples
  auto bytes = encode(a);
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);

  a = sample_announcement();
  std::get<ListLeaf>(a.leaves[1]).items.pop_back();  // items != samples
  bytes = encode(a);
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);

  a = sample_announcement();
  std::get<TensorLeaf>(a.leaves[0]).shape = {4, -1};
  bytes = encode(a);
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);

  a = sample_announcement();
  std::get<TensorLeaf>(a.leaves[0]).shape = {4, int64_t{1} << 40, int64_t{1} << 40};  // overflow
  bytes = encode(a);
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);

  bytes = encode(sample_announcement());
  bytes[kHeaderBytes + 44 + 4 + a.layout.size() + 4 + 1] = 42;  // dtype byte of leaf 0 (after 44 bytes of fields)
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);

  a = sample_announcement();
  a.event = -2;
  bytes = encode(a);
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);

  for (std::size_t n : {1, 3, 5}) {  // sample indices: none, or one per sample
    a = sample_announcement();
    a.indices.assign(n, 1);
    bytes = encode(a);
    EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage) << n << " indices";
  }
}

TEST(Protocol, GpuRingsTravelAsHandlesOnly) {
  Welcome w = host_welcome();
  w.ring = gpu_ring(0);
  w.ring.bytes = 0;  // a GPU producer before its first batch: only where it will be
  w.ring.memory_handle.clear();
  auto bytes = encode(w);
  auto back = std::get<Welcome>(decode(bytes.data(), bytes.size()));
  EXPECT_TRUE(back.ring.on_gpu());
  EXPECT_FALSE(back.ring.exists());
  EXPECT_EQ(back.ring.gpu_uuid, w.ring.gpu_uuid);
  EXPECT_EQ(back.run, w.run);  // the producer's run, all 64 bits, for a resume to name

  RingReady ready{gpu_ring(18)};
  bytes = encode(ready);
  EXPECT_LT(bytes.size(), 64u * 20 + 64);  // handles, never memory
  auto r = std::get<RingReady>(decode(bytes.data(), bytes.size())).ring;
  EXPECT_EQ(r.memory_handle, ready.ring.memory_handle);
  EXPECT_EQ(r.event_handles, ready.ring.event_handles);
  EXPECT_EQ(r.fd, -1);

  Announcement a = sample_announcement();
  a.event = 17;
  bytes = encode(a);
  EXPECT_EQ(std::get<Announcement>(decode(bytes.data(), bytes.size())).event, 17);
}

TEST(Protocol, InconsistentRingsAreRejected) {
  std::vector<Ring> bad;
  bad.push_back(Ring{-1, 4096, {}, {}, {}});      // host ring without an fd
  bad.push_back(Ring{3, 0, {}, {}, {}});          // an fd but no memory
  bad.push_back(Ring{-7, 0, {}, {}, {}});         // nonsense fd
  Ring gpu = gpu_ring(0);
  bad.push_back(gpu);                             // GPU ring without events
  gpu = gpu_ring(2);
  gpu.fd = 4;
  bad.push_back(gpu);                             // GPU ring with an fd
  for (const Ring& ring : bad) {
    auto bytes = encode(RingReady{ring});
    EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);
  }
  // A ring that does not exist yet cannot be announced as ready.
  Ring later = gpu_ring(0);
  later.bytes = 0;
  later.memory_handle.clear();
  auto bytes = encode(RingReady{later});
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);
}

TEST(Protocol, OtherVersionsAreRecognised) {
  const uint16_t other = kVersion + 1;
  auto bytes = encode(Hello{1, 0}, other);
  try {
    decode(bytes.data(), bytes.size());
    FAIL() << "accepted another version";
  } catch (const VersionMismatch& e) {
    EXPECT_EQ(e.version(), other);
  }
  // A refusal is readable whatever version wrote it.
  bytes = encode(Refuse{"speak version 1"}, other);
  EXPECT_EQ(std::get<Refuse>(decode(bytes.data(), bytes.size())).reason, "speak version 1");
}

TEST(Protocol, RandomInputNeverCrashes) {
  std::mt19937_64 rng(12345);
  std::string valid = encode(sample_announcement());
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string bytes;
    if (i % 2 == 0) {
      bytes.resize(rng() % 256);
      for (auto& c : bytes) c = static_cast<char>(rng());
      if (bytes.size() >= 8 && i % 4 == 0) {  // valid header, random body
        std::memcpy(bytes.data(), valid.data(), 6);
        bytes[6] = static_cast<char>(1 + rng() % 11);
        bytes[7] = 0;
      }
    } else {  // flip a few bytes of a valid message
      bytes = valid;
      for (int k = 0; k < 3; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    try {
      decode(bytes.data(), bytes.size());
      ++accepted;
    } catch (const MalformedMessage&) {
    }
  }
  EXPECT_LT(accepted, 200000);
}

TEST(Protocol, InconsistentGroupsAndResumesAreRejected) {
  auto rejects = [](Hello h) {
    auto bytes = encode(h);
    EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);
  };
  Hello h = group_hello();
  h.rank = 4;  // not below world_size
  rejects(h);
  h = group_hello();
  h.group.clear();  // a rank of no group
  rejects(h);
  h = group_hello();
  h.world_size = 0;  // a group without ranks
  rejects(h);
  h = group_hello();
  h.resume_position = -1;
  rejects(h);
  h = group_hello();
  h.resume_joined_at = -8;
  rejects(h);
  h = group_hello();
  h.group = std::string(kMaxGroupName + 1, 'g');
  rejects(h);
  h = group_hello();
  h.resume_run = ~uint64_t{0};  // any run a state names travels as it is
  auto named = encode(h);
  EXPECT_EQ(std::get<Hello>(decode(named.data(), named.size())).resume_run, h.resume_run);
  Welcome anonymous = host_welcome();
  anonymous.run = 0;  // a producer's welcome always names its run
  named = encode(anonymous);
  EXPECT_THROW(decode(named.data(), named.size()), MalformedMessage);
  GroupReady ready{1, Resume::Exact, 0};
  auto bytes = encode(ready);
  bytes[kHeaderBytes + 8] = 7;  // no such resume kind
  EXPECT_THROW(decode(bytes.data(), bytes.size()), MalformedMessage);
}
