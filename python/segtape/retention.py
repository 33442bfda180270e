"""segtape.retention: the retention lab (docs/retention.md) from Python, and
memory per step of your own training loops, PyTorch's or segtape's.

    import segtape.retention as rt
    lab = rt.run(["hidden-not-detached", "tbptt"], steps=48)
    print(lab.table)                 # the lab's terminal summary
    lab.rows[0]["bytes_per_step"]    # one flat dict per case
    rt.plot(lab.series())            # memory vs step, one line per case

    curve = rt.torch_memory(step, 48)          # a PyTorch loop, step by step
    curve = rt.segtape_memory(tape, step, 48)  # a segtape loop, step by step

The lab itself runs in C++ (segtape._segtape.retention); only its segtape side
runs here, LibTorch's side needs the `segtape retention` program built with
LibTorch. torch and matplotlib are imported only by the functions that need
them.
"""
import ctypes
import csv
import gc
import hashlib
import html
import io
import json as _json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import _INT64, _UINT64, _argument_names, _bytes, _set_ints
from . import _segtape as _C
from ._segtape import Error

__all__ = ["LabResult", "cases", "plot", "run", "segtape_memory", "torch_counter", "torch_memory"]

_lab = _C.retention

# LabConfig's fields by the type run() converts them to (budget: a size).
_INT_FIELDS = ("steps", "batch", "vocab", "embed", "hidden", "lag", "k", "window", "trainer_k", "seed")
_FLOAT_FIELDS = ("lr", "clip")
_CONFIG_KEYS = _INT_FIELDS + _FLOAT_FIELDS + ("budget", "device")


def cases():
    """The lab's cases in the table's order, one dict each: name, pitfall
    (False: a fix), backward_every_step (the pitfall needs retain_graph),
    summary (what the loop does) and remedy."""
    return [dict(c) for c in _lab.cases()]


def _config(config):
    unknown = sorted(set(config) - set(_CONFIG_KEYS))
    if unknown:
        raise TypeError(f"retention.run(): unknown setting {', '.join(unknown)} (valid: {', '.join(_CONFIG_KEYS)})")
    cfg = _lab.LabConfig()
    ints = []
    for key, value in config.items():
        if key in _INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"retention.run({key}=...): expected an int, got {value!r}")
            if value < 0:
                raise Error(f"retention.run({key}={value}): must not be negative")
            ints.append((key, value, _UINT64 if key == "seed" else (0, _INT64[1])))
        elif key in _FLOAT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"retention.run({key}=...): expected a number, got {value!r}")
            setattr(cfg, key, float(value))
        elif key == "budget":
            cfg.budget = _bytes(value, "retention.run(): budget")
        else:
            cfg.device = str(value)

    def named(e):  # the lab's checks name the program's flags: named here as run() takes them
        return Error("retention.run(): " + _argument_names(re.sub(r"^retention: ", "", str(e))))
    _set_ints(cfg, ints, "retention.run()", named)
    return cfg


def _error_fields(row, prefix, error):
    """error: the JSON's "no error" or {"type", "step", "message"}."""
    have = isinstance(error, dict)
    row[prefix] = error["type"] if have else None
    row[prefix + "_step"] = error["step"] if have else None
    row[prefix + "_message"] = error["message"] if have else None


def _row(entry):
    """One case of the lab's JSON as a flat dict (segtape's side)."""
    row = {k: entry[k] for k in ("case", "label", "pitfall", "summary", "remedy")}
    seg = entry["segtape"]
    if isinstance(seg, dict):
        for key, value in seg.items():
            if key == "error":
                continue
            if isinstance(value, dict):  # explained_at_last_step, replay
                for k, v in value.items():
                    row[k if key == "explained_at_last_step" else f"{key}_{k}"] = v
            else:
                row[key] = value
    # The strict policy's refusal: a pitfall's strict rerun, or a fix's own run.
    if entry["pitfall"]:
        _error_fields(row, "strict_error", entry.get("segtape_strict_policy_error"))
    else:
        _error_fields(row, "strict_error", seg.get("error") if isinstance(seg, dict) else None)
    if "segtape_without_retain_graph_error" in entry:
        _error_fields(row, "no_retain_graph_error", entry["segtape_without_retain_graph_error"])
    check = entry.get("gradient_check")
    if check:
        row["gradient_check_equal"] = check["segtape"]["equal"]
        row["gradient_check_max_relative_error"] = check["segtape"].get("max_relative_error")
    return row


