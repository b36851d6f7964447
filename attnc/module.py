"""Module, Linear and Dropout: torch.nn's bookkeeping for NumPy arrays."""
import collections
import collections.abc
import contextlib
import contextvars
import functools
import math
import os
import sys
import threading
import weakref

import numpy as np

from . import _C
from ._blocks import blocks, converted, filled, in_place_blocks
from ._checks import as_array, bfloat16, flag, is_floating, module_dtype, positive_int
from ._random import draw_seed, generator
from .functional import linear_backward

# __setstate__'s conversions of unpickled parameters and gradient buffers: (id of the unpickled
# array, dtype or "gradient buffer") -> (weak references to it and to its conversion). A tied
# parameter, or a buffer copy.copy shared, is one unpickled array in the states of several modules
# (pickle keeps objects' identity); each converting it alone (a read-only out-of-band buffer is
# copied) untied it. Weak: an entry goes with its unpickled array (_forget) and is checked
# to refer to the very array (an id is reused once its array is gone).
_unpickled_conversions = {}


def _new_locks():
    """The module's locks, made at import and again in a forked child: a
    lock another thread of the parent held at the fork stays held in the
    child, whose calls would then wait for it forever."""
    global _FINISH_LOCK, _GRADS_LOCK, _TREE_LOCK, _UNPICKLED_LOCK
    # _finish_backward's: adding a backward's gradients and releasing its forward's state are one step
    # (never re-entered: _finish_backward refuses a call from inside itself)
    _FINISH_LOCK = threading.Lock()
    # _grad's: a buffer looked up and made in one step (a reader made a second one over a backward's);
    # re-entered by a signal handler (or a finalizer) that runs inside the block and reads the gradients
    _GRADS_LOCK = threading.RLock()
    # __setattr__'s: a module assigned after the check that it does not contain the owner (two threads
    # assigning two modules into each other had made a cycle)
    _TREE_LOCK = threading.RLock()  # (re-entered by a __getattribute__ of its own that assigns a module)
    # _unpickled_conversions' (re-entered by _forget when a collection runs inside it)
    _UNPICKLED_LOCK = threading.RLock()


_new_locks()
os.register_at_fork(after_in_child=_new_locks)


def _replaced_method(obj, cls, methods):
    """Which of `methods` a call of obj would not run as cls's own, said as
    an error message says it ("X overrides forward", "this X has a forward
    set on the instance"; an instance's __call__ is never called, but is as
    plainly meant), or None when every one is cls's: what the callers that
    read a module's parameters instead of calling it (the attention modules,
    frozen modules) refuse."""
    kind = type(obj).__name__
    for method in methods:
        if getattr(type(obj), method) is not getattr(cls, method):
            return f"{kind} overrides {method}"
        if method in obj.__dict__:
            return f"this {kind} has a {method} set on the instance"
    return None


def _forget(key, dead):
    """The weak reference `dead` to an unpickled array died: its entry goes."""
    with _UNPICKLED_LOCK:
        if _unpickled_conversions.get(key, (None,))[0] is dead:
            del _unpickled_conversions[key]


def _converted_once(value, target, convert):
    """convert(value) for an array unpickled into several modules' states
    (a tied parameter, a gradient buffer copy.copy shared): the conversion
    made already for this very array and `target` (the dtype, or what it
    becomes), so that what was one array stays one (_unpickled_conversions)."""
    key = id(value), target
    with _UNPICKLED_LOCK:
        original, converted = _unpickled_conversions.get(key, (None, None))
        result = converted() if original is not None and original() is value else None
        if result is None:
            result = convert(value)
            if result is not value:  # a copy: the next module given this array gets the same
                _unpickled_conversions[key] = weakref.ref(value, functools.partial(_forget, key)), weakref.ref(result)
        return result


def _inside_finish_backward(frame):
    """Whether `frame` runs inside a Module._finish_backward of its thread (a
    signal handler or a finalizer run there): read from the thread's stack,
    which no interrupt can leave stale, as a flag could be."""
    while frame is not None:
        if frame.f_code is Module._finish_backward.__code__:
            return True
        frame = frame.f_back
    return False


_IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _dotted(prefix):
    """A `prefix` argument as the start of dotted names: torch's rule, the
    prefix and a dot (none for ""); TypeError naming it unless a str."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix: expected a str, got {type(prefix).__name__}")
    return prefix + "." if prefix else ""


def _grad_dtype(x, module_dtype):
    """The dtype of the gradient with respect to input x: x's when it is a
    floating array of 16 bits or more (as torch's x.grad), in native byte
    order as every result, else the module's (a float8 x's gradient would
    keep 2 or 3 mantissa bits)."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not isinstance(dtype, np.dtype):  # a torch tensor's: torch.float64 ...
        name = str(dtype).removeprefix("torch.")
        if name == "bfloat16":  # ml_dtypes' (None without it): NumPy knows the name only once it is imported
            dtype = bfloat16()
        else:
            try:
                dtype = np.dtype(name)
            except TypeError:
                dtype = None
    if isinstance(dtype, np.dtype) and is_floating(dtype) and dtype.itemsize >= 2:
        return dtype.newbyteorder("=")
    return module_dtype


_ADDED_IN_PLACE = (np.dtype(np.float32), np.dtype(np.float64))  # native byte order


def _adds_in_place(buffer, grad):
    """Whether _C.commit adds grad into buffer in place (its adds): float32
    or float64 arrays of one dtype, native, aligned, C-contiguous and
    apart. An overflow there gives inf with no NumPy warning, as torch's
    accumulation does."""
    return (isinstance(grad, np.ndarray) and buffer.dtype in _ADDED_IN_PLACE and grad.dtype == buffer.dtype
            and buffer.flags.c_contiguous and buffer.flags.aligned and grad.flags.c_contiguous
            and grad.flags.aligned and not np.may_share_memory(buffer, grad))


def _sum_into(total, grad, dtype):
    """total (of dtype: a gradient buffer, or a sum made here) + grad
    rounded to dtype, as ``buffer += grad`` rounds it: in grad's memory
    (grad being a backward's own new array) when grad has that dtype, is
    writeable and shares no memory with total (so that no buffer is
    written before commit), else a new array. The same bits either way.
    Added by blocks, Ctrl-C taken between them: one add of a float16
    (8192, 8192) gradient took 0.63 s here, the GIL held."""
    if grad.dtype == dtype and grad.flags.writeable and not np.may_share_memory(total, grad):
        for part in in_place_blocks(grad.shape):
            np.add(total[part], grad[part], out=grad[part])
        return grad
    return filled(total.shape, dtype, lambda part: np.add(total[part], grad[part]))


