"""segtape.nn: PyTorch's layers, optimizers and checkpoints on a segtape Tape.

Names, shapes, equations and initialisation are PyTorch's (docs/nn.md); a
layer takes its tape first, and an `rng` (segtape.nn.Rng) that defaults to
this module's generator, seeded by manual_seed (0 at import)."""
import os as _os

from ._segtape import Error
from ._segtape import nn as _N

Rng = _N.Rng
Optimizer = _N.Optimizer
SGD = _N.SGD
Adam = _N.Adam
AdamW = _N.AdamW
clip_grad_norm = _N.clip_grad_norm
clip_grad_norm_ = _N.clip_grad_norm  # torch.nn.utils' name
ModuleBase = _N.Module  # every module, C++ layers and Python containers alike

_default = [Rng(0)]


def manual_seed(seed):
    """Reseeds the generator layers use when no rng is given; returns it.
    seed: an int in [0, 2^64 - 1] (segtape.Error otherwise)."""
    seed = int(seed)
    if not 0 <= seed <= 2**64 - 1:
        raise Error(f"segtape.nn.manual_seed: seed must be in [0, 2^64 - 1], got {seed}")
    _default[0] = Rng(seed)
    return _default[0]


def default_rng():
    """The generator layers draw their initial weights from when no rng is
    given (segtape.nn.Rng, seeded 0 until manual_seed reseeds it)."""
    return _default[0]


class Module(_N.Module):
    """A container of layers and parameters, as torch.nn.Module: assigning a
    module to an attribute registers it under that name, so parameters get
    PyTorch's dotted names ("gru.weight_hh") for optimizers and checkpoints.
    Subclasses call super().__init__(tape) first and define forward()."""

    def __init__(self, tape):
        super().__init__(tape)

    def __setattr__(self, name, value):
        if isinstance(value, _N.Module):
            self._register_module(name, value)
        super().__setattr__(name, value)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """The module's computation, called by module(...): a subclass defines it
        (NotImplementedError here)."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def state_dict(self):
        """{name: NumPy copy} in PyTorch's order and names."""
        return {name: t.numpy() for name, t in self.named_parameters()}


def _rng(rng):
    return _default[0] if rng is None else rng


def _call_forward(self, *args, **kwargs):
    return self.forward(*args, **kwargs)


class _Layer:
    """The C++ layers' Python classes (Linear, Embedding, GRUCell, GRU,
    LSTMCell, LSTM, Dropout) call
    their C++ forward straight from __call__; a subclass whose forward is
    another is called through it, as torch.nn.Module.__call__ calls
    self.forward (m(x) skipped an overriding forward)."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cpp = next(b for b in cls.__mro__ if b.__module__ == _N.__name__)  # (the bound class: _N.Linear, ...)
        if cls.forward is not cpp.forward and cls.__call__ is cpp.__call__:
            cls.__call__ = _call_forward


class Linear(_Layer, _N.Linear):
    """y = x W^T + b (torch.nn.Linear)."""

    def __init__(self, tape, in_features, out_features, bias=True, *, rng=None):
        super().__init__(tape, in_features, out_features, bias, _rng(rng))


class Embedding(_Layer, _N.Embedding):
    """A lookup table [num_embeddings, embedding_dim] (torch.nn.Embedding)."""

    def __init__(self, tape, num_embeddings, embedding_dim, *, rng=None):
        super().__init__(tape, num_embeddings, embedding_dim, _rng(rng))


class GRUCell(_Layer, _N.GRUCell):
    """torch.nn.GRUCell: forward(x [B, I], h [B, H] or None) -> h' [B, H]."""

    def __init__(self, tape, input_size, hidden_size, bias=True, *, rng=None):
        super().__init__(tape, input_size, hidden_size, bias, _rng(rng))


class GRU(_Layer, _N.GRU):
    """torch.nn.GRU (sequence-first): forward(x [T, B, I], h0, keep=None,
    dropout_masks=None) -> (output, h_n).

    keep [T, B] (segtape's, not torch's): per-stream resets, every layer's
    state entering step t multiplied by keep[t, b] (0 starts an episode).
    dropout: torch's dropout= between layers (training mode only), its masks
    drawn from a generator of dropout_seed, or given: dropout_masks(T, B)
    draws them as a NumPy array [num_layers - 1, T, B, H] (a step's input)."""

    def __init__(self, tape, input_size, hidden_size, num_layers=1, bias=True, dropout=0.0, *, dropout_seed=0, rng=None):
        super().__init__(tape, input_size, hidden_size, num_layers, bias, dropout, dropout_seed, _rng(rng))


class LSTMCell(_Layer, _N.LSTMCell):
    """torch.nn.LSTMCell: forward(x [B, I], (h, c) or None) -> (h', c'), [B, H] each
    (gates i, f, g, o)."""

    def __init__(self, tape, input_size, hidden_size, bias=True, *, rng=None):
        super().__init__(tape, input_size, hidden_size, bias, _rng(rng))


class LSTM(_Layer, _N.LSTM):
    """torch.nn.LSTM (sequence-first): forward(x [T, B, I], (h0, c0) or None,
    dropout_masks=None) -> (output [T, B, H], (h_n, c_n) [num_layers, B, H]).

    dropout: between layers as GRU's (dropout_masks(T, B), dropout_seed)."""

    def __init__(self, tape, input_size, hidden_size, num_layers=1, bias=True, dropout=0.0, *, dropout_seed=0, rng=None):
        super().__init__(tape, input_size, hidden_size, num_layers, bias, dropout, dropout_seed, _rng(rng))


class Dropout(_Layer, _N.Dropout):
    """torch.nn.Dropout: in training mode x * mask, the mask's elements 0 with
    probability p and 1 / (1 - p) otherwise; x itself after eval().

    Its masks come from a generator of its own (seed; .rng). mask(shape)
    draws one as a NumPy array, for a step that takes its masks as inputs,
    and apply(x, mask) applies it."""

    def __init__(self, tape, p=0.5, *, seed=0):
        super().__init__(tape, p, seed)


def save(module, path, metadata=None):
    """The module's parameters to a safetensors file with PyTorch's names
    (atomic: a failed save never replaces a good file)."""
    _N.save(module, _os.fspath(path), dict(metadata or {}))  # str, bytes (any bytes: a path as the OS has it)


def load(module, path, strict=True):
    """Parameters from a safetensors file (torch's load_state_dict rules);
    the whole file is checked before anything is copied. Returns
    {"missing_keys", "unexpected_keys", "metadata"}."""
    return _N.load(module, _os.fspath(path), strict)
