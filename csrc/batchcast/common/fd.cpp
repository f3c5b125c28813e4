#include "batchcast/common/fd.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "batchcast/common/error.h"
#include "batchcast/common/write_guard.h"

namespace batchcast {

SystemError::SystemError(const std::string& what, int err)
    : Error(what + ": " + std::strerror(err)), code_(err) {}

void Fd::reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Mapping::guard_writes() {
  guard_readonly_range(data_, size_);
  guarded_ = true;
}

void Mapping::reset() {
  if (guarded_) {
    unguard_readonly_range(data_);
    guarded_ = false;
  }
  if (data_ != nullptr) {
    ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
}

}  // namespace batchcast
