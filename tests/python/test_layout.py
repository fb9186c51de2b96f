"""The layout of csrc/guard is part of the architecture (docs/architecture.md, "Layout"):
these checks read the sources, so a change that breaks a rule fails here with the file named."""
from __future__ import annotations

import ast
import pathlib
import re

GUARD = pathlib.Path(__file__).resolve().parents[2] / "csrc" / "guard"
INCLUDE = re.compile(r'^#include "guard/([^"]+)"', re.M)


def _sources(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in (".h", ".cpp"))


# The stack, bottom first (docs/architecture.md, "Layout"): a file includes only
# its own layer and the layers below it. "root" is csrc/guard's own files.
STACK = ["report", "root", "device", "store", "collective", "modes", "watchdog", "backend"]


def _layer(path: pathlib.Path) -> str:
    rel = path.relative_to(GUARD)
    return rel.parts[0] if len(rel.parts) > 1 else "root"


def _includes() -> list[tuple[pathlib.Path, pathlib.Path]]:
    return [(src, GUARD / inc) for src in _sources(GUARD) for inc in INCLUDE.findall(src.read_text())]


def test_the_layers_exist_and_hold_every_source():
    layers = {p.name for p in GUARD.iterdir() if p.is_dir()}
    assert layers == set(STACK) - {"root"}, layers
    at_root = {p.stem for p in GUARD.iterdir() if p.is_file()}
    assert at_root == {"Clock", "Config", "Errands", "Errors", "Runtime", "TorchCompat"}, at_root


def test_no_include_points_up_the_stack():
    offenders = []
    for src, inc in _includes():
        assert inc.exists(), f"{src.relative_to(GUARD)} includes a missing guard/{inc.relative_to(GUARD)}"
        if STACK.index(_layer(inc)) > STACK.index(_layer(src)):
            offenders.append(f"{src.relative_to(GUARD)} ({_layer(src)}) includes guard/{inc.relative_to(GUARD)} "
                             f"({_layer(inc)}, above it)")
    assert not offenders, "\n".join(offenders)


def test_the_device_layer_includes_only_itself_and_the_root():
    # device/ (the stream gate) knows words, streams and tensors, not groups,
    # verifiers or the watchdog; nor the report layer's analysis.
    offenders = [f"{src.relative_to(GUARD)} includes guard/{inc.relative_to(GUARD)}" for src, inc in _includes()
                 if _layer(src) == "device" and _layer(inc) not in ("device", "root")]
    assert not offenders, "\n".join(offenders)


def test_the_include_graph_of_the_files_has_no_circle():
    # Within a layer too: two files that include each other (directly or
    # through others) are one concept in two files, or a missing interface.
    graph: dict[pathlib.Path, set[pathlib.Path]] = {}
    for src, inc in _includes():
        a, b = src.with_suffix(""), inc.with_suffix("")
        if a != b:
            graph.setdefault(a, set()).add(b)
    done: set[pathlib.Path] = set()
    path: list[pathlib.Path] = []

    def visit(node: pathlib.Path) -> None:
        if node in path:
            loop = path[path.index(node):] + [node]
            raise AssertionError("an include circle: " + " -> ".join(str(p.relative_to(GUARD)) for p in loop))
        if node in done:
            return
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_no_source_is_longer_than_800_lines():
    long = {str(p.relative_to(GUARD.parent)): n for p in _sources(GUARD.parent)
            if (n := len(p.read_text().splitlines())) > 800}
    assert not long, f"split these by concept: {long}"


# A function definition at the top level of a file (clang-format's layout): a line at column 0
# that is not a declaration of something else, up to its closing "}" at column 0.
_NOT_A_FUNCTION = re.compile(r"^(namespace|struct|class|enum|union|using|template|extern|static_assert|#|//|\}|$)")


