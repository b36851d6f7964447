"""Module, Linear and Dropout: torch.nn's bookkeeping for NumPy arrays."""
import collections
import math

import numpy as np

from . import _C
from ._checks import module_dtype, positive_int
from ._random import draw_seed, generator
from .functional import linear_backward

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _detached(value):
    """A torch tensor that requires grad as one that does not (np.asarray refuses it)."""
    return value.detach() if hasattr(value, "detach") else value


def _grad_dtype(x, module_dtype):
    """The dtype of the gradient with respect to input x: x's when it is a
    floating array (as torch's x.grad), else the module's."""
    dtype = getattr(x, "dtype", None)
    return dtype if isinstance(dtype, np.dtype) and dtype.kind == "f" else module_dtype


def _indent(text, spaces):
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


class Module:
    """Parameters are ndarray attributes registered with register_parameter;
    submodules are registered by assignment, in order, as in torch."""

    def __init__(self, *, dtype=np.float32, rng=None):
        object.__setattr__(self, "_parameters", [])
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_grads", {})
        object.__setattr__(self, "_saved", None)
        self.dtype = module_dtype(dtype)
        self.rng = _C.check_rng(rng)
        self.training = True

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        elif name in self._parameters and value is not None:
            # any layout in, an aligned, writable, C-contiguous array of the
            # module's dtype out (the value itself when it already is one)
            value = _C.as_parameter(_detached(value), name=name, dtype=self.dtype)
        object.__setattr__(self, name, value)

    def __getstate__(self):
        """What a training-mode forward kept for backward is not pickled
        (nor copied by copy.deepcopy): it belongs to that forward."""
        state = dict(self.__dict__)
        state["_saved"] = None
        return state

    def __setstate__(self, state):
        """Unpickling sets attributes without __setattr__: convert the
        parameters here (out-of-band buffers may be read-only or unaligned)."""
        self.__dict__.update(state)
        for name in self._parameters:
            if self.__dict__[name] is not None:
                self.__dict__[name] = _C.as_parameter(self.__dict__[name], name=name, dtype=self.dtype)

    def register_parameter(self, name, value):
        self._parameters.append(name)
        setattr(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def backward(self, grad_output):
        """The gradient with respect to the input of the most recent
        training-mode forward; parameter gradients are added into the
        buffers named_grads() yields. Each forward allows one backward."""
        raise NotImplementedError(f"{type(self).__name__} has no backward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- modes ---------------------------------------------------------------
    def train(self, mode=True):
        self.training = bool(mode)
        for child in self._modules.values():
            child.train(mode)
        return self

    def eval(self):
        return self.train(False)

    # -- parameters ----------------------------------------------------------
    def named_parameters(self, prefix=""):
        for name in self._parameters:
            value = getattr(self, name)
            if value is not None:
                yield prefix + name, value
        for child_name, child in self._modules.items():
            yield from child.named_parameters(prefix + child_name + ".")

    def parameters(self):
        for _, value in self.named_parameters():
            yield value

    def state_dict(self):
        return {name: value.copy() for name, value in self.named_parameters()}

    def load_state_dict(self, state_dict, strict=True):
        """Copies state_dict's values into the parameters of the same keys;
        all or nothing: every value is converted and checked first."""
        own = dict(self.named_parameters())
        missing = [key for key in own if key not in state_dict]
        unexpected = [key for key in state_dict if key not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        converted = {}
        for key, value in state_dict.items():
            if key not in own:
                continue
            owner, name = self._owner_of(key)
            array = _C.as_parameter(_detached(value), name=key, dtype=owner.dtype)
            if array.shape != own[key].shape:
                raise ValueError(f"{key}: expected shape {own[key].shape}, got {array.shape}")
            converted[key] = owner, name, array
        # nothing below can fail: copy into each parameter in place (views
        # of it see the new values, as torch's copy_), or replace one that
        # cannot take a copy (read-only, or changed in place since assigned)
        for key, (owner, name, array) in converted.items():
            current = own[key]
            flags = current.flags
            if flags.writeable and flags.c_contiguous and flags.aligned and current.dtype == owner.dtype:
                np.copyto(current, array)
            else:
                object.__setattr__(owner, name, array.copy())  # never the caller's memory
        return IncompatibleKeys(missing, unexpected)

    def _owner_of(self, key):
        """(module, attribute name) of the parameter named `key`."""
        owner = self
        *path, name = key.split(".")
        for child in path:
            owner = owner._modules[child]
        return owner, name

    def to(self, dtype):
        dtype = module_dtype(dtype)
        object.__setattr__(self, "dtype", dtype)
        for name in self._parameters:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _C.as_parameter(value, name=name, dtype=dtype))
        for child in self._modules.values():
            child.to(dtype)
        return self

    # -- gradients -----------------------------------------------------------
    def named_grads(self, prefix=""):
        """(name, gradient buffer) for every parameter, in the order of
        named_parameters(): zeros until a backward adds into them. A buffer
        follows its parameter: it starts again from zeros when the
        parameter is replaced by one of another shape or dtype."""
        for name in self._parameters:
            if getattr(self, name) is not None:
                yield prefix + name, self._grad(name)
        for child_name, child in self._modules.items():
            yield from child.named_grads(prefix + child_name + ".")

    def zero_grad(self):
        for _, grad in self.named_grads():
            grad.fill(0)

    def _grad(self, name):
        """The gradient buffer of parameter `name`, made on first use."""
        param = getattr(self, name)
        grad = self._grads.get(name)
        if grad is None or grad.shape != param.shape or grad.dtype != param.dtype:
            grad = self._grads[name] = np.zeros(param.shape, param.dtype)
        return grad

    def _add_grads(self, grads):
        """Adds {dotted parameter name: gradient} into the buffers (None: skipped)."""
        for key, value in grads.items():
            if value is not None:
                owner, name = self._owner_of(key)
                owner._grad(name)[...] += value

    def _keep_for_backward(self, state, output_shape, x):
        """What this training-mode forward's backward needs (replacing any
        earlier forward's), with the shape its grad_output must have and
        the dtype of the gradient it returns: x's when x is a floating
        array (as torch's x.grad), else the module's."""
        object.__setattr__(self, "_saved", (state, tuple(output_shape), _grad_dtype(x, self.dtype)))

    def _kept(self, grad_output):
        """The kept forward state, with grad_output checked against the
        forward's output shape. A backward releases it (_release_kept) only
        once it has succeeded, so one that failed (a bad grad_output,
        MemoryError, KeyboardInterrupt) can be called again."""
        if self._saved is None:
            raise RuntimeError(f"{type(self).__name__}.backward: no training-mode forward to go back through "
                               "(each forward allows one backward; an eval-mode forward keeps nothing)")
        state, shape, _ = self._saved
        if np.shape(grad_output) != shape:
            raise ValueError(f"grad_output: expected shape {shape} (the forward's output), "
                             f"got {np.shape(grad_output)}")
        return state

    def _release_kept(self, grad_x):
        """One backward per forward: the kept state goes once it is used;
        grad_x in the dtype of the forward's input."""
        grad_dtype = self._saved[2]
        object.__setattr__(self, "_saved", None)
        return grad_x.astype(grad_dtype, copy=False)

    def _check_unchanged(self, params):
        """{dotted name: the array the forward used}: RuntimeError naming a
        parameter replaced since that forward."""
        for key, used in params.items():
            owner, name = self._owner_of(key)
            if getattr(owner, name) is not used:
                raise RuntimeError(f"{key} was replaced after the forward; its gradient would not match. "
                                   "Run the forward again before backward")

    # -- randomness ----------------------------------------------------------
    def _generator(self):
        return generator(self.rng)

    # -- printing ------------------------------------------------------------
    def extra_repr(self):
        return ""

    def __repr__(self):
        extra_lines = self.extra_repr().split("\n") if self.extra_repr() else []
        child_lines = [f"({name}): " + _indent(repr(child), 2) for name, child in self._modules.items()]
        lines = extra_lines + child_lines
        text = type(self).__name__ + "("
        if len(extra_lines) == 1 and not child_lines:
            text += extra_lines[0]
        elif lines:
            text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"


class Linear(Module):
    """y = x @ weight.T + bias; weight (out, in) and bias (out,) start uniform
    in [-1/sqrt(in), 1/sqrt(in)], as torch.nn.Linear."""

    def __init__(self, in_features, out_features, bias=True, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.in_features = positive_int(in_features, "in_features", allow_zero=True)
        self.out_features = positive_int(out_features, "out_features", allow_zero=True)
        bound = 1 / math.sqrt(self.in_features) if self.in_features else 0.0
        draw = self._generator()
        self.register_parameter("weight", draw.uniform(-bound, bound, (self.out_features, self.in_features)))
        self.register_parameter("bias", draw.uniform(-bound, bound, self.out_features) if bias else None)

    def forward(self, x):
        """x @ weight.T + bias in the module dtype. In training mode it also
        keeps, for backward, a private copy of x in the module dtype (a later
        in-place edit of the caller's x changes no gradient) and the
        parameters it used; an eval-mode forward keeps nothing."""
        out = _C.linear(x, self.weight, self.bias, dtype=self.dtype)
        if self.training:
            x_copy = np.array(x, dtype=self.dtype, order="C")
            self._keep_for_backward((x_copy, self.weight, self.bias), out.shape, x)
        return out

    def backward(self, grad_output):
        """The gradient with respect to the input x of the most recent
        training-mode forward (x's shape; x's dtype when x is a floating
        array, else the module's), given grad_output, the gradient with
        respect to that forward's output (its shape; converted to the
        module dtype). Adds grad_output^T x
        (summed over the leading dims) into weight's gradient buffer and
        grad_output summed over the leading dims into bias's (see
        named_grads), as torch accumulates .grad. One backward per
        forward: RuntimeError without a training-mode forward, for a second
        backward, or when a parameter was replaced since the forward;
        ValueError for a grad_output of another shape."""
        grad_output = _C.as_parameter(grad_output, name="grad_output", dtype=self.dtype)
        x, weight, bias = self._kept(grad_output)
        self._check_unchanged({"weight": weight, "bias": bias})
        grad_x, grad_weight, grad_bias = linear_backward(grad_output, x, weight, need_bias_grad=bias is not None)
        self._add_grads({"weight": grad_weight, "bias": grad_bias})
        return self._release_kept(grad_x)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Dropout(Module):
    """Zeroes each element with probability p in training mode and scales the
    rest by 1/(1-p); a fresh copy in eval mode."""

    def __init__(self, p=0.5, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.p = _C.probability(p, name="p")

    def forward(self, x):
        """In training mode with p > 0, draws the mask's seed from the
        module's rng (None: the package's global generator) and keeps it,
        with p and the shape, for backward: the mask is recomputed from
        the seed, never stored. An eval-mode forward keeps nothing."""
        if not self.training:
            return _C.dropout(x, self.p, training=False, rng=self.rng, dtype=self.dtype)
        p = _C.probability(self.p, name="p")
        seed = draw_seed(_C.check_rng(self.rng)) if p > 0 else None
        out = _C.dropout(x, p, dtype=self.dtype, seed=seed)
        self._keep_for_backward((seed, p), out.shape, x)
        return out

    def backward(self, grad_output):
        """The gradient with respect to the input of the most recent
        training-mode forward (x's floating dtype, else the module's):
        grad_output (converted to the module dtype) times that forward's mask and 1/(1-p), a fresh array (a copy when
        p was 0). One backward per forward: RuntimeError without a
        training-mode forward or for a second backward; ValueError for a
        grad_output of another shape than the forward's output."""
        grad_output = _C.as_parameter(grad_output, name="grad_output", dtype=self.dtype)
        seed, p = self._kept(grad_output)
        return self._release_kept(_C.dropout(grad_output, p, dtype=self.dtype, seed=seed))

    def extra_repr(self):
        return f"p={self.p}, inplace=False"
