"""Docstring fragments the attention classes share (attnc.attention, attnc.nn.MultiheadAttention)."""
import inspect
import re
import textwrap

# What the docstrings of these classes (and of attnc.nn.MultiheadAttention)
# say alike, written once. In the docstring of a class decorated with
# `shared_docs`, or of a method it defines, a line that holds only {name}
# stands for _DOC_FRAGMENTS[name], indented to that line (a fragment may hold
# such lines too); the class-specific text stays inline.
_DOC_FRAGMENTS = {
    "dtype": """\
dtype : data-type, default numpy.float32
    The module dtype, float16, bfloat16 (``ml_dtypes.bfloat16`` or
    ``"bfloat16"``, with ml_dtypes), float32 or float64: parameters are
    stored and outputs returned in it (16-bit modules compute in
    float32 and round each step's result).""",
    "rng": """\
rng : numpy.random.Generator, optional
    Draws the initial weights; None: the package's global generator
    (see ``attnc.manual_seed``).""",
    "rng_with_dropout": """\
rng : numpy.random.Generator, optional
    Draws the initial weights and the dropout masks; None: the
    package's global generator (see ``attnc.manual_seed``).""",
    "dropout_probability": """\
The probability of dropping each attention weight in training
mode, in ``[0, 1]``.""",
    "constructor_type_error": """\
TypeError
    If a size is not an integer, `dtype` is not one of the four (or is
    bfloat16 without ml_dtypes: the message says how to get it), or
    `rng` is neither a ``numpy.random.Generator`` nor None.""",
    "starts_in_training": """\
The module starts in training mode (dropout active), as torch's; call
`eval` for inference.""",
    "own_dtype": """\
The module computes in its own dtype: a float64 `x` given to a
float32 module gives a float32 output.""",
    "mask_summary": """\
The mask broadcasts to ``(..., seq, seq)`` (queries by keys), e.g.
``(batch, 1, seq)`` for padded keys; 1/True keeps a key, 0/False
masks it. See `forward`.""",
    "dropout_in_training": """\
In training mode (the default after construction) dropout applies to
the weights; call `eval` for inference. As in torch, the mode of the
dropout submodule (`attention_dropout`; `dropout` in
MultiHeadAttention) decides: `train` and `eval` set it with the
module's; after ``train()`` its own ``eval()`` turns dropout off, and
after ``eval()`` its own ``train()`` turns it on.""",
    "what_forward_keeps": """\
A training-mode forward keeps what `backward` needs; an eval-mode
forward keeps nothing.""",
    "x_description": """\
Leading dims are batch dims; bool, integer or floating,
converted to the module dtype.""",
    "attention_mask": """\
attention_mask : array_like, optional
    Which keys each query may attend to, broadcastable (NumPy
    rules) to the scores' shape ``(..., seq, seq)`` (queries by
    keys), e.g. ``(batch, 1, seq)`` to mask padded keys.
    {mask_values}""",
    "mask_values": """\
Bool, integer or floating. 0/False masks a position: its score
becomes -1e20 before the softmax, as the documents'
``masked_fill(mask == 0, -1e20)`` (a row masked everywhere
attends uniformly). Any other value keeps it; float masks are
not added to the scores.""",
    "return_weights": """\
return_weights : bool, default False
    Also return the attention weights, as ``(output, weights)``.""",
    "output_description": """\
A new array in the module dtype (float32 for a float64 `x` given to
a float32 module).""",
}
_FRAGMENT_LINE = re.compile(r"^( *)\{(\w+)\}$", re.MULTILINE)


def shared_docs(cls):
    """Fill the fragment lines of `cls`'s docstring and its methods' (see above)."""
    def fill(doc):
        return _FRAGMENT_LINE.sub(lambda line: textwrap.indent(fill(_DOC_FRAGMENTS[line[2]]), line[1]), doc)
    for documented in (cls, *filter(inspect.isfunction, vars(cls).values())):
        if documented.__doc__:  # None under python -OO
            documented.__doc__ = fill(documented.__doc__)
    return cls
