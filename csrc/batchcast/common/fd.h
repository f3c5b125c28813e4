// RAII owners for file descriptors and memory mappings, so that no exit path
// leaks one.
#pragma once

#include <cstddef>
#include <utility>

namespace batchcast {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// A shared mapping of a file; unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* data, std::size_t size) : data_(data), size_(size) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(Mapping&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        guarded_(std::exchange(other.guarded_, false)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      guarded_ = std::exchange(other.guarded_, false);
    }
    return *this;
  }
  ~Mapping() { reset(); }

  // A read-only mapping whose write faults are explained (common/write_guard.h).
  void guard_writes();

  std::byte* data() const { return static_cast<std::byte*>(data_); }
  std::size_t size() const { return size_; }
  void reset();

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool guarded_ = false;
};

}  // namespace batchcast
