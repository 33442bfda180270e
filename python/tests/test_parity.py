"""Parity with PyTorch from Python: values and gradients of GRUCell + Linear +
cross-entropy (<= 1e-5), and safetensors checkpoints both ways."""
import numpy as np
import pytest

import segtape
from segtape import nn

torch = pytest.importorskip("torch")


class Net(nn.Module):
    def __init__(self, tape, rng):
        super().__init__(tape)
        self.gru = nn.GRUCell(tape, 6, 8, rng=rng)
        self.head = nn.Linear(tape, 8, 5, rng=rng)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRUCell(6, 8)
        self.head = torch.nn.Linear(8, 5)


def copy_weights(net, ref):
    with torch.no_grad():
        for (name, t), (tname, p) in zip(net.named_parameters(), ref.named_parameters()):
            assert name == tname
            p.copy_(torch.from_numpy(t.numpy()))


def test_gru_linear_cross_entropy_values_and_gradients():
    tape = segtape.Tape()
    net = Net(tape, nn.Rng(3))
    ref = TorchNet()
    copy_weights(net, ref)
    gen = np.random.default_rng(0)
    xs = gen.standard_normal((4, 3, 6)).astype(np.float32)  # 4 steps, batch 3
    ys = gen.integers(0, 5, size=(4, 3))
    with tape.segment() as seg:
        h = None
        loss = tape.zeros([])
        for x, y in zip(xs, ys):
            h = net.gru(tape.tensor(x), h)
            loss = loss + segtape.cross_entropy(net.head(h), tape.tensor(y))
        seg.backward(loss)
        value = loss.item()
    th = None
    tloss = 0
    for x, y in zip(xs, ys):
        th = ref.gru(torch.from_numpy(x), th)
        tloss = tloss + torch.nn.functional.cross_entropy(ref.head(th), torch.from_numpy(y))
    tloss.backward()
    assert abs(value - tloss.item()) <= 1e-5 * max(1.0, abs(tloss.item()))
    for (name, t), (_, p) in zip(net.named_parameters(), ref.named_parameters()):
        got, want = t.grad.numpy(), p.grad.numpy()
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), name


def test_safetensors_round_trip_with_torch(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tape = segtape.Tape()
    net = Net(tape, nn.Rng(5))
    path = tmp_path / "net.safetensors"
    nn.save(net, path, {"note": "from segtape"})
    ref = TorchNet()
    ref.load_state_dict(safetensors_torch.load_file(str(path)), strict=True)
    for (name, t), (_, p) in zip(net.named_parameters(), ref.named_parameters()):
        assert np.array_equal(t.numpy(), p.detach().numpy()), name
    # and back: torch's weights, changed, into segtape
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(2.0)
    back = tmp_path / "torch.safetensors"
    safetensors_torch.save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(back))
    report = nn.load(net, back)
    assert report["missing_keys"] == [] and report["unexpected_keys"] == []
    for (name, t), (_, p) in zip(net.named_parameters(), ref.named_parameters()):
        assert np.array_equal(t.numpy(), p.detach().numpy()), name


def test_torch_state_dict_names_are_segtape_names():
    tape = segtape.Tape()
    net = Net(tape, nn.Rng(0))
    assert [n for n, _ in net.named_parameters()] == list(TorchNet().state_dict().keys())


