"""Configuration: one frozen object, built from the environment when asked.

Every setting the harness reads is declared here, with its meaning and its
default; nothing reads the environment at import time.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness import faults
from harness.errors import ConfigError
from harness.providers.prices import Prices
from harness.providers.ratelimit import parse_limits
from harness.urls import absolute_sqlite, shown_url

#: Every variable the harness reads. Documented in README.md.
ENV_VARS = (
    # SQLAlchemy URL of the run store. Default: sqlite:///harness.db in the cwd.
    "HARNESS_DATABASE_URL",
    # Celery broker URL. Default: filesystem:// under .harness/broker.
    "HARNESS_BROKER_URL",
    # Redis for the idempotency cache. Unset: the SQL record alone.
    "HARNESS_REDIS_URL",
    # Comma-separated modules that register agents and tools.
    "HARNESS_IMPORTS",
    # Seconds a lease lives without renewal. Recovery takes at most TTL + sweep.
    "HARNESS_LEASE_TTL",
    # Seconds between sweeps for stuck runs.
    "HARNESS_SWEEP_INTERVAL",
    # Delivery probes (harness.engine.probes): "on" (default) re-sends an
    # overdue run only once a probe sent after its message has come through
    # the queue (or 10 lease TTLs past its wake-up), so a backlog is not fed
    # duplicates; "off" re-sends every overdue run.
    "HARNESS_DELIVERY_PROBES",
    # Hard time limit of one step task, seconds (kept under the Redis
    # broker's visibility timeout so a long step is not delivered twice).
    "HARNESS_STEP_TIME_LIMIT",
    # Directory for the embedded broker's files. Default: .harness/broker.
    "HARNESS_HOME",
    # Filesystem broker polling interval, seconds.
    "HARNESS_BROKER_POLL",
    # The step queue's name; its recovery lane is "<name>.recovery". Set it to
    # the queue given to harness.celery.install(app, queue=...) in an app of
    # your own, so that processes which do not import that app (the CLI,
    # `harness serve`) send step messages where its workers consume. Default:
    # harness.
    "HARNESS_QUEUE",
    # Celery worker pool: prefork, solo or threads. Default: solo on the
    # filesystem broker (a killed prefork child can freeze its siblings
    # there), Celery's own default (prefork) on the others.
    "HARNESS_WORKER_POOL",
    # Connections a worker process keeps open to the run store: one per thread
    # that uses it at once. Default: derived from the worker's concurrency.
    # Lease renewals have a connection of their own besides.
    "HARNESS_DB_POOL_SIZE",
    # Alert threshold: a step RUNNING for longer than this is counted as stuck
    # by `harness stats`. Default: the step time limit.
    "HARNESS_RUNNING_ALERT",
    # Chaos testing only: comma-separated crash points (harness.faults) at which
    # the process SIGKILLs itself. Unset in production.
    "HARNESS_CRASH_AT",
    # Worker liveness: the file a worker refreshes while its consumer consumes,
    # read by `harness health --worker` (harness.celery.health). Default:
    # $HARNESS_HOME/health/worker.heartbeat; one per worker.
    "HARNESS_WORKER_HEARTBEAT_FILE",
    # Provider rate limits shared by every worker through Redis (needs
    # HARNESS_REDIS_URL): "openai:gpt-4.1-mini=500rpm/200000tpm; anthropic:*=50rpm".
    # A request is counted with its output limit (1,024 tokens if it sets none), and
    # a token limit queues the steps it turns away, first come first served
    # (harness.providers.ratelimit). Unset: none.
    "HARNESS_RATE_LIMITS",
    # The window of those limits, seconds. Default 60 (per minute); tests shorten it.
    "HARNESS_RATE_WINDOW",
    # Prices of model tokens, JSON, USD per million tokens (harness.providers.prices).
    # Unset: costs are null, and a run with a cost budget fails before its first
    # model call (a budget that cannot be measured never pauses).
    "HARNESS_PRICES",
    # The bearer token of the HTTP API and dashboard (`harness serve`). Unset:
    # `harness serve` makes a random one and prints a login URL with it.
    "HARNESS_API_TOKEN",
    # The largest request body the HTTP API reads, bytes (harness.web.door):
    # a larger one is answered 413 as soon as it is declared or has streamed
    # past this. Default 1048576 (1 MiB).
    "HARNESS_API_MAX_BODY",
    # Log format of workers, beat, the CLI and the API: "text" (one readable
    # line per record, the default) or "json" (one JSON object per line, with
    # the transition fields of harness.observability.logs).
    "HARNESS_LOG_FORMAT",
    # Directory of the per-step metrics that worker processes write
    # (prometheus_client multiprocess files, harness.observability.metrics),
    # read by the API's /metrics. One per host, shared by that host's workers
    # and API. Unset: workers measure nothing and write nothing.
    "HARNESS_METRICS_DIR",
    # A port on which a worker's main process serves /metrics from
    # HARNESS_METRICS_DIR, so a host without the API can be scraped too.
    # Unset: not served.
    "HARNESS_METRICS_PORT",
    # Bytes of JSON above which a step's result or an idempotency record (a
    # tool's output, a model's response) is stored as a blob beside its row
    # (harness.store.blobs). Default 65536; 0: never, every result in its row.
    "HARNESS_BLOB_THRESHOLD",
    # A directory shared by every worker (and the CLI, the API) where those
    # blobs are files. Unset: the table harness_blobs of the run store.
    "HARNESS_BLOB_DIR",
    # The address at which `harness serve` is reached from outside, e.g.
    # https://agents.example.com: a deferred call's callback URL
    # (ctx.callback_url()) is {HARNESS_PUBLIC_URL}/api/callbacks/{token}.
    # Default: http://127.0.0.1:8000.
    "HARNESS_PUBLIC_URL",
    # The secret callback tokens are signed with (HMAC-SHA256 over the run,
    # the step, the attempt and the expiry), the same on every worker and API
    # process; at least 16 characters. Unset: ctx.callback_url() raises
    # ConfigError, and the API refuses every callback.
    "HARNESS_CALLBACK_SECRET",
    # Seconds a run's stream of answer text (GET /api/runs/{id}/events,
    # `harness follow`) is kept after its last piece was written: the Redis
    # stream's expiry, or the age at which the sweeper trims the table
    # harness_stream where there is no Redis. The record keeps every answer
    # whole regardless. Default 3600.
    "HARNESS_STREAM_TTL",
)

#: OpenTelemetry's own variables that the harness reads (harness.observability.tracing); the
#: SDK reads the rest itself (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME,
#: OTEL_BSP_SCHEDULE_DELAY, ...). Documented in README.md.
OTEL_VARS = (
    # Comma-separated span exporters: otlp (OTLP/HTTP), console, or any
    # installed package's entry point. Unset or "none": tracing is off.
    "OTEL_TRACES_EXPORTER",
    # "true": tracing is off, whatever OTEL_TRACES_EXPORTER says.
    "OTEL_SDK_DISABLED",
)

DEFAULT_LEASE_TTL = 15.0
DEFAULT_SWEEP_INTERVAL = 5.0
DEFAULT_STEP_TIME_LIMIT = 900.0
DEFAULT_BROKER_POLL = 0.01
REDIS_VISIBILITY_TIMEOUT = 3600.0
WORKER_POOLS = ("prefork", "solo", "threads")
DEFAULT_QUEUE = "harness"
DEFAULT_PUBLIC_URL = "http://127.0.0.1:8000"
DEFAULT_STREAM_TTL = 3600.0
#: The shortest callback secret taken: a guessable one would let anyone answer.
MIN_CALLBACK_SECRET = 16
#: A queue name that every broker takes as is, and that ``celery worker -Q a,b`` can list.
QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
LOG_FORMATS = ("text", "json")
DEFAULT_API_MAX_BODY = 1 << 20
#: Bytes of JSON text above which a result is stored as a blob (harness.store.blobs).
DEFAULT_BLOB_THRESHOLD = 65536


def chain_budget(step_time_limit: float) -> float:
    """A tenth of the step time limit, at most a minute."""
    return min(60.0, step_time_limit / 10)


def _names(raw: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name}={raw!r} must be a finite number")
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be positive")
    return value


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("on", "1", "true", "yes"):
        return True
    if raw in ("off", "0", "false", "no"):
        return False
    raise ConfigError(f"{name}={raw!r}: give on or off")


def _threshold(env: Mapping[str, str], name: str, default: int) -> int | None:
    """A number of bytes, or None for 0 (off)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number of bytes (0: off)") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must be a number of bytes, or 0 (off)")
    return value or None


