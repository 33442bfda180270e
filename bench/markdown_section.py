"""Replaces a generated section of a Markdown file, between the lines
<!-- NAME:begin --> and <!-- NAME:end -->, as the bench scripts' --out does."""


def replace_section(path, name, text):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    with open(path) as f:
        doc = f.read()
    b, e = doc.find(begin), doc.find(end)
    if b < 0 or e < b:
        raise SystemExit(f"{path}: no {begin} ... {end} section")
    with open(path, "w") as f:
        f.write(doc[:b] + begin + "\n" + text + "\n" + doc[e:])
    print(f"wrote {path}")