# The arguments a module's constructor names its parameters' sizes by, while it
# makes them (an attention module's Linear layers are sized by its "hidden_dim",
# not by their own "out_features, in_features"); None outside such a constructor.
_constructor_sizes = contextvars.ContextVar("attnc_constructor_sizes", default=None)


@contextlib.contextmanager
def _sized_by(sizes):
    """Within: a parameter NumPy refuses to make is blamed on `sizes`, the
    arguments of the constructor that asked for it (e.g. "hidden_dim")."""
    token = _constructor_sizes.set(sizes)
    try:
        yield
    finally:
        _constructor_sizes.reset(token)


# A parameter's initial values are drawn and converted this many elements at a
# time, Ctrl-C asked about between blocks (Python asks between bytecodes): in
# one NumPy call each, MultiHeadAttention(8192, 8)'s 2 GiB of float64 draws and
# their conversion ran 0.1-2.2 s past Ctrl-C, and attnc.from_torch of torch's
# nn.MultiheadAttention(8192, 8) 1-3 s (a Ctrl-C audit, 2026-12-07).
_DRAW_BLOCK_ELEMENTS = 1 << 20


def _initial_values(make, shape, sizes, dtype):
    """make(shape), a parameter's initial values (float64), as an array of
    `dtype`: drawn and converted a block of rows along shape's first axis at a
    time (the same values: a generator's draws for a block follow those of the
    block before, and each is converted as the whole would be). An array NumPy
    refuses (too big to exist, or to allocate) raises its error with the sizes
    that asked for it in front (`sizes`, e.g. "out_features, in_features", or
    those of the constructor making the layer: _sized_by)."""
    try:
        values = np.empty(shape, dtype)
        for part in blocks(shape, (0,), _DRAW_BLOCK_ELEMENTS):
            values[part] = make(values[part].shape)
        return values
    except (ValueError, MemoryError, OverflowError) as error:  # NumPy's _ArrayMemoryError is a MemoryError;
        # OverflowError: a size past any float, in the scale of the values make draws
        kind = MemoryError if isinstance(error, MemoryError) else ValueError
        sizes = _constructor_sizes.get() or sizes
        raise kind(f"{sizes}: no parameter of shape {shape} can be made ({error})") from error


@functools.lru_cache(maxsize=1024)
def _key_paths(keys):
    """Dotted parameter names, each split once into (submodule path, name):
    a forward looks up its parameters by name at every call (a module
    class has a few such tuples: the cache stays small)."""
    return tuple((tuple(path), name) for *path, name in (key.split(".") for key in keys))


def _indent(text, spaces):
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


_FILL_BLOCK_BYTES = 8 << 20  # a block of _fill_with_zeros: Ctrl-C is asked between two


def _fill_with_zeros(buffer):
    """buffer (C-contiguous, as _grad keeps it) <- the bytes np.zeros makes:
    through a byte view (never a copy), whose fill NumPy runs as memset. Its
    fill(0) for float32 runs an element loop: 0.61 against 0.40 ms for a
    MultiHeadAttention(768)'s 9.4 MB of gradients out of cache
    (benchmarks/NOTES.md). By blocks of _FILL_BLOCK_BYTES, Python running
    its signal handlers between them: one memset of a 1 GiB buffer, the GIL
    held, had kept Ctrl-C waiting 0.1 s. Object arrays (a parameter placed
    past assignment) hold pointers, and a 0-d array has no byte view: filled
    by element."""
    if buffer.dtype.hasobject or buffer.ndim == 0:
        buffer.fill(0)
        return
    flat = buffer.reshape(-1).view(np.uint8)
    for start in range(0, flat.size, _FILL_BLOCK_BYTES):
        flat[start:start + _FILL_BLOCK_BYTES].fill(0)


