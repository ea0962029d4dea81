"""A metric's key is written in one place, its module in ``app/analysis/metric_defs``: every
other module and template reads the registry (a view's loop, or the metric's object where a
rule means one metric). A key (or a name built on it: ``ttft_ms_p50``) written anywhere else
in ``app/``, ``templates/`` or ``static/`` fails here, naming the file and line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from app.analysis.metric_defs import METRICS

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "app" / "analysis" / "metric_defs"
# where a name equal to a metric key means something else: (file, name) -> what it is
PROBE_ROW = "a field of the batch-scaling probe's rows (its own measurement, not the run's)"
ALLOWED: dict[tuple[str, str], str] = {
    ("app/targets/sim_config.py", "ttft_ms"): "the simulator's SimConfig field (its TTFT)",
    ("app/targets/sim_config.py", "itl_ms"): "the simulator's SimConfig field (its ITL)",
    ("app/targets/simulator/answer.py", "ttft_ms"): "names SimConfig's ttft_ms in its docstring",
    ("app/probes/batch_scaling.py", "ttft_ms"): PROBE_ROW,
    ("app/probes/batch_scaling.py", "tpot_ms"): PROBE_ROW,
    ("app/cli/probe_cmd.py", "ttft_ms"): PROBE_ROW,
    ("app/cli/probe_cmd.py", "tpot_ms"): PROBE_ROW,
    ("app/figures/probes.py", "tpot_ms"): PROBE_ROW,
    ("app/services/probes.py", "tpot_ms"): PROBE_ROW + " (a run's TPOT p50 placed in one)",
    ("templates/probe.html", "ttft_ms"): PROBE_ROW,
    ("templates/probe.html", "tpot_ms"): PROBE_ROW,
}


def _keys() -> list[str]:
    return sorted(METRICS, key=len, reverse=True)


def _pattern() -> re.Pattern[str]:
    """A key as a whole word of an identifier-like name (``ttft_ms``, ``ttft_ms_p50``,
    ``sweep_ttft_ms``; not ``user_ttft_ms`` when looking for ``ttft_ms``: the longest key
    wins)."""
    keys = "|".join(re.escape(k) for k in _keys())
    word = "[A-Za-z0-9]"
    return re.compile(rf"(?<!{word})(?:{word}+_)*?({keys})(?:_{word}+)*(?!{word})")


def _python_hits(path: Path, pat: re.Pattern[str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in pat.finditer(node.value):
                hits.append((node.lineno, m.group(0)))
    return hits


def _text_hits(path: Path, pat: re.Pattern[str]) -> list[tuple[int, str]]:
    hits: list[tuple[int, str]] = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        for m in pat.finditer(line):
            hits.append((i, m.group(0)))
    return hits


def scan(root: Path = ROOT) -> list[str]:
    """Every metric key written outside the registry: ``path:line: name``."""
    pat = _pattern()
    found: list[str] = []
    files = [*root.glob("app/**/*.py"), *root.glob("templates/**/*.html")]
    files += [*root.glob("static/*.js")]
    for path in sorted(files):
        rel = path.relative_to(root).as_posix()
        if path.is_relative_to(REGISTRY):
            continue
        hits = _python_hits(path, pat) if path.suffix == ".py" else _text_hits(path, pat)
        found += [f"{rel}:{line}: {name}" for line, name in hits if (rel, name) not in ALLOWED]
    return found


def test_no_metric_key_is_written_outside_the_registry() -> None:
    assert scan() == []


def test_the_scan_finds_a_key_written_in_a_view(tmp_path: Path) -> None:
    """The scan can fail: a view module with a hand-written key list, a template reading a
    headline key, a docstring's example."""
    (tmp_path / "app" / "web").mkdir(parents=True)
    (tmp_path / "templates").mkdir()
    (tmp_path / "app" / "web" / "view.py").write_text(
        'KEYS = ("ttft_ms", "e2el_ms")\nx = {"user_ttft_ms": 1}\n'
    )
    (tmp_path / "templates" / "page.html").write_text("<td>{{ s.ttft_ms_p50 }}</td>\n")
    assert scan(tmp_path) == [
        "app/web/view.py:1: ttft_ms",
        "app/web/view.py:1: e2el_ms",
        "app/web/view.py:2: user_ttft_ms",
        "templates/page.html:1: ttft_ms_p50",
    ]


def test_every_allowed_name_is_still_there() -> None:
    """An exception that no longer matches anything goes (the list stays the truth)."""
    pat = _pattern()
    for rel, name in ALLOWED:
        path = ROOT / rel
        hits = _python_hits(path, pat) if path.suffix == ".py" else _text_hits(path, pat)
        assert name in {n for _, n in hits}, (rel, name)
