"""OpenBLAS's kernel choice: segtape.blas_kernels(), blas_better_kernels() and
the warning at import when OpenBLAS fell back to kernels older than AVX2 on a
CPU that has AVX2 (docs/benchmarks.md, change 9); segtape.packed_kernel() and
SEGTAPE_PACKED. Each case is a fresh Python process: OpenBLAS reads
OPENBLAS_CORETYPE, and segtape SEGTAPE_PACKED, only once."""
import os
import platform
import subprocess
import sys

import pytest

PROBE = (
    "import warnings, json\n"
    "with warnings.catch_warnings(record=True) as w:\n"
    "    warnings.simplefilter('always')\n"
    "    import segtape\n"
    "print(json.dumps({'kernels': segtape.blas_kernels(), 'better': segtape.blas_better_kernels(),\n"
    "                  'warnings': [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]}))\n"
)


def probe(coretype):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    import json

    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_warning_comes_exactly_when_openblas_fell_back():
    r = probe(None)
    assert r["kernels"]
    if r["better"]:
        # This machine's OpenBLAS did not know its CPU: say so, naming the fix.
        assert r["better"] in ("SkylakeX", "Haswell")
        assert len(r["warnings"]) == 1
        assert f"OPENBLAS_CORETYPE={r['better']}" in r["warnings"][0]
        assert r["kernels"] in r["warnings"][0]
    else:
        assert r["warnings"] == []


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="OpenBLAS's x86 kernel names")
def test_a_set_openblas_coretype_is_kept_and_never_warned_about():
    r = probe("Prescott")
    assert r["better"] == ""
    assert r["warnings"] == []
    # An OpenBLAS built for one CPU (no DYNAMIC_ARCH) ignores the variable.
    default = probe(None)["kernels"]
    if r["kernels"] != "Prescott" and r["kernels"] == default:
        pytest.skip(f"this OpenBLAS ignores OPENBLAS_CORETYPE (runs {default})")
    assert r["kernels"] == "Prescott"


def packed_in_a_fresh_process(value):
    env = dict(os.environ)
    env.pop("SEGTAPE_PACKED", None)
    if value is not None:
        env["SEGTAPE_PACKED"] = value
    p = subprocess.run([sys.executable, "-c", "import segtape; print(segtape.packed_kernel())"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def test_packed_kernel_is_the_best_the_cpu_has_unless_the_environment_chooses():
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    best = "none"
    if platform.machine() in ("x86_64", "AMD64") and flags:
        best = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "none"
    elif platform.machine() in ("x86_64", "AMD64"):
        pytest.skip("no /proc/cpuinfo to tell the CPU's vector extensions")
    assert packed_in_a_fresh_process(None) == best
    assert packed_in_a_fresh_process("0") == "none"
    assert packed_in_a_fresh_process("avx2") == ("none" if best == "none" else "avx2")
