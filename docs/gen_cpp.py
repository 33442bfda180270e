"""Writes the C++ reference page from the public headers, with their comments.

Usage: python docs/gen_cpp.py OUT.md

The public headers are those `cmake --install` installs: every .h under
engine/, nn/ and agent/'s include/segtape. libclang (clang's own parser,
through its Python bindings) reads them as one translation unit, and this
script cuts each header's text at the places the parser gives: what stays is
the header as a user reads it, comments as written, without private and
protected members, function bodies, `detail` namespaces and includes. A class,
struct or enum gets a heading; the functions and constants around it are
shown in source order. Declarations a macro makes (the elementwise ops of
segtape/ops.h) are written out from the parser's types.

docs/build.sh runs it before `mkdocs build`; the page is not kept in git.
libclang: Debian's libclang1-14 (a dependency of clang); SEGTAPE_LIBCLANG
names another libclang.so.
"""
import glob
import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = ("engine", "nn", "agent")


def load_clang():
    try:
        from clang import cindex
    except ImportError:
        sys.exit("gen_cpp.py: needs clang's Python bindings (pip install clang==14.0; docs/build.sh installs them)")
    library = os.environ.get("SEGTAPE_LIBCLANG") or next(iter(sorted(
        glob.glob("/usr/lib/llvm-*/lib/libclang.so.1") + glob.glob("/usr/lib/llvm-*/lib/libclang-*.so.1"),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p)], reverse=True)), None)
    if not library or not os.path.exists(library):
        sys.exit("gen_cpp.py: no libclang found (Debian: apt-get install libclang1-14, which clang depends on; "
                 "or set SEGTAPE_LIBCLANG to a libclang.so)")
    cindex.Config.set_library_file(library)
    return cindex


def public_headers():
    """engine's, then nn's, then agent's (the layers, from the bottom)."""
    return [p for layer in LAYERS for p in sorted((ROOT / layer / "include" / "segtape").rglob("*.h"))]


class Header:
    """One header's text and the cuts made in it."""

    def __init__(self, path):
        self.path = path
        self.data = path.read_bytes()
        layer = path.relative_to(ROOT).parts[0]
        self.name = str(path.relative_to(ROOT / layer / "include"))  # as #include names it: segtape/nn/module.h

    def text(self, start, end, cuts=()):
        """data[start:end] with each (a, b, replacement) of cuts inside it replaced."""
        out, at = [], start
        for a, b, rep in sorted(c for c in cuts if start <= c[0] and c[1] <= end):
            if a < at:
                continue  # (inside a cut already made)
            before = self.data[at:a].decode()
            out += [before.rstrip() if rep == ";" else before, rep]
            at = b
        out.append(self.data[at:end].decode())
        return "".join(out)

    def line_start(self, offset):
        return self.data.rfind(b"\n", 0, offset) + 1

    def line_end(self, offset):
        end = self.data.find(b"\n", offset)
        return len(self.data) if end < 0 else end

    def leading_comment(self, offset):
        """Where the // comment lines just above the line of `offset` begin
        (offset's line start when there are none)."""
        start = self.line_start(offset)
        while start > 0:
            prev = self.line_start(start - 1)
            if not self.data[prev:start].strip().startswith(b"//"):
                break
            start = prev
        return start

    def file_comment(self):
        lines = []
        for line in self.data.decode().splitlines():
            if not line.startswith("//"):
                break
            lines.append(line)
        return "\n".join(lines)


def dedent(text):
    lines = text.splitlines()
    indent = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
    text = "\n".join(l[indent:].rstrip() for l in lines)
    text = re.sub(r"\n\n+(\s*}\s*;)", r"\n\1", text)  # (where a class's private part was)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


