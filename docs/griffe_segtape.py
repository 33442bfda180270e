"""A griffe extension for the Python reference page (reference/python.md):
the compiled functions' signatures, and docstrings shown as written.

mkdocstrings reads the installed package by importing it (docs/build.sh), and
Python's inspect module cannot read the signature of a function bound with
nanobind: without this extension segtape.tanh shows as `tanh()` and its
docstring starts with the signature as text. nanobind keeps each function's
signatures, docstrings and default values in __nb_signature__; this turns
them into griffe's parameters, return type and overloads, and spells the
extension's types as users write them (segtape.Tensor, not
segtape._segtape.Tensor). A property or constant whose only documentation is
its type's (a nanobind getter's "(self) -> int", str's docstring) gets no
docstring rather than a wrong one.

mkdocstrings reads a docstring as Markdown; segtape's are plain text, so
each is escaped where Markdown would change it: `<eos>` would vanish as an
HTML tag and super().__init__ turn bold. Code spans (`...`) and indented
blocks are left as written.

Loaded by mkdocs.yml (the python handler's `extensions`).
"""
import ast
import re

import griffe

_EXTENSION_MODULE = re.compile(r"\bsegtape\._segtape\.")
_DEFAULT = re.compile(r"\\(\d+)")
_KINDS = {"posonlyargs": griffe.ParameterKind.positional_only, "args": griffe.ParameterKind.positional_or_keyword,
          "kwonlyargs": griffe.ParameterKind.keyword_only}


def _spelled(text):
    return _EXTENSION_MODULE.sub("segtape.", text)


def _function(name, signature, defaults):
    """A griffe Function from one of nanobind's signatures, e.g.
    'def sum(input: segtape._segtape.Tensor, axis: int | None = \\0) -> segtape._segtape.Tensor'
    with the values of \\0, \\1, ... in `defaults`."""
    text = _DEFAULT.sub(lambda m: f"_nb_default_{m.group(1)}", signature)
    text = re.sub(r"^def\s*\(", "def _(", text)  # (a property's getter has no name)
    tree = ast.parse(text + ": ...").body[0]
    args = tree.args

    def default(node):
        if node is None:
            return None
        source = ast.unparse(node)
        m = re.fullmatch(r"_nb_default_(\d+)", source)
        return repr(defaults[int(m.group(1))]) if m and defaults else _spelled(source)

    def annotation(node):
        return None if node is None else _spelled(ast.unparse(node))

    positional = args.posonlyargs + args.args
    pos_defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parameters = []
    for kind in ("posonlyargs", "args"):
        for a in getattr(args, kind):
            d = pos_defaults[positional.index(a)]
            parameters.append(griffe.Parameter(a.arg, annotation=annotation(a.annotation), kind=_KINDS[kind],
                                               default=default(d)))
    if args.vararg:
        parameters.append(griffe.Parameter(args.vararg.arg, annotation=annotation(args.vararg.annotation),
                                           kind=griffe.ParameterKind.var_positional))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        parameters.append(griffe.Parameter(a.arg, annotation=annotation(a.annotation), kind=_KINDS["kwonlyargs"],
                                           default=default(d)))
    if args.kwarg:
        parameters.append(griffe.Parameter(args.kwarg.arg, annotation=annotation(args.kwarg.annotation),
                                           kind=griffe.ParameterKind.var_keyword))
    if parameters and parameters[0].name == "self":
        parameters = parameters[1:]  # (a method's instance: not written, as on the Python classes)
    return griffe.Function(name, parameters=griffe.Parameters(*parameters), returns=annotation(tree.returns))


_MARKDOWN = re.compile(r"[\\<*_]")


def _escaped(text):
    return _MARKDOWN.sub(lambda m: "&lt;" if m.group() == "<" else "\\" + m.group(), text)


def _as_text(docstring):
    """Markdown that shows `docstring` as written (see above)."""
    out, code, blank = [], False, True
    for line in docstring.splitlines():
        code = bool(line.strip()) and line.startswith("    ") and (code or blank)  # (an indented block)
        blank = not line.strip()
        if not code:
            parts = line.split("`")
            if len(parts) % 2 == 0:
                parts = [line]  # (a backtick without its pair: no code span)
            line = "`".join(_escaped(p) if i % 2 == 0 else p for i, p in enumerate(parts))
        out.append(line)
    return "\n".join(out)


class SegtapeReference(griffe.Extension):
    def on_object(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = _as_text(obj.docstring.value)

    def on_function_instance(self, *, node, func, **kwargs):
        signatures = getattr(node.obj, "__nb_signature__", None)
        if not signatures:
            return
        try:
            functions = [_function(func.name, sig, defaults) for sig, _, defaults in signatures]
        except SyntaxError:
            return  # (not Python: an array's type, ndarray[dtype=float32, ...]; kept as it was)
        func.parameters, func.returns = functions[0].parameters, functions[0].returns
        func.labels.discard("method descriptor")  # (how CPython holds a compiled method: not the reader's concern)
        if len(functions) > 1:
            func.overloads = functions
        docs = "\n\n".join(doc for _, doc, _ in signatures if doc)
        func.docstring = griffe.Docstring(docs, parent=func) if docs else None

    def on_attribute_instance(self, *, node, attr, **kwargs):
        obj = node.obj
        getter = getattr(obj, "fget", None)
        signatures = getattr(getter, "__nb_signature__", None)
        if signatures:
            try:
                attr.annotation = _function(attr.name, *signatures[0][::2]).returns
            except SyntaxError:
                pass
            doc = (getattr(obj, "__doc__", None) or "").strip()
            if doc == (getter.__doc__ or "").strip() and signatures[0][1] is None:
                attr.docstring = None
        elif not isinstance(obj, property) and getattr(obj, "__doc__", None) == getattr(type(obj), "__doc__", None):
            attr.docstring = None
