"""Optional static code policy: refuse a cell before it reaches a kernel.

Defence in depth, off by default: the container is the real boundary. A static
look at dynamic Python can always be evaded -- ``exec`` of a string built at run
time, a denied module reached through another module's attributes
(``asyncio.subprocess``), a file written and then imported or ``%run``, a name
bound by an earlier cell (``import os as o`` in one, ``o.system()`` in the next:
each cell is checked alone) -- so this catches the obvious, cheap cases (a
model's first attempt, a pasted snippet), says plainly which rule and line
refused the cell, and claims nothing more.

Cells are IPython input, not Python. Magics, shell escapes, help (``obj?``) and
pasted prompts are read the way IPython's own input transformer
(``IPython.core.inputtransformer2``) reads them, so notebook code still parses
and keeps its line numbers; the Python inside ``%time``/``%%capture``-style
magics and in ``{expr}`` of magic and shell arguments is checked too.

Known gap: code that still does not parse passes unchecked. IPython refuses to
run a cell with a SyntaxError, so nothing of it runs -- unless IPython accepts
syntax this reading does not know (other IPython versions, magics an extension
adds); that is where a determined writer gets through.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re
import string
import textwrap
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["CodePolicy", "PolicyViolation"]


class PolicyViolation(Exception):
    """A cell the policy refuses. ``rule`` is the setting that refused it
    (``deny_imports``, ``deny_calls``, ``deny_shell``; ``nesting`` for magics nested
    too deep to check), ``line`` is 1-based in the submitted cell, and ``message``
    (also ``str()``) says both, for a person or a model to act on."""

    def __init__(self, rule: str, line: int | None, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.line = line
        self.message = message

    def __reduce__(self) -> tuple[type[PolicyViolation], tuple[str, int | None, str]]:
        return type(self), (self.rule, self.line, self.message)


# Line magics that run a shell command: IPython's, its default aliases, ipykernel's
# %man, the package managers (they build a shell command line) and the alias makers.
_SHELL_LINE_MAGICS = frozenset(
    {"system", "sx", "sc", "man", "alias", "rehashx", "pip", "conda", "mamba", "micromamba", "uv"}
    | {"ls", "ll", "lf", "lk", "ldir", "lx", "cat", "cp", "mv", "rm", "mkdir", "rmdir"}
)
# Cell magics that hand their body to a shell or another interpreter.
_SHELL_CELL_MAGICS = frozenset(
    {"!", "system", "sx", "script", "bash", "sh", "perl", "ruby", "python", "python2", "python3", "pypy"}
)
# Magics whose argument or body is Python IPython runs; the value is the
# getopt spec of the line magic's options (its statement follows them).
_PYTHON_LINE_MAGICS = {"time": "", "timeit": "n:r:tcp:qo", "prun": "D:l:rs:T:q", "debug": "b:"}
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "prun", "debug", "capture"})

_IMPORTERS = frozenset({"__import__", "importlib.import_module", "importlib.__import__", "sys.modules.get"})
_GET_IPYTHON = frozenset({"get_ipython", "IPython.get_ipython", "IPython.core.getipython.get_ipython"})
_SHELL_METHODS = frozenset(f"get_ipython().{m}" for m in ("system", "getoutput", "system_raw", "system_piped"))
_MAX_DEPTH = 8
"""Magics inside magics (``%time %time ...``) checked before the cell is refused."""

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what the Python tokenizer counts, so line numbers agree
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\Z")
_ESCAPES = frozenset("!%?,;/")
_DOCTEST_PS1 = re.compile(r"\s*>>>")
_DOCTEST_PROMPT = re.compile(r"\s*(?:>>>|\.\.\.)[ \t]?")
_IPYTHON_PROMPT = re.compile(r"(?:(?:(?:\[nav\]|\[ins\])? )?In \[\d+\]: |\s*\.{3,}: ?)")
_CELL_MAGIC_HELP = re.compile(r"%%\w+\?")
_MAGIC_HELP = re.compile(r"%{1,2}[\w.]*\?{1,2}\s*\Z")
_AUTOMAGIC = re.compile(r"\s*([\w.*]*)(.*)\Z", re.DOTALL)
_STRING_END = {q: re.compile(r"(?:[^\\]|\\.)*?" + q, re.DOTALL) for q in ("'", '"', "'''", '"""')}
_NOT_BARE_BEFORE_EQ = frozenset("=!<>:+-*/%&|^@")


