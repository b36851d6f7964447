"""attnc.from_torch: the attnc twin of a torch module, with its weights and mode.

Duck-typed: torch is never imported. A module is recognised by its class
name and its state_dict keys; its weights are read with
.detach().cpu().numpy(), its hyper-parameters from its weight shapes and
attributes (head counts, dropout modules' p, torch.nn.MultiheadAttention's
options).
"""
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .attention import (MultiHeadAttention, MultiHeadSelfAttention, SelfAttention, SelfAttentionV1, SelfAttentionV2,
                        SelfAttentionV3, SelfAttentionV4)
from .module import Dropout, Linear, Module
from . import _C
from ._checks import flag, has_an_axis, integer, is_a_bool, module_dtype, positive_int
from .multihead import MultiheadAttention


@dataclass(frozen=True)
class _Twin:
    """How one torch class becomes an attnc class.

    layers: the torch module's Linear layers (state_dict prefixes) -> the
    attnc module's; args: (torch module, its weights under attnc's keys)
    -> the attnc constructor's positional arguments; sizes: (torch module,
    weights) -> the attributes the document's forward reads besides those
    args read (a dimension it splits, views or scales by) and the values
    its constructor gave them for these weights; dropout: the name of the
    torch module's Dropout, whose p is the constructor's last argument and
    whose own mode the twin's Dropout takes (None: it has none); softmax:
    the dims meaning the scores' last axis of the document's
    torch.nn.Softmax submodule `softmax` (None: it has none)."""
    cls: type
    layers: dict
    args: Callable
    sizes: Callable
    dropout: str = None
    softmax: tuple = None

    def make(self, module, weights, dtype, rng):
        """The attnc module, constructed with the torch module's sizes and Dropout p;
        TypeError naming an attribute the document's class has and `module` lacks,
        or a submodule the twin would not compute as the document's forward calls
        it; ValueError naming a size attribute that disagrees with the weights."""
        name = type(module).__name__
        for layer in self.layers:  # the twin reads their weights as torch.nn.Linear's forward would
            _check_torch_class(getattr(module, layer, None), "Linear", f"{name}'s {layer}")
        try:
            args = self.args(module, weights)
            for attribute, expected in self.sizes(module, weights).items():
                _check_size_attribute(getattr(module, attribute), expected, f"{name}'s {attribute}")
            if self.softmax:
                _check_softmax(module.softmax, self.softmax, f"{name}'s softmax")
            if self.dropout:
                dropout = getattr(module, self.dropout)
                _check_torch_class(dropout, "Dropout", f"{name}'s {self.dropout}")
                args += (_C.probability(dropout.p, name=f"from_torch: {name}'s {self.dropout}.p"),)
        except AttributeError as error:
            raise TypeError(f"from_torch: this {name} lacks an attribute the document's {name} has ({error})") \
                from error
        return self.cls(*args, dtype=dtype, rng=rng)

    def matches(self, keys):
        return {key.rpartition(".")[0] for key in keys} == set(self.layers)

    def rename(self, key):
        layer, _, name = key.rpartition(".")
        return f"{self.layers[layer]}.{name}"


def _check_size_attribute(value, expected, what):
    """ValueError unless `value`, an attribute a document's forward reads, is
    `expected`, the value its constructor gives it for the module's weights
    (an int, or a float such as 004's _norm_fact): the twin computes from
    the weights, the torch module from the attribute."""
    if isinstance(expected, int):
        same = integer(value, f"from_torch: {what}") == expected
    else:
        same = not (is_a_bool(value) or has_an_axis(value)) and callable(getattr(type(value), "__float__", None)) \
            and float(value) == expected  # (a str has no __float__)
    if not same:
        raise ValueError(f"from_torch: {what} is {value!r} where its weights make it {expected!r}: the document's "
                         "forward reads it, the twin would compute from the weights")