class LabResult:
    """What run() returns.

    rows: one flat dict per case (segtape's side), in the order the cases
    ran, with the keys case, label, pitfall, summary, remedy, memory (what
    the bytes count), policy,
    bytes_per_step (least-squares slope of bytes vs step), bytes_per_step_at_end,
    bytes_last_step, bytes_peak (the largest after-step value), ms_per_step_start,
    ms_per_step_end, budget_bytes, budget_exceeded_at_step (None: never),
    budget_step_extrapolated, rows (steps measured); strict_error (the error
    type the strict policy raised, None if none), strict_error_step,
    strict_error_message; pitfalls: tape_node_bytes, tape_node_bytes_per_step,
    backward_gradient_bytes, steps_held (the explainer at the last step);
    pitfalls with a backward every step: no_retain_graph_error (and _step,
    _message); fixes: segment_peak_min_after_first, segment_peak_max_after_first,
    segments; exact-replay: replay_* and gradient_check_equal,
    gradient_check_max_relative_error.
    json: the lab's JSON summary, parsed. csv: engine,case,step,bytes for every
    step. svg: the lab's figure. table: the lab's terminal summary.
    """

    def __init__(self, raw):
        self.json = _json.loads(raw["json"])
        self.csv = raw["csv"]
        self.svg = raw["svg"]
        self.table = raw["table"]
        self.rows = [_row(e) for e in self.json["cases"]]

    def series(self, engine="segtape"):
        """{label: [bytes after step 0, 1, ...]} from the CSV, for plot()."""
        label = {r["case"]: r["label"] for r in self.rows}
        out = {}
        for rec in csv.DictReader(io.StringIO(self.csv)):
            if rec["engine"] == engine:
                out.setdefault(label[rec["case"]], []).append(float(rec["bytes"]))
        return out

    def dataframe(self):
        """rows as a pandas DataFrame, one row per case, indexed by label."""
        try:
            import pandas
        except ImportError:
            raise ImportError("LabResult.dataframe() needs pandas, which is not installed "
                              "(pip install pandas); LabResult.rows holds the same data as a list of dicts") from None
        return pandas.DataFrame(self.rows).set_index("label")

    def __repr__(self):
        return f"<segtape.retention.LabResult: {', '.join(r['label'] for r in self.rows)}>"

    def _repr_svg_(self):
        return self.svg

    def _repr_html_(self):
        return f"<div>{self.svg}</div><pre>{html.escape(self.table)}</pre>"


def run(cases=None, *, measure_anomaly=False, **config):
    """Runs the lab's cases on segtape and returns a LabResult.

    cases: names as the table prints them or as `segtape retention --cases`
    takes them ("hidden-not-detached", "1", "tbptt", "tbptt:8", ...), a list or
    one comma-separated string; None runs all of them (cases()).
    config: LabConfig's fields: steps, batch, vocab, embed, hidden, lag, k,
    window, trainer_k, seed (ints), lr, clip (numbers), budget (bytes or a size
    such as "1MiB"), device ("cpu" or "cuda"). measure_anomaly=True also
    measures anomaly mode's cost on the agent loop (the JSON's
    "anomaly_mode", as `segtape retention` does): 8192 steps of two Trainers
    at the configured sizes, about 2 s at the default sizes on two cores.
    """
    if cases is None:
        names = [c["name"] for c in _lab.cases()]
    elif isinstance(cases, str):
        names = [c.strip() for c in cases.split(",") if c.strip()]
    elif isinstance(cases, int) and not isinstance(cases, bool):
        names = [str(cases)]
    else:
        cases = list(cases) if not isinstance(cases, (bytes, bytearray)) else cases
        if isinstance(cases, (bytes, bytearray)) or not all(isinstance(c, (str, int)) and not isinstance(c, bool) for c in cases):
            raise TypeError(f"retention.run(): cases must be names (str) or case numbers (int), one or a list; got {cases!r}")
        names = [str(c) for c in cases]
    if not names:
        raise Error("retention.run(): no cases given")
    return LabResult(_lab.run_lab(_config(config), names, measure_anomaly))


# ---------------------------------------------------------------- PyTorch's memory

