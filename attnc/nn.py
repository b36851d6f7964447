"""attnc.nn: the modules, as torch.nn holds torch's.

The documents' attention classes (their names and parameter keys), the
building blocks Module, Linear and Dropout, MultiheadAttention, the twin
of torch.nn.MultiheadAttention, and FrozenMultiheadAttention, what its
freeze() returns. The documents' own multi-head class is
attnc.MultiHeadAttention, at the top level only: no two public names here
differ only by letter case.
"""
from .attention import (
    MultiHeadSelfAttention,
    SelfAttention,
    SelfAttentionInterview,
    SelfAttentionV1,
    SelfAttentionV2,
    SelfAttentionV3,
    SelfAttentionV4,
)
from .frozen import FrozenMultiheadAttention
from .module import Dropout, Linear, Module
from .multihead import MultiheadAttention

__all__ = [
    "Module", "Linear", "Dropout",
    "SelfAttentionV1", "SelfAttentionV2", "SelfAttentionV3", "SelfAttentionV4", "SelfAttentionInterview",
    "SelfAttention", "MultiHeadSelfAttention", "MultiheadAttention", "FrozenMultiheadAttention",
]
