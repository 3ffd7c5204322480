"""The GPU double itself (tests/gpu_double): its NCCL keeps the real CuPy's signatures, gives NumPy's
answers, defers results to the stream, hangs where NCCL hangs, and makes the usual mistakes loud.

Each check is a small MPI program run under mpiexec with gpu_double.env(); rank 0 prints one
`RESULT <json>` line of every rank's values, and the test compares them with NumPy here.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from common.runner import mpi_launchers
from conftest import ROOT, processes_running, tutor
from gpu_double import env

PY = sys.executable  # the Python of the tests, and of the launcher the runner finds for it

PRELUDE = '''
import json
import numpy as np
import cupy
from cupy.cuda import nccl
from mpi4py import MPI
world = MPI.COMM_WORLD
rank, size = world.rank, world.size
null = cupy.cuda.Stream.null

def nccl_comm(comm=world):
    uid = comm.bcast(nccl.get_unique_id() if comm.rank == 0 else None)
    return nccl.NcclCommunicator(comm.size, uid, comm.rank)

def host(x):
    return x.get().tolist()

def failure(fn):
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

def report(**values):
    rows = world.gather(values)
    if rank == 0:
        print("RESULT " + json.dumps(rows), flush=True)
'''


def start(tmp_path, body, n, extra_env=None):
    script = tmp_path / "prog.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    cmd = [*mpi_launchers.mpiexec(n), "-n", str(n), PY, "-m", "mpi4py", str(script)] if n else [PY, str(script)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env(tmp_path), **(extra_env or {})}, start_new_session=True)
    return proc, script


def kill(proc, script):
    os.killpg(proc.pid, signal.SIGKILL)  # mpiexec, its proxies and the ranks share the group
    out, err = proc.communicate()
    end = time.monotonic() + 10
    while processes_running(str(script)) and time.monotonic() < end:  # SIGKILL lands, not at once
        time.sleep(0.05)
    assert not processes_running(str(script)), "a rank outlived its killed mpiexec"
    return out, err


def mpi(tmp_path, body, n=2, timeout=90, extra_env=None):
    """Run `body` on n ranks (n=0: plain python); its ranks' reported values, in rank order."""
    proc, script = start(tmp_path, body, n, extra_env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = kill(proc, script)
        pytest.fail(f"timed out after {timeout}s\n{out}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{out}\n{err[-3000:]}"
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, out + err
    return json.loads(lines[0][len("RESULT "):])


def data(r, count, dtype):
    """Each rank's input in the programs below: small integers, so every sum is exact."""
    return (np.arange(count) % 5 + r + 1).astype(dtype)


# ---- signatures ------------------------------------------------------------------------------------

BAD_CALLS = '''
import ctypes, os
import cupy_backends.cuda.libs.nccl as real
me = nccl_comm()
dummy = real.NcclCommunicator(1, bytes(128), 0)    # the stub libnccl makes the real calls no-ops
x = cupy.zeros(4, dtype=cupy.float32)
p, f32, s = x.data.ptr, nccl.NCCL_FLOAT32, null.ptr
cases = {
    "one argument short": ("allReduce", (p, p, 4, f32, 0), {}),
    "one argument too many": ("allReduce", (p, p, 4, f32, 0, s, 0), {}),
    "unknown keyword": ("allReduce", (p, p, 4, f32, 0), {"strm": s}),
    "keywords by the real names": ("allReduce", (), dict(sendbuf=p, recvbuf=p, count=4, datatype=f32,
                                                       op=0, stream=s)),
    "twice the same argument": ("allReduce", (p, p, 4, f32, 0, s), {"sendbuf": p}),
    "a float pointer": ("allReduce", (float(p), p, 4, f32, 0, s), {}),
    "a NumPy integer pointer": ("allReduce", (np.int64(p), p, 4, f32, 0, s), {}),
    "a negative count": ("allReduce", (p, p, -1, f32, 0, s), {}),
    "a string peer": ("send", (p, 4, f32, "1", s), {}),
    "send without a peer": ("send", (p, 4, f32, s), {}),
    "recvcount by name": ("reduceScatter", (p, p), dict(recvcount=2, datatype=f32, op=0, stream=s)),
    "rank_id with an argument": ("rank_id", (0,), {}),
}
def outcome(fn):
    return (failure(fn) or "ok").split(":")[0]
got = {name: (outcome(lambda: getattr(dummy, m)(*a, **k)), outcome(lambda: getattr(me, m)(*a, **k)))
       for name, (m, a, k) in cases.items()}
got["NcclCommunicator with a str id"] = (outcome(lambda: real.NcclCommunicator(1, "x" * 128, 0)),
                                         outcome(lambda: nccl.NcclCommunicator(1, "x" * 128, 0)))
got["groupStart(1)"] = (outcome(lambda: real.groupStart(1)), outcome(lambda: nccl.groupStart(1)))
null.synchronize()
def names(doc):
    return [p.split("=")[0].split()[-1] for p in doc.splitlines()[0].split("(", 1)[1][:-1].split(", ")]
params = {m: (names(getattr(real.NcclCommunicator, m).__doc__)[1:],
              [q[1] for q in getattr(nccl.NcclCommunicator, m).real_params])
          for m in ("allReduce", "reduce", "bcast", "broadcast", "allGather", "reduceScatter", "send",
                    "recv")}
params["NcclCommunicator"] = (names(real.NcclCommunicator.__doc__),
                              [q[1] for q in nccl.NcclCommunicator.__init__.real_params])
constants = {k: getattr(real, k) == getattr(nccl, k) for k in dir(real) if k.startswith("NCCL_")}
def fake(line):
    return type("Fake", (), {"__doc__": line})
drift = failure(lambda: nccl.checked(fake("NcclCommunicator.send(self, intptr_t buf, size_t count)"))(
    lambda self, sendbuf, count: None))
report(got=got, params=params, constants=constants, drift=drift,
       error_is_real=nccl.NcclError is real.NcclError,
       version=[nccl.get_version(), real.get_build_version()])
'''


def test_signatures_come_from_the_real_module(tmp_path):
    [row] = mpi(tmp_path, BAD_CALLS, n=1)
    for case, (real, double) in row["got"].items():
        assert double == real, f"{case}: the real CuPy says {real}, the double {double}"
    assert row["got"]["one argument short"][0] == "TypeError"
    assert row["got"]["keywords by the real names"] == ["ok", "ok"]
    for name, (real, double) in row["params"].items():
        assert double == real and real, name
    assert row["constants"] and all(row["constants"].values()) and len(row["constants"]) >= 20
    assert row["error_is_real"]
    assert row["drift"].startswith("ImportError: GPU double: the real CuPy's send(buf, count)")
    assert row["version"][0] == row["version"][1] > 0


def test_floats_for_integers_are_refused_where_cython_would_truncate(tmp_path):
    # a deliberate difference: real CuPy truncates a float count (n / 2); the double says so
    [row] = mpi(tmp_path, '''
x = cupy.zeros(4, dtype=cupy.float32)
report(err=failure(lambda: nccl_comm().allReduce(x.data.ptr, x.data.ptr, 4 / 2, nccl.NCCL_FLOAT32,
                                                 nccl.NCCL_SUM, null.ptr)))
''', n=1)
    assert row["err"].startswith("TypeError: an integer is required") and "count" in row["err"]


def test_an_unloadable_real_module_is_an_import_error_in_one_line(tmp_path):
    proc, _ = start(tmp_path, "", 0, {"TUTOR_GPU_DOUBLE_LIBNCCL": str(tmp_path / "missing.so")})
    _, err = proc.communicate(timeout=60)  # the prelude imports cupy.cuda.nccl
    code = "from common.plumbing import devices; print(devices.gpu_ready('mpi4py', 1, (8, '')))"
    broken = {**os.environ, **env(tmp_path), "TUTOR_GPU_DOUBLE_LIBNCCL": "/no/libnccl.so.2"}
    probe = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=broken)
    assert proc.returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("ImportError: GPU double: cannot load the real cupy_backends.cuda.libs.nccl with "
                           f"{tmp_path / 'missing.so'}: "), err
    assert probe.stdout.startswith("(False, ") and "ImportError: GPU double: cannot load" in probe.stdout


# ---- values ----------------------------------------------------------------------------------------

COLLECTIVES = '''
comm, s = nccl_comm(), null
def data(r, count, dtype):
    return cupy.asarray((np.arange(count) % 5 + r + 1).astype(dtype))
n, out = 6, {}
for name, dtype, kind in [("f64", np.float64, nccl.NCCL_FLOAT64), ("i32", np.int32, nccl.NCCL_INT32),
                          ("u8", np.uint8, nccl.NCCL_UINT8), ("f16", np.float16, nccl.NCCL_FLOAT16)]:
    for op in ("SUM", "PROD", "MAX", "MIN", "AVG"):
        x, y = data(rank, n, dtype), cupy.zeros(n, dtype)
        comm.allReduce(x.data.ptr, y.data.ptr, n, kind, getattr(nccl, "NCCL_" + op), s.ptr)
        s.synchronize()
        out[f"allReduce {op} {name}"] = host(y)
x, y = data(rank, n, np.float32), cupy.full(n, -1.0, dtype=np.float32)
f32, root = nccl.NCCL_FLOAT32, size - 1
comm.reduce(x.data.ptr, y.data.ptr, n, f32, nccl.NCCL_SUM, root, s.ptr)
y0 = cupy.full(n, -1.0, dtype=np.float32)
# NCCL uses reduce's recvbuf on the root only: elsewhere any pointer will do
comm.reduce(x.data.ptr, y0.data.ptr if rank == root else 0, n, f32, nccl.NCCL_MAX, root, s.ptr)
grouped = [cupy.zeros(n, dtype=np.float32) for _ in range(2)]
nccl.groupStart()                                                # collectives may be grouped too
for op, out_ in zip((nccl.NCCL_MIN, nccl.NCCL_SUM), grouped):
    comm.allReduce(x.data.ptr, out_.data.ptr, n, f32, op, s.ptr)
nccl.groupEnd()
z = data(rank, n, np.float32)
comm.bcast(z.data.ptr, n, f32, 1, s.ptr)
b = cupy.full(n, -1.0, dtype=np.float32)
mine = data(rank, n, np.float32)   # held: a freed array's pointer faults, as on a GPU
comm.broadcast(mine.data.ptr, b.data.ptr, n, f32, 0, s.ptr)
g = cupy.full(n * size, -1.0, dtype=np.float32)
comm.allGather(x.data.ptr, g.data.ptr, n, f32, s.ptr)
big = data(rank, n * size, np.float32)
rs = cupy.full(n, -1.0, dtype=np.float32)
comm.reduceScatter(big.data.ptr, rs.data.ptr, n, f32, nccl.NCCL_SUM, s.ptr)
ip = data(rank, n, np.float32)
comm.allReduce(ip.data.ptr, ip.data.ptr, n, f32, nccl.NCCL_SUM, s.ptr)            # in place
ipg = cupy.full(n * size, -1.0, dtype=np.float32)
ipg[rank * n:(rank + 1) * n] = data(rank, n, np.float32)
comm.allGather(ipg[rank * n:].data.ptr, ipg.data.ptr, n, f32, s.ptr)               # in place
iprs = data(rank, n * size, np.float32)
comm.reduceScatter(iprs.data.ptr, iprs[rank * n:].data.ptr, n, f32, nccl.NCCL_SUM, s.ptr)  # in place
got, ring = cupy.full(n, -1, dtype=np.int64), data(rank, n, np.int64)
nccl.groupStart()
comm.send(ring.data.ptr, n, nccl.NCCL_INT64, (rank + 1) % size, s.ptr)
comm.recv(got.data.ptr, n, nccl.NCCL_INT64, (rank - 1) % size, s.ptr)
nccl.groupEnd()
cupy.cuda.Device().synchronize()
out.update({"reduce": host(y), "reduce to the root only": host(y0), "grouped": [host(a) for a in grouped],
            "bcast": host(z), "broadcast": host(b), "allGather": host(g),
            "reduceScatter": host(rs), "allReduce in place": host(ip), "allGather in place": host(ipg),
            "reduceScatter in place": host(iprs[rank * n:(rank + 1) * n]), "send/recv ring": host(got)})
report(**out)
'''


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_and_send_recv_match_numpy(tmp_path, n):
    rows, c = mpi(tmp_path, COLLECTIVES, n=n), 6
    for r, row in enumerate(rows):
        for dtype, name in [(np.float64, "f64"), (np.int32, "i32"), (np.uint8, "u8"), (np.float16, "f16")]:
            xs = np.array([data(q, c, dtype) for q in range(n)])
            want = {"SUM": xs.sum(0, dtype=dtype), "PROD": xs.prod(0, dtype=dtype), "MAX": xs.max(0),
                    "MIN": xs.min(0), "AVG": (xs.sum(0, dtype=dtype) / n) if dtype in (np.float64, np.float16)
                    else xs.sum(0, dtype=dtype) // n}
            for op, value in want.items():
                np.testing.assert_allclose(row[f"allReduce {op} {name}"], value.astype(dtype), rtol=1e-3,
                                           err_msg=f"allReduce {op} {name} rank {r}")
        xs = np.array([data(q, c, np.float32) for q in range(n)])
        assert row["reduce"] == (xs.sum(0).tolist() if r == n - 1 else [-1.0] * c)
        assert row["reduce to the root only"] == (xs.max(0).tolist() if r == n - 1 else [-1.0] * c)
        assert row["grouped"] == [xs.min(0).tolist(), xs.sum(0).tolist()]
        assert row["bcast"] == xs[1].tolist()
        assert row["broadcast"] == xs[0].tolist()
        assert row["allGather"] == xs.ravel().tolist()
        assert row["allReduce in place"] == xs.sum(0).tolist()
        assert row["allGather in place"] == xs.ravel().tolist()
        bigs = np.array([data(q, c * n, np.float32) for q in range(n)]).sum(0)
        assert row["reduceScatter"] == row["reduceScatter in place"] == bigs[r * c:(r + 1) * c].tolist()
        assert row["send/recv ring"] == data((r - 1) % n, c, np.int64).tolist()


def test_results_wait_for_the_stream(tmp_path):
    rows = mpi(tmp_path, '''
comm, out = nccl_comm(), {}
s = cupy.cuda.Stream(non_blocking=True)
for way in ("stream.synchronize", "device.synchronize", "event.synchronize", "stream.done", "runtime"):
    x, y = cupy.full(4, rank + 1, dtype=cupy.int32), cupy.zeros(4, dtype=cupy.int32)
    null.synchronize()
    comm.allReduce(x.data.ptr, y.data.ptr, 4, nccl.NCCL_INT32, nccl.NCCL_SUM, s.ptr)
    e = s.record()
    before = [host(y), cupy.asnumpy(y).tolist(), int(y[0]), y.sum().item()]  # the sum: another stream
    {"stream.synchronize": s.synchronize, "device.synchronize": cupy.cuda.Device().synchronize,
     "event.synchronize": e.synchronize, "stream.done": lambda: s.done,
     "runtime": cupy.cuda.runtime.deviceSynchronize}[way]()
    out[way] = (before, host(y))
report(**out)
''', n=2)
    for row in rows:
        for way, (before, after) in row.items():
            assert before == [[0] * 4, [0] * 4, 0, 0], f"{way}: read before the sync should be stale"
            assert after == [3] * 4, way


def test_a_cupy_op_on_the_same_stream_sees_a_prior_recv(tmp_path):
    rows = mpi(tmp_path, '''
comm, s = nccl_comm(), null
x = cupy.ones(1, dtype=cupy.int64)
if rank > 0:
    comm.recv(x.data.ptr, 1, nccl.NCCL_INT64, rank - 1, s.ptr)
x = 2 * x + rank                  # same stream: runs after the receive landed
if rank < size - 1:
    comm.send(x.data.ptr, 1, nccl.NCCL_INT64, rank + 1, s.ptr)
s.synchronize()
other = cupy.cuda.Stream(non_blocking=True)
y = cupy.zeros(1, dtype=cupy.int64)
null.synchronize()
if rank == 0:
    comm.send(x.data.ptr, 1, nccl.NCCL_INT64, 1, other.ptr)
elif rank == 1:
    comm.recv(y.data.ptr, 1, nccl.NCCL_INT64, 0, other.ptr)
on_null = int((y + 0)[0])          # another stream: not ordered after the receive
other.synchronize()
report(chain=int(x[0]), on_null=on_null, after=int(y[0]))
''', n=3)
    chain = [2]
    for r in (1, 2):
        chain.append(2 * chain[-1] + r)
    assert [row["chain"] for row in rows] == chain
    assert [row["on_null"] for row in rows[1:]] == [0, 0]
    assert rows[1]["after"] == chain[0]


HEAD_TO_HEAD = '''
comm, s, peer = nccl_comm(), null, 1 - rank
out, got = cupy.full(1, rank, dtype=cupy.float64), cupy.zeros(1, dtype=cupy.float64)  # eager-sized
MODE
print(f"posted {rank}", flush=True)
s.synchronize()
report(got=int(got[0]))
'''


def test_ungrouped_head_to_head_sends_hang(tmp_path):
    proc, script = start(tmp_path, HEAD_TO_HEAD.replace("MODE", '''
comm.send(out.data.ptr, out.size, nccl.NCCL_FLOAT64, peer, s.ptr)
comm.recv(got.data.ptr, got.size, nccl.NCCL_FLOAT64, peer, s.ptr)'''), 2)
    seen, reader = [], threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    end = time.monotonic() + 60
    # the ranks' lines reach the pipe through hydra and may interleave ("posted 0posted 1\n\n"): look
    # in the joined text, not for whole lines
    while not all(f"posted {r}" in "".join(seen) for r in (0, 1)) and time.monotonic() < end:
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):  # both reached the sync: it must not end from there
        proc.wait(timeout=3)
    os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=10)
    out, err = kill(proc, script)
    out = "".join(seen) + out
    assert "posted 0" in out and "posted 1" in out, err  # both reached the sync, then hung there
    assert "RESULT" not in out


