// The CUDA transport of a build made without the CUDA toolkit: nothing is
// available, and every attempt to use a GPU ring says so.
#include "batchcast/cuda/transport.h"

namespace batchcast::cuda {
namespace {

[[noreturn]] void unavailable() {
  throw CudaError(
      "this batchcast was built without its CUDA transport (no CUDA toolkit was found when it "
      "was compiled); install the toolkit (nvcc) and reinstall batchcast to serve or receive "
      "batches in GPU memory");
}

}  // namespace

bool built() { return false; }
int device_count() { return 0; }
std::string device_uuid(int) { unavailable(); }
int visible_device(const std::string&) { unavailable(); }
std::string uuid_text(const std::string& uuid) { return "GPU-<" + std::to_string(uuid.size()) + " bytes>"; }
bool can_access_peer(int, int) { unavailable(); }

DeviceScope::DeviceScope(int, bool checked) {
  if (checked) unavailable();
}
DeviceScope::~DeviceScope() = default;

DeviceRing::DeviceRing(int device, uint64_t bytes, int) : device_(device), bytes_(bytes) { unavailable(); }
DeviceRing::~DeviceRing() = default;
void DeviceRing::free_all() {}
std::string DeviceRing::uuid() const { unavailable(); }
std::string DeviceRing::memory_handle() const { unavailable(); }
std::vector<std::string> DeviceRing::event_handles() const { unavailable(); }
std::byte* DeviceRing::staging(uint64_t) { unavailable(); }
void DeviceRing::copy_in(const std::byte*, uint64_t, uint64_t) { unavailable(); }
void DeviceRing::commit(int) { unavailable(); }
void DeviceRing::synchronize() { unavailable(); }

ImportedRing::ImportedRing(const std::string&, const std::string&, uint64_t bytes,
                           const std::vector<std::string>&)
    : bytes_(bytes) {
  unavailable();
}
ImportedRing::~ImportedRing() = default;
void ImportedRing::close_all() {}

struct ReleaseWaiter::State {};
ReleaseWaiter::ReleaseWaiter(int, std::function<void(uint64_t)>) { unavailable(); }
ReleaseWaiter::~ReleaseWaiter() = default;
void* ReleaseWaiter::acquire() { unavailable(); }
void ReleaseWaiter::add(uint64_t, void*) { unavailable(); }
void ReleaseWaiter::discard(void*) {}
int64_t ReleaseWaiter::pending() const { return 0; }

}  // namespace batchcast::cuda
