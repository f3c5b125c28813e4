// libFuzzer target for the message decoder: any input must either decode to a
// message that re-encodes to the same bytes, or throw MalformedMessage.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "batchcast/protocol/message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace batchcast::protocol;
  try {
    Message m = decode(data, size);
    uint16_t version = 0;  // a Refuse decodes whatever its version: re-encode with it
    std::memcpy(&version, data + 4, sizeof(version));
    std::string again = encode(m, version);
    if (again.size() != size || again.compare(0, size, reinterpret_cast<const char*>(data), size) != 0) {
      std::abort();  // decode accepted bytes that do not round-trip
    }
  } catch (const batchcast::MalformedMessage&) {
  }
  return 0;
}
