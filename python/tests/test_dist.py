"""segtape.dist from Python (docs/distributed.md): two ranks under mpirun.

Each test runs a small script as `mpirun -np 2 python script` and reads what
rank 0 wrote. Skipped, saying why, when this build has no MPI or mpirun is
not installed."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import segtape
from segtape import dist

pytestmark = pytest.mark.skipif(not dist.mpi_built() or shutil.which("mpirun") is None,
                                reason="segtape built without MPI, or no mpirun (apt-get install libopenmpi-dev openmpi-bin)")


def run_two_ranks(tmp_path, body):
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import numpy as np
        import segtape
        from segtape import dist, nn
        A = segtape._segtape.agent
        comm = dist.mpi(timeout_s=60)
        out = {}
    """) + textwrap.dedent(body) + textwrap.dedent("""
        if comm.rank == 0:
            json.dump(out, open(sys.argv[1], "w"))
    """))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OPENBLAS_NUM_THREADS="1")
    result = tmp_path / "out.json"
    p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, str(script), str(result)],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(result.read_text())


def test_two_ranks_train_as_one_process_with_both_ranks_streams(tmp_path):
    out = run_two_ranks(tmp_path, """
        def config(batch, shards):
            c = A.TrainConfig()
            c.env, c.history, c.batch, c.hidden, c.embed, c.steps, c.env_shards = "recall", "tbptt:8", batch, 32, 8, 400, shards
            return c
        two = A.Trainer(config(4, 1), comm)
        while not two.done():
            two.run_segment()
        one = A.Trainer(config(8, 2))
        while not one.done():
            one.run_segment()
        p2 = np.concatenate([p.ravel() for p in two.parameters()]).astype(np.float64)
        p1 = np.concatenate([p.ravel() for p in one.parameters()]).astype(np.float64)
        out["distance"] = float(np.linalg.norm(p2 - p1) / np.linalg.norm(p1))
        out["ranks"] = two.ranks
        mine = np.concatenate([p.ravel() for p in two.parameters()])
        theirs = comm.allgather(mine.tobytes())
        out["replicas_equal"] = theirs[0] == theirs[1]
    """)
    assert out["ranks"] == 2
    assert out["replicas_equal"]
    assert 0 < out["distance"] <= 1e-6


def test_a_loop_of_your_own_averages_its_gradients(tmp_path):
    out = run_two_ranks(tmp_path, """
        tape = segtape.Tape("cpu")
        model = nn.Linear(tape, 6, 3, rng=nn.Rng(comm.rank + 1))   # different initial values per rank...
        avg = dist.GradientAverager(comm, model)                   # ...rank 0's broadcast
        opt = nn.Adam(model, lr=1e-2)
        rng = np.random.default_rng(comm.rank)
        for _ in range(5):
            with tape.segment() as seg:
                x = tape.tensor(rng.standard_normal((4, 6)).astype(np.float32))
                seg.backward(segtape.mse_loss(model(x), tape.zeros([4, 3])))
                avg.average()
                opt.step()
                opt.zero_grad()
        dist.check_replicas(comm, model, "after 5 steps")  # raises when the replicas differ
        out["transport"], out["stats"] = avg.transport, avg.stats
        try:
            dist.check_same(comm, {"hidden": str(32 + comm.rank)}, "the test's settings")
            out["refused"] = ""
        except segtape.Error as e:
            out["refused"] = str(e)
        buf = np.full(3, comm.rank + 1.0, dtype=np.float32)
        comm.allreduce_sum(buf)
        out["sum"] = buf.tolist()
    """)
    assert out["transport"] == "mpi"
    assert out["stats"]["calls"] == 5 and out["stats"]["bytes"] > 0
    assert "hidden is '32' on rank 0, but rank 1 has '33'" in out["refused"]
    assert out["sum"] == [3.0, 3.0, 3.0]


def test_collectives_that_differ_between_ranks_are_refused_on_every_rank(tmp_path):
    # A rank summing another length, or calling another collective, was paired
    # by MPI with the other's buffer (heap corruption, or a wrong sum and exit 0).
    out = run_two_ranks(tmp_path, """
        def refused(f):
            try:
                f()
                return ""
            except segtape.Error as e:
                return str(e)
        out["lengths"] = refused(lambda: comm.allreduce_sum(np.ones(8 if comm.rank == 0 else 4, dtype=np.float32)))
        out["calls"] = refused(lambda: comm.allreduce_sum(np.ones(8, dtype=np.float32)) if comm.rank == 0 else comm.allgather(b"x"))
        out["models"] = refused(lambda: dist.GradientAverager(comm, nn.Linear(segtape.Tape("cpu"), 6, 3 if comm.rank == 0 else 4)))
        buf = np.ones(8, dtype=np.float32)
        comm.allreduce_sum(buf)  # the communicator still works
        out["sum"] = buf.tolist()
    """)
    assert "elements is '8' on rank 0, but rank 1 has '4'" in out["lengths"]
    assert "call is 'allreduce_sum' on rank 0, but rank 1 has 'allgather'" in out["calls"]
    assert "parameter 00000 is 'f32[3,6]' on rank 0, but rank 1 has 'f32[4,6]'" in out["models"]
    assert out["sum"] == [2.0] * 8


def test_one_process_has_a_local_communicator():
    c = dist.local()
    assert (c.rank, c.size, c.backend) == (0, 1, "local")
    assert dist.launched_by_mpirun() is False
