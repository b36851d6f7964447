"""An array's blocks, for NumPy work done a block at a time so that Ctrl-C is
taken between blocks: Python asks for it between bytecodes, and one NumPy
call over hundreds of MiB holds the GIL (and the KeyboardInterrupt) for as
long as it runs, up to seconds."""
import math

import numpy as np


def blocks(shape, axes, elements):
    """Index tuples (one entry per axis of `shape`) that cover an array of
    `shape` once, in order, in blocks of about `elements` elements:
    consecutive ranges along axes[0], each of whole sub-arrays. Where one
    index of axes[0] alone holds more than `elements`, each index of it is
    taken on its own and split along axes[1] the same way, and so on. The
    axes not in `axes` are always whole, and a block holds at least one
    index of the last axis it splits."""
    yield from _blocks(shape, tuple(axes), elements, (slice(None),) * len(shape))


def _blocks(shape, axes, elements, index):
    axis, later_axes = axes[0], axes[1:]
    # the elements of one index along `axis`: the axes neither fixed nor this one
    unit = math.prod(n for d, n in enumerate(shape) if d != axis and isinstance(index[d], slice))
    if unit > elements and later_axes:
        for i in range(shape[axis]):
            yield from _blocks(shape, later_axes, elements, index[:axis] + (i,) + index[axis + 1:])
        return
    step = max(1, elements // max(unit, 1))
    for first in range(0, shape[axis], step):
        yield index[:axis] + (slice(first, first + step),) + index[axis + 1:]


# the elements converted between two Ctrl-C checks: 2 MiB of float64
_CONVERT_BLOCK = 1 << 18


def converted(array, dtype):
    """`array` as `dtype`: the array itself when it has that dtype, else a
    new C-ordered array of the values ``array.astype(dtype)`` gives,
    converted a block of about _CONVERT_BLOCK elements at a time:
    one astype of 512 MiB of float32 gradients to float64 took 2.2 s into
    fresh pages here (0.13 s into reused ones), Ctrl-C waiting for all of it."""
    dtype = np.dtype(dtype)
    if array.dtype == dtype:
        return array
    if array.ndim == 0:
        return array.astype(dtype)
    result = np.empty(array.shape, dtype)
    for part in blocks(array.shape, range(array.ndim), _CONVERT_BLOCK):
        result[part] = array[part]
    return result