def test_gru_sequence_with_per_stream_resets_equals_torch_masking_the_state():
    """keep [T, B]: the state entering step t is keep[t] * h (PyTorch: h * (1 - done))."""
    tape = segtape.Tape()
    net = Net(tape, nn.Rng(7))
    ref = TorchNet()
    copy_weights(net, ref)
    p = dict(net.named_parameters())
    gen = np.random.default_rng(1)
    T, B = 6, 3
    xs = gen.standard_normal((T, B, 6)).astype(np.float32)
    done = np.zeros((T, B), dtype=np.float32)
    done[0, 0] = done[2, 1] = done[3, 1] = done[5, 2] = 1  # episode ends before these steps
    w = gen.standard_normal((T, B, 8)).astype(np.float32)
    with tape.segment() as seg:
        h0 = tape.zeros([B, 8])
        ys = segtape.gru_sequence(tape.tensor(xs), h0, p["gru.weight_ih"], p["gru.weight_hh"], p["gru.bias_ih"],
                                  p["gru.bias_hh"], keep=tape.tensor(1 - done))
        loss = (ys * tape.tensor(w)).sum()
        seg.backward(loss)
        got = ys.numpy()
    th = torch.zeros(B, 8)
    outs = []
    for t in range(T):
        th = ref.gru(torch.from_numpy(xs[t]), th * (1 - torch.from_numpy(done[t])).unsqueeze(1))
        outs.append(th)
    want = torch.stack(outs)
    (want * torch.from_numpy(w)).sum().backward()
    assert np.abs(got - want.detach().numpy()).max() <= 1e-5
    for name, tp in ref.gru.named_parameters():
        g, wg = p["gru." + name].grad.numpy(), tp.grad.numpy()
        assert np.abs(g - wg).max() <= 1e-5 * max(1.0, np.abs(wg).max()), name
    # without keep the same inputs give other states: the resets took effect
    with tape.segment():
        plain = segtape.gru_sequence(tape.tensor(xs), tape.zeros([B, 8]), p["gru.weight_ih"], p["gru.weight_hh"],
                                     p["gru.bias_ih"], p["gru.bias_hh"]).numpy()
    assert np.abs(plain - got).max() > 1e-3


def test_nn_gru_passes_keep_to_its_layers():
    tape = segtape.Tape()
    gru = nn.GRU(tape, 4, 5, num_layers=1, rng=nn.Rng(2))
    p = dict(gru.named_parameters())
    gen = np.random.default_rng(3)
    xs = gen.standard_normal((4, 2, 4)).astype(np.float32)
    keep = np.ones((4, 2), dtype=np.float32)
    keep[1, 0] = keep[3, 1] = 0
    with tape.segment():
        x = tape.tensor(xs)
        out, h_n = gru(x, None, keep=tape.tensor(keep))
        want = segtape.gru_sequence(x, tape.zeros([2, 5]), p["weight_ih_l0"], p["weight_hh_l0"], p["bias_ih_l0"],
                                    p["bias_hh_l0"], keep=tape.tensor(keep))
        assert np.array_equal(out.numpy(), want.numpy())
        assert not np.array_equal(out.numpy(), gru(x)[0].numpy())


class LstmNet(nn.Module):
    def __init__(self, tape, rng, dropout=0.0):
        super().__init__(tape)
        self.lstm = nn.LSTM(tape, 6, 8, num_layers=2, dropout=dropout, dropout_seed=4, rng=rng)
        self.head = nn.Linear(tape, 8, 5, rng=rng)


class TorchLstmNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, num_layers=2)
        self.head = torch.nn.Linear(8, 5)


def test_lstm_linear_cross_entropy_values_and_gradients():
    tape = segtape.Tape()
    net = LstmNet(tape, nn.Rng(3))
    ref = TorchLstmNet()
    copy_weights(net, ref)
    gen = np.random.default_rng(0)
    T, B = 5, 3
    xs = gen.standard_normal((T, B, 6)).astype(np.float32)
    h0, c0 = (gen.standard_normal((2, B, 8)).astype(np.float32) for _ in range(2))
    ys = gen.integers(0, 5, size=(T * B,))
    with tape.segment() as seg:
        out, (h_n, c_n) = net.lstm(tape.tensor(xs), (tape.tensor(h0), tape.tensor(c0)))
        loss = segtape.cross_entropy(net.head(out.reshape([T * B, 8])), tape.tensor(ys))
        seg.backward(loss)
        got = [loss.item(), out.numpy(), h_n.numpy(), c_n.numpy()]
    tout, (th, tc) = ref.lstm(torch.from_numpy(xs), (torch.from_numpy(h0), torch.from_numpy(c0)))
    tloss = torch.nn.functional.cross_entropy(ref.head(tout.reshape(T * B, 8)), torch.from_numpy(ys))
    tloss.backward()
    assert abs(got[0] - tloss.item()) <= 1e-5 * max(1.0, abs(tloss.item()))
    for g, w in zip(got[1:], (tout, th, tc)):
        assert np.abs(g - w.detach().numpy()).max() <= 1e-5
    for (name, t), (_, p) in zip(net.named_parameters(), ref.named_parameters()):
        got_g, want = t.grad.numpy(), p.grad.numpy()
        assert np.abs(got_g - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), name