def _long_functions(path: pathlib.Path, limit: int = 80) -> list[tuple[int, int, str]]:
    """(line, length, first line) of each function of ``path`` over ``limit`` lines without a
    ``// Long:`` comment (its reason) in the four lines above it."""
    # Raw string literals are data (GateKernel.h's PTX text): blank them, keeping the line count.
    text = re.sub(r'R"(\w*)\((.*?)\)\1"', lambda m: "\n" * m.group(0).count("\n"), path.read_text(), flags=re.S)
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i][:1].isspace() or _NOT_A_FUNCTION.match(lines[i]) or "(" not in lines[i]:
            i += 1
            continue
        head = i
        while i < len(lines) and not lines[i].rstrip().endswith("{") and not lines[i].rstrip().endswith(";"):
            i += 1
        if i >= len(lines) or lines[i].rstrip().endswith(";") or re.search(r"=\s*\{$", lines[i]):
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("}"):
            end += 1
        n = end - head + 1
        if n > limit and not any(line.startswith("// Long:") for line in lines[max(0, head - 4):head]):
            out.append((head + 1, n, lines[head]))
        i = end + 1
    return out


def test_no_function_is_over_80_lines_without_its_reason():
    long = {f"{p.relative_to(GUARD.parent)}:{line}": f"{n} lines: {text}" for p in _sources(GUARD.parent)
            for line, n, text in _long_functions(p)}
    assert not long, f"split these, or say why not in a '// Long:' comment just above: {long}"


def test_the_long_function_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"  x += {i};" for i in range(85))
    src = tmp_path / "a.cpp"
    src.write_text(f"namespace t {{\n\nint f(int x,\n      int y) {{\n{body}\n  return x;\n}}\n\n}}\n")
    assert [n for _, n, _ in _long_functions(src)] == [89]
    src.write_text(f"// Long: a table.\nint f(int x) {{\n{body}\n  return x;\n}}\n")
    assert _long_functions(src) == []


def _function_length(src: pathlib.Path, signature: str) -> int:
    """Lines from the line that holds `signature` to the function's closing brace."""
    lines = src.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if signature in line)
    end = next(i for i in range(head, len(lines)) if lines[i].startswith("}"))
    return end - head + 1


def test_every_operation_takes_one_pipeline_that_reads_in_a_screen():
    # GuardBackend::issue is the path of every operation: record, checks before, the inner
    # call (or the route the checks chose), checks after, the work handed out. What a mode
    # does at each step is CollectiveChecks' (issue 56: 110 lines before, ~40 asked).
    n = _function_length(GUARD / "backend" / "GuardBackend.cpp", "GuardBackend::issue(")
    assert n <= 45, f"GuardBackend::issue is {n} lines: move a step into CollectiveChecks or a helper"


def test_the_pipeline_length_check_sees_a_long_issue(tmp_path):
    src = tmp_path / "a.cpp"
    body = "\n".join(f"  x += {i};" for i in range(50))
    src.write_text(f"int GuardBackend::issue(int x) {{\n{body}\n  return x;\n}}\n")
    assert _function_length(src, "GuardBackend::issue(") == 53


# Where a thread may be let go unjoined, and why: each is stuck, or may be, somewhere that must
# not hold the process (a frozen store, a dying process, a stuck watchdog at exit), or is the
# thread that drops its own owner. A one-off background task is an Errand (guard/Errands.h):
# named, owned, joined at exit.
DETACH_ALLOWED = {
    "store/StoreChannel.cpp": "a call blocked in a frozen store owns the channel",
    "watchdog/TerminateHandler.cpp": "the dying process's last words, bounded by the process's end",
    "watchdog/WatchdogExit.cpp": "the watchdog thread stuck at exit",
    "watchdog/LauncherStop.cpp": "waits for the launcher's SIGTERM all the process's life, then ends it",
    "modes/verify/Verifier.cpp": "the pacer holding the verifier's last reference cannot join itself",
}


def test_no_one_off_thread_is_detached():
    users = {str(src.relative_to(GUARD)) for src in _sources(GUARD) if ".detach()" in src.read_text()}
    assert users <= set(DETACH_ALLOWED), f"run it as an errand (guard/Errands.h): {sorted(users - set(DETACH_ALLOWED))}"


