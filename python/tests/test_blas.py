"""OpenBLAS's kernel choice: segtape.blas_kernels(), blas_better_kernels() and
the warning at import when OpenBLAS fell back to kernels older than AVX2 on a
CPU that has AVX2 (docs/lab/benchmarks-changelog.md, item 9), each case a fresh Python
process (OpenBLAS reads OPENBLAS_CORETYPE only when it loads);
segtape.packed_kernel() and set_kernel_options(packed=...), in this process."""
import os
import platform
import subprocess
import sys

import pytest

import segtape

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


def packed_kernel_with(value):
    before = segtape.kernel_options()
    try:
        segtape.set_kernel_options(packed=value)
        return segtape.packed_kernel()
    finally:
        segtape.set_kernel_options(**before)


def test_packed_kernel_is_the_best_the_cpu_has_unless_the_kernel_options_choose():
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
    assert segtape.kernel_options() == {"gemv": "auto", "packed": "best", "fused_gru": "on", "fused_gru_grid": "off"}
    assert segtape.packed_kernel() == best
    assert packed_kernel_with("best") == best
    assert packed_kernel_with("off") == "none"
    assert packed_kernel_with("avx2") == ("none" if best == "none" else "avx2")
    assert segtape.packed_kernel() == best  # put back


def test_a_kernel_option_out_of_its_values_is_refused_and_changes_nothing():
    before = segtape.kernel_options()
    with pytest.raises(segtape.Error, match="kernel option packed = '0': expected best, avx2 or off"):
        segtape.set_kernel_options(gemv="off", packed="0")
    assert segtape.kernel_options() == before