def _directory(env: Mapping[str, str], name: str) -> Path | None:
    """An absolute path, which must be a directory if it exists (it is made on first use)."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    path = Path(raw).absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name}={raw!r} is not a directory")
    return path


def _count(env: Mapping[str, str], name: str) -> int | None:
    """A positive whole number, or None when unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be positive")
    return value


def _step_time_limit(env: Mapping[str, str]) -> float:
    """``HARNESS_STEP_TIME_LIMIT``, with the chain budget under the broker's
    visibility timeout (a longer task would be delivered twice while it runs)."""
    time_limit = _number(env, "HARNESS_STEP_TIME_LIMIT", DEFAULT_STEP_TIME_LIMIT)
    if time_limit + chain_budget(time_limit) >= REDIS_VISIBILITY_TIMEOUT:
        raise ConfigError(
            f"HARNESS_STEP_TIME_LIMIT={time_limit:g}, plus the throughput-mode chain "
            f"budget ({chain_budget(time_limit):g} s), must stay under the broker's "
            f"visibility timeout ({REDIS_VISIBILITY_TIMEOUT:g} s)"
        )
    return time_limit


def _crash_points(env: Mapping[str, str]) -> tuple[str, ...]:
    """``HARNESS_CRASH_AT``: named crash points (harness.faults) only."""
    crash_at = _names(env.get("HARNESS_CRASH_AT", ""))
    unknown = {spec for spec in crash_at if spec.partition(".")[0] not in faults.POINTS}
    if unknown:
        raise ConfigError(
            f"HARNESS_CRASH_AT: unknown points {sorted(unknown)}; known: {', '.join(faults.POINTS)}"
        )
    return crash_at


