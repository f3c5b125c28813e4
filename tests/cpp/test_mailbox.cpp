// The mailbox: its frame queues (order across wraps, full and too large,
// records and indices that cannot be right, a writer and a reader racing,
// a writer killed at random points) and the mailbox around them (opened
// through /proc, the releases back, and the bells: rung only when the other
// side said it sleeps).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <memory>
#include <utility>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/mailbox/frame_queue.h"
#include "batchcast/mailbox/mailbox.h"
#include "batchcast/mailbox/ordering.h"

using namespace batchcast;
using Push = FrameQueue::Push;
using Pop = FrameQueue::Pop;

namespace {

// A queue in plain memory (tests that need two processes map it shared).
struct Queue {
  explicit Queue(uint64_t capacity, void* memory = nullptr)
      : owned(memory == nullptr ? new std::byte[sizeof(FrameQueue::Indices) + capacity]() : nullptr),
        base(memory != nullptr ? static_cast<std::byte*>(memory) : owned.get()),
        indices(new (base) FrameQueue::Indices()),
        capacity(capacity) {}
  FrameQueue writer() { return FrameQueue(indices, base + sizeof(FrameQueue::Indices), capacity); }
  FrameQueue reader() { return FrameQueue(indices, base + sizeof(FrameQueue::Indices), capacity); }
  std::byte* data() { return base + sizeof(FrameQueue::Indices); }

