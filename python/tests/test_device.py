"""device="cuda" from Python. Without a GPU, the host-emulated device
(segtape/emulation.h) runs the device paths: pools the host may not touch,
copies and updates through the backend. Values must equal the CPU tape's."""
import numpy as np
import pytest

import segtape
from segtape import _segtape, nn


@pytest.fixture
def emulated():
    _segtape._emulate_cuda_on_host(True)
    yield
    _segtape._emulate_cuda_on_host(False)


def train(device, steps=3, capturable=False):
    tape = segtape.Tape(device, segment_budget="8MiB")
    rng = nn.Rng(4)
    gru, head = nn.GRUCell(tape, 3, 8, rng=rng), nn.Linear(tape, 8, 2, rng=rng)

    class Net(nn.Module):
        def __init__(self, t):
            super().__init__(t)
            self.gru, self.head = gru, head

    net = Net(tape)
    opt = nn.Adam(net, lr=1e-2, capturable=capturable)
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    losses, h = [], None
    for _ in range(steps):
        with tape.segment() as seg:
            h = gru(tape.tensor(x), h)
            loss = segtape.cross_entropy(head(h), tape.tensor([0, 1]))
            seg.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            h = seg.carry(h)
    return tape, losses, net.state_dict(), h.numpy()


def test_emulated_device_matches_the_cpu(emulated):
    tape, losses, state, h = train("cuda")
    assert tape.device.startswith("cuda")
    _, cpu_losses, cpu_state, cpu_h = train("cpu")
    assert losses == cpu_losses
    assert np.array_equal(h, cpu_h)
    for name in cpu_state:
        assert np.array_equal(state[name], cpu_state[name]), name


def test_capturable_adam_keeps_its_step_count_on_the_device(emulated):
    # PyTorch's capturable=True: the step count lives on the device and is
    # advanced there; the updates equal the host count's, bit for bit.
    _, losses, state, h = train("cuda", steps=4, capturable=True)
    _, cpu_losses, cpu_state, cpu_h = train("cpu", steps=4)
    assert losses == cpu_losses
    assert np.array_equal(h, cpu_h)
    for name in cpu_state:
        assert np.array_equal(state[name], cpu_state[name]), name


def test_capturable_clip_keeps_the_norm_on_the_device(emulated):
    # nn.clip_grad_norm(model, max_norm, total_sq): the norm's square stays in
    # total_sq (None is returned); the gradients equal the host clip's.
    grads = {}
    for device in ("cpu", "cuda"):
        tape = segtape.Tape(device, segment_budget="8MiB")
        model = nn.Linear(tape, 3, 2, rng=nn.Rng(1))
        x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
        with tape.segment() as seg:
            seg.backward(model(tape.tensor(x)).sum())
            if device == "cpu":
                norm = nn.clip_grad_norm(model, 0.5)
            else:
                total_sq = tape.persistent([1], dtype="float64")
                assert nn.clip_grad_norm(model, 0.5, total_sq) is None
                assert np.sqrt(total_sq.numpy()[0]) == norm
            grads[device] = [p.grad.numpy() for p in (model.weight, model.bias)]
    assert norm > 0.5  # it clipped
    for a, b in zip(grads["cpu"], grads["cuda"]):
        assert np.array_equal(a, b)


def test_cuda_without_a_gpu_is_a_clear_error():
    try:
        tape = segtape.Tape("cuda")
    except segtape.DeviceError as e:  # also a RuntimeError
        assert "CUDA" in str(e) or "cuda" in str(e)
    else:  # a GPU is there: it must work
        with tape.segment():
            assert tape.tensor([1.0, 2.0]).numpy().tolist() == [1.0, 2.0]
