"""Static checks that docker-compose.yml and the Dockerfile match the code they deploy."""

import importlib
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
EXPECTED = ("postgres", "redis", "migrate", "worker", "beat", "flower", "api")
CELERY_SUBCOMMANDS = ("worker", "beat", "flower")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and "services" in data, "docker-compose.yml has no services"
    assert "version" not in data, "compose spec files must not set a top-level `version:`"
    services: dict[str, dict[str, Any]] = data["services"]
    return services


def _argv(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command")
    if cmd is None:
        return []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _host(url: str) -> str:
    netloc = url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
    return netloc.rsplit(":", 1)[0]


def _celery_services(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    argvs = {name: _argv(svc) for name, svc in services.items()}
    return {name: argv for name, argv in argvs.items() if argv[:1] == ["celery"]}


def test_services_exist_and_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    missing = [name for name in EXPECTED if name not in services]
    assert not missing, f"missing compose services: {missing}"
    for name, svc in services.items():
        image = svc.get("image")
        if image is None:
            assert "build" in svc, f"{name}: needs either `image` or `build`"
            continue
        tag = image.rsplit("/", 1)[-1]
        assert ":" in tag and not tag.endswith(":latest"), f"{name}: pin an image tag ({image})"


def test_worker_is_scalable(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker, "worker: container_name breaks --scale worker=N"
    assert "ports" not in worker, "worker: fixed host ports break --scale worker=N"


def test_celery_commands_target_tasks_app(services: dict[str, dict[str, Any]]) -> None:
    celery_services = _celery_services(services)
    assert {"worker", "beat", "flower"} <= set(celery_services), "celery roles missing"
    for name, argv in celery_services.items():
        assert argv[1:3] == ["-A", "tasks"], f"{name}: expected `celery -A tasks ...`: {argv}"
        assert len(argv) > 3 and argv[3] in CELERY_SUBCOMMANDS, f"{name}: bad subcommand {argv}"
    celery = importlib.import_module("celery")
    tasks = importlib.import_module("tasks")
    assert isinstance(getattr(tasks, "app", None), celery.Celery), "tasks.app is not a Celery app"


def test_worker_events_and_flower_auth(services: dict[str, dict[str, Any]]) -> None:
    assert "-E" in _argv(services["worker"]), "worker needs -E (task events) for Flower"
    auth = [a for a in _argv(services["flower"]) if a.startswith("--basic-auth=")]
    assert auth, "flower must be started with --basic-auth="
    assert "FLOWER_BASIC_AUTH" in auth[0], "flower --basic-auth must come from FLOWER_BASIC_AUTH"


def test_harness_commands_are_registered(services: dict[str, dict[str, Any]]) -> None:
    from harness.cli import main

    used = {name: _argv(svc) for name, svc in services.items()}
    used = {name: argv for name, argv in used.items() if argv[:1] == ["harness"]}
    assert "migrate" in used, "the migrate service should run `harness migrate`"
    for name, argv in used.items():
        assert len(argv) > 1, f"{name}: `harness` without a subcommand"
        assert argv[1] in main.commands, f"{name}: `harness {argv[1]}` is not a CLI command"


def test_harness_env_vars_are_documented(services: dict[str, dict[str, Any]]) -> None:
    from harness.settings import ENV_VARS

    for name, svc in services.items():
        for var in _env(svc):
            if var.startswith("HARNESS_"):
                assert var in ENV_VARS, f"{name}: {var} is not in harness.settings.ENV_VARS"


def test_connection_urls_point_at_compose_hosts(services: dict[str, dict[str, Any]]) -> None:
    checked = 0
    for name, svc in services.items():
        env = _env(svc)
        if "HARNESS_DATABASE_URL" in env:
            url = env["HARNESS_DATABASE_URL"]
            assert url.startswith("postgresql+psycopg://"), f"{name}: use psycopg 3 URL ({url})"
            assert _host(url) == "postgres", f"{name}: database host must be `postgres` ({url})"
            checked += 1
        for var in ("HARNESS_BROKER_URL", "HARNESS_REDIS_URL"):
            if var in env:
                assert _host(env[var]) == "redis", f"{name}: {var} must point at `redis`"
    assert checked, "no service sets HARNESS_DATABASE_URL"


def _dockerfile_instructions() -> list[tuple[str, str]]:
    assert DOCKERFILE.is_file(), "Dockerfile is missing from the repo root"
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")  # fold line continuations
    pairs = [ln.split(None, 1) for ln in joined.splitlines() if ln.strip()]
    return [(p[0].upper(), p[1] if len(p) > 1 else "") for p in pairs]


def _instruction_argv(args: str) -> list[str]:
    parsed = yaml.safe_load(args) if args.startswith("[") else None  # JSON (exec) form
    return [str(a) for a in parsed] if isinstance(parsed, list) else shlex.split(args)


def test_dockerfile_cmd_and_copies() -> None:
    instructions = _dockerfile_instructions()
    cmds = [" ".join(_instruction_argv(a)) for op, a in instructions if op == "CMD"]
    assert cmds and "celery -A tasks" in cmds[-1], f"Dockerfile CMD should run celery: {cmds}"
    for op, args in instructions:
        argv = _instruction_argv(args) if op in ("COPY", "ADD") else []
        if any(a.startswith("--from") for a in argv):
            continue  # multi-stage copy, not from the build context
        paths = [a for a in argv if not a.startswith("--")]
        for src in paths[:-1]:
            assert (ROOT / src).exists(), f"Dockerfile COPYs {src!r}, which is not in the repo"


@pytest.mark.parametrize("name", ["worker", "beat", "api"])
def test_depends_on_migrate_completion(services: dict[str, dict[str, Any]], name: str) -> None:
    deps = services[name].get("depends_on") or {}
    assert isinstance(deps, dict), f"{name}: depends_on must use the long form with conditions"
    condition = (deps.get("migrate") or {}).get("condition")
    assert condition == "service_completed_successfully", f"{name}: must wait for migrate"
    for dep, spec in deps.items():
        if (spec or {}).get("condition") == "service_healthy":
            assert "healthcheck" in services[dep], f"{name}: {dep} needs a healthcheck"


def test_worker_healthcheck_runs_the_liveness_command(services: dict[str, dict[str, Any]]) -> None:
    from harness.cli import main

    worker = services["worker"]
    test = [str(part) for part in (worker.get("healthcheck") or {}).get("test") or []]
    assert test[:1] == ["CMD"], "worker: healthcheck `test` should be [CMD, harness, health, ...]"
    argv = test[1:]
    assert argv[:3] == ["harness", "health", "--worker"], f"worker: healthcheck runs {argv}"
    main.commands["health"].make_context("health", argv[2:])  # the options parse
    assert worker.get("restart") in ("unless-stopped", "always"), "worker: needs a restart policy"
    # The check reads the file the worker writes: both see the worker's environment.
    assert "HARNESS_WORKER_HEARTBEAT_FILE" in _env(worker)


def _healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = [str(part) for part in (service.get("healthcheck") or {}).get("test") or []]
    assert test[:1] in (["CMD"], ["CMD-SHELL"]), f"healthcheck test form: {test}"
    return test[1:] if test[0] == "CMD" else shlex.split(test[1])


def test_every_long_running_service_has_a_working_healthcheck(
    services: dict[str, dict[str, Any]],
) -> None:
    from harness.cli import main

    for name, svc in services.items():
        if svc.get("restart") == "no":
            continue  # a one-shot job
        assert "healthcheck" in svc, f"{name}: a long-running service needs a healthcheck"
        argv = _healthcheck_argv(svc)
        if argv[:1] == ["harness"]:
            main.commands[argv[1]].make_context(argv[1], argv[2:])  # the options parse
        elif argv[:2] == ["python", "-c"]:
            compile(argv[2], f"{name}-healthcheck", "exec")  # the image has python, not curl


def test_beat_is_healthy_only_while_it_sweeps(services: dict[str, dict[str, Any]]) -> None:
    beat = services["beat"]
    assert _healthcheck_argv(beat)[:3] == ["harness", "health", "--worker"]
    # The sweeper refreshes this file after each sweep (harness.celery.sweeper).
    beat_file = _env(beat)["HARNESS_WORKER_HEARTBEAT_FILE"]
    assert beat_file != _env(services["worker"])["HARNESS_WORKER_HEARTBEAT_FILE"]


def test_every_harness_variable_in_the_file_is_a_setting() -> None:
    from harness.settings import ENV_VARS

    used = set(re.findall(r"\bHARNESS_[A-Z0-9_]+", COMPOSE.read_text()))
    assert used and used <= set(ENV_VARS), f"not settings: {sorted(used - set(ENV_VARS))}"


def test_the_api_serves_with_a_required_token(services: dict[str, dict[str, Any]]) -> None:
    api = services["api"]
    argv = _argv(api)
    assert argv[:2] == ["harness", "serve"], argv
    port = argv[argv.index("--port") + 1]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert any(str(p).endswith(f":{port}") for p in api.get("ports") or []), "publish its port"
    token = _env(api)["HARNESS_API_TOKEN"]
    assert token.startswith("${HARNESS_API_TOKEN:?"), "the API must refuse to start without one"
    check = " ".join(_healthcheck_argv(api))
    assert f"127.0.0.1:{port}/healthz" in check


def test_flower_keeps_its_state_in_a_volume(services: dict[str, dict[str, Any]]) -> None:
    flower = services["flower"]
    argv = _argv(flower)
    assert "--persistent=True" in argv
    db = next(a.split("=", 1)[1] for a in argv if a.startswith("--db="))
    mounts = {m.split(":")[1]: m.split(":")[0] for m in flower.get("volumes") or []}
    assert any(db.startswith(path + "/") for path in mounts), f"{db} is not on a volume"
    assert "/healthcheck" in " ".join(_healthcheck_argv(flower))


def test_workers_and_api_share_the_metrics_directory(services: dict[str, dict[str, Any]]) -> None:
    directories = set()
    for name in ("worker", "api"):
        directory = _env(services[name])["HARNESS_METRICS_DIR"]
        assert f"metrics:{directory}" in (services[name].get("volumes") or []), name
        directories.add(directory)
    assert len(directories) == 1


def test_the_image_installs_the_pinned_versions() -> None:
    runs = [args for op, args in _dockerfile_instructions() if op == "RUN"]
    assert any("-c constraints.txt" in run and "pip install" in run for run in runs), runs
    copied = " ".join(args for op, args in _dockerfile_instructions() if op == "COPY")
    assert "constraints.txt" in copied
    pins = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if "==" in ln]
    names = {ln.split("==")[0].lower() for ln in pins}
    assert {"celery", "kombu", "redis", "sqlalchemy", "flower"} <= names


def test_the_package_declares_ranges_not_pins() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = [dep for dep in project["dependencies"] if "==" in dep]
    assert not pinned, f"exact pins belong in constraints.txt: {pinned}"
