// The CUDA runtime of a build made without the CUDA toolkit: no device is
// visible, and every attempt to use a GPU ring says so. (The simulated device
// of the tests is still there: cuda/simulated_runtime.cpp.)
#include "batchcast/common/error.h"
#include "batchcast/cuda/runtime.h"

namespace batchcast::cuda {
namespace {

[[noreturn]] void unavailable() {
  throw CudaError(
      "this batchcast was built without its CUDA transport (no CUDA toolkit was found when it "
      "was compiled); install the toolkit (nvcc) and reinstall batchcast to serve or receive "
      "batches in GPU memory");
}

class UnavailableRuntime final : public Runtime {
 public:
  bool built() const override { return false; }
  int device_count() noexcept override { return 0; }
  std::string device_uuid(int) override { unavailable(); }
  bool can_access_peer(int, int) override { unavailable(); }
  bool context_switching() noexcept override { return false; }
  bool current_context(void**) noexcept override { return false; }
  bool set_current_context(void*) noexcept override { return false; }
  void* primary_context(int) noexcept override { return nullptr; }
  bool current_device(int*) noexcept override { return false; }
  void set_device(int) override { unavailable(); }
  void* device_alloc(uint64_t) override { unavailable(); }
  void device_free(void*) noexcept override {}
  void* host_alloc(uint64_t) override { unavailable(); }
  void host_free(void*) noexcept override {}
  bool is_pinned(const void*) noexcept override { return false; }
  void host_register(void*, uint64_t) override { unavailable(); }
  void host_unregister(void*) noexcept override {}
  Stream stream_create() override { unavailable(); }
  void stream_destroy(Stream) noexcept override {}
  void stream_synchronize(Stream) override { unavailable(); }
  void stream_wait(Stream, Event) override { unavailable(); }
  void launch_host_function(Stream, std::function<void()>) override { unavailable(); }
  Event event_create(unsigned) override { unavailable(); }
  void event_destroy(Event) noexcept override {}
  void event_record(Event, Stream) override { unavailable(); }
  void event_synchronize(Event) override { unavailable(); }
  void copy_async(void*, const void*, uint64_t, Copy, Stream) override { unavailable(); }
  void device_synchronize() override { unavailable(); }
  std::string memory_handle(void*) override { unavailable(); }
  void* open_memory_handle(const std::string&) override { unavailable(); }
  void close_memory_handle(void*) noexcept override {}
  std::string event_handle(Event) override { unavailable(); }
  Event open_event_handle(const std::string&) override { unavailable(); }
};

}  // namespace

Runtime& cuda_runtime() {
  static UnavailableRuntime runtime;
  return runtime;
}

}  // namespace batchcast::cuda
