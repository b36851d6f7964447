"""attnc: self-attention and multi-head attention for NumPy, computed in C."""
# The extension first: every other module needs it, and without it they fail
# with a misleading circular-import message.
try:
    from ._C import get_num_threads, set_num_threads
except ModuleNotFoundError as error:
    if error.name != __name__ + "._C":
        raise
    import importlib.machinery
    import os

    _package = os.path.dirname(os.path.abspath(__file__))
    raise ImportError(
        f"the attnc source directory {_package} has no compiled extension "
        f"(attnc/_C{importlib.machinery.EXTENSION_SUFFIXES[0]}). Python looks first in the current "
        "directory (or the script's), so when that is attnc's repository root it imports these sources "
        "instead of an installed attnc. Run `pip install -e .` in "
        f"{os.path.dirname(_package)} to build the extension there, or run Python from another directory."
    ) from None
from . import functional, nn, optim
from ._random import manual_seed
from .attention import (
    MultiHeadAttention,
    MultiHeadSelfAttention,
    SelfAttention,
    SelfAttentionInterview,
    SelfAttentionV1,
    SelfAttentionV2,
    SelfAttentionV3,
    SelfAttentionV4,
)
from .convert import from_torch
from .frozen import FrozenAttention
from .module import Dropout, Linear, Module

__version__ = "0.1.0"

__all__ = [
    "Module", "Linear", "Dropout",
    "SelfAttentionV1", "SelfAttentionV2", "SelfAttentionV3", "SelfAttentionV4", "SelfAttentionInterview",
    "MultiHeadAttention", "SelfAttention", "MultiHeadSelfAttention", "FrozenAttention",
    "functional", "nn", "optim", "from_torch", "manual_seed", "set_num_threads", "get_num_threads", "__version__",
]
