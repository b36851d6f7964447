"""attnc._blocks: blocks(), the blocks in which softmax_backward, the heads'
mean of the weights and the parameters' initial draws do their NumPy work
(Ctrl-C taken between blocks), checked for what its callers rely on against
counts made element by element; converted(), checked against NumPy's astype;
the sums of gradients made by blocks (in_place_blocks, filled), against
NumPy's whole-array add."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnc import _blocks
from attnc._blocks import blocks, converted


@st.composite
def shapes_and_axes(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=4)))
    axes = draw(st.permutations(range(len(shape))))
    return shape, tuple(axes[:draw(st.integers(1, len(shape)))])


@settings(max_examples=300, deadline=None)
@given(shapes_and_axes(), st.integers(1, 400))
def test_blocks_cover_each_element_once_in_order_and_hold_about_the_budget(shape_and_axes, elements):
    shape, axes = shape_and_axes
    seen = np.zeros(shape, np.int64)
    elements_of = np.arange(math.prod(shape)).reshape(shape)  # (any array of the shape)
    last_starts = ()
    for part in blocks(shape, axes, elements):
        assert len(part) == len(shape)
        for axis, index in enumerate(part):
            if axis not in axes:  # the axes not listed: always whole
                assert index == slice(None)
        seen[part] += 1
        block = elements_of[part]
        if block.size == 0:  # (an array of no elements: its blocks have none either)
            assert elements_of.size == 0
            continue
        # in order along the axes as listed (for the initial draws: a generator's
        # draws for a block follow those of the block before)
        starts = tuple(part[axis] if isinstance(part[axis], int) else part[axis].indices(shape[axis])[0]
                       for axis in axes)
        assert starts > last_starts
        last_starts = starts
        # one index of an axis is taken alone only when it holds more than `elements`
        for i, axis in enumerate(axes):
            if isinstance(part[axis], int):
                assert math.prod(n for d, n in enumerate(shape) if d not in axes[:i + 1]) > elements
        # the axis split: at most `elements` (or one index of it), and no fewer
        # than fit unless the axis ends there
        (split,) = [axis for axis, index in enumerate(part) if isinstance(index, slice) and index != slice(None)]
        first, stop, _ = part[split].indices(shape[split])
        one_index = block.size // (stop - first)
        assert block.size <= max(elements, one_index)
        assert stop == shape[split] or block.size + one_index > elements
    assert (seen == 1).all()


def _arrays_to_convert():
    rng = np.random.default_rng(0)
    values = rng.standard_normal((5, 7, 300)) * 1e3
    values[0, 0, :3] = [np.inf, -np.nan, 1e300]  # (past float16's range: inf, as astype rounds it)
    with np.errstate(over="ignore"):
        as_float32 = values.astype(np.float32)
    yield "c-order", values
    yield "transposed", values.transpose(2, 0, 1)
    yield "strided", values[::2, :, ::3]
    yield "one-d", values.reshape(-1)
    yield "empty", values[:, :0]
    yield "zero-d", np.array(2.5)
    yield "float32", as_float32


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name, array", list(_arrays_to_convert()), ids=[name for name, _ in _arrays_to_convert()])
def test_converted_gives_astypes_values_by_blocks(name, array, dtype, monkeypatch):
    """converted (a gradient or a bias to the dtype a call returns, Ctrl-C taken
    between blocks): the values of NumPy's astype, in blocks small enough here to
    take many; the array itself when it has the dtype already."""
    dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    monkeypatch.setattr(_blocks, "_FILL_BLOCK", 97)
    with np.errstate(over="ignore", invalid="ignore"):
        got = converted(array, dtype)
        expected = array.astype(dtype)
    if array.dtype == dtype:
        assert got is array
    assert got.dtype == dtype and got.shape == array.shape
    as_bytes = lambda a: np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # (NaNs' bits too)
    np.testing.assert_array_equal(as_bytes(got), as_bytes(expected))


@pytest.mark.parametrize("grad_dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("name, array", [(name, array) for name, array in _arrays_to_convert() if name != "float32"],
                         ids=[name for name, _ in _arrays_to_convert() if name != "float32"])
def test_sums_of_gradients_by_blocks_give_numpys_whole_array_add(name, array, grad_dtype, monkeypatch):
    """A parameter's gradients that commit cannot add in place are summed by
    blocks (_sum_into, Ctrl-C taken between them): in the gradient's own memory
    when it has the buffer's dtype (in_place_blocks), else into a new array
    (filled). Both must give NumPy's whole-array add rounded to the buffer's
    dtype, and leave the buffer unwritten; blocks small enough here to take
    many."""
    from attnc.module import _sum_into
    monkeypatch.setattr(_blocks, "_FILL_BLOCK", 97)
    with np.errstate(over="ignore", invalid="ignore"):
        buffer = np.ascontiguousarray(array).astype(np.float16)
        grad = (np.ascontiguousarray(array[..., ::-1] if array.ndim else array) / 3).astype(grad_dtype)
        expected = np.add(buffer, grad).astype(np.float16)
        kept = buffer.copy()
        got = _sum_into(buffer, grad, buffer.dtype)
    if grad_dtype == "float16":
        assert got is grad  # (summed in its memory)
    assert got.dtype == np.float16 and got.shape == buffer.shape
    as_bytes = lambda a: np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    np.testing.assert_array_equal(as_bytes(got), as_bytes(expected))
    np.testing.assert_array_equal(as_bytes(buffer), as_bytes(kept))