@pytest.mark.parametrize("mode", [
    '''nccl.groupStart()
comm.send(out.data.ptr, out.size, nccl.NCCL_FLOAT64, peer, s.ptr)
comm.recv(got.data.ptr, got.size, nccl.NCCL_FLOAT64, peer, s.ptr)
nccl.groupEnd()''',
    '''first, second = (comm.send, comm.recv) if rank % 2 == 0 else (comm.recv, comm.send)
first((out if rank % 2 == 0 else got).data.ptr, out.size, nccl.NCCL_FLOAT64, peer, s.ptr)
second((got if rank % 2 == 0 else out).data.ptr, out.size, nccl.NCCL_FLOAT64, peer, s.ptr)'''],
    ids=["grouped", "parity-order"])
def test_grouped_or_ordered_exchanges_complete(tmp_path, mode):
    rows = mpi(tmp_path, HEAD_TO_HEAD.replace("MODE", mode), n=2, timeout=60)
    assert [row["got"] for row in rows] == [1, 0]


# ---- mistakes the double makes loud ------------------------------------------------------------------

def test_mistakes_give_wrong_values_or_errors(tmp_path):
    rows = mpi(tmp_path, '''
comm, s = nccl_comm(), null
def allreduce(x, y, count, kind=nccl.NCCL_INT32, op=nccl.NCCL_SUM, stream=s):
    comm.allReduce(x.data.ptr, y.data.ptr, count, kind, op, stream.ptr)
    stream.synchronize()
x, y = cupy.full(4, rank + 1.5), cupy.zeros(4)
allreduce(x, y, 4, kind=nccl.NCCL_FLOAT32)                         # float64 data called float32
wrong_type = host(y)
x, y = cupy.full(4, rank + 1, dtype=cupy.int32), cupy.zeros(4, dtype=cupy.int32)
allreduce(y, x, 4)                                                 # recvbuf, sendbuf swapped
swapped = host(y)
report(wrong_type=wrong_type, swapped=swapped,
       past_the_end=failure(lambda: allreduce(x, y, 5)),
       slice_past_the_end=failure(lambda: allreduce(x[2:], y[2:], 4)),
       int64_for_int32=failure(lambda: allreduce(x, y, 4, kind=nccl.NCCL_INT64)),
       bad_datatype=failure(lambda: allreduce(x, y, 4, kind=99)),
       bad_op=failure(lambda: allreduce(x, y, 4, op=99)),
       bfloat16=failure(lambda: allreduce(x, y, 4, kind=nccl.NCCL_BFLOAT16)),
       bad_peer=failure(lambda: comm.send(x.data.ptr, 4, nccl.NCCL_INT32, size, s.ptr)),
       bad_root=failure(lambda: comm.bcast(x.data.ptr, 4, nccl.NCCL_INT32, -1, s.ptr)),
       bad_stream=failure(lambda: allreduce(x, y, 4, stream=type("S", (), {"ptr": 12345})())),
       unmatched_group_end=failure(nccl.groupEnd))
''', n=2)
    for row in rows:
        assert row["wrong_type"] != [4.0] * 4
        assert row["swapped"] == [0] * 4
        for key in ("past_the_end", "slice_past_the_end", "int64_for_int32"):
            assert row[key].startswith("DoubleFault: allReduce: out of bounds"), row[key]
        for key in ("bad_datatype", "bad_op", "bad_peer", "bad_root", "bad_stream"):
            assert row[key].startswith("NcclError: NCCL_ERROR_INVALID_ARGUMENT: invalid argument"), row[key]
        assert row["bfloat16"].startswith("NotImplementedError")
        assert row["unmatched_group_end"].startswith("NcclError: NCCL_ERROR_INVALID_USAGE")