def _check_softmax(softmax, dims, what):
    """TypeError unless `softmax` is a torch.nn.Softmax (keeping torch's forward)
    over one of `dims`, the scores' last axis, as the document's class makes it."""
    _check_torch_class(softmax, "Softmax", what)
    dim = softmax.dim
    if is_a_bool(dim) or not isinstance(dim, (int, np.integer)) or dim not in dims:
        raise TypeError(f"from_torch: {what} is over dim={dim!r}, not the scores' last axis "
                        f"(dim={dims[0]}) as the document's: the twin would compute over that axis")


def _in_dim(layer):
    """The input size of an attnc layer, from its weight (out, in)."""
    return lambda module, weights: (weights[f"{layer}.weight"].shape[1],)


def _self_attention(module, weights):
    """SelfAttention's (dim_in, dim_k, dim_v, bias), all from the weights."""
    dim_k, dim_in = weights["linear_q.weight"].shape
    return dim_in, dim_k, weights["linear_v.weight"].shape[0], "linear_q.bias" in weights


def _multi_head_self_attention(heads):
    """MultiHeadSelfAttention's (dim_in, dim_k, dim_v, num_heads, bias); num_heads from attribute `heads`."""
    def args(module, weights):
        dim_in, dim_k, dim_v, bias = _self_attention(module, weights)
        return dim_in, dim_k, dim_v, integer(getattr(module, heads), heads), bias
    return args


def _dims(**dims):
    """sizes: each attribute a dimension of a layer's weight (out, in), given as (layer, axis)."""
    return lambda module, weights: {attribute: weights[f"{layer}.weight"].shape[axis]
                                    for attribute, (layer, axis) in dims.items()}


def _norm_fact(dim):
    """004's _norm_fact for a head of `dim` features, as its constructor computes it."""
    return 1 / math.sqrt(dim) if dim else math.inf


