"""Optimizers for attnc modules: torch.optim.SGD and torch.optim.AdamW on
NumPy parameters.

An optimizer holds a Module, not a list of arrays: each step() walks
module.named_parameters() and module.named_grads() together and updates
every parameter in place from its gradient buffer, so references to the
parameters (and views of them) stay valid and see the new values. A
parameter reached by several names (weight tying) comes once, under its
first name, with the gradient of every use, and is updated once, as
torch updates a tied parameter. The gradient buffers are only read;
zero_grad() clears them.

The optimizer state (momentum buffers, Adam moments, step counts) is kept
per dotted parameter name in `state`, its arrays in the parameter's dtype;
for a float16 or bfloat16 parameter in float32: its update is computed in
float32 from the parameter and gradient widened, and rounded once into the
parameter (Adam's default eps, 1e-8, is 0 in float16, and its moments
would underflow). No float32 copy of the parameter is kept between steps.
A parameter replaced by one of the same shape and dtype (an assignment, a
load_state_dict) keeps its state, as torch's ``copy_``-based loading does; one
replaced by a parameter of another shape or dtype (an assignment,
module.to) makes step() raise ValueError naming it, before any parameter
is updated: its state cannot follow it, and resetting it silently would
change the optimisation behind the caller's back. Make a new optimizer
then.

The hyper-parameters are plain attributes (``optimizer.lr = 0.01`` between
steps, as a schedule sets torch's ``param_groups``); every step checks them
as the constructor does, so a bad value raises, naming it, before any
parameter moves.

Each update rule is torch's single-tensor (foreach=False) implementation,
operation by operation, with the hyperparameters rounded to the
parameter's dtype where torch rounds them, computed in one pass over each
parameter by a C kernel (``_C.update``; csrc/optimizer_impl.h) that also
puts the state's new entries in place: a KeyboardInterrupt (Ctrl-C) comes
between two parameters, never inside one, so each parameter and its state
are stepped or untouched. What can differ from torch is the rounding of a
multiply-add fused or not (a few units in the last place per step)."""
import math
import numbers

import numpy as np

from . import _C
from ._checks import bfloat16, refuse_masked
from .module import Module

__all__ = ["Optimizer", "SGD", "AdamW"]


_REAL_DTYPE_NAMES = ("float", "int", "uint", "bfloat")  # NumPy's, ml_dtypes' and torch's names, "torch." removed