class Module:
    """Base class of attnc's modules: parameters, submodules, modes and gradients.

    ``torch.nn.Module``'s bookkeeping for NumPy arrays. Parameters are
    ndarray attributes registered with `register_parameter`; submodules
    are registered by assigning them as attributes, in order, as in torch.
    `named_parameters`, `state_dict` and `load_state_dict` walk both in
    registration order with torch's dotted keys (``"Q_proj.weight"``).

    Parameters
    ----------
    dtype : data-type, default numpy.float32
        The module dtype: anything ``numpy.dtype`` maps to float16,
        float32 or float64, or bfloat16 (``ml_dtypes.bfloat16`` or
        ``"bfloat16"``; needs the ml_dtypes package). Parameters are
        stored in it and outputs returned in it.
    rng : numpy.random.Generator, optional
        The generator for parameter initialisation and dropout, kept by
        the module. None (the default): each draw comes from the
        package's global generator (see ``attnc.manual_seed``).

    Attributes
    ----------
    dtype : numpy.dtype
        float16, bfloat16, float32 or float64.
    training : bool
        True after construction (training mode), as in torch; see `train`
        and `eval`.
    rng : numpy.random.Generator or None
        The `rng` given.

    Raises
    ------
    TypeError
        If `dtype` is not one of the four (None included; bfloat16 without
        ml_dtypes says how to get it), or `rng` is neither a
        ``numpy.random.Generator`` nor None.

    Notes
    -----
    Dtype rule: attnc's modules compute in their own dtype. Their inputs
    (bool, integer or floating, in any layout) are converted to it, and
    their outputs are new arrays of it: a float64 input to a float32
    module gives a float32 result. Use `to` or ``dtype=np.float64`` for
    float64.

    float16 and bfloat16 modules store their parameters, the steps'
    results (projections, attention, gradients) and their outputs in 16
    bits, as torch's do, and compute each step in float32: products are
    accumulated, softmax and log-sum-exp taken in float32, and each
    step's result rounded once (to nearest, ties to even).

    A parameter assigned after construction is converted to an aligned,
    writable, C-contiguous array of the module dtype. Pickling and
    ``copy.deepcopy`` keep the parameters and gradient buffers and drop
    what a training-mode forward kept for `backward`.

    Examples
    --------
    A module with one parameter:

    >>> import numpy as np
    >>> import attnc
    >>> class Scale(attnc.Module):
    ...     def __init__(self, size):
    ...         super().__init__()
    ...         self.register_parameter("weight", np.full(size, 2.0))
    ...     def forward(self, x):
    ...         return np.asarray(x, self.dtype) * self.weight
    >>> scale = Scale(3)
    >>> scale.weight.dtype, scale.training
    (dtype('float32'), True)
    >>> scale(np.arange(3.0))
    array([0., 2., 4.], dtype=float32)
    >>> scale.state_dict()
    {'weight': array([2., 2., 2.], dtype=float32)}
    """

    def __init__(self, *, dtype=np.float32, rng=None):
        object.__setattr__(self, "_parameters", [])
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_grads", {})
        object.__setattr__(self, "_saved", None)
        self.dtype = module_dtype(dtype)
        self.rng = _C.check_rng(rng)
        self.training = True

    def __setattr__(self, name, value):
        if "_modules" not in self.__dict__:
            raise AttributeError(f"{name}: assigned before Module.__init__ ran; call super().__init__() first in "
                                 f"{type(self).__name__}.__init__")
        if name == "dtype":  # (before the Module branch: a module assigned here is no dtype)
            value = module_dtype(value)
        elif name == "training":  # its truth, as train(mode) takes it
            value = flag(value, "training")
        elif isinstance(value, Module):
            if name in self._parameters:
                raise TypeError(f"{name}: a parameter takes an array or None, got a {type(value).__name__} module")
            with _TREE_LOCK:
                if value._contains(self):
                    raise ValueError(f"{name}: the {type(value).__name__} assigned contains this module (or is it): "
                                     "a module tree has no cycles (every walk of it, state_dict, train, repr, would "
                                     "not end)")
                self._modules[name] = value
        elif name in self._modules:
            raise TypeError(f"{name}: a submodule takes a Module, got {type(value).__name__}")
        elif name in self._parameters:
            value = self._as_parameter(name, value)
        object.__setattr__(self, name, value)

    def _contains(self, module):
        """Whether `module` is this module or one of its submodules, at any depth."""
        seen, stack = set(), [self]
        while stack:
            current = stack.pop()
            if current is module:
                return True
            if id(current) not in seen:
                seen.add(id(current))
                stack.extend(tuple(getattr(current, "_modules", {}).values()))  # (no __init__ run yet: none)
        return False

    def __delattr__(self, name):
        """A deleted submodule leaves the module (its forward then names it);
        a deleted parameter stays registered, so assigning it again restores it."""
        object.__delattr__(self, name)
        self._modules.pop(name, None)

    def _as_parameter(self, name, value):
        """Any layout in, an aligned, writable, C-contiguous array of the
        module's dtype out (the value itself when it already is one); None
        stays None."""
        return None if value is None else _C.as_parameter(value, name=name, dtype=self.dtype)

    def __getstate__(self):
        """What a training-mode forward kept for backward is not pickled
        (nor copied by copy.deepcopy or copy.copy): it belongs to that
        forward. The registries are the state's own: copy.copy shares the
        state's values, and a submodule assigned to a shallow copy had gone
        into the original's registry too (its forward then used the copy's
        submodule, not the one its attribute names)."""
        state = dict(self.__dict__)
        state["_saved"] = None
        state["_parameters"], state["_modules"], state["_grads"] = \
            list(self._parameters), dict(self._modules), dict(self._grads)
        return state

    def __copy__(self):
        """A shallow copy, as torch's: it shares the parameters, submodules
        and gradient buffers, but not the registries (__getstate__). The
        module's own parameters' buffers are made now where a parameter has
        none yet (torch's ``.grad`` lives on the shared parameter): made
        later, on first use, each module's would have been its own, and a
        backward of one left the other's at zero."""
        for name in self._parameters:
            value = self.__dict__.get(name)
            if type(value) is np.ndarray:
                try:
                    self._grad(name, name, value)
                except ValueError:  # a buffer changed in place: shared as it is (its use names it)
                    pass
        return self._shallow_copy()

    def _shallow_copy(self):
        """A copy sharing the state's values (copy.copy's, without making
        gradient buffers)."""
        copied = type(self).__new__(type(self))
        copied.__setstate__(self.__getstate__())
        return copied

    def __setstate__(self, state):
        """Unpickling sets attributes without __setattr__: convert the
        parameters here (out-of-band buffers may be read-only or unaligned),
        an array shared by several modules' states once (_unpickled_conversions)."""
        self.__dict__.update(state)
        for name in self._parameters:
            if name in self.__dict__:  # (a deleted parameter stays deleted, and registered)
                self.__dict__[name] = self._unpickled_parameter(name, self.__dict__[name])
        for name, (grad, made_for) in self._grads.items():  # gradient buffers writable again (a shared one once)
            self._grads[name] = _converted_once(grad, "gradient buffer",
                                                lambda g: np.require(g, requirements="CAW")), made_for

    def _unpickled_parameter(self, name, value):
        """`value` unpickled as parameter `name`, converted (_as_parameter);
        an array another module converted already, that module's conversion."""
        if not isinstance(value, np.ndarray):
            return self._as_parameter(name, value)
        return _converted_once(value, self.dtype, lambda v: self._as_parameter(name, v))

    def register_parameter(self, name, value):
        """Register a parameter: the attribute `name`, set to `value`.

        Parameters
        ----------
        name : str
            The attribute name, and the key in `state_dict` (prefixed by
            the submodule path).
        value : array_like or None
            The initial value, converted to a C-contiguous array of the
            module dtype; None registers an absent parameter (skipped by
            `named_parameters`), as torch's ``bias=False``.

        Raises
        ------
        TypeError
            If `name` is not a str, or `value` is complex, object or string.
        KeyError
            If `name` is empty, holds a ".", or names another attribute (a
            submodule, a method), as torch's. Registering a parameter's name
            again replaces its value.
        """
        if not isinstance(name, str):
            raise TypeError(f"name: expected a str, got {type(name).__name__}")
        if not name or "." in name:
            raise KeyError(f"name: a parameter name is not empty and has no '.', got {name!r}")
        if name not in self._parameters and (name in self._modules or hasattr(self, name)):
            raise KeyError(f"name: attribute {name!r} already exists")
        value = self._as_parameter(name, value)  # first: a value refused leaves no name behind
        if name not in self._parameters:
            self._parameters.append(name)
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        """Compute the module's output; each subclass defines it.

        Parameters
        ----------
        *args, **kwargs
            The subclass's inputs.

        Raises
        ------
        NotImplementedError
            On the base class.
        """
        raise NotImplementedError

    def backward(self, grad_output):
        """Go back through the most recent training-mode forward.

        Returns the gradient with respect to that forward's input and adds
        every parameter's gradient into the buffer `named_grads` yields.
        Each forward allows one backward. Subclasses define it; see
        ``Linear.backward``.

        Parameters
        ----------
        grad_output : array_like
            The gradient with respect to the forward's output.

        Raises
        ------
        NotImplementedError
            On a module without a backward.
        """
        raise NotImplementedError(f"{type(self).__name__} has no backward")

    def __call__(self, *args, **kwargs):
        """Call `forward` with the same arguments, as torch's modules do.

        Parameters
        ----------
        *args, **kwargs
            Passed to `forward`.

        Returns
        -------
        object
            What `forward` returns.
        """
        return self.forward(*args, **kwargs)

    # -- modes ---------------------------------------------------------------
    def train(self, mode=True):
        """Set training mode (dropout active, forwards keep state for backward).

        Parameters
        ----------
        mode : bool, default True
            True: training mode; False: evaluation mode. Applied to every
            submodule.

        Returns
        -------
        Module
            The module itself.
        """
        mode = flag(mode, "mode")
        self.training = mode
        for child in tuple(self._modules.values()):  # (another thread may add or delete one)
            child.train(mode)
        return self

    def eval(self):
        """Set evaluation mode: no dropout, and forwards keep nothing for backward.

        Returns
        -------
        Module
            The module itself (``train(False)``).

        Examples
        --------
        >>> import attnc
        >>> attnc.Dropout(0.5).eval().training
        False
        """
        return self.train(False)

    # -- parameters ----------------------------------------------------------
    def named_parameters(self, prefix="", remove_duplicate=True):
        """Iterate over ``(dotted name, parameter)``, in registration order.

        The module's own parameters first, then each submodule's; absent
        (None) parameters are skipped. The arrays are the parameters
        themselves, not copies. A parameter reached by several names (a
        submodule assigned to two attributes, or one array assigned to
        two parameters: weight tying) comes once, under its first name,
        as in torch.

        Parameters
        ----------
        prefix : str, default ""
            Prepended to every name with a dot (``"model"`` gives
            ``"model.weight"``), as in torch.
        remove_duplicate : bool, default True
            False: every name, a shared parameter under each (the keys of
            `state_dict`).

        Yields
        ------
        name : str
            The parameter's `state_dict` key, e.g. ``"Q_proj.weight"``.
        parameter : ndarray
            The parameter, in the module dtype.

        Examples
        --------
        >>> import attnc
        >>> [(name, p.shape) for name, p in attnc.Linear(3, 2).named_parameters()]
        [('weight', (2, 3)), ('bias', (2,))]
        """
        prefix = _dotted(prefix)
        if not flag(remove_duplicate, "remove_duplicate"):
            for name, value, _, _ in self._every_parameter_slot(prefix):
                yield name, value
            return
        for name, value, _ in self._shared_parameters(prefix):
            yield name, value

    def _every_parameter_slot(self, prefix):
        """(dotted name, parameter, owning module, attribute name) of every
        parameter name, in registration order."""
        for name in self._parameters:
            try:
                value = getattr(self, name)
            except AttributeError as error:  # deleted, still registered: named by its dotted key
                raise AttributeError(f"{prefix}{name}: the parameter was deleted; assign it again") from error
            if value is not None:
                yield prefix + name, value, self, name
        for child_name, child in tuple(self._modules.items()):  # (another thread may add or delete one)
            yield from child._every_parameter_slot(prefix + child_name + ".")

    def _shared_parameters(self, prefix):
        """(first dotted name, parameter, [(owning module, attribute name), ...])
        of every parameter once (by identity), in registration order."""
        shared = {}
        for name, value, owner, attribute in self._every_parameter_slot(prefix):
            shared.setdefault(id(value), (name, value, []))[2].append((owner, attribute))
        return shared.values()

    def parameters(self):
        """Iterate over the parameters, in the order of `named_parameters`.

        Yields
        ------
        ndarray
            Each parameter itself (not a copy).
        """
        for _, value in self.named_parameters():
            yield value

    def state_dict(self):
        """Copies of the parameters, keyed as torch keys them.

        Returns
        -------
        dict of str to ndarray
            ``{dotted name: copy}`` in the order of `named_parameters`,
            a shared parameter under each of its names, as in torch;
            the keys of the torch twin's ``state_dict()``.
        """
        # a parameter placed past __setattr__ (a list, a torch tensor, an ndarray subclass) as the
        # assignment would convert it, named by its key: its own copy() may be none or a shallow one
        return {name: _C.copy(value if type(value) is np.ndarray else owner._as_parameter(name, value))
                for name, value, owner, _ in self._every_parameter_slot("")}

    def load_state_dict(self, state_dict, strict=True):
        """Copy parameter values from a mapping, all or nothing.

        Every value is converted and checked first; nothing is changed
        unless the whole mapping is valid. Values are copied into the
        parameters in place (views of a parameter see the new values);
        every value is read before any parameter is written, so the
        module's own arrays may be given (a swap of two parameters).

        Parameters
        ----------
        state_dict : mapping of str to array_like
            Values keyed as `state_dict` keys them: anything
            ``np.asarray`` takes (CPU torch tensors included), converted
            to the module dtype.
        strict : bool, default True
            True: the keys must be exactly the module's. False: load the
            keys the module has and ignore the rest.

        Returns
        -------
        missing_keys, unexpected_keys : list of str
            A named tuple: the module's keys absent from `state_dict`,
            and the keys of `state_dict` the module does not have.

        Raises
        ------
        KeyError
            With `strict`, listing every missing and unexpected key.
        ValueError
            Naming the key, for a value of another shape (in both modes).
        TypeError
            Naming the key, for a complex, object or string value; naming
            `state_dict`, for anything but a mapping.

        Examples
        --------
        >>> import numpy as np
        >>> import attnc
        >>> linear = attnc.Linear(2, 1)
        >>> linear.load_state_dict({"weight": [[1.0, 2.0]], "bias": [0.5]})
        IncompatibleKeys(missing_keys=[], unexpected_keys=[])
        >>> linear(np.array([1.0, 1.0]))
        array([3.5], dtype=float32)
        >>> linear.load_state_dict({"weight": [[3.0, 4.0]]}, strict=False)
        IncompatibleKeys(missing_keys=['bias'], unexpected_keys=[])
        """
        if not isinstance(state_dict, collections.abc.Mapping):
            raise TypeError(f"state_dict: expected a mapping of parameter names to arrays, got "
                            f"{type(state_dict).__name__}")
        strict = flag(strict, "strict")
        own = dict(self.named_parameters(remove_duplicate=False))
        missing = [key for key in own if key not in state_dict]
        unexpected = [key for key in state_dict if key not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        converted = {}
        for key, value in state_dict.items():
            if key not in own:
                continue
            owner, name = self._owner_of(key)
            array = _C.as_parameter(value, name=key, dtype=owner.dtype)
            current = own[key]
            if not isinstance(current, np.ndarray):  # placed past assignment (a list, a tensor): as a forward reads it
                current = _C.as_parameter(current, name=key, dtype=owner.dtype)
            if array.shape != current.shape:
                raise ValueError(f"{key}: expected shape {current.shape}, got {array.shape}")
            if any(np.may_share_memory(array, param) for param in own.values()):
                array = _C.copy(array)  # a parameter's own memory (a swap): read before any is overwritten
            converted[key] = owner, name, array
        # copy into each parameter in place (views of it see the new values,
        # as torch's copy_), or replace one that cannot take a copy (read-only,
        # or changed in place since assigned): planned here, then done in one
        # C call, so that a Ctrl-C leaves the module as it was or loaded
        targets, sources, assignments = [], [], []
        replacements = {}  # id(parameter) -> (it, its replacement): a tied parameter stays tied
        for key, (owner, name, array) in converted.items():
            current = own[key]
            flags = current.flags if type(current) is np.ndarray else None  # a placed subclass: replaced
            if flags and flags.writeable and flags.c_contiguous and flags.aligned and current.dtype == owner.dtype \
                    and current.shape == array.shape:  # (reshaped since checked, by an __array__ or a thread: replaced)
                targets.append(current)
                sources.append(array)
                continue
            _, replacement = replacements.get(id(current), (None, None))
            if replacement is not None and replacement.dtype == array.dtype:
                np.copyto(replacement, array)  # the last of its names wins, as copy_ after copy_ in torch
            else:
                replacement = _C.copy(array)  # never the caller's memory
                replacements[id(current)] = current, replacement
            assignments.append((owner, name, replacement))
        _C.commit(targets, sources, assignments)
        return _IncompatibleKeys(missing, unexpected)

    def _submodule(self, path):
        """The module at `path` (a tuple of child names) below this one."""
        owner = self
        for depth, child in enumerate(path):
            try:
                owner = owner._modules[child]
            except KeyError:
                raise AttributeError(f"{'.'.join(path[:depth + 1])}: the module has no such submodule "
                                     "(deleted?); its forward needs it") from None
        return owner

    def _owner_of(self, key):
        """(module, attribute name) of the parameter named `key`."""
        ((path, name),) = _key_paths((key,))
        return self._submodule(path), name

    def _values_of(self, keys):
        """The current values of the parameters named by the tuple of
        dotted `keys`, looked up now (a user may have replaced any).
        Every forward starts here, so the usual case walks `_modules`
        directly (half the time of `_submodule`'s checked walk: 1.0 us
        against 1.9 for a module's eight parameters); a missing
        submodule or parameter takes the checked walk, whose errors name
        it."""
        paths = _key_paths(keys)
        values = []
        try:
            for path, name in paths:
                owner = self
                for child in path:
                    owner = owner._modules[child]
                values.append(getattr(owner, name))
            return tuple(values)
        except (KeyError, AttributeError):
            pass
        try:
            return tuple([getattr(self._submodule(path), name) for path, name in paths])
        except AttributeError as error:  # a deleted parameter: name it by its dotted key
            for key, (path, name) in zip(keys, paths):
                owner = self._submodule(path)
                if path and name not in owner._parameters:
                    raise AttributeError(f"{key}: {'.'.join(path)} is now a {type(owner).__name__}, which has no "
                                         f"parameter {name!r}; the forward needs one there") from error
                if not hasattr(owner, name):
                    raise AttributeError(f"{key}: the parameter was deleted; assign it again before a "
                                         "forward") from error
            raise

    def to(self, dtype):
        """Convert the module and its submodules to another dtype.

        Parameters
        ----------
        dtype : data-type
            float16, bfloat16, float32 or float64, as the constructor's.
            The parameters are converted (rounded to nearest when
            narrower), each replaced by a new array, except one already
            of that dtype, which is kept as it is; and `dtype` updated.

        Returns
        -------
        Module
            The module itself.

        Raises
        ------
        TypeError
            If `dtype` is not one of the four.
        AttributeError, TypeError, ValueError
            If a parameter was deleted or holds a value that does not
            convert (naming it); the module is then left as it was.

        Examples
        --------
        >>> import numpy as np
        >>> import attnc
        >>> attnc.Linear(2, 2).to(np.float64).weight.dtype
        dtype('float64')
        """
        dtype = module_dtype(dtype)
        slots = list(self._every_parameter_slot(""))  # (a deleted parameter raises here, before any change)
        converted = {}  # id(parameter) -> (it, its conversion): a tied parameter stays tied
        for key, value, _, _ in slots:  # all converted first: a failure changes nothing
            if id(value) not in converted:  # an array already of the dtype kept as it is (views follow it)
                kept = type(value) is np.ndarray and value.dtype == dtype
                converted[id(value)] = value, value if kept else _C.as_parameter(value, name=key, dtype=dtype)
        for _, value, owner, name in slots:
            object.__setattr__(owner, name, converted[id(value)][1])
        self._set_dtype(dtype)
        return self

    def _set_dtype(self, dtype):
        object.__setattr__(self, "dtype", dtype)
        for child in tuple(self._modules.values()):
            child._set_dtype(dtype)

    # -- gradients -----------------------------------------------------------
    def named_grads(self, prefix="", remove_duplicate=True):
        """Iterate over ``(dotted name, gradient buffer)``, in the order of `named_parameters`.

        Each buffer has its parameter's shape and dtype: zeros until a
        `backward` adds into it, as torch accumulates ``.grad``. A buffer
        follows its parameter: it starts again from zeros when the
        parameter is replaced by one of another shape or dtype. A buffer
        changed in place instead (its shape, dtype or strides set, or made
        read-only) makes this, `backward` and optimizer steps raise
        ValueError naming its parameter, rather than lose the gradient it
        held; `zero_grad` gives it a new buffer. A shared
        submodule has one buffer per parameter, which gets the gradients
        of every use; an array assigned to parameters of two modules has a
        buffer in each, and comes here once with their sum (a new array).

        Parameters
        ----------
        prefix : str, default ""
            As in `named_parameters`: prepended with a dot.
        remove_duplicate : bool, default True
            As in `named_parameters`: False yields every name.

        Yields
        ------
        name : str
            The parameter's `state_dict` key.
        grad : ndarray
            Its gradient buffer itself (writable; optimizers read it), or
            the sum of a tied array's buffers.
        """
        prefix = _dotted(prefix)
        if not flag(remove_duplicate, "remove_duplicate"):
            for name, value, owner, attribute in self._every_parameter_slot(prefix):
                yield name, owner._grad(attribute, name, value)
            return
        for name, value, slots in self._shared_parameters(prefix):
            made = (owner._grad(attribute, name, value) for owner, attribute in slots)
            buffers = list({id(buffer): buffer for buffer in made}.values())
            yield name, buffers[0] if len(buffers) == 1 else np.asarray(sum(buffers[1:], buffers[0]))  # 0-d: an array

    def zero_grad(self):
        """Fill every gradient buffer (see `named_grads`) with zeros.

        A buffer changed in place (reshaped, restrided, retyped, made read-only) is
        replaced by a new one instead."""
        for name, value, owner, attribute in self._every_parameter_slot(""):
            _fill_with_zeros(owner._grad(attribute, name, value, renew=True))

    def _grad(self, name, key, param, renew=False):
        """The gradient buffer of parameter `name` (dotted `key`), whose
        value the caller read once (`param`: another thread may set the
        attribute meanwhile; reading it again had raised AttributeError on
        None), made on first use and again after the parameter changed
        shape or dtype. ValueError naming `key` if the buffer itself was
        changed in place (unless `renew`: a new one then)."""
        if type(param) is not np.ndarray:  # placed past __setattr__ (a subclass too), or set to None by a thread
            raise TypeError(f"{key}: the parameter is {type(param).__name__}, not an ndarray: assign it again "
                            "(assignment converts it)")
        layout = param.shape, param.dtype
        grads = self._grads
        with _GRADS_LOCK:
            entry = grads.get(name)
            grad, made_for = entry or (None, None)  # made_for: the parameter's layout then
            if grad is not None and made_for == layout:
                if grad.shape == param.shape and grad.dtype == param.dtype and grad.flags.c_contiguous \
                        and grad.flags.writeable:
                    return grad
                if not renew:
                    state = ("" if grad.flags.c_contiguous else ", strided") + \
                        ("" if grad.flags.writeable else ", read-only")
                    raise ValueError(f"{key}: its gradient buffer was changed in place (now shape {grad.shape}, dtype "
                                     f"{grad.dtype}{state}; the parameter is {param.shape}, {param.dtype}): "
                                     "zero_grad() gives it a new one")
            grad = np.zeros(param.shape, param.dtype)
            # A signal handler this thread ran since the lookup may have made the buffer and added to it:
            # that one stands. (No call between this test and the store, so no handler runs in between.)
            if (grads[name] if name in grads else None) is not entry:
                return self._grad(name, key, param, renew)
            grads[name] = grad, layout
            return grad

    def _additions_of_grads(self, grads):
        """(buffers, sources, adds), what _C.commit writes, for {dotted
        parameter name: gradient} (None: skipped): each float32 or float64
        gradient added into its buffer in place (adds[i] True; a shared
        parameter's gradients one after another into its one buffer), and
        a buffer with gradients commit cannot add (float16, bfloat16, of
        another dtype: _adds_in_place) given its sum, made here (adds[i]
        False). Every buffer made and checked first, and those sums made
        (nothing written), so that a failure (MemoryError,
        KeyboardInterrupt, a NumPy floating-point error raised, a parameter
        whose dtype or shape was changed in place since the forward) adds
        nothing. Added in place, a sum is not written into the gradient's
        memory first and then copied: a MultiHeadAttention (4, 128, 768)'s
        2.4 M float32 gradients took 2.5 ms a backward that way, 1.5 ms
        added (benchmarks/NOTES.md)."""
        gradients = {}  # id(buffer) -> (buffer, its gradients in order): a tied parameter's add into one
        for key, value in grads.items():
            if value is None:
                continue
            owner, name = self._owner_of(key)
            buffer = owner._grad(name, key, getattr(owner, name))
            if buffer.shape != value.shape or not np.can_cast(value.dtype, buffer.dtype, "same_kind"):
                raise ValueError(f"{key}: the parameter is now {buffer.dtype} of shape {buffer.shape}, its gradient "
                                 f"{value.dtype} of shape {value.shape} (changed in place since the forward?)")
            if not buffer.flags.writeable:
                raise ValueError(f"{key}: its gradient buffer is read-only")
            gradients.setdefault(id(buffer), (buffer, []))[1].append(value)
        buffers, sources, adds = [], [], []
        for buffer, values in gradients.values():
            if all(_adds_in_place(buffer, value) for value in values):
                buffers += [buffer] * len(values)
                sources += values
                adds += [True] * len(values)
                continue
            total = buffer
            for value in values:
                total = _sum_into(total, value, buffer.dtype)
            buffers.append(buffer)
            sources.append(total)
            adds.append(False)
        return buffers, sources, adds

    def _keep_for_backward(self, state, output_shape, x, params=None):
        """What this training-mode forward's backward needs (replacing any
        earlier forward's), with the shape its grad_output must have, the
        dtype of the gradient it returns (_grad_dtype: x's when x is a floating
        array of 16 bits or more, as torch's x.grad, else the module's), and the parameters the forward
        used ({dotted name: array or None}) with their shapes and dtypes, and
        the module dtype. A parameter that is not an ndarray (a list put in
        the instance dict, which a forward converts) has no gradient buffer
        to follow it: TypeError naming it (this forward keeps nothing)."""
        for key, a in (params or {}).items():
            if a is not None and type(a) is not np.ndarray:
                raise TypeError(f"{key}: a training-mode forward needs the parameter as an ndarray (its gradient "
                                f"buffer takes its shape and dtype), got a {type(a).__name__}; assign it again "
                                "(assignment converts it)")
        used = {key: (a, None if a is None else (a.shape, a.dtype)) for key, a in (params or {}).items()}
        object.__setattr__(self, "_saved", (state, tuple(output_shape), _grad_dtype(x, self.dtype), used,
                                            self.dtype))

    def _kept(self, grad_output):
        """The kept forward state, with grad_output checked against the
        forward's output shape. A backward releases it (_finish_backward) only
        once it has succeeded, so one that failed (a bad grad_output,
        MemoryError, KeyboardInterrupt) can be called again."""
        saved = self._saved  # read once: another thread may release it
        if saved is None:
            raise RuntimeError(f"{type(self).__name__}.backward: no training-mode forward to go back through "
                               "(each forward allows one backward; an eval-mode forward keeps nothing)")
        state, shape, _, used, dtype = saved
        if self.dtype != dtype:
            raise ValueError(f"dtype: the module's dtype changed after the forward, from {dtype} to {self.dtype}; "
                             "run the forward again before backward")
        if np.shape(grad_output) != shape:
            raise ValueError(f"grad_output: expected shape {shape} (the forward's output), "
                             f"got {np.shape(grad_output)}")
        for key, (array, layout) in used.items():
            owner, name = self._owner_of(key)
            if not hasattr(owner, name):
                raise RuntimeError(f"{key}: the parameter was deleted after the forward; assign it again and "
                                   "run the forward again before backward")
            if getattr(owner, name) is not array:
                raise RuntimeError(f"{key} was replaced after the forward; its gradient would not match. "
                                   "Run the forward again before backward")
            if array is not None and (array.shape, array.dtype) != layout:
                raise ValueError(f"{key}: changed in place after the forward, from {layout[1]} of shape "
                                 f"{layout[0]} to {array.dtype} of shape {array.shape}; run the forward again "
                                 "before backward")
        return state

    def _finish_backward(self, state, grads, grad_x):
        """Adds `grads` into their buffers and releases the forward's kept
        `state` (one backward per forward), both or neither: under a lock, so
        that of two threads' backwards of one forward only one adds its
        gradients; checked first (_additions_of_grads), then added and the
        state released in one C call (_C.commit: no signal handler,
        so no KeyboardInterrupt, in between), so that a failure leaves the
        state for a retry. Returns grad_x in the dtype of the forward's
        input."""
        if _inside_finish_backward(sys._getframe(1)):
            raise RuntimeError(f"{type(self).__name__}.backward: called by a signal handler (or a finalizer) "
                               "while its thread was adding another backward's gradients (whose lock it would "
                               "have waited for forever); nothing was added: call it again after that")
        with _FINISH_LOCK:
            saved = self._saved
            if saved is None or saved[0] is not state:
                raise RuntimeError(f"{type(self).__name__}.backward: another backward used this forward's state "
                                   "meanwhile, or another forward replaced it (a training-mode module runs one "
                                   "forward and backward at a time; share it between threads in eval mode)")
            buffers, sources, adds = self._additions_of_grads(grads)
            _C.commit(buffers, sources, [(self, "_saved", None)], adds)
        return converted(grad_x, saved[2])

    # -- randomness ----------------------------------------------------------
    def _generator(self):
        return generator(self.rng)

    # -- printing ------------------------------------------------------------
    def extra_repr(self):
        """The module's own settings, shown inside its ``repr``, as torch's.

        Returns
        -------
        str
            Empty on the base class; e.g. ``"in_features=4,
            out_features=4, bias=True"`` for a `Linear`.
        """
        return ""

    def __repr__(self):
        extra_lines = self.extra_repr().split("\n") if self.extra_repr() else []
        child_lines = [f"({name}): " + _indent(repr(child), 2) for name, child in tuple(self._modules.items())]
        lines = extra_lines + child_lines
        text = type(self).__name__ + "("
        if len(extra_lines) == 1 and not child_lines:
            text += extra_lines[0]
        elif lines:
            text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"


class Linear(Module):
    """Affine layer ``y = x @ weight.T + bias``, as ``torch.nn.Linear``.

    Parameters
    ----------
    in_features : int
        Size of each input's last dimension, >= 0.
    out_features : int
        Size of each output's last dimension, >= 0.
    bias : bool, default True
        Whether the layer has a bias (False: the `bias` attribute is None).
    dtype : data-type, default numpy.float32
        The module dtype: float16, bfloat16, float32 or float64 (see
        `Module`).
    rng : numpy.random.Generator, optional
        Draws the initial weights; None: the package's global generator.

    Attributes
    ----------
    weight : ndarray, shape (out_features, in_features)
        Initially uniform in ``[-1/sqrt(in_features), 1/sqrt(in_features)]``,
        as torch.
    bias : ndarray, shape (out_features,), or None
        Initially uniform in the same range.

    Raises
    ------
    ValueError
        If `in_features` or `out_features` is negative.
    TypeError
        If `in_features` or `out_features` is not an integer, or `dtype`
        or `rng` is invalid (see `Module`).

    See Also
    --------
    attnc.functional.linear : The same map on given arrays.

    Notes
    -----
    The module computes in its own dtype: a float64 input to a float32
    layer gives a float32 result.

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> layer = attnc.Linear(3, 2, rng=np.random.default_rng(0))
    >>> layer
    Linear(in_features=3, out_features=2, bias=True)
    >>> x = np.ones((4, 5, 3))
    >>> y = layer(x)
    >>> y.shape, y.dtype
    ((4, 5, 2), dtype('float32'))
    >>> np.allclose(y, x @ layer.weight.T + layer.bias)
    True
    """

    def __init__(self, in_features, out_features, bias=True, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.in_features = positive_int(in_features, "in_features", allow_zero=True)
        self.out_features = positive_int(out_features, "out_features", allow_zero=True)
        bias = flag(bias, "bias")
        draw = self._generator()

        def uniform(shape):  # the bound inside: an in_features past any float fails as a shape does
            bound = 1 / math.sqrt(self.in_features) if self.in_features else 0.0
            return draw.uniform(-bound, bound, shape)

        self.register_parameter("weight", _initial_values(uniform, (self.out_features, self.in_features),
                                                          "out_features, in_features", self.dtype))
        self.register_parameter("bias", _initial_values(uniform, (self.out_features,), "out_features", self.dtype)
                                if bias else None)

    def forward(self, x):
        """Compute ``x @ weight.T + bias`` over the leading dims of `x`.

        In training mode the forward also keeps, for `backward`, a private
        copy of `x` in the module dtype (a later in-place edit of the
        caller's `x` changes no gradient) and the parameters it used; an
        eval-mode forward keeps nothing.

        Parameters
        ----------
        x : array_like, shape (..., in_features)
            At least 1-D; bool, integer or floating, converted to the
            module dtype.

        Returns
        -------
        ndarray, shape (..., out_features)
            A new array in the module dtype (float32 for a float64 `x`
            given to a float32 layer).

        Raises
        ------
        ValueError
            If `x` is 0-d or its last dimension is not `in_features`.
        TypeError
            If `x` is complex, object or string.
        """
        weight, bias = self.weight, self.bias
        if weight is None:  # (only the bias may be absent)
            raise TypeError("weight: expected an array of shape (out_features, in_features), got None")
        if not self.training:
            return _C.linear(x, weight, bias, dtype=self.dtype)
        values = as_array(x, "x")  # read once, for the forward and its backward alike
        out = _C.linear(values, weight, bias, dtype=self.dtype)  # (which also names a bad x)
        with np.errstate(over="ignore"):  # an overflow was warned of by the product's conversion: once
            x_copy = np.array(values, dtype=self.dtype, order="C")
        self._keep_for_backward((x_copy, weight, bias), out.shape, x, {"weight": weight, "bias": bias})
        return out

    def backward(self, grad_output):
        """The gradient with respect to the input of the most recent training-mode forward.

        Also adds ``grad_output^T @ x`` (summed over the leading dims)
        into the weight's gradient buffer and `grad_output` summed over
        the leading dims into the bias's (see `named_grads`), as torch
        accumulates ``.grad``. One backward per forward.

        Parameters
        ----------
        grad_output : array_like, shape (..., out_features)
            The gradient with respect to that forward's output (its
            shape); converted to the module dtype.

        Returns
        -------
        ndarray, shape (..., in_features)
            The gradient with respect to the forward's `x`: `x`'s shape,
            and `x`'s dtype when `x` was a floating array of 16 bits or
            more (as torch's ``x.grad``), else the module's.

        Raises
        ------
        RuntimeError
            Without a training-mode forward, for a second backward of one
            forward, or when a parameter was replaced since the forward
            (naming it).
        ValueError
            If `grad_output` does not have the forward output's shape (the
            forward's state stays: a corrected call works).

        Examples
        --------
        >>> import numpy as np
        >>> import attnc
        >>> layer = attnc.Linear(2, 1)
        >>> _ = layer.load_state_dict({"weight": [[1.0, 3.0]], "bias": [0.0]})
        >>> y = layer(np.array([[1.0, 2.0], [3.0, 4.0]]))
        >>> layer.backward(np.ones_like(y))
        array([[1., 3.],
               [1., 3.]])
        >>> dict(layer.named_grads())
        {'weight': array([[4., 6.]], dtype=float32), 'bias': array([2.], dtype=float32)}
        """
        grad_output = _C.as_parameter(grad_output, name="grad_output", dtype=self.dtype)
        state = self._kept(grad_output)
        x, weight, bias = state
        grad_x, grad_weight, grad_bias = linear_backward(grad_output, x, weight, need_bias_grad=bias is not None)
        return self._finish_backward(state, {"weight": grad_weight, "bias": grad_bias}, grad_x)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Dropout(Module):
    """Dropout, as ``torch.nn.Dropout``: zero elements at random in training mode.

    In training mode each element is zeroed with probability `p` and the
    rest are scaled by ``1/(1 - p)`` (``p=1`` gives zeros, no NaN); in
    evaluation mode the output is a copy of the input.

    Parameters
    ----------
    p : float, default 0.5
        The probability of zeroing an element, in ``[0, 1]``.
    dtype : data-type, default numpy.float32
        The module dtype: float16, bfloat16, float32 or float64 (see
        `Module`).
    rng : numpy.random.Generator, optional
        Draws each training-mode forward's mask; None: the package's
        global generator, at each forward.

    Attributes
    ----------
    p : float
        The probability given.

    Raises
    ------
    ValueError
        If `p` is outside ``[0, 1]`` or NaN.
    TypeError
        If `p` is not a number, or `dtype` or `rng` is invalid (see
        `Module`).

    Notes
    -----
    Every training-mode call draws a new mask. The mask comes from a
    counter-based generator keyed by a seed drawn from `rng`: the same
    seed gives the same mask for any number of threads. The module
    computes in its own dtype (float32 for a float64 input to a float32
    module).

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> dropout = attnc.Dropout(0.5, rng=np.random.default_rng(0))
    >>> y = dropout(np.ones((2, 4)))
    >>> bool(np.all((y == 0) | (y == 2)))
    True
    >>> dropout.eval()(np.ones(3))
    array([1., 1., 1.], dtype=float32)
    """

    def __init__(self, p=0.5, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.p = _C.probability(p, name="p")

    def forward(self, x):
        """Zero elements of `x` with probability `p` (training mode), or copy it.

        In training mode with ``p > 0`` the mask's seed is drawn from the
        module's `rng` (None: the package's global generator) and kept,
        with `p` and the shape, for `backward`: the mask is recomputed
        from the seed, never stored. An eval-mode forward keeps nothing.

        Parameters
        ----------
        x : array_like
            Any shape (0-d and empty included); bool, integer or floating,
            converted to the module dtype.

        Returns
        -------
        ndarray
            A new array of `x`'s shape in the module dtype.

        Raises
        ------
        TypeError
            If `x` is complex, object or string.
        """
        if not self.training:
            return _C.dropout(x, self.p, training=False, rng=self.rng, dtype=self.dtype)
        p = _C.probability(self.p, name="p")
        seed = draw_seed(_C.check_rng(self.rng)) if p > 0 else None
        out = _C.dropout(x, p, dtype=self.dtype, seed=seed)
        self._keep_for_backward((seed, p), out.shape, x)
        return out

    def backward(self, grad_output):
        """The gradient with respect to the input of the most recent training-mode forward.

        `grad_output` times that forward's mask and ``1/(1 - p)``, a new
        array (a copy when `p` was 0). One backward per forward.

        Parameters
        ----------
        grad_output : array_like
            The gradient with respect to the forward's output (its shape);
            converted to the module dtype.

        Returns
        -------
        ndarray
            The forward input's shape; its dtype when it was a floating
            array of 16 bits or more, else the module's.

        Raises
        ------
        RuntimeError
            Without a training-mode forward, or for a second backward of
            one forward.
        ValueError
            If `grad_output` does not have the forward output's shape.
        """
        grad_output = _C.as_parameter(grad_output, name="grad_output", dtype=self.dtype)
        state = self._kept(grad_output)
        seed, p = state
        return self._finish_backward(state, {}, _C.dropout(grad_output, p, dtype=self.dtype, seed=seed))

    def extra_repr(self):
        return f"p={self.p}, inplace=False"
