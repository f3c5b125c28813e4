// Wire dtypes <-> torch dtypes. Kept apart from message.h so that the wire
// format (and its fuzz target) builds without torch.
#pragma once

#include "batchcast/protocol/message.h"
#include "batchcast/tensor/tensor.h"

namespace batchcast::protocol {

// Throws InvalidArgument for dtypes batchcast cannot share.
DType to_wire(ScalarType type);
ScalarType from_wire(DType type);

}  // namespace batchcast::protocol
