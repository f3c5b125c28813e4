// The CUDA transport: what it says without a GPU (this runs everywhere), and
// on a GPU machine — or on the simulated device (CTest runs it there too, as
// cpp_cuda_simulated) — the ring's one-copy write path, checked byte for byte.
// Cross-process sharing is covered by tests/python/test_gpu.py and
// test_gpu_rules.py.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include "batchcast/tensor/aten.h"

#include <cstring>
#include <numeric>

#include "batchcast/cuda/runtime.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/producer/producer.h"

using namespace batchcast;

TEST(Cuda, UuidsPrintLikeNvidiaSmi) {
  std::string uuid;
  for (int i = 0; i < 16; ++i) uuid.push_back(static_cast<char>(0xa0 + i));
  EXPECT_EQ(cuda::uuid_text(uuid).size(), 4u + 32u + 4u);
  if (cuda::built()) EXPECT_EQ(cuda::uuid_text(uuid), "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");
}

TEST(Cuda, ServingFromAnInvisibleGpuIsAClearError) {
  ProducerOptions options;
  options.name = "cuda-missing";
  options.runtime_dir = ::testing::TempDir() + "/bc-cuda";
  options.cuda_device = cuda::device_count();  // one past the last visible device
  try {
    Producer producer(options);
    FAIL() << "a producer started on a device that does not exist";
  } catch (const CudaError& e) {
    std::string what = e.what();
    if (cuda::built()) {
      EXPECT_NE(what.find("cuda:" + std::to_string(options.cuda_device)), std::string::npos) << what;
      EXPECT_NE(what.find("GPU(s)"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("without its CUDA transport"), std::string::npos) << what;
    }
  }
}

TEST(Cuda, ImportingARingFromAnUnseenGpuNamesIt) {
  if (!cuda::built()) GTEST_SKIP() << "built without the CUDA transport";
  std::string uuid(16, '\x11');
  try {
    cuda::ImportedRing ring(uuid, std::string(64, '\0'), 4096, {std::string(64, '\0')});
    FAIL() << "imported a ring from a GPU that does not exist";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("GPU-11111111-1111-1111-1111-111111111111"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA_VISIBLE_DEVICES"), std::string::npos) << e.what();
  }
}

TEST(Cuda, RingCopiesStagedBytesExactlyOnce) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests need a GPU machine";
  const uint64_t n = 3 << 20;
  cuda::DeviceRing ring(0, 2 * n, 4);
  EXPECT_EQ(ring.uuid(), cuda::device_uuid(0));
  EXPECT_EQ(ring.memory_handle().size(), cuda::kHandleBytes);
  EXPECT_EQ(ring.event_handles().size(), 4u);
  // Two batches through the two staging buffers, the second at an offset.
  for (int batch = 0; batch < 2; ++batch) {
    std::byte* staged = ring.staging(n);
    for (uint64_t i = 0; i < n; ++i) staged[i] = static_cast<std::byte>((i * 7 + batch) & 0xff);
    ring.copy_in(staged, batch * n, n);
    ring.record_slot(batch);
    ring.finish_staging();
  }
  ring.synchronize();
  std::vector<uint8_t> back(2 * n);
  {
    cuda::DeviceScope scope(0);
    cuda::runtime().copy_async(back.data(), ring.data(), back.size(), cuda::Runtime::Copy::DeviceToHost, nullptr);
    cuda::runtime().stream_synchronize(nullptr);
  }
  const uint8_t* p = back.data();
  for (int batch = 0; batch < 2; ++batch) {
    for (uint64_t i = 0; i < n; i += 4099) {
      ASSERT_EQ(p[batch * n + i], static_cast<uint8_t>((i * 7 + batch) & 0xff)) << batch << " " << i;
    }
  }
  EXPECT_THROW(ring.copy_in(ring.staging(16), 2 * n - 8, 16), InvalidArgument);
}

// Loader workers write a GPU ring's batches into its pinned host mirror (same
// offsets); the producer copies them from there to the GPU with no host copy.
TEST(Cuda, LeasesOfAGpuRingAreInItsPinnedHostMirror) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests need a GPU machine";
  ProducerOptions options;
  options.name = "cuda-mirror";
  options.runtime_dir = ::testing::TempDir() + "/bc-cuda-mirror";
  options.cuda_device = 0;
  options.slots = 4;
  Producer producer(options);
  auto batch = [](at::Tensor t) {
    Batch b;
    b.samples = t.size(0);
    b.layout = "ids";
    b.leaves.emplace_back(from_aten(std::move(t)));
    return b;
  };
  producer.begin_epoch(0);
  EXPECT_FALSE(producer.lease(2));  // no ring before the first batch
  producer.publish(batch(at::arange(0, 1000, at::kLong)));  // sizes the ring
  EXPECT_EQ(producer.stats().bytes_copied, 8000);
  EXPECT_EQ(producer.host_memory().first, nullptr);  // no mirror until a lease asks for it

  auto a = producer.lease(2);
  ASSERT_TRUE(a);
  auto [mirror, mirror_bytes] = producer.host_memory();
  ASSERT_NE(mirror, nullptr);
  EXPECT_EQ(a->ring_bytes, mirror_bytes);
  EXPECT_EQ(mirror_bytes, producer.stats().ring_bytes);
  ASSERT_GE(a->fd, 0);
  EXPECT_TRUE(cuda::runtime().is_pinned(mirror + a->offsets[0]));
  auto in_mirror = [&](const Producer::Lease& l, int64_t start) {
    at::Tensor t = at::from_blob(mirror + l.offsets[0], {1000}, at::TensorOptions().dtype(at::kLong));
    t.copy_(at::arange(start, start + 1000, at::kLong));
    return t;
  };
  producer.publish(batch(in_mirror(*a, 1000)), a->seq, /*in_place=*/true);
  ProducerStats s = producer.stats();
  EXPECT_EQ(s.bytes_copied, 8000);  // the first batch's only
  EXPECT_EQ(s.batches_in_place, 1);
  EXPECT_EQ(s.direct_copies, 1);

  // Not written in place (here: it lies at another lease's place): copied
  // into its lease through staging.
  auto b = producer.lease(2);
  auto c = producer.lease(2);
  ASSERT_TRUE(b && c);
  producer.publish(batch(in_mirror(*b, 2000)), c->seq);
  s = producer.stats();
  EXPECT_EQ(s.bytes_copied, 16000);
  EXPECT_EQ(s.batches_in_place, 1);
  EXPECT_EQ(s.direct_copies, 1);
  EXPECT_EQ(s.leases_out, 1);  // b
  producer.return_lease(b->seq);
  producer.end_epoch();
  producer.finish();
}
