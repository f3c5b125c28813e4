// Which CUDA runtime this process uses, chosen once, at first use.
#include "batchcast/cuda/runtime.h"

#include <cstdlib>
#include <string>

#include "batchcast/common/error.h"

namespace batchcast::cuda {

Runtime& runtime() {
  static Runtime& chosen = []() -> Runtime& {
    const char* spec = std::getenv("BATCHCAST_SIMULATED_CUDA");
    if (spec != nullptr && *spec != '\0') return simulated_runtime(spec);
    return cuda_runtime();
  }();
  return chosen;
}

Stream Runtime::current_stream() {
  throw CudaError("batchcast: a GPU's current stream is torch's (cuda::Runtime::current_stream)");
}

void* Runtime::stream_alloc(uint64_t) {
  throw CudaError("batchcast: memory of a GPU's tensors is torch's (cuda::Runtime::stream_alloc)");
}

void Runtime::stream_free(void*, Stream) noexcept {}  // (stream_alloc gave nothing out)

int64_t test_ring_delay_us() {
  static const int64_t us = [] {
    const char* text = std::getenv("BATCHCAST_TEST_RING_DELAY_US");
    if (text == nullptr || *text == '\0') return int64_t{0};
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (*end != '\0' || value < 0) {
      throw InvalidArgument("BATCHCAST_TEST_RING_DELAY_US='" + std::string(text) +
                            "': expected microseconds (an integer >= 0)");
    }
    return static_cast<int64_t>(value);
  }();
  return us;
}

}  // namespace batchcast::cuda
