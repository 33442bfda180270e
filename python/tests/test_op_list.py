"""The op list (engine/include/segtape/op_list.h) against the bindings: every
op of the list is a function of the extension and of the package, and each
elementwise one records its own op kind. The extension's _ops is the list
itself, made from the same macro as the C++ OpKind enum, so an op added
there and left out of python/src/segtape_py.cpp fails here."""
import numpy as np

import segtape
from segtape import _segtape as _C

FAMILIES = {"Leaf", "Op", "Unary", "UnaryScalar", "Binary"}


def test_the_list_holds_every_op_kind_once():
    kinds = [kind for _, kind, _ in _C._ops]
    names = [name for _, _, name in _C._ops]
    assert len(set(kinds)) == len(kinds) and len(set(names)) == len(names)
    assert {family for family, _, _ in _C._ops} <= FAMILIES
    assert ("Leaf", "Input", "input") in _C._ops
    assert {"MatMul", "Add", "Scale", "Tanh", "Softmax", "GruCell", "GruSequence", "Softplus"} <= set(kinds)


def test_every_op_of_the_list_is_bound_and_exported():
    missing = []
    for family, kind, name in _C._ops:
        if family == "Leaf":
            if not callable(getattr(segtape.Segment, name, None)):
                missing.append(f"{kind}: Segment.{name}")
            continue
        bound = getattr(_C, name, None)
        if not callable(bound):
            missing.append(f"{kind}: segtape._segtape.{name} (python/src/segtape_py.cpp, bind_ops)")
        elif getattr(segtape, name, None) is not bound:
            missing.append(f"{kind}: segtape.{name} (python/segtape/__init__.py)")
        if family == "Unary" and not callable(getattr(segtape.Tensor, name, None)):
            missing.append(f"{kind}: Tensor.{name} (python/src/segtape_py.cpp, bind_ops)")
    assert not missing, "ops of engine/include/segtape/op_list.h without their Python binding: " + ", ".join(missing)


def test_each_elementwise_function_records_its_own_op_kind():
    tape = segtape.Tape()
    x = tape.parameter([2, 3])
    x.copy_(np.array([[0.5, 1.0, 1.5], [2.0, 2.5, 3.0]], dtype=np.float32))
    for family, kind, name in _C._ops:
        if family not in ("Unary", "UnaryScalar", "Binary"):
            continue
        f = getattr(segtape, name)
        with tape.segment():
            y = f(x, x) if family == "Binary" else f(x, 2.0) if family == "UnaryScalar" else f(x)
            recorded = tape.explain().to_dict()["nodes_by_op"]
            assert recorded == {kind: 1}, f"segtape.{name} recorded {recorded}"
            assert y.shape == (2, 3)
