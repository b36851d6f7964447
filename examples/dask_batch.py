"""Self-attention over a batch too large for one machine, on a Dask cluster.

`attend(module, x, attention_mask)` is `module(x, attention_mask)` for a
`dask.array` x of shape (batch, seq, dim): one task per chunk of the batch,
each calling the module on its chunk in a worker process. attnc computes each
item alone (an item's output does not depend on the batch it is in), so the
result is bit for bit the single-process call's: the chunks only split the
work. This holds between processes that run the same kernel level
(`attnc._C.simd_level()`): portable and AVX2 kernels differ in the last bits.
So `main` pins every worker to this process's level; on a cluster whose CPUs
lack it that call fails: drop it, and the results agree to float rounding.

The module travels by pickle: it is one key of the task graph, pickled once,
sent to the scheduler and copied to each worker that runs a chunk. Use it in
evaluation mode (`module.eval()`): in training mode the dropout masks would
depend on which worker ran which chunk, and in what order.

Run it on this machine (a `dask.distributed.LocalCluster` of worker processes):

    python examples/dask_batch.py

and on a real cluster, the same code with the scheduler's address:

    dask scheduler                                 # on one machine: prints tcp://host:8786
    dask worker tcp://host:8786 --nthreads 1       # on each machine (attnc's own threads use its cores)
    python examples/dask_batch.py --scheduler tcp://host:8786

Every worker needs NumPy and attnc installed (the same version as the client,
since the module is unpickled there); the client needs dask[distributed]. Here
the batch is drawn by the workers and the whole result comes back to this
process, to be checked against the single-process call. For a batch that does
not fit in one machine, read x where the workers can reach it (for example
`da.from_zarr`, chunked along the batch) and write the result the same way
(`attend(...).to_zarr(...)`): then no chunk ever passes through the client.
"""
import argparse
import contextlib
import time

import dask
import dask.array as da
import numpy as np
from dask.distributed import Client, LocalCluster

import attnc


def attend(module, x, attention_mask=None):
    """module(x, attention_mask) on Dask, one task per chunk of the batch (lazy).

    module: an attnc attention module called as module(x[, attention_mask]),
        e.g. attnc.MultiHeadAttention in evaluation mode.
    x: a dask array (batch, seq, dim); only its batch axis may be chunked
        (attention needs whole sequences, so other chunks are merged).
    attention_mask: None, or a NumPy or dask array shaped as the module takes
        it, whose first axis is the batch or 1 (one mask for every item): e.g.
        (batch, 1, 1, seq) or (1, 1, seq, seq) for MultiHeadAttention.
    Returns a dask array (batch, seq, out_features) of the module's dtype,
    chunked as x along the batch.
    """
    if x.ndim != 3:
        raise ValueError(f"x must be (batch, seq, dim), got shape {x.shape}")
    x = x.rechunk({1: -1, 2: -1})
    chunk_args = [x, "bse"]
    if attention_mask is not None:
        mask = da.asarray(attention_mask)
        if mask.ndim < 1 or mask.shape[0] not in (1, x.shape[0]):
            raise ValueError(f"attention_mask must have the batch ({x.shape[0]}) or 1 as its first axis, "
                             f"got shape {mask.shape}")
        mask = da.broadcast_to(mask, x.shape[:1] + mask.shape[1:])
        mask = mask.rechunk((x.chunks[0],) + (-1,) * (mask.ndim - 1))   # x's chunks of the batch, whole otherwise
        chunk_args += [mask, ("b",) + tuple(f"mask axis {axis}" for axis in range(1, mask.ndim))]
    empty = module(np.zeros((0,) + x.shape[1:], module.dtype))   # an empty batch: the output's dtype and width
    return da.blockwise(
        type(module).__call__, "bso",              # Module.__call__(module, x_chunk[, mask_chunk])
        dask.delayed(module), None,                # one graph key: pickled once, copied to each worker
        *chunk_args,
        new_axes={"o": empty.shape[-1]}, meta=empty, concatenate=True)


def padding_mask(lengths, seq):
    """(batch, 1, 1, seq): 1 for an item's first lengths[i] positions, 0 for its padding."""
    keep = da.arange(seq) < lengths[:, None]
    return keep[:, None, None, :].astype(np.int8)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scheduler", help="a running scheduler, e.g. tcp://host:8786 "
                                            "(default: a LocalCluster on this machine)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=512, help="items per task")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    args = parser.parse_args(argv)

    module = attnc.MultiHeadAttention(args.dim, args.heads, rng=np.random.default_rng(0)).eval()
    draw = da.random.default_rng(1)   # the batch is drawn by the workers, chunk by chunk
    x = draw.standard_normal((args.batch, args.seq, args.dim), chunks=(args.chunk, -1, -1)).astype(np.float32)
    mask = padding_mask(draw.integers(1, args.seq + 1, size=args.batch, chunks=args.chunk), args.seq)

    with contextlib.ExitStack() as stack:
        if args.scheduler:
            client = stack.enter_context(Client(args.scheduler))
        else:
            cluster = stack.enter_context(LocalCluster(
                n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None))
            client = stack.enter_context(Client(cluster))
        client.run(attnc._C.set_simd_level, attnc._C.simd_level())   # the same kernels as this process
        print(f"{len(client.scheduler_info()['workers'])} workers at {client.scheduler.address}; "
              f"x {x.shape} in {x.numblocks[0]} chunks of up to {args.chunk} items")
        start = time.perf_counter()
        output, x_values, mask_values = client.compute([attend(module, x, mask), x, mask], sync=True)
        print(f"on the cluster: {time.perf_counter() - start:.2f} s (with drawing x and moving it here)")

    start = time.perf_counter()
    expected = module(x_values, mask_values)
    print(f"in this process: {time.perf_counter() - start:.2f} s")
    equal = np.array_equal(output, expected)
    print("cluster result == single-process result:", equal)
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
