"""segtape: a reverse-mode autograd engine whose tape is cut into segments.

Everything a segment records lives in one arena that is reset when the
segment ends, so memory per segment is fixed by construction:

    import segtape
    tape = segtape.Tape(device="cpu", segment_budget="64MiB")
    with tape.segment() as seg:
        ...                      # ops record into the segment
        seg.backward(loss)       # gradients accumulate into the parameters
        h = seg.carry(h)         # value kept, history cut

docs/python.md documents the API; the C++ library it wraps is documented in
docs/design.md.
"""
import atexit as _atexit
import re as _re

import numpy as _np

from . import _segtape as _C
from ._segtape import (  # noqa: F401  (re-exported)
    AnomalyError,
    BudgetError,
    CheckpointError,
    DeviceError,
    Error,
    ExpiredTensorError,
    Explanation,
    IndexError,
    NonFiniteError,
    OutOfMemoryError,
    SEGMENT_ARENA_POOL,
    Segment,
    ShapeError,
    TapeError,
    Tensor,
    blas_better_kernels,
    blas_kernels,
    cuda_built,
    format_bytes,
    kernel_options,
    packed_kernel,
    set_kernel_options,
)

__version__ = "0.1.0"


def _warn_if_generic_blas():
    """OpenBLAS reads OPENBLAS_CORETYPE only when it loads, before segtape can
    set it (the segtape program restarts itself instead): say so once."""
    better = blas_better_kernels()
    if better:
        import warnings

        warnings.warn(
            f"OpenBLAS did not recognise this CPU and runs its generic {blas_kernels()} kernels: segtape's CPU "
            f"products are several times slower. Start Python with OPENBLAS_CORETYPE={better} in the "
            "environment (docs/benchmarks.md).",
            RuntimeWarning,
            stacklevel=3,
        )


_warn_if_generic_blas()

# The longest the interpreter's exit waits for segtape calls still running in
# daemon threads (docs/python.md, "Threads and the interpreter's exit").
_EXIT_WAIT_SECONDS = 5.0


def _at_exit():
    """Runs before the interpreter finalizes, while daemon threads still run:
    from here on the calls that release the GIL or run Python code from C++
    (Trainer(), run_segment, evaluate, retention.run, make_env, the dist
    collectives) raise RuntimeError, running ones stop at their next boundary,
    and this waits for them. A daemon thread that finalization ends inside
    such a call ends the process with std::terminate (CPython ends it with
    pthread_exit, whose unwinding no nanobind call lets through)."""
    left = _C._at_exit(_EXIT_WAIT_SECONDS)
    if left:
        # Finalization would end that thread inside its call (std::terminate,
        # rc 134, or a segfault): the process ends here instead, its output
        # flushed, with status 1 (the status the program would have exited
        # with cannot be read here). The atexit handlers registered before
        # `import segtape` do not run.
        import os
        import sys

        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # (a closed stream: nothing to flush)
                pass
        try:
            print(f"segtape: {left} call(s) in daemon threads still running {_EXIT_WAIT_SECONDS:g} s after the interpreter "
                  "began to exit; the process ends now with status 1 (os._exit), not in std::terminate during "
                  "finalization", file=sys.stderr, flush=True)
        except Exception:
            pass
        os._exit(1)


_atexit.register(_at_exit)

_UINT32_MAX = 2**32 - 1
# The ranges of the C++ fields' types an int argument goes into (nanobind
# refuses a value beyond them with a TypeError that names neither the call
# nor the argument).
_INT64 = (-2**63, 2**63 - 1)
_UINT64 = (0, 2**64 - 1)  # also size_t


def _bound(n):
    """An end of a C++ type's range as people write it (2^64 - 1)."""
    for p in (64, 63):
        if n == 2**p - 1:
            return f"2^{p} - 1"
        if n == -2**p:
            return f"-2^{p}"
    return str(n)


def _out_of_range(call, name, value, lo, hi):
    return Error(f"{call}: {name} must be in [{_bound(lo)}, {_bound(hi)}], got {value}")


def _set_ints(config, ints, call, named):
    """config.<name> = value for each (name, value, (lo, hi)) of ints, where
    [lo, hi] is the C++ field's type, then config.validate(), whose error
    `named` names as the caller takes its arguments. A value beyond its
    type is refused naming the call and the argument: with validate()'s
    message for the type's end nearest to it (e.g. "batch must be in [1,
    65536]") where that message is the same one value further in (it does
    not print the value, which is not the caller's), else with the type's
    range."""
    beyond = []
    for name, value, (lo, hi) in ints:
        if lo <= value <= hi:
            setattr(config, name, value)
        else:
            beyond.append((name, value, lo, hi))

    def validated(inward):
        for name, value, lo, hi in beyond:
            setattr(config, name, hi - inward if value > hi else lo + inward)
        try:
            config.validate()
        except Error as e:
            return e
        return None

    if beyond:
        at_end, further_in = validated(0), validated(1)
        if at_end is not None and further_in is not None and str(at_end) == str(further_in):
            raise named(at_end)
        name, value, lo, hi = beyond[0]
        raise _out_of_range(call, name, value, lo, hi)
    error = validated(0)
    if error is not None:
        raise named(error)


