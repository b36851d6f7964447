"""A frozen module (`module.freeze()`, and attnc.nn.MultiheadAttention's): the
module's eval-mode forward with its weights copied once (read-only) and packed once. Oracles: the document's
torch module, the float64 NumPy reference, and the module's own forward bit
for bit (a frozen module must be the same computation with the packing done
ahead). Its snapshot must never go stale or be writable, and packs that are
not its weights' must never be used."""
import copy
import pickle
import threading

import numpy as np
import pytest

import attnc
from attnc import _C
from toolkit import (K_BLOCK, KERNEL_LEVELS, MODEL_IDS, MODELS, assert_close, make_module, make_pair, ref_module,
                     torch_forward)
from conftest import at_level

# (B, T, dim, heads): the module's GEMM orders by the rows of x (B * T):
# direct loops (a tiny product), few rows (<= 8), transposed (a few dozen),
# streamed (a few hundred), blocked (x beyond the streamed order's bytes at
# every level), where its frozen twin takes the direct loops or the packed
# orders; and dims past one K block (two blocks of the products' K)
SIZES = [(1, 2, 4, 2), (1, 5, 48, 4), (1, 32, 64, 4), (2, 77, 96, 4), (3, 128, 64, 2)]
WIDE = (1, 40, K_BLOCK + 32, 4)
BLOCKED = (2, 500, 1056, 8)


def mha(size, dtype=np.float32, seed=0):
    B, T, D, H = size
    module = attnc.MultiHeadAttention(D, H, dtype=dtype, rng=np.random.default_rng(seed)).eval()
    x = np.random.default_rng(seed + 1).standard_normal((B, T, D)).astype(dtype)
    return module, x


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_frozen_matches_torch_and_the_module(model, dtype):
    """Every attention class, frozen, against the document's torch module
    and the float64 reference, and bit for bit against the module."""
    tm, am = make_pair(model, 12, dtype)
    x = np.random.default_rng(3).standard_normal((2, 7, 12)).astype(dtype)
    frozen = am.freeze()
    out = frozen(x)
    np.testing.assert_array_equal(out, am(x))
    assert_close(out, torch_forward(model, tm, x), dtype, "frozen vs torch")
    assert_close(out, ref_module(am, x)[0], dtype, "frozen vs float64 reference")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", SIZES + [WIDE], ids=str)
def test_frozen_has_the_module_bits_at_every_level(simd_mode, size, threads, dtype, restore_threads):
    """Packed at each level, the products read the packs at every size
    (where the module's few-rows and transposed orders read the weights in
    place, and its short items run a task per item or head group): the
    module's bits at that level, any thread count."""
    attnc.set_num_threads(threads)
    module, x = mha(size, dtype)
    frozen = module.freeze()
    out = frozen(x)
    np.testing.assert_array_equal(out, module(x))
    assert_close(out, ref_module(module, x)[0], dtype, "frozen vs float64 reference")


def test_frozen_blocked_order_over_two_k_blocks(restore_threads):
    """x past the streamed order's bytes, dims past one K block: the packs'
    second K block is read where the per-call packing puts it."""
    module, x = mha(BLOCKED)
    frozen = module.freeze()
    for threads in (1, 2):
        attnc.set_num_threads(threads)
        np.testing.assert_array_equal(frozen(x), module(x))
    assert_close(frozen(x[:, :20]), ref_module(module, x[:, :20])[0], np.float32, "frozen vs float64 reference")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_frozen_16_bit(dtype):
    """16-bit modules pack their weights widened (and as bfloat16 pairs
    where the level multiplies pairs): the module's bits."""
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dtype = ml_dtypes.bfloat16
    for size in SIZES[1:]:
        module, x = mha(size, dtype)
        np.testing.assert_array_equal(module.freeze()(x).view(np.uint16), module(x).view(np.uint16))


def test_frozen_with_mask_and_weights():
    module, x = mha((2, 77, 96, 4))
    keep = np.random.default_rng(4).random((2, 1, 1, 77)) < 0.7
    keep[..., 0] = True
    out, weights = module.freeze()(x, keep, return_weights=True)
    expected, expected_weights = module(x, keep, return_weights=True)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(weights, expected_weights)


def test_packs_made_at_one_level_are_not_read_at_another(restore_threads):
    """After the SIMD level changes, the packs (another layout) are left
    alone: the new level's module bits."""
    if len(KERNEL_LEVELS) < 2:
        pytest.skip("this CPU has one kernel level")
    module, x = mha((2, 77, 96, 4))
    frozen = module.freeze()  # at the best level
    for level in KERNEL_LEVELS[:-1]:
        for _ in at_level(level):
            np.testing.assert_array_equal(frozen(x), module(x))


