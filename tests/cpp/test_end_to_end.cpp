// The C++ API alone (no Python): a producer and two consumers in one process,
// over a real socket and ring, as a LibTorch training program would use them.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include "batchcast/tensor/aten.h"
#include <unistd.h>

#include <cstdlib>
#include <numeric>
#include <optional>
#include <thread>

#include <zmq.hpp>

#include "batchcast/common/error.h"
#include "batchcast/consumer/consumer.h"
#include "batchcast/producer/producer.h"

using namespace batchcast;

namespace {

// A private runtime directory, removed at the end (producers leave it empty).
struct PrivateDir {
  std::string path;
  PrivateDir() {
    char tmpl[] = "/tmp/batchcast-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~PrivateDir() { EXPECT_EQ(::rmdir(path.c_str()), 0) << path << " is not empty"; }
};

Batch ids(int64_t start, int64_t n) {
  Batch b;
  b.samples = n;
  b.layout = "ids";
  b.leaves.emplace_back(from_aten(at::arange(start, start + n, at::kLong)));
  Items names;
  for (int64_t i = start; i < start + n; ++i) names.values.push_back("s" + std::to_string(i));
  b.leaves.emplace_back(std::move(names));
  return b;
}

}  // namespace

TEST(EndToEnd, TwoConsumersGetEverySampleOnceOverTwoEpochs) {
  PrivateDir scratch;
  const std::string& dir = scratch.path;
  std::optional<Producer> producer_holder;
  producer_holder.emplace(ProducerOptions{"e2e", dir, 4});
  Producer& producer = *producer_holder;
  std::thread serve([&] {
    ASSERT_TRUE(producer.wait_for_consumers(2, 30));
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      producer.begin_epoch(epoch);
      for (int64_t start = 0; start < 103; start += 10) producer.publish(ids(start, std::min<int64_t>(10, 103 - start)));
      producer.end_epoch();
    }
    producer.finish();
  });
  auto run = [&](int64_t batch_size, std::vector<std::vector<int64_t>>* seen) {
    ConsumerOptions options;
    options.name = "e2e";
    options.batch_size = batch_size;
    options.runtime_dir = dir;
    Consumer consumer(options);
    for (int epoch = 0; epoch < 2; ++epoch) {
      EXPECT_EQ(consumer.begin_epoch(), epoch);
      seen->emplace_back();
      while (auto batch = consumer.next()) {
        auto t = to_aten(std::get<Tensor>(batch->leaves[0]));
        const auto& names = std::get<Items>(batch->leaves[1]).values;
        for (int64_t i = 0; i < t.size(0); ++i) {
          seen->back().push_back(t[i].item<int64_t>());
          EXPECT_EQ(names[static_cast<size_t>(i)], "s" + std::to_string(t[i].item<int64_t>()));
        }
      }
    }
    consumer.begin_epoch();
    try {
      (void)consumer.next();
      ADD_FAILURE() << "a third epoch of a producer that served two";
    } catch (const EpochsExhausted& e) {
      EXPECT_NE(std::string(e.what()).find("asked for epoch 2"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(consumer.finished());
  };
  std::vector<std::vector<int64_t>> a, b;
  std::thread ta(run, 7, &a), tb(run, 25, &b);
  ta.join();
  tb.join();
  serve.join();
  producer_holder.reset();  // removes its socket and lock files
  std::vector<int64_t> want(103);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(a, (std::vector<std::vector<int64_t>>{want, want}));
  EXPECT_EQ(b, (std::vector<std::vector<int64_t>>{want, want}));
}

// A close() ended by an interrupt (Ctrl-C) while it waits for a consumer to
// map the ring still lets everything go: before, the I/O thread was left
// joinable and the producer's destructor (at the interpreter's exit) was
// std::terminate — "terminate called without an active exception".
TEST(EndToEnd, ACloseInterruptedWhileAConsumerHasNotMappedTheRingLetsEverythingGo) {
  PrivateDir dir;
  ProducerOptions o;
  o.name = "interrupted";
  o.runtime_dir = dir.path;
  o.linger = 60;
  bool closing = false;
  o.interrupt = [&closing] {
    if (closing) throw std::runtime_error("KeyboardInterrupt");
  };
  auto producer = std::make_unique<Producer>(o);
  // A consumer that says Hello and never maps the ring (it never will).
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(producer->endpoint());
  protocol::Hello hello;
  hello.pid = ::getpid();
  const std::string bytes = protocol::encode(hello);
  dealer.send(zmq::buffer(bytes));
  ASSERT_TRUE(producer->wait_for_consumers(1, 30.0));
  producer->begin_epoch(0);
  producer->publish(ids(0, 4));
  producer->end_epoch();
  producer->finish();
  closing = true;
  EXPECT_THROW(producer->close(), std::runtime_error);
  producer.reset();  // the I/O thread joined, the ring, socket and name let go
  o.interrupt = nullptr;
  Producer again(o);  // the name is free
  again.close();
}

TEST(EndToEnd, NoProducerIsAClearErrorAfterTheTimeout) {
  ConsumerOptions options;
  options.name = "nobody";
  options.timeout = 0.3;
  PrivateDir scratch;
  options.runtime_dir = scratch.path;
  try {
    Consumer consumer(options);
    FAIL() << "connected to nothing";
  } catch (const ProducerLost& e) {
    EXPECT_NE(std::string(e.what()).find("no batchcast producer named 'nobody'"), std::string::npos);
  }
}

TEST(EndToEnd, TwoProducersCannotShareAName) {
  PrivateDir scratch;
  {
    Producer first(ProducerOptions{"same", scratch.path});
    EXPECT_THROW(Producer(ProducerOptions{"same", scratch.path}), NameInUse);
  }
  Producer again(ProducerOptions{"same", scratch.path});  // free once the first is gone
}

// The producer's life is one state: what each call does in each phase.
TEST(EndToEnd, TheProducersLifeGoesOneWay) {
  PrivateDir scratch;
  using Phase = Producer::Phase;
  {
    // finish(): the stream has ended; nothing can follow it, stop() changes nothing.
    Producer p(ProducerOptions{"life", scratch.path, 4});
    EXPECT_EQ(p.phase(), Phase::Serving);
    p.begin_epoch(0);
    p.publish(ids(0, 4));
    p.end_epoch();
    p.finish();
    EXPECT_EQ(p.phase(), Phase::Served);
    try {
      p.publish(ids(4, 4));
      FAIL() << "published after the stream's end";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("publish: producer 'life' has ended its stream"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(p.begin_epoch(1), InvalidArgument);
    p.finish();  // idempotent
    p.fail("late");  // the stream has ended: nothing to tell
    p.stop();
    EXPECT_EQ(p.phase(), Phase::Served);
    p.close();
    EXPECT_EQ(p.phase(), Phase::Closed);
    p.close();  // idempotent
  }
  {
    // stop() mid-stream: every call says Stopped; finish() still tells consumers the end.
    Producer p(ProducerOptions{"life", scratch.path, 4});
    p.begin_epoch(0);
    p.stop();
    EXPECT_EQ(p.phase(), Phase::Stopping);
    EXPECT_THROW(p.publish(ids(0, 4)), Stopped);
    EXPECT_THROW(p.end_epoch(), Stopped);
    EXPECT_THROW(p.wait_for_consumers(1, 5), Stopped);
    p.finish();
    EXPECT_EQ(p.phase(), Phase::Stopped);
  }
  {
    // fail(): the loader's error ends the stream; a consumer gets it, then the end.
    Producer p(ProducerOptions{"life", scratch.path, 4});
    std::thread serve([&] {
      ASSERT_TRUE(p.wait_for_consumers(1, 30));
      p.begin_epoch(0);
      p.publish(ids(0, 4));
      p.fail("ValueError: bad sample 5");
    });
    ConsumerOptions options;
    options.name = "life";
    options.runtime_dir = scratch.path;
    Consumer consumer(options);
    EXPECT_EQ(consumer.begin_epoch(), 0);
    ASSERT_TRUE(consumer.next().has_value());
    try {
      consumer.next();
      FAIL() << "the loader's error did not reach the consumer";
    } catch (const LoaderError& e) {
      EXPECT_NE(std::string(e.what()).find("raised: ValueError: bad sample 5"), std::string::npos) << e.what();
    }
    serve.join();
    EXPECT_EQ(p.phase(), Phase::Served);
    consumer.begin_epoch();  // the stream ended in that error: a later epoch raises it again
    EXPECT_THROW(consumer.next(), LoaderError);
    EXPECT_TRUE(consumer.finished());
  }
}

// Leases: a loader worker writes a batch into a slot reserved for it, and the
// producer, told so, announces it without copying; anything else is copied
// (into its lease where it fits); a batch said to be in place that is not
// where its lease is, is refused.
TEST(Leases, BatchesWrittenInPlaceAreNotCopiedAndEverythingElseIs) {
  PrivateDir scratch;
  ProducerOptions po{"leases", scratch.path, 4};
  Producer producer(po);
  EXPECT_FALSE(producer.lease(8));  // no ring before the first batch

  std::vector<std::vector<int64_t>> seen;
  std::thread consume([&] {
    ConsumerOptions options;
    options.name = "leases";
    options.runtime_dir = scratch.path;
    Consumer consumer(options);  // the loader's batches as they are
    consumer.begin_epoch();
    while (auto batch = consumer.next()) {
      auto t = to_aten(std::get<Tensor>(batch->leaves[0]));
      const auto& names = std::get<Items>(batch->leaves[1]).values;
      seen.emplace_back();
      for (int64_t i = 0; i < t.size(0); ++i) {
        seen.back().push_back(t[i].item<int64_t>());
        EXPECT_EQ(names[static_cast<size_t>(i)], "s" + std::to_string(t[i].item<int64_t>()));
      }
    }
  });
  ASSERT_TRUE(producer.wait_for_consumers(1, 30));
  producer.begin_epoch(0);
  producer.publish(ids(0, 10));  // sizes the ring: 10 int64 per batch
  EXPECT_EQ(producer.stats().bytes_copied, 80);

  // In place: written where the lease says, announced without a copy.
  auto lease = producer.lease(2);
  ASSERT_TRUE(lease);
  ASSERT_EQ(lease->offsets.size(), 1u);
  EXPECT_EQ(lease->bytes, std::vector<uint64_t>{80});
  EXPECT_GE(lease->fd, 0);
  auto [ring, ring_bytes] = producer.host_memory();
  ASSERT_NE(ring, nullptr);
  EXPECT_EQ(lease->ring_bytes, ring_bytes);
  auto in_place = [&](const Producer::Lease& l, int64_t start, int64_t n) {
    Batch b = ids(start, n);
    at::Tensor t = at::from_blob(ring + l.offsets[0], {n}, at::TensorOptions().dtype(at::kLong));
    t.copy_(to_aten(std::get<Tensor>(b.leaves[0])));
    b.leaves[0] = from_aten(t);
    return b;
  };
  producer.publish(in_place(*lease, 10, 10), lease->seq, true);
  ProducerStats s = producer.stats();
  EXPECT_EQ(s.bytes_copied, 80);
  EXPECT_EQ(s.batches_in_place, 1);
  EXPECT_EQ(s.leases_out, 0);

  // At most `limit` out; a smaller batch (an epoch's last) fits its lease.
  auto a = producer.lease(2);
  auto b = producer.lease(2);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(producer.lease(2));
  EXPECT_EQ(producer.stats().leases_out, 2);
  producer.publish(in_place(*a, 20, 4), a->seq, true);
  EXPECT_EQ(producer.stats().batches_in_place, 2);

  // Said to be in place in lease c, but lying at lease b's place: refused,
  // and both leases stay out.
  auto c = producer.lease(3);
  ASSERT_TRUE(c);
  try {
    producer.publish(in_place(*b, 24, 10), c->seq, true);
    FAIL() << "a batch that does not lie in its lease was published as in place";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("does not lie there"), std::string::npos) << e.what();
  }
  EXPECT_THROW(producer.publish(ids(24, 10), std::nullopt, true), InvalidArgument);  // in place, no lease
  s = producer.stats();
  EXPECT_EQ(s.batches_in_place, 2);
  EXPECT_EQ(s.leases_out, 2);
  producer.return_lease(c->seq);
  producer.publish(in_place(*b, 24, 10), b->seq, true);
  s = producer.stats();
  EXPECT_EQ(s.bytes_copied, 80);
  EXPECT_EQ(s.batches_in_place, 3);
  EXPECT_EQ(s.leases_out, 0);

  // A batch larger than its lease: copied to a slot of its own, lease back.
  auto f = producer.lease(2);
  ASSERT_TRUE(f);
  producer.publish(ids(34, 12), f->seq);
  s = producer.stats();
  EXPECT_EQ(s.bytes_copied, 80 + 96);
  EXPECT_EQ(s.leases_out, 0);

  // Ordinary memory with a lease: copied into the leased slot.
  auto d = producer.lease(2);
  ASSERT_TRUE(d);
  producer.publish(ids(46, 10), d->seq);
  s = producer.stats();
  EXPECT_EQ(s.bytes_copied, 80 + 96 + 80);
  EXPECT_EQ(s.leases_out, 0);

  // Naming a lease that is not out is an error; returning one twice is harmless.
  EXPECT_THROW(producer.publish(ids(56, 10), d->seq), InvalidArgument);
  auto e = producer.lease(2);
  ASSERT_TRUE(e);
  EXPECT_TRUE(producer.lease_out(e->seq));
  producer.return_lease(e->seq);
  producer.return_lease(e->seq);
  EXPECT_FALSE(producer.lease_out(e->seq));
  EXPECT_EQ(producer.stats().leases_out, 0);
  // At an epoch's end every lease still out goes back at once.
  auto g = producer.lease(2);
  auto h = producer.lease(2);
  ASSERT_TRUE(g && h);
  EXPECT_EQ(producer.return_leases(), 2);
  EXPECT_FALSE(producer.lease_out(g->seq) || producer.lease_out(h->seq));
  EXPECT_EQ(producer.return_leases(), 0);

  producer.end_epoch();
  producer.finish();
  consume.join();
  std::vector<std::vector<int64_t>> want;
  for (auto [start, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {10, 10}, {20, 4}, {24, 10}, {34, 12}, {46, 10}}) {
    want.emplace_back(n);
    std::iota(want.back().begin(), want.back().end(), start);
  }
  EXPECT_EQ(seen, want);
}
