// The Config a Python dict describes: each field checked by type and range, errors naming it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <limits>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "mok/error.hpp"

namespace nb = nanobind;

namespace {

// A short repr of a config value for messages (a long list is cut).
std::string value_text(nb::handle v) {
  std::string r = nb::repr(v).c_str();
  return r.size() > 60 ? r.substr(0, 57) + "..." : r;
}

// A config field's integer: a Python int (or an integer type with __index__, e.g. numpy.int64),
// never a bool, a float or a str (TypeError); one that does not fit the field's C++ type is
// invalid_config (a mok.Error).
template <class Int>
Int config_int(const std::string& field, nb::handle v) {
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
    throw nb::type_error(("config field '" + field + "' must be an int; got " +
                          nb::type_name(v.type()).c_str() + " " + value_text(v))
                             .c_str());
  nb::object index = nb::steal(PyNumber_Index(v.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  constexpr long long lo = std::numeric_limits<Int>::min(), hi = std::numeric_limits<Int>::max();
  if (overflow != 0 || x < lo || x > hi)
    throw mok::Error(mok::ErrorCode::invalid_config,
                     field + " = " + value_text(index) + " is not allowed: outside the field's " +
                         (sizeof(Int) == 4 ? "int32" : "int64") + " range [" + std::to_string(lo) +
                         ", " + std::to_string(hi) + "]");
  return Int(x);
}

// The int fields of Config (routed_capacity_rows and ring_rows are int64_t).
constexpr std::pair<const char*, int mok::Config::*> kIntFields[] = {
    {"hidden", &mok::Config::hidden},
    {"intermediate", &mok::Config::intermediate},
    {"num_experts", &mok::Config::num_experts},
    {"top_k", &mok::Config::top_k},
    {"num_shared_experts", &mok::Config::num_shared_experts},
    {"shared_intermediate", &mok::Config::shared_intermediate},
    {"max_tokens_per_rank", &mok::Config::max_tokens_per_rank},
    {"ep_size", &mok::Config::ep_size},
    {"ep_rank", &mok::Config::ep_rank},
    {"tile_rows", &mok::Config::tile_rows}};

std::string precision_names() {
  std::string out;
  for (mok::Precision p : {mok::Precision::bf16, mok::Precision::fp8_block, mok::Precision::mxfp8,
                           mok::Precision::nvfp4})
    out += std::string(out.empty() ? "" : ", ") + mok::precision_name(p);
  return out;
}

}  // namespace

mok::Config mok_py::config_from(const nb::dict& d) {
  mok::Config c;
  for (auto [key, value] : d) {
    if (!nb::isinstance<nb::str>(key))
      throw nb::type_error(("config keys must be str (mok.preset's field names); got " +
                            std::string(nb::type_name(key.type()).c_str()) + " " + value_text(key))
                               .c_str());
    const std::string k = nb::cast<std::string>(key);
    bool known = false;
    for (auto [name, field] : kIntFields)
      if (k == name) {
        c.*field = config_int<int>(k, value);
        known = true;
      }
    if (known) continue;
    if (k == "precision") {
      if (!nb::isinstance<nb::str>(value))
        throw nb::type_error(
            ("config field 'precision' must be a str (allowed: " + precision_names() + "); got " +
             nb::type_name(value.type()).c_str() + " " + value_text(value))
                .c_str());
      c.precision = mok::parse_precision(nb::cast<std::string>(value));
    } else if (k == "routed_capacity_rows")
      c.routed_capacity_rows = config_int<int64_t>(k, value);
    else if (k == "ring_rows")
      c.ring_rows = config_int<int64_t>(k, value);
    else
      throw mok::Error(mok::ErrorCode::invalid_config, "unknown config field '" + k + "'");
  }
  return c;
}
