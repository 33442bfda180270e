"""segtape.retention: the retention lab run from Python, and the memory per
step of a PyTorch loop (the counting allocator) and of a segtape loop.

The loops here use the lab's model (B = 8 streams, embed 32, H = 128, 16
tokens) over 24 steps; the lab itself runs smaller (B = 4, embed 16, H = 32). Pitfall 1 grows every step; a fix holds the same high-water
in every segment."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import segtape

import segtape.retention as rt

B, E, H, V, LAG, K, T = 8, 32, 128, 16, 8, 8, 24
STATE = B * H * 4  # bytes of the float32 hidden state [B, H]


# ---------------------------------------------------------------- the lab

LAB = dict(batch=4, embed=16, hidden=32)
LAB_BUDGET = 96 * 1024


@pytest.fixture(scope="module")
def lab():
    """Pitfall 1 and its fix, 24 steps, a 96 KiB strict budget (given as a string)."""
    return rt.run(["hidden-not-detached", "tbptt"], steps=T, budget="96KiB", **LAB)


def test_cases_lists_the_labs_seven_pitfalls_and_six_fixes():
    names = [c["name"] for c in rt.cases()]
    assert len(names) == 13 and names[0] == "hidden-not-detached" and "exact-replay" in names
    assert [c["pitfall"] for c in rt.cases()] == [True] * 7 + [False] * 6


def test_lab_rows_have_one_flat_row_per_case(lab):
    assert [r["label"] for r in lab.rows] == ["1 hidden-not-detached", "tbptt:8"]
    for row in lab.rows:
        for key in ("case", "label", "pitfall", "bytes_per_step", "bytes_last_step", "bytes_peak", "strict_error",
                    "budget_exceeded_at_step", "memory"):
            assert key in row, key
        assert not any(isinstance(v, (dict, list)) for v in row.values())
    config = lab.json["config"]
    assert config["budget"] == LAB_BUDGET and config["steps"] == T and config["hidden"] == LAB["hidden"]
    assert lab.rows[0]["budget_bytes"] == LAB_BUDGET


def test_pitfall_1_grows_every_step_and_the_strict_policy_refuses_it(lab):
    """Every step keeps at least its GRU output and the 4 H-vectors per row
    the cell saves for backward: 5 * B * H floats."""
    row = lab.rows[0]
    curve = lab.series()["1 hidden-not-detached"]
    least = 5 * LAB["batch"] * LAB["hidden"] * 4
    assert len(curve) == T
    assert all(b - a > least for a, b in zip(curve, curve[1:]))
    assert row["bytes_per_step"] > least and row["bytes_last_step"] == row["bytes_peak"] == curve[-1]
    assert row["strict_error"] == "BudgetError" and LAG < row["strict_error_step"] < T
    assert "96.0 KiB" in row["strict_error_message"]
    # Without retain_graph, the second backward through the history is refused.
    assert row["no_retain_graph_error"] == "TapeError" and row["no_retain_graph_error_step"] == LAG + 1


def test_tbptt_holds_the_same_high_water_in_every_segment(lab):
    row = lab.rows[1]
    curve = lab.series()["tbptt:8"]
    assert row["strict_error"] is None and row["segments"] == T // K
    assert row["segment_peak_min_after_first"] == row["segment_peak_max_after_first"] == row["bytes_peak"]
    assert curve[K:2 * K] == curve[2 * K:3 * K]  # to the byte
    assert row["bytes_peak"] < LAB_BUDGET < lab.rows[0]["bytes_peak"]


def test_every_case_at_small_sizes():
    """All 13 cases (cases=None) in one run: every pitfall ends above every
    fix's high-water, no fix is refused by the strict policy, and
    exact-replay's gradients equal pitfall 1's."""
    result = rt.run(None, steps=T, trainer_k=K, **LAB)  # gru-state in segments of K too
    assert [r["case"] for r in result.rows] == [c["name"] for c in rt.cases()]
    pitfalls = [r for r in result.rows if r["pitfall"]]
    fixes = [r for r in result.rows if not r["pitfall"]]
    assert len(pitfalls) == 7 and len(fixes) == 6
    assert min(r["bytes_last_step"] for r in pitfalls) > max(r["bytes_peak"] for r in fixes)
    assert all(r["bytes_per_step"] > 1024 for r in pitfalls)
    assert all(r["strict_error"] is None and r["segments"] >= T // K for r in fixes)
    replay = result.rows[-1]
    assert replay["case"] == "exact-replay" and replay["gradient_check_equal"] is True
    assert replay["replay_segments"] == T // K and replay["replay_recompute_factor"] == 2.0


def test_lab_outputs_for_notebooks_and_files(lab):
    assert lab.svg.lstrip().startswith(("<svg", "<?xml")) and lab.svg.rstrip().endswith("</svg>")
    assert lab._repr_svg_() == lab.svg
    page = lab._repr_html_()
    assert "<svg" in page and "1 hidden-not-detached" in page and "<pre>" in page
    assert lab.csv.splitlines()[0] == "engine,case,step,bytes" and len(lab.csv.splitlines()) == 1 + 2 * T
    assert "1 hidden-not-detached" in lab.table and "tbptt:8" in lab.table


def test_dataframe_or_a_clear_import_error(lab):
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs pandas"):
            lab.dataframe()
    else:
        df = lab.dataframe()
        assert list(df.index) == ["1 hidden-not-detached", "tbptt:8"]
        assert df.loc["tbptt:8", "bytes_peak"] == lab.rows[1]["bytes_peak"]


def test_run_refuses_bad_settings():
    with pytest.raises(TypeError, match="unknown setting stepz"):
        rt.run(["tbptt"], stepz=10)
    with pytest.raises(TypeError, match="expected an int"):
        rt.run(["tbptt"], steps=2.5)
    with pytest.raises(segtape.Error, match="unknown retention case 'nope'"):
        rt.run(["nope"], steps=T, **LAB)
    with pytest.raises(segtape.Error):
        rt.run(["tbptt"], budget="lots")
    with pytest.raises(segtape.Error, match="hidden"):
        rt.run(["tbptt"], hidden=0)


# ---------------------------------------------------------------- PyTorch loops

def _torch_loop(detach):
    """Pitfall 1 (detach=False: h never detached, backward every step with
    retain_graph) or its fix (h.detach() after each K-step backward)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    tokens = torch.from_numpy(rng.integers(0, V, size=(T, B)))
    targets = torch.roll(tokens, LAG, 0)
    embed, gru, head = torch.nn.Embedding(V, E), torch.nn.GRUCell(E, H), torch.nn.Linear(H, V)
    params = [*embed.parameters(), *gru.parameters(), *head.parameters()]
    for p in params:  # gradients exist before the loop, as parameters do
        p.grad = torch.zeros_like(p)
    state = {"h": None, "loss": 0.0}

    def step(t):
        h = state["h"] = gru(embed(tokens[t]), state["h"])
        if t >= LAG:
            loss = F.cross_entropy(head(h), targets[t])
            if detach:
                state["loss"] = state["loss"] + loss
            else:
                loss.backward(retain_graph=True)
        if detach and (t + 1) % K == 0:
            if torch.is_tensor(state["loss"]):
                state["loss"].backward()
            state["h"], state["loss"] = h.detach(), 0.0
    return step


