"""Argument checks shared by the modules and the functional layer: each
raises where the bad value enters, naming the argument."""
import math
import operator

import numpy as np

_REAL_KINDS = "biuf"


def module_dtype(dtype):
    """The module dtype for `dtype`: float32 or float64, else TypeError."""
    if dtype is None:
        raise TypeError("dtype: expected float32 or float64, got None")
    try:
        resolved = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype: {dtype!r} is not a NumPy dtype") from error
    if resolved.kind != "f" or resolved.itemsize not in (4, 8):
        raise TypeError(f"dtype: expected float32 or float64, got {resolved}")
    return np.dtype(np.float32 if resolved.itemsize == 4 else np.float64)


def as_real(value, name):
    """`value` as an ndarray of real numbers (no copy for an ndarray)."""
    array = np.asarray(value)
    if array.dtype.kind not in _REAL_KINDS:
        raise TypeError(f"{name}: unsupported dtype {array.dtype}; expected real numbers (bool, int or float)")
    return array


def result_dtype(*arrays):
    """float64 if any floating input is float64 (or wider), else float32."""
    wide = any(a.dtype.kind == "f" and a.dtype.itemsize >= 8 for a in arrays if a is not None)
    return np.dtype(np.float64 if wide else np.float32)


def positive_int(value, name, allow_zero=False):
    try:
        number = operator.index(value)
    except TypeError as error:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from error
    if number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else ">= 1"
        raise ValueError(f"{name}: expected an integer {bound}, got {number}")
    return number


def _number(value, name, what):
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError as error:  # an int beyond the float range
        raise ValueError(f"{name}: expected {what}, got an integer too large for a float") from error
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name}: expected {what}, got {value!r}") from error


def probability(value, name):
    p = _number(value, name, "a number in [0, 1]")
    if not 0.0 <= p <= 1.0:  # also rejects NaN
        raise ValueError(f"{name}: expected a probability in [0, 1], got {value!r}")
    return p


def divides(heads, size, heads_name, size_name):
    if size % heads:
        raise ValueError(f"{heads_name}: {heads} heads do not divide {size_name}={size}")


def finite(value, name):
    number = _number(value, name, "a finite number")
    if not math.isfinite(number):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return number
