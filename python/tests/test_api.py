"""The Python API: tensors and NumPy, ops and operators, segments, carry,
the gradient-carry (exact BPTT) calls, no_grad, stats, explain and DOT."""
import numpy as np
import pytest

import segtape
from segtape import nn


def test_tensor_round_trip_keeps_values_and_dtype(tape):
    with tape.segment():
        for a in (np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.float64),
                  np.array([[1, 2], [3, 4]], dtype=np.int32)):
            t = tape.tensor(a)
            assert t.shape == a.shape
            assert np.array_equal(t.numpy(), a)
        assert tape.tensor([1.5, 2.5]).dtype == "float32"  # Python floats, as torch.tensor
        assert tape.tensor([1, 2]).dtype == "int64"
        assert tape.tensor(3.5).shape == () and tape.tensor(np.zeros((0, 3), np.float32)).shape == (0, 3)
        assert tape.tensor(np.zeros((2, 2), dtype=np.float32).T).numpy().flags["C_CONTIGUOUS"]


def test_integers_keep_every_bit_or_are_refused(tape):
    with tape.segment():
        big = 2**53 + 1  # not a double
        t = tape.tensor(np.array([big]))
        assert t.item() == big and isinstance(t.item(), int)
        assert isinstance(tape.tensor([1.5]).item(), float)
        assert tape.tensor(np.array([2**63 - 1], np.uint64)).numpy().tolist() == [2**63 - 1]
        with pytest.raises(segtape.ShapeError, match="uint64 value 18446744073709551615 does not fit int64"):
            tape.tensor(np.array([1, 2**64 - 1], np.uint64))
        with pytest.raises(segtape.ShapeError, match="does not fit int64"):
            t.copy_(np.array([2**63], np.uint64))
        assert t.item() == big  # unchanged
        with pytest.raises(segtape.ShapeError, match="does not fit int64"):
            tape.tensor(np.array([2**64 - 1], np.uint64), dtype="int64")
        f = tape.tensor(np.zeros(1, np.float32))
        f.copy_(np.array([2**63], np.uint64))  # into a float tensor: converted, not refused
        assert f.item() == 2.0**63


def test_numpy_is_a_copy_that_outlives_the_segment(tape):
    with tape.segment():
        t = tape.tensor(np.ones(3, dtype=np.float32))
        a = t.numpy()
    assert not t.is_live
    a[0] = 5  # writable: the array owns its copy
    assert a.tolist() == [5, 1, 1]


def test_operators_match_numpy(tape):
    g = np.random.default_rng(1)
    a = g.standard_normal((3, 4)).astype(np.float32)
    b = g.standard_normal((3, 4)).astype(np.float32) + 3
    w = g.standard_normal((4, 2)).astype(np.float32)
    with tape.segment():
        A, B, W = tape.tensor(a), tape.tensor(b), tape.tensor(w)
        checks = {
            "add": ((A + B).numpy(), a + b), "sub": ((A - B).numpy(), a - b), "mul": ((A * B).numpy(), a * b),
            "div": ((A / B).numpy(), a / b), "neg": ((-A).numpy(), -a), "scale": ((A * 2.0).numpy(), a * 2),
            "rscale": ((0.5 * A).numpy(), a * 0.5), "div_scalar": ((A / 4.0).numpy(), a / 4),
            "matmul": ((A @ W).numpy(), a @ w), "tanh": (A.tanh().numpy(), np.tanh(a)),
            "sigmoid": (A.sigmoid().numpy(), 1 / (1 + np.exp(-a))), "relu": (A.relu().numpy(), np.maximum(a, 0)),
            "exp": (A.exp().numpy(), np.exp(a)), "log": (B.log().numpy(), np.log(b)),
            "softplus": (segtape.softplus(A).numpy(), np.log1p(np.exp(a))),
            "fn_sum": (segtape.sum(A, axis=0).numpy(), a.sum(0)), "fn_mean": (segtape.mean(A).numpy(), a.mean()),
            "fn_reshape": (segtape.reshape(A, (4, 3)).numpy(), a.reshape(4, 3)),
            "fn_transpose": (segtape.transpose(A).numpy(), a.T), "fn_tanh": (segtape.tanh(A).numpy(), np.tanh(a)),
            "sum": (A.sum().numpy(), a.sum()), "sum0": (A.sum(0).numpy(), a.sum(0)),
            "mean1": (A.mean(axis=-1).numpy(), a.mean(-1)), "T": (A.T.numpy(), a.T),
            "reshape": (A.reshape([4, 3]).numpy(), a.reshape(4, 3)),
            "softmax": (A.softmax().numpy(), np.exp(a) / np.exp(a).sum(-1, keepdims=True)),
            "concat": (segtape.concat([A, B], axis=1).numpy(), np.concatenate([a, b], 1)),
            "slice": (segtape.slice(A, 1, 1, 2).numpy(), a[:, 1:3]),
        }
        for name, (got, want) in checks.items():
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=name)