def test_frozen_is_a_snapshot():
    """Edits to the module after freezing, in place or by assignment, do
    not reach the frozen module; they reach the next freeze."""
    module, x = mha((1, 77, 96, 4))
    before = module(x)
    frozen = module.freeze()
    module.query_linear.weight *= 2
    module.output_linear.bias[...] = 1
    module.value_linear.weight = np.zeros_like(module.value_linear.weight)
    np.testing.assert_array_equal(frozen(x), before)
    np.testing.assert_array_equal(module.freeze()(x), module(x))
    assert not np.array_equal(module(x), before)


def test_frozen_parameters_cannot_be_made_writable():
    module, x = mha((1, 77, 96, 4))
    frozen = module.freeze()
    for param in frozen._params:
        if param is not None:
            with pytest.raises(ValueError):
                param.flags.writeable = True
            with pytest.raises(ValueError):
                param[...] = 0


def test_packs_of_other_weights_are_never_read():
    """self_attention reads the packs only with the frozen weights they
    were packed from: with another module's parameters (or a copy of the
    frozen ones), it computes from the parameters given."""
    a, x = mha((1, 77, 96, 4), seed=0)
    b, _ = mha((1, 77, 96, 4), seed=5)
    frozen = a.freeze()
    params = b._values_of(b._spec[0])
    out = _C.self_attention(x, params, b._spec, None, b.dtype, 0.0, False, None, False, None, False, frozen._packed)
    np.testing.assert_array_equal(out, b(x))
    doubled = tuple(None if p is None else p * 2 for p in frozen._params)  # other memory, other values
    out = _C.self_attention(x, doubled, a._spec, None, a.dtype, 0.0, False, None, False, None, False, frozen._packed)
    np.testing.assert_array_equal(out, _C.self_attention(x, doubled, a._spec, None, a.dtype))
    assert not np.array_equal(out, frozen(x))


def test_packed_argument_checked():
    module, x = mha((1, 5, 48, 4))
    params = module._values_of(module._spec[0])
    with pytest.raises(TypeError, match="^packed: "):
        _C.self_attention(x, params, module._spec, None, module.dtype, 0.0, False, None, False, None, False, "no")


class Overriding(attnc.MultiHeadAttention):
    def forward(self, x, attention_mask=None, *, return_weights=False):
        return super().forward(x, attention_mask, return_weights=return_weights) * 2


class Inheriting(attnc.MultiHeadAttention):
    pass


def test_freeze_refuses_what_it_cannot_reproduce():
    with pytest.raises(TypeError, match="^module: Overriding overrides forward"):
        Overriding(8, 2).freeze()
    with pytest.raises(TypeError, match="^module: expected one of attnc's attention modules, got Linear"):
        attnc.FrozenAttention(attnc.Linear(2, 2))
    sub = Inheriting(8, 2, rng=np.random.default_rng(0)).eval()
    x = np.ones((1, 3, 8), np.float32)
    np.testing.assert_array_equal(sub.freeze()(x), sub(x))
    with pytest.raises(TypeError, match="^attention_mask: SelfAttentionV1's forward takes no mask"):
        make_module("V1").freeze()(np.ones((3, 4), np.float32), np.ones((3, 3)))


def test_freeze_names_a_bad_parameter():
    module, _ = mha((1, 5, 48, 4))
    module.key_linear.weight = np.zeros((47, 48), np.float32)
    with pytest.raises(ValueError, match="^key_linear.weight: "):
        module.freeze()
    del module.key_linear.weight
    with pytest.raises(AttributeError, match="^key_linear.weight: "):
        module.freeze()


def test_frozen_bad_input_names_x():
    module, _ = mha((1, 5, 48, 4))
    frozen = module.freeze()
    with pytest.raises(ValueError, match="^x: "):
        frozen(np.ones((2, 5, 47), np.float32))
    with pytest.raises(TypeError, match="^x: "):
        frozen(np.ones((2, 5, 48), complex))


def test_frozen_pickles_and_copies():
    module, x = mha((2, 77, 96, 4))
    frozen = module.freeze()
    loaded = pickle.loads(pickle.dumps(frozen))
    np.testing.assert_array_equal(loaded(x), module(x))
    assert copy.copy(frozen) is frozen and copy.deepcopy(frozen) is frozen
    assert repr(frozen) == "FrozenAttention(MultiHeadAttention, in_dim=96, heads=4, dtype=float32)"
    assert frozen.dtype == np.float32


