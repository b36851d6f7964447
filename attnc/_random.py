"""The package's global generator and the seeds kernels key their
counter-based RNG with (the C layer calls draw_seed when dropout applies)."""
import numpy as np

from ._checks import is_a_bool

_global = np.random.default_rng()


def manual_seed(n):
    """Reset the package's global generator, used wherever ``rng=None``.

    Modules and functions given ``rng=None`` draw their initial weights
    and dropout seeds from the global generator at each draw; after
    ``manual_seed(n)`` they draw the same values again.

    Parameters
    ----------
    n : int or None
        The seed, anything ``numpy.random.default_rng`` takes (an int >=
        0, a sequence of them, a ``SeedSequence``); None: fresh entropy
        from the operating system.

    Raises
    ------
    ValueError
        For a negative seed, naming `n` (with NumPy's message).
    TypeError
        For a seed that is not an integer, naming `n` (with NumPy's
        message), and for a bool, alone or in a sequence (NumPy would take
        True as 1).

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> attnc.manual_seed(0)
    >>> first = attnc.Linear(2, 2).weight
    >>> attnc.manual_seed(0)
    >>> np.array_equal(first, attnc.Linear(2, 2).weight)
    True
    """
    global _global
    try:
        if is_a_bool(n) or (isinstance(n, (list, tuple)) and any(is_a_bool(entropy) for entropy in n)):
            raise TypeError("a bool is not a seed")  # (NumPy takes True as 1, and in a sequence too)
        _global = np.random.default_rng(n)
    except (TypeError, ValueError) as error:
        raise type(error)(f"manual_seed: n={n!r} is not a seed numpy.random.default_rng takes: {error}") from None


def generator(rng=None):
    """The generator to draw from now: `rng`, or the current global one."""
    return _global if rng is None else rng


def draw_seed(rng=None):
    """A fresh 64-bit key for one dropout mask."""
    return int(generator(rng).integers(0, 2**64, dtype=np.uint64))
