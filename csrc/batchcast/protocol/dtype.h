// Wire dtypes <-> torch dtypes. Kept apart from message.h so that the wire
// format (and its fuzz target) builds without torch.
#pragma once

#include <c10/core/ScalarType.h>

#include "batchcast/protocol/message.h"

namespace batchcast::protocol {

// Throws InvalidArgument for dtypes batchcast cannot share.
DType to_wire(c10::ScalarType type);
c10::ScalarType from_wire(DType type);

}  // namespace batchcast::protocol
