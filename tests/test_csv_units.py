"""Issue 24.7: a CSV request log states its time unit (seconds by default; ``--time-unit``,
the API's and the import page's ``time_unit``: s, ms or us), and implausible values are
refused naming the row: TTFT or E2E over one hour, time per output token over 10 s,
timestamps going backwards. Expected figures are SPEC worked example B's, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.cli.main import main
from app.importers.csv_log import ImportFormatError, parse_csv_log
from app.services.file_imports import import_text
from app.services.runs import open_database, run_report
from tests.api_support import api_client

HEADER = "request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens\n"
# SPEC worked example B (seconds): TTFT 420, 560, 480 ms; window 4.36 s; 240 tokens
ROWS_S = [("r1", 0.00, 0.42, 3.10, 1024, 80), ("r2", 0.15, 0.71, 4.36, 4096, 96),
          ("r3", 0.40, 0.88, 2.92, 512, 64)]  # fmt: skip


def example_b(scale: float) -> str:
    """Example B with its times multiplied by ``scale`` (1000: milliseconds)."""
    lines = [
        f"{rid},{start * scale:.6f},{first * scale:.6f},{end * scale:.6f},{n_in},{n_out}"
        for rid, start, first, end, n_in, n_out in ROWS_S
    ]
    return HEADER + "\n".join(lines) + "\n"


@pytest.mark.parametrize(("unit", "scale"), [("s", 1.0), ("ms", 1e3), ("us", 1e6)])
def test_the_same_log_in_each_unit_reads_the_same(unit: str, scale: float) -> None:
    log = parse_csv_log(example_b(scale), time_unit=unit)
    ttft_ms = [(r.event_t_ns[0] - r.sent_ns) / 1e6 for r in log.records]  # type: ignore[operator]
    assert ttft_ms == pytest.approx([420.0, 560.0, 480.0], abs=1e-6)
    assert [r.end_ns for r in log.records] == [3_100_000_000, 4_360_000_000, 2_920_000_000]
    assert log.time_unit == unit and log.origin_s == pytest.approx(0.0)


def test_milliseconds_read_as_seconds_are_refused_naming_the_row() -> None:
    """Example B in ms read as seconds: r1's time per output token would be
    (3100 - 420) / 79 = 33.92 s, over the 10 s bound."""
    with pytest.raises(ImportFormatError) as e:
        parse_csv_log(example_b(1e3))
    msg = str(e.value)
    assert msg.startswith("row 1 (r1):") and "33.92 s" in msg and "10 s" in msg
    assert "time unit" in msg and "ms" in msg


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        # TTFT 3700 s > 3600 s (one token: no TPOT)
        ("r4,10,3710,3710,5,1", "row 4 (r4): TTFT (first_token_ts - start_ts) is 3700 s"),
        # E2E 4000 s > 3600 s; TPOT (4000 - 1) / 999 = 4.0 s is plausible
        ("r4,10,11,4010,5,1000", "row 4 (r4): E2E (end_ts - start_ts) is 4000 s"),
        # timestamps going backwards
        ("r4,10,9,12,5,3", "row 4 (r4): first_token_ts < start_ts"),
        ("r4,10,11,10.5,5,3", "row 4 (r4): end_ts < first_token_ts"),
    ],
)
def test_implausible_rows_are_refused(row: str, needle: str) -> None:
    with pytest.raises(ImportFormatError) as e:
        parse_csv_log(example_b(1.0) + row + "\n")
    assert needle in str(e.value)


def test_the_bounds_scale_with_the_unit() -> None:
    # 3,599,000 ms = 3599 s: within the hour; 3,601,000 ms is not
    ok = HEADER + "a,0,3599000,3599000,5,1\n"
    assert parse_csv_log(ok, time_unit="ms").records[0].end_ns == 3_599_000_000_000
    with pytest.raises(ImportFormatError, match=r"row 1 \(a\): TTFT .* 3601000 ms \(3601 s\)"):
        parse_csv_log(HEADER + "a,0,3601000,3601000,5,1\n", time_unit="ms")
    with pytest.raises(ImportFormatError, match="time_unit: choose from s, ms, us"):
        parse_csv_log(ok, time_unit="h")


def _report_of(db: str, run_id: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["report", run_id, "--json", "--database-url", db]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_cli_time_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'u.db'}"
    f = tmp_path / "ms.csv"
    f.write_text(example_b(1e3))
    assert main(["import", "csv", str(f), "--database-url", db]) == 2
    err = capsys.readouterr().err.strip()
    assert "row 1 (r1)" in err and "--time-unit" in err and len(err.splitlines()) == 1
    assert main(["import", "csv", str(f), "--time-unit", "ms", "--json", "--database-url", db]) == 0
    (run_id,) = json.loads(capsys.readouterr().out)["runs"]
    rep = _report_of(db, run_id, capsys)
    m = rep["metrics"]
    assert isinstance(m, dict)
    # by hand: TTFT 420, 560, 480 ms -> p50 480, p95 480 + 0.9 x 80 = 552
    assert m["ttft_ms"]["p50"] == pytest.approx(480.0)
    assert m["ttft_ms"]["p95"] == pytest.approx(552.0)
    assert m["window"]["duration_s"] == pytest.approx(4.36)
    assert round(m["output_throughput_tok_s"], 2) == 55.05  # 240 / 4.36
    tpot = [(3.10 - 0.42) / 79, (4.36 - 0.71) / 95, (2.92 - 0.88) / 63]
    assert m["tpot_ms"]["mean"] == pytest.approx(float(np.mean(tpot)) * 1000)
    notes = rep["validity"]["notes"]  # type: ignore[index]
    assert any("times read in milliseconds" in n for n in notes)
    # the option is for CSV logs only
    v = tmp_path / "v.json"
    v.write_text("{}")
    assert main(["import", "vllm", str(v), "--time-unit", "ms", "--database-url", db]) == 2
    assert "--time-unit" in capsys.readouterr().err


def test_api_and_page_time_unit(db_url: str) -> None:
    with api_client(db_url) as api:
        files = {"file": ("ms.csv", example_b(1e3).encode())}

        def post(**data: str) -> object:
            return api.client.post(
                "/api/v1/imports", data=data, files=files, headers=api.h(api.run)
            )

        r = post(format="csv")
        assert r.status_code == 422 and "row 1 (r1)" in r.text  # type: ignore[attr-defined]
        r = post(format="csv", time_unit="h")
        assert r.status_code == 422 and "time_unit" in r.text  # type: ignore[attr-defined]
        r = post(format="aiperf", time_unit="ms")
        assert r.status_code == 422 and "time_unit" in r.text  # type: ignore[attr-defined]
        r = post(format="csv", time_unit="ms")
        assert r.status_code == 201, r.text  # type: ignore[attr-defined]
        (run_id,) = r.json()["runs"]  # type: ignore[attr-defined]
        rep = run_report(api.sessions, run_id)
        assert rep["metrics"]["ttft_ms"]["p50"] == pytest.approx(480.0)
        page = api.client.get("/import").text
        assert 'name="time_unit"' in page and 'value="ms"' in page


def test_service_default_is_seconds(sqlite_url: str) -> None:
    sessions = open_database(sqlite_url)
    (run_id,) = import_text(sessions, "csv", example_b(1.0), file_name="s.csv")
    rep = run_report(sessions, run_id)
    assert rep["metrics"]["ttft_ms"]["p50"] == pytest.approx(480.0)
    assert any("times read in seconds" in n for n in rep["validity"]["notes"])
