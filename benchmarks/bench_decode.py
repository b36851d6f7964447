"""Decode against long key/value caches: attnc against torch SDPA, and against the
machine's read bandwidth, side by side in one run (benchmarks, not tests).

Cases and their targets:
  D1  q (1, 32, L, 128) against k, v (1, 32, 8192, 128) float32, bottom-right causal
      (a KV-cache step), L in {1, 4, 16}. Targets for L = 1: attnc <= 0.5x torch SDPA,
      and attnc reads K and V at >= 70% of the read bandwidth measured below.
  D2  the same with grouped-query attention, 8 key/value heads for the 32 query heads
      (enable_gqa). Target: <= 0.35x D1's time (K and V are 4x smaller, read once per group).
Read bandwidth: the best of a single-threaded and a two-threaded sum of a 512 MiB array
(NumPy releases the GIL in reductions). Every result is checked against torch before
it is timed; each sample is the best of back-to-back blocks after a warm-up and a pause.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_decode.py
"""
import argparse
import threading
import time

import numpy as np

import attnc
from attnc import functional as F

THREADS = 2
KEYS, HEADS, KV_HEADS, HEAD_DIM = 8192, 32, 8, 128


def best_ms(fn, blocks=7, calls=3):
    fn()
    time.sleep(0.2)
    fn()
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return min(times) * 1e3


def read_bandwidth_gbs():
    array = np.ones(512 * 2**20 // 4, np.float32)
    halves = np.array_split(array, THREADS)

    def two_threads():
        workers = [threading.Thread(target=np.add.reduce, args=(half,)) for half in halves]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    seconds = min(best_ms(lambda: np.add.reduce(array)), best_ms(two_threads)) / 1e3
    return array.nbytes / seconds / 1e9


def case(torch, L, kv_heads):
    rng = np.random.default_rng(L + kv_heads)
    q = rng.standard_normal((1, HEADS, L, HEAD_DIM), dtype=np.float32)
    k, v = (rng.standard_normal((1, kv_heads, KEYS, HEAD_DIM), dtype=np.float32) for _ in range(2))
    gqa = kv_heads != HEADS
    mine = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",  # noqa: E731
                                                   enable_gqa=gqa)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    mask = torch.ones(L, KEYS, dtype=torch.bool).tril(KEYS - L)  # bottom-right causal, as an explicit mask
    theirs = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        tq, tk, tv, attn_mask=None if L == 1 else mask, enable_gqa=gqa).numpy()
    error = np.abs(mine() - theirs()).max()
    assert error < 1e-4, f"attnc differs from torch by {error}"
    return mine, theirs, k.nbytes + v.nbytes


def main():
    argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0]).parse_args()
    import torch
    torch.set_num_threads(THREADS)
    attnc.set_num_threads(THREADS)
    bandwidth = read_bandwidth_gbs()
    print(f"read bandwidth (best of 1 and {THREADS} threads summing 512 MiB): {bandwidth:.1f} GB/s")
    decode_ms = None
    for kv_heads in (HEADS, KV_HEADS):
        for L in (1, 4, 16):
            mine, theirs, kv_bytes = case(torch, L, kv_heads)
            attnc_ms, torch_ms = best_ms(mine), best_ms(theirs)
            rate = kv_bytes / attnc_ms / 1e6
            line = (f"{'D2 GQA ' + str(kv_heads) + ' kv heads' if kv_heads != HEADS else 'D1'} L={L:2d}: attnc "
                    f"{attnc_ms:6.2f} ms, torch {torch_ms:6.2f} ms, attnc/torch {attnc_ms / torch_ms:.2f}, "
                    f"K+V read at {rate:.1f} GB/s ({rate / bandwidth:.0%} of the bandwidth)")
            if kv_heads == HEADS and L == 1:
                decode_ms = attnc_ms
            if kv_heads != HEADS and L == 1:
                line += f", {attnc_ms / decode_ms:.2f}x D1's time"
            print(line, flush=True)


if __name__ == "__main__":
    main()