def _worker_pool(env: Mapping[str, str]) -> str | None:
    pool = env.get("HARNESS_WORKER_POOL", "").strip() or None
    if pool is not None and pool not in WORKER_POOLS:
        raise ConfigError(f"HARNESS_WORKER_POOL={pool!r}: choose one of {', '.join(WORKER_POOLS)}")
    return pool


def _rate_limits(env: Mapping[str, str]) -> str:
    """``HARNESS_RATE_LIMITS``, checked now rather than at the first model call."""
    rate_limits = env.get("HARNESS_RATE_LIMITS", "").strip()
    parse_limits(rate_limits)
    if rate_limits and not env.get("HARNESS_REDIS_URL"):
        raise ConfigError(
            "HARNESS_RATE_LIMITS needs HARNESS_REDIS_URL: the limits are shared through Redis"
        )
    return rate_limits


def _log_format(env: Mapping[str, str]) -> str:
    log_format = env.get("HARNESS_LOG_FORMAT", "").strip().lower() or "text"
    if log_format not in LOG_FORMATS:
        raise ConfigError(
            f"HARNESS_LOG_FORMAT={log_format!r}: choose one of {', '.join(LOG_FORMATS)}"
        )
    return log_format


def _metrics(env: Mapping[str, str]) -> tuple[Path | None, int | None]:
    """``HARNESS_METRICS_DIR`` and ``HARNESS_METRICS_PORT`` (which needs the folder)."""
    metrics_dir = env.get("HARNESS_METRICS_DIR", "").strip()
    metrics_port = _count(env, "HARNESS_METRICS_PORT")
    if metrics_port is not None and (metrics_port > 65535 or not metrics_dir):
        raise ConfigError(
            f"HARNESS_METRICS_PORT={metrics_port} needs HARNESS_METRICS_DIR and a port "
            "number up to 65535"
        )
    return (Path(metrics_dir).absolute() if metrics_dir else None), metrics_port


