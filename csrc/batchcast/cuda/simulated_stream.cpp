// Events of the simulated device (simulated_stream.h): their records run
// and waited for through a futex on their shared state.
#include "batchcast/cuda/simulated_stream.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

#include "batchcast/common/endpoint.h"

namespace batchcast::cuda::simulated {
namespace {

bool alive(int64_t pid) { return pid == ::getpid() || process_alive(static_cast<long>(pid)); }

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

void complete(EventState* e, uint32_t record) {
  uint32_t seen = e->completed.load();
  while (seen < record && !e->completed.compare_exchange_weak(seen, record)) {
  }
  futex_wake(&e->completed);
}

void wait_for(const SimEvent& e, uint32_t record) {
  while (true) {
    const uint32_t seen = e.state->completed.load();
    if (seen >= record) return;
    futex_wait(&e.state->completed, seen, 100);
    if (e.state->completed.load() < record && !alive(e.owner)) return;
  }
}

}  // namespace batchcast::cuda::simulated