def _bytes(value, what):
    """A size in bytes from an int or a string such as "64MiB"."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a size such as '64MiB' or a byte count, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise Error(f"{what} {value}: must be a positive size, such as 64MiB")
        if value > _UINT64[1]:
            raise Error(f"{what} {value}: must be a size in [1, 2^64 - 1] bytes, such as 64MiB")
        return value
    if isinstance(value, str):
        return _C.parse_bytes(value, what)
    raise TypeError(f"{what}: expected a size such as '64MiB' or a byte count, got {type(value).__name__}")


def _argument_names(text):
    """A C++ check's message with the segtape program's flags (--trainer-k)
    named as the Python functions take them (trainer_k)."""
    return _re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), text)


def _device(device):
    if isinstance(device, _C.Device):
        return device
    text = str(device)
    if text == "cpu":
        return _C.Device.cpu()
    if text == "cuda" or text.startswith("cuda:"):
        index = 0
        if text.startswith("cuda:"):
            try:
                index = int(text[5:])
            except ValueError:
                raise Error(f"device '{text}': expected 'cpu', 'cuda' or 'cuda:N'") from None
        return _C.Device.cuda(index)
    raise Error(f"device '{text}': expected 'cpu', 'cuda' or 'cuda:N'")


class Tape(_C._Tape):
    """A tape: the segment arena, the persistent pool (parameters, optimizer
    state) and the carry buffers.

    device: "cpu", "cuda" or "cuda:N". segment_budget: the arena bytes per
    segment ("64MiB" or an int); an op that would exceed it raises BudgetError
    saying what filled the segment. grow=True is the teaching policy: the arena
    grows instead of refusing (to reproduce PyTorch's retained-graph growth),
    up to grow_limit bytes if given. anomaly=True checks every op's output for
    NaN and Inf. precision="bf16" runs every matrix product on bfloat16
    operands, rounded to bfloat16, the rest in float32 (docs/precision.md;
    the CPU only for now).
    """

    def __init__(self, device="cpu", segment_budget="64MiB", *, grow=False, grow_limit=None, anomaly=False,
                 node_capacity=None, allow_tf32=False, precision="f32"):
        options = _C.TapeOptions()
        options.segment_budget = _bytes(segment_budget, "segtape.Tape: segment_budget")
        options.grow = bool(grow)
        if grow_limit is not None:
            options.grow_limit = _bytes(grow_limit, "segtape.Tape: grow_limit")
        options.anomaly = bool(anomaly)
        if node_capacity is not None:
            node_capacity = int(node_capacity)
            if not _UINT64[0] <= node_capacity <= _UINT64[1]:
                raise _out_of_range("segtape.Tape", "node_capacity", node_capacity, *_UINT64)
            options.node_capacity = node_capacity
        options.allow_tf32 = bool(allow_tf32)
        options.precision = precision
        super().__init__(_device(device), options)

    def tensor(self, values, dtype=None):
        """A tensor of the open segment holding a copy of `values` (a NumPy
        array or anything np.asarray takes). Values that carry a dtype (NumPy
        arrays and scalars, segtape and torch tensors) keep it (float32,
        float64; integers and bools become int64); Python floats and lists
        of them become float32 and Python ints int64, as torch.tensor does."""
        if dtype is not None:
            if _np.dtype(dtype) == _np.int64:
                _refuse_wrapping_uint64(values, "tape.tensor")
            a = _np.asarray(values, dtype=_np.dtype(dtype))
        elif isinstance(values, _np.ndarray):
            a = values
        else:
            a = _np.asarray(values)
            # (np.float64 is a subclass of float: its dtype says it is not a Python float)
            if a.dtype == _np.float64 and not hasattr(values, "dtype"):
                a = a.astype(_np.float32)
        _refuse_wrapping_uint64(a, "tape.tensor")
        if a.dtype.kind in "iub":
            a = a.astype(_np.int64, copy=False)
        elif a.dtype == _np.float16:
            a = a.astype(_np.float32)
        shape = list(a.shape)
        a = _np.ascontiguousarray(a).reshape(-1)  # (a 0-d array keeps its shape [])
        if a.dtype == _np.float32:
            return self._from_f32(a, shape)
        if a.dtype == _np.float64:
            return self._from_f64(a, shape)
        if a.dtype == _np.int64:
            return self._from_i64(a, shape)
        raise ShapeError(f"tape.tensor: dtype {a.dtype} is not supported (float32, float64 or int64)")

    def explain(self, top=10):
        """Who holds the memory of the open segment: str(e) is the report,
        e.to_dict() the same as a dict."""
        return self._explain(top)

    def to_dot(self, names=None, first_step=0, last_step=None, max_nodes=2000):
        """Graphviz DOT of the open segment's tape. names: a module (its
        parameters are drawn with their names) or a list of (name, tensor)."""
        pairs = []
        if names is not None:
            items = names.named_parameters() if hasattr(names, "named_parameters") else names
            pairs = [(t, n) for n, t in items]
        return self._to_dot(pairs, first_step, _UINT32_MAX if last_step is None else last_step, max_nodes)


def _backward(self, loss=None, seeds=(), *, grad_output=None, retain_graph=False, allow_overwritten=False):
    """Accumulates d(objective)/d(parameters) into the parameters' gradients.

    loss: a one-element tensor (the objective), or, with grad_output, any
    tensor of the segment whose gradient grad_output is. seeds: a list of
    (tensor, gradient) pairs added to the objective, e.g. the state leaving
    the segment with dL/dh from the segment after it (exact BPTT).
    allow_overwritten: let the backward through where a tensor one of its ops
    reads was written after the op was recorded (an optimizer step, copy_()),
    which raises TapeError otherwise; it then reads the values as they are
    now, not the ones the forward used (teaching: retained history across
    updates)."""
    if grad_output is not None:
        if seeds:
            raise TapeError("backward: give seeds or grad_output, not both")
        return self._backward_grad(loss, grad_output, retain_graph, allow_overwritten)
    if loss is None and not seeds:
        raise TapeError("backward: nothing to differentiate (give a loss, seeds, or both)")
    return self._backward(loss, list(seeds), retain_graph, allow_overwritten)


Segment.backward = _backward

_NUMPY_DTYPES = {"float32": _np.float32, "float64": _np.float64, "int64": _np.int64}


def _refuse_wrapping_uint64(values, what):
    """A uint64 value above 2^63 - 1 would wrap to a negative int64: refused."""
    raw = _np.asarray(values)
    if raw.dtype.kind == "u" and raw.dtype.itemsize == 8 and raw.size and int(raw.max()) > _np.iinfo(_np.int64).max:
        raise ShapeError(f"{what}: uint64 value {int(raw.max())} does not fit int64 (it would wrap to a negative)")


def _copy_(self, values):
    """Overwrites the tensor's values with `values` (anything np.asarray
    takes, converted to the tensor's dtype; the same shape), with no history,
    as torch's `with no_grad(): t.copy_(...)`. In place: where an op
    recorded before it reads the tensor in its backward, that backward is
    refused with a TapeError (PyTorch's "modified by an inplace operation")."""
    if self.dtype == "int64":
        _refuse_wrapping_uint64(values, "copy_()")
    a = _np.asarray(values, dtype=_NUMPY_DTYPES[self.dtype])
    if a.shape != self.shape:
        raise ShapeError(f"copy_(): an array of shape {list(a.shape)} into a tensor of shape {list(self.shape)}")
    self._copy_(_np.ascontiguousarray(a))
    return self


Tensor.copy_ = _copy_

# NumPy must not treat a Tensor as a scalar object: `array + t` made an object
# array of Tensors, silently. With __array_ufunc__ None a ufunc with a Tensor
# operand raises TypeError (as Python's operators do for unsupported types),
# and np.asarray(t) is a copy of its values, as t.numpy().
Tensor.__array_ufunc__ = None


def _array(self, dtype=None, copy=None):
    if copy is False:
        raise ValueError("segtape.Tensor: np.asarray(t, copy=False) cannot be honoured: the values are always copied (t.numpy())")
    a = self.numpy()
    return a if dtype is None else a.astype(dtype, copy=False)


Tensor.__array__ = _array


# The ops as functions, one per op of segtape/op_list.h (the extension's _ops:
# (family, kind, name); the Leaf is Segment.input): segtape.tanh(x) is
# x.tanh(), segtape.sum(x, axis=None) (torch.sum's name) x.sum(axis). One the
# extension does not bind is left out here, and test_op_list.py names it.
for _family, _kind, _name in _C._ops:
    if _family != "Leaf" and hasattr(_C, _name):
        globals()[_name] = getattr(_C, _name)
del _family, _kind, _name
detach = Tensor.detach  # a view with no history: no op of its own
# An LSTM state [2, B, H] and its (h, c): compositions of concat and slice, no ops of their own.
lstm_state, lstm_h, lstm_c = _C.lstm_state, _C.lstm_h, _C.lstm_c


from . import nn  # noqa: E402,F401
from ._segtape import dist  # noqa: E402,F401  (data parallelism: docs/distributed.md)
