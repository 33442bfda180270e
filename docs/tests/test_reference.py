"""The generated reference pages name what they document, read from the
built site (docs/build.sh runs these tests after `mkdocs build`; SEGTAPE_SITE
is the site's folder).

Python (reference/python.md, rendered by mkdocstrings from the installed
package): an entry for every public name that the package's own docstring
test walks (python/tests/test_docstrings.py: each function, class, method and
property of segtape, segtape.nn, segtape.gym, segtape.retention, segtape.dist
and segtape.lm), found by its anchor; and, as on the hand-written user pages,
no commit hash, date or test name in the rendered text.

C++ (reference/cpp.md, docs/gen_cpp.py): every class, struct, enum and
function the public headers declare at namespace scope, found by a reading
of the headers that does not share the generator's (a regular expression
over their text, where the generator uses libclang), and the main classes by
name.

Each check is also run on the page with one name taken out, to show that it
fails.
"""
import html
import os
import pathlib
import re
import sys

import pytest

from conftest import DOCS, ROOT
from test_pages import findings

SITE = pathlib.Path(os.environ.get("SEGTAPE_SITE", ROOT / "build" / "site"))


def built(page):
    path = SITE / page / "index.html"
    if not path.is_file():
        pytest.fail(f"{path} is missing: build the site first (docs/build.sh runs these tests after mkdocs build)")
    return path.read_text()


# ---- Python ---------------------------------------------------------------------------------

def walked_names():
    """The names python/tests/test_docstrings.py checks, walked the same way."""
    sys.path.insert(0, str(ROOT / "python" / "tests"))
    try:
        import test_docstrings
    finally:
        sys.path.pop(0)
    return [name for module in test_docstrings.MODULES for name, _ in test_docstrings.public(module)]


def missing_python_names(page_html, names):
    anchors = set(re.findall(r'\bid="([^"]+)"', page_html))
    return [n for n in names if n not in anchors]


@pytest.fixture(scope="module")
def python_page():
    return built("reference/python")


@pytest.fixture(scope="module")
def python_names():
    names = walked_names()
    assert len(names) > 150, len(names)  # (the walk found the package's names)
    return names


def test_the_python_page_has_an_entry_for_every_public_name(python_page, python_names):
    missing = missing_python_names(python_page, python_names)
    assert not missing, f"the Python reference has no entry for {len(missing)} public names: {missing}"


def test_a_python_name_left_out_is_found(python_page, python_names):
    without = python_page.replace('id="segtape.tanh"', "").replace('id="segtape.Segment.backward"', "")
    assert sorted(missing_python_names(without, python_names)) == ["segtape.Segment.backward", "segtape.tanh"]


def test_the_python_page_names_no_commit_date_or_test(python_page):
    main = re.search(r"<article.*?</article>", python_page, flags=re.S).group()
    text = html.unescape(re.sub(r"<[^>]+>", "", main))
    found = findings("reference/python.md", text)
    assert not found, "the rendered Python reference names a commit, a date or a test:\n  " + "\n  ".join(found)


# ---- C++ ------------------------------------------------------------------------------------

PUBLIC_HEADERS = [p for layer in ("engine", "nn", "agent") for p in (ROOT / layer / "include" / "segtape").rglob("*.h")]
# Namespace-scope declarations start at column 0 (namespaces are not indented).
RECORD = re.compile(r"^(?:template <[^\n]*>\s*)?(?:class|struct|union|enum class|enum)\s+(\w+)\b[^;\n]*\{", re.M)
FUNCTION = re.compile(r"^(?!return\b|using\b|namespace\b|typedef\b|template\b|friend\b)"
                      r"(?:\[\[\w+\]\] |inline |constexpr |static |extern )*"
                      r"[A-Za-z_][\w:<>,*& ]*?[\s*&]([a-z_]\w*)\(", re.M)
DETAIL = re.compile(r"^namespace detail \{\n.*?^\}[^;\n]*$", re.M | re.S)

MAIN_CLASSES = ["segtape::Tape", "segtape::Segment", "segtape::Tensor", "segtape::TapeOptions", "segtape::Arena",
                "segtape::Device", "segtape::Shape", "segtape::NoGradGuard", "segtape::Explanation", "segtape::Error",
                "segtape::nn::Module", "segtape::nn::Linear", "segtape::nn::GRU", "segtape::nn::LSTM",
                "segtape::nn::SGD", "segtape::nn::Adam", "segtape::nn::AdamW", "segtape::nn::Rng",
                "segtape::dist::Communicator", "segtape::dist::GradientAverager", "segtape::agent::Trainer",
                "segtape::agent::TrainConfig", "segtape::agent::Env", "segtape::agent::Policy"]


def declared_in_headers():
    """{(kind, name)} of the classes and functions the public headers declare
    at namespace scope, outside `detail` namespaces."""
    found = set()
    for header in PUBLIC_HEADERS:
        text = DETAIL.sub("", header.read_text())
        found |= {("class", m.group(1)) for m in RECORD.finditer(text)}
        found |= {("function", m.group(1)) for m in FUNCTION.finditer(text)}
    return found


def missing_cpp_names(page_md, declared):
    headings = set(re.findall(r"^### `(?:\w+::)*(\w+)`$", page_md, flags=re.M))
    code = "\n".join(re.findall(r"^```cpp\n(.*?)^```$", page_md, flags=re.M | re.S))
    code = re.sub(r"//.*", "", code)  # (declared, not named in a comment)
    missing = [n for kind, n in declared if kind == "class" and n not in headings]
    missing += [n for kind, n in declared if kind == "function" and not re.search(rf"\b{n}\(", code)]
    return sorted(missing)


def missing_main_classes(page_md):
    return [c for c in MAIN_CLASSES if f"### `{c}`" not in page_md]


@pytest.fixture(scope="module")
def cpp_page():
    built("reference/cpp")  # (in the site: the nav and the strict build have it)
    return (DOCS / "reference" / "cpp.md").read_text()


@pytest.fixture(scope="module")
def declared():
    found = declared_in_headers()
    assert len({n for k, n in found if k == "class"}) > 80 and len({n for k, n in found if k == "function"}) > 80, found
    return found


def test_the_cpp_page_has_every_public_class_and_function(cpp_page, declared):
    missing = missing_cpp_names(cpp_page, declared)
    assert not missing, f"the C++ reference lacks {len(missing)} names the public headers declare: {missing}"


def test_the_cpp_page_has_the_main_classes(cpp_page):
    assert not missing_main_classes(cpp_page)


def test_a_cpp_name_left_out_is_found(cpp_page, declared):
    tape = re.search(r"^### `segtape::Tape`\n.*?(?=^##)", cpp_page, flags=re.M | re.S).group()
    without = cpp_page.replace(tape, "").replace("Tensor lstm_h(", "Tensor lstm_(")
    assert missing_cpp_names(without, declared) == ["Tape", "lstm_h"]
    assert missing_main_classes(without) == ["segtape::Tape"]
