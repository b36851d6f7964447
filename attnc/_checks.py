"""The modules' constructor checks that have no counterpart in the C layer
(sizes, head counts, the module dtype): each raises where the bad value
enters, naming the argument. Everything a call passes (arrays, dropout
probabilities, scale, axis, rng, thread counts) is checked once, in
attnc/_C (csrc/bindings.c)."""
import operator
import sys

import numpy as np


_MODULE_DTYPES = "float16, bfloat16, float32 or float64"
_BFLOAT16_HELP = ("bfloat16 needs the ml_dtypes package (the bfloat16 of JAX and TensorFlow): "
                  "pip install ml_dtypes, or pip install 'attnc[bf16]'")


# The errors a failed conversion or truth is raised again as, the argument's name in front
# (RuntimeError: torch's, for a tensor of several elements): the C layer's name_the_error.
_NAMED_ERRORS = (TypeError, ValueError, RuntimeError)


def bfloat16():
    """ml_dtypes' bfloat16 dtype, or None when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def refuse_masked(value, name):
    """ValueError naming `name` for a numpy.ma.MaskedArray with an element masked: attnc
    reads (and an optimizer updates) every element, masked or not."""
    ma = sys.modules.get("numpy.ma")  # no masked array exists before it is imported
    if ma is not None and isinstance(value, ma.MaskedArray) and ma.is_masked(value):
        raise ValueError(f"{name}: a masked array with masked elements; attnc reads every element, masked or "
                         f"not: pass {name}.filled(value)")


def as_array(value, name):
    """np.asarray(value), a torch tensor that requires grad by its values (detached): NumPy
    refuses it, and attnc never differentiates through it; a torch bfloat16 tensor, which
    NumPy refuses, widened to float32 (exactly); a numpy.ma.MaskedArray with an
    element masked refused (ValueError): attnc reads every element, masked or not. The rule of
    attnc._C's conversions, whose errors name the argument as this one's do."""
    refuse_masked(value, name)
    try:
        if not isinstance(value, np.ndarray) and hasattr(value, "requires_grad"):  # a torch tensor
            value = value.detach() if value.requires_grad else value
            if str(getattr(value, "dtype", "")) == "torch.bfloat16":
                value = value.float()
        return np.asarray(value)
    except _NAMED_ERRORS as error:
        if type(error) not in _NAMED_ERRORS:  # a subclass may take other arguments: as raised
            raise
        raise type(error)(f"{name}: {error}") from error


def is_floating(dtype):
    """True for a floating dtype NumPy or ml_dtypes knows: bfloat16 and
    ml_dtypes' float8, float6 and float4 included (some of which NumPy
    calls kind "f", others "V", as its structured and opaque dtypes)."""
    return dtype.kind == "f" or (dtype.kind == "V" and (dtype == bfloat16() or dtype.name.startswith("float")))


def module_dtype(dtype):
    """The module dtype for `dtype`: float16, bfloat16, float32 or float64
    (bfloat16 with ml_dtypes only), else TypeError naming the argument."""
    if dtype is None:
        raise TypeError(f"dtype: expected {_MODULE_DTYPES}, got None")
    if isinstance(dtype, str) and dtype.strip().lower() == "bfloat16":
        if bfloat16() is None:
            raise TypeError(f"dtype: {_BFLOAT16_HELP}")
        return bfloat16()
    if hasattr(dtype, "dtype") and not isinstance(dtype, (type, np.dtype, np.generic)):
        # np.dtype would take the object's .dtype (a module's, an array's): a slip
        raise TypeError(f"dtype: expected a data-type, got a {type(dtype).__name__}")
    try:
        resolved = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype: {dtype!r} is not a NumPy dtype") from error
    if resolved.kind == "V" and resolved == bfloat16():
        return bfloat16()
    if resolved.kind != "f" or resolved.itemsize not in (2, 4, 8):
        raise TypeError(f"dtype: expected {_MODULE_DTYPES}, got {resolved}")
    return np.dtype({2: np.float16, 4: np.float32, 8: np.float64}[resolved.itemsize])


def flag(value, name):
    """`value`'s truth, as bool(value); an object that has none (an array of
    several elements) raises its error with the argument's name in front,
    as the C layer's flags do."""
    try:
        return bool(value)
    except _NAMED_ERRORS as error:
        if type(error) not in _NAMED_ERRORS:  # a subclass may take other arguments: as raised
            raise
        raise type(error)(f"{name}: {error}") from error


def is_a_bool(value):
    """Whether `value` is a bool: Python's, or anything of a bool dtype (NumPy's
    bool scalars and arrays, a torch bool tensor), which convert to 0 and 1 as
    numbers do (the C layer's odd_number_kind)."""
    if isinstance(value, (bool, np.bool_)):
        return True
    if type(value) in (int, float):
        return False
    try:
        dtype = value.dtype
    except AttributeError:  # no dtype: not a bool (another error, a property's own, propagates)
        return False
    return dtype.kind == "b" if isinstance(dtype, np.dtype) else str(dtype) == "torch.bool"


def has_an_axis(value):
    """Whether `value` is an array or tensor with an axis (a shape of one
    element or more), which converts to a number when it holds one element
    (torch's __index__ and float() take it; NumPy refuses it)."""
    try:
        return len(value.shape) > 0
    except (AttributeError, TypeError):  # no shape, or not a sequence of sizes: not an array
        return False


def integer(value, name):
    """`value` as an int, through __index__; a bool is refused (True where a
    count, an axis or a seed belongs is a slip, as NumPy's axis holds), and
    so is an array or tensor with an axis, even of one element, as the C
    layer's integers refuse it."""
    try:
        if is_a_bool(value) or has_an_axis(value):
            raise TypeError
        return operator.index(value)
    except TypeError as error:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from error


def positive_int(value, name, allow_zero=False):
    number = integer(value, name)
    if number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else ">= 1"
        raise ValueError(f"{name}: expected an integer {bound}, got {number}")
    return number


def divides(heads, size, heads_name, size_name):
    if size % heads:
        raise ValueError(f"{heads_name}: {heads} heads do not divide {size_name}={size}")
