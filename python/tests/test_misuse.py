"""Calls a user can get wrong, each once a silent wrong result or an unclear
error (a review that attacked the Python API, 2026-12-03): each now refused
by name, or given the meaning a NumPy or PyTorch user expects."""
import gc
import os

import numpy as np
import pytest

import segtape
from segtape import dist, nn


def test_allreduce_sum_refuses_an_array_it_cannot_sum_in_place():
    for odd in (None, [1.0, 2.0], 3):
        with pytest.raises(TypeError, match="allreduce_sum sums in place"):
            dist.local().allreduce_sum(odd)
    # float64 or a strided view was converted to a temporary, summed there, and
    # the caller's array kept its values (exit 0, no error).
    c = dist.local()
    for bad, what in ((np.ones(3), "float64"), (np.ones(6, np.float32)[::2], "not C-contiguous"),
                      (np.ones(3, np.int32), "int32")):
        with pytest.raises(TypeError, match=r"allreduce_sum sums in place.*float32.*" + what):
            c.allreduce_sum(bad)
    ok = np.ones(3, np.float32)
    c.allreduce_sum(ok)  # one rank: the sum is itself
    assert ok.tolist() == [1.0, 1.0, 1.0]


def test_no_grad_guards_dropped_out_of_order_leave_gradients_on():
    # Each guard restored the mode it had saved: dropping the outer one first
    # and then exiting the inner one left the tape without gradients for good.
    tape = segtape.Tape()
    w = tape.parameter([2])

    def records():
        with tape.segment():
            return (w * w).sum().requires_grad

    g1, g2 = tape.no_grad(), tape.no_grad()
    g1.__enter__()
    g2.__enter__()
    del g1
    gc.collect()
    assert not records()  # g2 is still entered
    g2.__exit__(None, None, None)
    assert records()

    def guarded():
        with tape.no_grad():
            yield

    a, b = guarded(), guarded()
    next(a), next(b)
    with pytest.raises(segtape.TapeError, match="reverse order"):
        a.close()  # (its guard, refused, goes with the closed generator's frame)
    b.close()
    assert records()


def test_a_gru_cell_without_bias_has_no_bias_tensors():
    tape = segtape.Tape()
    g = nn.GRUCell(tape, 2, 3, bias=False)
    assert g.bias_ih is None and g.bias_hh is None  # as nn.Linear(bias=False).bias and PyTorch's
    assert [n for n, _ in g.named_parameters()] == ["weight_ih", "weight_hh"]
    assert tuple(nn.GRUCell(tape, 2, 3).bias_ih.shape) == (9,)


def test_numpy_operands_raise_instead_of_making_object_arrays():
    tape = segtape.Tape()
    with tape.segment():
        x = tape.tensor(np.array([1.0, 2.0], np.float32))
        for f in (lambda: np.zeros(2) + x, lambda: np.full(2, 0.5) * x, lambda: np.add(x, 1.0)):
            with pytest.raises(TypeError):
                f()
        a = np.asarray(x)  # a copy of the values, as x.numpy()
        assert a.dtype == np.float32 and a.tolist() == [1.0, 2.0]
        assert (2.0 * x).numpy().tolist() == [2.0, 4.0]
        assert segtape.neg(x).numpy().tolist() == [-1.0, -2.0]


def test_a_budget_near_2_to_the_64_is_refused_not_zero():
    # align_up wrapped 2^64 - 1 to an arena of 0 bytes.
    with pytest.raises(segtape.OutOfMemoryError, match="could not reserve an arena chunk of 18446744073709551615 bytes") as e:
        segtape.Tape(segment_budget=2**64 - 1)
    # a MemoryError too, as a Python user would catch it
    assert isinstance(e.value, MemoryError) and isinstance(e.value, segtape.Error)
    assert e.value.pool == segtape.SEGMENT_ARENA_POOL == "segment arena (TapeOptions::segment_budget)"


def test_shape_errors_name_the_call():
    tape = segtape.Tape()
    with pytest.raises(segtape.ShapeError, match=r"zeros: shape \[-1\]: dimension -1 is out of range.*never inferred"):
        tape.zeros([-1])
    with tape.segment():
        x = tape.zeros([2, 3])
        with pytest.raises(segtape.ShapeError, match=r"reshape: shape \[3,-1\]"):
            x.reshape([3, -1])


