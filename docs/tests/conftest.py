"""Shared helpers of the documentation's tests (run by docs/build.sh)."""
import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's `!!python/...` tags (the slug function) read as nothing: only the nav is wanted here."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_sections():
    """{top-level nav section: [page paths relative to docs/]} from mkdocs.yml."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)

    def pages(entry):
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [p for e in entry for p in pages(e)]
        if isinstance(entry, dict):
            return [p for v in entry.values() for p in pages(v)]
        return []

    sections = {}
    for item in config["nav"]:
        (title, value), = item.items()
        sections[title] = pages(value)
    return sections
