"""An attention module frozen for inference: a snapshot of its parameters,
read-only, with its projection weights packed once.

A module's forward packs each weight matrix into the GEMM's micro-kernel
layout on every call, because its parameters may have changed since the last
one (they are writable arrays, and optimizers edit them in place). A frozen
module's weights cannot change: `attnc._C.freeze_module` copies them into
arrays no one can make writable and packs them once, and every call reads
those packs. The module itself stays as it was; editing it after freezing
changes nothing in the frozen one, as an ONNX Runtime session or OpenVINO's
compiled model keeps the weights it was built with.
"""
import inspect

import numpy as np

from . import _C
from .module import _replaced_method


def _check_runs_class_code(module, cls, methods):
    """TypeError naming `module` if one of `methods` (what a call of it runs)
    is not cls's own: a frozen module computes cls's forward only."""
    replaced = _replaced_method(module, cls, methods)
    if replaced:
        raise TypeError(f"module: {replaced}; a frozen module computes {cls.__name__}'s forward only")


class FrozenAttention:
    """An attention module's eval-mode forward, with its weights frozen and packed once.

    Made by the module's ``freeze()``. Calls return what the module's
    eval-mode forward returned at the moment it was frozen, bit for bit
    (no dropout; the same bits for any thread count), with the projection
    weights packed for the GEMM once rather than at every call. It holds
    its own copy of the parameters: later edits to the module, in place or
    by assignment, do not reach it (freeze again to take them).

    Parameters
    ----------
    module : attnc attention module
        One of attnc's attention modules (``MultiHeadAttention``,
        ``SelfAttentionV1`` ...), whose forward it reproduces.

    Raises
    ------
    TypeError
        If `module` is not one of attnc's attention modules, or is a
        subclass that overrides ``forward`` (or ``__call__``).
    AttributeError, TypeError, ValueError
        If a parameter or the dropout probability was deleted, replaced
        by a wrong value or resized (naming it), as a forward would.
    MemoryError
        If the copies or the packed weights cannot be allocated.

    Notes
    -----
    Memory: the parameters' copy plus the packed projection weights (each
    weight's rows padded to a multiple of the micro-kernel's width, 32 at
    AVX-512; widened to float32 for float16, and for bfloat16 below the
    AVX512_BF16 level): about twice the parameters in float32 and float64,
    three times in those 16-bit cases, more for small modules (the
    padding). The packs are read by the kernels that made them (the
    SIMD level active at freezing); after ``attnc._C.set_simd_level`` to a
    level with other kernels, the products pack per call as the module's do
    (the same bits as that level's module). A frozen module cannot be
    trained and has no backward; its attributes cannot be set; it pickles
    as its parameters (and packs again when loaded).

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> module = attnc.MultiHeadAttention(8, 2, rng=np.random.default_rng(0)).eval()
    >>> frozen = module.freeze()
    >>> x = np.random.default_rng(1).normal(size=(2, 3, 8))
    >>> bool(np.array_equal(frozen(x), module(x)))
    True
    >>> module.query_linear.weight[...] = 0  # the frozen copy keeps its weights
    >>> bool(np.array_equal(frozen(x), module(x)))
    False
    """

    __slots__ = ("_params", "_packed", "_spec", "_dtype", "_takes_mask", "_kind")

    def __init__(self, module):
        from .attention import _Attention  # (attention.py imports this file)
        if not isinstance(module, _Attention):
            raise TypeError(f"module: expected one of attnc's attention modules, got {type(module).__name__}")
        kind = next(cls for cls in type(module).__mro__ if cls.__module__ == _Attention.__module__)
        _check_runs_class_code(module, kind, ("forward", "__call__", "_attend"))
        params = module._values_of(module._spec[0])
        module._check_projections()
        _C.probability(module._dropout()[0], name=module._spec[1])  # unused here, but checked as a forward checks it
        self._set(params, module._spec, module.dtype, "attention_mask" in inspect.signature(kind.forward).parameters,
                  kind.__name__)

    def _set(self, params, spec, dtype, takes_mask, kind):
        frozen, packed = _C.freeze_module(params, spec, dtype)
        for name, value in (("_params", frozen), ("_packed", packed), ("_spec", spec), ("_dtype", dtype),
                            ("_takes_mask", takes_mask), ("_kind", kind)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"{name}: a FrozenAttention's attributes cannot be set (freeze the module again)")

    def __delattr__(self, name):
        raise AttributeError(f"{name}: a FrozenAttention's attributes cannot be deleted")

    @classmethod
    def _unpickled(cls, params, spec, dtype, takes_mask, kind):
        frozen = cls.__new__(cls)
        frozen._set(params, spec, dtype, takes_mask, kind)
        return frozen

    def __reduce__(self):
        return FrozenAttention._unpickled, (self._params, self._spec, self._dtype, self._takes_mask, self._kind)

    def __copy__(self):
        return self  # nothing in it changes

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return (f"FrozenAttention({self._kind}, in_dim={self._spec[2][0]}, heads={self._spec[3]}, "
                f"dtype={np.dtype(self._dtype).name})")

    @property
    def dtype(self):
        """The frozen module's dtype (its parameters' and results')."""
        return self._dtype

    def __call__(self, x, attention_mask=None, *, return_weights=False):
        """The module's eval-mode forward with the frozen parameters.

        Parameters
        ----------
        x : array_like, shape (..., seq, in_dim)
            As the module's forward takes it.
        attention_mask : array_like, optional
            As the module's forward takes it; only for modules whose
            forward takes a mask.
        return_weights : bool, optional
            Also return the attention weights, as the module's forward.

        Returns
        -------
        ndarray, or (ndarray, ndarray)
            What the module's eval-mode forward returns.

        Raises
        ------
        TypeError
            For an `attention_mask` given to a module whose forward takes
            none; otherwise as the module's forward.
        ValueError
            As the module's forward.
        """
        if attention_mask is not None and not self._takes_mask:
            raise TypeError(f"attention_mask: {self._kind}'s forward takes no mask")
        return _C.self_attention(x, self._params, self._spec, attention_mask, self._dtype, 0.0, False, None,
                                 return_weights, None, False, self._packed)