def test_explain_takes_any_row_count():
    tape = segtape.Tape()
    w = tape.parameter([4])
    with tape.segment():
        (w * 2.0).sum()
        every = tape.explain(2**63).to_dict()  # a vector reserved 2^63 + 1 rows: "vector::reserve"
        assert every["node_count"] >= 1 and len(every["largest"]) == every["node_count"]


def test_bytes_paths_save_and_load_the_file_they_name(tmp_path):
    os.chdir(tmp_path)
    tape = segtape.Tape()
    lin = nn.Linear(tape, 2, 2)
    nn.save(lin, b"model.safetensors")
    assert os.listdir(".") == ["model.safetensors"]
    nn.load(nn.Linear(tape, 2, 2), b"model.safetensors")
    # A name that is not UTF-8 (any bytes but / and NUL are a Linux file name)
    # was an "incompatible function arguments" TypeError.
    odd = b"caf\xe9.safetensors"
    nn.save(lin, odd)
    assert odd in os.listdir(b".")
    assert nn.load(nn.Linear(tape, 2, 2), odd)["missing_keys"] == []
    nn.load(nn.Linear(tape, 2, 2), os.fsdecode(odd))  # the same file by its str (surrogate-escaped) name
    with pytest.raises(TypeError):
        nn.save(lin, 3)
    # An error naming such a file keeps its message (it was empty).
    with pytest.raises(segtape.CheckpointError, match=r"nope\\xe9\.safetensors: cannot open"):
        nn.load(lin, b"nope\xe9.safetensors")


def test_retention_run_names_its_own_arguments():
    from segtape import retention
    with pytest.raises(segtape.Error, match=r"retention\.run\(\): steps must be in \[2, 100000\]"):
        retention.run(["tbptt"], steps=1)
    for clip in (float("nan"), -1.0, 0.0):
        with pytest.raises(segtape.Error, match=r"clip must be a finite number > 0"):
            retention.run(["tbptt"], clip=clip)
    with pytest.raises(segtape.Error, match=r"lr must be a finite number > 0"):
        retention.run(["tbptt"], lr=float("inf"))
    with pytest.raises(TypeError, match="cases must be names"):
        retention.run(b"tbptt")


def _trainer_whose_env_calls(name):
    """A Trainer (tbptt:8) on a Python env registered as `name` whose step()
    runs box["call"] once when it is set, keeping the message of a refusal
    (segtape.Error) in box["refused"]; one segment already run."""
    import segtape.gym as sg
    A = segtape._segtape.agent
    box = {}

    class Env:
        def __init__(self, b, s):
            self.b = b

        def observe(self):
            return np.zeros((self.b, 3), np.float32)

        def step(self, a):
            if "call" in box:
                call = box.pop("call")
                try:
                    call()
                except segtape.Error as e:
                    box["refused"] = str(e)
            return np.ones(self.b, np.float32), np.zeros(self.b, np.uint8), np.zeros(self.b, np.uint8)

    sg._factories[name] = Env
    A.register_python_env(name, 3, 0, 4)
    c = A.TrainConfig()
    c.env, c.batch, c.hidden, c.embed, c.steps, c.history = name, 4, 8, 4, 10**6, "tbptt:8"
    tr = A.Trainer(c)
    tr.run_segment()
    return tr, box


def test_a_trainer_refuses_save_and_load_from_inside_a_segment(tmp_path):
    # A load from an env's step(), inside run_segment, was accepted and then
    # overwritten by the segment's own update.
    ck = str(tmp_path / "trainer.safetensors")
    tr, box = _trainer_whose_env_calls("misuse.reentrant")
    tr.save(ck)
    for name, call in (("load", lambda: tr.load(ck)), ("save", lambda: tr.save(ck))):
        box["call"] = call
        tr.run_segment()
        assert box.pop("refused", "").startswith(name + ": called while a segment runs"), name
    tr.load(ck)  # between segments: as before
    assert tr.step == 8


