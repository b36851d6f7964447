"""examples/dask_batch.py on a dask.distributed.LocalCluster of two worker
processes: the module travels to the workers by pickle, each task attends over
a chunk of the batch, and the result is bit for bit the single-process call's
(attnc computes each item alone, whatever batch it is in) and the float64
oracle's within the float tolerance. The cluster and its processes are gone
after the last test."""
import importlib.util
import os
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import psutil
import pytest
from dask.distributed import Client, LocalCluster

import attnc
from toolkit import assert_close, ref_module

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dask_batch.py"
spec = importlib.util.spec_from_file_location("dask_batch", EXAMPLE)
dask_batch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dask_batch)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    scratch = {"temporary-directory": str(tmp_path_factory.mktemp("dask"))}   # not /tmp/dask-scratch-space
    with dask.config.set(scratch), \
            LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.run(attnc._C.set_simd_level, attnc._C.simd_level())   # the kernels of the single-process call
        worker_pids = list(client.run(os.getpid).values())
        assert len(set(worker_pids)) == 2 and os.getpid() not in worker_pids
        yield client
    assert not [pid for pid in worker_pids if psutil.pid_exists(pid)], "worker processes outlived the cluster"


BATCH, SEQ, DIM, CHUNK = 10, 7, 16, 3   # chunks of 3, 3, 3 and 1 items


def padding(rng, mask_shape):
    """1 for each item's first keys (a random count), 0 for its padding: (BATCH, 1.., SEQ)."""
    keep = np.arange(SEQ) < rng.integers(1, SEQ + 1, size=(BATCH, 1))
    return keep.reshape(mask_shape).astype(np.int64)


def multi_head(dtype):
    return attnc.MultiHeadAttention(DIM, 4, dtype=dtype, rng=np.random.default_rng(0))


CASES = {   # the module and its mask
    "MultiHeadAttention": (multi_head, lambda rng: None),
    "MultiHeadAttention-padding": (multi_head, lambda rng: padding(rng, (BATCH, 1, 1, SEQ))),
    "MultiHeadAttention-one-mask-for-all": (multi_head, lambda rng: np.tril(np.ones((1, 1, SEQ, SEQ)))),
    "SelfAttention-wider-output-padding": (
        lambda dtype: attnc.SelfAttention(DIM, 8, 12, dtype=dtype, rng=np.random.default_rng(0)),
        lambda rng: padding(rng, (BATCH, 1, SEQ))),
}


@pytest.mark.parametrize("case", CASES)
def test_chunks_on_workers_equal_the_single_process_call(client, case, dtype):
    make_module, make_mask = CASES[case]
    module = make_module(dtype).eval()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, SEQ, DIM)).astype(dtype)
    mask = make_mask(rng)
    lazy = dask_batch.attend(module, da.from_array(x, chunks=(CHUNK, -1, -1)), mask)
    assert lazy.numblocks == (4, 1, 1)
    output = client.compute(lazy).result()
    expected = module(x) if mask is None else module(x, mask)
    assert output.dtype == dtype and np.array_equal(output, expected)
    assert_close(output, ref_module(module, x, mask)[0], dtype, case)


def test_the_example_runs_on_a_scheduler_address(client, capsys):
    status = dask_batch.main(["--scheduler", client.scheduler.address, "--batch", "40", "--chunk", "16",
                              "--seq", "8", "--dim", "16", "--heads", "4"])
    text = capsys.readouterr().out
    assert status == 0 and "x (40, 8, 16) in 3 chunks" in text, text
    assert "cluster result == single-process result: True" in text, text


def test_a_mask_of_another_batch_is_refused():
    x = da.zeros((BATCH, SEQ, DIM), chunks=(CHUNK, -1, -1), dtype=np.float32)
    with pytest.raises(ValueError, match=r"attention_mask must have the batch \(10\) or 1 as its first axis"):
        dask_batch.attend(multi_head(np.float32).eval(), x, np.ones((BATCH - 1, 1, 1, SEQ)))
