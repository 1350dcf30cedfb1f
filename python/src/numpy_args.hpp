// The NumPy module's array arguments: each has one dtype, and take() turns what the caller passed
// into a C-contiguous CPU array of it, or a TypeError naming the argument (nothing is cast).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

namespace nb = nanobind;

namespace mok_py {

// The dtype an array argument must have, as NumPy names it (in messages and in signatures).
template <class T>
struct DtypeName;
template <>
struct DtypeName<double> {
  static constexpr auto descr = nb::detail::const_name("float64");
};
template <>
struct DtypeName<float> {
  static constexpr auto descr = nb::detail::const_name("float32");
};
template <>
struct DtypeName<int32_t> {
  static constexpr auto descr = nb::detail::const_name("int32");
};
template <>
struct DtypeName<uint8_t> {
  static constexpr auto descr = nb::detail::const_name("uint8");
};

// An array argument of dtype T as the caller passed it: its caster takes any object, and the
// function's body checks it with take() (below), so that a refusal names the argument. nanobind's
// own ndarray caster would cast other dtypes silently (int64 ids, float64 scales), or refuse
// without saying which argument or why.
template <class T>
struct Arg {
  nb::object obj;
};

}  // namespace mok_py

namespace nanobind::detail {
template <class T>
struct type_caster<mok_py::Arg<T>> {
  NB_TYPE_CASTER(mok_py::Arg<T>,
                 const_name("numpy.ndarray[dtype=") + mok_py::DtypeName<T>::descr + const_name("]"))
  bool from_python(handle src, uint32_t, cleanup_list*) noexcept {
    value.obj = borrow(src);
    return true;
  }
};
}  // namespace nanobind::detail

namespace mok_py {

template <class T>
using In = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;
template <class T>
using Out = nb::ndarray<nb::numpy, T>;

// "float32", "int64", ...: a DLPack dtype as NumPy names it.
std::string dtype_text(nb::dlpack::dtype d);

// The array `h` (argument `name`) as a C-contiguous CPU array of dtype T, or a TypeError naming
// the argument, what it got and the dtype expected. Nothing is converted: another dtype (int64
// ids, float64 scales, float32 weights) is an error, never a cast; only the layout may change (a
// non-contiguous array of dtype T is copied). Lists and other non-arrays are refused too.
template <class T>
inline In<T> take(nb::handle h, const std::string& name) {
  const std::string want = name + " must be a NumPy array of dtype " +
                           std::string(mok_py::DtypeName<T>::descr.text) + "; got ";
  nb::ndarray<nb::ro> any;
  if (!nb::try_cast(h, any, /*convert=*/false)) {
    PyErr_Clear();  // what the failed import left (e.g. NumPy's BufferError from __dlpack__)
    std::string got = nb::type_name(h.type()).c_str();
    if (nb::hasattr(h, "dtype"))
      got += " of dtype " + std::string(nb::str(nb::handle(nb::object(h.attr("dtype")))).c_str());
    throw nb::type_error((want + got).c_str());
  }
  if (any.device_type() != nb::device::cpu::value)
    throw nb::type_error(
        (want + (any.device_type() == nb::device::cuda::value
                     ? std::string("a CUDA array (copy it to the CPU)")
                     : "an array on DLPack device type " + std::to_string(any.device_type())))
            .c_str());
  if (any.dtype() != nb::dtype<T>())
    throw nb::type_error((want + "dtype " + dtype_text(any.dtype())).c_str());
  In<T> a;
  if (!nb::try_cast(h, a, /*convert=*/true)) {  // only a copy to C order is left to do
    PyErr_Clear();
    throw nb::type_error((want + "an array nanobind could not copy to C order").c_str());
  }
  return a;
}
template <class T>
inline In<T> take(const Arg<T>& a, const std::string& name) {
  return take<T>(a.obj, name);
}

}  // namespace mok_py