def test_a_trainer_read_from_inside_a_segment_shows_its_last_update():
    # What a Trainer shows from an env's step(), inside run_segment: the run
    # as its last completed update left it (step, parameters, counts), not a
    # half-done segment's; its properties cannot be set, there or anywhere.
    tr, box = _trainer_whose_env_calls("misuse.reader")
    before = [p.copy() for p in tr.parameters()]
    seen = {}

    def read():
        seen.update(step=tr.step, done=tr.done(), skipped=tr.skipped_updates, count=tr.parameter_count,
                    params=tr.parameters(), rank=(tr.rank, tr.ranks))
    box["call"] = read
    tr.run_segment()
    assert "refused" not in box
    assert seen["step"] == 8 and not seen["done"] and seen["skipped"] == 0 and seen["rank"] == (0, 1)
    assert seen["count"] == sum(p.size for p in before)
    assert all(np.array_equal(a, b) for a, b in zip(seen["params"], before))  # not the update the segment then made
    assert tr.step == 16 and any(not np.array_equal(a, b) for a, b in zip(tr.parameters(), before))
    for name in ("step", "skipped_updates", "parameter_count", "rank", "ranks"):
        box["call"] = lambda: setattr(tr, name, 0)
        with pytest.raises(AttributeError):
            tr.run_segment()
        box.pop("call", None)


