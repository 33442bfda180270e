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
