"""The package's shape, measured over its own imports (the folders' rules are import-linter
contracts in pyproject.toml, run by `make test`): no import circle, short import chains, and
modules small enough to read.

Circles are looked for over every import, those inside functions included (grimp's graph).  The
depth is that of loading a module: the longest chain of module-level imports, since an import
inside a function (a subcommand's module, torch where a GPU is asked for) is deferred on purpose
and runs only when that function does."""

from __future__ import annotations

import ast
import functools
import pathlib

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_DEPTH = 8  # modules in the longest chain of imports
MAX_LINES = 500


@functools.cache
def _graph() -> dict[str, set[str]]:
    g = grimp.build_graph("sacbot", exclude_type_checking_imports=True)
    mods = {m for m in g.modules if m.startswith("sacbot")}
    return {m: {i for i in g.find_modules_directly_imported_by(m) if i in mods and i != m} for m in mods}


def _module_level_graph() -> dict[str, set[str]]:
    """sacbot's modules (envs/ as sacbot.envs) and the ones each imports at module level."""
    files = {}
    for folder, prefix in (("sacbot", ()), ("envs", ("sacbot",))):
        for p in (ROOT / folder).rglob("*.py"):
            parts = (*prefix, *p.relative_to(ROOT).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    edges: dict[str, set[str]] = {}
    for name, p in files.items():
        out = set()
        for node in ast.parse(p.read_text()).body:  # module level: not in functions, not TYPE_CHECKING
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("sacbot"):
                found = {f"{node.module}.{a.name}" for a in node.names} & files.keys()
                out |= found or ({node.module} & files.keys())
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names} & files.keys()
        edges[name] = out - {name}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _longest_chain(edges: dict[str, set[str]]) -> list[str]:
    @functools.cache
    def chain(v: str) -> tuple[str, ...]:  # edges must hold no circle (test_no_import_circle...)
        best: tuple[str, ...] = ()
        for w in sorted(edges[v]):
            c = chain(w)
            if len(c) > len(best):
                best = c
        return (v, *best)

    return list(max((chain(v) for v in sorted(edges)), key=len))


def test_the_checks_find_a_circle_and_measure_a_chain():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _longest_chain({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == ["a", "b", "c"]


def test_no_import_circle_in_the_package():
    assert _cycles(_graph()) == []


def test_loading_any_module_imports_at_most_eight_levels_deep():
    chain = _longest_chain(_module_level_graph())
    assert len(chain) <= MAX_DEPTH, " -> ".join(chain)


@pytest.mark.parametrize("folder", ["sacbot", "envs"])
def test_no_module_is_over_500_lines(folder):
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
