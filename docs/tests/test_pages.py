"""User pages speak to users: Home, Quickstart, Guides and Reference carry no
commit hashes, no dates and no test names. Results and Lab may (that is where
provenance, the lab notebook and the tests that back each claim live). The
sections are read from mkdocs.yml's nav."""
import re

import pytest

from conftest import DOCS, nav_sections

USER_SECTIONS = ("Home", "Quickstart", "Guides", "Reference")
OTHER_SECTIONS = ("Results", "Lab")

# A commit hash: 7 to 40 hex digits with at least one letter and one digit
# (so that 1000000 and words such as "defaced" are not hashes). Hex constants
# written 0x... do not match (no word boundary after the x).
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
DATE = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b"                     # 2026-12-03
    rf"|\b\d{{1,2}} {MONTH} \d{{4}}\b"           # 3 Dec 2026
    rf"|\b{MONTH} \d{{1,2}},? \d{{4}}\b"         # Dec 3, 2026
    rf"|\b{MONTH} \d{{4}}\b"                     # Dec 2026, December 2026
)
# Hex that is not a commit: the CRC-32 values of the checkpoint format's worked example.
NOT_HASHES = {
    "checkpoint-format.md": {"302dbfc8", "cbf43926", "472a8f5e"},
}

# A test cited by name. A GoogleTest name in backticks, `Suite.NameOfTheTest`:
# the part after the dot starts with at least three CamelCase words (capitals
# then lower case, so `Cli.AFolderWith...` and `...IsALowerBound...` count and
# an acronym such as GRU does not), so API names (`nn::GRU`,
# `segtape.nn`, `Trainer.evaluate`, `TapeOptions.segment_budget`, `np.float32`,
# a `Foo.GRUCell`) do not match; or a whole suite, `Suite.*`.
GTEST = re.compile(r"`[A-Z][A-Za-z0-9]*\.(?:(?:[A-Z]+[a-z0-9]+){3}|\*)")
# A test's file or program: test_x.py, x_test.cpp / .cu / .sh, a ctest
# program `x_test`, or a path under tests/ or python/tests/.
TEST_FILE = re.compile(r"\btest_\w+\.py\b|\b\w+_test(?:\.(?:cpp|cu|sh)\b|`)")
TEST_PATH = re.compile(r"(?<![\w/.-])(?:python/)?tests/[\w./*-]*")
# tests/ paths a user page may name, because they are what a reader runs or
# reads rather than a test's evidence: the script that runs the suites, the
# data files shipped with them, the command that redraws the notebook's
# figures, and (for a contributor) the op table to edit and the fuzzer's build
# and run commands. A test file inside an allowed path is allowed with it.
ALLOWED_TEST_PATHS = {
    "quickstart.md": {"tests/run.sh"},
    "python.md": {"tests/run.sh", "python/tests/test_notebook.py"},
    "distributed.md": {"tests/run.sh"},
    "cuda.md": {"tests/run.sh"},
    "text-and-series.md": {"tests/data/sunspots.csv"},
    "design.md": {"tests/run.sh", "tests/op_cases.h"},
    "reference/cpp.md": {"tests/op_cases.h"},
    "checkpoint-format.md": {"tests/fuzz/corpus", "tests/fuzz/corpus/", "tests/fuzz/safetensors_fuzz.cpp"},
}


def user_pages():
    sections = nav_sections()
    assert set(USER_SECTIONS + OTHER_SECTIONS) >= set(sections), \
        f"mkdocs.yml's nav has a section this test does not sort: {sorted(set(sections) - set(USER_SECTIONS + OTHER_SECTIONS))}"
    return [p for s in USER_SECTIONS for p in sections.get(s, [])]


# (The C++ reference, generated from the public headers, shows their comments
# as written: it is checked like the other pages, so a header's comment names
# no test; the op table's comment names tests/op_cases.h, the file a
# contributor edits to add an op.)
SOURCE_PAGES = set()


def findings(page, text=None):
    """What `page` (its Markdown, or `text`: a rendered page's) names that a user page must not."""
    allowed = NOT_HASHES.get(page, set())
    allowed_paths = ALLOWED_TEST_PATHS.get(page, set())
    found = []
    for number, line in enumerate((DOCS / page).read_text().splitlines() if text is None else text.splitlines(), 1):
        found += [f"{page}:{number}: commit hash? {m.group()!r}: {line.strip()[:120]}"
                  for m in HASH.finditer(line) if m.group() not in allowed]
        found += [f"{page}:{number}: date {m.group()!r}: {line.strip()[:120]}" for m in DATE.finditer(line)]
        if page in SOURCE_PAGES:
            continue
        paths = list(TEST_PATH.finditer(line))
        allowed_spans = [m.span() for m in paths if m.group().rstrip(".") in allowed_paths]
        found += [f"{page}:{number}: test path {m.group()!r}: {line.strip()[:120]}"
                  for m in paths if m.group().rstrip(".") not in allowed_paths]
        found += [f"{page}:{number}: test name {m.group()!r}: {line.strip()[:120]}"
                  for rx in (GTEST, TEST_FILE) for m in rx.finditer(line)
                  if not any(a <= m.start() and m.end() <= b for a, b in allowed_spans)]
    return found


@pytest.mark.parametrize("page", user_pages())
def test_user_page_has_no_commit_hashes_dates_or_test_names(page):
    found = findings(page)
    assert not found, ("a user page (Home, Quickstart, Guides, Reference) names a commit, a date or a test; "
                       "state the behaviour plainly and link the Lab page that cites the test (docs/lab/, "
                       "docs/hardening.md), or drop the provenance:\n  "
                       + "\n  ".join(found))


def test_the_patterns_catch_what_they_should():
    for text in ["at 5d307a1", "a2746e5+", "c94924e", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"]:
        assert HASH.search(text), text
    for text in ["1000000 steps", "0x1f2e3d4c", "defaced", "float32", "sha256", "cbf4392"[:6]]:
        assert not HASH.search(text), text
    for text in ["on 2026-12-04", "ran Dec 2026", "4 December 2026", "Dec 4, 2026"]:
        assert DATE.search(text), text
    for text in ["ICLR 2023", "100,000 steps", "lag 8"]:
        assert not DATE.search(text), text
    for text in ["`Sizes.EstimateIsALowerBoundCloseToTheMeasuredSegment`", "`Cli.AFolderWithMetricsRowsIsKeptAHeaderAloneIsTaken`",
                 "`CudaTraining.TbpttTwentyStepsReplayEqualsEager`", "(`Ppo.*`)", "tests/agent_test.cpp",
                 "python/tests/test_lm.py", "test_notebook.py", "`exact_test`", "dist_cli_test.sh", "cuda_test.cu"]:
        assert GTEST.search(text) or TEST_FILE.search(text) or TEST_PATH.search(text), text
    for text in ["`nn::GRU`", "`segtape.nn`", "`Trainer.evaluate`", "`TapeOptions.segment_budget`", "`np.float32`",
                 "`nn.GRUCell`", "`Foo.GRUCell`", "`Trainer.Config`", "`test_mse`", "`segtape.*`", "latest_tests/x",
                 "build/tests/x"]:
        assert not (GTEST.search(text) or TEST_FILE.search(text) or TEST_PATH.search(text)), text
