#include "batchcast/common/threads.h"

#include <cerrno>
#include <memory>

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "batchcast/common/endpoint.h"

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

void exit_with_process(long pid, int code) {
  auto watch = std::make_shared<Fd>(watch_process(pid));
  if (!watch->valid() && !process_alive(pid)) ::_exit(code);
  start_background_thread("batchcast-orphan", [pid, code, watch] {
    while (true) {
      if (watch->valid()) {
        pollfd item{watch->get(), POLLIN, 0};
        const int n = ::poll(&item, 1, -1);
        if (n > 0) ::_exit(code);  // readable: the process exited
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) watch->reset();  // cannot wait on it: look every second instead
      } else {
        if (!process_alive(pid)) ::_exit(code);
        ::sleep(1);
      }
    }
  }).detach();
}

}  // namespace batchcast