def test_frozen_from_many_threads(restore_threads):
    """One frozen module called from several Python threads at once: every
    result the single call's bits."""
    attnc.set_num_threads(2)
    module, x = mha((2, 77, 96, 4))
    frozen = module.freeze()
    assert_same_from_threads(lambda: frozen(x), module(x))


def assert_same_from_threads(call, expected, threads=4, calls=20):
    """call() from several Python threads at once, `calls` times each: no
    error, and every result `expected`'s bits."""
    results, errors = [], []

    def run():
        try:
            for _ in range(calls):
                results.append(call())
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    started = [threading.Thread(target=run) for _ in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()
    assert not errors
    assert len(results) == threads * calls and all(np.array_equal(r, expected) for r in results)


@pytest.mark.parametrize("kind", ["MultiHeadAttention", "nn.MultiheadAttention"])
def test_freeze_out_of_memory_raises_and_frees(kind):
    if kind == "MultiHeadAttention":
        module, x = mha((1, 77, 96, 4))
        forward = lambda m: m(x)  # noqa: E731
    else:
        module = nn_mha("default")
        (x, _, _), _ = nn_calls("default", np.float32)["self"]
        forward = lambda m: m(x, x, x)[0]  # noqa: E731
    for n in range(2):  # the Q, K, V weights' packs, then the output projection's
        _C.fail_alloc_after(n)
        try:
            with pytest.raises(MemoryError, match="^freeze_module: "):
                module.freeze()
        finally:
            _C.fail_alloc_after(-1)
    np.testing.assert_array_equal(forward(module.freeze()), forward(module))


class Calling(attnc.MultiHeadAttention):
    def __call__(self, x, *args, **kwargs):
        return super().__call__(np.clip(x, -1, 1), *args, **kwargs)


def test_freeze_refuses_a_subclass_that_overrides_call():
    """A subclass overriding __call__ (not forward) was frozen, and the frozen
    module's results were not the module's (a review helper, 2026-12-01)."""
    with pytest.raises(TypeError, match="^module: Calling overrides __call__"):
        Calling(8, 2).freeze()


def test_frozen_attributes_cannot_be_set():
    """Its packs are read with its own frozen arrays only; reassigning them
    (or anything) is refused rather than trusted (a review helper, 2026-12-01)."""
    module, x = mha((1, 77, 96, 4))
    frozen = module.freeze()
    expected = frozen(x)
    with pytest.raises(AttributeError, match="^_params: "):
        frozen._params = module._values_of(module._spec[0])
    with pytest.raises(AttributeError, match="^_packed: "):
        del frozen._packed
    np.testing.assert_array_equal(frozen(x), expected)


# ----------------------------------------------------------------------------
# attnc.nn.MultiheadAttention's freeze(): FrozenMultiheadAttention

NN_CONFIGS = {"default": {}, "nobias": dict(bias=False), "batch_first": dict(batch_first=True),
              "bias_kv": dict(add_bias_kv=True), "zero_attn": dict(add_zero_attn=True),
              "kdim_vdim": dict(kdim=24, vdim=40)}


def nn_mha(config, dtype=np.float32, seed=0, embed_dim=32, heads=4):
    """An eval-mode nn.MultiheadAttention of `config`, its biases made nonzero."""
    module = attnc.nn.MultiheadAttention(embed_dim, heads, **NN_CONFIGS[config], dtype=dtype,
                                         rng=np.random.default_rng(seed)).eval()
    if module.in_proj_bias is not None:
        module.in_proj_bias[...] = np.linspace(-1, 1, 3 * embed_dim)
        module.out_proj.bias[...] = np.linspace(1, -1, embed_dim)
    return module


def nn_calls(config, dtype, length=40, batch=3, embed_dim=32):
    """{name: (args, kwargs)} of forward calls: self-attention (the one C
    call), key and value one array, three arrays, masks, no weights,
    unbatched."""
    options = NN_CONFIGS[config]
    rng = np.random.default_rng(1)

    def seq(n, features, batched=True):
        if not batched:
            return rng.standard_normal((n, features)).astype(dtype)
        shape = (batch, n, features) if options.get("batch_first") else (n, batch, features)
        return rng.standard_normal(shape).astype(dtype)

    kdim, vdim = options.get("kdim", embed_dim), options.get("vdim", embed_dim)
    x, memory, single = seq(length, embed_dim), seq(length + 5, kdim), seq(length, embed_dim, batched=False)
    value = seq(length + 5, vdim) if kdim != vdim else memory
    padding = rng.random((batch, length + 5)) < 0.2
    causal = np.triu(np.ones((length, length), bool), k=1)
    calls = {"cross": ((x, memory, value), {}), "cross_padding": ((x, memory, value), {"key_padding_mask": padding}),
             "cross_per_head": ((x, memory, value), {"average_attn_weights": False})}
    if kdim == vdim == embed_dim:
        calls.update({"self": ((x, x, x), {}), "self_no_weights": ((x, x, x), {"need_weights": False}),
                      "self_per_head": ((x, x, x), {"average_attn_weights": False}),
                      "self_causal": ((x, x, x), {"attn_mask": causal, "is_causal": True, "need_weights": False}),
                      "self_unbatched": ((single, single, single), {})})
    return calls


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("config", NN_CONFIGS)
def test_frozen_nn_mha_has_the_module_bits(config, threads, dtype, restore_threads):
    """Every kind of call of a frozen nn.MultiheadAttention gives the bits of
    the module's eval-mode forward (outputs and weights); its self-attention
    reads the packs (made only for the stacked in_proj_weight)."""
    attnc.set_num_threads(threads)
    module = nn_mha(config, dtype)
    frozen = module.freeze()
    assert (frozen._module._packed is not None) == (module.in_proj_weight is not None)
    private = frozen._module  # computes with its frozen arrays themselves, whose pointers the packs match
    _, params = private._checked_parameters(private._geometry())
    assert all(params[key] is value for key, value in private.named_parameters())
    for name, (args, kwargs) in nn_calls(config, dtype).items():
        expected, got = module(*args, **kwargs), frozen(*args, **kwargs)
        for e, g in zip(expected, got):
            assert (e is None) == (g is None), name
            if e is not None:
                assert g.dtype == e.dtype and np.array_equal(g, e), (config, name)


def test_frozen_nn_mha_matches_torch():
    """The independent oracle: torch's module loaded with the same state_dict."""
    import torch
    module = nn_mha("default", np.float64)
    twin = torch.nn.MultiheadAttention(32, 4, dtype=torch.float64)
    twin.load_state_dict({key: torch.from_numpy(np.array(value)) for key, value in module.state_dict().items()})
    frozen = module.freeze()
    for name, (args, kwargs) in nn_calls("default", np.float64).items():
        with torch.no_grad():
            t_out, t_weights = twin.eval()(*(torch.from_numpy(a) for a in args),
                                           **{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                              for k, v in kwargs.items()})
        out, weights = frozen(*args, **kwargs)
        assert_close(out, t_out.numpy(), np.float64, name)
        if weights is not None:
            assert_close(weights, t_weights.numpy(), np.float64, name)


def test_frozen_nn_mha_is_a_snapshot():
    """Edits to the module after freezing (in place, by assignment, a new
    out_proj, its layout or dtype) do not reach the frozen module; they
    reach the next freeze."""
    module = nn_mha("default")
    (x, _, _), _ = nn_calls("default", np.float32)["self"]
    before = module(x, x, x)
    frozen = module.freeze()
    module.in_proj_weight *= 2
    module.in_proj_bias[...] = 1
    module.out_proj = attnc.Linear(32, 32, rng=np.random.default_rng(9))
    module.batch_first = True
    for got, expected in zip(frozen(x, x, x), before):
        np.testing.assert_array_equal(got, expected)
    module.batch_first = False
    np.testing.assert_array_equal(module.freeze()(x, x, x)[0], module(x, x, x)[0])
    assert not np.array_equal(module(x, x, x)[0], before[0])
    wide = module.to(np.float64)
    assert frozen.dtype == np.float32 and frozen(x, x, x)[0].dtype == np.float32 and wide.dtype == np.float64


def test_frozen_nn_mha_parameters_cannot_be_made_writable():
    for config in ("default", "bias_kv", "kdim_vdim"):
        frozen = nn_mha(config).freeze()
        params = [value for _, value in frozen._module.named_parameters() if value is not None]
        assert len(params) >= 4
        for param in params:
            with pytest.raises(ValueError):
                param.flags.writeable = True
            with pytest.raises(ValueError):
                param[...] = 0


def test_frozen_nn_mha_packs_made_at_one_level_are_not_read_at_another(restore_threads):
    if len(KERNEL_LEVELS) < 2:
        pytest.skip("this CPU has one kernel level")
    module = nn_mha("default")
    (x, _, _), _ = nn_calls("default", np.float32)["self"]
    frozen = module.freeze()  # at the best level
    for level in KERNEL_LEVELS[:-1]:
        for _ in at_level(level):
            np.testing.assert_array_equal(frozen(x, x, x)[0], module(x, x, x)[0])


class OverridingNN(attnc.nn.MultiheadAttention):
    def forward(self, *args, **kwargs):
        out, weights = super().forward(*args, **kwargs)
        return out * 2, weights


class CallingNN(attnc.nn.MultiheadAttention):
    def __call__(self, query, *args, **kwargs):
        return super().__call__(np.clip(query, -1, 1), *args, **kwargs)


class InheritingNN(attnc.nn.MultiheadAttention):
    pass


def test_frozen_nn_mha_refuses_what_it_cannot_reproduce():
    with pytest.raises(TypeError, match="^module: OverridingNN overrides forward"):
        OverridingNN(8, 2).freeze()
    with pytest.raises(TypeError, match="^module: CallingNN overrides __call__"):
        CallingNN(8, 2).freeze()
    with pytest.raises(TypeError, match="^module: expected an attnc.nn.MultiheadAttention, got MultiHeadAttention"):
        attnc.nn.FrozenMultiheadAttention(attnc.MultiHeadAttention(8, 2))
    sub = InheritingNN(8, 2, rng=np.random.default_rng(0)).eval()
    x = np.ones((3, 1, 8), np.float32)
    np.testing.assert_array_equal(sub.freeze()(x, x, x)[0], sub(x, x, x)[0])


def test_frozen_nn_mha_names_a_bad_parameter_and_bad_input():
    module = nn_mha("default")
    frozen = module.freeze()
    with pytest.raises(ValueError, match="^query: "):
        frozen(np.ones((5, 2, 31), np.float32), np.ones((5, 2, 32)), np.ones((5, 2, 32)))
    x = np.ones((5, 2, 32), np.float32)
    with pytest.raises(ValueError, match="^key_padding_mask: "):
        frozen(x, x, x, key_padding_mask=np.zeros((2, 4), bool))
    module.in_proj_weight = np.zeros((95, 32), np.float32)
    with pytest.raises(ValueError, match="^in_proj_weight: "):
        module.freeze()
    module.in_proj_weight = None
    with pytest.raises(ValueError, match="^in_proj_weight: "):
        module.freeze()


def test_frozen_nn_mha_pickles_copies_and_cannot_be_set():
    module = nn_mha("batch_first")
    (x, _, _), _ = nn_calls("batch_first", np.float32)["self"]
    frozen = module.freeze()
    expected = module(x, x, x)
    loaded = pickle.loads(pickle.dumps(frozen))
    assert loaded._module._packed is not None
    for got, want in zip(loaded(x, x, x), expected):
        np.testing.assert_array_equal(got, want)
    assert copy.copy(frozen) is frozen and copy.deepcopy(frozen) is frozen
    assert repr(frozen) == "FrozenMultiheadAttention(embed_dim=32, num_heads=4, batch_first=True, dtype=float32)"
    with pytest.raises(AttributeError, match="^_module: "):
        frozen._module = module
    with pytest.raises(AttributeError, match="^_module: "):
        del frozen._module
    np.testing.assert_array_equal(frozen(x, x, x)[0], expected[0])
    assert module._packed is None and "_packed" not in pickle.loads(pickle.dumps(frozen._module)).__dict__


def test_frozen_nn_mha_from_many_threads(restore_threads):
    attnc.set_num_threads(2)
    module = nn_mha("default")
    (x, _, _), _ = nn_calls("default", np.float32)["self"]
    frozen = module.freeze()
    assert_same_from_threads(lambda: frozen(x, x, x, need_weights=False)[0], module(x, x, x, need_weights=False)[0])


def test_freeze_checks_the_dropout_probability_as_a_forward_does():
    """Regression (API audit): an eval-mode forward of a module whose dropout p was set to
    5 raises ValueError naming it, but freeze() took the module (a frozen call has no
    dropout). freeze() now checks it as the forward does; a valid p is taken."""
    module = attnc.SelfAttentionV3(8, rng=np.random.default_rng(0)).eval()
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    module.attention_dropout.p = 5
    for call in (lambda: module(x), module.freeze):
        with pytest.raises(ValueError, match=r"^attention_dropout.p: expected a probability in \[0, 1\]"):
            call()
    module.attention_dropout.p = 0.3
    np.testing.assert_array_equal(module.freeze()(x), module(x))