def test_store_keys_are_spelled_only_in_store_keys_h():
    key = re.compile(r'"(guard|st|alert|once|snap|report|strict|p2p)/|"alerts"')
    offenders = []
    for src in _sources(GUARD):
        if src.name == "StoreKeys.h":
            continue
        for n, line in enumerate(src.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if key.search(code) and not code.lstrip().startswith("#include"):
                offenders.append(f"{src.relative_to(GUARD)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_groups_fail_in_one_place():
    # Whatever finds that a group cannot go on hands a GroupFailure to
    # IncidentSink::failGroup: the watchdog files it at its desk (FailureDesk.cpp), and a
    # detached group's sink fails it (in GroupState.cpp); GroupState::fail is called nowhere else.
    call = re.compile(r"(\.|->)fail\(")
    callers = {str(src.relative_to(GUARD)) for src in _sources(GUARD) if call.search(src.read_text())}
    assert callers == {"watchdog/FailureDesk.cpp", "collective/GroupState.cpp"}, callers


def test_differences_are_handed_as_values_and_rendered_at_the_desk():
    # A check mode hands a Difference (report/Difference.h) to the desk, which renders it:
    # renderDifference is called by the desk (and a detached group's sink) only, and the
    # collective renderer underneath it only inside report/ (the watchdog's own analysis).
    render = re.compile(r"\brenderDifference\(")
    callers = {str(src.relative_to(GUARD)) for src in _sources(GUARD) if render.search(src.read_text())}
    assert callers == {"watchdog/FailureDesk.cpp", "collective/GroupState.cpp", "report/Difference.cpp",
                       "report/Difference.h"}, callers
    collective = re.compile(r"\bdifferenceVerdict\(")
    outside = {str(src.relative_to(GUARD)) for src in _sources(GUARD)
               if collective.search(src.read_text()) and src.relative_to(GUARD).parts[0] != "report"}
    assert not outside, outside


def test_the_check_mode_is_decided_in_one_file():
    # Which object does a group's `check` is the registry's answer (modes/Modes.cpp, one line
    # per mode); everything else asks the group's mode (collective/Mode.h), never which it is
    # (Config parses and names the modes).
    mode = re.compile(r"CheckMode::(Off|Async|Verify|Strict)")
    users = {str(src.relative_to(GUARD)) for src in _sources(GUARD) if mode.search(src.read_text())}
    assert users == {"Config.h", "modes/Modes.cpp"}, users


MODES = GUARD / "modes"


def _mode_of(path: pathlib.Path) -> str | None:
    """The mode whose folder holds `path` (None outside csrc/guard/modes/<mode>/)."""
    rel = path.relative_to(GUARD).parts
    return rel[1] if rel[0] == "modes" and len(rel) > 2 else None


def test_each_mode_lives_in_its_folder_and_nothing_else_reaches_into_it():
    # The change stories of issue 67: adding a mode, or changing how verify gates a release,
    # touches that mode's folder and the registry's line. So a mode's files are included only
    # by its own folder and the registry, and no mode includes another's; the Python bindings
    # and the C++ tests read a mode through collective/Mode.h too (tests of a mode's own
    # mechanism, e.g. the verifier's pacing, are that mode's and may include it).
    folders = {p.name for p in MODES.iterdir() if p.is_dir()}
    assert folders == {"off", "async", "strict", "verify"}, folders
    offenders = []
    for src, inc in _includes() + [(src, GUARD / inc) for src in _sources(GUARD.parent / "python")
                                   for inc in INCLUDE.findall(src.read_text())]:
        if not inc.is_relative_to(MODES) or _mode_of(inc) is None:
            continue
        if src.is_relative_to(GUARD) and (_mode_of(src) == _mode_of(inc) or src == MODES / "Modes.cpp"):
            continue
        offenders.append(f"{src.relative_to(GUARD.parent)} includes guard/{inc.relative_to(GUARD)}")
    assert not offenders, offenders


def test_nothing_outside_a_mode_names_its_verifier_or_its_mechanisms():
    # Outside modes/, a group's mode is asked what it does (Mode.h), never whether it has a
    # verifier, a pairing, a deferred receive or a split audit.
    names = re.compile(r"\b(Verifier|P2PPairing|DeferredReceives|InBandCheck|(Strict|Verify|Async|Off)Mode)\b")
    code = re.compile(r"//.*$|/\*.*?\*/", re.M | re.S)
    sources = _sources(GUARD) + _sources(GUARD.parent / "python")
    offenders = sorted(str(src.relative_to(GUARD.parent)) for src in sources
                       if not src.is_relative_to(MODES) and names.search(code.sub("", src.read_text())))
    assert not offenders, offenders


def test_a_mode_is_registered_by_one_line():
    registry = (MODES / "Modes.cpp").read_text()
    lines = re.findall(r"^\s*\{CheckMode::(\w+), &(\w+)Mode::make\},$", registry, re.M)
    assert sorted(lines) == sorted([("Off", "Off"), ("Async", "Async"), ("Strict", "Strict"), ("Verify", "Verify")])


def test_ops_and_states_are_compared_as_enums_not_strings():
    cmp = re.compile(r'\b(state|op|kind|phase|subject)\s*[!=]=\s*"')
    offenders = []
    for src in _sources(GUARD):
        for n, line in enumerate(src.read_text().splitlines(), 1):
            if cmp.search(line):
                offenders.append(f"{src.relative_to(GUARD)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# --- torch_ext/ -----------------------------------------------------------------

PACKAGE = GUARD.parents[1] / "torch_ext"


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for type checkers, never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imports(name: str, path: pathlib.Path, mods: dict[str, pathlib.Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere: at module level and inside functions
    (an import in a function is a dependency as much as one at the top), not for type checkers."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    out = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = package.split(".")[: len(package.split(".")) - n.level + 1]
                base = ".".join(up + ([n.module] if n.module else []))
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in n.names)
    return {m for m in out if m in mods and m != name}


def _import_graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if (loop := visit(nxt)) is not None:
                return loop
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if (loop := visit(node)) is not None:
            return loop
    return None


def test_the_package_imports_have_no_circle():
    # Imports inside functions count: `backend` importing `_ddp` in a function while `_ddp`
    # imports `backend` is a circle that only the order of calls keeps from failing.
    loop = _circle(_import_graph())
    assert loop is None, "an import circle: " + " -> ".join(loop)


def test_the_circle_check_sees_a_circle_inside_a_function(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    mods = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    assert _circle(graph) == ["a", "b", "a"]


# The tools on top of the package: the face (torch_ext and its other modules) imports none of them.
TOOLS = ("torch_ext.testing", "torch_ext.diagnose", "torch_ext.lightning")
# Except: torch_ext.live_report() is the live diagnose tool's report, asked from a job.
FACE_USES_TOOL = {("torch_ext.backend", "torch_ext.diagnose.live")}


def test_the_package_face_imports_no_tool():
    # The test backend (nccl_sim) in particular: a guard group imports it by its entry point
    # (pyproject.toml, "torch_ext.inner_backends"), as any other package's backend.
    graph = _import_graph()
    face = [m for m in graph if not m.startswith(TOOLS)]
    offenders = [f"{m} imports {d}" for m in sorted(face) for d in sorted(graph[m])
                 if d.startswith(TOOLS) and (m, d) not in FACE_USES_TOOL]
    assert not offenders, "\n".join(offenders)


def test_the_compiled_core_is_taken_from_one_module():
    # torch_ext._core loads _C once (torch_ext._extension checks it against the running torch).
    offenders = [str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                 if re.search(r"^\s*from torch_ext import (.*\b)?_C\b", p.read_text(), re.M)]
    assert not offenders, offenders
