"""Optimizers for attnc modules: torch.optim.SGD and torch.optim.AdamW on
NumPy parameters.

An optimizer holds a Module, not a list of arrays: each step() walks
module.named_parameters() and module.named_grads() together and updates
every parameter in place from its gradient buffer, so references to the
parameters (and views of them) stay valid and see the new values. The
gradient buffers are only read; zero_grad() clears them.

The optimizer state (momentum buffers, Adam moments, step counts) is kept
per dotted parameter name in `state`, its arrays in the parameter's dtype.
A parameter replaced by one of the same shape and dtype (an assignment, a
load_state_dict) keeps its state, as torch's copy_-based loading does; one
replaced by a parameter of another shape or dtype (an assignment,
module.to) makes step() raise ValueError naming it, before any parameter
is updated: its state cannot follow it, and resetting it silently would
change the optimisation behind the caller's back. Make a new optimizer
then.

Each update rule is torch's single-tensor (foreach=False) implementation,
operation by operation, with the hyperparameters rounded to the
parameter's dtype where torch rounds them; what can differ from torch is
the rounding of a multiply-add that torch's vector kernels fuse (a few
units in the last place per step)."""
import math
import numbers

import numpy as np

from .module import Module

__all__ = ["Optimizer", "SGD", "AdamW"]


def _number(value, name):
    """value as a float; TypeError for anything but a real number (a bool or
    a string is not one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    return float(value)


def _nonnegative(value, name):
    """value as a finite float >= 0, else ValueError naming the argument."""
    number = _number(value, name)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return number


def _betas(betas):
    """(beta1, beta2) as floats in [0, 1), from a tuple or list of two."""
    if not isinstance(betas, (tuple, list)):
        raise TypeError(f"betas: expected a pair (beta1, beta2), got {type(betas).__name__} {betas!r}")
    if len(betas) != 2:
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {len(betas)} values {betas!r}")
    pair = tuple(_number(beta, "betas") for beta in betas)
    if not all(0 <= beta < 1 for beta in pair):
        raise ValueError(f"betas: expected beta1 and beta2 in [0, 1), got {betas!r}")
    return pair


class Optimizer:
    """The walk SGD and AdamW share: over the module's (name, parameter,
    gradient) triples, with the per-name state and its shape/dtype check;
    a subclass gives the update rule, _update."""

    def __init__(self, module):
        if not isinstance(module, Module):
            raise TypeError(f"module: expected an attnc.Module, got {type(module).__name__}")
        self.module = module
        self.state = {}      # dotted parameter name -> {state name: value}
        self._layouts = {}   # dotted parameter name -> (shape, dtype) at its first step

    def zero_grad(self):
        """Sets every gradient buffer of the module to zero (module.zero_grad())."""
        self.module.zero_grad()

    def step(self):
        """Updates every parameter in place from its gradient buffer.

        ValueError, naming the parameter, with no parameter updated, if a
        parameter was replaced since the previous step by one of another
        shape or dtype."""
        triples = [(name, param, grad) for (name, param), (_, grad)
                   in zip(self.module.named_parameters(), self.module.named_grads())]
        for name, param, _ in triples:
            layout = param.shape, param.dtype
            before = self._layouts.setdefault(name, layout)
            if layout != before:
                raise ValueError(f"{name}: replaced since the previous step by a parameter of shape "
                                 f"{param.shape} and dtype {param.dtype} (was {before[0]}, {before[1]}); "
                                 "its optimizer state cannot follow it: make a new optimizer")
        for name, param, grad in triples:
            self._update(param, grad, self.state.setdefault(name, {}))

    def _update(self, param, grad, state):
        """Updates `param` in place from `grad` (read only) and its `state` dict."""
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent, torch.optim.SGD (dampening 0, no Nesterov).

    For each parameter p with gradient g, at step t:

        d = g + weight_decay * p                        (when weight_decay != 0)
        b = d                      at the first step    (when momentum != 0)
        b = momentum * b + d       afterwards; then d = b
        p = p - lr * d

    Arguments: module, an attnc.Module; lr, momentum and weight_decay, finite
    real numbers >= 0 (TypeError for a non-number, bools and strings
    included; ValueError otherwise, each naming its argument). The momentum
    buffer b of each parameter is state[name]["momentum_buffer"]."""

    def __init__(self, module, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(module)
        self.lr = _nonnegative(lr, "lr")
        self.momentum = _nonnegative(momentum, "momentum")
        self.weight_decay = _nonnegative(weight_decay, "weight_decay")

    def _update(self, param, grad, state):
        d = grad if self.weight_decay == 0 else grad + self.weight_decay * param
        if self.momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = d.copy()
            else:
                buf *= self.momentum
                buf += d
            d = buf
        param -= self.lr * d


class AdamW(Optimizer):
    """Adam with decoupled weight decay, torch.optim.AdamW (amsgrad False).

    For each parameter p with gradient g, at its step t = 1, 2, ...:

        p = p * (1 - lr * weight_decay)
        m = lerp(m, g, 1 - beta1)                 m + (1-beta1) (g - m), as torch.lerp
        v = beta2 * v + (1 - beta2) * g * g
        p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    with m and v starting at zero. torch.lerp computes g - (g - m) * beta1
    instead when 1 - beta1 >= 0.5; so does this.

    Arguments: module, an attnc.Module; lr, eps and weight_decay, finite
    real numbers >= 0; betas, a tuple or list (beta1, beta2) of real numbers
    in [0, 1) (TypeError for a non-number, bools and strings included, or
    betas not a tuple or list; ValueError otherwise, each naming its
    argument). state[name] holds "step" (an int), "exp_avg" (m) and
    "exp_avg_sq" (v)."""

    def __init__(self, module, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(module)
        self.lr = _nonnegative(lr, "lr")
        self.betas = _betas(betas)
        self.eps = _nonnegative(eps, "eps")
        self.weight_decay = _nonnegative(weight_decay, "weight_decay")

    def _update(self, param, grad, state):
        beta1, beta2 = self.betas
        if not state:
            state.update(step=0, exp_avg=np.zeros_like(param), exp_avg_sq=np.zeros_like(param))
        state["step"] += 1
        step, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        if self.weight_decay != 0:
            param *= 1 - self.lr * self.weight_decay
        weight = param.dtype.type(1 - beta1)   # torch.lerp rounds its weight to the dtype
        if abs(weight) < 0.5:
            m += weight * (grad - m)
        else:
            m[...] = grad - (grad - m) * (1 - weight)
        v *= beta2
        v += (1 - beta2) * grad * grad
        step_size = self.lr / (1 - beta1 ** step)
        denom = np.sqrt(v) / (1 - beta2 ** step) ** 0.5
        denom += self.eps
        param += -step_size * m / denom
