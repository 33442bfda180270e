#!/usr/bin/env bash
# Builds the documentation site into build/site (open build/site/index.html):
#   1. docs/reference/cli.md from the program's own --help (docs/gen_cli.py):
#      `segtape --help` and `segtape <command> --help` for every command it
#      lists; the page is generated here, never edited, and not kept in git;
#   2. docs/reference/cpp.md from the public C++ headers and their comments
#      (docs/gen_cpp.py, with libclang); generated here, not kept in git;
#   3. `mkdocs build --strict`: a broken link, a missing anchor or a page
#      left out of the nav fails the build. The Python reference
#      (docs/reference/python.md) is rendered from the installed package's
#      docstrings by mkdocstrings, which imports it: the package
#      (`pip install ./python`, docs/python.md) must be installed first;
#   4. the docs' tests (docs/tests, pytest): user pages carry no commit hashes
#      and no dates; every shell block of the Quickstart runs; a broken link
#      and a missing page fail a strict build; the reference pages name every
#      public Python name and C++ class and function.
# Installs MkDocs + Material, mkdocstrings, clang's Python bindings and pytest
# into a virtual environment (build-docs) when they are missing.
#
# Usage: bash docs/build.sh [SEGTAPE_BINARY]   (default: $SEGTAPE_BUILD/agent/segtape, build/agent/segtape)
#   SEGTAPE_PACKAGE_PYTHON: a Python that imports the installed segtape package
#     (default: $SEGTAPE_BUILD/python/bin/python, build/python/bin/python, the
#     virtual environment tests/run.sh installs it into)
#   SEGTAPE_DOCS_VENV (default build-docs), SEGTAPE_SITE (default build/site)
#   mkdocs serve: build-docs/bin/mkdocs serve, after one run of this script
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
binary=${1:-${SEGTAPE_BUILD:-$root/build}/agent/segtape}
binary=$(realpath "$binary" 2>/dev/null || echo "$binary")
venv=${SEGTAPE_DOCS_VENV:-$root/build-docs}
site=${SEGTAPE_SITE:-$root/build/site}
package_python=${SEGTAPE_PACKAGE_PYTHON:-${SEGTAPE_BUILD:-$root/build}/python/bin/python}
if [[ ! -x "$binary" ]]; then
  echo "docs/build.sh: no segtape program at $binary (build it first: bash tests/run.sh, or pass its path)" >&2
  exit 1
fi
if ! import_error=$("$package_python" -c "import segtape" 2>&1); then
  echo "docs/build.sh: $package_python cannot import segtape: the Python reference is made from the installed" \
       "package. Install it first (bash tests/run.sh does, or: source tests/setup.sh &&" \
       "segtape_python_install build/python build/python-pkg; docs/python.md), or set SEGTAPE_PACKAGE_PYTHON" \
       "to a Python that imports it:" >&2
  echo "$import_error" | tail -1 >&2
  exit 1
fi
if ! "$venv/bin/python" -c "import mkdocs, material, pymdownx, pytest, mkdocstrings_handlers.python, clang.cindex" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check "mkdocs==1.6.1" "mkdocs-material==9.8.2" \
    "pymdown-extensions==13.1.2" "mkdocstrings==1.0.8" "mkdocstrings-python==2.0.11" "griffelib==2.4.1" "clang==14.0" "pytest>=7"
fi
# The docs' Python imports the installed package (mkdocstrings inspects it;
# the tests walk it): a folder of links to the package and to NumPy, which
# it imports, named by a .pth file. Nothing else of that environment is seen.
"$package_python" - "$venv/segtape-package" <<'PY'
import os, sys, numpy, segtape
folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
for name in os.listdir(folder):
    os.unlink(os.path.join(folder, name))
for module in (segtape, numpy):
    package = os.path.dirname(module.__file__)
    for path in (package, package + ".libs"):  # (a NumPy wheel's libraries sit beside it)
        if os.path.isdir(path):
            os.symlink(path, os.path.join(folder, os.path.basename(path)))
PY
"$venv/bin/python" -c "import sys, sysconfig; open(sysconfig.get_paths()['purelib'] + '/segtape-package.pth', 'w').write(sys.argv[1] + '\n')" \
  "$venv/segtape-package"
if ! import_error=$("$venv/bin/python" -c "import segtape" 2>&1); then
  echo "docs/build.sh: the docs' Python ($("$venv/bin/python" -V)) cannot import the segtape package installed" \
       "for $package_python ($("$package_python" -V)); they must be the same Python version:" >&2
  echo "$import_error" | tail -3 >&2
  exit 1
fi
"$venv/bin/python" docs/gen_cli.py "$binary" docs/reference/cli.md
"$venv/bin/python" docs/gen_cpp.py docs/reference/cpp.md
# Not --quiet: mkdocs counts the warnings that --strict turns into a failure
# only when they are logged, so --quiet lets a broken link through.
NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --site-dir "$site"
(cd docs/tests && SEGTAPE_CLI=$binary SEGTAPE_SITE=$site "$venv/bin/python" -m pytest -q -p no:cacheprovider .)
echo "docs/build.sh: the site is in $site (open $site/index.html)"
