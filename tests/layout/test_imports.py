"""The house's rules: no import cycles between modules, folders or cluster/'s rooms, and no torch in
a router process."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("replica", "tenancy", "cluster", "loadtest", "bench", "fairlane")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports, at top level or inside a function."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
        graph.setdefault(name, set())
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def collapsed(graph: dict[str, set[str]], key) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for src, targets in graph.items():
        out[key(src)] |= {key(t) for t in targets if key(t) != key(src)}
    return out


def package_package(name: str) -> str:
    """Packages never import each other's package __init__ lazily to dodge a cycle: the top folder."""
    return name.split(".")[0]


def cluster_room(name: str) -> str:
    parts = name.split(".")
    if parts[0] != "cluster":
        return parts[0]
    return "cluster." + parts[1] if len(parts) > 2 else name  # a room, or a top-level cluster module


def test_no_module_cycles():
    assert find_cycle(project_imports()) is None


def test_no_cycles_between_folders():
    assert find_cycle(collapsed(project_imports(), package_package)) is None


def test_no_cycles_between_cluster_rooms():
    assert find_cycle(collapsed(project_imports(), cluster_room)) is None


def test_the_engine_imports_no_serving_code():
    engine = {t for src, targets in project_imports().items() if src.startswith("replica") for t in targets}
    assert all(t.startswith("replica") for t in engine), sorted(engine)


def test_the_router_app_loads_no_torch():
    """The router process imports cluster.app (Serve builds both deployments from it) and tokenizes,
    but needs no torch: a router that loads it carries ~400 MB it never uses."""
    code = (
        "import sys, cluster.app\n"
        "from cluster.text.prompts import PromptEncoder\n"
        "enc = PromptEncoder.for_model('smollm2-135m', random_weights=False)\n"
        "assert enc.chat([{'role': 'user', 'content': 'Hi'}])\n"
        "assert enc.completion('Hello there')\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'replica.engine') if m in sys.modules)\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