def test_adding_zero_is_the_identity_and_other_numbers_are_refused(tape):
    with tape.segment():
        a = tape.tensor([1.0, 2.0])
        assert sum([a, a]).numpy().tolist() == [2.0, 4.0]  # sum() starts from 0
        assert (0 + a).numpy().tolist() == [1.0, 2.0]
        with pytest.raises(TypeError, match="only when the number is 0"):
            a + 1.0


def test_division_by_a_zero_scalar_is_pytorchs(tape):
    with tape.segment():
        got = (tape.tensor([1.0, -1.0, 0.0]) / 0.0).numpy()
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


def test_backward_gives_parameter_gradients(tape):
    w = tape.parameter([3])
    w.copy_(np.array([1, 2, 3], dtype=np.float32))
    with tape.segment() as seg:
        x = tape.tensor(np.array([2, 3, 4], dtype=np.float32))
        seg.backward((w * x).sum())
    assert w.grad.numpy().tolist() == [2, 3, 4]
    tape.zero_grad()
    assert w.grad.numpy().tolist() == [0, 0, 0]


def test_carry_keeps_the_value_and_cuts_the_history(tape):
    with tape.segment() as seg:
        h = tape.tensor(np.ones((1, 2), dtype=np.float32)).tanh()
        c = seg.carry(h)
    assert c.space == "carry" and not h.is_live
    with tape.segment():
        np.testing.assert_allclose(c.numpy(), np.tanh(np.ones((1, 2))), rtol=1e-6)
        assert c.is_live


def test_gradient_carry_matches_one_long_segment(tape):
    """Exact BPTT across a boundary: seg.input / seg.grad / seeded backward
    give the gradient of one segment over both halves."""
    w = tape.parameter([2, 2])
    w.copy_(np.array([[0.5, -0.2], [0.1, 0.3]], dtype=np.float32))
    x0 = np.array([[1.0, -1.0]], dtype=np.float32)

    def steps(h, n):
        for _ in range(n):
            h = (h @ w).tanh()
        return h

    with tape.segment() as seg:  # reference: 4 steps in one segment
        seg.backward(steps(tape.tensor(x0), 4).sum())
    want = w.grad.numpy().copy()
    assert np.abs(want).max() > 1e-2
    tape.zero_grad()
    with tape.segment() as seg:  # forward of the first half, state stored
        h_mid = seg.carry(steps(tape.tensor(x0), 2))
    with tape.segment() as seg:  # second half: its gradient, and dL/dh_mid handed back
        leaf = seg.input(h_mid)
        seg.backward(steps(leaf, 2).sum())
        dh = seg.carry(seg.grad(leaf))
    with tape.segment() as seg:  # first half replayed, seeded with dL/dh_mid
        h = steps(tape.tensor(x0), 2)
        seg.backward(seeds=[(h, dh)])
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6, atol=1e-7)


def test_no_grad_records_nothing(tape):
    w = tape.parameter([2])
    with tape.segment():
        with tape.no_grad():
            y = w * w
        assert tape.stats()["node_count"] == 0
        with pytest.raises(segtape.TapeError):
            tape.segment()  # one segment at a time
    del y


def test_stats_explain_and_dot(tape):
    rng = nn.Rng(0)

    class Net(nn.Module):
        def __init__(self, t):
            super().__init__(t)
            self.gru = nn.GRUCell(t, 4, 8, rng=rng)

    net = Net(tape)
    with tape.segment():
        h = None
        for _ in range(3):
            h = net.gru(tape.zeros([2, 4]), h)
            tape.next_step()
        e = tape.explain()
        d = e.to_dict()
        assert d["node_count"] == 3 and d["nodes_by_op"] == {"GruCell": 3}
        assert d["bytes_per_step"] > 0 and "retained" in str(e)
        s = tape.stats()
        assert s["live_bytes"] > 0 and s["bytes_by_op"]["GruCell"] > 0
        dot = tape.to_dot(names=net)
        assert dot.startswith("digraph") and "gru.weight_hh" in dot
    assert tape.stats()["last_segment_peak"] >= s["live_bytes"]