def test_lstm_cell_is_torchs():
    tape = segtape.Tape()
    cell = nn.LSTMCell(tape, 4, 3, rng=nn.Rng(1))
    ref = torch.nn.LSTMCell(4, 3)
    copy_weights(cell, ref)
    gen = np.random.default_rng(2)
    x, h, c = (gen.standard_normal(s).astype(np.float32) for s in ((2, 4), (2, 3), (2, 3)))
    with tape.segment():
        h1, c1 = cell(tape.tensor(x), (tape.tensor(h), tape.tensor(c)))
        z1, zc = cell(tape.tensor(x))  # no state: zeros
        state = segtape.lstm_cell(tape.tensor(x), segtape.lstm_state(tape.tensor(h), tape.tensor(c)), *(t for _, t in cell.named_parameters()))
        got = [h1.numpy(), c1.numpy(), z1.numpy(), zc.numpy()]
        assert np.array_equal(segtape.lstm_h(state).numpy(), got[0]) and np.array_equal(segtape.lstm_c(state).numpy(), got[1])
    th, tc = ref(torch.from_numpy(x), (torch.from_numpy(h), torch.from_numpy(c)))
    tz, tzc = ref(torch.from_numpy(x))
    for g, w in zip(got, (th, tc, tz, tzc)):
        assert np.abs(g - w.detach().numpy()).max() <= 1e-5


def test_lstm_safetensors_round_trip_with_torch(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tape = segtape.Tape()
    net = LstmNet(tape, nn.Rng(5))
    assert [n for n, _ in net.named_parameters()] == list(TorchLstmNet().state_dict().keys())
    path = tmp_path / "lstm.safetensors"
    nn.save(net, path)
    ref = TorchLstmNet()
    ref.load_state_dict(safetensors_torch.load_file(str(path)), strict=True)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(-0.5)
    back = tmp_path / "torch.safetensors"
    safetensors_torch.save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(back))
    report = nn.load(net, back)
    assert report["missing_keys"] == [] and report["unexpected_keys"] == []
    for (name, t), (_, p) in zip(net.named_parameters(), ref.named_parameters()):
        assert np.array_equal(t.numpy(), p.detach().numpy()), name


