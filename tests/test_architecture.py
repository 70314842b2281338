"""The shape of the code, checked: data flows one way (shardship kernel <- packer <-
transfer <- train), no stage imports a later one outside the CLI layer, no file or
function grows past what a reader takes in at once (docs/ARCHITECTURE.md)."""
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
