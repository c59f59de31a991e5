"""The repository keeps its promises: the README's commands are the ones CI runs, and code is lint-clean."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.helpers import IN_CI, ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(.+?)\n```", text, flags=re.S)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci, f".ci/run must run the README's test command verbatim: {test_command}"


def test_readme_run_command_installs_and_serves() -> None:
    run_command = readme_commands()[0]
    assert "pip install ." in run_command and "gpumon serve --simulate-if-no-gpu 8xH100-SXM" in run_command


@pytest.mark.parametrize("tool", [["ruff", "check", "."], ["mypy"]], ids=["ruff", "mypy"])
def test_lint_and_types_are_clean(tool: list[str]) -> None:
    exe = shutil.which(tool[0])
    if exe is None:
        if IN_CI:
            pytest.fail(f"{tool[0]} is part of the test extra and must be installed in CI")
        pytest.skip(f"{tool[0]} not installed")
    result = subprocess.run([exe, *tool[1:]], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def gpumon_modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__.py)."""
    mods = {}
    for path in (ROOT / "gpumon").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module → the gpumon modules it imports anywhere: at the top, inside functions, under TYPE_CHECKING.

    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module, else ``pkg`` itself.
    """
    mods = gpumon_modules()

    def owner(name: str) -> str | None:  # the module that defines ``name`` (a dotted path into the package)
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                found = owner(target) if target.startswith("gpumon") else None
                if found is not None and found != mod:
                    graph[mod].add(found)
    return graph


def test_no_module_of_gpumon_imports_itself_through_others() -> None:
    graph = import_graph()
    finished: set[str] = set()

    def visit(mod: str, path: list[str]) -> None:
        if mod in path:
            pytest.fail("import circle: " + " -> ".join([*path[path.index(mod) :], mod]))
        if mod in finished:
            return
        for imported in sorted(graph[mod]):
            visit(imported, [*path, mod])
        finished.add(mod)

    for mod in sorted(graph):
        visit(mod, [])


def test_import_graph_sees_imports_in_functions_and_under_type_checking() -> None:
    graph = import_graph()
    assert "gpumon.config.sim" in graph["gpumon.config.resolve"]  # a plain top-level import
    assert "gpumon.web.server" in graph["gpumon.cli.serve"]  # imported inside a function
    assert "gpumon.gpu.snapshot" in graph["gpumon.gpu.attribution.owners"]  # under TYPE_CHECKING


def test_no_folder_of_gpumon_holds_more_than_14_modules() -> None:
    crowded = {
        str(d.relative_to(ROOT)): n
        for d in [ROOT / "gpumon", *(ROOT / "gpumon").rglob("*/")]
        if d.name != "__pycache__" and (n := len(list(d.glob("*.py")))) > 14
    }
    assert not crowded, f"split these folders by concern: {crowded}"


def test_the_layout_names_folders_in_at_most_30_lines() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    layout = re.search(r"## Layout\n.*?```\n(.+?)\n```", text, flags=re.S)
    assert layout, "docs/design.md has a Layout section with the tree in a code block"
    lines = layout.group(1).splitlines()
    assert len(lines) <= 30, f"the layout is {len(lines)} lines"
    named = {m.group(1) for line in lines if (m := re.match(r"\s+(\w+)/\s", line))}
    folders = {d.name for d in (ROOT / "gpumon").iterdir() if d.is_dir() and (d / "__init__.py").exists()}
    assert folders <= named, f"the layout does not name {sorted(folders - named)}"


def test_the_examples_documented_commands_match_the_example() -> None:
    """docs/sdk.md follows the example with `gpumon diagnose --job NAME`: the name the example reports as."""
    example = (ROOT / "examples" / "train_tiny.py").read_text()
    (default,) = re.findall(r'add_argument\("--job", default="([^"]+)"\)', example)
    doc = (ROOT / "docs" / "sdk.md").read_text()
    assert re.findall(r"gpumon diagnose --job (\S+)", doc) == [default]
    assert "--index-url https://download.pytorch.org/whl/cpu" in doc  # the example's torch, without CUDA


def test_the_readme_indexes_every_doc_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    indexed = set(re.findall(r"^\| \[docs/([\w.-]+\.md)\]", text, flags=re.M))
    assert indexed == {p.name for p in (ROOT / "docs").glob("*.md")}
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):  # relative links and images
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"
    for doc in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def gpumon_names() -> set[str]:
    """The names a reader of the docs imports from gpumon's SDK: its public classes, and model.py's
    functions (preset)."""
    names = set()
    for path in (ROOT / "gpumon" / "client").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            function = path.name == "model.py" and isinstance(node, ast.FunctionDef)
            public = isinstance(node, ast.ClassDef) or function
            if public and not node.name.startswith("_"):  # type: ignore[union-attr]
                names.add(node.name)  # type: ignore[union-attr]
    return names


def test_every_python_example_in_the_docs_imports_the_gpumon_names_it_uses() -> None:
    """A reader copies one block: each gpumon name it uses is imported in it or in an earlier block of the
    same page (the page reads top to bottom)."""
    names = gpumon_names()
    assert {"Reporter", "preset", "ModelSpec"} <= names
    missing: list[str] = []
    parsed = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        imported: set[str] = set()
        for block in re.findall(r"```python\n(.+?)\n```", doc.read_text(), flags=re.S):
            tree = ast.parse(block)  # every block is Python a reader can paste
            parsed += 1
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpumon"):
                    imported |= {a.asname or a.name for a in node.names}
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            missing += [f"{doc.name}: {name}" for name in sorted((used & names) - imported)]
    assert parsed >= 5
    assert missing == [], f"python blocks use gpumon names they never import: {missing}"


@pytest.mark.slow  # a daemon with two simulated jobs, and the verdicts they need
def test_the_readme_quickstart_runs_as_written() -> None:
    """The quickstart's `gpumon serve ...` (on this driverless machine: the demo node) and its curl line give
    what the README shows: both jobs' MFU and verdicts, GPU 0 busy and GPU 6 serving a job."""
    import time

    from support.helpers import start_daemon

    first = readme_commands()[0]
    serve = first.split(" && gpumon ", 1)[1].split()
    assert serve[0] == "serve" and "--sim-job" in serve
    curl = next(c for c in readme_commands() if c.startswith("curl "))
    shown = re.search(r"```\n(gpumon_.+?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    assert shown is not None
    expected = [re.sub(r" \S+$", "", line) for line in shown.group(1).splitlines()]
    d = start_daemon(*serve[1:])
    try:
        # until the verdicts the README shows: in the first seconds a job's window is too short for one
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(
                curl.replace("localhost:9478", d.url.removeprefix("http://")),
                shell=True, capture_output=True, text=True, executable="/bin/bash",
            )  # fmt: skip
            lines = out.stdout.splitlines()
            if [re.sub(r" \S+$", "", line) for line in lines] == expected or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:
        d.stop()
    assert [re.sub(r" \S+$", "", line) for line in lines] == expected, out.stdout + out.stderr
    values = {re.sub(r" \S+$", "", line): float(line.rsplit(" ", 1)[1]) for line in lines}
    # llama-70b at its name's MFU; finetune, 45 % waiting on data, capped below its tensor cores' activity
    assert values[expected[0]] > 0.5 and 0.1 < values[expected[4]] < 0.3 and 0.3 < values[expected[5]] < 0.5
    assert values[expected[6]] == values[expected[7]] == 1.0  # finetune input-bound, llama-70b compute-bound
