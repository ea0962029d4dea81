"""All configuration, from the environment (prefix ``TOKENTRACE_``), in one object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def default_database_url() -> str:
    data_dir = Path(platformdirs.user_data_dir("tokentrace"))
    return f"sqlite:///{data_dir / 'tokentrace.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENTRACE_", extra="ignore")

    database_url: str = Field(
        default_factory=default_database_url,
        description="SQLAlchemy URL; default: a SQLite file in the user's data directory",
    )
    sql_echo: bool = False

    # ``tokentrace serve``
    host: str = Field("127.0.0.1", description="address `tokentrace serve` listens on")
    port: int = Field(8000, ge=0, le=65535, description="port `tokentrace serve` listens on")
    public_url: str | None = Field(
        None, description="URL workers use to reach this server (default http://host:port)"
    )
    auth_reads: bool = Field(False, description="GET routes need a token with the read scope")
    local_worker: bool = Field(True, description="`tokentrace serve` starts an embedded worker")
    local_worker_probes: bool = Field(
        True,
        description="the embedded worker also runs probe jobs, where torch is installed",
    )
    local_worker_realtime: bool = Field(
        False,
        description="the embedded worker runs loads at real-time priority (SCHED_FIFO; needs "
        "root or CAP_SYS_NICE)",
    )
    # the launch forms' default target (``serve --demo`` sets it to its simulator)
    default_target_url: str = Field(
        "http://127.0.0.1:9000",
        description="base URL the dashboard's launch forms start with",
    )
    default_target_model: str = Field(
        "tokentrace-sim", min_length=1, description="model the launch forms start with"
    )
    # jobs and workers
    lease_ttl_s: float = Field(30.0, gt=0, description="a job lease lasts this long unrenewed")
    heartbeat_interval_s: float = Field(5.0, gt=0, description="how often workers heartbeat")
    poll_interval_s: float = Field(1.0, gt=0, description="how often idle workers ask for work")
    max_attempts: int = Field(3, ge=1, description="leases a job gets before it fails")
    shard_wait_s: float = Field(
        300.0,
        gt=0,
        description="a run dealt over workers (shards) fails if not every shard was leased "
        "and ready this long after it was queued",
    )
    probe_artifact_max_mb: float = Field(
        32.0, gt=0, description="largest probe artifact (e.g. a gzipped trace) stored, MiB"
    )
    # limits and security (docs/reliability.md)
    max_body_bytes: int = Field(
        1024 * 1024, gt=0, description="largest request body; bigger ones get 413"
    )
    max_upload_bytes: int = Field(
        64 * 1024 * 1024, gt=0, description="largest worker result batch (POST .../results)"
    )
    max_import_bytes: int = Field(
        256 * 1024 * 1024, gt=0, description="largest uploaded import file (POST imports)"
    )
    max_import_events: int = Field(
        10_000_000,
        gt=0,
        description="most events (token chunk times) one import may hold, every run of the "
        "file together; a bigger file is refused (413) before it is stored",
    )
    max_concurrent_imports: int = Field(
        1, ge=1, description="imports the server runs at once; another gets 429 meanwhile"
    )
    target_allowlist: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="hosts (glob patterns, host:port) and CIDRs that runs may target; "
        "empty: any. Env: comma-separated or a JSON list",
    )
    dataset_dirs: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="directories a worker (the embedded one included) may read dataset_path "
        "files from; empty: runs on workers cannot name a file. Env: comma-separated or JSON",
    )
    secret_key: str | None = Field(
        None,
        description="Fernet key sealing target API keys in queued jobs (default: a key file)",
    )
    secret_key_file: str | None = Field(
        None, description="where the generated key is kept (default: user data dir, mode 0600)"
    )
    target_allow_self: bool = Field(
        False, description="runs may target this dashboard's own address (refused by default)"
    )
    target_allow_link_local: bool = Field(
        False,
        description="runs may target link-local addresses, 169.254.0.0/16 and fe80::/10 "
        "(cloud metadata services; refused by default)",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="origins allowed cross-origin (empty: CORS off)"
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host header values served (names, *.sub-domain patterns, IPs; * any); "
        "others get 400. Empty: the bind host, the public URL's host, localhost, 127.0.0.1, "
        "::1 (and this machine's name when bound to every interface). Env: comma-separated "
        "or a JSON list",
    )
    auth_max_failures: int = Field(
        10,
        ge=1,
        description="failed sign-ins or token checks a client address may make in "
        "auth_failure_window_s; then it gets 429 (Retry-After) until the window ends",
    )
    auth_failure_window_s: float = Field(
        60.0, gt=0, le=86_400, description="the window auth_max_failures counts in, s"
    )
    auth_failure_clients: int = Field(
        10_000, ge=1, description="client addresses whose failures are remembered (memory)"
    )
    db_pool_size: int = Field(10, ge=1, description="database connections kept open")
    db_max_overflow: int = Field(
        70, ge=0, description="extra connections under load (pool_size + this >= 2 x 40 threads)"
    )
    db_pool_timeout_s: float = Field(30.0, gt=0, description="wait for a free connection")
    # series alerts (app/services/series_alerts.py): webhooks delivered off the request path
    alert_poll_s: float = Field(
        5.0, gt=0, le=3600, description="how often the dashboard settles, judges and delivers"
    )
    alert_retry_s: float = Field(
        10.0, gt=0, le=3600, description="first retry of a failed webhook; doubled each try"
    )
    alert_max_attempts: int = Field(6, ge=1, le=100, description="tries before a delivery fails")
    alert_timeout_s: float = Field(5.0, gt=0, le=60, description="one webhook POST's time limit")

    @field_validator(
        "target_allowlist", "cors_origins", "dataset_dirs", "allowed_hosts", mode="before"
    )
    @classmethod
    def _split_list(cls, v: Any) -> Any:
        """``a,b`` or ``["a", "b"]`` (from the environment) -> a list of stripped entries."""
        if isinstance(v, str):
            text = v.strip()
            items = json.loads(text) if text.startswith("[") else text.split(",")
            return [str(x).strip() for x in items if str(x).strip()]
        return v

    def secret_key_path(self) -> Path:
        if self.secret_key_file:
            return Path(self.secret_key_file)
        return Path(platformdirs.user_data_dir("tokentrace")) / "secret.key"

    def host_allowlist(self) -> list[str]:
        """The Host names (lower case, no port or brackets; ``*.`` patterns) this server
        answers: ``allowed_hosts`` plus the server's own URL's host, else the default."""
        from urllib.parse import urlsplit

        own = urlsplit(self.server_url()).hostname or ""
        if self.allowed_hosts:
            names = [*self.allowed_hosts, own]
        else:
            names = ["localhost", "127.0.0.1", "::1", own]
            if self.public_url:
                names.append(urlsplit(self.public_url).hostname or "")
            if self.host in ("0.0.0.0", "::", ""):  # every interface: this machine's names
                import socket

                names += [socket.gethostname(), socket.getfqdn()]
            else:
                names.append(self.host)
        out: list[str] = []
        for n in names:
            n = n.strip().lower().rstrip(".")
            if n.startswith("[") and n.endswith("]"):
                n = n[1:-1]
            if n and n not in out:
                out.append(n)
        return out

    def server_url(self) -> str:
        """Where a worker on this machine reaches the server."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


def get_settings() -> Settings:
    return Settings()
