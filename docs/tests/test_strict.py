"""The site's build is strict: a broken link and a page missing from the nav
fail it. Checked on a copy of docs/ and mkdocs.yml with one of each, built
the way docs/build.sh builds the site (the generated API references reduced
to their titles, which is quicker and changes nothing here)."""
import os
import shutil
import subprocess
import sys

from conftest import DOCS, ROOT


def test_a_broken_link_and_a_missing_page_fail_the_build(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("tests"))
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for page in ("python.md", "cpp.md"):  # (the API references, a title each: rendering them takes seconds)
        (tmp_path / "docs" / "reference" / page).write_text(f"# {page}\n")
    with open(tmp_path / "docs" / "index.md", "a") as f:
        f.write("\nA link to [a page that is not there](no-such-page.md).\n")
    (tmp_path / "docs" / "histories.md").unlink()  # in the nav, gone
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert out.returncode != 0, out.stdout + out.stderr
    assert "no-such-page.md" in out.stderr, out.stderr
    assert "histories.md" in out.stderr, out.stderr
