"""The modules' constructor checks that have no counterpart in the C layer
(sizes, head counts, the module dtype): each raises where the bad value
enters, naming the argument. Everything a call passes (arrays, dropout
probabilities, scale, axis, rng, thread counts) is checked once, in
attnc/_C (csrc/bindings.c)."""
import operator

import numpy as np


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


def positive_int(value, name, allow_zero=False):
    try:
        number = operator.index(value)
    except TypeError as error:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from error
    if number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else ">= 1"
        raise ValueError(f"{name}: expected an integer {bound}, got {number}")
    return number


def divides(heads, size, heads_name, size_name):
    if size % heads:
        raise ValueError(f"{heads_name}: {heads} heads do not divide {size_name}={size}")
