"""The package's global generator and the seeds kernels key their
counter-based RNG with (the C layer calls draw_seed when dropout applies)."""
import numpy as np

_global = np.random.default_rng()


def manual_seed(n):
    """Reset the global generator used by modules and functions given rng=None."""
    global _global
    _global = np.random.default_rng(n)


def generator(rng=None):
    """The generator to draw from now: `rng`, or the current global one."""
    return _global if rng is None else rng


def draw_seed(rng=None):
    """A fresh 64-bit key for one dropout mask."""
    return int(generator(rng).integers(0, 2**64, dtype=np.uint64))
