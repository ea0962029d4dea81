"""Which hardware a run used, and the decode weight-read floor it implies.

* ``worker_stamp``: the worker that ran a job (id, name, hostname, GPU names), recorded in
  the run's ``load_stats["worker"]`` when a job (or a sweep step) completes.
* ``hardware_of``: the comparability key's hardware field: the run annotation's device
  preset, else the datasheet preset matching the worker's first GPU, else the worker's GPU
  names; None when nothing is known (a CPU-only worker and no annotation).
* ``roofline_floor``: TPOT's weight-read floor (ms) from the run annotation's model and the
  device's memory bandwidth (the annotation's device preset, else a ``ceilings`` probe
  measured on the worker's GPU, else that GPU's datasheet preset).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from app.analysis import roofline as rl
from app.analysis.device_presets import device_preset, preset_for_device_name
from app.analysis.model_presets import ModelConfig, dtype_bytes
from app.protocol.wire import RunMeta, WorkerCapabilities
from app.storage import probes as probe_repo
from app.storage import repository as repo
from app.storage.models import Worker

log = logging.getLogger(__name__)

DEFAULT_DEVICE_TEXT = "this device"


def worker_stamp(session: Session, worker_id: str | None) -> dict[str, Any] | None:
    """What the run page and the comparability key need to know about a job's worker."""
    if not worker_id:
        return None
    w = session.get(Worker, worker_id)
    if w is None:
        return None
    try:
        caps = WorkerCapabilities.model_validate(w.capabilities)
        gpus = [g.name for g in caps.gpus]
    except ValueError:
        gpus = []
    return {"id": w.id, "name": w.name, "hostname": w.hostname, "gpus": gpus}


def stamp_meta(session: Session, worker_id: str | None, meta: RunMeta | None) -> None:
    """Put the worker's stamp in ``meta.load_stats["worker"]`` (stored with the run)."""
    stamp = worker_stamp(session, worker_id)
    if meta is not None and stamp is not None:
        meta.load_stats["worker"] = stamp


def stamp_run(session: Session, run_id: str, worker_id: str | None, meta: RunMeta | None) -> None:
    """``stamp_meta``, or with no ``RunMeta`` (nothing measured), straight into the run."""
    if meta is not None:
        stamp_meta(session, worker_id, meta)
        return
    stamp = worker_stamp(session, worker_id)
    run = repo.find_run(session, run_id)
    if stamp is not None and run is not None:
        repo.update_run(session, run_id, load_stats=dict(run.load_stats or {}) | {"worker": stamp})


def worker_gpus(load_stats: dict[str, Any] | None) -> list[str]:
    worker = (load_stats or {}).get("worker")
    gpus = worker.get("gpus") if isinstance(worker, dict) else None
    return [str(g) for g in gpus] if isinstance(gpus, list) else []


def hardware_of(load_stats: dict[str, Any] | None, annotation_device: str | None) -> str | None:
    """The hardware a run used, as compared between runs (see the module doc)."""
    if annotation_device:
        return annotation_device
    gpus = worker_gpus(load_stats)
    if not gpus:
        return None
    preset = preset_for_device_name(gpus[0])
    if preset is not None and all(preset_for_device_name(g) == preset for g in gpus):
        return f"{len(gpus)} x {preset.name}" if len(gpus) > 1 else preset.name
    return " + ".join(gpus)


def run_hardware(session: Session, run_id: str, load_stats: dict[str, Any] | None) -> str | None:
    ann = probe_repo.get_annotation(session, run_id)
    return hardware_of(load_stats, ann.device if ann is not None else None)


def _measured_bandwidth(session: Session, device_name: str) -> float | None:
    for p in probe_repo.list_probes(session, kind="ceilings", status="succeeded", limit=50):
        if (p.fingerprint or {}).get("device_name") != device_name:
            continue
        bw = ((p.result or {}).get("ceilings") or {}).get("bandwidth_bps")
        if isinstance(bw, int | float) and bw > 0:
            return float(bw)
    return None


def roofline_floor(
    session: Session, run_id: str, load_stats: dict[str, Any] | None
) -> tuple[float | None, str]:
    """(TPOT weight-read floor in ms or None, the device as the note names it)."""
    ann = probe_repo.get_annotation(session, run_id)
    if ann is None:
        return None, DEFAULT_DEVICE_TEXT
    try:
        model = ModelConfig.model_validate(ann.model)
        weight = dtype_bytes(str((ann.dtypes or {}).get("weight", "bf16")))
    except ValueError as e:
        log.warning("run %s: unusable annotation: %s", run_id, e)
        return None, DEFAULT_DEVICE_TEXT
    bandwidth: float | None = None
    label = DEFAULT_DEVICE_TEXT
    if ann.device:
        try:
            preset = device_preset(ann.device)
            bandwidth, label = preset.bandwidth_bps, preset.label
        except ValueError:
            pass
    gpus = worker_gpus(load_stats)
    if bandwidth is None and gpus:
        bandwidth = _measured_bandwidth(session, gpus[0])
        label = f"{gpus[0]} (measured)"
        if bandwidth is None:
            sheet = preset_for_device_name(gpus[0])
            if sheet is not None:
                bandwidth, label = sheet.bandwidth_bps, sheet.label
    if bandwidth is None:
        return None, DEFAULT_DEVICE_TEXT
    floor_s = rl.weight_read_floor_s(model, bandwidth, dtypes=rl.Dtypes(weight=weight))
    return floor_s * 1e3, label
