#include "batchcast/common/endpoint.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "batchcast/common/error.h"

namespace batchcast {

void validate_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64 && name[0] != '.';
  for (char c : name) {
    bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '_' || c == '-';
    ok = ok && allowed;
  }
  if (!ok) {
    throw InvalidArgument("invalid producer name '" + name +
                          "': use 1-64 characters from A-Z a-z 0-9 . _ - (not starting with '.')");
  }
}

static std::string ensure_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw SystemError("cannot create runtime directory " + dir, errno);
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) throw SystemError("cannot stat " + dir, errno);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    throw InvalidArgument("runtime directory " + dir +
                          " is not a directory owned by this user; set BATCHCAST_RUNTIME_DIR");
  }
  if ((st.st_mode & 0077) != 0 && ::chmod(dir.c_str(), 0700) != 0) {
    throw SystemError("cannot make " + dir + " private (mode 0700)", errno);
  }
  return dir;
}

std::string runtime_dir(const std::string& override_dir) {
  if (!override_dir.empty()) return ensure_private_dir(override_dir);
  if (const char* env = std::getenv("BATCHCAST_RUNTIME_DIR"); env != nullptr && *env != '\0') {
    return ensure_private_dir(env);
  }
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    struct stat st {};
    if (::stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid()) {
      return ensure_private_dir(std::string(xdg) + "/batchcast");
    }
  }
  return ensure_private_dir("/tmp/batchcast-" + std::to_string(::geteuid()));
}

std::string endpoint_for(const std::string& dir, const std::string& name) {
  std::string path = dir + "/" + name + ".sock";
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    throw InvalidArgument("socket path " + path + " is too long for a Unix socket (max " +
                          std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                          " bytes); use a shorter name or BATCHCAST_RUNTIME_DIR");
  }
  return "ipc://" + path;
}

// A forked child (a DataLoader worker) inherits the lock's descriptor, and
// with it the flock: the name would stay taken until every worker noticed
// its producer's death. Children drop their copies at once.
namespace {

constexpr int kMaxLocks = 256;
std::atomic<int> lock_fds[kMaxLocks];  // -1: free; atomics: read in the child without a lock

void close_lock_fds_in_child() {
  for (auto& fd : lock_fds) {
    int f = fd.exchange(-1);
    if (f >= 0) ::close(f);
  }
}

void register_lock_fd(int fd) {
  static const bool installed = [] {
    for (auto& f : lock_fds) f = -1;
    return pthread_atfork(nullptr, nullptr, close_lock_fds_in_child) == 0;
  }();
  (void)installed;
  for (auto& slot : lock_fds) {
    int expected = -1;
    if (slot.compare_exchange_strong(expected, fd)) return;
  }
}

void unregister_lock_fd(int fd) {
  for (auto& slot : lock_fds) {
    int expected = fd;
    if (slot.compare_exchange_strong(expected, -1)) return;
  }
}

}  // namespace

NameLock::NameLock(const std::string& dir, const std::string& name)
    : lock_path_(dir + "/" + name + ".lock"), socket_path_(dir + "/" + name + ".sock") {
  // Loop until the lock we hold is on the file that is at lock_path_ now: a
  // previous owner may unlink it between our open and our flock.
  for (int attempt = 0; attempt < 100; ++attempt) {
    Fd fd(::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) throw SystemError("cannot open " + lock_path_, errno);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) throw SystemError("cannot lock " + lock_path_, errno);
      char buf[32] = {};
      ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
      std::string owner = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
      throw NameInUse("a batchcast producer named '" + name + "' is already running (pid " +
                      owner + "); stop it or choose another name");
    }
    struct stat held {}, current {};
    if (::fstat(fd.get(), &held) == 0 && ::stat(lock_path_.c_str(), &current) == 0 &&
        held.st_ino == current.st_ino && held.st_dev == current.st_dev) {
      std::string pid = std::to_string(::getpid());
      if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), pid.data(), pid.size(), 0) < 0) {
        // The pid is only informational.
      }
      ::unlink(socket_path_.c_str());  // stale socket of a dead producer
      fd_ = std::move(fd);
      register_lock_fd(fd_.get());
      return;
    }
  }
  throw NameInUse("could not acquire the lock for producer name '" + name + "'");
}

NameLock::~NameLock() {
  ::unlink(socket_path_.c_str());
  ::unlink(lock_path_.c_str());
  unregister_lock_fd(fd_.get());
}

Wakeup::Wakeup() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!fd_.valid()) throw SystemError("eventfd", errno);
}

void Wakeup::notify() {
  uint64_t one = 1;
  while (::write(fd_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

void Wakeup::drain() {
  uint64_t value = 0;
  while (::read(fd_.get(), &value, sizeof(value)) < 0 && errno == EINTR) {
  }
}

bool process_alive(long pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  // A killed process that its parent has not reaped yet still answers kill(0):
  // read its state from /proc and count a zombie as gone.
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  Fd fd;
  do {
    fd = Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  } while (!fd.valid() && errno == EINTR);
  if (!fd.valid()) return errno != ENOENT;
  char buf[512];
  ssize_t n;
  do {
    n = ::read(fd.get(), buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return true;
  std::string stat(buf, static_cast<size_t>(n));
  auto close_paren = stat.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat.size()) return true;
  char state = stat[close_paren + 2];
  return state != 'Z' && state != 'X';
}

Fd watch_process(long pid) {
#ifdef SYS_pidfd_open
  if (pid > 0) return Fd(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0)));
#else
  (void)pid;
#endif
  return Fd();
}

bool readable_now(int fd) {
  pollfd item{fd, POLLIN, 0};
  int n;
  do {
    n = ::poll(&item, 1, 0);
  } while (n < 0 && errno == EINTR);
  return n > 0 && (item.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace batchcast
