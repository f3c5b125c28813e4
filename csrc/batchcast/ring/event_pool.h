// Slot events of a GPU ring, lent out one per slot in use. A BorrowedEvent
// goes back to its pool when it is dropped, so no path can leak one. (The
// events themselves belong to the ring's memory; these are their indices,
// which is what travels in an announcement.) Not thread-safe: the producer
// uses it under its lock.
#pragma once

#include <optional>
#include <utility>
#include <vector>

namespace batchcast {

class EventPool;

class BorrowedEvent {
 public:
  BorrowedEvent() = default;
  BorrowedEvent(const BorrowedEvent&) = delete;
  BorrowedEvent& operator=(const BorrowedEvent&) = delete;
  BorrowedEvent(BorrowedEvent&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)), index_(other.index_) {}
  BorrowedEvent& operator=(BorrowedEvent&& other) noexcept;
  ~BorrowedEvent();

  int index() const { return index_; }

 private:
  friend class EventPool;
  BorrowedEvent(EventPool* pool, int index) : pool_(pool), index_(index) {}
  EventPool* pool_ = nullptr;
  int index_ = -1;
};

class EventPool {
 public:
  explicit EventPool(int count);
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An unused event, or nullopt while all are lent out.
  std::optional<BorrowedEvent> borrow();
  int size() const { return size_; }
  int available() const { return static_cast<int>(free_.size()); }

 private:
  friend class BorrowedEvent;
  int size_;
  std::vector<int> free_;
};

inline EventPool::EventPool(int count) : size_(count) {
  for (int i = count - 1; i >= 0; --i) free_.push_back(i);
}

inline std::optional<BorrowedEvent> EventPool::borrow() {
  if (free_.empty()) return std::nullopt;
  int index = free_.back();
  free_.pop_back();
  return BorrowedEvent(this, index);
}

inline BorrowedEvent& BorrowedEvent::operator=(BorrowedEvent&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr) pool_->free_.push_back(index_);
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = other.index_;
  }
  return *this;
}

inline BorrowedEvent::~BorrowedEvent() {
  if (pool_ != nullptr) pool_->free_.push_back(index_);
}

}  // namespace batchcast
