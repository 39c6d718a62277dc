#include "core/dtype.h"

namespace loom {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case kFloat32: return "float32";
    case kFloat64: return "float64";
    case kInt64: return "int64";
    case kInt32: return "int32";
    case kUInt8: return "uint8";
    case kBool: return "bool";
    case kFloat16: return "float16";
    case kBFloat16: return "bfloat16";
  }
  return "unknown";
}

size_t element_size(DType dtype) {
  switch (dtype) {
    case kFloat64:
    case kInt64: return 8;
    case kFloat32:
    case kInt32: return 4;
    case kFloat16:
    case kBFloat16: return 2;
    case kUInt8:
    case kBool: return 1;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == kFloat32 || dtype == kFloat64 || dtype == kFloat16 || dtype == kBFloat16;
}

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

// IEEE half conversion, written out rather than relying on _Float16 so that it builds
// with any C++20 compiler.
Half::Half(float value) {
  uint32_t f;
  std::memcpy(&f, &value, 4);
  uint32_t sign = (f >> 16) & 0x8000;
  int32_t exponent = static_cast<int32_t>((f >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = f & 0x7fffff;
  if (((f >> 23) & 0xff) == 0xff) {  // inf or nan
    bits = static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
  } else if (exponent >= 31) {  // overflow to inf
    bits = static_cast<uint16_t>(sign | 0x7c00);
  } else if (exponent <= 0) {  // subnormal or zero
    if (exponent < -10) {
      bits = static_cast<uint16_t>(sign);
    } else {
      mantissa |= 0x800000;
      uint32_t shift = static_cast<uint32_t>(14 - exponent);
      uint32_t half_mantissa = mantissa >> shift;
      uint32_t remainder = mantissa & ((1u << shift) - 1);
      uint32_t halfway = 1u << (shift - 1);
      if (remainder > halfway || (remainder == halfway && (half_mantissa & 1))) ++half_mantissa;
      bits = static_cast<uint16_t>(sign | half_mantissa);
    }
  } else {
    uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
    uint32_t remainder = mantissa & 0x1fff;
    if (remainder > 0x1000 || (remainder == 0x1000 && (half & 1))) ++half;  // may carry into exponent: correct
    bits = static_cast<uint16_t>(half);
  }
}

Half::operator float() const {
  uint32_t sign = (bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  uint32_t f;
  if (exponent == 0) {
    if (mantissa == 0) {
      f = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) {
        mantissa <<= 1;
        --exponent;
      }
      f = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
    }
  } else if (exponent == 31) {
    f = sign | 0x7f800000u | (mantissa << 13);
  } else {
    f = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &f, 4);
  return value;
}

}  // namespace loom
