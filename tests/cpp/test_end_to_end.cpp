// The C++ API alone (no Python): a producer and two consumers in one process,
// over a real socket and ring, as a LibTorch training program would use them.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdlib>
#include <numeric>
#include <optional>
#include <thread>

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
  b.leaves.emplace_back(at::arange(start, start + n, at::kLong));
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
        auto t = std::get<at::Tensor>(batch->leaves[0]);
        const auto& names = std::get<Items>(batch->leaves[1]).values;
        for (int64_t i = 0; i < t.size(0); ++i) {
          seen->back().push_back(t[i].item<int64_t>());
          EXPECT_EQ(names[static_cast<size_t>(i)], "s" + std::to_string(t[i].item<int64_t>()));
        }
      }
    }
    consumer.begin_epoch();
    EXPECT_FALSE(consumer.next());  // no third epoch
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
    consumer.begin_epoch();
    EXPECT_FALSE(consumer.next().has_value());  // and then the stream's end, at once
    EXPECT_TRUE(consumer.finished());
  }
}
