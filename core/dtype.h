// DType: the element type of a tensor, and the switch that turns a runtime dtype into
// a C++ type for kernels (dispatch_floating / dispatch_all).
//
// float32 is the working type; float64 exists on CPU so gradient checks by finite
// differences are exact enough to mean something; int64 holds labels and indices;
// bool is what comparisons return (as in PyTorch); float16/bfloat16 are storage types
// for mixed precision on CUDA (the CPU backend only copies/casts them).
#pragma once

#include <bit>  // defines: std::bit_cast (BFloat16's conversions)
#include <cstdint>
#include <cstring>
#include <utility>
#include <ostream>

#include "core/error.h"

namespace loom {

enum class DType : int8_t { Float32, Float64, Int64, Int32, UInt8, Bool, Float16, BFloat16 };

// Names as PyTorch prints them: kFloat32 is "float32".
const char* dtype_name(DType dtype);
size_t element_size(DType dtype);
bool is_floating(DType dtype);
std::ostream& operator<<(std::ostream& out, DType dtype);

constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kInt64 = DType::Int64;
constexpr DType kInt32 = DType::Int32;
constexpr DType kUInt8 = DType::UInt8;
constexpr DType kBool = DType::Bool;
constexpr DType kFloat16 = DType::Float16;
constexpr DType kBFloat16 = DType::BFloat16;

// 16-bit float storage types. Arithmetic on them happens in float (CPU) or in CUDA
// kernels; these structs only carry bits and convert.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float value);
  explicit operator float() const;
};
// bfloat16 is the top half of a float32: widening is a 16-bit shift, narrowing rounds the
// dropped 16 bits to nearest even (add 0x7fff plus the lowest kept bit, then shift), NaN
// to the canonical quiet NaN 0x7fc0 -- bit for bit PyTorch's c10::BFloat16 and oneDNN.
// Inline and branch-free (a mask select, not an if), so that a CPU loop converting
// bfloat16 vectorises around it (Note [bfloat16 conversion in registers],
// core/cpu/bf16_convert.h).
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value) : bits(round_to_bits(value)) {}
  explicit operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
  static uint16_t round_to_bits(float value) {
    const uint32_t u = std::bit_cast<uint32_t>(value);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = 0u - static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);  // all ones for NaN
    return static_cast<uint16_t>((rounded & ~nan) | (0x7fc0u & nan));
  }
};

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return kFloat32; }
template <> constexpr DType dtype_of<double>() { return kFloat64; }
template <> constexpr DType dtype_of<int64_t>() { return kInt64; }
template <> constexpr DType dtype_of<int32_t>() { return kInt32; }
template <> constexpr DType dtype_of<uint8_t>() { return kUInt8; }
template <> constexpr DType dtype_of<bool>() { return kBool; }
template <> constexpr DType dtype_of<Half>() { return kFloat16; }
template <> constexpr DType dtype_of<BFloat16>() { return kBFloat16; }


// dispatch_floating(dtype, "relu", [&]<typename T>() { ... }) calls the lambda with
// T = float or double; other dtypes are an error naming the op. (Functions, not macros,
// so that `#pragma omp` works inside the lambda.)
template <typename F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& body) {
  switch (dtype) {
    case kFloat32: return body.template operator()<float>();
    case kFloat64: return body.template operator()<double>();
    default: LOOM_FAIL(op, ": expected a float32 or float64 tensor, got ", dtype_name(dtype));
  }
}

// Floating types plus the integer types and bool.
template <typename F>
decltype(auto) dispatch_all(DType dtype, const char* op, F&& body) {
  switch (dtype) {
    case kFloat32: return body.template operator()<float>();
    case kFloat64: return body.template operator()<double>();
    case kInt64: return body.template operator()<int64_t>();
    case kInt32: return body.template operator()<int32_t>();
    case kUInt8: return body.template operator()<uint8_t>();
    case kBool: return body.template operator()<bool>();
    default: LOOM_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported on this device");
  }
}

// Every dtype, 16-bit floats included as their storage structs (Half, BFloat16): for
// kernels that only move or convert values, such as copy.
template <typename F>
decltype(auto) dispatch_any(DType dtype, const char* op, F&& body) {
  switch (dtype) {
    case kFloat16: return body.template operator()<Half>();
    case kBFloat16: return body.template operator()<BFloat16>();
    default: return dispatch_all(dtype, op, std::forward<F>(body));
  }
}

}  // namespace loom