@dataclass(frozen=True)
class CodePolicy:
    """What cells may not do. Empty (the default) allows everything.

    ``deny_imports``: modules, with their submodules (``import``, ``from ... import``,
    ``__import__``/``importlib.import_module``/``sys.modules`` with a literal name).
    ``deny_calls``: dotted names such as ``eval`` or ``os.system``, matched through
    import aliases, simple assignments and ``getattr`` with a literal; any use is
    refused, not only a call, so ``from os import system`` in one cell cannot set up
    ``system()`` in the next. ``deny_shell``: IPython's shell syntax (``!cmd``,
    ``x = !cmd``, ``%%bash`` and the other script magics, ``%system``/``%sx``, shell
    aliases such as ``%ls``, ``%pip``) and ``get_ipython().system()``; Python's own
    routes to a shell (``os.system``, ``subprocess``) belong in the other two lists.
    """

    deny_imports: tuple[str, ...] = ()
    deny_calls: tuple[str, ...] = ()
    deny_shell: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "deny_imports", _names(self.deny_imports, "deny_imports"))
        object.__setattr__(self, "deny_calls", _names(self.deny_calls, "deny_calls"))
        object.__setattr__(self, "deny_shell", bool(self.deny_shell))

    @classmethod
    def from_lists(
        cls,
        deny_imports: Iterable[str] | str | None = None,
        deny_calls: Iterable[str] | str | None = None,
        deny_shell: bool = False,
    ) -> CodePolicy:
        """From settings: lists (or comma-separated strings); blanks and repeats dropped."""
        return cls(_names(deny_imports, "deny_imports"), _names(deny_calls, "deny_calls"), bool(deny_shell))

    @property
    def enabled(self) -> bool:
        return bool(self.deny_imports or self.deny_calls or self.deny_shell)

    def check(self, code: str) -> None:
        """Raise :class:`PolicyViolation` for the first denied thing (by line) in ``code``.

        Returns quietly when the policy is disabled, and when the cell does not
        parse even after IPython's syntax is set aside: the kernel then reports the
        SyntaxError itself and runs nothing (see the module docstring for the gap).
        """
        if not self.enabled:
            return
        reader = _Reader()
        reader.read(_split(code), 0, None, 0)
        live: set[int] = set()
        trees: list[tuple[ast.AST, int]] = []
        found: list[PolicyViolation] = []
        for cell in reader.cells:
            if cell.tree is None or (cell.parent is not None and id(cell.parent) not in live):
                continue  # IPython would not run it (or not reach it): nothing to refuse
            live.add(id(cell))
            trees.append((cell.tree, cell.offset))
            if self.deny_shell:
                found += [_violation("deny_shell", line, what) for line, what in cell.shell]
            for line, expr in cell.exprs:
                tree = _parse(expr.strip(), "eval")
                if tree is not None:
                    trees.append((tree, line - 1))
        found += _Analysis(self, trees).run()
        if found:
            raise min(found, key=lambda v: v.line or 0)


