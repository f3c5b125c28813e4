#include "batchcast/mailbox/frame_queue.h"

#include <cstring>

namespace batchcast {
namespace {

constexpr uint64_t round8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

}  // namespace

FrameQueue::FrameQueue(Indices* indices, std::byte* data, uint64_t capacity)
    : indices_(indices), data_(data), capacity_(capacity) {
  written_ = indices_->written.load(std::memory_order_acquire);
  read_ = indices_->read.load(std::memory_order_acquire);
  // Both sides start where the queue is (a new one: at zero). Indices that
  // cannot be right from the start are never used: the queue takes nothing
  // and gives nothing.
  broken_ = capacity_ < 64 || capacity_ % 8 != 0 || written_ % 8 != 0 || read_ % 8 != 0 ||
            read_ > written_ || written_ - read_ > capacity_;
}

FrameQueue::Push FrameQueue::push(const void* frame, std::size_t size) {
  return put(kFrame, frame, size);
}

FrameQueue::Push FrameQueue::push_marker() { return put(kMarker, nullptr, 0); }

FrameQueue::Push FrameQueue::put(uint32_t kind, const void* frame, std::size_t size) {
  if (size > largest_frame(capacity_)) return Push::TooLarge;
  if (broken_) return Push::Full;
  const uint64_t need = kHeader + round8(size);
  // seq_cst: a writer that asked to be told of room either sees it here or
  // is seen asking by the reader (mailbox.h).
  const uint64_t read = indices_->read.load(std::memory_order_seq_cst);
  // The reader's index is the reader's word: one behind what was written, or
  // ahead of it, is not believed (no room until it makes sense again).
  if (read > written_ || written_ - read > capacity_) return Push::Full;
  const uint64_t room = capacity_ - (written_ - read);
  const uint64_t at = written_ % capacity_;
  const uint64_t to_end = capacity_ - at;
  const uint64_t padding = need > to_end ? to_end : 0;
  if (padding + need > room) return Push::Full;
  if (padding > 0) {
    const uint32_t header[2] = {static_cast<uint32_t>(to_end - kHeader), kPadding};
    std::memcpy(data_ + at, header, sizeof header);
  }
  const uint64_t start = (written_ + padding) % capacity_;
  const uint32_t header[2] = {static_cast<uint32_t>(size), kind};
  std::memcpy(data_ + start, header, sizeof header);
  if (size > 0) std::memcpy(data_ + start + kHeader, frame, size);
  written_ += padding + need;
  // seq_cst: a reader that announced it sleeps either sees this frame or is
  // seen asleep by the writer's next load of its flag (mailbox.h).
  indices_->written.store(written_, std::memory_order_seq_cst);
  return Push::Done;
}

bool FrameQueue::all_read() const {
  return indices_ != nullptr && indices_->read.load(std::memory_order_seq_cst) == written_;
}

bool FrameQueue::has_unread() const {
  return indices_->written.load(std::memory_order_seq_cst) != read_;
}

FrameQueue::Pop FrameQueue::pop(std::string& out) {
  if (broken_) return Pop::Empty;
  while (true) {
    const uint64_t written = indices_->written.load(std::memory_order_acquire);
    if (written == read_) return Pop::Empty;
    // The writer's index is the writer's word: behind what was read, further
    // ahead than the queue holds, or between two records, it is not
    // followed (the next publish puts it right).
    if (written < read_ || written - read_ > capacity_ || written % 8 != 0) return Pop::Empty;
    const uint64_t available = written - read_;
    const uint64_t at = read_ % capacity_;
    const uint64_t to_end = capacity_ - at;
    uint32_t header[2];
    bool valid = available >= kHeader;
    if (valid) std::memcpy(header, data_ + at, sizeof header);
    const uint64_t size = valid ? header[0] : 0;
    if (valid && header[1] == kPadding) {
      valid = size + kHeader == to_end && to_end <= available;
      if (valid) {
        read_ += to_end;
        indices_->read.store(read_, std::memory_order_release);
        continue;
      }
    } else if (valid && (header[1] == kFrame || header[1] == kMarker)) {
      const uint64_t need = kHeader + round8(size);
      valid = size <= largest_frame(capacity_) && need <= available && need <= to_end &&
              (header[1] == kFrame || size == 0);
      if (valid) {
        if (header[1] == kFrame) out.assign(reinterpret_cast<const char*>(data_ + at + kHeader), size);
        read_ += need;
        indices_->read.store(read_, std::memory_order_seq_cst);
        return header[1] == kFrame ? Pop::Frame : Pop::Marker;
      }
    } else {
      valid = false;
    }
    // Not a record: what was published from here on cannot be told apart
    // from noise. Dropped, all of it, once.
    dropped_ += 1;
    read_ = written;
    indices_->read.store(read_, std::memory_order_release);
  }
}

}  // namespace batchcast