_SHIM = r"""// segtape.retention's counting allocator for the running torch (generated).
#include "torch_memory.h"

using segtape::torch_memory::CountingAllocator;
extern "C" {
int segtape_torch_memory_install() {
  try {
    segtape::torch_memory::install();
    return 1;
  } catch (...) {
    return 0;
  }
}
long long segtape_torch_memory_live() { return CountingAllocator::stats().live.load(); }
long long segtape_torch_memory_peak() { return CountingAllocator::stats().peak.load(); }
long long segtape_torch_memory_allocations() { return CountingAllocator::stats().allocations.load(); }
void segtape_torch_memory_reset_peak() { CountingAllocator::reset_peak(); }
}
"""

_counter = []  # the loaded library, once per process


def _header():
    here = Path(__file__).resolve().parent
    candidates = [here / "include" / "torch_memory.h",  # installed package
                  Path(_C.__file__).resolve().parent / "include" / "torch_memory.h",
                  here.parent.parent / "agent" / "torch_memory.h"]  # source tree: python/segtape -> agent
    for path in candidates:
        if path.is_file():
            return path
    raise Error("torch_memory.h not found (looked in " + ", ".join(str(p.parent) for p in candidates) + ")")


def _cache_dir():
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "segtape"


def _build_counter(torch):
    import contextlib
    with contextlib.redirect_stderr(io.StringIO()):  # cpp_extension's "No CUDA runtime is found" on CPU-only torch
        from torch.utils import cpp_extension
    header = _header()
    cxx = os.environ.get("CXX") or "c++"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    lib_dirs = cpp_extension.library_paths()
    flags = ["-std=c++17", "-O2", "-w", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    flags += [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{header.parent}"]
    libs = [f"-L{p}" for p in lib_dirs] + [f"-Wl,-rpath,{p}" for p in lib_dirs] + ["-lc10"]
    key = hashlib.sha256("\0".join([torch.__version__, cxx, _SHIM, header.read_text(), *flags, *libs]).encode()).hexdigest()[:16]
    version = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in torch.__version__)
    target = _cache_dir() / f"torch_memory-torch{version}-{key}.so"
    if target.is_file():
        return target
    if shutil.which(cxx) is None:
        raise Error(f"torch_memory: no C++ compiler '{cxx}' to build the counting allocator "
                    "(install g++ or set CXX to one)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="segtape-torch-memory-") as tmp:
        source = Path(tmp) / "torch_memory_shim.cpp"
        source.write_text(_SHIM)
        built = Path(tmp) / target.name
        cmd = [cxx, *flags, str(source), "-o", str(built), *libs]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise Error(f"torch_memory: could not run the C++ compiler '{cxx}': {e}") from None
        if p.returncode != 0:
            if torch.__version__.startswith("1.13"):
                why = f"compiling the counting allocator against torch {torch.__version__} failed"
            else:
                why = (f"torch {torch.__version__} is not supported by the counting allocator "
                       "(torch_memory.h implements torch 1.13's c10::Allocator interface)")
            raise Error(f"torch_memory: {why}; {' '.join(cmd)} said:\n{p.stderr.strip()}")
        # Atomic: another process may be building the same library.
        staged = target.parent / f".{target.name}.{os.getpid()}.tmp"
        shutil.copyfile(built, staged)
        os.replace(staged, target)
    return target


class _Counter:
    """The counting allocator's statistics (bytes of CPU tensor storage
    allocated since it was installed)."""

    def __init__(self, path):
        lib = ctypes.CDLL(str(path))
        for name in ("live", "peak", "allocations"):
            getattr(lib, f"segtape_torch_memory_{name}").restype = ctypes.c_longlong
        lib.segtape_torch_memory_install.restype = ctypes.c_int
        lib.segtape_torch_memory_reset_peak.restype = None
        if not lib.segtape_torch_memory_install():
            raise Error("torch_memory: the counting allocator could not be installed")
        self._lib = lib

    def live(self):
        return int(self._lib.segtape_torch_memory_live())

    def peak(self):
        return int(self._lib.segtape_torch_memory_peak())

    def allocations(self):
        return int(self._lib.segtape_torch_memory_allocations())

    def reset_peak(self):
        self._lib.segtape_torch_memory_reset_peak()


def torch_counter():
    """The counting allocator for torch's CPU tensors: compiled, loaded and
    installed on the first call (see torch_memory), the same object after.
    Its live() and peak() are bytes of CPU tensor storage allocated since it
    was installed and not yet freed (peak: the largest live since
    reset_peak()); allocations() counts them. Call it before creating the
    tensors a measurement should see: one created before is never counted,
    so freeing it does not lower live()."""
    if not _counter:
        import torch
        _counter.append(_Counter(_build_counter(torch)))
    return _counter[0]


def torch_memory(step_fn, steps, device="cpu"):
    """Memory of a PyTorch loop after each step: calls step_fn(t) for t in
    range(steps) and returns a list of `steps` ints, the bytes of live tensor
    storage after each call minus those live before the first, i.e. what the
    loop has added and still holds (create the model, its gradients and the
    optimizer's state before the call to leave them out, as the lab does).

    device="cpu": the bytes counted by segtape's counting allocator
    (torch_memory.h), which is compiled on first use with $CXX (or c++)
    against the running torch's headers and libc10, cached under
    ~/.cache/segtape, and installed in front of torch's CPU allocator for the
    rest of the process (torch_counter()). Only tensors allocated after that
    are counted; tensors allocated before keep their own deleter and are freed
    safely, uncounted, so a tensor made before the install and dropped by the
    loop (an initial hidden state) does not lower the count: call
    torch_counter() before building the model for exact differences.
    Autograd's graph nodes live on the C++ heap and are not counted. torch_memory.h implements torch 1.13's c10::Allocator interface;
    other torch versions are refused with the compiler's message (segtape.Error).

    device="cuda" (or "cuda:N"): torch.cuda.memory_allocated(device), the
    bytes the caching allocator has handed to tensors (not what it reserved).
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        # (without CUDA, torch.cuda.memory_allocated() is 0: a curve of zeros that looks like a measurement)
        if not torch.cuda.is_available():
            raise Error(f"torch_memory: device '{device}': this torch has no CUDA (torch.cuda.is_available() is False); "
                        "measure on device='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise Error(f"torch_memory: device '{device}': torch sees {torch.cuda.device_count()} CUDA device(s)")

        def live():
            return int(torch.cuda.memory_allocated(dev))
    elif dev.type == "cpu":
        live = torch_counter().live
    else:
        raise Error(f"torch_memory: device '{device}': expected 'cpu', 'cuda' or 'cuda:N'")
    gc.collect()  # garbage of earlier code, collected during the loop, would lower the curve
    base = live()
    out = []
    for t in range(int(steps)):
        step_fn(t)
        out.append(live() - base)
    return out


def segtape_memory(tape, step_fn, steps):
    """Memory of a segtape loop after each step: calls step_fn(t) for t in
    range(steps) and returns a list of `steps` ints, tape.stats()'s
    live_bytes + carry_bytes after each call: the bytes in use in the open
    segment's arena (op outputs, what backward saved and backward's own
    buffers) plus the carried state (seg.carry). Parameters, their gradients
    and optimizer state (the persistent pool) are not counted, nor the tape
    nodes (TapeStats.node_bytes) or the reserved op workspace, as in the lab."""
    out = []
    for t in range(int(steps)):
        step_fn(t)
        s = tape.stats()
        out.append(int(s["live_bytes"] + s["carry_bytes"]))
    return out


def plot(series, ax=None, title=None, log=False):
    """A line per entry of series ({label: list of bytes after each step}),
    in KiB against the step; log=True for a log y axis. Labels that start
    with a number, as the lab's pitfalls do ("1 hidden-not-detached"), are
    dashed, the others solid. Draws on ax (a new figure when None) and
    returns it."""
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(7, 4))
    for label, values in series.items():
        values = list(values)
        ax.plot(range(len(values)), [v / 1024 for v in values], label=label,
                linestyle="--" if _is_pitfall(label) else "-")
    ax.set_xlabel("step")
    ax.set_ylabel("KiB after the step")
    if log:
        ax.set_yscale("log", nonpositive="mask")  # 0 bytes: a gap, not a plunge
    if title:
        ax.set_title(title)
    if series:
        ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    return ax


def _is_pitfall(label):
    """A label of a pitfall in the lab's style ("1 hidden-not-detached")."""
    head = str(label).split(" ", 1)[0]
    return head.isdigit()
