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
