// Background threads of the core. They block every signal, so that a signal
// sent to the process (SIGCHLD from a DataLoader worker, a profiler's SIGPROF,
// a scheduler's SIGUSR1) is handled by a thread of the user's and never
// interrupts a background wait.
#pragma once

#include <functional>
#include <thread>

namespace batchcast {

// `name` (at most 15 characters) is what ps, top and /proc show for it.
std::thread start_background_thread(const char* name, std::function<void()> body);

}  // namespace batchcast

namespace batchcast {

// Ends this process (_exit(code)) once process `pid` has exited: for a
// process that only works for `pid` (a DataLoader worker of a producer), so
// that it never outlives it blocked where its own watchdog does not look (a
// lock copied held by the fork, a stuck file system). A detached background
// thread waits on the process (a pidfd; without one it checks every second).
// If `pid` is gone already, the process ends at once.
void exit_with_process(long pid, int code);

}  // namespace batchcast