class FrozenMultiheadAttention:
    """`attnc.nn.MultiheadAttention`'s eval-mode forward, with its parameters frozen.

    Made by the module's ``freeze()``. Calls take the module's forward
    arguments and return what its eval-mode forward returned at the moment
    it was frozen, bit for bit (no dropout; the same bits for any thread
    count). It holds its own read-only copy of the parameters: later edits
    to the module, in place or by assignment, do not reach it (freeze again
    to take them). Its self-attention calls, the module's one C call
    (`query`, `key` and `value` one array, no masks, the stacked
    ``in_proj_weight``, neither ``add_bias_kv`` nor ``add_zero_attn``), read
    the in-projection and output projection weights packed once, as
    `FrozenAttention` does; its other calls pack them per call, as the
    module's.

    Parameters
    ----------
    module : attnc.nn.MultiheadAttention
        The module whose forward it reproduces.

    Raises
    ------
    TypeError
        If `module` is not an ``attnc.nn.MultiheadAttention``, or is a
        subclass that overrides ``forward`` (or ``__call__``).
    ValueError, TypeError
        If a parameter or size was replaced by a wrong value (naming it),
        as a forward would raise.
    MemoryError
        If the copies or the packed weights cannot be allocated.

    Notes
    -----
    Memory: the parameters' copy plus, with the stacked ``in_proj_weight``,
    the packed projection weights (see `FrozenAttention`). After
    ``attnc._C.set_simd_level`` to a level with other kernels, the
    products pack per call. A frozen module cannot be trained and has no
    backward; its attributes cannot be set; it pickles as the module it
    copies (and packs again when loaded).

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> mha = attnc.nn.MultiheadAttention(8, 2, batch_first=True, rng=np.random.default_rng(0)).eval()
    >>> frozen = mha.freeze()
    >>> x = np.random.default_rng(1).normal(size=(2, 3, 8))
    >>> bool(np.array_equal(frozen(x, x, x)[0], mha(x, x, x)[0]))
    True
    >>> mha.out_proj.weight[...] = 0  # the frozen copy keeps its weights
    >>> bool(np.array_equal(frozen(x, x, x)[0], mha(x, x, x)[0]))
    False
    """

    __slots__ = ("_module", "_checked")

    def __init__(self, module):
        from .multihead import _FUSED_NAMES, _PARAMETERS, MultiheadAttention, _fused_spec  # (it imports this file)
        if not isinstance(module, MultiheadAttention):
            raise TypeError(f"module: expected an attnc.nn.MultiheadAttention, got {type(module).__name__}")
        _check_runs_class_code(module, MultiheadAttention, ("forward", "__call__", "_forward", "_self_attention"))
        geometry = module._geometry()
        _, params = module._checked_parameters(geometry)
        packed, frozen = None, {}
        if not geometry.separate:  # the self-attention call's weights: copied and packed together
            copies, packed = _C.freeze_module(tuple(params[name] for name in _FUSED_NAMES), _fused_spec(geometry),
                                              module.dtype)
            frozen.update(zip(_FUSED_NAMES, copies))
        for name, value in params.items():  # the rest copied as freeze_module copies
            if name not in frozen:
                frozen[name] = None if value is None else _C.read_only_copy(value, module.dtype, name)
        # a private eval-mode copy computes with the frozen arrays (set past __setattr__, which would make
        # writable copies of them), out_proj a copy of its own; no gradient buffers
        private = module._shallow_copy()
        private.out_proj = module.out_proj._shallow_copy()
        for owner in (private, private.out_proj):
            object.__setattr__(owner, "_grads", {})
        private.eval()
        for name in _PARAMETERS:
            owner, attribute = private._owner_of(name)
            object.__setattr__(owner, attribute, frozen[name])
        object.__setattr__(private, "_packed", packed)
        object.__setattr__(self, "_module", private)
        # its sizes and parameters, read and checked once (a call's forward would read the same)
        object.__setattr__(self, "_checked", (geometry, *private._checked_parameters(geometry)))

    def __setattr__(self, name, value):
        raise AttributeError(f"{name}: a FrozenMultiheadAttention's attributes cannot be set (freeze the module "
                             f"again)")

    def __delattr__(self, name):
        raise AttributeError(f"{name}: a FrozenMultiheadAttention's attributes cannot be deleted")

    def __reduce__(self):
        return FrozenMultiheadAttention, (self._module,)  # (its state without the packs: made again when loaded)

    def __copy__(self):
        return self  # nothing in it changes

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        m = self._module
        return (f"FrozenMultiheadAttention(embed_dim={m.embed_dim}, num_heads={m.num_heads}, "
                f"batch_first={m.batch_first}, dtype={np.dtype(m.dtype).name})")

    @property
    def dtype(self):
        """The frozen module's dtype (its parameters' and results')."""
        return self._module.dtype

    def __call__(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                 average_attn_weights=True, is_causal=False):
        """The module's eval-mode forward with the frozen parameters.

        Parameters
        ----------
        query, key, value : array_like
            As `attnc.nn.MultiheadAttention.forward` takes them.
        key_padding_mask : array_like, optional
            The padding mask, in torch's convention, as the forward takes it.
        need_weights : bool, default True
            As the forward takes it.
        attn_mask : array_like, optional
            The attention mask, in torch's convention, as the forward takes
            it (after `need_weights`, in the forward's positional order).
        average_attn_weights, is_causal : bool, optional
            As the forward takes them.

        Returns
        -------
        attn_output : ndarray
            What the module's eval-mode forward returns.
        attn_weights : ndarray or None
            Likewise (None without `need_weights`).

        Raises
        ------
        ValueError, TypeError
            As the module's forward, naming the argument.
        """
        return self._module._forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                     average_attn_weights, is_causal, self._checked)