  std::unique_ptr<std::byte[]> owned;
  std::byte* base;
  FrameQueue::Indices* indices;
  uint64_t capacity;
};

// A frame that says what it is: its number, then bytes made from it.
std::string frame(uint64_t n, std::size_t size) {
  std::string f(std::max<std::size_t>(size, 8), '\0');
  std::memcpy(f.data(), &n, 8);
  for (std::size_t i = 8; i < f.size(); ++i) f[i] = static_cast<char>((n * 131 + i) & 0xff);
  return f;
}
bool intact(const std::string& f, uint64_t& n) {
  if (f.size() < 8) return false;
  std::memcpy(&n, f.data(), 8);
  return f == frame(n, f.size());
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

TEST(FrameQueue, FramesComeOutInOrderAcrossManyWraps) {
  Queue q(4096);
  FrameQueue w = q.writer(), r = q.reader();
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::size_t> size(0, FrameQueue::largest_frame(4096));
  uint64_t sent = 0, got = 0;
  std::string out;
  std::vector<std::size_t> sizes;
  while (got < 5000) {
    // Write until full, read a random part: every wrap position is met.
    while (sent < 5000) {
      std::size_t s = size(rng);
      std::string f = sent % 7 == 3 ? std::string() : frame(sent, s);
      Push p = sent % 7 == 3 ? w.push_marker() : w.push(f.data(), f.size());
      if (p == Push::Full) break;
      ASSERT_EQ(p, Push::Done);
      sizes.push_back(f.size());
      sent += 1;
    }
    const uint64_t take = std::uniform_int_distribution<uint64_t>(1, sent - got)(rng);
    for (uint64_t i = 0; i < take; ++i, ++got) {
      Pop p = r.pop(out);
      if (got % 7 == 3) {
        ASSERT_EQ(p, Pop::Marker) << got;
        continue;
      }
      ASSERT_EQ(p, Pop::Frame) << got;
      uint64_t n = 0;
      ASSERT_TRUE(intact(out, n)) << got;
      EXPECT_EQ(n, got);
      EXPECT_EQ(out.size(), sizes[got]);
    }
  }
  EXPECT_EQ(r.pop(out), Pop::Empty);
  EXPECT_FALSE(r.has_unread());
  EXPECT_EQ(r.dropped(), 0);
}

TEST(FrameQueue, AFullQueueTakesNothingAndATooLargeFrameNeverGoesIn) {
  Queue q(1024);
  FrameQueue w = q.writer(), r = q.reader();
  const std::string big(FrameQueue::largest_frame(1024) + 1, 'x');
  EXPECT_EQ(w.push(big.data(), big.size()), Push::TooLarge);
  const std::string f = frame(1, 100);  // 112 bytes a record
  int pushed = 0;
  while (w.push(f.data(), f.size()) == Push::Done) pushed += 1;
  EXPECT_EQ(pushed, 1024 / 112);
  EXPECT_EQ(w.push(f.data(), f.size()), Push::Full);  // still full: nothing was overwritten
  std::string out;
  for (int i = 0; i < pushed; ++i) {
    ASSERT_EQ(r.pop(out), Pop::Frame);
    EXPECT_EQ(out, f);
  }
  EXPECT_EQ(r.pop(out), Pop::Empty);
  EXPECT_EQ(w.push(f.data(), f.size()), Push::Done);  // room again
}

// A record that cannot be right is dropped with what was published after it,
// counted, and never followed as a size; what is published later is read.
TEST(FrameQueue, ACorruptedRecordIsDroppedAndCountedNeverTrusted) {
  Queue q(1024);
  FrameQueue w = q.writer(), r = q.reader();
  std::string out;
  const std::string f = frame(5, 40);
  const std::vector<std::pair<uint32_t, uint32_t>> bad = {
      {4000, 0x46524d31},  // a frame's size past the queue
      {500, 0x46524d31},   // past what was published
      {8, 0x12345678},     // no such record kind
      {16, 0x4d524b31},    // a marker with a body
      {3, 0x50414431},     // padding that does not reach the end
  };
  int64_t expected_drops = 0;
  for (const auto& [size, kind] : bad) {
    ASSERT_EQ(w.push(f.data(), f.size()), Push::Done);
    ASSERT_EQ(w.push(f.data(), f.size()), Push::Done);
    // The first record's header, overwritten after it was published.
    const uint64_t at = q.indices->read.load() % 1024;
    uint32_t header[2] = {size, kind};
    std::memcpy(q.data() + at, header, sizeof header);
    EXPECT_EQ(r.pop(out), Pop::Empty) << size << " " << kind;
    expected_drops += 1;
    EXPECT_EQ(r.dropped(), expected_drops);
    ASSERT_EQ(w.push(f.data(), f.size()), Push::Done);
    ASSERT_EQ(r.pop(out), Pop::Frame);
    EXPECT_EQ(out, f);
  }
}

TEST(FrameQueue, IndicesThatCannotBeRightAreNotFollowed) {
  Queue q(1024);
  FrameQueue w = q.writer(), r = q.reader();
  std::string out;
  const std::string f = frame(9, 24);
  ASSERT_EQ(w.push(f.data(), f.size()), Push::Done);
  // The writer's index far ahead, or between records: not followed.
  for (uint64_t bogus : {uint64_t{1} << 40, uint64_t{13}}) {
    q.indices->written.store(bogus);
    EXPECT_EQ(r.pop(out), Pop::Empty);
  }
  // The writer's next publish puts it right.
  ASSERT_EQ(w.push(f.data(), f.size()), Push::Done);
  ASSERT_EQ(r.pop(out), Pop::Frame);
  ASSERT_EQ(r.pop(out), Pop::Frame);
  EXPECT_EQ(r.pop(out), Pop::Empty);
  // The reader's index ahead of what was written: the writer sees no room.
  q.indices->read.store(uint64_t{1} << 40);
  EXPECT_EQ(w.push(f.data(), f.size()), Push::Full);
  EXPECT_EQ(r.dropped(), 0);
  // A side that starts from indices no queue can have never uses them.
  Queue odd(1024);
  odd.indices->written.store(13);
  FrameQueue w2 = odd.writer(), r2 = odd.reader();
  EXPECT_EQ(w2.push(f.data(), f.size()), Push::Full);
  EXPECT_EQ(r2.pop(out), Pop::Empty);
}

TEST(FrameQueue, AWriterAndAReaderRacingLoseNothing) {
  Queue q(8192);
  constexpr uint64_t kFrames = 200000;
  std::thread writer([&] {
    FrameQueue w = q.writer();
    std::mt19937 rng(3);
    for (uint64_t n = 0; n < kFrames;) {
      const std::string f = frame(n, 8 + rng() % 300);
      if (w.push(f.data(), f.size()) == Push::Done) {
        n += 1;
      } else {
        std::this_thread::yield();
      }
    }
  });
  FrameQueue r = q.reader();
  std::string out;
  uint64_t expected = 0;
  while (expected < kFrames) {
    Pop p = r.pop(out);
    if (p == Pop::Empty) {
      std::this_thread::yield();
      continue;
    }
    ASSERT_EQ(p, Pop::Frame);
    uint64_t n = 0;
    ASSERT_TRUE(intact(out, n)) << expected;
    ASSERT_EQ(n, expected);
    expected += 1;
  }
  writer.join();
  EXPECT_EQ(r.dropped(), 0);
}

// A writer process killed at any point: the reader gets every frame the
// writer published, intact and in order, and nothing half written.
TEST(FrameQueue, AWriterKilledAtRandomPointsLeavesTheReaderWorking) {
  constexpr uint64_t kCapacity = 4096;
  std::mt19937 rng(11);
  for (int round = 0; round < 20; ++round) {
    void* shared = ::mmap(nullptr, sizeof(FrameQueue::Indices) + kCapacity, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(shared, MAP_FAILED);
    Queue q(kCapacity, shared);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      FrameQueue w = q.writer();
      for (uint64_t n = 0;;) {
        const std::string f = frame(n, 8 + (n * 37) % 700);
        if (w.push(f.data(), f.size()) == Push::Done) {
          n += 1;
        } else {
          sched_yield();  // full: let the reader in (one CPU is enough)
        }
      }
    }
    FrameQueue r = q.reader();
    std::string out;
    uint64_t expected = 0;
    const uint64_t kill_after = 1 + rng() % 5000;  // frames read before the kill
    bool killed = false;
    while (true) {
      Pop p = r.pop(out);
      if (p == Pop::Empty) {
        if (killed) break;
        sched_yield();
        continue;
      }
      ASSERT_EQ(p, Pop::Frame);
      uint64_t n = 0;
      ASSERT_TRUE(intact(out, n)) << "round " << round << " frame " << expected;
      ASSERT_EQ(n, expected);
      expected += 1;
      if (!killed && expected == kill_after) {
        // Mid-write, most likely: the writer is spinning on a full queue or copying.
        ::kill(child, SIGKILL);
        ::waitpid(child, nullptr, 0);
        killed = true;
      }
    }
    EXPECT_GE(expected, kill_after);
    EXPECT_EQ(r.dropped(), 0);
    ::munmap(shared, sizeof(FrameQueue::Indices) + kCapacity);
  }
}

TEST(Mailbox, OpensThroughProcAndCarriesBothWays) {
  int bell[2];
  ASSERT_EQ(::pipe2(bell, O_NONBLOCK | O_CLOEXEC), 0);
  auto producer = Mailbox::create("test", bell[1], 7);
  auto consumer = Mailbox::open(producer->description(), ::getpid(), 7);
  std::string out;
  EXPECT_EQ(producer->post("announcement"), Push::Done);
  EXPECT_EQ(producer->post_marker(), Push::Done);
  ASSERT_EQ(consumer->receive(out), Pop::Frame);
  EXPECT_EQ(out, "announcement");
  EXPECT_EQ(consumer->receive(out), Pop::Marker);
  EXPECT_EQ(consumer->receive(out), Pop::Empty);
  EXPECT_EQ(consumer->send("release"), Push::Done);
  ASSERT_EQ(producer->collect(out), Pop::Frame);
  EXPECT_EQ(out, "release");
  EXPECT_EQ(producer->collect(out), Pop::Empty);
  const std::string too_large(FrameQueue::largest_frame(Mailbox::kToConsumerBytes) + 1, 'x');
  EXPECT_EQ(producer->post(too_large), Push::TooLarge);
  EXPECT_EQ(consumer->dropped(), 0);
  ::close(bell[0]);
  ::close(bell[1]);
}

// A side is rung only when it said it sleeps, and always then; a side about
// to sleep that has something waiting is told not to.
TEST(Mailbox, BellsRingOnlyForASideThatSleeps) {
  int bell[2];
  ASSERT_EQ(::pipe2(bell, O_NONBLOCK | O_CLOEXEC), 0);
  auto producer = Mailbox::create("test", bell[1], 7);
  auto consumer = Mailbox::open(producer->description(), ::getpid(), 7);
  std::string out;
  // Awake consumer: not rung.
  producer->post("a");
  EXPECT_FALSE(readable(consumer->consumer_bell()));
  EXPECT_FALSE(consumer->consumer_sleeps());  // "a" is there: do not sleep
  ASSERT_EQ(consumer->receive(out), Pop::Frame);
  // Sleeping consumer: rung once, and not again after it woke.
  EXPECT_TRUE(consumer->consumer_sleeps());
  producer->post("b");
  EXPECT_TRUE(readable(consumer->consumer_bell()));
  consumer->consumer_woke();
  EXPECT_FALSE(readable(consumer->consumer_bell()));
  producer->post("c");
  EXPECT_FALSE(readable(consumer->consumer_bell()));
  // The producer asks to be rung only for what it waits on.
  char c;
  auto rung = [&] {
    const bool r = readable(bell[0]);
    while (::read(bell[0], &c, 1) > 0) {
    }
    return r;
  };
  EXPECT_FALSE(producer->producer_sleeps(false, false));
  consumer->send("r1");
  consumer->made_room();
  EXPECT_FALSE(rung());
  EXPECT_TRUE(producer->producer_sleeps(true, false));  // r1 is there already
  while (producer->collect(out) == Pop::Frame) {
  }
  EXPECT_FALSE(producer->producer_sleeps(true, false));
  consumer->made_room();  // not what it waits for
  EXPECT_FALSE(rung());
  consumer->send("r2");
  EXPECT_TRUE(rung());
  consumer->send("r3");  // rung once only: the flag went down with the ring
  EXPECT_FALSE(rung());
  // Room, while a message waits for it.
  EXPECT_TRUE(producer->producer_sleeps(false, true));  // r3 is there
  while (producer->collect(out) == Pop::Frame) {
  }
  EXPECT_FALSE(producer->producer_sleeps(false, true));
  consumer->send("r4");  // not what it waits for
  EXPECT_FALSE(rung());
  while (consumer->receive(out) == Pop::Frame) {
  }
  consumer->made_room();
  EXPECT_TRUE(rung());
  ::close(bell[0]);
  ::close(bell[1]);
}

TEST(Mailbox, WhatIsNotAMailboxIsNotOpened) {
  int bell[2];
  ASSERT_EQ(::pipe2(bell, O_NONBLOCK | O_CLOEXEC), 0);
  auto producer = Mailbox::create("test", bell[1], 7);
  protocol::MailboxReady d = producer->description();
  auto with = [&](auto change) {
    protocol::MailboxReady x = d;
    change(x);
    return x;
  };
  EXPECT_THROW(Mailbox::open(with([](auto& x) { x.to_consumer += 8; }), ::getpid(), 7), MalformedMessage);
  EXPECT_THROW(Mailbox::open(with([](auto& x) { x.to_producer = 12; }), ::getpid(), 7), MalformedMessage);
  EXPECT_THROW(Mailbox::open(with([](auto& x) { x.bytes = 0; }), ::getpid(), 7), MalformedMessage);
  // Another file of the right size: not a mailbox.
  int other = ::memfd_create("other", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(other, static_cast<off_t>(d.bytes)), 0);
  EXPECT_THROW(Mailbox::open(with([&](auto& x) { x.memory_fd = other; }), ::getpid(), 7), MalformedMessage);
  // Another consumer's mailbox (a descriptor number the producer reused):
  // never attached to.
  try {
    Mailbox::open(d, ::getpid(), 8);
    ADD_FAILURE() << "opened another consumer's mailbox";
  } catch (const MalformedMessage& e) {
    EXPECT_NE(std::string(e.what()).find("consumer 7's, not this consumer's (8)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Mailbox::open(d, ::getpid(), 7));
  // No such descriptor in the producer.
  EXPECT_THROW(Mailbox::open(with([](auto& x) { x.consumer_bell = 999999; }), ::getpid(), 7), SystemError);
  ::close(other);
  ::close(bell[0]);
  ::close(bell[1]);
}

// The ordering rule (mailbox/ordering.h), without memory or sockets: messages
// of random sizes, some too large for the mailbox, a mailbox that fills up,
// a socket that delivers late and a consumer that reads at random moments —
// every message is handled once, in the order it was sent.
TEST(Ordering, MessagesTooLargeForTheMailboxTakeTheirPlaceThroughTheirMarkers) {
  for (uint32_t seed = 1; seed <= 100; ++seed) {
    std::mt19937 rng(seed);
    constexpr uint64_t kLargest = 16;
    constexpr std::size_t kRoom = 3;  // records the mailbox holds
    Outbox outbox;
    Inbox inbox;
    std::deque<std::pair<bool, std::string>> mailbox;  // (marker, message)
    std::deque<std::string> socket;                    // sent, not yet arrived
    std::vector<std::string> sent, handled;
    auto post = [&](const std::string& m) {
      if (mailbox.size() >= kRoom) return FrameQueue::Push::Full;
      mailbox.emplace_back(false, m);
      return FrameQueue::Push::Done;
    };
    auto post_marker = [&] {
      if (mailbox.size() >= kRoom) return FrameQueue::Push::Full;
      mailbox.emplace_back(true, std::string());
      return FrameQueue::Push::Done;
    };
    auto receive = [&](std::string& out) {
      if (mailbox.empty()) return FrameQueue::Pop::Empty;
      auto [marker, m] = mailbox.front();
      mailbox.pop_front();
      if (marker) return FrameQueue::Pop::Marker;
      out = m;
      return FrameQueue::Pop::Frame;
    };
    auto handle = [&](const std::string& m) { handled.push_back(m); };
    for (int step = 0; step < 300; ++step) {
      switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
        case 0: {  // the producer sends one
          const std::size_t size = std::uniform_int_distribution<std::size_t>(1, 24)(rng);
          std::string m = std::to_string(sent.size()) + ":" + std::string(size, 'x');
          sent.push_back(m);
          if (outbox.enqueue(std::make_shared<const std::string>(m), kLargest)) socket.push_back(m);
          outbox.flush(post, post_marker);
          break;
        }
        case 1:  // the socket delivers what it carries
          while (!socket.empty() && rng() % 2) {
            inbox.spilled(socket.front());
            socket.pop_front();
          }
          break;
        case 2:  // the consumer reads
          inbox.drain(receive, handle);
          break;
        case 3:  // room came: the producer posts what waited
          outbox.flush(post, post_marker);
          break;
      }
      ASSERT_LE(handled.size(), sent.size());
      for (std::size_t i = 0; i < handled.size(); ++i) ASSERT_EQ(handled[i], sent[i]) << "seed " << seed;
    }
    do {  // everything arrives, and the consumer reads it
      for (; !socket.empty(); socket.pop_front()) inbox.spilled(socket.front());
      outbox.flush(post, post_marker);
      inbox.drain(receive, handle);
    } while (!outbox.empty() || !mailbox.empty() || !socket.empty());
    EXPECT_EQ(handled, sent) << "seed " << seed;
    EXPECT_FALSE(inbox.expects_socket());
  }
}

// The producer sees a consumer's trainer blocked waiting for a message (it
// said so before sleeping, and has read everything), and no longer once a
// message is posted.
TEST(Mailbox, TheProducerSeesATrainerThatWaits) {
  int bell[2];
  ASSERT_EQ(::pipe2(bell, O_NONBLOCK | O_CLOEXEC), 0);
  auto producer = Mailbox::create("test", bell[1], 7);
  auto consumer = Mailbox::open(producer->description(), ::getpid(), 7);
  EXPECT_FALSE(producer->consumer_waits());
  ASSERT_TRUE(consumer->consumer_sleeps());
  EXPECT_TRUE(producer->consumer_waits());
  ASSERT_EQ(producer->post("hello"), FrameQueue::Push::Done);
  EXPECT_FALSE(producer->consumer_waits());  // rung, and a message to read
  consumer->consumer_woke();
  std::string out;
  ASSERT_EQ(consumer->receive(out), FrameQueue::Pop::Frame);
  EXPECT_FALSE(producer->consumer_waits());  // awake
  ASSERT_TRUE(consumer->consumer_sleeps());
  EXPECT_TRUE(producer->consumer_waits());
  ::close(bell[0]);
  ::close(bell[1]);
}
