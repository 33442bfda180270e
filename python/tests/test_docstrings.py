# Every public name of the package says what it does (issue 50: the Python
# reference is generated from the docstrings): each function, class, method
# and property of segtape, segtape.nn, segtape.gym, segtape.retention,
# segtape.dist and segtape.lm has a docstring with more than its signature
# (nanobind writes the signature of a function bound without one).
import importlib
import inspect
import re

import segtape

MODULES = ["segtape", "segtape.nn", "segtape.gym", "segtape.retention", "segtape.dist", "segtape.lm"]
SIGNATURE = re.compile(r"^\s*([\w.]+)?\(.*\)(\s*->\s*.+)?\s*$")


def says_something(obj):
    doc = getattr(obj, "__doc__", None) or ""
    return any(line.strip() and not SIGNATURE.match(line) for line in doc.splitlines())


def module(name):
    return segtape.dist if name == "segtape.dist" else importlib.import_module(name)


def public(name):
    mod = module(name)
    for attr in getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]:
        obj = getattr(mod, attr)
        if inspect.ismodule(obj) or not (callable(obj) or isinstance(obj, property)):
            continue  # (constants, submodules)
        if not str(getattr(obj, "__module__", "") or "").startswith("segtape"):
            continue  # (names imported from elsewhere: os, numpy)
        yield f"{name}.{attr}", obj
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if not member.startswith("_") and (callable(value) or isinstance(value, property) or hasattr(value, "__get__")):
                    yield f"{name}.{attr}.{member}", value


def test_every_public_name_has_a_docstring():
    walked = [(n, o) for m in MODULES for n, o in public(m)]
    assert len(walked) > 150, len(walked)  # (the walk found the package's names)
    missing = sorted(n for n, o in walked if not says_something(o))
    assert not missing, f"{len(missing)} of {len(walked)} public names have no docstring: {missing}"


def test_a_name_without_a_docstring_is_found():
    def bare(x):
        pass

    assert not says_something(bare)
    assert not says_something(segtape._C.parse_bytes)  # nanobind's signature alone ("parse_bytes(text: str, ...) -> int")
    assert says_something(segtape.cross_entropy)
    # a compiled property bound without one: nanobind writes "(self) -> str"
    assert not says_something(segtape._C.agent.Env.name)
    assert says_something(segtape.Tensor.shape)
