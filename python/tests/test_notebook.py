"""docs/notebooks/retention.ipynb runs from top to bottom without an error.

The notebook runs in a Jupyter kernel of this interpreter (sys.executable):
a "python3" kernelspec for it is installed into a temporary directory that
JUPYTER_PATH puts first, since the system's "python3" kernelspec may start
another Python (Debian's points at /usr/bin/python3, outside this venv).

SEGTAPE_NOTEBOOK_OUT=path writes the executed notebook there.
SEGTAPE_NOTEBOOK_FIGURES=1 writes its figures to docs/figures/<name>.png
(each plotting cell names its figure in its metadata, "figure").
"""
import base64
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
if importlib.util.find_spec("ipykernel") is None:
    pytest.skip("ipykernel is not installed for this interpreter", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "notebooks" / "retention.ipynb"
TIMEOUT_S = 120  # per cell; the whole notebook takes 8-13 s on two cores

def figures(nb):
    """{figure name: PNG bytes} of the executed notebook's plotting cells."""
    out = {}
    for cell in nb.cells:
        name = cell.metadata.get("figure")
        if cell.cell_type != "code" or not name:
            continue
        pngs = [o["data"]["image/png"] for o in cell.get("outputs", [])
                if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})]
        assert len(pngs) == 1, f"cell with figure {name!r} made {len(pngs)} PNG figures, expected 1"
        out[name] = base64.b64decode(pngs[0])
    return out


@pytest.fixture
def python3_kernel(tmp_path, monkeypatch):
    """A "python3" kernelspec running this interpreter, found before any other."""
    quiet = {**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}  # ipykernel's debugger: no frozen-modules warning
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(tmp_path), "--name", "python3"],
                   check=True, capture_output=True, env=quiet)
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    assert os.path.realpath(spec["argv"][0]) == os.path.realpath(sys.executable)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return "python3"


def test_retention_notebook_runs(python3_kernel, tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Committed without outputs, so that it stays small and reviewable.
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    client = nbclient.NotebookClient(nb, kernel_name=python3_kernel, timeout=TIMEOUT_S,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    start = time.monotonic()
    client.execute()  # raises CellExecutionError naming the cell on any error
    seconds = time.monotonic() - start
    print(f"retention.ipynb executed in {seconds:.1f} s")

    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    pngs = figures(nb)
    expected = {c.metadata["figure"] for c in nb.cells if c.metadata.get("figure")}
    assert set(pngs) == expected and len(expected) >= 5
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 5000 for p in pngs.values())
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "BudgetError at step" in text  # pitfall 1 under the strict policy
    assert "retention lab: B=8" in text  # the lab's table
    import re
    assert re.search(r"stops the loop without the line at chunk \d+", text)  # the repackage_hidden section's budget

    out = os.environ.get("SEGTAPE_NOTEBOOK_OUT")
    if out:
        nbformat.write(nb, out)
    if os.environ.get("SEGTAPE_NOTEBOOK_FIGURES") == "1":
        for name, png in pngs.items():
            (ROOT / "docs" / "figures" / f"{name}.png").write_bytes(png)