def _queue(env: Mapping[str, str]) -> str:
    queue = env.get("HARNESS_QUEUE", "").strip() or DEFAULT_QUEUE
    if not QUEUE_NAME.fullmatch(queue):
        raise ConfigError(
            f"HARNESS_QUEUE={queue!r}: letters, digits and _ . : - only (no spaces or commas)"
        )
    return queue


def _traces_exporter(env: Mapping[str, str]) -> tuple[str, ...]:
    """OpenTelemetry's own variables: ``OTEL_TRACES_EXPORTER`` (``none``
    ignored), all off with ``OTEL_SDK_DISABLED=true``."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    return tuple(
        name.lower()
        for name in _names(env.get("OTEL_TRACES_EXPORTER", ""))
        if name.lower() != "none"
    )


@dataclass(frozen=True)
class Settings:
    """Everything the harness is configured with. Build with :meth:`from_env`."""

    database_url: str
    broker_url: str
    redis_url: str | None
    imports: tuple[str, ...]
    lease_ttl: float
    sweep_interval: float
    step_time_limit: float
    home: Path
    broker_poll: float
    running_alert: float = DEFAULT_STEP_TIME_LIMIT
    #: The sweeper tells a queued message from a lost one (harness.engine.probes).
    delivery_probes: bool = True
    crash_at: tuple[str, ...] = ()
    worker_pool: str | None = None
    db_pool_size: int | None = None  # None: derived from the worker's concurrency
    heartbeat_file: Path | None = None
    queue: str = DEFAULT_QUEUE
    rate_limits: str = ""
    rate_window: float = 60.0
    prices: str = ""
    api_token: str | None = None
    #: The largest request body the HTTP API reads, bytes.
    api_max_body: int = DEFAULT_API_MAX_BODY
    log_format: str = "text"
    metrics_dir: Path | None = None
    metrics_port: int | None = None
    #: Span exporters to trace steps with (harness.observability.tracing); empty: tracing off.
    traces_exporter: tuple[str, ...] = ()
    #: Bytes of JSON above which a result is a blob (harness.store.blobs); None: never.
    blob_threshold: int | None = DEFAULT_BLOB_THRESHOLD
    #: Where blobs are files; None: the run store's table.
    blob_dir: Path | None = None
    #: Where `harness serve` is reached from outside (callback URLs).
    public_url: str = DEFAULT_PUBLIC_URL
    #: What callback tokens are signed with; None: no callbacks.
    callback_secret: str | None = None
    #: Seconds a run's stream of answer text is kept (harness.streams).
    stream_ttl: float = DEFAULT_STREAM_TTL

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the ``HARNESS_*`` variables (``os.environ`` by default)."""
        env = os.environ if env is None else env
        # Read in this order, so that of two mistakes the same one is reported first.
        home = Path(env.get("HARNESS_HOME") or ".harness").absolute()
        lease_ttl = _number(env, "HARNESS_LEASE_TTL", DEFAULT_LEASE_TTL)
        time_limit = _step_time_limit(env)
        imports = _names(env.get("HARNESS_IMPORTS", ""))
        crash_at = _crash_points(env)
        pool = _worker_pool(env)
        heartbeat = env.get("HARNESS_WORKER_HEARTBEAT_FILE", "").strip()
        rate_limits = _rate_limits(env)
        prices = env.get("HARNESS_PRICES", "").strip()
        Prices.parse(prices)
        log_format = _log_format(env)
        metrics_dir, metrics_port = _metrics(env)
        queue = _queue(env)
        traces = _traces_exporter(env)
        return cls(
            database_url=env.get("HARNESS_DATABASE_URL") or "sqlite:///harness.db",
            broker_url=env.get("HARNESS_BROKER_URL") or "filesystem://",
            redis_url=env.get("HARNESS_REDIS_URL") or None,
            imports=imports,
            lease_ttl=lease_ttl,
            sweep_interval=_number(env, "HARNESS_SWEEP_INTERVAL", DEFAULT_SWEEP_INTERVAL),
            delivery_probes=_switch(env, "HARNESS_DELIVERY_PROBES", True),
            step_time_limit=time_limit,
            home=home,
            broker_poll=_number(env, "HARNESS_BROKER_POLL", DEFAULT_BROKER_POLL),
            running_alert=_number(env, "HARNESS_RUNNING_ALERT", time_limit),
            crash_at=crash_at,
            worker_pool=pool,
            db_pool_size=_count(env, "HARNESS_DB_POOL_SIZE"),
            heartbeat_file=Path(heartbeat).absolute() if heartbeat else None,
            queue=queue,
            rate_limits=rate_limits,
            rate_window=_number(env, "HARNESS_RATE_WINDOW", 60.0),
            prices=prices,
            api_token=env.get("HARNESS_API_TOKEN", "").strip() or None,
            api_max_body=_count(env, "HARNESS_API_MAX_BODY") or DEFAULT_API_MAX_BODY,
            log_format=log_format,
            metrics_dir=metrics_dir,
            metrics_port=metrics_port,
            traces_exporter=traces,
            blob_threshold=_threshold(env, "HARNESS_BLOB_THRESHOLD", DEFAULT_BLOB_THRESHOLD),
            blob_dir=_directory(env, "HARNESS_BLOB_DIR"),
            public_url=_public_url(env),
            callback_secret=_callback_secret(env),
            stream_ttl=_number(env, "HARNESS_STREAM_TTL", DEFAULT_STREAM_TTL),
        )

    @property
    def chain_budget(self) -> float:
        """Seconds into a step task after which throughput mode starts no
        further step in it (``Agent.steps_per_task``)."""
        return chain_budget(self.step_time_limit)

    @property
    def task_time_limit(self) -> float:
        """Celery's hard limit on one step task: a step's own limit, plus the
        chain budget, so the last step a chain starts still gets all of its own."""
        return self.step_time_limit + self.chain_budget

    @property
    def worker_heartbeat_file(self) -> Path:
        """The file a worker keeps fresh while it consumes (harness.celery.health)."""
        return self.heartbeat_file or self.home / "health" / "worker.heartbeat"

    @property
    def broker_dir(self) -> Path:
        """Where the embedded ``filesystem://`` broker keeps its messages."""
        return self.home / "broker"

    @property
    def uses_filesystem_broker(self) -> bool:
        """True for the embedded broker, whose prefork pool must be avoided."""
        return self.broker_url.startswith("filesystem://")

    @property
    def store_shown(self) -> str:
        """The run store's URL as a user may be shown it: the password masked,
        a relative SQLite path made absolute (the default is in the working folder)."""
        return shown_url(absolute_sqlite(self.database_url))

    @property
    def broker_shown(self) -> str:
        """The broker as a user may be shown it: the embedded one with its folder."""
        if self.uses_filesystem_broker:
            return f"filesystem:// in {self.broker_dir}"
        return shown_url(self.broker_url)

    @property
    def store_in_working_folder(self) -> bool:
        """Is the run store an SQLite file named relative to the working folder
        (the default ``sqlite:///harness.db``)? A process started elsewhere uses another."""
        return absolute_sqlite(self.database_url) != self.database_url

    @property
    def where(self) -> str:
        """Which run store and broker these settings use, passwords masked: what
        an error about a run that is missing or not moving names, so that a
        process pointed elsewhere than the workers shows it."""
        return f"store {self.store_shown}, broker {self.broker_shown}"


def _public_url(env: Mapping[str, str]) -> str:
    url = env.get("HARNESS_PUBLIC_URL", "").strip() or DEFAULT_PUBLIC_URL
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url):
        raise ConfigError(
            f"HARNESS_PUBLIC_URL must be an http:// or https:// address such as "
            f"https://agents.example.com, not {url!r}"
        )
    return url.rstrip("/")


def _callback_secret(env: Mapping[str, str]) -> str | None:
    secret = env.get("HARNESS_CALLBACK_SECRET", "").strip()
    if not secret:
        return None
    if len(secret) < MIN_CALLBACK_SECRET:
        raise ConfigError(
            f"HARNESS_CALLBACK_SECRET must be at least {MIN_CALLBACK_SECRET} characters "
            f"(it signs the URLs that complete deferred calls); it has {len(secret)}"
        )
    return secret
