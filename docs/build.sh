#!/usr/bin/env bash
# Builds the documentation site into build/site (open build/site/index.html):
#   1. docs/reference/cli.md from the program's own --help (docs/gen_cli.py):
#      `segtape --help` and `segtape <command> --help` for every command it
#      lists; the page is generated here, never edited, and not kept in git;
#   2. docs/reference/cpp.md from the public C++ headers and their comments
#      (docs/gen_cpp.py, with libclang); generated here, not kept in git;
#   3. `mkdocs build --strict`: a broken link, a missing anchor or a page
#      left out of the nav fails the build;
#   4. the docs' tests (docs/tests, pytest): user pages carry no commit hashes
#      and no dates; every shell block of the Quickstart runs; a broken link
#      and a missing page fail a strict build; the C++ reference names every
#      public class and function.
# Installs MkDocs + Material, clang's Python bindings and pytest into a
# virtual environment (build-docs) when they are missing.
#
# Usage: bash docs/build.sh [SEGTAPE_BINARY]   (default: $SEGTAPE_BUILD/agent/segtape, build/agent/segtape)
#   SEGTAPE_DOCS_VENV (default build-docs), SEGTAPE_SITE (default build/site)
#   mkdocs serve: build-docs/bin/mkdocs serve, after one run of this script
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
binary=${1:-${SEGTAPE_BUILD:-$root/build}/agent/segtape}
binary=$(realpath "$binary" 2>/dev/null || echo "$binary")
venv=${SEGTAPE_DOCS_VENV:-$root/build-docs}
site=${SEGTAPE_SITE:-$root/build/site}
if [[ ! -x "$binary" ]]; then
  echo "docs/build.sh: no segtape program at $binary (build it first: bash tests/run.sh, or pass its path)" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "import mkdocs, material, pymdownx, pytest, clang.cindex" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check "mkdocs==1.6.1" "mkdocs-material==9.8.2" \
    "pymdown-extensions==13.1.2" "clang==14.0" "pytest>=7"
fi
"$venv/bin/python" docs/gen_cli.py "$binary" docs/reference/cli.md
"$venv/bin/python" docs/gen_cpp.py docs/reference/cpp.md
# Not --quiet: mkdocs counts the warnings that --strict turns into a failure
# only when they are logged, so --quiet lets a broken link through.
NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --site-dir "$site"
(cd docs/tests && SEGTAPE_CLI=$binary SEGTAPE_SITE=$site "$venv/bin/python" -m pytest -q -p no:cacheprovider .)
echo "docs/build.sh: the site is in $site (open $site/index.html)"
