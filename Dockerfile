# Minimal image for the CLI and simulator (the dashboard and worker targets come later).
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
RUN pip install --no-cache-dir . && useradd --create-home tokentrace
USER tokentrace
ENTRYPOINT ["tokentrace"]
CMD ["--help"]
