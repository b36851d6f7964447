"""Thread count of the kernels' pool."""
import operator

from . import _C


def set_num_threads(n):
    """Threads the kernels may use (n >= 1). Results never depend on it."""
    try:
        n = operator.index(n)
    except TypeError as error:
        raise TypeError(f"n: expected an integer, got {type(n).__name__}") from error
    if n < 1:
        raise ValueError(f"n: expected at least 1 thread, got {n}")
    _C.set_num_threads(n)
