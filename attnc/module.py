"""Module, Linear and Dropout: torch.nn's bookkeeping for NumPy arrays."""
import collections
import math

import numpy as np

from . import _C
from ._checks import as_real, module_dtype, positive_int, probability
from ._random import check_rng, draw_seed, generator

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _indent(text, spaces):
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


class Module:
    """Parameters are ndarray attributes registered with register_parameter;
    submodules are registered by assignment, in order, as in torch."""

    def __init__(self, *, dtype=np.float32, rng=None):
        object.__setattr__(self, "_parameters", [])
        object.__setattr__(self, "_modules", {})
        self.dtype = module_dtype(dtype)
        self.rng = check_rng(rng)
        self.training = True

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        elif name in self._parameters and value is not None:
            value = np.ascontiguousarray(as_real(value, name), dtype=self.dtype)
        object.__setattr__(self, name, value)

    def register_parameter(self, name, value):
        self._parameters.append(name)
        setattr(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

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
        own = dict(self.named_parameters())
        missing = [key for key in own if key not in state_dict]
        unexpected = [key for key in state_dict if key not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        converted = {}
        for key, value in state_dict.items():
            if key not in own:
                continue
            if hasattr(value, "detach"):  # a torch tensor that requires grad
                value = value.detach()
            array = as_real(value, key)
            if array.shape != own[key].shape:
                raise ValueError(f"{key}: expected shape {own[key].shape}, got {array.shape}")
            converted[key] = array
        for key, array in converted.items():
            np.copyto(own[key], array, casting="unsafe")
        return IncompatibleKeys(missing, unexpected)

    def to(self, dtype):
        dtype = module_dtype(dtype)
        object.__setattr__(self, "dtype", dtype)
        for name in self._parameters:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, np.ascontiguousarray(value, dtype=dtype))
        for child in self._modules.values():
            child.to(dtype)
        return self

    # -- randomness ----------------------------------------------------------
    def _generator(self):
        return generator(self.rng)

    def _dropout_seed(self, p):
        return draw_seed(self.rng) if self.training and p > 0 else 0

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
        return _C.linear(x, self.weight, self.bias, self.dtype)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Dropout(Module):
    """Zeroes each element with probability p in training mode and scales the
    rest by 1/(1-p); a fresh copy in eval mode."""

    def __init__(self, p=0.5, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.p = probability(p, "p")

    def forward(self, x):
        p = self.p if self.training else 0.0
        return _C.dropout(x, p, self._dropout_seed(p), self.dtype)

    def extra_repr(self):
        return f"p={self.p}, inplace=False"
