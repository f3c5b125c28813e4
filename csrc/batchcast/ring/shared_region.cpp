#include "batchcast/ring/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "batchcast/common/error.h"

namespace batchcast {
namespace {

// Asks for transparent huge pages (2 MiB) for the ring's memory. Where the
// system allows them for shared memory (shmem_enabled "advise" or more in
// /sys/kernel/mm/transparent_hugepage), a process maps, faults and unmaps a
// ring in 512x fewer page-table entries: taking a batch and closing a
// consumer then cost almost nothing whatever the ring's size. Elsewhere the
// advice is ignored and 4 KiB pages serve as before.
void advise_huge_pages(void* p, std::size_t bytes) {
#ifdef MADV_HUGEPAGE
  (void)::madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace

SharedRegion SharedRegion::create(std::size_t bytes, const std::string& label) {
  SharedRegion r;
  r.fd_ = Fd(::memfd_create(("batchcast:" + label).c_str(), MFD_CLOEXEC));
  if (!r.fd_.valid()) throw SystemError("memfd_create", errno);
  if (::ftruncate(r.fd_.get(), static_cast<off_t>(bytes)) != 0) {
    throw SystemError("cannot size shared ring to " + std::to_string(bytes) + " bytes", errno);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd_.get(), 0);
  if (p == MAP_FAILED) throw SystemError("mmap of shared ring", errno);
  advise_huge_pages(p, bytes);
  r.mapping_ = Mapping(p, bytes);
  return r;
}

bool SharedRegion::populate(std::size_t offset, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (offset > size() || bytes > size() - offset) return false;
  // madvise wants a page-aligned start.
  const std::size_t page = 4096;
  const std::size_t start = offset / page * page;
  return ::madvise(data() + start, bytes + (offset - start), MADV_POPULATE_WRITE) == 0;
#else
  (void)offset;
  (void)bytes;
  return false;
#endif
}

void SharedRegion::fault_in(std::size_t offset, std::size_t bytes) {
  if (offset > size() || bytes > size() - offset) throw InvalidArgument("fault_in outside the region");
  // Touching also makes a short tmpfs fail here (SIGBUS would come later).
  std::memset(data() + offset, 0, bytes);
}

SharedRegion SharedRegion::open(long producer_pid, int fd, std::size_t bytes) {
  SharedRegion r;
  std::string path = "/proc/" + std::to_string(producer_pid) + "/fd/" + std::to_string(fd);
  do {
    r.fd_ = Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  } while (!r.fd_.valid() && errno == EINTR);
  if (!r.fd_.valid()) throw SystemError("cannot open the producer's ring at " + path, errno);
  off_t actual = ::lseek(r.fd_.get(), 0, SEEK_END);
  if (actual < 0 || static_cast<std::size_t>(actual) < bytes) {
    throw MalformedMessage("ring at " + path + " is smaller than announced");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, r.fd_.get(), 0);
  if (p == MAP_FAILED) throw SystemError("mmap of the producer's ring", errno);
  advise_huge_pages(p, bytes);
  r.mapping_ = Mapping(p, bytes);
  r.mapping_.guard_writes();
  r.fd_.reset();  // the mapping keeps the memory alive
  return r;
}

}  // namespace batchcast
