#include "batchcast/common/write_guard.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace batchcast {
namespace {

constexpr int kRanges = 64;
std::atomic<uintptr_t> g_begin[kRanges];
std::atomic<uintptr_t> g_end[kRanges];
struct sigaction g_previous;
std::once_flag g_installed;
std::mutex g_registry;  // registration only; the handler reads the atomics

void on_segv(int sig, siginfo_t* info, void* context) {
  auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int i = 0; i < kRanges; ++i) {
    uintptr_t b = g_begin[i].load(std::memory_order_acquire);
    if (b != 0 && addr >= b && addr < g_end[i].load(std::memory_order_acquire)) {
      static const char kMessage[] =
          "\nbatchcast: a batch tensor was written in place (the Python traceback names the "
          "line). Batches are read-only views of memory shared with other training processes: "
          "use out-of-place ops (x = x / 255), write into x.clone(), or receive private copies "
          "you may modify with Consumer(..., device=bc.Placement(writable=True)).\n";
      [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
      break;
    }
  }
  // Hand the fault to whoever had it before (default: terminate with SIGSEGV):
  // restore their action and return, so the faulting instruction runs again.
  (void)sig;
  (void)context;
  ::sigaction(SIGSEGV, &g_previous, nullptr);
}

void install() {
  struct sigaction action {};
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGSEGV, &action, &g_previous);
}

}  // namespace

void guard_readonly_range(const void* begin, std::size_t size) {
  std::call_once(g_installed, install);
  std::lock_guard<std::mutex> lock(g_registry);
  auto b = reinterpret_cast<uintptr_t>(begin);
  for (int i = 0; i < kRanges; ++i) {
    if (g_begin[i].load(std::memory_order_relaxed) == 0) {
      g_end[i].store(b + size, std::memory_order_release);
      g_begin[i].store(b, std::memory_order_release);
      return;
    }
  }
}

void unguard_readonly_range(const void* begin) {
  std::lock_guard<std::mutex> lock(g_registry);
  auto b = reinterpret_cast<uintptr_t>(begin);
  for (int i = 0; i < kRanges; ++i) {
    if (g_begin[i].load(std::memory_order_relaxed) == b) {
      g_begin[i].store(0, std::memory_order_release);
      return;
    }
  }
}

}  // namespace batchcast
