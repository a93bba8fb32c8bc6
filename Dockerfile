# Project image: one image for every role (migrate, worker, beat, flower);
# docker-compose.yml picks the role through `command:`.
FROM python:3.11-slim

# PYTHONPATH: celeryconfig.py lives in /app; keep it importable whatever the cwd.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

WORKDIR /app

COPY pyproject.toml README.md ./
COPY harness/ ./harness/
COPY tasks/ ./tasks/
COPY celeryconfig.py ./

RUN pip install --no-cache-dir .

# Never run Celery as root (it warns, and a compromised task would own the container).
RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin harness \
    && chown -R harness:harness /app
USER harness

CMD ["celery", "-A", "tasks", "worker", "--loglevel=INFO"]
