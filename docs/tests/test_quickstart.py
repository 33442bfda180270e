"""Every shell block of the Quickstart (docs/quickstart.md) runs, as written,
in order, in a scratch copy of the scripts it calls (agent/run.sh and
tests/setup.sh), so that its runs/ and build-main/ land there and not in the
checkout.

One thing differs from a user's machine: agent/run.sh's build is not redone
(it would build the program again, minutes); a `cmake` placed first on PATH
links the program that ctest's build made ($SEGTAPE_CLI, as docs/build.sh
passes it) where `cmake --build` would have written it
(build-main/agent/segtape). The runs themselves are the page's, at their
full length (about 15 s in all on two cores).
`bash tests/run.sh` is not run here (it is the command that runs this test);
the test checks that it is what CI runs.
"""
import os
import pathlib
import re
import shutil
import stat
import subprocess

import pytest

from conftest import DOCS, ROOT

def bash_blocks():
    text = (DOCS / "quickstart.md").read_text()
    return [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)]


CMAKE_SHIM = """#!/usr/bin/env bash
# Stands in for cmake in agent/run.sh: configure does nothing, the build links the built program.
if [[ "$1" == --build ]]; then mkdir -p "$2/agent" && ln -sf {binary!r} "$2/agent/segtape"; fi
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    binary = os.environ.get("SEGTAPE_CLI")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail("SEGTAPE_CLI must name the built segtape program (docs/build.sh sets it)")
    root = tmp_path_factory.mktemp("quickstart")
    for script in ("agent/run.sh", "tests/setup.sh"):
        (root / script).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / script, root / script)
    tools = root / "tools"
    tools.mkdir()
    cmake = tools / "cmake"
    cmake.write_text(CMAKE_SHIM.format(binary=os.path.realpath(binary)))
    cmake.chmod(cmake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return root


def test_quickstart_has_shell_blocks():
    assert len(bash_blocks()) >= 4


def test_tests_run_sh_is_what_ci_runs():
    assert re.search(r"^exec bash tests/run\.sh\s*$", (ROOT / ".ci/run").read_text(), flags=re.M)


def test_every_block_runs_in_order(scratch):
    env = dict(os.environ, PATH=f"{scratch / 'tools'}:{os.environ['PATH']}", OPENBLAS_NUM_THREADS="1", TERM="dumb")
    env.pop("SEGTAPE_BUILD", None)
    env.pop("SEGTAPE_BUILD_MAIN", None)
    for block in bash_blocks():
        if block == "bash tests/run.sh":
            continue  # what runs this test; see test_tests_run_sh_is_what_ci_runs
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=scratch, env=env,
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, f"quickstart block failed ({out.returncode}):\n{block}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}"
    run = scratch / "runs" / "quickstart"
    for name in ("plot.svg", "metrics.csv", "metrics.json", "checkpoint.safetensors"):
        assert (run / name).is_file(), f"the quickstart's run wrote no {name}"
    assert (scratch / "runs" / "quickstart-tmaze" / "plot.svg").is_file()
