// The simulated device (cuda/simulated_runtime.h) keeps the CUDA rules the
// transport relies on — stream order, events that complete in stream order, a
// wait that covers the latest record as of the call, IPC only across
// processes, a context bound by calls made without one — and the transport's
// DeviceRing, run on it, reuses a staging buffer only after its copies.
// Run with BATCHCAST_SIMULATED_CUDA set (CTest does).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/cuda/runtime.h"
#include "batchcast/cuda/simulated_runtime.h"
#include "batchcast/cuda/transport.h"

using namespace batchcast;
using cuda::Runtime;

namespace {

Runtime& rt() { return cuda::runtime(); }

// A stream held back until open(): what runs on it after the gate waits.
class Gate {
 public:
  explicit Gate(cuda::Stream stream) {
    auto opened = opened_.get_future().share();
    rt().launch_host_function(stream, [opened] { opened.wait(); });
  }
  ~Gate() { open(); }
  void open() {
    if (!done_) opened_.set_value();
    done_ = true;
  }

 private:
  std::promise<void> opened_;
  bool done_ = false;
};

struct Streams {
  std::vector<cuda::Stream> all;
  cuda::Stream make() { return all.emplace_back(rt().stream_create()); }
  ~Streams() {
    for (cuda::Stream s : all) rt().stream_destroy(s);
  }
};

constexpr auto kPatience = std::chrono::seconds(20);  // for things that must happen

}  // namespace

TEST(SimulatedDevice, IsChosenByTheEnvironment) {
  ASSERT_TRUE(cuda::simulated::active()) << "run with BATCHCAST_SIMULATED_CUDA set";
  EXPECT_TRUE(cuda::built());
  EXPECT_GE(cuda::device_count(), 1);
  EXPECT_THROW(cuda::simulated::parse_options("seed=x"), InvalidArgument);
  EXPECT_THROW(cuda::simulated::parse_options("devices=0"), InvalidArgument);
  EXPECT_THROW(cuda::simulated::parse_options("speed=3"), InvalidArgument);
  EXPECT_EQ(cuda::simulated::parse_options("seed=4,max_delay_us=7,devices=2").devices, 2);
}