class Generator:
    def __init__(self, cindex):
        self.ci = cindex
        K = cindex.CursorKind
        self.K = K
        self.records = {K.CLASS_DECL, K.STRUCT_DECL, K.UNION_DECL, K.CLASS_TEMPLATE, K.ENUM_DECL,
                        K.CLASS_TEMPLATE_PARTIAL_SPECIALIZATION}
        self.functions = {K.FUNCTION_DECL, K.CXX_METHOD, K.CONSTRUCTOR, K.DESTRUCTOR, K.FUNCTION_TEMPLATE,
                          K.CONVERSION_FUNCTION}
        self.headers = {str(p): Header(p) for p in public_headers()}

    def parse(self):
        source = "".join(f'#include "{h.name}"\n' for h in self.headers.values())
        args = ["-x", "c++", "-std=c++20"] + [f"-I{ROOT / layer / 'include'}" for layer in LAYERS]
        tu = self.ci.TranslationUnit.from_source(
            "segtape_public_headers.cpp", args, unsaved_files=[("segtape_public_headers.cpp", source)],
            options=self.ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD)
        errors = [d for d in tu.diagnostics if d.severity >= self.ci.Diagnostic.Error]
        if errors:
            sys.exit("gen_cpp.py: the public headers do not parse:\n  " + "\n  ".join(str(d) for d in errors[:20]))
        return tu

    # --- what a user sees of one declaration -------------------------------------------------
    def cuts(self, cursor, header):
        """(start, end, replacement) cuts inside cursor: function bodies, and the
        private and protected parts of classes."""
        K, out = self.K, []
        if cursor.kind in self.functions:
            body = next((c for c in cursor.get_children() if c.kind == K.COMPOUND_STMT), None)
            if body is not None and header.data[body.extent.start.offset:body.extent.start.offset + 1] == b"{":
                # (a defaulted function's body is made by the compiler: nothing to cut)
                out.append((self.declarator_end(cursor, body), body.extent.end.offset, ";"))
            return out
        if cursor.kind in self.records and cursor.kind != K.ENUM_DECL:
            tokens = list(cursor.get_tokens())
            opening = next((t for t in tokens if t.spelling == "{"), None)
            if opening is None:
                return out  # a declaration without a body
            closing = tokens[-1] if tokens[-1].spelling == "}" else next(t for t in reversed(tokens) if t.spelling == "}")
            access = "private" if cursor.kind in (K.CLASS_DECL, K.CLASS_TEMPLATE) else "public"
            region = opening.extent.end.offset
            for child in cursor.get_children():
                if child.kind == K.CXX_ACCESS_SPEC_DECL:
                    if access != "public":
                        out.append((region, header.line_start(child.extent.start.offset), "\n"))
                    region = header.line_start(child.extent.start.offset)
                    access = child.access_specifier.name.lower()
                    continue
                if access == "public" and child.location.file and str(child.location.file) == str(header.path):
                    out += self.cuts(child, header)
            if access != "public":
                out.append((region, header.line_start(closing.extent.start.offset), "\n"))
        return out

    def declarator_end(self, function, body):
        """Where a function's declaration ends before its body: before a
        constructor's member initializers, else at the body's brace."""
        depth, seen_params = 0, False
        for t in function.get_tokens():
            if t.extent.start.offset >= body.extent.start.offset:
                break
            s = t.spelling
            if s == "(":
                depth += 1
                seen_params = True
            elif s == ")":
                depth -= 1
            elif s == ":" and depth == 0 and seen_params and function.kind == self.K.CONSTRUCTOR:
                return t.extent.start.offset
        return body.extent.start.offset

    def from_types(self, cursor, namespace):
        """A declaration a macro made, written from the parser's types, as
        the header would write it (Tensor, not segtape::Tensor; const Tensor&)."""
        def spelled(t):
            return re.sub(r" ([&*])", r"\1", t.spelling.replace("::".join(namespace) + "::", ""))
        args = ", ".join(f"{spelled(a.type)} {a.spelling}".strip() for a in cursor.get_arguments())
        return f"{spelled(cursor.result_type)} {cursor.spelling}({args});"

    # --- one header --------------------------------------------------------------------------
    def items(self, tu):
        """Each header's public declarations in source order: {path: [(namespace, cursor)]}."""
        K, found = self.K, {path: [] for path in self.headers}

        def walk(cursor, namespace):
            for c in cursor.get_children():
                if c.kind == K.NAMESPACE:
                    if c.spelling and c.spelling != "detail" and (namespace or c.spelling == "segtape"):
                        walk(c, namespace + [c.spelling])  # (std and the other libraries' are not read)
                    continue
                path = str(c.location.file) if c.location.file else None
                if path not in found:
                    continue
                if c.kind in (K.STATIC_ASSERT, K.USING_DIRECTIVE, K.MACRO_INSTANTIATION, K.INCLUSION_DIRECTIVE):
                    continue
                if c.kind in self.records and not c.is_definition() and c.kind != K.ENUM_DECL:
                    continue  # (a class declared ahead of its definition)
                if c.kind in self.functions and c.semantic_parent.kind != K.NAMESPACE:
                    continue  # (a member defined outside its class: declared in it)
                if c.kind in self.functions and c.canonical != c and c.is_definition():
                    continue  # (defined below its declaration)
                if c.kind == K.MACRO_DEFINITION and not re.fullmatch(r"SEGTAPE_[A-Z0-9_]*[A-Z0-9]", c.spelling):
                    continue  # (a helper macro of the list macros: SEGTAPE_OP_KIND_, ..._Unary)
                found[path].append((namespace, c))

        walk(tu.cursor, [])
        for path, header in self.headers.items():
            undefined = set(re.findall(rb"^#undef\s+(\w+)", header.data, flags=re.M))
            found[path] = [(ns, c) for ns, c in found[path]
                           if c.kind != K.MACRO_DEFINITION or c.spelling.encode() not in undefined]
        return found

    def render(self, header, items):
        K = self.K
        parts = [f"## `{header.name}`\n"]
        comment = header.file_comment()
        if comment:
            parts.append(f"```cpp\n{comment}\n```\n")
        block, block_ns, done_macro_sites, names = [], None, set(), []
        last_end = 0  # where the last declaration written ends

        def add(text, start):
            """A declaration to the block, after a blank line where the header has one."""
            together = block and not re.search(rb"\n[ \t]*\n", header.data[last_end:start])
            if together:
                block[-1] += "\n" + text
            else:
                block.append(text)

        def flush():
            if block:
                where = f"In `{'::'.join(block_ns)}`:\n\n" if block_ns else ""
                parts.append(where + "```cpp\n" + "\n\n".join(block) + "\n```\n")
                block.clear()

        for namespace, c in items:
            start, end = c.extent.start.offset, c.extent.end.offset
            name = "::".join(namespace + [c.spelling])
            written = header.data[start:end].decode()
            if c.kind != K.MACRO_DEFINITION and c.spelling and c.spelling not in written:
                # Made by a macro: the comment above the macro's lines, then the declarations.
                site = header.line_start(start)
                if c.kind not in self.functions:
                    continue
                first = site
                while first > 0 and re.match(rb"\s*(#|SEGTAPE_\w+\()", header.data[header.line_start(first - 1):first]):
                    first = header.line_start(first - 1)  # (up through the macro's lines to its comment)
                if first not in done_macro_sites:
                    done_macro_sites.add(first)
                    if namespace != block_ns:
                        flush()
                        block_ns = namespace
                    comment = header.leading_comment(first)
                    block.append(dedent(header.text(comment, first)) if comment < first else "")
                block[-1] = (block[-1] + "\n" + self.from_types(c, namespace)).lstrip("\n")
                last_end = header.line_end(end)
                names.append(name)
                continue
            first = header.leading_comment(start)
            text = dedent(header.text(first, header.line_end(end), self.cuts(c, header)))
            if namespace != block_ns:
                flush()
                block_ns = namespace
            if c.kind in self.records and (c.is_definition() or c.kind == K.ENUM_DECL):
                flush()
                parts.append(f"### `{name}`\n\n```cpp\n{text}\n```\n")
            else:
                add(text, first)
            last_end = header.line_end(end)
            names.append(name)
        flush()
        return "\n".join(parts), names


