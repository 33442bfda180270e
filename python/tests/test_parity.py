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