TEST(SimulatedDevice, AStreamRunsItsWorkInOrderAfterTheHostMovedOn) {
  Streams streams;
  cuda::Stream s = streams.make();
  std::mutex mu;
  std::vector<int> order;
  Gate gate(s);
  for (int i = 0; i < 50; ++i) {
    rt().launch_host_function(s, [&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(order.empty());  // queued behind the gate: the host did not wait
  }
  gate.open();
  rt().stream_synchronize(s);
  std::vector<int> want(50);
  for (int i = 0; i < 50; ++i) want[i] = i;
  EXPECT_EQ(order, want);
}

TEST(SimulatedDevice, AWaitCoversTheEventsLatestRecordAsOfTheCall) {
  Streams streams;
  cuda::Stream a = streams.make(), b = streams.make();
  cuda::Event e = rt().event_create(Runtime::kInterprocess);
  std::mutex mu;
  std::vector<std::string> order;
  auto note = [&](const char* what) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(what);
  };
  Gate first(a);
  rt().launch_host_function(a, [&] { note("a: before the record"); });
  rt().event_record(e, a);
  rt().stream_wait(b, e);
  std::promise<void> b_ran;
  rt().launch_host_function(b, [&] {
    note("b: after the wait");
    b_ran.set_value();
  });
  Gate second(a);  // a record after the wait's call must not hold b back
  rt().event_record(e, a);
  first.open();
  ASSERT_EQ(b_ran.get_future().wait_for(kPatience), std::future_status::ready)
      << "b waited for a record made after its wait";
  EXPECT_EQ(order, (std::vector<std::string>{"a: before the record", "b: after the wait"}));
  second.open();
  rt().stream_synchronize(a);
  rt().event_destroy(e);
}

TEST(SimulatedDevice, TheDefaultStreamRunsInTheCallingThread) {
  Streams streams;
  cuda::Stream a = streams.make();
  void* device = rt().device_alloc(1 << 16);
  std::vector<char> host(1 << 16, 'x'), back(1 << 16, 0);
  rt().copy_async(device, host.data(), host.size(), Runtime::Copy::HostToDevice, nullptr);
  rt().copy_async(back.data(), device, back.size(), Runtime::Copy::DeviceToHost, nullptr);
  EXPECT_EQ(back, host);  // done when the call returns
  // A wait on the default stream blocks the caller until the event completes.
  cuda::Event e = rt().event_create(0);
  std::atomic<bool> passed_gate{false};
  {
    Gate gate(a);
    rt().launch_host_function(a, [&] { passed_gate = true; });
    rt().event_record(e, a);
    std::thread opener([&] { gate.open(); });
    rt().stream_wait(nullptr, e);
    EXPECT_TRUE(passed_gate);
    opener.join();
  }
  rt().event_destroy(e);
  rt().device_free(device);
}

TEST(SimulatedDevice, CopiesOutsideEveryAllocationAreErrors) {
  void* device = rt().device_alloc(4096);
  std::vector<char> host(8192);
  EXPECT_THROW(rt().copy_async(device, host.data(), 8192, Runtime::Copy::HostToDevice, nullptr), CudaError);
  EXPECT_THROW(rt().copy_async(host.data(), host.data() + 4096, 16, Runtime::Copy::DeviceToHost, nullptr),
               CudaError);
  rt().device_free(device);
}

TEST(SimulatedDevice, ACallWithoutAContextBindsOneAndADeviceScopeRestoresNone) {
  std::thread([] {
    EXPECT_EQ(cuda::simulated::current_context_id(), 0u);
    cuda::Stream s = rt().stream_create();  // as libcudart: binds device 0's context, left current
    EXPECT_EQ(cuda::simulated::current_context_id(), cuda::simulated::primary_context_id(0));
    rt().stream_destroy(s);
  }).join();
  std::thread([] {
    {
      cuda::DeviceScope scope(0);
      EXPECT_EQ(cuda::simulated::current_context_id(), cuda::simulated::primary_context_id(0));
      cuda::Stream s = rt().stream_create();
      rt().stream_destroy(s);
    }
    EXPECT_EQ(cuda::simulated::current_context_id(), 0u);
  }).join();
}

TEST(SimulatedDevice, IpcHandlesOpenInAnotherProcessWhichSeesTheCopyOnceItsEventCompleted) {
  // Fork first, before any stream thread exists in this test.
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const uint64_t n = 1 << 20;
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The consumer: handles in, then wait on the event and read.
    std::string handles(2 * cuda::kHandleBytes, '\0');
    std::size_t got = 0;
    while (got < handles.size()) {
      ssize_t r = ::read(to_child[0], handles.data() + got, handles.size() - got);
      if (r <= 0) ::_exit(10);
      got += static_cast<std::size_t>(r);
    }
    try {
      const auto* memory = static_cast<const char*>(rt().open_memory_handle(handles.substr(0, 64)));
      cuda::Event e = rt().open_event_handle(handles.substr(64));
      char ready = 1;
      if (::write(from_child[1], &ready, 1) != 1) ::_exit(11);
      rt().stream_wait(nullptr, e);  // returns once the producer's copy is done
      for (uint64_t i = 0; i < n; i += 4093) {
        if (memory[i] != static_cast<char>(i % 127)) ::_exit(12);
      }
      ::_exit(0);
    } catch (...) {
      ::_exit(13);
    }
  }
  Streams streams;
  cuda::Stream s = streams.make();
  void* device = rt().device_alloc(n);
  cuda::Event e = rt().event_create(Runtime::kInterprocess);
  std::vector<char> host(n);
  for (uint64_t i = 0; i < n; ++i) host[i] = static_cast<char>(i % 127);
  const std::string memory = rt().memory_handle(device), event = rt().event_handle(e);
  EXPECT_THROW(rt().open_memory_handle(memory), CudaError);  // not in the exporting process
  Gate gate(s);
  rt().copy_async(device, host.data(), n, Runtime::Copy::HostToDevice, s);
  rt().event_record(e, s);
  const std::string handles = memory + event;
  ASSERT_EQ(::write(to_child[1], handles.data(), handles.size()), static_cast<ssize_t>(handles.size()));
  char ready = 0;
  ASSERT_EQ(::read(from_child[0], &ready, 1), 1);  // the child waits on the event now
  gate.open();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the other process read the memory before the copy, or failed";
  rt().stream_synchronize(s);
  rt().event_destroy(e);
  rt().device_free(device);
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
}

// The transport on the simulated device: six batches through the two staging
// buffers of a ring whose stream falls behind (BATCHCAST_TEST_RING_DELAY_US),
// each filled as soon as staging() hands it out. Refilling a buffer before its
// copies ran would put a later batch's bytes in an earlier slot.
TEST(SimulatedDevice, ARingRefillsAStagingBufferOnlyAfterItsCopies) {
  const uint64_t n = 1 << 18;
  cuda::DeviceRing ring(0, 6 * n, 6);
  for (int batch = 0; batch < 6; ++batch) {
    std::byte* staged = ring.staging(n);
    std::memset(staged, 'a' + batch, n);
    ring.copy_in(staged, batch * n, n);
    ring.record_slot(batch);
    ring.finish_staging();
  }
  ring.synchronize();
  std::vector<char> back(6 * n);
  rt().copy_async(back.data(), ring.data(), back.size(), Runtime::Copy::DeviceToHost, nullptr);
  for (int batch = 0; batch < 6; ++batch) {
    for (uint64_t i = 0; i < n; i += 997) {
      ASSERT_EQ(back[batch * n + i], static_cast<char>('a' + batch)) << "batch " << batch << " byte " << i;
    }
  }
}
