"""The worker's on-disk spool: result batches survive a lost connection or a worker restart.

Layout under the worker's state directory::

    jobs/<job_id>-a<attempt>/job.json          the LeasedJob (lease id, run id, ...)
    jobs/<job_id>-a<attempt>/batch-000007.json a ResultBatch written but not yet acknowledged
    jobs/<job_id>-a<attempt>/complete.json     the CompleteRequest, once the load has ended
    kept/<job_id>-a<attempt>/                  a job's spool the server will not take (a
                                               refused batch, a lost lease): never re-sent
                                               by itself, never deleted; kept.json says why

Every file is written atomically (temporary file, fsync, rename, fsync of the directory)
before it is sent, and a batch file is deleted once the server acknowledged it. What is left
after a crash is exactly what the server may not have: a new worker re-sends it (the server
deduplicates by (job, batch_no), so a batch that did arrive is acknowledged as a duplicate).
A batch is only ever deleted once acknowledged: a spool whose batches the server refused, or
whose lease was lost before they were sent, moves to ``kept/`` (``JobSpool.keep``), from
where ``tokentrace recover`` stores them into their run (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import IO

import platformdirs
from pydantic import BaseModel, ValidationError

from app.protocol.wire import CompleteRequest, LeasedJob, ResultBatch

BATCH_PREFIX = "batch-"
KEPT_DIR = "kept"
KEPT_NOTE = "kept.json"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; the file is readable by its owner only."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _dump(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


class JobSpool:
    """The spool of one leased job attempt."""

    def __init__(self, path: Path, job: LeasedJob) -> None:
        self.path = path
        self.job = job

    def _batch_path(self, batch_no: int) -> Path:
        return self.path / f"{BATCH_PREFIX}{batch_no:06d}.json"

    def write(self, batch: ResultBatch) -> bytes:
        """Spool ``batch`` durably; returns its JSON (the body to send)."""
        data = _dump(batch)
        atomic_write(self._batch_path(batch.batch_no), data)
        return data

    def read(self, batch_no: int) -> bytes | None:
        """The spooled JSON of batch ``batch_no``, or None when it is not (or no longer) here."""
        try:
            return self._batch_path(batch_no).read_bytes()
        except FileNotFoundError:
            return None

    def ack(self, batch_no: int) -> None:
        self._batch_path(batch_no).unlink(missing_ok=True)

    def pending(self) -> list[int]:
        """Batch numbers written but not acknowledged, ascending."""
        nos: list[int] = []
        for p in self.path.glob(f"{BATCH_PREFIX}*.json"):
            with contextlib.suppress(ValueError):
                nos.append(int(p.stem.removeprefix(BATCH_PREFIX)))
        return sorted(nos)

    def write_complete(self, req: CompleteRequest) -> None:
        atomic_write(self.path / "complete.json", _dump(req))

    def read_complete(self) -> CompleteRequest | None:
        try:
            return CompleteRequest.model_validate_json((self.path / "complete.json").read_bytes())
        except (FileNotFoundError, ValidationError, ValueError):
            return None

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def kept_path(self) -> Path:
        """Where ``keep`` moves this spool (``<state>/kept/<job>-a<attempt>``)."""
        if self.path.parent.name == KEPT_DIR:
            return self.path
        return self.path.parent.parent / KEPT_DIR / self.path.name

    def keep(self, reason: str) -> Path:
        """Move this spool to ``kept/`` with ``kept.json`` (why, which batches): its batches
        are never re-sent by themselves nor deleted. Returns the new path."""
        dest = self.kept_path()
        note = {"reason": reason, "job_id": self.job.job_id, "run_id": self.job.run_id,
                "attempt": self.job.attempt, "batches": self.pending()}  # fmt: skip
        atomic_write(self.path / KEPT_NOTE, json.dumps(note, indent=1).encode())
        if dest != self.path:
            dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if dest.exists():  # kept once already (a retried keep): merge into it
                for f in self.path.iterdir():
                    os.replace(f, dest / f.name)
                shutil.rmtree(self.path, ignore_errors=True)
            else:
                os.replace(self.path, dest)
            _fsync_dir(dest.parent)
            self.path = dest
        return dest


class Spool:
    """All job spools of one worker state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.jobs_dir = root / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    def open_job(self, job: LeasedJob) -> JobSpool:
        path = self.jobs_dir / f"{job.job_id}-a{job.attempt}"
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        # the target's API key is not spooled: re-sending results after a restart needs none
        kept = job.model_copy(
            update={"spec": {k: v for k, v in job.spec.items() if k != "api_key"}}
        )
        atomic_write(path / "job.json", _dump(kept))
        return JobSpool(path, job)

    def kept(self) -> list[JobSpool]:
        """Job spools kept for recovery (``JobSpool.keep``), oldest name first."""
        return _spools_in(self.root / KEPT_DIR, remove_bad=False)

    def leftovers(self) -> list[JobSpool]:
        """Job spools left by an earlier worker process (unreadable ones are removed)."""
        return _spools_in(self.jobs_dir, remove_bad=True)


def _spools_in(root: Path, *, remove_bad: bool) -> list[JobSpool]:
    out: list[JobSpool] = []
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if not d.is_dir():
            continue
        try:
            job = LeasedJob.model_validate_json((d / "job.json").read_bytes())
        except (OSError, ValidationError, ValueError):
            if remove_bad:
                shutil.rmtree(d, ignore_errors=True)
            continue
        out.append(JobSpool(d, job))
    return out


def default_state_root() -> Path:
    return Path(platformdirs.user_state_dir("tokentrace"))


def worker_key(server_url: str, name: str | None) -> str:
    """A stable local id: the same server and name find the same state directory again."""
    h = hashlib.sha256(f"{server_url.rstrip('/')}|{name or ''}".encode()).hexdigest()[:10]
    return f"{name}-{h}" if name and name.replace("-", "").replace("_", "").isalnum() else h


class StateDirLock:
    """An exclusive lock on a worker state directory, held while the worker runs.

    ``acquire`` picks ``<root>/worker-<key>``, or ``-2``, ``-3``, ... when another live worker
    holds that one: a restarted worker finds its own spool again, and two workers on one
    machine never share one."""

    def __init__(self, path: Path, handle: IO[bytes]) -> None:
        self.path = path
        self._handle = handle

    @classmethod
    def acquire(cls, root: Path, key: str, *, exact: bool = False) -> StateDirLock:
        for n in range(1, 1000):
            path = root if exact else root / (f"worker-{key}" + ("" if n == 1 else f"-{n}"))
            path.mkdir(parents=True, exist_ok=True)
            handle = open(path / "lock", "ab")  # noqa: SIM115 (held until release)
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                if exact:
                    raise RuntimeError(f"{path} is in use by another worker") from None
                continue
            return cls(path, handle)
        raise RuntimeError(f"no free worker state directory under {root}")

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
        self._handle.close()
