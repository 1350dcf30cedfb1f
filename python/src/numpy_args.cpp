#include "numpy_args.hpp"

namespace mok_py {

std::string dtype_text(nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  std::string kind;
  switch (Code(d.code)) {
    case Code::Int:
      kind = "int";
      break;
    case Code::UInt:
      kind = "uint";
      break;
    case Code::Float:
      kind = "float";
      break;
    case Code::Bfloat:
      kind = "bfloat";
      break;
    case Code::Complex:
      kind = "complex";
      break;
    case Code::Bool:
      return "bool";
    default:  // the float8 and float4 codes and others NumPy has no name for
      return "DLPack dtype code " + std::to_string(int(d.code)) + " (" + std::to_string(d.bits) +
             " bits)";
  }
  std::string text = kind + std::to_string(d.bits);
  if (d.lanes != 1) text += " x " + std::to_string(d.lanes) + " lanes";
  return text;
}

}  // namespace mok_py