def test_gym_train_names_its_budget_argument():
    gym = pytest.importorskip("gymnasium")
    import segtape.gym as sg

    class Big(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (50000,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(50000, np.float32), {}

        def step(self, a):
            return np.zeros(50000, np.float32), 1.0, False, False, {}

    with pytest.raises(segtape.BudgetError) as e:  # the class kept, the words train()'s
        sg.train(Big, steps=64, batch=16)
    assert str(e.value).startswith("segtape.gym.train: ") and "budget" in str(e.value), e.value
    assert "TrainConfig" not in str(e.value) and "--" not in str(e.value), e.value
    res = sg.train(Big, steps=32, batch=2, hidden=8, budget="256MiB")  # enough for it
    assert res.trainer.step == 32
    # Without budget=, the Trainer's default: history "full" grows to 1 GiB
    # (a 64 MiB default given always stopped it at step 340 here).
    sg.register_gymnasium_envs()
    full = sg.train("segtape/TMaze-v0", steps=400, batch=64, hidden=128, history="full")
    assert full.trainer.step == 400


def test_a_signal_handler_cannot_save_inside_evaluate(tmp_path):
    # evaluate runs Python's signal handlers between its segments (Ctrl-C);
    # a handler's save there wrote the evaluation's env and state.
    import signal
    A = segtape._segtape.agent
    c = A.TrainConfig()
    c.env, c.batch, c.hidden, c.embed, c.steps = "recall", 4, 8, 4, 10**6
    tr = A.Trainer(c)
    tr.run_segment()

    def handler(signum, frame):
        tr.save(str(tmp_path / "from-handler.safetensors"))

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        with pytest.raises(segtape.Error, match="save: called while a segment runs"):
            tr.evaluate(10**8, 3)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not (tmp_path / "from-handler.safetensors").exists()
    tr.save(str(tmp_path / "after.safetensors"))  # between segments: as before


def test_a_trainer_refuses_run_segment_and_evaluate_from_inside_a_segment():
    # A run_segment or evaluate from an env's step() got "segment 2 is still
    # open", after it had written the trainer's persistent state: the outer
    # segment then failed in its backward ("copy_into wrote into it").
    tr, box = _trainer_whose_env_calls("misuse.reentrant_run")
    calls = (("run_segment", tr.run_segment), ("evaluate", lambda: tr.evaluate(8, 1)), ("reset_score", tr.reset_score))
    for name, call in calls:
        box["call"] = call
        step = tr.step
        assert tr.run_segment()["steps"] == 8  # the outer segment completes
        assert tr.step == step + 8
        assert box.pop("refused", "").startswith(name + ": called while a segment runs"), name
    # from the evaluation's env: refused too, and the outer evaluate completes
    score = tr.evaluate(64, 2)
    for name, call in calls:
        box["call"] = call
        again = tr.evaluate(64, 2)
        assert again == score or (again != again and score != score), name
        assert box.pop("refused", "").startswith(name + ": called while a segment runs"), name
    tr.run_segment()  # between segments: as before
    assert tr.step == 8 * 5


def test_history_full_refuses_evaluate_by_name_until_the_run_ends():
    # It was "tape.segment(): segment 1 is still open; end it (let its
    # Segment go out of scope, or call end())", advice no caller can follow.
    A = segtape._segtape.agent
    c = A.TrainConfig()
    c.env, c.batch, c.hidden, c.embed, c.steps, c.history = "recall", 4, 8, 4, 64, "full"
    t = A.Trainer(c)
    t.run_segment()
    with pytest.raises(segtape.Error, match=r"^evaluate: history 'full' keeps its whole run in one open segment; "
                                            r"it evaluates only once the run has ended"):
        t.evaluate(16, 1)
    while not t.done():
        t.run_segment()  # the refusal changed nothing
    assert t.step == 64
    t.evaluate(16, 1)  # the run has ended: its segment with it


def test_gym_train_refuses_eval_every_with_history_full_before_training():
    pytest.importorskip("gymnasium")
    import segtape.gym as sg
    sg.register_gymnasium_envs()
    rows = []
    with pytest.raises(segtape.Error, match=r"^segtape\.gym\.train: eval_every .*history 'full' keeps its whole run in one "
                                            r"open segment"):
        sg.train("segtape/TMaze-v0", steps=64, batch=2, hidden=8, history="full", eval_every=32, eval_episodes=2,
                 log_every=8, callback=rows.append)
    assert rows == []  # refused before any training
    res = sg.train("segtape/TMaze-v0", steps=64, batch=2, hidden=8, history="full")
    assert res.evaluate(episodes=2)["episodes"] == 2  # once the run has ended


def test_a_python_env_that_sets_done_to_255_is_told_so():
    # 255 is the contract check's mark of a value left unwritten: the env was
    # told it "left done of stream 0 unwritten".
    import segtape.gym as sg
    A = segtape._segtape.agent

    class Env:
        done = 255

        def __init__(self, b, s):
            self.b = b

        def observe(self):
            return np.zeros((self.b, 3), np.float32)

        def step(self, a):
            done = np.zeros(self.b, np.uint8)
            done[1] = Env.done
            return np.ones(self.b, np.float32), done, np.zeros(self.b, np.uint8)

    sg._factories["misuse.done255"] = Env
    A.register_python_env("misuse.done255", 3, 0, 4)
    c = A.TrainConfig()
    c.env, c.batch, c.hidden, c.embed, c.steps, c.history = "misuse.done255", 4, 8, 4, 64, "tbptt:4"
    for done in (255, 2):
        Env.done = done
        with pytest.raises(segtape.Error, match=rf"^env 'misuse\.done255', step 1: step\(\) set done of stream 1 to {done}; "
                                                r"done is 0 or 1 \(the Env contract"):
            A.Trainer(c).run_segment()


def test_a_subclass_forward_is_what_calling_the_layer_runs():
    # m(x) called the C++ layer straight, skipping an overriding forward
    # (torch.nn.Module.__call__ calls self.forward).
    tape = segtape.Tape()

    class ReluLinear(nn.Linear):
        def forward(self, x):
            return super().forward(x).relu()

    class Deeper(ReluLinear):  # inherits the override
        pass

    class Silent(nn.GRUCell):
        def forward(self, x, hx=None):
            return super().forward(x, hx) * 0.0

    class Twice(nn.Embedding):
        def forward(self, i):
            return super().forward(i) * 2.0

    class LastOnly(nn.GRU):
        def forward(self, x, hx=None, keep=None):
            return super().forward(x, hx, keep)[1]

    with tape.segment():
        x = tape.tensor(np.array([[1.0, -2.0, 3.0]], np.float32))
        for cls in (ReluLinear, Deeper):
            m = cls(tape, 3, 4, rng=nn.Rng(1))
            plain = nn.Linear(tape, 3, 4, rng=nn.Rng(1))(x).numpy()
            assert (plain < 0).any()  # (so the relu shows)
            assert np.array_equal(m(x).numpy(), np.maximum(plain, 0)), cls
            assert np.array_equal(m(x).numpy(), m.forward(x).numpy())
        assert not Silent(tape, 3, 5)(x).numpy().any()
        i = tape.tensor(np.array([1, 2]))
        e = Twice(tape, 4, 3, rng=nn.Rng(2))
        assert np.array_equal(e(i).numpy(), 2 * nn.Embedding(tape, 4, 3, rng=nn.Rng(2))(i).numpy())
        seq = tape.tensor(np.ones((2, 1, 3), np.float32))
        assert tuple(LastOnly(tape, 3, 5)(seq).shape) == (1, 1, 5)
        # the layers themselves: __call__ is still the C++ one
        assert nn.Linear.__call__ is segtape._segtape.nn.Linear.__call__


def test_out_of_range_ints_name_the_call_and_the_argument():
    # Each was nanobind's "TypeError: (): incompatible function arguments",
    # naming neither the call nor the argument.
    from segtape import retention
    for kwargs, message in (({"segment_budget": 2**64}, r"segtape\.Tape: segment_budget 18446744073709551616: must be a size "
                                                          r"in \[1, 2\^64 - 1\] bytes"),
                            ({"grow": True, "grow_limit": 2**64}, r"segtape\.Tape: grow_limit .* \[1, 2\^64 - 1\] bytes"),
                            ({"node_capacity": -1}, r"segtape\.Tape: node_capacity must be in \[0, 2\^64 - 1\], got -1")):
        with pytest.raises(segtape.Error, match="^" + message):
            segtape.Tape(**kwargs)
    for kwargs, message in (({"steps": 2**64}, r"steps must be in \[2, 100000\]"),  # the lab's own range where it has one
                            ({"seed": 2**64}, r"seed must be in \[0, 2\^64 - 1\], got 18446744073709551616"),
                            ({"k": 2**63}, r"k must be in \[0, 2\^63 - 1\], got 9223372036854775808"),
                            ({"budget": 2**64}, r"budget 18446744073709551616: must be a size in \[1, 2\^64 - 1\] bytes")):
        with pytest.raises(segtape.Error, match=r"^retention\.run\(\): " + message):
            retention.run(["tbptt"], **kwargs)
    pytest.importorskip("gymnasium")
    import segtape.gym as sg
    sg.register_gymnasium_envs()
    for kwargs, message in (({"seed": -1}, r"seed must be in \[0, 2\^64 - 1\], got -1"),
                            ({"batch": 2**63}, r"batch must be in \[1, 65536\]$"),
                            ({"steps": 2**64}, r"steps must be in \[1, 1e9\]$"),
                            ({"hidden": -2**63 - 1}, r"hidden must be in \[1, 16384\]$"),
                            ({"budget": 2**64}, r"budget 18446744073709551616: must be a size in \[1, 2\^64 - 1\] bytes"),
                            # the check's message would print the nearest int64, not the value given: the type's range
                            ({"algo": "ppo", "minibatches": 2**63}, r"minibatches must be in \[-2\^63, 2\^63 - 1\], "
                                                                    r"got 9223372036854775808")):
        with pytest.raises(segtape.Error, match=r"^segtape\.gym\.train: " + message):
            sg.train("segtape/TMaze-v0", **{"steps": 64, "batch": 2, **kwargs})


def test_tensor_keeps_float64_of_anything_that_has_that_dtype():
    # A float64 segtape tensor, torch tensor or NumPy scalar became float32
    # (0.3333333333333333 -> 0.33333334); a float64 ndarray kept float64.
    tape = segtape.Tape()
    third = 1 / 3
    with tape.segment():
        a = tape.tensor(np.array([third]))
        given = [a, np.float64(third), np.array(third)]
        torch = None
        try:
            import torch
        except ImportError:
            pass
        if torch is not None:
            given.append(torch.tensor([third], dtype=torch.float64))
        for values in given:
            t = tape.tensor(values)
            assert t.dtype == "float64", type(values)
            assert t.numpy().reshape(-1)[0] == third, type(values)
        # without a dtype: Python floats (and lists of them) become float32, as documented
        assert tape.tensor(third).dtype == "float32" and tape.tensor([third, 0.5]).dtype == "float32"
        assert tape.tensor(np.float32(third)).dtype == "float32"
        if torch is not None:
            assert tape.tensor(torch.tensor([third])).dtype == "float32"


def test_torch_memory_refuses_cuda_where_torch_has_none():
    # It returned [0, 0, 0]: a measurement that looks valid and is empty.
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    from segtape import retention
    for device in ("cuda", "cuda:0"):
        with pytest.raises(segtape.Error, match=rf"^torch_memory: device '{device}': this torch has no CUDA"):
            retention.torch_memory(lambda t: torch.ones(1000), 3, device=device)
