// libFuzzer target for a mailbox queue's reader: whatever bytes and indices
// the other process left in the shared memory, the reader never reads outside
// the queue, never hands out a frame larger than a record may be, never loops
// for ever, and every frame it hands out goes to the message decoder, which
// either decodes it or throws MalformedMessage. The writer, meeting the same
// memory, never writes outside the queue either.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "batchcast/mailbox/frame_queue.h"
#include "batchcast/protocol/message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using batchcast::FrameQueue;
  if (size < 16 + 64) return 0;
  const uint64_t capacity = std::min<uint64_t>((size - 16) / 8 * 8, 4096);
  // Exactly the queue's bytes, so that ASan sees any read past them.
  auto indices = std::make_unique<FrameQueue::Indices>();
  auto memory = std::make_unique<std::byte[]>(capacity);
  uint64_t written = 0, read = 0;
  std::memcpy(&written, data, 8);
  std::memcpy(&read, data + 8, 8);
  // Mostly plausible indices (the interesting part), sometimes anything.
  if ((written & 1) == 0) {
    read %= 4 * capacity;
    written = read + written % (capacity + 16);
  }
  indices->written.store(written);
  indices->read.store(read);
  std::memcpy(memory.get(), data + 16, capacity);
  FrameQueue reader(indices.get(), memory.get(), capacity);
  std::string frame;
  for (uint64_t i = 0;; ++i) {
    if (i > capacity) std::abort();  // every pop takes at least 8 bytes, or ends
    const FrameQueue::Pop p = reader.pop(frame);
    if (p == FrameQueue::Pop::Empty) break;
    if (p == FrameQueue::Pop::Frame) {
      if (frame.size() > FrameQueue::largest_frame(capacity)) std::abort();
      try {
        batchcast::protocol::decode(frame.data(), frame.size());
      } catch (const batchcast::MalformedMessage&) {
      }
    }
  }
  FrameQueue writer(indices.get(), memory.get(), capacity);
  const std::string release = batchcast::protocol::encode(batchcast::protocol::Release{{1, 2, 3}});
  for (int i = 0; i < 64; ++i) {
    if (writer.push(release.data(), release.size()) != FrameQueue::Push::Done) break;
  }
  return 0;
}
