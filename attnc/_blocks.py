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


# the elements a new array is filled with between two Ctrl-C checks: 2 MiB of float64
_FILL_BLOCK = 1 << 18


def filled(shape, dtype, values_of, axes=None):
    """A new C-ordered array of `shape` and `dtype` whose every block (of
    about _FILL_BLOCK elements, along `axes`: all by default) is assigned
    values_of(index of the block), cast as an assignment casts: values_of
    computes a block's values in temporaries of a block's size. An array of
    one block is a copy of values_of(()) (an array's whole, as ``x[()]``
    is): a small array costs about what NumPy's calls alone cost."""
    if math.prod(shape) <= _FILL_BLOCK:
        return np.array(values_of(()), dtype, order="C")
    result = np.empty(shape, dtype)
    for part in blocks(shape, range(len(shape)) if axes is None else axes, _FILL_BLOCK):
        result[part] = values_of(part)
    return result


def in_place_blocks(shape):
    """The index tuples of an array of `shape` for work written in place, a
    block of about _FILL_BLOCK elements at a time: ``...`` alone (the
    whole, 0-d arrays too) for an array of one block."""
    if math.prod(shape) <= _FILL_BLOCK:
        return [...]
    return blocks(shape, range(len(shape)), _FILL_BLOCK)


def converted(array, dtype):
    """`array` as `dtype`: the array itself when it has that dtype, else a
    new C-ordered array of the values ``array.astype(dtype)`` gives, filled
    by blocks: one astype of 512 MiB of float32 gradients to float64 took
    2.2 s into fresh pages here (0.13 s into reused ones), Ctrl-C waiting
    for all of it."""
    dtype = np.dtype(dtype)
    return array if array.dtype == dtype else filled(array.shape, dtype, lambda part: array[part])
