#include "batchcast/common/threads.h"

#include <pthread.h>
#include <signal.h>

namespace batchcast {

std::thread start_background_thread(const char* name, std::function<void()> body) {
  // A new thread inherits its creator's signal mask: block everything for the
  // creation only, then restore the creator's mask.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  std::thread thread;
  try {
    thread = std::thread([name, body = std::move(body)] {
      ::pthread_setname_np(::pthread_self(), name);
      body();
    });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return thread;
}

}  // namespace batchcast
