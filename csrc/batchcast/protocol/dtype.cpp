#include "batchcast/protocol/dtype.h"

namespace batchcast::protocol {

DType to_wire(ScalarType type) {
  switch (type) {
    case ScalarType::Byte: return DType::UInt8;
    case ScalarType::Char: return DType::Int8;
    case ScalarType::Short: return DType::Int16;
    case ScalarType::Int: return DType::Int32;
    case ScalarType::Long: return DType::Int64;
    case ScalarType::Half: return DType::Float16;
    case ScalarType::Float: return DType::Float32;
    case ScalarType::Double: return DType::Float64;
    case ScalarType::Bool: return DType::Bool;
    case ScalarType::BFloat16: return DType::BFloat16;
    case ScalarType::ComplexFloat: return DType::Complex64;
    case ScalarType::ComplexDouble: return DType::Complex128;
    case ScalarType::UInt16: return DType::UInt16;
    case ScalarType::UInt32: return DType::UInt32;
    case ScalarType::UInt64: return DType::UInt64;
    default:
      throw InvalidArgument(std::string("batchcast cannot share tensors of dtype ") +
                            batchcast::dtype_name(type));
  }
}

ScalarType from_wire(DType type) {
  static constexpr ScalarType kTypes[kDTypeCount] = {
      ScalarType::Byte,      ScalarType::Char,         ScalarType::Short,
      ScalarType::Int,       ScalarType::Long,         ScalarType::Half,
      ScalarType::Float,     ScalarType::Double,       ScalarType::Bool,
      ScalarType::BFloat16,  ScalarType::ComplexFloat, ScalarType::ComplexDouble,
      ScalarType::UInt16,    ScalarType::UInt32,       ScalarType::UInt64};
  return kTypes[static_cast<uint8_t>(type)];
}

}  // namespace batchcast::protocol
