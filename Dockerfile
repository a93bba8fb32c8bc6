# Project image: one image for every role (migrate, worker, beat, flower, api);
# docker-compose.yml picks the role through `command:`.
FROM python:3.11-slim

# PYTHONPATH: celeryconfig.py lives in /app; keep it importable whatever the cwd.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

# Optional extras, comma-separated: otel (traces), openai, anthropic, mcp (MCP servers as tools).
ARG EXTRAS=""

WORKDIR /app

COPY pyproject.toml README.md constraints.txt ./
COPY harness/ ./harness/
COPY tasks/ ./tasks/
COPY celeryconfig.py ./

# The exact versions the project is tested with (constraints.txt); the package
# itself declares ranges, so it also installs beside an application's own pins.
RUN if [ -n "$EXTRAS" ]; then target=".[$EXTRAS]"; else target="."; fi \
    && pip install --no-cache-dir -c constraints.txt "$target"

# Never run Celery as root (it warns, and a compromised task would own the container).
# /data (Flower's state) and /metrics (workers' metric files) are volume mount points:
# created here so that a new named volume takes their owner.
RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin harness \
    && mkdir -p /data /metrics \
    && chown -R harness:harness /app /data /metrics
USER harness

CMD ["celery", "-A", "tasks", "worker", "--loglevel=INFO"]
