"""attnc: self-attention and multi-head attention for NumPy, computed in C."""
from . import functional, nn, optim
from ._C import get_num_threads, set_num_threads
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
from .module import Dropout, Linear, Module

__version__ = "0.1.0"

__all__ = [
    "Module", "Linear", "Dropout",
    "SelfAttentionV1", "SelfAttentionV2", "SelfAttentionV3", "SelfAttentionV4", "SelfAttentionInterview",
    "MultiHeadAttention", "SelfAttention", "MultiHeadSelfAttention",
    "functional", "nn", "optim", "from_torch", "manual_seed", "set_num_threads", "get_num_threads", "__version__",
]