def test_dropout_between_lstm_layers_on_recorded_masks_is_torchs():
    """Training mode, dropout 0.3: the masks drawn as a step's input; torch runs
    the layers one by one with the same masks on the first layer's output."""
    tape = segtape.Tape()
    net = LstmNet(tape, nn.Rng(6), dropout=0.3)
    ref = TorchLstmNet()
    copy_weights(net, ref)
    T, B = 4, 2
    xs = np.random.default_rng(1).standard_normal((T, B, 6)).astype(np.float32)
    masks = net.lstm.dropout_masks(T, B)
    assert masks.shape == (1, T, B, 8) and 0 < (masks == 0).mean() < 1
    assert set(np.unique(masks)) <= {0.0, np.float32(1) / np.float32(0.7)}
    with tape.segment() as seg:
        out, _ = net.lstm(tape.tensor(xs), None, dropout_masks=tape.tensor(masks))
        seg.backward(out.sum())
        got = out.numpy()
    p = dict(ref.lstm.named_parameters())
    layer = lambda x, k: torch._VF.lstm(x, (torch.zeros(1, B, 8), torch.zeros(1, B, 8)),  # noqa: E731
                                        [p[f"{n}_l{k}"] for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")],
                                        True, 1, 0.0, True, False, False)[0]
    want = layer(layer(torch.from_numpy(xs), 0) * torch.from_numpy(masks[0]), 1)
    want.sum().backward()
    assert np.abs(got - want.detach().numpy()).max() <= 1e-5
    for name, t in net.lstm.named_parameters():
        assert np.abs(t.grad.numpy() - p[name].grad.numpy()).max() <= 1e-5 * max(1.0, np.abs(p[name].grad.numpy()).max()), name
    # eval(): no dropout, whatever masks are given
    net.eval()
    assert not net.lstm.training
    with tape.segment():
        a = net.lstm(tape.tensor(xs), None, dropout_masks=tape.tensor(masks))[0].numpy()
        b = net.lstm(tape.tensor(xs))[0].numpy()
    assert np.array_equal(a, b) and not np.array_equal(a, got)


def test_dropout_module_train_eval_and_masks():
    tape = segtape.Tape()
    drop = nn.Dropout(tape, 0.25, seed=3)
    x = np.ones((4, 50), dtype=np.float32)
    with tape.segment():
        y = drop(tape.tensor(x)).numpy()
        assert set(np.unique(y)) <= {0.0, np.float32(1) / np.float32(0.75)}
        m = drop.mask([4, 50])
        assert np.array_equal(drop.apply(tape.tensor(x), tape.tensor(m)).numpy(), x * m)
        state = drop.rng.state
        assert drop.eval() is drop and not drop.training
        assert np.array_equal(drop(tape.tensor(x)).numpy(), x)
        assert np.array_equal(drop.mask([3]), np.ones(3, dtype=np.float32))
        assert drop.rng.state == state  # eval draws nothing
        drop.train()
        assert drop.training
    with pytest.raises(Exception, match=r"nn::Dropout: the dropout probability must be in \[0, 1\), got 1"):
        nn.Dropout(tape, 1.0)


def bf16(a):
    """float32 values rounded to bfloat16 (ties to even), as float32."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).bfloat16().float().numpy()


def test_bf16_linear_is_torch_autocast_bfloat16_on_the_cpu():
    """A Linear layer (no bias) on a Tape(precision="bf16") against the same
    layer under torch.autocast("cpu", torch.bfloat16): the forward products of
    bfloat16 operands accumulated in float32 and rounded to bfloat16 on both
    sides, so within a bfloat16 rounding of each other (summation orders
    differ); float32's values are further off. The weight gradients below."""
    tape = segtape.Tape(precision="bf16")
    net = nn.Linear(tape, 64, 32, bias=False, rng=nn.Rng(5))
    ref = torch.nn.Linear(64, 32, bias=False)
    copy_weights(net, ref)
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    g = np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32)
    with tape.segment() as seg:
        y = net(tape.tensor(x))
        seg.backward(y, grad_output=tape.tensor(g))
        got = y.numpy()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ty = ref(torch.from_numpy(x))
    assert ty.dtype == torch.bfloat16
    ty.float().backward(torch.from_numpy(g))
    want = ty.float().detach().numpy()
    assert (np.abs(got - want) <= 2.0**-7 * np.abs(want) + 1e-6).all(), np.abs(got - want).max()
    f32 = x @ ref.weight.detach().numpy().T
    assert np.abs(f32 - want).max() > 1e-3 and np.abs(got - f32).max() > 1e-3  # (bf16 on both sides, not float32)
    # The weight gradient: segtape's is the exact product of the rounded
    # operands, rounded (within half a bfloat16 step); PyTorch 1.13's CPU
    # GEMM for bfloat16 adds that product up in bfloat16 (0.8 % of the
    # largest value off the exact product here), so the two agree to 2 %.
    got_grad, want_grad = dict(net.named_parameters())["weight"].grad.numpy(), ref.weight.grad.numpy()
    exact = bf16(g).T.astype(np.float64) @ bf16(x).astype(np.float64)
    assert (np.abs(got_grad - exact) <= 2.0**-8 * np.abs(exact) + 1e-6).all(), np.abs(got_grad - exact).max()
    assert np.abs(got_grad - want_grad).max() <= 0.02 * np.abs(exact).max()
    with pytest.raises(segtape.Error, match="'fp16' is not a precision"):
        segtape.Tape(precision="fp16")