def _names(value: Iterable[str] | str | None, setting: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    out: list[str] = []
    for item in items:
        name = str(item).strip()
        if setting == "deny_calls":
            name = name.removeprefix("builtins.")
        if not name or name in out:
            continue
        if not _DOTTED.match(name):
            # a typo must fail loudly: a silently dead rule is worse than none
            raise ValueError(f"{setting}: {name!r} is not a dotted Python name")
        out.append(name)
    return tuple(out)


def _violation(rule: str, line: int | None, what: str) -> PolicyViolation:
    return PolicyViolation(rule, line, f"line {line}: {what} is denied by the gateway's code policy ({rule})")


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _split(code: str) -> list[str]:
    lines = _LINE_BREAK.split(code)
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()  # IPython: "ls\n" is one line, "ls\n\n" two
    return lines


def _parse(source: str, mode: str = "exec") -> ast.AST | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like are the kernel's to report
            tree: ast.AST = compile(
                source, "<cell>", mode, ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
            )
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    return tree


# --- IPython syntax -> Python with the same line numbers


@dataclass(eq=False)
class _Cell:
    """A piece IPython compiles on its own: the cell, or Python inside a magic.
    ``lines`` are Python standing in for lines ``offset + 1`` onwards of the cell;
    ``parent`` must run for this to run."""

    offset: int
    parent: _Cell | None
    lines: list[str]
    shell: list[tuple[int, str]] = field(default_factory=list)
    exprs: list[tuple[int, str]] = field(default_factory=list)  # {expr} IPython evaluates in arguments
    tree: ast.AST | None = None


def _dedents(lines: list[str], first: int) -> list[list[str]]:
    """IPython 9 removes the common indentation, IPython 8 the first line's: try both."""
    head, body = lines[:first], lines[first:]
    common = textwrap.dedent("\n".join(body)).split("\n")
    indent = body[0][: len(body[0]) - len(body[0].lstrip(" \t"))]
    by_first = [s.removeprefix(indent) for s in body]
    return [head + common] + ([head + by_first] if by_first != common else [])


def _strip_prompts(lines: list[str], first: int) -> None:
    body = lines[first:]
    if any(_DOCTEST_PS1.match(s) for s in body):
        body = [_DOCTEST_PROMPT.sub("", s, count=1) for s in body]
    if _IPYTHON_PROMPT.match(body[0]) or (len(body) > 1 and _IPYTHON_PROMPT.match(body[1])):
        body = [_IPYTHON_PROMPT.sub("", s, count=1) for s in body]
    lines[first:] = body


def _continued(lines: list[str], i: int) -> int:
    """Last line of a backslash-continued magic or shell command (IPython joins them)."""
    while lines[i].endswith("\\") and i + 1 < len(lines):
        i += 1
    return i


def _assemble(lines: list[str], i: int, end: int, col: int) -> str:
    parts = [lines[i][col:], *lines[i + 1 : end + 1]]
    return " ".join([p.rstrip()[:-1] for p in parts[:-1]] + [parts[-1].rstrip()])


def _bare_assign(line: str, j: int) -> bool:
    """``=`` at ``j`` is an assignment, not part of ``==``, ``<=``, ``+=``, ``:=``..."""
    return line[j + 1 : j + 2] != "=" and (j == 0 or line[j - 1] not in _NOT_BARE_BEFORE_EQ)


def _strip_options(args: str, spec: str) -> str:
    """The statement after a magic's getopt-style options (``%timeit -n 10 f()`` -> ``f()``)."""
    rest = args.strip()
    while rest.startswith("-") and len(rest) > 1:
        word, rest = ([*rest.split(None, 1), ""])[:2]
        if word == "--":
            break
        if word.startswith("--"):
            takes_value = word == "--breakpoint"
        else:  # -qn 10: the first letter taking a value takes the rest of the word, or the next one
            letters = word[1:]
            takes_value = next((k for k, ch in enumerate(letters) if ch + ":" in spec), None) == len(letters) - 1
        if takes_value:
            rest = ([*rest.split(None, 1), ""])[1]
    return rest


def _runs_python(name: str, args: str) -> bool:
    """``%%python3`` and ``%%script python3`` bodies are Python too (in a subprocess)."""
    program = args.split()[0].rsplit("/", 1)[-1] if name == "script" and args.split() else name
    return program.startswith(("python", "pypy"))


class _Reader:
    """Splits a cell into the Python pieces IPython would compile, in order, parents first."""

    def __init__(self) -> None:
        self.cells: list[_Cell] = []

    def read(self, lines: list[str], offset: int, parent: _Cell | None, depth: int) -> None:
        first = next((i for i, s in enumerate(lines) if s.strip()), None)
        if first is None:
            return
        if depth > _MAX_DEPTH:
            line = offset + first + 1
            raise PolicyViolation(
                "nesting",
                line,
                f"line {line}: magics nested more than {_MAX_DEPTH} deep cannot be checked "
                "and are refused by the gateway's code policy",
            )
        single = len(lines) - first == 1  # IPython's automagic applies to one-line cells only
        base = [""] * first + lines[first:]
        tree = _parse("\n".join(base))
        if tree is not None:  # plain Python (nearly every cell): IPython leaves it alone
            cell = _Cell(offset, parent, list(base))
            self.cells.append(cell)
            if single:
                self._automagic(cell, first, depth)
            cell.tree = tree if cell.lines == base else _parse("\n".join(cell.lines))
            return
        chosen: _Reader | None = None
        for variant in _dedents(base, first):
            sub = _Reader()
            cell = _Cell(offset, parent, variant)
            sub.cells.append(cell)
            touched = sub._transform(cell, first, depth)
            if single and first not in touched:
                sub._automagic(cell, first, depth)
            cell.tree = _parse("\n".join(cell.lines))
            if chosen is None or cell.tree is not None:
                chosen = sub
            if cell.tree is not None:
                break
        assert chosen is not None
        self.cells += chosen.cells

    def _transform(self, cell: _Cell, first: int, depth: int) -> set[int]:
        """Replace IPython syntax in place; return the lines replaced."""
        lines = cell.lines
        _strip_prompts(lines, first)
        head = lines[first]
        if head.startswith("%%") and not _CELL_MAGIC_HELP.match(head):
            name, _, args = head[2:].rstrip().partition(" ")
            body = lines[first + 1 :]
            lines[first:] = ["pass"] + [""] * len(body)
            line = cell.offset + first + 1
            if name in _SHELL_CELL_MAGICS:
                cell.shell.append((line, f"shell magic '%%{name}'"))
            self._braces(cell, args, line)
            if name == "timeit":  # its argument is setup code
                self.read([_strip_options(args, _PYTHON_LINE_MAGICS["timeit"])], line - 1, cell, depth + 1)
            if name in _PYTHON_CELL_MAGICS or _runs_python(name, args):
                self.read(body, line, cell, depth + 1)
            return set(range(first, len(lines)))
        return self._scan(cell, first, depth)

    def _scan(self, cell: _Cell, first: int, depth: int) -> set[int]:
        """Walk the lines as Python's tokenizer would (strings, brackets, comments,
        backslashes), so IPython syntax is recognised only where IPython sees it: at the
        start of a logical line, after its first ``=``, or as a trailing ``?``."""
        lines = cell.lines
        touched: set[int] = set()
        quote: str | None = None
        brackets = 0
        cont = assigned = False
        start = i = first
        while i < len(lines):
            line = lines[i]
            if quote is None and brackets == 0 and not cont:
                start, assigned = i, False
                text = line.lstrip()
                if text[:1] in _ESCAPES:
                    indent = line[: len(line) - len(text)]
                    end = _continued(lines, i)
                    lines[i] = indent + self._escape(cell, _assemble(lines, i, end, len(indent)), i, depth)
                    lines[i + 1 : end + 1] = [""] * (end - i)
                    touched.update(range(i, end + 1))
                    i = end + 1
                    continue
            j, n, code_end, escaped = 0, len(line), len(line), False
            while j < n:
                if quote is not None:
                    m = _STRING_END[quote].match(line, j)
                    if m is None:
                        j = n
                        break
                    j, quote = m.end(), None
                    continue
                c = line[j]
                if c == "#":
                    code_end = j
                    break
                if c in "'\"":
                    quote = c * 3 if line.startswith(c * 3, j) else c
                    j += len(quote)
                    continue
                if c in "([{":
                    brackets += 1
                elif c in ")]}":
                    brackets = max(0, brackets - 1)
                elif c == "=" and brackets == 0 and not assigned and _bare_assign(line, j):
                    assigned = True
                    k, rhs = i, line[j + 1 :].lstrip()
                    while rhs == "\\" and k + 1 < len(lines):  # x = \ then !cmd on the next line
                        k += 1
                        rhs = lines[k].lstrip()
                    if rhs[:1] in ("!", "%"):  # x = !cmd, x = %magic
                        col = len(lines[k]) - len(rhs)
                        end = _continued(lines, k)
                        self._escape(cell, _assemble(lines, k, end, col), k, depth)
                        lines[k] = lines[k][:col] + "None"
                        lines[k + 1 : end + 1] = [""] * (end - k)
                        touched.update(range(i, end + 1))
                        quote, brackets, i, escaped = None, 0, end + 1, True
                        break
                j += 1
            if escaped:
                cont = False
                continue
            if quote in ("'", '"') and not line.endswith("\\"):
                quote = None  # an unterminated string ends with its line (the parser will say so)
            cont = quote is None and code_end == n and line.endswith("\\")
            if quote is None and brackets == 0 and not cont and line[:code_end].rstrip().endswith("?"):
                stripped = lines[start].lstrip()  # obj? / obj?? : help, runs nothing
                lines[start] = lines[start][: len(lines[start]) - len(stripped)] + "pass"
                lines[start + 1 : i + 1] = [""] * (i - start)
                touched.update(range(start, i + 1))
            i += 1
        last = next((k for k in range(len(lines) - 1, start - 1, -1) if lines[k].strip()), start)
        if quote is None and brackets and lines[last].rstrip().endswith("?"):
            # IPython too reads `d = {\nobj?` at the end of a cell as help on obj, dropping the rest
            indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
            lines[start:] = [indent + "pass"] + [""] * (len(lines) - start - 1)
            touched.update(range(start, len(lines)))
        return touched

    def _escape(self, cell: _Cell, text: str, i: int, depth: int) -> str:
        """One escaped line (``!cmd``, ``%magic``, ``?obj``, ``/f x``...): note what it
        runs; return the Python IPython puts in its place (``pass`` for its own calls)."""
        line = cell.offset + i + 1
        if text.startswith("!"):
            cell.shell.append((line, f"shell command {_short(text)!r}"))
            self._braces(cell, text.lstrip("!"), line)
            return "pass"
        if text.startswith("%"):
            if not _MAGIC_HELP.match(text):
                name, _, args = text[1:].partition(" ")
                self._magic(cell, name, args, line, depth, f"shell magic '%{name}'")
            return "pass"
        if text.startswith("?"):
            return "pass"
        name, _, args = text[1:].partition(" ")  # IPython's autocall escapes, verbatim
        if text[0] == ",":
            return '{}("{}")'.format(name, '", "'.join(args.split()))
        if text[0] == ";":
            return f'{name}("{args}")'
        return "{}({})".format(name, ", ".join(args.split())) if name else text

    def _magic(self, cell: _Cell, name: str, args: str, line: int, depth: int, shown: str) -> None:
        if name in _SHELL_LINE_MAGICS:
            cell.shell.append((line, shown))
        self._braces(cell, args, line)
        spec = _PYTHON_LINE_MAGICS.get(name)
        if spec is not None:
            self.read([_strip_options(args, spec)], line - 1, cell, depth + 1)

    def _automagic(self, cell: _Cell, i: int, depth: int) -> None:
        """A one-line cell starting with a magic's name runs that magic (IPython's
        automagic, on by default) unless the name is a Python one or is assigned."""
        line = cell.lines[i]
        m = _AUTOMAGIC.match(line)
        assert m is not None
        name, rest = m.group(1), m.group(2)
        if (
            not name.isidentifier()
            or keyword.iskeyword(name)
            or hasattr(builtins, name)
            or rest.lstrip()[:1] in ("=", ",")
        ):
            return
        parses = _parse(line.strip()) is not None
        if name in _SHELL_LINE_MAGICS or name in _PYTHON_LINE_MAGICS or not parses:
            # not parsing, it can only run as a magic: one this list may not know, whose {expr} still run
            shown = f"{_short(line)!r} (IPython runs it as the shell magic '%{name}')"
            self._magic(cell, name, rest, cell.offset + i + 1, depth, shown)
            if not parses:
                cell.lines[i] = line[: len(line) - len(line.lstrip())] + "pass"

    @staticmethod
    def _braces(cell: _Cell, text: str, line: int) -> None:
        """IPython evaluates ``{expr}`` in magic and shell arguments as Python."""
        try:
            fields = list(string.Formatter().parse(text))
        except ValueError:
            return  # IPython's expansion fails the same way and evaluates nothing
        for _, name, spec, _ in fields:
            if name:
                cell.exprs.append((line, f"{name}:{spec}" if spec else name))


# --- the checks


def _literal(node: ast.AST) -> str | None:
    """A string the parser already knows: ``"os"``, ``"o" "s"``, ``"o" + "s"``, ``f"os"``."""
    tail: list[str] = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        right = _literal(node.right) if not isinstance(node.right, ast.BinOp) else None
        if right is None:
            return None
        tail.append(right)
        node = node.left
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        node = ast.Constant("".join(str(v.value) for v in node.values if isinstance(v, ast.Constant)))
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value + "".join(reversed(tail))
    return None


def _join(base: str, attr: str) -> str:
    return attr if base in ("builtins", "__builtins__") else f"{base}.{attr}"


def _source(node: ast.AST) -> str:
    try:
        return _short(ast.unparse(node))
    except (RecursionError, ValueError):
        return "?"


class _Analysis:
    """Names resolved to dotted paths through imports, one-name assignments,
    ``getattr``/``__import__`` with literals and ``get_ipython()``; flow-insensitive
    and per cell, which is cheap, and enough for the obvious cases."""

    def __init__(self, policy: CodePolicy, trees: list[tuple[ast.AST, int]]) -> None:
        self.imports = policy.deny_imports
        self.calls = frozenset(policy.deny_calls)
        self.shell = policy.deny_shell
        self.aliases: dict[str, str] = {}
        self.star: list[str] = []
        self.memo: dict[int, str | None] | None = None  # once the aliases are final
        self.trees = [(list(ast.walk(tree)), offset) for tree, offset in trees]
        for nodes, _ in self.trees:
            for node in nodes:
                if isinstance(node, ast.Import):
                    for a in node.names:
                        top = a.name.partition(".")[0]
                        self.aliases[a.asname or top] = a.name if a.asname else top
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for a in node.names:
                        if a.name == "*":
                            self.star.append(node.module)
                        else:
                            self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for nodes, _ in self.trees:  # o = os, ip = get_ipython(): after the imports they may name
            for node in nodes:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    value = self.dotted(node.value)
                    if value is not None and value != node.targets[0].id:
                        self.aliases[node.targets[0].id] = value
        self.memo = {}

    def dotted(self, node: ast.AST, depth: int = 0) -> str | None:
        """``o.path.join`` -> ``os.path.join`` after ``import os as o``; None if unknown."""
        chain: list[ast.Attribute] = []
        base: str | None = None
        while isinstance(node, ast.Attribute):
            if self.memo is not None and id(node) in self.memo:  # a.b.c..., each prefix once: linear
                base = self.memo[id(node)]
                break
            chain.append(node)
            node = node.value
        else:
            if isinstance(node, ast.Name):
                base = self.aliases.get(node.id) or next(
                    (f"{m}.{node.id}" for m in self.star if f"{m}.{node.id}" in self.calls), node.id
                )
            elif depth > 16:
                return None
            elif isinstance(node, ast.Call):
                base = self._returns(node, depth + 1)
            elif isinstance(node, ast.Subscript) and self.dotted(node.value, depth + 1) == "sys.modules":
                base = _literal(node.slice)
        for attr_node in reversed(chain):
            base = None if base is None else _join(base, attr_node.attr)
            if self.memo is not None:
                self.memo[id(attr_node)] = base
        return base

    def _returns(self, call: ast.Call, depth: int) -> str | None:
        """What a call returns, for the few that return something we can name."""
        func = self.dotted(call.func, depth)
        arg = _literal(call.args[0]) if call.args else None
        if func in _IMPORTERS and arg:
            top_only = func == "__import__" and len(call.args) < 4 and not call.keywords
            return arg.partition(".")[0] if top_only else arg
        if func == "getattr" and len(call.args) >= 2:
            base, attr = self.dotted(call.args[0], depth), _literal(call.args[1])
            return _join(base, attr) if base and attr else None
        if func in _GET_IPYTHON and not call.args:
            return "get_ipython()"
        return None

    def run(self) -> list[PolicyViolation]:
        found: list[PolicyViolation] = []
        for nodes, offset in self.trees:
            called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
            for node in nodes:
                line = getattr(node, "lineno", 1) + offset
                if isinstance(node, ast.Import):
                    found += [v for a in node.names if (v := self._import(a.name, line))]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for name in [node.module] + [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]:
                        v = self._import(name, line)
                        if v is None and name in self.calls:
                            v = _violation("deny_calls", line, f"import of {name!r}")
                        if v is not None:
                            found.append(v)
                            break
                elif isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                    if isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)):
                        continue
                    v = self._use(node, line, id(node) in called)
                    if v is not None:
                        found.append(v)
        return found

    def _import(self, module: str, line: int) -> PolicyViolation | None:
        if any(module == d or module.startswith(d + ".") for d in self.imports):
            return _violation("deny_imports", line, f"import of {module!r}")
        return None

    def _use(self, node: ast.AST, line: int, called: bool) -> PolicyViolation | None:
        if isinstance(node, ast.Call):  # __import__("x"), importlib.import_module("x"), run_line_magic("sx", ...)
            func, arg = self.dotted(node.func), (_literal(node.args[0]) if node.args else None)
            if func in _IMPORTERS and arg and (v := self._import(arg, line)):
                return v
            if self.shell and func == "get_ipython().run_line_magic" and arg in _SHELL_LINE_MAGICS:
                return _violation("deny_shell", line, f"call of {_source(node)!r}")
            if self.shell and func == "get_ipython().run_cell_magic" and arg in _SHELL_CELL_MAGICS:
                return _violation("deny_shell", line, f"call of {_source(node)!r}")
        if isinstance(node, ast.Subscript) and self.dotted(node.value) == "sys.modules":
            arg = _literal(node.slice)
            if arg and (v := self._import(arg, line)):
                return v
        name = self.dotted(node)  # for a call: what it returns (getattr(os, "system") -> os.system)
        if name is None:
            return None
        rule = "deny_calls" if name in self.calls else "deny_shell" if self.shell and name in _SHELL_METHODS else None
        if rule is None:
            return None
        shown = _source(node)
        what = f"{'call' if called else 'use'} of {name!r}" + (f" (as {shown!r})" if shown != name else "")
        return _violation(rule, line, what)
