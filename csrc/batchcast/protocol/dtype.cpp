#include "batchcast/protocol/dtype.h"

namespace batchcast::protocol {

// Both directions from the one table (message.h).
DType to_wire(ScalarType type) {
  switch (type) {
#define BATCHCAST_DTYPE_TO_WIRE(wire, bytes, name, scalar, code, bits) \
  case ScalarType::scalar:                                             \
    return DType::wire;
    BATCHCAST_DTYPES(BATCHCAST_DTYPE_TO_WIRE)
#undef BATCHCAST_DTYPE_TO_WIRE
    default:
      throw InvalidArgument(std::string("batchcast cannot share tensors of dtype ") + batchcast::dtype_name(type) +
                            " (it shares " + dtype_names() + ")");
  }
}

ScalarType from_wire(DType type) {
#define BATCHCAST_DTYPE_SCALAR(wire, bytes, name, scalar, code, bits) ScalarType::scalar,
  static constexpr ScalarType kTypes[kDTypeCount] = {BATCHCAST_DTYPES(BATCHCAST_DTYPE_SCALAR)};
#undef BATCHCAST_DTYPE_SCALAR
  return kTypes[static_cast<uint8_t>(type)];
}

}  // namespace batchcast::protocol
