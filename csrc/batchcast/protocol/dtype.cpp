#include "batchcast/protocol/dtype.h"

namespace batchcast::protocol {

DType to_wire(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Byte: return DType::UInt8;
    case c10::ScalarType::Char: return DType::Int8;
    case c10::ScalarType::Short: return DType::Int16;
    case c10::ScalarType::Int: return DType::Int32;
    case c10::ScalarType::Long: return DType::Int64;
    case c10::ScalarType::Half: return DType::Float16;
    case c10::ScalarType::Float: return DType::Float32;
    case c10::ScalarType::Double: return DType::Float64;
    case c10::ScalarType::Bool: return DType::Bool;
    case c10::ScalarType::BFloat16: return DType::BFloat16;
    case c10::ScalarType::ComplexFloat: return DType::Complex64;
    case c10::ScalarType::ComplexDouble: return DType::Complex128;
    case c10::ScalarType::UInt16: return DType::UInt16;
    case c10::ScalarType::UInt32: return DType::UInt32;
    case c10::ScalarType::UInt64: return DType::UInt64;
    default:
      throw InvalidArgument(std::string("batchcast cannot share tensors of dtype ") +
                            c10::toString(type));
  }
}

c10::ScalarType from_wire(DType type) {
  static constexpr c10::ScalarType kTypes[kDTypeCount] = {
      c10::ScalarType::Byte,      c10::ScalarType::Char,         c10::ScalarType::Short,
      c10::ScalarType::Int,       c10::ScalarType::Long,         c10::ScalarType::Half,
      c10::ScalarType::Float,     c10::ScalarType::Double,       c10::ScalarType::Bool,
      c10::ScalarType::BFloat16,  c10::ScalarType::ComplexFloat, c10::ScalarType::ComplexDouble,
      c10::ScalarType::UInt16,    c10::ScalarType::UInt32,       c10::ScalarType::UInt64};
  return kTypes[static_cast<uint8_t>(type)];
}

}  // namespace batchcast::protocol
