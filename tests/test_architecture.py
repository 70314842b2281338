"""The shape of the code, checked: data flows one way (shardship kernel <- packer <-
transfer <- train), no stage imports a later one outside the CLI layer, no file or
function grows past what a reader takes in at once, no module imports itself back through
others (docs/ARCHITECTURE.md)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["shardship", "packer", "transfer", "train"]  # each may import those before it
# the CLI layer may reach forward, lazily, to compose stages (packer budget sizes the
# trainer's checkpoints and reads the live quota)
CLI_EXCEPTIONS = {("packer/cli.py", "train"), ("packer/cli.py", "transfer")}
MAX_FILE_LINES = 460
MAX_FUNCTION_LINES = 85


def sources(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py"))


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out & set(ORDER)


@pytest.mark.parametrize("pkg", ORDER)
def test_stages_import_only_what_comes_before_them(pkg: str):
    later = set(ORDER[ORDER.index(pkg) + 1:])
    bad = []
    for p in sources(pkg):
        rel = str(p.relative_to(ROOT))
        for dep in imported_packages(p) & later:
            if (rel, dep) not in CLI_EXCEPTIONS:
                bad.append(f"{rel} imports {dep}")
    assert not bad, bad


def test_cli_exceptions_are_lazy():
    """The CLI's forward imports sit inside the command that needs them, so
    `import packer` never loads torch or paramiko."""
    for rel, dep in CLI_EXCEPTIONS:
        tree = ast.parse((ROOT / rel).read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.split(".")[0] == dep for n in names), f"{rel}: module-level import of {dep}"


@pytest.mark.parametrize("pkg", ORDER)
def test_files_and_functions_stay_readable(pkg: str):
    long_files, long_funcs = [], []
    for p in sources(pkg):
        text = p.read_text()
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{p.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_funcs.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long_files and not long_funcs, long_files + long_funcs


def _parses_index(fn: ast.AST) -> bool:
    """A function that calls json.load(s) and names index.json (or INDEX) parses it."""
    calls = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("load", "loads")
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "json" for n in ast.walk(fn))
    names = any((isinstance(n, ast.Constant) and n.value == "index.json")
                or (isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", "")) == "INDEX")
                for n in ast.walk(fn))
    return calls and names


# functions that name index.json and call json.loads on something else
NOT_INDEX_READERS = {"train/jobs/measure.py probe_worker_rss"}  # parses its probe's stdout


def test_one_module_reads_index_json():
    """Only the format module parses index.json; everyone else calls it."""
    owner = ROOT / "shardship" / "format" / "index.py"
    readers = []
    for pkg in ORDER:
        for p in sources(pkg):
            if p == owner:
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parses_index(node)
                        and f"{p.relative_to(ROOT)} {node.name}" not in NOT_INDEX_READERS):
                    readers.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not readers, readers


def module_names() -> dict[str, Path]:
    """Every module of the four packages by its dotted name (a package by its own)."""
    out: dict[str, Path] = {}
    for pkg in ORDER:
        for p in sources(pkg):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports: every import statement, at module level,
    inside a function or under TYPE_CHECKING alike (a type-only import closes a circle for
    the reader and for mypy as much as a run-time one). `from a.b import c` names the
    module a.b.c where c is one, else a.b; relative imports resolved."""
    mods = module_names()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for m, p in mods.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                out.update(o for o in (owner(a.name) for a in node.names) if o)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                for a in node.names:
                    o = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else owner(base)
                    if o:
                        out.add(o)
        out.discard(m)
        graph[m] = out
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycle_anywhere():
    """No module imports itself back through others, counting imports inside functions
    and under TYPE_CHECKING (issue 41): a circle names every module in it and, for each,
    the ones in the circle it imports."""
    graph = import_graph()
    cycles = import_cycles(graph)
    assert not cycles, [{m: sorted(graph[m] & set(c)) for m in c} for c in cycles]


def test_the_cycle_check_sees_lazy_and_type_only_imports():
    """The checker itself: a circle closed by a function-level import and one closed under
    TYPE_CHECKING are both found; a one-way chain is not."""
    src = {
        "a": "import b\n",
        "b": "def f():\n    import a\n",
        "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from d import X\n",
        "d": "from c import Y\n",
        "e": "import a\n",
    }
    graph = {}
    for m, text in src.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        graph[m] = names & set(src)
    assert sorted(import_cycles(graph)) == [["a", "b"], ["c", "d"]]
