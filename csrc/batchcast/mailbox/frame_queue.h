// One direction of a mailbox: a single-writer, single-reader queue of frames
// (whole messages, as bytes) in memory two processes share. Lock-free: the
// writer publishes a frame by moving its `written` index past it, the reader
// frees the room by moving its `read` index; neither ever waits for the
// other, so a process killed at any point leaves the other side working (a
// frame half written was never published; one half read is read again by
// nobody, since its reader is gone).
//
// Neither side trusts what the other wrote. The reader checks every index
// and every record before it copies a frame out; a record that cannot be
// right (a size past what was published, an unknown kind) is dropped with
// everything published after it, and counted; an index that cannot be right
// is never followed. Frames are copied out before they are decoded, so the
// other side cannot change them under the decoder.
//
// Layout: records of an 8-byte header (size, kind) and the frame padded to
// 8 bytes; a record never wraps around the end (a padding record fills the
// rest). A frame larger than a quarter of the queue does not go in at all
// (TooLarge): the caller sends it another way and may leave a Marker in its
// place, so that the reader knows where it belongs in the order.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace batchcast {

class FrameQueue {
 public:
  // Where the two indices live in the shared memory (each on its own cache line).
  struct Indices {
    alignas(64) std::atomic<uint64_t> written{0};  // bytes published by the writer
    alignas(64) std::atomic<uint64_t> read{0};     // bytes the reader is done with
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "indices shared between processes");

  enum class Push { Done, Full, TooLarge };
  enum class Pop { Empty, Frame, Marker };

  FrameQueue() = default;
  // `capacity`: a multiple of 8, at least 64. Both sides start from the
  // indices as they are (a new mailbox: zero); from impossible ones, the
  // queue is never used (Full, Empty).
  FrameQueue(Indices* indices, std::byte* data, uint64_t capacity);

  // The largest frame push() takes.
  static uint64_t largest_frame(uint64_t capacity) { return capacity / 4 - kHeader; }

  // Writer.
  Push push(const void* frame, std::size_t size);
  Push push_marker();

  // Reader: the next frame (copied into `out`) or marker, or Empty.
  Pop pop(std::string& out);
  // Whether the writer has published anything not read yet (never a false Empty).
  bool has_unread() const;
  // Writer: whether the reader has taken everything published so far.
  bool all_read() const;
  // Records dropped as impossible (each drop counts once).
  int64_t dropped() const { return dropped_; }

 private:
  static constexpr uint64_t kHeader = 8;
  enum Kind : uint32_t { kFrame = 0x46524d31, kMarker = 0x4d524b31, kPadding = 0x50414431 };
  Push put(uint32_t kind, const void* frame, std::size_t size);

  Indices* indices_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t written_ = 0;  // the writer's own count (the shared one is only published)
  uint64_t read_ = 0;     // the reader's own count
  int64_t dropped_ = 0;
  bool broken_ = false;  // started from indices that cannot be right
};

}  // namespace batchcast
