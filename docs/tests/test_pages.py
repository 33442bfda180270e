"""User pages speak to users: Home, Quickstart, Guides and Reference carry no
commit hashes and no dates. Results and Lab may (that is where provenance and
the lab notebook live). The sections are read from mkdocs.yml's nav."""
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


def user_pages():
    sections = nav_sections()
    assert set(USER_SECTIONS + OTHER_SECTIONS) >= set(sections), \
        f"mkdocs.yml's nav has a section this test does not sort: {sorted(set(sections) - set(USER_SECTIONS + OTHER_SECTIONS))}"
    return [p for s in USER_SECTIONS for p in sections.get(s, [])]


def findings(page):
    allowed = NOT_HASHES.get(page, set())
    found = []
    for number, line in enumerate((DOCS / page).read_text().splitlines(), 1):
        found += [f"{page}:{number}: commit hash? {m.group()!r}: {line.strip()[:120]}"
                  for m in HASH.finditer(line) if m.group() not in allowed]
        found += [f"{page}:{number}: date {m.group()!r}: {line.strip()[:120]}" for m in DATE.finditer(line)]
    return found


@pytest.mark.parametrize("page", user_pages())
def test_user_page_has_no_commit_hashes_or_dates(page):
    found = findings(page)
    assert not found, ("a user page (Home, Quickstart, Guides, Reference) names a commit or a date; "
                       "move that text to a Results or Lab page (docs/lab/), or drop the provenance:\n  "
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
