// Where a producer named N listens: a Unix socket in a per-user runtime
// directory (mode 0700), guarded by a lock file so that two live producers
// can never share a name.
#pragma once

#include <string>

#include "batchcast/common/fd.h"

namespace batchcast {

// Throws InvalidArgument unless name is 1-64 of [A-Za-z0-9._-], not starting with '.'.
void validate_name(const std::string& name);

// The per-user runtime directory, created 0700 if missing. `override_dir`
// wins when non-empty, then $BATCHCAST_RUNTIME_DIR, then
// $XDG_RUNTIME_DIR/batchcast, then /tmp/batchcast-<uid>.
std::string runtime_dir(const std::string& override_dir = "");

// "ipc://<dir>/<name>.sock"
std::string endpoint_for(const std::string& dir, const std::string& name);

// Holds <dir>/<name>.lock for a producer's lifetime; removes the lock and
// socket files when released.
class NameLock {
 public:
  NameLock(const std::string& dir, const std::string& name);  // throws NameInUse
  NameLock(const NameLock&) = delete;
  NameLock& operator=(const NameLock&) = delete;
  ~NameLock();

  const std::string& socket_path() const { return socket_path_; }

 private:
  std::string lock_path_;
  std::string socket_path_;
  Fd fd_;
};

// An eventfd used to wake a thread blocked in zmq_poll from any other thread.
class Wakeup {
 public:
  Wakeup();
  void notify();
  void drain();
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
};

bool process_alive(long pid);

// A descriptor that becomes readable once process `pid` exits (a pidfd), so
// a thread can sleep until then instead of checking on a timer; invalid
// where the kernel has none (before Linux 5.3, or a sandbox that denies it).
Fd watch_process(long pid);
// Whether `fd` is readable now (never blocks).
bool readable_now(int fd);

}  // namespace batchcast