def slug(text):
    """The heading's anchor, as mkdocs.yml's toc makes it (pymdownx's slugify, lower case)."""
    from pymdownx.slugs import slugify
    return slugify(case="lower")(text, "-")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/gen_cpp.py OUT.md")
    out_path = sys.argv[1]
    generator = Generator(load_clang())
    items = generator.items(generator.parse())
    sections, count = [], 0
    for path, header in generator.headers.items():
        text, names = generator.render(header, items[path])
        sections.append(text)
        count += len(names)
    headers = list(generator.headers.values())
    page = [
        "<!-- Generated by docs/gen_cpp.py from the public headers (docs/build.sh). "
        "Do not edit: change the headers' comments. -->\n",
        "# C++ API\n",
        "The public headers of the C++ library, as `cmake --install` installs them under `include/segtape/`, "
        "with their comments: each header's public declarations in its own order, without private members, "
        "function bodies and implementation details. This page is generated from the headers each time the "
        "site is built, so it always matches them. How the pieces fit: [design notes](../design.md); "
        "the layers and optimizers: [nn (C++)](../nn.md).\n",
        "Headers: " + ", ".join(f"[`{h.name}`](#{slug(h.name)})" for h in headers) + ".\n",
    ]
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "w") as f:
        f.write("\n".join(page + sections))
    print(f"gen_cpp.py: wrote {out_path}: {len(headers)} headers, {count} declarations")


if __name__ == "__main__":
    main()