def test_module_registration_gives_pytorch_names_and_refuses_duplicates(tape):
    class Net(nn.Module):
        def __init__(self, t):
            super().__init__(t)
            self.encoder = nn.Linear(t, 3, 4)
            self.core = nn.GRU(t, 4, 5, num_layers=2)
            self.extra = self.register_parameter("extra", [2])

    net = Net(tape)
    names = [n for n, _ in net.named_parameters()]
    assert names[:3] == ["extra", "encoder.weight", "encoder.bias"]
    assert "core.weight_hh_l1" in names and net.parameter_count() == sum(t.numel() for _, t in net.named_parameters())
    with pytest.raises(segtape.Error):
        net.encoder = nn.Linear(tape, 3, 4)


def test_gru_layer_and_optimizers(tape):
    gru = nn.GRU(tape, 3, 4, num_layers=1, rng=nn.Rng(2))
    for opt in (nn.SGD(gru, lr=0.1, momentum=0.9), nn.Adam(gru, lr=1e-2), nn.AdamW(gru, lr=1e-2)):
        before = [t.numpy().copy() for t in gru.parameters()]
        with tape.segment() as seg:
            out, h_n = gru(tape.tensor(np.ones((5, 2, 3), dtype=np.float32)))
            assert out.shape == (5, 2, 4) and h_n.shape == (1, 2, 4)
            seg.backward(out.mean())
        norm = nn.clip_grad_norm(gru, 1e9)
        assert norm > 0
        opt.step()
        opt.zero_grad()
        assert opt.step_count == 1
        assert any(not np.array_equal(b, t.numpy()) for b, t in zip(before, gru.parameters()))


def test_manual_seed_makes_initialisation_repeatable(tape):
    nn.manual_seed(7)
    a = nn.Linear(tape, 3, 3).weight.numpy()
    nn.manual_seed(7)
    b = nn.Linear(tape, 3, 3).weight.numpy()
    assert np.array_equal(a, b)


def test_agent_sparse_recall_and_update_bias():
    """make_env(sparse=True) adds the blank token; TrainConfig.update_bias is validated by name."""
    A = segtape._segtape.agent
    dense = A.make_env("recall", batch=2, seed=1, lag=4, vocab=3)
    sparse = A.make_env("recall", batch=2, seed=1, lag=4, vocab=3, sparse=True)
    assert (dense.vocab, sparse.vocab) == (3, 4)
    assert (dense.num_actions, sparse.num_actions) == (3, 3)
    for other in ("tmaze", "dialogue"):  # no sparse form: refused, not ignored
        with pytest.raises(Exception, match=other + ": sparse is recall's option"):
            A.make_env(other, batch=2, seed=1, sparse=True)
    assert (A.TrainConfig().update_bias, A.TrainConfig().lag, A.TrainConfig().vocab, A.TrainConfig().sparse) == (0.0, 8, 4, False)

    def config(bias):
        c = A.TrainConfig()
        c.env, c.history, c.steps, c.batch, c.hidden, c.embed = "recall", "tbptt:4", 8, 2, 8, 4
        c.update_bias, c.lag, c.sparse = bias, 4, True
        return c

    c = config(3.0)
    assert (c.update_bias, c.lag, c.vocab, c.sparse) == (3.0, 4, 4, True)
    c.validate()
    t = A.Trainer(c)
    biased, plain = t.parameters(), A.Trainer(config(0.0)).parameters()
    assert (5, 4) in [p.shape for p in plain]  # the embedding: vocab 4 + the blank, embed 4 (dense: (4, 4))
    # the update bias changes one tensor, gru.bias_hh [3H], in its z block [H:2H] only, by the bias
    changed = [i for i, (a, b) in enumerate(zip(biased, plain)) if not np.array_equal(a, b)]
    assert len(changed) == 1
    d, H = biased[changed[0]] - plain[changed[0]], 8
    assert d.shape == (3 * H,)
    assert np.allclose(d[H:2 * H], 3.0, atol=1e-6) and not d[:H].any() and not d[2 * H:].any()
    while not t.done():
        t.run_segment()
    assert np.isnan(t.evaluate(4, 1))  # sparse recall at lag 4 asks its first question at step 4
    assert 0 <= t.evaluate(8, 1) <= 1
    c.update_bias = float("nan")
    with pytest.raises(Exception, match="--update-bias"):
        c.validate()
