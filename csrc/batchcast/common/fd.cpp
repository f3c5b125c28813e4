#include "batchcast/common/fd.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "batchcast/common/error.h"

namespace batchcast {

SystemError::SystemError(const std::string& what, int err)
    : Error(what + ": " + std::strerror(err)), code_(err) {}

void Fd::reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Mapping::reset() {
  if (data_ != nullptr) {
    ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
}

}  // namespace batchcast
