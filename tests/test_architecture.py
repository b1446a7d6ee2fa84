"""The house rules that keep the middle of the package livable, checked on the source itself:
no import cycle (counting every import statement, those inside functions too, and the package
__init__ every import runs first), no module over 500 lines, and a config import that loads no
model, rollout, retriever or method code."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tinyrl"
MAX_LINES = 500


def modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".")[: None if is_package else -1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _owner(name: str, known: set[str]) -> str | None:
    """The longest prefix of a dotted name that is one of our modules."""
    parts = name.split(".")
    return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in known), None)


def import_graph() -> dict[str, set[str]]:
    """module -> the modules importing it runs: every `import` / `from ... import` (TYPE_CHECKING blocks
    left out) and, for `a.b.c`, the packages `a` and `a.b` whose __init__ runs first."""
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}

    def add(m: str, target: str | None) -> None:
        while target:
            if target != m and not m.startswith(target + "."):  # a module's own packages are running already
                graph[m].add(target)
            target = target.rpartition(".")[0] if "." in target else None

    for m, f in mods.items():
        is_package = f.name == "__init__.py"
        for node in _runtime_nodes(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    add(m, _owner(a.name, known))
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(m, is_package, node.level, node.module)
                for a in node.names:
                    add(m, _owner(f"{base}.{a.name}", known) or _owner(base, known))
    return graph


def _runtime_nodes(tree):
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            yield child
            stack.append(child)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle_through_a_package_init():
    graph = {"p": {"q", "q.r"}, "q": {"p"}, "q.r": set()}  # importing q.r runs q's __init__ first
    assert cycles(graph) == [["p", "q"]]
    assert cycles({"p": {"q"}, "q": set()}) == []


def test_tinyrl_has_no_import_cycle():
    found = cycles(import_graph())
    assert found == [], f"import cycles: {found}"


def test_no_module_is_over_500_lines():
    long = {str(f.relative_to(PACKAGE.parent)): n for f in PACKAGE.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these along a seam a reader would recognise: {long}"


def test_importing_the_config_loads_no_model_rollout_retriever_or_method_code():
    code = ("import sys, tinyrl.config\n"
            "bad = ('tinyrl.model', 'tinyrl.rollout', 'tinyrl.agents.retrieval', 'tinyrl.agents.environments', "
            "'tinyrl.trainer', 'tinyrl.methods.grpo', 'tinyrl.methods.sft', 'tinyrl.methods.common', "
            "'tinyrl.tasks.search_qa', 'tinyrl.rewards', 'transformers', 'peft', 'bm25s')\n"
            "print(sorted(m for m in bad if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_the_config_and_the_cli_load_no_torch_and_no_agents():
    for code in ("import tinyrl.config", "import tinyrl.cli",
                 "import sys; from tinyrl.cli import main; sys.argv = ['tinyrl', 'presets']\n"
                 "import contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()): main()"):
        mods = loaded_after(code)
        assert "torch" not in mods and not any(m == "tinyrl.agents" or m.startswith("tinyrl.agents.") for m in mods), code


def test_the_name_tables_are_the_registries_keys():
    """The config checks names against tinyrl.names (no torch); the algorithm's tables must have the same keys."""
    from tinyrl import names
    from tinyrl.agents.formats import SearchR1Format
    from tinyrl.algo.advantages import ESTIMATORS
    from tinyrl.algo.losses import AGGREGATIONS

    assert tuple(ESTIMATORS) == names.ESTIMATORS and tuple(AGGREGATIONS) == names.AGGREGATIONS
    assert names.TOKEN_REWARD_ESTIMATORS <= set(names.ESTIMATORS)
    assert names.FORMATS["search_r1"] is SearchR1Format and callable(names.TOOLS["search"])


def test_every_subpackage_ships_in_the_wheel():
    """`pip install .` (the README's first command) installs only the packages pyproject.toml lists."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")
             if "assets" not in p.parts}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