def test_cross_stream_race_raises_and_waiting_fixes_it(tmp_path):
    rows = mpi(tmp_path, '''
comm = nccl_comm()
side, blocking = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream()
def allreduce(x, stream):
    comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_INT32, nccl.NCCL_SUM, stream.ptr)
x = cupy.full(4, rank + 1, dtype=cupy.int32)                  # written on the null stream
race = failure(lambda: allreduce(x, side))
side.wait_event(null.record())
allreduce(x, side)
side.synchronize()
after_wait = host(x)
x[...] = 3
allreduce(x, blocking)                                        # legacy: blocking waits for null
blocking.synchronize()
implicit = host(x)
got = cupy.zeros(4, dtype=cupy.int32)
side.wait_event(null.record())
comm.allReduce(x.data.ptr, got.data.ptr, 4, nccl.NCCL_INT32, nccl.NCCL_SUM, side.ptr)
back = failure(lambda: allreduce(got, null))                  # written by nccl on side: unordered
null.wait_event(side.record())
allreduce(got, null)                                          # now ordered: runs side's work first
null.synchronize()
x[...] = 1
null.synchronize()
allreduce(x, side)                                            # the writer was synced: fine
side.synchronize()
report(race=race, back=back, after_wait=after_wait, implicit=implicit, ordered=host(got), synced=host(x))
''', n=2)
    for row in rows:
        assert row["race"].startswith("DoubleFault: allReduce: a buffer written on the null stream, used by "
                                      "NCCL on stream 0x") and "without waiting for it" in row["race"]
        assert "written on stream 0x" in row["back"] and "used by NCCL on the null stream" in row["back"]
        assert row["after_wait"] == [3] * 4 and row["implicit"] == [6] * 4
        assert row["ordered"] == [24] * 4 and row["synced"] == [2] * 4