def _004_sizes(heads):
    """004's attributes its forward reads: dim_in, _norm_fact (from dim_k per head)
    and, with heads (the head count's attribute; None: one head, no views),
    dim_k and dim_v."""
    def sizes(module, weights):
        dims = _dims(dim_in=("linear_q", 1), dim_k=("linear_q", 0), dim_v=("linear_v", 0))(module, weights)
        if heads is None:
            return {"dim_in": dims["dim_in"], "_norm_fact": _norm_fact(dims["dim_k"])}
        return {**dims, "_norm_fact": _norm_fact(dims["dim_k"] // positive_int(getattr(module, heads), heads))}
    return sizes


_V1 = {"Q_proj": "Q_proj", "K_proj": "K_proj", "V_proj": "V_proj"}
_FUSED = {"proj": "proj"}
_V3 = {"proj": "proj", "output_proj": "output_proj"}
_LINEAR_QKV = {"linear_q": "linear_q", "linear_k": "linear_k", "linear_v": "linear_v"}
_QKV = {"q": "linear_q", "k": "linear_k", "v": "linear_v"}
_HIDDEN_DIM = _dims(hidden_dim=("Q_proj", 1))  # 000's and 002's forwards scale by it
_DIM = _dims(dim=("proj", 1))  # split by it and scale by it

# the documents' classes under their own names: each name's versions (003 and 004 share two names)
_TWINS = {
    # 000
    "SelfAttentionv1": [_Twin(SelfAttentionV1, _V1, _in_dim("Q_proj"), sizes=_HIDDEN_DIM)],
    "SelfAttentionv2": [_Twin(SelfAttentionV2, _FUSED, _in_dim("proj"), sizes=_DIM)],
    "SelfAttentionv3": [_Twin(SelfAttentionV3, _V3, _in_dim("proj"), dropout="attention_dropout", sizes=_DIM)],
    "SelfAttentionInterview": [_Twin(SelfAttentionV4, {"query": "query", "key": "key", "value": "value"},
                                     _in_dim("query"), dropout="attention_dropout", sizes=_dims(dim=("query", 1)))],
    # 001
    "EasyAttentionModule": [_Twin(SelfAttentionV1, {"query_linear": "Q_proj", "key_linear": "K_proj",
                                                    "value_linear": "V_proj"}, _in_dim("Q_proj"), sizes=_HIDDEN_DIM)],
    "AttentionModule": [_Twin(SelfAttentionV2, _FUSED, _in_dim("proj"), sizes=_DIM)],
    "Attention": [_Twin(SelfAttentionV3, _V3, _in_dim("proj"), dropout="dropout", sizes=_DIM)],
    "MuitiHeadAttention": [_Twin(
        MultiHeadAttention,
        {name: name for name in ("query_linear", "key_linear", "value_linear", "output_linear")},
        lambda module, weights: (weights["query_linear.weight"].shape[1], integer(module.head_num, "head_num")),
        dropout="dropout",
        sizes=lambda module, weights: {  # its views and its scale
            "head_dim": weights["query_linear.weight"].shape[1] // positive_int(module.head_num, "head_num")})],
    # 002
    "SelfattentionV1": [_Twin(SelfAttentionV1, {"querry_proj": "Q_proj", "key_proj": "K_proj",
                                                "value_proj": "V_proj"}, _in_dim("Q_proj"), sizes=_HIDDEN_DIM)],
    "SelfattentionV2": [_Twin(SelfAttentionV2, _FUSED, _in_dim("proj"), sizes=_dims(hidden_dim=("proj", 1)))],
    "slefattentionV3": [_Twin(SelfAttentionV3, _V3, _in_dim("proj"), dropout="attention_dropout", sizes=_DIM)],
    # 003 (layers q, k, v with biases, an nn.Softmax over the scores' last axis) and 004 (linear_q, linear_k,
    # linear_v)
    "SelfAttention": [_Twin(SelfAttention, _QKV, _self_attention, sizes=_dims(dim_k=("linear_q", 0)),
                            softmax=(-1, 2)),
                      _Twin(SelfAttention, _LINEAR_QKV, _self_attention, sizes=_004_sizes(None))],
    "MultiHeadSelfAttention": [_Twin(MultiHeadSelfAttention, _QKV, _multi_head_self_attention("nums_head"),
                                     sizes=_dims(dim_k=("linear_q", 0), dim_v=("linear_v", 0)), softmax=(-1, 3)),
                               _Twin(MultiHeadSelfAttention, _LINEAR_QKV, _multi_head_self_attention("num_heads"),
                                     sizes=_004_sizes("num_heads"))],
}


def _numpy(tensor, what):
    """A tensor's values as a NumPy array; float16 and bfloat16 widened to
    float32 (exactly), as NumPy has no bfloat16; a view with torch's
    negative or conjugate bit set resolved (its values, not its storage's).
    TypeError naming `what` for a layout other than strided (sparse)."""
    if str(getattr(tensor, "layout", "torch.strided")) != "torch.strided":
        raise TypeError(f"from_torch: {what} is a {tensor.layout} tensor; attnc's twins take dense (strided) "
                        "parameters (to_dense() makes one)")
    tensor = tensor.detach().cpu().resolve_neg().resolve_conj()
    if str(tensor.dtype) not in ("torch.float32", "torch.float64"):
        tensor = tensor.float()
    return tensor.numpy()


def _tied_keys(tensors):
    """The groups of two or more keys of a ``state_dict(keep_vars=True)``
    naming one tensor (a parameter, or a submodule, assigned twice), each
    in state_dict order."""
    groups = {}
    for key, tensor in tensors.items():
        groups.setdefault(id(tensor), []).append(key)
    return [keys for keys in groups.values() if len(keys) > 1]


_TORCH_CLASSES = ("Linear", "NonDynamicallyQuantizableLinear", "MultiheadAttention")
_TORCH_DTYPES = {"torch.float64": "float64", "torch.float32": "float32", "torch.float16": "float16",
                 "torch.bfloat16": "bfloat16"}


def _twin_dtype(torch_dtypes):
    """The twin's dtype for weights of these torch dtypes: the narrowest of float16,
    bfloat16, float32 and float64 that holds them all (float16 with bfloat16: float32),
    as the functional rule; any other torch dtype counts as float32. bfloat16 needs
    ml_dtypes (module_dtype's TypeError says how to get it)."""
    names = {_TORCH_DTYPES.get(name, "float32") for name in torch_dtypes} or {"float32"}
    if "float64" in names:
        return module_dtype(np.float64)
    return module_dtype(names.pop() if len(names) == 1 else np.float32)


def _check_torch_class(obj, torch_name, what):
    """TypeError unless obj's class is torch.nn.<torch_name> or a subclass of it
    that keeps its forward (another forward computes something else)."""
    bases = [cls for cls in type(obj).__mro__
             if cls.__name__ == torch_name and cls.__module__.startswith("torch.nn.")]
    if not bases:
        raise TypeError(f"from_torch: {what} is not torch.nn.{torch_name} (a {type(obj).__module__}."
                        f"{type(obj).__qualname__})")
    if getattr(type(obj), "forward", None) is not getattr(bases[0], "forward", None):
        raise TypeError(f"from_torch: {what} is not torch.nn.{torch_name}: its class {type(obj).__qualname__} "
                        "overrides forward (the twin would compute torch's)")


def _check_torch_calls(module, name):
    """TypeError naming the first of module and its submodules whose call
    runs code of its own that the twin would not: a forward set on the
    instance, or hooks (forward, forward pre-, backward, backward pre-)."""
    named = getattr(module, "named_modules", None)  # (MultiheadAttention's forward reads out_proj, never calls it)
    whole = callable(named) and name != "MultiheadAttention"
    for path, sub in named() if whole else (("", module),):
        what = f"{name}'s {path}" if path else f"this {name}"
        if "forward" in getattr(sub, "__dict__", {}):
            raise TypeError(f"from_torch: {what} has a forward set on the instance, which the twin would not compute")
        for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if getattr(sub, hooks, None):
                raise TypeError(f"from_torch: {what} has {hooks.strip('_').replace('_', ' ')}, which the twin "
                                "would not run")


def _linear_shape(weight):
    """(out_features, in_features) of a torch.nn.Linear's weight; TypeError for no
    weight (None), ValueError unless it is 2-D."""
    if weight is None:
        raise TypeError("from_torch: weight: expected a tensor, got None (torch's forward needs one)")
    shape = tuple(weight.shape)
    if len(shape) != 2:
        raise ValueError(f"from_torch: weight: expected 2 dims (out_features, in_features), got shape {shape}")
    return shape


def _torch_twin(module, name, dtype, rng):
    """The attnc twin of torch.nn.Linear or torch.nn.MultiheadAttention, or None; TypeError
    for another class of the same name (a user's own MultiheadAttention), which lacks the
    attributes torch's has."""
    if name not in _TORCH_CLASSES:
        return None
    _check_torch_class(module, "MultiheadAttention" if name == "MultiheadAttention" else "Linear", f"this {name}")
    try:
        if name != "MultiheadAttention":
            out_features, in_features = _linear_shape(module.weight)  # (torch's forward reads the weight alone)
            args = (in_features, out_features), dict(bias=module.bias is not None)
        else:
            args = (module.embed_dim, module.num_heads), dict(
                dropout=module.dropout, bias=module.in_proj_bias is not None, add_bias_kv=module.bias_k is not None,
                add_zero_attn=module.add_zero_attn, kdim=module.kdim, vdim=module.vdim, batch_first=module.batch_first)
    except AttributeError as error:
        raise TypeError(f"from_torch: this {name} is not torch.nn.{name} ({error})") from error
    cls = MultiheadAttention if name == "MultiheadAttention" else Linear
    return cls(*args[0], **args[1], dtype=dtype, rng=rng)


def from_torch(module, *, dtype=None, rng=None):
    """The attnc twin of a torch module: its class, hyper-parameters, weights and mode.

    torch is not imported: the module is recognised by its class name and
    state_dict keys, its weights are read with ``.detach().cpu().numpy()``
    and copied (a tensor the module holds under several keys, a tied
    parameter or submodule, becomes one array the twin holds under the
    same keys), and the twin is put in the module's mode
    (``module.training``; a Dropout submodule in a mode of its own, as
    after ``module.train(); module.dropout.eval()``, gives that mode to
    the twin's Dropout).

    Parameters
    ----------
    module : torch.nn.Module
        One of the classes listed in the Notes.
    dtype : data-type, optional
        The twin's dtype: float16, bfloat16 (with ml_dtypes), float32 or
        float64. None (the default): the weights' own, the narrowest of
        those holding them all (float64 if any is float64; float32 for a
        mix of float16 and bfloat16).
    rng : numpy.random.Generator, optional
        The twin's generator (initialisation, then dropout), as every
        constructor's; None: the package's global generator.

    Returns
    -------
    attnc.Module
        The twin, with the module's weights loaded.

    Raises
    ------
    TypeError
        Naming the class, when it is not one of those below, or when its
        parameters are not those of a version of that name (other layer
        names, a missing bias); also for another `dtype`, for
        bfloat16 weights without ml_dtypes when `dtype` is None, for
        a state_dict entry that is not real floating (complex, integer,
        quantized) or on the meta device, naming it; for a subclass of
        torch's Linear or MultiheadAttention (under its name) or of
        torch.nn.Dropout (a document's dropout) that overrides forward,
        a document's layer that is not a torch.nn.Linear keeping its
        forward, a dropout that is not torch.nn.Dropout (AlphaDropout,
        Dropout1d), a module or submodule the twin would compute
        differently (a forward set on the instance; forward or backward
        hooks), a document's class lacking an attribute its twin
        reads, 003's softmax that is not torch.nn.Softmax over the
        scores' last axis, a sparse parameter, an attnc module, and a
        Dropout's p that is a bool or has an axis.
    ValueError
        From the twin's constructor or `load_state_dict`, for sizes that
        do not fit (a head count that does not divide the dimension);
        naming a document class's attribute its forward splits, views
        or scales by (hidden_dim, dim, head_dim, dim_k, dim_v, dim_in,
        004's _norm_fact) that disagrees with the weights, a Dropout's p
        outside [0, 1], and a mode (``training``) with no truth value.

    Notes
    -----
    Recognised, by class name: ``torch.nn.Linear`` -> `attnc.Linear`;
    ``torch.nn.MultiheadAttention`` -> `attnc.nn.MultiheadAttention`
    (every constructor option recovered from its attributes); and the
    documents' classes under their own names, state_dict keys renamed
    where a document names the layers differently:

    - 000 ``SelfAttentionv1``, 001 ``EasyAttentionModule`` (``query_linear``,
      ...) and 002 ``SelfattentionV1`` (``querry_proj``, ``key_proj``,
      ``value_proj``) -> `attnc.SelfAttentionV1`;
    - 000 ``SelfAttentionv2``, 001 ``AttentionModule``, 002
      ``SelfattentionV2`` -> `attnc.SelfAttentionV2`;
    - 000 ``SelfAttentionv3``, 001 ``Attention`` and 002
      ``slefattentionV3`` -> `attnc.SelfAttentionV3`;
    - 000 ``SelfAttentionInterview`` -> `attnc.SelfAttentionV4`;
    - 001 ``MuitiHeadAttention`` -> `attnc.MultiHeadAttention`;
    - 003 ``SelfAttention`` (``q``, ``k``, ``v``) and 004's (``linear_q``,
      ...) -> `attnc.SelfAttention`;
    - 003 ``MultiHeadSelfAttention`` (``q``, ``k``, ``v``, ``nums_head``)
      and 004's (``linear_*``, ``num_heads``) ->
      `attnc.MultiHeadSelfAttention`.

    Sizes come from the weight shapes (biases from their presence), head
    counts from the module's attribute, dropout rates from its Dropout's
    ``p``. attnc implements the documents' intent (see the errata): the
    twin of 003's ``MultiHeadSelfAttention`` attends over positions, not
    over its feature channels as that document's code does, so its
    outputs differ.

    Examples
    --------
    With PyTorch installed, ``net = attnc.from_torch(torch_module)`` gives
    the twin, and ``net(x)`` matches
    ``torch_module(torch.from_numpy(x))``. A class without a twin is
    refused, naming it:

    >>> import attnc
    >>> class Conv2d:  # stands in for a torch module attnc does not know
    ...     training = True
    ...     def state_dict(self):
    ...         return {}
    >>> attnc.from_torch(Conv2d())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    TypeError: from_torch: no attnc twin for Conv2d (known classes: ...)
    """
    name = type(module).__name__
    if isinstance(module, Module):
        raise TypeError(f"from_torch: this {name} is an attnc module already; from_torch takes a torch module "
                        "(copy.deepcopy copies an attnc module)")
    if name not in _TWINS and name not in _TORCH_CLASSES:
        known = ", ".join(sorted(set(_TWINS) | {"Linear", "MultiheadAttention"}))
        raise TypeError(f"from_torch: no attnc twin for {name} (known classes: {known})")
    _check_torch_calls(module, name)
    tensors = dict(module.state_dict(keep_vars=True))  # the module's own tensors: a tie is one object
    for key, tensor in tensors.items():  # complex, integer, quantized: no twin computes them
        floating = getattr(tensor, "is_floating_point", None)
        if not callable(floating) or not floating():
            kind = getattr(tensor, "dtype", type(tensor).__name__)
            raise TypeError(f"from_torch: {name}'s {key} is {kind}; attnc's twins take real floating parameters")
        if getattr(tensor, "is_meta", False):
            raise TypeError(f"from_torch: {name}'s {key} is on the meta device: it has no values to copy")
    if dtype is None:
        dtype = _twin_dtype({str(t.dtype) for t in tensors.values()})
    weights = {key: _numpy(t, f"{name}'s {key}") for key, t in tensors.items()}
    twin, version = _torch_twin(module, name, dtype, rng), None
    if twin is None:
        versions = _TWINS[name]
        version = next((v for v in versions if v.matches(weights)), None)
        if version is None:
            layouts = " or ".join(", ".join(v.layers) for v in versions)
            raise TypeError(f"from_torch: {name} with parameters {list(weights)} matches none of the documents' "
                            f"{name} (layers {layouts})")
        weights = {version.rename(key): array for key, array in weights.items()}
        twin = version.make(module, weights, dtype, rng)
    expected = [key for key, _ in twin.named_parameters(remove_duplicate=False)]
    if sorted(expected) != sorted(weights):
        raise TypeError(f"from_torch: {name}'s parameters {list(weights)} are not those of its attnc twin "
                        f"{type(twin).__name__}, {expected}")
    twin.load_state_dict(weights)
    for keys in _tied_keys(tensors):  # torch's ties (a parameter or submodule assigned twice) kept
        names = [key if version is None else version.rename(key) for key in keys]
        owner, attribute = twin._owner_of(names[0])
        shared = getattr(owner, attribute)
        for tied in names[1:]:
            setattr(*twin._owner_of(tied), shared)
    twin.train(flag(module.training, f"from_torch: {name}'s training"))
    if version is not None and version.dropout:  # the Dropout's own mode: torch's way to train without it
        (dropout,) = (sub for sub in twin._modules.values() if isinstance(sub, Dropout))
        mode = getattr(module, version.dropout).training
        dropout.train(flag(mode, f"from_torch: {name}'s {version.dropout}.training"))
    return twin
