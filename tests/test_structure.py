"""The shape of the house: the wings stand in order (no module imports one of a higher wing, nor of a sibling),
no module imports another that imports it back (lazy imports in functions count), the seam to mlx-lm imports
nothing of ours but the error type, and no file grows past ~500 lines, nor a line past 120 characters."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"mlx_spec": ROOT / "mlx_spec", "mlx_spec.tui": ROOT / "tui"}  # tui/ installs as mlx_spec.tui
MAX_LINES = 500
MAX_WIDTH = 120  # characters a line
sys.path.insert(0, str(ROOT / "scripts"))
from architecture import FLOORS  # noqa: E402  (the wings, lowest floor first; a floor's wings in a tuple)


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that `name` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found |= {t for t in [target, *(f"{target}.{a.name}" for a in node.names)] if t in known}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
    return found - {name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        path.pop()
        return None

    return next((found for node in sorted(edges) if node not in state and (found := visit(node))), None)


def test_the_checker_sees_a_cycle_and_the_package_graph():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    edges = graph()
    assert "mlx_spec.core.events" in edges["mlx_spec.decode.batched"]
    assert "mlx_spec.decode.batched" in edges["mlx_spec.decode.engine"]


def wing(module: str) -> str | None:
    """A module's wing (None: the package's face, `mlx_spec` itself)."""
    return module.split(".")[1] if "." in module else None


def floor(name: str) -> int:
    return next(i for i, f in enumerate(FLOORS) if name == f or isinstance(f, tuple) and name in f)


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that reach a higher wing or a sibling on the same floor."""
    return sorted((a, b) for a, targets in edges.items() for b in targets
                  if wing(a) and wing(b) and wing(a) != wing(b) and floor(wing(b)) >= floor(wing(a)))


def test_the_wings_stand_in_order():
    edges = graph()
    assert {wing(m) for m in edges} - {None} == {w for f in FLOORS for w in ([f] if isinstance(f, str) else f)}
    assert upward({"mlx_spec.core.a": {"mlx_spec.seams.b"}, "mlx_spec.seams.b": {"mlx_spec.core.a"},
                   "mlx_spec.serve.c": {"mlx_spec.train.d", "mlx_spec.decode.e"}}) == [
        ("mlx_spec.seams.b", "mlx_spec.core.a"), ("mlx_spec.serve.c", "mlx_spec.train.d")]
    assert upward(edges) == []


def test_the_wings_have_empty_faces():
    """A wing's `__init__.py` holds nothing: importing one never loads what its modules load (MLX above all)."""
    faces = [ROOT / "mlx_spec" / (f if isinstance(f, str) else w) / "__init__.py"
             for f in FLOORS for w in ([f] if isinstance(f, str) else f)]
    assert [p for p in faces if p.exists() and p.read_text().strip()] == []


def test_no_module_imports_itself_back():
    assert cycle(graph()) is None


def test_the_mlx_lm_seam_stands_on_the_ground():
    """compat.py, and layout.py (where mlx-lm's models keep their parts), which it reads."""
    assert graph()["mlx_spec.seams.compat"] <= {"mlx_spec.seams.errors", "mlx_spec.seams.layout"}
    assert graph()["mlx_spec.seams.layout"] <= {"mlx_spec.seams.errors"}


def test_no_file_grows_past_the_limit():
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert len(lines) > 40 and not {name: n for name, n in lines.items() if n > MAX_LINES}


def test_no_line_is_packed_past_the_width():
    wide = [f"{name}:{i}" for name, path in modules().items()
            for i, line in enumerate(path.read_text().splitlines(), 1) if len(line) > MAX_WIDTH]
    assert not wide


def probes(path: Path) -> list[str]:
    """The getattr / hasattr calls in a file whose object is a drafter or a policy."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") and node.args:
            subject = ast.unparse(node.args[0])
            if "drafter" in subject or "policy" in subject or subject == "chosen":
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_drafters_and_policies_are_asked_not_probed(tmp_path):
    """What a drafter or a policy may do is declared on its base class (drafters/protocol.py Drafter, policy/
    interface.py DraftPolicy): callers ask it, they never probe it."""
    probe = tmp_path / "probe.py"
    probe.write_text("getattr(self.drafter, 'outlook', None)\nhasattr(policy, 'cut')\ngetattr(args, 'kind')\n")
    assert len(probes(probe)) == 2
    assert [found for path in modules().values() for found in probes(path)] == []


def test_the_table_of_drafters_names_every_drafter_module_and_its_kinds():
    """Every drafter module is in the one table (drafters/kinds.py) and declares its kinds; every drafter class
    stands on the protocol's base."""
    import importlib

    from mlx_spec.drafters.kinds import DRAFTERS
    from mlx_spec.drafters.protocol import Drafter, Kind

    listed = {module for kind in DRAFTERS.values() for module in kind.modules}
    folder = ROOT / "mlx_spec" / "drafters"
    assert listed == {p.stem for p in folder.glob("*.py")} - {"__init__", "kinds", "protocol"}
    for name in sorted(listed):
        module = importlib.import_module(f"mlx_spec.drafters.{name}")
        assert module.KINDS and all(isinstance(kind, Kind) for kind in module.KINDS), name
        classes = [value for value in vars(module).values() if isinstance(value, type)
                   and value.__module__ == module.__name__ and value.__name__.endswith("Drafter")]
        assert classes and all(issubclass(c, Drafter) for c in classes), name


def test_the_packaged_table_of_models_is_the_one_at_the_root():
    """models.toml lives once, at the root (the product card's layout); the package reads it through a link, so an
    edit that replaces the link with a copy (as `sed -i` does) would let the two drift apart."""
    packaged = ROOT / "mlx_spec" / "models.toml"
    assert packaged.is_symlink() and packaged.resolve() == (ROOT / "models.toml").resolve()


def test_every_mutant_applies_and_its_tests_exist():
    """scripts/mutants.py (run by CI after the suite) still fits the code: each deliberate bug's line occurs once,
    and pytest finds each test named to catch it (a renamed or re-parametrized test would leave it unchecked)."""
    import mutants
    assert [m.what for m in mutants.MUTANTS if not mutants.applies(m)] == []
    assert mutants.missing_tests(mutants.MUTANTS) == []