def test_a_communicator_over_half_the_ranks(tmp_path):
    rows = mpi(tmp_path, '''
half = 0 if rank < 2 else 1
sub = world.Split(color=half, key=rank)
comm = nccl_comm(sub)                       # only the half's members make this one
x = cupy.full(2, rank, dtype=cupy.int64)
comm.allReduce(x.data.ptr, x.data.ptr, 2, nccl.NCCL_INT64, nccl.NCCL_SUM, null.ptr)
null.synchronize()
report(half_sum=int(x[0]), nccl_rank=comm.rank_id(), nccl_size=comm.size(), device=comm.device_id())
''', n=3)
    got = [[r["half_sum"], r["nccl_rank"], r["nccl_size"]] for r in rows]
    assert got == [[1, 0, 2], [1, 1, 2], [2, 0, 1]]
    assert not list(tmp_path.glob("nccl-rendezvous-*")), "the rendezvous folders were left behind"


# ---- the rest of the cupy surface --------------------------------------------------------------------

def test_devices_memory_and_the_readiness_probe(tmp_path):
    [row] = mpi(tmp_path, '''
import os, subprocess
from common.plumbing import devices
rt = cupy.cuda.runtime
def visible(cvd):
    if cvd is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = cvd
    count = failure(rt.getDeviceCount) or rt.getDeviceCount()
    return count, [rt.deviceGetPCIBusId(i) for i in range(count if isinstance(count, int) else 0)]
all8, two, none, cut = visible(None), visible("3,5"), visible(""), visible("1,9,2")
visible(None)
pool = cupy.get_default_memory_pool()
base = pool.used_bytes()
a = cupy.zeros(100, dtype=cupy.float32)
b = cupy.empty(129, dtype=cupy.float32)
grown = pool.used_bytes() - base
del a, b
x = cupy.arange(64, dtype=cupy.float32)
report(all8=all8, two=two, none=none, cut=cut, grown=grown, freed=pool.used_bytes() - base,
       smi=subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines(),
       bad_device=failure(lambda: cupy.cuda.Device(8).use()),
       device_props=rt.getDeviceProperties(0)["name"].decode(),
       probe=devices.gpu_ready("mpi4py", 2, devices.visible_gpus()),
       kernel=float((x * 2).sum()), matmul=host(cupy.matmul(cupy.ones((2, 3)), cupy.ones((3, 2)))),
       version=cupy.__version__, unknown=failure(lambda: cupy.no_such_thing),
       numpy_only=failure(lambda: cupy.busday_count),
       implicit=failure(lambda: np.asarray(x)), mixed=failure(lambda: x + np.ones(64)),
       slice_offset=x[3:].data.ptr - x.data.ptr)
''', n=1)
    assert row["all8"][0] == 8 and len(set(row["all8"][1])) == 8
    assert row["two"] == [2, [row["all8"][1][3], row["all8"][1][5]]]
    assert row["none"][0].startswith("CUDARuntimeError: cudaErrorNoDevice")
    assert row["cut"] == [1, [row["all8"][1][1]]]  # CUDA stops at the first entry past the GPUs
    assert row["grown"] == 512 + 1024 and row["freed"] == 512  # only x (256 B -> 512) is left
    assert row["smi"] == [f"GPU {i}: Double GPU (UUID: GPU-double-{i:04d})" for i in range(8)]
    assert row["bad_device"].startswith("CUDARuntimeError: cudaErrorInvalidDevice: invalid device ordinal")
    assert row["probe"][0] is True, row["probe"]
    assert row["kernel"] == 4032.0 and row["matmul"] == [[3.0, 3.0], [3.0, 3.0]]
    assert row["version"].endswith(" (GPU double)") and row["version"][0].isdigit()
    assert row["unknown"] == "AttributeError: module 'cupy' (GPU double) has no attribute 'no_such_thing'"
    assert row["numpy_only"].startswith("AttributeError")  # NumPy has it, the real CuPy does not
    assert row["implicit"].startswith("TypeError: Implicit conversion to a NumPy array is not allowed")
    assert row["mixed"].startswith("TypeError: Unsupported type")
    assert row["slice_offset"] == 12


def test_lesson_00_gpu_path_passes_under_the_double(tmp_path):
    proc = tutor("run", "00", "-n", "2", "--api", "mpi4py", "--device", "gpu", env=env(tmp_path), timeout=120)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr
    assert "transport nccl" in proc.stdout