def _number(value, name):
    """value as a float: a real number, or a 0-d array or tensor of one of an
    integer or floating dtype (as torch takes a tensor lr, and attnc's other
    numeric arguments take them); TypeError for anything else (a bool of any
    kind, a complex number, a string)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None:  # a NumPy scalar, a 0-d array or tensor: judged by its dtype
        real = str(dtype).removeprefix("torch.").startswith(_REAL_DTYPE_NAMES)
        ok = real and getattr(value, "ndim", None) == 0
    else:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok:
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError as error:  # an int (or a Fraction) past any float
        raise ValueError(f"{name}: expected a finite number, got {value!r} (too large for a float)") from error


def _nonnegative(value, name):
    """value as a finite float >= 0, else ValueError naming the argument."""
    number = _number(value, name)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return number


_COUNT_LIMIT = 2 ** 63  # a state count's bound: int64's (AdamW's 1 - beta ** step needs it as a float)


try:  # (first byte, one past the last) of the memory an array spans
    from numpy.lib.array_utils import byte_bounds as _byte_bounds  # NumPy 2
except ImportError:  # NumPy 1
    _byte_bounds = np.byte_bounds


def _may_overlap_itself(array):
    """True when two elements of `array` may share memory (a zero stride
    along an axis of more than one element, or strides that interleave):
    an in-place update would then write such memory once per element. The
    test is sufficient, not exact: axes sorted by stride, each stride must
    step over everything the smaller ones span (every C, Fortran or sliced
    layout passes)."""
    if array.size == 0 or array.flags.c_contiguous or array.flags.f_contiguous:  # (NumPy's flags: no axis of
        return False                                                            # more than one element overlaps)
    span = array.itemsize
    for stride, size in sorted((abs(stride), size) for stride, size in zip(array.strides, array.shape) if size > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def _betas(betas):
    """(beta1, beta2) as floats in [0, 1), from a tuple or list of two."""
    if not isinstance(betas, (tuple, list)):
        raise TypeError(f"betas: expected a pair (beta1, beta2), got {type(betas).__name__} {betas!r}")
    betas = tuple(betas)  # as given: a list that an element's __float__ changes is read once
    if len(betas) != 2:
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {len(betas)} values {betas!r}")
    pair = tuple(_number(beta, "betas") for beta in betas)
    if not all(0 <= beta < 1 for beta in pair):
        raise ValueError(f"betas: expected beta1 and beta2 in [0, 1), got {betas!r}")
    return pair


class Optimizer:
    """Base class of the optimizers: the walk over a module's parameters and gradients.

    `step` walks ``module.named_parameters()`` and
    ``module.named_grads()`` together and updates every parameter in
    place (a tied parameter once, under its first name, from the
    gradient of every use); a subclass gives the update rule (`SGD`,
    `AdamW`). The state of each parameter (momentum buffers, moments, step
    counts) is kept in `state` under its dotted name (a tied parameter's
    first).

    Parameters
    ----------
    module : attnc.Module
        The module whose parameters are optimised.

    Attributes
    ----------
    module : attnc.Module
        The module given.
    state : dict of str to dict
        Per dotted parameter name, the update rule's state (arrays in the
        parameter's dtype; float32 for a float16 or bfloat16 parameter,
        whose update is computed in float32).

    Raises
    ------
    TypeError
        If `module` is not an ``attnc.Module``.

    Examples
    --------
    >>> import attnc
    >>> optimizer = attnc.optim.SGD(attnc.Linear(2, 1), lr=0.1)
    >>> isinstance(optimizer, attnc.optim.Optimizer), optimizer.state
    (True, {})
    """

    def __init__(self, module):
        if not isinstance(module, Module):
            raise TypeError(f"module: expected an attnc.Module, got {type(module).__name__}")
        self.module = module
        self.state = {}      # dotted parameter name -> {state name: value}
        self._layouts = {}   # dotted parameter name -> (shape, dtype) at its first step

    def __setstate__(self, state):
        """Unpickling: the state's arrays writable again (out-of-band buffers
        may be read-only), as a module's parameters and gradient buffers
        are; anything else as it came (step() checks it)."""
        self.__dict__.update(state)
        if isinstance(self.state, dict):
            for entries in self.state.values():
                for key in self._state_arrays if isinstance(entries, dict) else ():
                    if type(entries.get(key)) is np.ndarray:
                        entries[key] = np.require(entries[key], requirements="CAW")

    def zero_grad(self):
        """Set every gradient buffer of the module to zero (``module.zero_grad()``)."""
        self.module.zero_grad()

    def step(self):
        """Update every parameter in place from its gradient buffer.

        The gradient buffers are only read; views of a parameter see the
        new values.

        Raises
        ------
        ValueError
            Naming the parameter, with no parameter updated, if a
            parameter was replaced since the previous step by one of
            another shape or dtype (its state cannot follow it: make a new
            optimizer), or cannot be updated in place (read-only, not
            float16, bfloat16, float32 or float64, or with strides under
            which elements may share memory, as strides set to 0 make
            them); naming the setting,
            if a hyper-parameter attribute (``lr``, ...) was set since
            construction to a value the constructor refuses (checked at
            every step); naming the entry, with no parameter updated, if
            an entry of `state` was set to an array of another shape or
            dtype, read-only or with elements sharing memory, to a masked
            array with an element masked, to an
            array sharing memory with another the step reads or writes (a
            parameter, a gradient buffer, another entry), to a step count
            below 0 or from 2**63 on, or an AdamW state lost some entries;
            naming both, with no parameter updated, for one dict made the
            state of two parameters.
        TypeError
            Naming the setting, for a hyper-parameter attribute set to
            something that is not a real number; naming the entry, with
            no parameter updated, for an entry of `state` set to a value
            of another kind (not a dict, an ndarray (a subclass neither) or
            an int); naming the
            attribute, for `module` or `state` set to something that is
            not an attnc.Module or a dict.
        NotImplementedError
            On the base class, which has no update rule.
        """
        self._check_settings()
        if not isinstance(self.module, Module):
            raise TypeError(f"module: expected an attnc.Module, got {type(self.module).__name__}")
        if not isinstance(self.state, dict):
            raise TypeError(f"state: expected a dict of parameter names to dicts, got {type(self.state).__name__}")
        triples = [(name, param, grad) for (name, param), (_, grad)
                   in zip(self.module.named_parameters(), self.module.named_grads())]
        self._check_own_states(triples)
        for name, param, _ in triples:
            if not param.flags.writeable or not _updatable(param.dtype):
                kind = f"{'a read-only' if not param.flags.writeable else 'an'} {param.dtype} array"
                raise ValueError(f"{name}: step() updates parameters in place: expected a writable float16, "
                                 f"bfloat16, float32 or float64 array, got {kind}")
            if _may_overlap_itself(param):
                raise ValueError(f"{name}: step() updates parameters in place: expected an array whose elements "
                                 f"cannot share memory, got strides {param.strides} for shape {param.shape}, which may")
            layout = param.shape, param.dtype
            before = self._layouts.get(name, layout)  # recorded once the whole step is known to run
            if layout != before:
                raise ValueError(f"{name}: replaced since the previous step by a parameter of shape "
                                 f"{param.shape} and dtype {param.dtype} (was {before[0]}, {before[1]}); "
                                 "its optimizer state cannot follow it: make a new optimizer")
            self._check_state(name, param)
        self._check_apart(triples)
        for name, param, grad in triples:  # a Ctrl-C comes between two parameters, never inside one
            self._layouts.setdefault(name, (param.shape, param.dtype))
            try:
                self._update(param, grad, self.state.setdefault(name, {}))
            except ValueError as error:  # (an array made read-only by another thread or a signal handler)
                raise ValueError(f"{name}: {error}") from None

    def _check_settings(self):
        """Checks the hyper-parameter attributes (at construction and at every
        step: they are plain attributes a caller may set), normalising them;
        TypeError or ValueError naming the first bad one."""

    def _check_state(self, name, param):
        """`state[name]`, a public dict a caller may have edited, as `_update` needs
        it: absent, or a dict whose entries named by `_state_arrays` are writable
        arrays of the update's dtype and the parameter's shape and whose counts
        (`_state_counts`) are ints >= 0 (with counts, all of them or none). Else
        TypeError (a wrong kind) or ValueError naming the entry; checked for every
        parameter before any is updated."""
        if name not in self.state:
            return
        state = self.state[name]
        where = f"state[{name!r}]"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expected a dict, got {type(state).__name__}")
        if not state:  # none of the entries: the update starts the state again
            return
        entries = self._state_arrays + self._state_counts
        if self._state_counts and state and any(key not in state for key in entries):
            raise ValueError(f"{where}: expected the entries {entries} or none, got {tuple(state)}")
        dtype = _update_dtype(param)
        for key in self._state_arrays:
            array = state.get(key)
            if key not in state or (array is None and not self._state_counts):  # SGD's None: no buffer yet
                continue
            if (type(array) is np.ndarray and array.shape == param.shape and array.dtype == dtype
                    and array.flags.writeable and not _may_overlap_itself(array)):
                continue  # (the common case, checked without building a message: steps of small modules)
            expected = f"expected a writable {dtype} array of shape {param.shape}"
            refuse_masked(array, f"{where}[{key!r}]")
            if type(array) is not np.ndarray:  # a subclass's operators are not the update's (np.matrix's *)
                raise TypeError(f"{where}[{key!r}]: {expected} (an ndarray, not a subclass), got "
                                f"{type(array).__name__}")
            if array.shape != param.shape or array.dtype != dtype or not array.flags.writeable:
                kind = "a read-only" if not array.flags.writeable else "a"
                raise ValueError(f"{where}[{key!r}]: {expected}, got {kind} {array.dtype} array of shape "
                                 f"{array.shape}")
            raise ValueError(f"{where}[{key!r}]: {expected} whose elements cannot share memory, got strides "
                             f"{array.strides}")
        for key in self._state_counts:
            count = state[key]
            if isinstance(count, bool) or not isinstance(count, numbers.Integral):
                raise TypeError(f"{where}[{key!r}]: expected an int >= 0, got {type(count).__name__} {count!r}")
            if not 0 <= count < _COUNT_LIMIT:  # (a float power of a larger one overflows)
                raise ValueError(f"{where}[{key!r}]: expected an int >= 0 and below 2**63, got {count!r}")

    def _check_own_states(self, triples):
        """No two parameters' states are one dict (``dict.fromkeys(names, {})``):
        the step would update each parameter with the moments and counts of
        the ones before it. ValueError naming both, before any parameter is
        updated (an emptied dict holds no array that `_check_apart` could
        find shared)."""
        first_name_of = {}  # id(state dict) -> the first parameter name it is the state of
        for name, _, _ in triples:
            state = self.state.get(name)
            if not isinstance(state, dict):  # absent, or refused by _check_state
                continue
            first = first_name_of.setdefault(id(state), name)
            if first != name:
                raise ValueError(f"state[{name!r}]: the same dict as state[{first!r}]; each parameter needs a "
                                 "state of its own: give it a dict of its own ({} starts it again)")

    def _check_apart(self, triples):
        """Every array step() writes in place (the parameters and their state
        arrays) shares no memory with another it reads or writes (those and
        the gradient buffers, which it only reads): else the update's result
        would depend on the order of its writes (two state entries one array,
        a state entry that is a gradient buffer). ValueError naming both;
        checked before any parameter is updated. By the arrays' byte spans:
        sufficient, not exact (two interleaved views of one buffer are
        refused too); only where some array is a view, or one array comes
        twice (arrays that own their memory, as the module's and the
        optimizer's own, never share it)."""
        entries = []
        for name, param, grad in triples:
            entries += [(name, param, True), (f"the gradient buffer of {name}", grad, False)]
            state = self.state.get(name) or {}
            entries += [(f"state[{name!r}][{key!r}]", state[key], True) for key in self._state_arrays
                        if isinstance(state.get(key), np.ndarray)]
        if all(array.base is None for _, array, _ in entries) and len({id(e[1]) for e in entries}) == len(entries):
            return
        spans = [(*_byte_bounds(array), label, written) for label, array, written in entries if array.size]
        spans.sort(key=lambda span: span[0])
        open_spans = []  # those not yet ended where the current one starts
        for low, high, label, written in spans:
            open_spans = [span for span in open_spans if span[1] > low]
            for other in open_spans:
                if written or other[3]:
                    first, second = (label, other[2]) if written else (other[2], label)
                    raise ValueError(f"{first}: shares memory with {second}, and step() writes it in place: "
                                     "give it an array of its own")
            open_spans.append((low, high, label, written))

    _state_arrays = ()  # the arrays the update rule keeps in a parameter's state
    _state_counts = ()  # its counts; with any, the state is all of these or empty

    def _update(self, param, grad, state):
        """Updates `param` in place from `grad` (read only) and its `state` dict,
        in one call of ``_C.update`` (the update and the state's new entries
        together: a KeyboardInterrupt comes before or after all of it)."""
        raise NotImplementedError(f"{type(self).__name__} has no update rule: use attnc.optim.SGD or AdamW")


def _updatable(dtype):
    """True for the dtypes of the C update (``_C.update``), in either byte
    order: float16, bfloat16, float32, float64 (not longdouble, nor
    ml_dtypes' narrower floats)."""
    return dtype.type in (np.float16, np.float32, np.float64) or (dtype.kind == "V" and dtype == bfloat16())


def _update_dtype(param):
    """The dtype an update computes in and keeps its state in: float32 for a
    16-bit parameter, else the parameter's (in native byte order: a
    parameter's dtype set in place to the other order steps as it did)."""
    return np.dtype(np.float32) if param.dtype.itemsize == 2 else param.dtype.newbyteorder("=")


class SGD(Optimizer):
    """Stochastic gradient descent, as torch.optim.SGD (dampening 0, no Nesterov).

    Parameters
    ----------
    module : attnc.Module
        The module whose parameters are optimised.
    lr : float
        The learning rate; finite, >= 0.
    momentum : float, default 0.0
        The momentum factor; finite, >= 0.
    weight_decay : float, default 0.0
        The L2 penalty added to the gradient; finite, >= 0.

    Raises
    ------
    TypeError
        If `module` is not an ``attnc.Module``, or a hyper-parameter is
        not a real number (bools and strings are not); the message names
        it.
    ValueError
        If a hyper-parameter is negative, infinite or NaN; the message
        names it.

    Notes
    -----
    For each parameter p with gradient g, at each step::

        d = g + weight_decay * p                        (when weight_decay != 0)
        b = d                      at the first step    (when momentum != 0)
        b = momentum * b + d       afterwards; then d = b
        p = p - lr * d

    The momentum buffer b of each parameter is
    ``state[name]["momentum_buffer"]``.

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> layer = attnc.Linear(2, 1)
    >>> _ = layer.load_state_dict({"weight": [[1.0, 1.0]], "bias": [0.0]})
    >>> optimizer = attnc.optim.SGD(layer, lr=0.1)
    >>> y = layer(np.array([[1.0, 2.0]]))
    >>> _ = layer.backward(np.ones_like(y))  # gradient of y.sum()
    >>> optimizer.step()
    >>> print(layer.weight, layer.bias)
    [[0.9 0.8]] [-0.1]
    >>> optimizer.zero_grad()
    """

    _state_arrays = ("momentum_buffer",)

    def __init__(self, module, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(module)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self._check_settings()

    def _check_settings(self):
        self.lr = _nonnegative(self.lr, "lr")
        self.momentum = _nonnegative(self.momentum, "momentum")
        self.weight_decay = _nonnegative(self.weight_decay, "weight_decay")

    def _update(self, param, grad, state):
        buffers, entries = (), {}
        if self.momentum != 0:
            buffers = (state.get("momentum_buffer"),)
            if buffers[0] is None:  # the first step's buffer: in the state once the step is done
                buffers = (np.empty(param.shape, _update_dtype(param)),)
                entries["momentum_buffer"] = buffers[0]
        _C.update(param, grad, buffers, "sgd", state, entries, start=bool(entries), lr=self.lr,
                  momentum=self.momentum, weight_decay=self.weight_decay)


class AdamW(Optimizer):
    """Adam with decoupled weight decay, as torch.optim.AdamW (amsgrad False).

    Parameters
    ----------
    module : attnc.Module
        The module whose parameters are optimised.
    lr : float, default 1e-3
        The learning rate; finite, >= 0.
    betas : tuple of float, default (0.9, 0.999)
        ``(beta1, beta2)``, a tuple or list of two numbers in ``[0, 1)``:
        the decay rates of the first and second moments.
    eps : float, default 1e-8
        Added to the denominator; finite, >= 0.
    weight_decay : float, default 1e-2
        The decoupled weight decay; finite, >= 0.

    Raises
    ------
    TypeError
        If `module` is not an ``attnc.Module``, `betas` is not a tuple or
        list, or a hyper-parameter is not a real number (bools and strings
        are not); the message names it.
    ValueError
        If `lr`, `eps` or `weight_decay` is negative, infinite or NaN, or
        `betas` is not two numbers in ``[0, 1)``; the message names it.

    Notes
    -----
    For each parameter p with gradient g, at its step t = 1, 2, ...::

        p = p * (1 - lr * weight_decay)
        m = lerp(m, g, 1 - beta1)                 m + (1-beta1) (g - m), as torch.lerp
        v = beta2 * v + (1 - beta2) * g * g
        p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    with m and v starting at zero. ``torch.lerp`` computes ``g - (g - m) *
    beta1`` instead when ``1 - beta1 >= 0.5``; so does this.
    ``state[name]`` holds ``"step"`` (an int), ``"exp_avg"`` (m) and
    ``"exp_avg_sq"`` (v).

    Examples
    --------
    The first step moves each parameter by about `lr` against its
    gradient's sign:

    >>> import numpy as np
    >>> import attnc
    >>> layer = attnc.Linear(2, 1)
    >>> _ = layer.load_state_dict({"weight": [[1.0, 1.0]], "bias": [0.0]})
    >>> optimizer = attnc.optim.AdamW(layer, lr=0.1, weight_decay=0.0)
    >>> y = layer(np.array([[1.0, -2.0]]))
    >>> _ = layer.backward(np.ones_like(y))
    >>> optimizer.step()
    >>> print(np.round(layer.weight, 4), np.round(layer.bias, 4))
    [[0.9 1.1]] [-0.1]
    """

    _state_arrays, _state_counts = ("exp_avg", "exp_avg_sq"), ("step",)

    def __init__(self, module, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(module)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self._check_settings()

    def _check_settings(self):
        self.lr = _nonnegative(self.lr, "lr")
        self.betas = _betas(self.betas)
        self.eps = _nonnegative(self.eps, "eps")
        self.weight_decay = _nonnegative(self.weight_decay, "weight_decay")

    def _update(self, param, grad, state):
        beta1, beta2 = self.betas
        if state:
            step = int(state["step"]) + 1  # a Python int: a NumPy integer count (a checkpoint's) wraps
            moments, entries = (state["exp_avg"], state["exp_avg_sq"]), {"step": step}
        else:  # the first step's moments: in the state once the step is done
            step, moments = 1, tuple(np.zeros(param.shape, _update_dtype(param)) for _ in range(2))
            entries = {"step": step, "exp_avg": moments[0], "exp_avg_sq": moments[1]}
        _C.update(param, grad, moments, "adamw", state, entries, decay=1 - self.lr * self.weight_decay,
                  lerp_weight=1 - beta1, beta2=beta2, step_size=self.lr / (1 - beta1 ** step),
                  bias2_sqrt=(1 - beta2 ** step) ** 0.5, eps=self.eps)
