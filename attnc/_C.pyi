"""Type stub of attnc's C extension: the kernels and the one layer that
checks arguments (every error names its argument). All arguments may be
passed by keyword. The public, documented API is attnc.functional, the
modules and attnc.set_num_threads / get_num_threads."""
from typing import Any, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

_Array = npt.NDArray[np.floating[Any]]
_Out = Union[_Array, Tuple[_Array, _Array], Tuple[_Array, _Array, _Array]]
_Rng = Optional[np.random.Generator]
# (names, dropout_name, (in_dim, qk_dim, v_dim, out_dim), n_heads, heads_axis, fused):
# see attnc/attention.py _spec
_Spec = Tuple[Tuple[str, ...], str, Tuple[int, int, int, int], int, bool, bool]

# dtype=None: the functional dtype rule (docs/API.md)
def linear(x: npt.ArrayLike, weight: npt.ArrayLike, bias: Optional[npt.ArrayLike] = None, *,
           dtype: Optional[npt.DTypeLike] = None) -> _Array: ...
def softmax(x: npt.ArrayLike, axis: int = -1, *, dtype: Optional[npt.DTypeLike] = None) -> _Array: ...
def dropout(x: npt.ArrayLike, p: float = 0.5, *, training: bool = True, rng: _Rng = None,
            dtype: Optional[npt.DTypeLike] = None, seed: Optional[int] = None) -> _Array: ...
def scaled_dot_product_attention(
    query: npt.ArrayLike, key: npt.ArrayLike, value: npt.ArrayLike, attn_mask: Optional[npt.ArrayLike] = None,
    dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None, rng: _Rng = None,
    return_weights: bool = False, return_lse: bool = False, attn_bias: Optional[npt.ArrayLike] = None,
    causal_alignment: str = "top_left", window: Optional[Tuple[Optional[int], Optional[int]]] = None,
    dtype: Optional[npt.DTypeLike] = None, seed: Optional[int] = None,
) -> _Out: ...
# the gradients over the broadcast batch (attnc.functional sums them to the inputs' shapes)
def scaled_dot_product_attention_backward(
    grad_out: npt.ArrayLike, query: npt.ArrayLike, key: npt.ArrayLike, value: npt.ArrayLike, out: npt.ArrayLike,
    lse: npt.ArrayLike, attn_mask: Optional[npt.ArrayLike] = None, is_causal: bool = False,
    scale: Optional[float] = None, dropout_p: float = 0.0, *, attn_bias: Optional[npt.ArrayLike] = None,
    causal_alignment: str = "top_left", window: Optional[Tuple[Optional[int], Optional[int]]] = None,
    dtype: Optional[npt.DTypeLike] = None, seed: Optional[int] = None,
) -> Tuple[_Array, _Array, _Array]: ...
# (x, qkv, merged, lse, seed): what a training-mode forward keeps for its backward
_Saved = Tuple[_Array, _Array, _Array, _Array, int]
# freeze_module's packed weights: an opaque capsule
_Packed = object
def self_attention(
    x: npt.ArrayLike, params: Tuple[Optional[npt.ArrayLike], ...], spec: _Spec,
    attention_mask: Optional[npt.ArrayLike], dtype: npt.DTypeLike, dropout_p: float = 0.0,
    training: bool = False, rng: _Rng = None, return_weights: bool = False, scale: Optional[float] = None,
    save: bool = False, packed: Optional[_Packed] = None,
) -> Union[_Out, Tuple[_Out, _Saved]]: ...
# read-only copies of a module's parameters and their projection weights packed once (a capsule)
def freeze_module(
    params: Tuple[Optional[npt.ArrayLike], ...], spec: _Spec, dtype: npt.DTypeLike,
) -> Tuple[Tuple[Optional[_Array], ...], _Packed]: ...
def copy(array: _Array) -> _Array: ...
def read_only_copy(array: npt.ArrayLike, dtype: npt.DTypeLike, name: str = "array") -> _Array: ...
# (grad_x, the Q/K/V weights' gradients stacked, their biases' stacked, grad_w_out or None, grad_bias_out or None)
def self_attention_backward(
    grad_output: npt.ArrayLike, saved: _Saved, params: Tuple[Optional[npt.ArrayLike], ...], spec: _Spec,
    attention_mask: Optional[npt.ArrayLike] = None, *, dtype: npt.DTypeLike, dropout_p: float = 0.0,
    scale: Optional[float] = None,
) -> Tuple[_Array, _Array, _Array, Optional[_Array], Optional[_Array]]: ...
# one optimizer step of one parameter, in place, then state.update(entries) (attnc.optim)
def update(
    param: _Array, grad: _Array, state_arrays: Tuple[_Array, ...], rule: str, state: dict, entries: dict, *,
    start: bool = False, lr: float = 0.0, momentum: float = 0.0, weight_decay: float = 0.0, decay: float = 1.0,
    lerp_weight: float = 0.0, beta2: float = 0.0, step_size: float = 0.0, bias2_sqrt: float = 1.0, eps: float = 0.0,
) -> None: ...

# checks the modules' constructors share with the calls above
def probability(p: float, name: str = "p") -> float: ...
def check_rng(rng: _Rng) -> _Rng: ...
def commit(targets: list[_Array], sources: list[_Array], assignments: list[tuple[object, str, object]],
           adds: list[bool] | None = None) -> None: ...
def as_parameter(value: npt.ArrayLike, *, name: str, dtype: npt.DTypeLike) -> _Array: ...
def result_dtype(**arrays: npt.ArrayLike) -> np.dtype: ...

def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
# a test hook: run up to n threads (0: up to the real CPUs), so that thread counts
# up to n split the work as on a machine that wide; the default count stays the CPUs'
def set_cpus_for_tests(n: int) -> None: ...

# kernel ISA levels ("portable", "avx2", "avx512", "avx512bf16") and a test hook
def simd_levels() -> Tuple[str, ...]: ...
def set_simd_level(level: str) -> None: ...
def simd_level() -> str: ...
def fail_alloc_after(n: int, *, once: bool = False) -> int: ...

# the ways of an L1 data cache set as the GEMM counts them (0: unknown), and a
# test hook that makes it count another CPU's (0 to MAX_L1D_WAYS)
def l1d_ways() -> int: ...
def set_l1d_ways(ways: int) -> None: ...
MAX_L1D_WAYS: int

# a test hook: the order the last GEMM on this thread took ("direct", "few_rows",
# "transposed", "streamed", "far_x" or "blocked")
def last_gemm_order() -> str: ...
# the active level's vector width in bytes, and whether this CPU is Intel's (the
# GEMM's orders depend on both)
def simd_vector_bytes() -> int: ...
def cpu_is_intel() -> bool: ...

# the GEMM's K block: every product sums its K blocks of this many steps in
# order, each from zero (the tests take K from it)
GEMM_KC: int
