"""Settings: defaults, parsing and validation of the HARNESS_* variables."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import harness
from harness import api
from harness import settings as settings_module
from harness.celery.config import celery_settings
from harness.errors import ConfigError
from harness.settings import ENV_VARS, REDIS_VISIBILITY_TIMEOUT, Settings
from harness.store.blobs import BlobStore

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"HARNESS_[A-Z_]+")
NUMERIC = (
    "HARNESS_LEASE_TTL",
    "HARNESS_SWEEP_INTERVAL",
    "HARNESS_STEP_TIME_LIMIT",
    "HARNESS_BROKER_POLL",
)


def test_defaults(tmp_path: Path) -> None:
    s = Settings.from_env({})
    assert s.database_url == "sqlite:///harness.db"
    assert s.broker_url == "filesystem://"
    assert s.redis_url is None
    assert s.imports == ()
    assert s.lease_ttl == 15.0
    assert s.sweep_interval == 5.0
    assert s.step_time_limit == 900.0
    assert s.broker_poll == 0.01
    assert s.worker_pool is None
    assert s.home == tmp_path / ".harness"  # the autouse fixture chdirs into tmp_path
    assert s.broker_dir == tmp_path / ".harness" / "broker"
    assert s.uses_filesystem_broker


def test_empty_values_mean_the_default() -> None:
    env = {name: "" for name in ENV_VARS}
    assert Settings.from_env(env) == Settings.from_env({})


def test_blank_numbers_mean_the_default() -> None:
    assert Settings.from_env({"HARNESS_LEASE_TTL": "   "}).lease_ttl == 15.0


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_LEASE_TTL", "3")
    monkeypatch.setenv("HARNESS_REDIS_URL", "redis://localhost:6379/1")
    s = Settings.from_env()
    assert s.lease_ttl == 3.0
    assert s.redis_url == "redis://localhost:6379/1"


def test_explicit_values(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "HARNESS_DATABASE_URL": "postgresql+psycopg://u@db/h",
            "HARNESS_BROKER_URL": "redis://broker:6379/0",
            "HARNESS_REDIS_URL": "redis://cache:6379/1",
            "HARNESS_LEASE_TTL": "2.5",
            "HARNESS_SWEEP_INTERVAL": " 1 ",
            "HARNESS_STEP_TIME_LIMIT": "60",
            "HARNESS_HOME": str(tmp_path / "home"),
            "HARNESS_BROKER_POLL": "0.5",
        }
    )
    assert s.database_url == "postgresql+psycopg://u@db/h"
    assert s.broker_url == "redis://broker:6379/0"
    assert s.redis_url == "redis://cache:6379/1"
    assert (s.lease_ttl, s.sweep_interval, s.step_time_limit, s.broker_poll) == (2.5, 1, 60, 0.5)
    assert s.home == tmp_path / "home"
    assert s.broker_dir == tmp_path / "home" / "broker"
    assert not s.uses_filesystem_broker


def test_relative_home_is_made_absolute(tmp_path: Path) -> None:
    assert Settings.from_env({"HARNESS_HOME": "state"}).home == tmp_path / "state"


def test_imports_are_split_on_commas_and_stripped() -> None:
    s = Settings.from_env({"HARNESS_IMPORTS": "a, b,,c"})
    assert s.imports == ("a", "b", "c")


def test_imports_of_only_separators_are_empty() -> None:
    assert Settings.from_env({"HARNESS_IMPORTS": " , ,"}).imports == ()


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("raw", ["abc", "1s", "ten"])
def test_non_numeric_value_is_a_config_error_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: raw})
    assert str(info.value) == f"{name}={raw!r} is not a number"


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("raw", ["0", "-1", "-0.5"])
def test_non_positive_value_is_a_config_error_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: raw})
    assert str(info.value) == f"{name}={raw!r} must be positive"


@pytest.mark.parametrize("raw", ["nan", "inf"])
def test_lease_ttl_must_be_finite(raw: str) -> None:
    """NaN compares false to everything (a lease that is never live, or never expires);
    an infinite TTL means a run whose worker died is never recovered."""
    with pytest.raises(ConfigError, match="HARNESS_LEASE_TTL"):
        Settings.from_env({"HARNESS_LEASE_TTL": raw})


@pytest.mark.parametrize("raw", ["3600", "3600.0", "86400"])
def test_step_time_limit_at_or_above_the_visibility_timeout_is_rejected(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"HARNESS_STEP_TIME_LIMIT=.*visibility timeout"):
        Settings.from_env({"HARNESS_STEP_TIME_LIMIT": raw})


def test_step_time_limit_just_under_the_visibility_timeout_is_accepted() -> None:
    """The task's hard limit is the step's plus the chain budget (throughput mode)."""
    limit = REDIS_VISIBILITY_TIMEOUT - 61
    settings = Settings.from_env({"HARNESS_STEP_TIME_LIMIT": f"{limit}"})
    assert settings.step_time_limit == limit
    assert settings.task_time_limit == REDIS_VISIBILITY_TIMEOUT - 1
    with pytest.raises(ConfigError, match="chain budget"):
        Settings.from_env({"HARNESS_STEP_TIME_LIMIT": f"{limit + 1}"})


def test_the_chain_budget_is_a_tenth_of_the_step_limit_up_to_a_minute() -> None:
    assert Settings.from_env({"HARNESS_STEP_TIME_LIMIT": "100"}).chain_budget == 10
    assert Settings.from_env({}).chain_budget == 60


def test_env_vars_has_no_duplicates_and_only_harness_names() -> None:
    assert len(set(ENV_VARS)) == len(ENV_VARS)
    assert all(NAME.fullmatch(name) for name in ENV_VARS)


def _from_env_source() -> str:
    """The source of ``Settings.from_env`` and of the helpers of harness.settings
    it calls: each checked variable is read by a helper of its own."""
    called = Settings.from_env.__func__.__code__.co_names  # type: ignore[attr-defined]
    helpers = [
        obj
        for name in called
        if inspect.isfunction(obj := getattr(settings_module, name, None))
        and obj.__module__ == settings_module.__name__
    ]
    return "".join(inspect.getsource(f) for f in [Settings.from_env, *helpers])


def test_env_vars_is_exactly_what_from_env_reads() -> None:
    read = set(NAME.findall(_from_env_source()))
    assert read == set(ENV_VARS)


def test_env_vars_covers_every_name_in_settings_py() -> None:
    names = set(NAME.findall(inspect.getsource(settings_module)))
    assert names <= set(ENV_VARS)


def test_no_other_module_mentions_an_undeclared_variable() -> None:
    sources = [*REPO.joinpath("harness").rglob("*.py"), *REPO.joinpath("tasks").rglob("*.py")]
    sources.append(REPO / "celeryconfig.py")
    found = {
        (name, str(path.relative_to(REPO)))
        for path in sources
        for name in NAME.findall(path.read_text())
    }
    assert {(n, p) for n, p in found if n not in ENV_VARS} == set()


def test_settings_is_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.lease_ttl = 1.0  # type: ignore[misc]


def test_settings_is_exported_from_harness() -> None:
    assert harness.Settings is Settings


def test_worker_pool_is_one_celery_knows() -> None:
    assert Settings.from_env({"HARNESS_WORKER_POOL": "prefork"}).worker_pool == "prefork"
    with pytest.raises(harness.ConfigError, match="HARNESS_WORKER_POOL='gevent'"):
        Settings.from_env({"HARNESS_WORKER_POOL": "gevent"})


def test_celery_pool_follows_the_setting(tmp_path: Path) -> None:
    home = {"HARNESS_HOME": str(tmp_path)}
    assert celery_settings(Settings.from_env(home))["worker_pool"] == "solo"
    prefork = Settings.from_env(home | {"HARNESS_WORKER_POOL": "prefork"})
    assert celery_settings(prefork)["worker_pool"] == "prefork"
    redis = Settings.from_env({"HARNESS_BROKER_URL": "redis://localhost:6379/0"})
    assert "worker_pool" not in celery_settings(redis)


def test_db_pool_size_defaults_to_derived_from_the_concurrency() -> None:
    assert Settings.from_env({}).db_pool_size is None
    assert Settings.from_env({"HARNESS_DB_POOL_SIZE": "  "}).db_pool_size is None


def test_db_pool_size_is_read() -> None:
    assert Settings.from_env({"HARNESS_DB_POOL_SIZE": " 12 "}).db_pool_size == 12


@pytest.mark.parametrize("raw", ["abc", "2.5", "1e3"])
def test_db_pool_size_must_be_a_whole_number(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"HARNESS_DB_POOL_SIZE": raw})
    assert str(info.value) == f"HARNESS_DB_POOL_SIZE={raw!r} is not a whole number"


@pytest.mark.parametrize("raw", ["0", "-3"])
def test_db_pool_size_must_be_positive(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"HARNESS_DB_POOL_SIZE": raw})
    assert str(info.value) == f"HARNESS_DB_POOL_SIZE={raw!r} must be positive"


def test_db_pool_size_is_documented_in_the_readme() -> None:
    assert "| `HARNESS_DB_POOL_SIZE` |" in (REPO / "README.md").read_text()


def test_the_readme_documents_every_variable() -> None:
    readme = (REPO / "README.md").read_text()
    assert [name for name in ENV_VARS if f"| `{name}` |" not in readme] == []


def test_rate_limits_are_checked_when_read_and_need_redis() -> None:
    redis_url = {"HARNESS_REDIS_URL": "redis://localhost:6379/1"}
    limits = "openai:gpt-4.1-mini=500rpm/200000tpm; anthropic:*=50rpm"
    settings = Settings.from_env(redis_url | {"HARNESS_RATE_LIMITS": limits})
    assert (settings.rate_limits, settings.rate_window) == (limits, 60.0)
    with pytest.raises(ConfigError, match="HARNESS_RATE_LIMITS needs HARNESS_REDIS_URL"):
        Settings.from_env({"HARNESS_RATE_LIMITS": limits})
    with pytest.raises(ConfigError, match="HARNESS_RATE_LIMITS"):
        Settings.from_env(redis_url | {"HARNESS_RATE_LIMITS": "openai:gpt=5 per minute"})
    with pytest.raises(ConfigError, match="HARNESS_RATE_WINDOW"):
        Settings.from_env({"HARNESS_RATE_WINDOW": "0"})


def test_prices_are_checked_when_read() -> None:
    prices = '{"openai:gpt-4.1-mini": {"input": 0.4, "output": 1.6}}'
    assert Settings.from_env({"HARNESS_PRICES": prices}).prices == prices
    with pytest.raises(ConfigError, match="HARNESS_PRICES is not JSON"):
        Settings.from_env({"HARNESS_PRICES": "gpt=1"})


def test_blobs_default_to_the_table_above_64_kib() -> None:
    s = Settings.from_env({})
    assert (s.blob_threshold, s.blob_dir) == (65536, None)


def test_blob_settings_are_read(tmp_path: Path) -> None:
    s = Settings.from_env({"HARNESS_BLOB_THRESHOLD": " 1024 ", "HARNESS_BLOB_DIR": "blobs"})
    assert (s.blob_threshold, s.blob_dir) == (1024, tmp_path / "blobs")
    assert Settings.from_env({"HARNESS_BLOB_THRESHOLD": "0"}).blob_threshold is None  # off


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("64k", "is not a whole number of bytes (0: off)"),
        ("1.5", "is not a whole number"),
        ("-1", "must be a number of bytes, or 0 (off)"),
    ],
)
def test_a_bad_blob_threshold_is_a_config_error(raw: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"HARNESS_BLOB_THRESHOLD": raw})
    assert str(info.value).startswith(f"HARNESS_BLOB_THRESHOLD={raw!r} {problem}")


def test_a_blob_dir_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "taken").touch()
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"HARNESS_BLOB_DIR": "taken"})
    assert str(info.value) == "HARNESS_BLOB_DIR='taken' is not a directory"


def test_the_store_opens_with_the_blob_settings(tmp_path: Path) -> None:
    """The directory is made when the store opens; one that cannot be is said then."""
    env = {"HARNESS_DATABASE_URL": f"sqlite:///{tmp_path / 'h.db'}"}
    blobs = env | {"HARNESS_BLOB_THRESHOLD": "2048", "HARNESS_BLOB_DIR": "shared/blobs"}
    store = api.open_store(Settings.from_env(blobs))
    assert store.blobs == BlobStore(2048, tmp_path / "shared" / "blobs")
    assert (tmp_path / "shared" / "blobs").is_dir()
    store.close()
    (tmp_path / "taken").touch()
    unusable = Settings.from_env(env | {"HARNESS_BLOB_DIR": "taken/blobs"})
    with pytest.raises(ConfigError, match=r"HARNESS_BLOB_DIR='.*/taken/blobs': cannot create it"):
        api.open_store(unusable)


def test_the_api_body_limit_defaults_to_a_mebibyte_and_is_read() -> None:
    assert Settings.from_env({}).api_max_body == 1 << 20
    assert Settings.from_env({"HARNESS_API_MAX_BODY": " 4096 "}).api_max_body == 4096


@pytest.mark.parametrize(
    ("raw", "problem"),
    [("1MB", "is not a whole number"), ("0", "must be positive"), ("-1", "must be positive")],
)
def test_a_bad_api_body_limit_is_a_config_error(raw: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"HARNESS_API_MAX_BODY": raw})
    assert str(info.value) == f"HARNESS_API_MAX_BODY={raw!r} {problem}"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@db/h", "postgresql://u:***@db/h"),
        ("postgresql+psycopg://u:p@ss@db:5432/h", "postgresql+psycopg://u:***@db:5432/h"),
        ("amqp://guest:guest@rabbit:5672//", "amqp://guest:***@rabbit:5672//"),
        ("redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("redis://redis:6379/0", "redis://redis:6379/0"),
        (
            "postgresql://u@db/h?password=pw&sslmode=require",
            "postgresql://u@db/h?password=***&sslmode=require",
        ),
        ("sqlite:////abs/harness.db", "sqlite:////abs/harness.db"),
    ],
)
def test_shown_url_masks_the_password(url: str, shown: str) -> None:
    assert settings_module.shown_url(url) == shown


def test_where_names_the_store_and_broker_as_absolute_paths(tmp_path: Path) -> None:
    """The embedded default is relative to the working folder: shown absolute,
    so two processes started in two folders show two stores (issue 21)."""
    s = Settings.from_env({})
    assert s.store_shown == f"sqlite:///{tmp_path / 'harness.db'}"
    assert s.where == (
        f"store sqlite:///{tmp_path / 'harness.db'}, "
        f"broker filesystem:// in {tmp_path / '.harness' / 'broker'}"
    )
    remote = Settings.from_env(
        {
            "HARNESS_DATABASE_URL": "postgresql://u:pw@db/h",
            "HARNESS_BROKER_URL": "amqp://guest:guest@rabbit:5672//",
        }
    )
    assert remote.where == "store postgresql://u:***@db/h, broker amqp://guest:***@rabbit:5672//"
    memory = Settings.from_env({"HARNESS_DATABASE_URL": "sqlite:///:memory:"})
    assert memory.store_shown == "sqlite:///:memory:"