def test_torch_memory_sees_the_undetached_state_grow_and_the_detached_one_stay_flat():
    pytest.importorskip("torch")
    rt.torch_counter()  # installed before the loops' tensors exist
    leaking = rt.torch_memory(_torch_loop(detach=False), T)
    detached = rt.torch_memory(_torch_loop(detach=True), T)
    assert len(leaking) == len(detached) == T
    # Each step keeps at least its new hidden state, and autograd's saved tensors.
    assert all(b - a >= 4 * STATE for a, b in zip(leaking, leaking[1:]))
    # After each K-step backward the fix holds the detached state and nothing else.
    assert detached[K - 1::K] == [STATE] * (T // K)
    assert detached[K:2 * K] == detached[2 * K:3 * K]  # every segment alike, to the byte
    assert max(detached) < leaking[-1] / 3


def test_freeing_tensors_allocated_before_install_is_safe():
    """A tensor torch's own allocator made (before the counting allocator is
    installed) is freed by its own deleter: no crash, and the count does not
    drop by its size. Run in a fresh process: the install is once per process."""
    pytest.importorskip("torch")
    code = textwrap.dedent(f"""
        import torch
        before = {{"a": torch.ones(1 << 20)}}          # 4 MiB, torch's allocator
        import segtape
        import segtape.retention as rt
        kept = []
        def step(t):
            if t == 0:
                del before["a"]                        # freed through the base allocator
            else:
                kept.append(torch.ones(1024))          # 4 KiB, counted
        print(rt.torch_memory(step, 3))
        kept.clear()
        print(rt.torch_counter().live() >= 0)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["[0,", "4096,", "8192]", "True"]


def test_the_counting_allocator_is_cached_by_torch_version(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    built = rt._build_counter(torch)
    assert built.parent == tmp_path / "segtape" and f"torch{torch.__version__}" in built.name
    mtime = built.stat().st_mtime_ns
    assert rt._build_counter(torch) == built and built.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # no staging file left


def test_compiler_errors_are_segtape_errors(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(segtape.Error, match="no C\\+\\+ compiler"):
        rt._build_counter(torch)
    failing = tmp_path / "failing-cxx"
    failing.write_text("#!/bin/sh\necho 'error: c10::Allocator has no member allocate' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CXX", str(failing))
    with pytest.raises(segtape.Error, match=f"torch {torch.__version__}") as e:
        rt._build_counter(torch)
    assert "c10::Allocator has no member allocate" in str(e.value)
    assert not list((tmp_path / "segtape").iterdir())  # nothing cached


def test_torch_memory_refuses_an_unknown_device():
    pytest.importorskip("torch")
    with pytest.raises(segtape.Error, match="expected 'cpu', 'cuda'"):
        rt.torch_memory(lambda t: None, 1, device="meta")


# ---------------------------------------------------------------- segtape loops

class _Model(segtape.nn.Module):
    def __init__(self, tape):
        super().__init__(tape)
        self.embed = segtape.nn.Embedding(tape, V, E)
        self.gru = segtape.nn.GRUCell(tape, E, H)
        self.head = segtape.nn.Linear(tape, H, V)


def _segtape_memory(tbptt):
    """Pitfall 1 on the teaching policy, or tbptt:K under the strict policy."""
    tape = segtape.Tape(segment_budget="1MiB", grow=not tbptt)
    model = _Model(tape)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, V, size=(T, B))
    targets = np.roll(tokens, LAG, axis=0)
    state = {"seg": tape.segment(), "h": None, "loss": None}

    def step(t):
        seg = state["seg"]
        h = state["h"] = model.gru(model.embed(tape.tensor(tokens[t])), state["h"])
        if t >= LAG:
            loss = segtape.cross_entropy(model.head(h), tape.tensor(targets[t]))
            if tbptt:
                state["loss"] = loss if state["loss"] is None else state["loss"] + loss
            else:
                seg.backward(loss, retain_graph=True)
        if tbptt and (t + 1) % K == 0:
            if state["loss"] is not None:
                seg.backward(state["loss"])
            state["h"], state["loss"] = seg.carry(h), None
            seg.end()
            state["seg"] = tape.segment()
        tape.next_step()
    return rt.segtape_memory(tape, step, T)


def test_segtape_memory_counts_the_arena_and_the_carried_state():
    leaking = _segtape_memory(tbptt=False)
    tbptt = _segtape_memory(tbptt=True)
    assert all(b - a > 20 * 1024 for a, b in zip(leaking, leaking[1:]))
    # After a boundary the new segment's arena is empty: only the carried state is left.
    assert tbptt[K - 1::K] == [STATE] * (T // K)
    assert tbptt[K:2 * K] == tbptt[2 * K:3 * K]
    assert max(tbptt) < leaking[-1] / 4


# ---------------------------------------------------------------- plot

def test_plot_draws_one_line_per_series_in_kib():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        out = rt.plot({"1 pitfall": [1024, 2048, 4096], "fix": [1024, 0, 1024]}, ax=ax, title="t", log=True)
        assert out is ax and ax.get_yscale() == "log" and ax.get_title() == "t"
        assert [list(line.get_ydata()) for line in ax.lines] == [[1, 2, 4], [1, 0, 1]]
        assert [line.get_linestyle() for line in ax.lines] == ["--", "-"]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["1 pitfall", "fix"]
    finally:
        plt.close(fig)
