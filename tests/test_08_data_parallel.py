"""Lesson 08's pure parts, in one process: bucket packing, the uneven-shard loss arithmetic, and what
lessons/data_parallel/show.py says of the overlap figures (no MPI)."""
import argparse
import math
import os
import subprocess
import sys

import pytest

from common import bootstrap, shards
from conftest import ROOT, check_nps, load_lesson, worst_over_seeds
from lessons.data_parallel import budget, show

PATH = os.path.join(ROOT, "lessons", "08_data_parallel.py")


dp = load_lesson("08_data_parallel.py")


def test_loading_the_lesson_imports_neither_mpi_nor_torch():
    code = (f"import importlib.util, sys; sys.path.insert(0, {ROOT!r}); "
            f"s = importlib.util.spec_from_file_location('m', {PATH!r}); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(sorted(k for k in ('mpi4py.MPI', 'torch', 'cupy') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- bucket packing -------------------------------------------------------------------------------

CASES = [([4, 4, 4, 4, 4], 8), ([1, 2, 3, 4, 5, 6, 7], 7), ([10, 1, 1, 1, 30, 2], 5), ([3], 1),
         ([0, 5, 0, 5], 5), ([8] * 32, 64), ([100, 1, 100], 100), ([4, 4, 4, 4, 4, 4, 4], 10)]


@pytest.mark.parametrize("nbytes, cap", CASES)
def test_buckets_reverse_order_close_at_the_cap_and_every_tensor_once(nbytes, cap):
    plan = dp.pack_buckets(nbytes, cap)
    flat = [i for b in plan for i in b]
    assert flat == list(reversed(range(len(nbytes))))      # last parameter first, each exactly once
    for b in plan[:-1]:                                    # DDP's rule: a bucket closes once it holds the cap,
        assert sum(nbytes[i] for i in b) >= cap            # and not one tensor earlier
        assert sum(nbytes[i] for i in b[:-1]) < cap


@pytest.mark.parametrize("nbytes, cap", [c for c in CASES if all(x % 4 == 0 for x in c[0]) and c[1] % 4 == 0]
                         + [([4, 4, 400, 4, 4], 16), ([12] * 7, 20), ([12] * 7, 24), ([40, 4, 4, 4, 40], 44)])
def test_buckets_are_the_ones_ddp_itself_computes(nbytes, cap):
    """torch's own assignment (the function DDP's rebuild uses), given the tensors in the order backward
    makes their gradients (last first), groups them exactly as the lesson does."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    ready = [torch.zeros(b // 4) for b in reversed(nbytes)]   # float32: 4 bytes each
    theirs, _ = dist._compute_bucket_assignment_by_size(ready, [cap])
    last = len(nbytes) - 1
    assert [[last - i for i in b] for b in theirs] == dp.pack_buckets(nbytes, cap)


def test_a_bucket_may_pass_the_cap_by_one_tensor():
    assert dp.pack_buckets([1, 1, 50, 1, 1], 4) == [[4, 3, 2], [1, 0]]
    assert dp.pack_buckets([50, 1], 4) == [[1, 0]]
    assert dp.pack_buckets([], 4) == []


@pytest.mark.parametrize("depth, size, cap", [(32, 32768, 262144), (32, 16384, 262144), (10, 524288, 1048576),
                                              (10, 524288, 300000), (7, 3, 10), (5, 4, 4), (6, 9, 100),
                                              (32, 32768, 314572)])
def test_uniform_tensors_match_the_yaml_closed_forms(depth, size, cap):
    per = math.ceil(cap / size)
    plan = dp.pack_buckets([size] * depth, cap)
    assert len(plan) == math.ceil(depth / per)                 # the YAML's bucket count
    assert len(plan[0]) * size == min(depth, per) * size       # the YAML's first bucket


# ---- the uneven-shard loss arithmetic -----------------------------------------------------------------

def grads(torch, model, loss):
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])


def test_sum_over_global_batch_is_exact_and_mean_of_means_is_not():
    torch = pytest.importorskip("torch")
    batch, n = 64, 3                                       # shards 22, 21, 21
    model = dp.tiny_mlp(torch, torch.float64, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, dp.FEATURES, generator=gen, dtype=torch.float64)
    y = torch.randn(batch, 1, generator=gen, dtype=torch.float64)
    full = grads(torch, model, dp.per_sample_loss(model, x, y).mean())
    bounds = shards.chunk_bounds(batch, n)
    parts = [grads(torch, model, dp.per_sample_loss(model, x[a:b], y[a:b]).sum() / batch) for a, b in bounds]
    means = [grads(torch, model, dp.per_sample_loss(model, x[a:b], y[a:b]).mean()) for a, b in bounds]
    ddp = [grads(torch, model, dp.per_sample_loss(model, x[a:b], y[a:b]).sum() * n / batch) for a, b in bounds]
    assert float((sum(parts) - full).abs().max()) < 1e-14          # sum / B, then SUM: the full gradient
    assert float((sum(ddp) / n - full).abs().max()) < 1e-14        # DDP's / N undoes the * N
    assert float((sum(means) / n - full).abs().max()) > 1e-6       # mean of means: wrong on uneven shards
    equal = [grads(torch, model, dp.per_sample_loss(model, x[a:b], y[a:b]).mean())
             for a, b in shards.chunk_bounds(batch, 4)]            # 4 shards of 16: equal, so right
    assert float((sum(equal) / 4 - full).abs().max()) < 1e-14


def test_per_sample_abs_is_the_loop_over_rows_and_the_budget_tells_orders_from_a_wrong_mean():
    """per_sample_abs = sum over rows of |one row's gradient / B|; the full batch's gradient and the sum of
    3 shards' (sum / B) stay inside the step's parity budget, the mean of uneven shards' means does not."""
    torch = pytest.importorskip("torch")
    batch = 64
    model = dp.tiny_mlp(torch, torch.float32, torch.device("cpu"), seed=3)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, dp.FEATURES, generator=gen), torch.randn(batch, 1, generator=gen)
    rows = [grads(torch, model, dp.per_sample_loss(model, x[i:i + 1], y[i:i + 1]).sum() / batch) for i in range(batch)]
    got = budget.per_sample_abs(torch, model, x, y, batch)
    assert torch.allclose(got, sum(r.abs().double() for r in rows), rtol=1e-5, atol=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    full = grads(torch, model, dp.per_sample_loss(model, x, y).mean())
    dg = budget.Drift(torch, "float32", batch, 0.05, 0.9).step(model, opt, x, y)
    bounds = shards.chunk_bounds(batch, 3)
    parts = [grads(torch, model, dp.per_sample_loss(model, x[a:b], y[a:b]).sum() / batch) for a, b in bounds]
    means = [grads(torch, model, dp.per_sample_loss(model, x[a:b], y[a:b]).mean()) for a, b in bounds]
    assert budget.ratio(torch, [sum(parts)], [full], dg) <= 1
    assert budget.ratio(torch, [sum(means) / 3], [full], dg) > 10


# every value lesson 08 grades against the oracle's budget (|difference| / budget, <= 1 inside)
BUDGETED = ("a_vs_b_ratio", "a_vs_c_ratio", "c_vs_b_ratio", "exact_grad_ratio", "bucket_ratio", "overlap_ratio")


def budgeted(doc):
    """The worst budgeted ratio of one run, over its ranks."""
    return max(r[k] for r in doc["ranks"] for k in BUDGETED)


def worst_08(tmp_path, n, seeds, dtype):
    """Lesson 08 at n ranks for each seed, with its YAML's --steps 3 --reps 1: every check passes;
    the worst budgeted ratio over them."""
    return worst_over_seeds(tmp_path, "08", n, seeds, budgeted, dtype=dtype, timeout=400,
                            args=("--steps", "3", "--reps", "1"))


@pytest.mark.torch
@pytest.mark.parametrize("n", [3, 5])
def test_correct_runs_stay_inside_the_budget_for_3_seeds(tmp_path, n):
    assert worst_08(tmp_path, n, range(3), "float32") <= 1


@pytest.mark.sweep  # the check NPs x 20 seeds: minutes an NP; pytest -m sweep
@pytest.mark.torch
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", check_nps("08"))
def test_correct_runs_stay_inside_the_budget_for_20_seeds(tmp_path, n, dtype):
    """The issue's bar (41): the NPs `bin/tutor check` runs (the YAML's np.check), 20 seeds each,
    both dtypes (minutes per NP on 2 cores)."""
    assert worst_08(tmp_path, n, range(20), dtype) <= 1


# ---- small helpers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["0", "-3", "x", "nan", "inf"])
def test_positive_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        bootstrap.positive(float)(text)


def test_positive_accepts_and_overlap_formula():
    assert bootstrap.positive(int)("7") == 7 and bootstrap.positive(float)("0.25") == 0.25
    assert dp.overlap_of(10.0, 4.0, 10.0) == 1.0    # comm fully hidden behind compute
    assert dp.overlap_of(14.0, 4.0, 10.0) == 0.0    # one after the other
    assert dp.overlap_of(1.0, 0.0, 1.0) == 0.0      # nothing to hide


@pytest.mark.parametrize("after, hooks, done, says", [
    (0.0, 0.6, [1, 2], "communication ran during backward"),
    (0.0, 0.6, [0, 0], "does not show communication done during backward"),
    (0.1, -0.5, [0, 1], "did worse"),
    (0.1, 0.2, [0, 1], "no overlap shown"),
])
def test_the_overlap_figures_are_read_as_measured(after, hooks, done, says):
    from types import SimpleNamespace
    s = {"overlap_after": after, "overlap_hooks": hooks, "done_after_backward": done, "calls_bucketed": 4}
    for transport, words in (("mpi", "Test() calls"), ("gloo", "worker threads"), ("nccl", "CUDA stream")):
        ctx = SimpleNamespace(world_size=2, transport=transport)
        text = " ".join(show.where_it_runs(ctx, s))
        assert says in text and words in text, text
    assert "nothing to hide" in " ".join(show.where_it_runs(SimpleNamespace(world_size=1, transport="mpi"), s))
