# Sieve retrieval service. Build:  docker build -t sieve:cpu .
#                                  docker build --build-arg DEVICE=cuda -t sieve:cuda .
# Single stage on purpose: the only build step is `pip install`, and every wheel it needs is binary.
FROM python:3.11-slim

# cpu: CPU-only torch wheel (~200 MB instead of ~2.5 GB) + faiss-cpu; cuda: default torch (bundles CUDA 12) + faiss-gpu-cu12.
ARG DEVICE=cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependency layer: only the project metadata, so source edits do not reinstall torch.
COPY pyproject.toml README.md ./
RUN set -eux; \
    python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; e = p['optional-dependencies']; print('\n'.join(p['dependencies'] + e['qdrant'] + e['qdrant-edge']))" \
        > /tmp/requirements.txt; \
    if [ "$DEVICE" = "cpu" ]; then \
        pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; \
    elif [ "$DEVICE" = "cuda" ]; then \
        pip install torch==2.13.0; \
        sed -i 's/^faiss-cpu.*/faiss-gpu-cu12>=1.8/' /tmp/requirements.txt; \
    else \
        echo "DEVICE must be cpu or cuda, got '$DEVICE'" >&2; exit 1; \
    fi; \
    pip install -r /tmp/requirements.txt; \
    rm /tmp/requirements.txt

# Source layer: the one package.
COPY sieve ./sieve
RUN pip install --no-deps . && rm -rf build *.egg-info

RUN useradd --create-home --uid 10001 sieve \
    && mkdir -p /data/index /data/cache \
    && chown -R sieve:sieve /data
USER sieve

ENV SIEVE_HOST=0.0.0.0 \
    SIEVE_PORT=8000 \
    SIEVE_INDEX_DIR=/data/index \
    SIEVE_CACHE_DIR=/data/cache \
    HF_HOME=/data/cache/huggingface

VOLUME /data
EXPOSE 8000

# Liveness only (the process answers); readiness (/readyz) is checked by compose, whose start_period covers the first index build.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SIEVE_PORT', '8000'), timeout=4)"]

# Builds the demo index into the volume on first start (skipped when it is already there), then serves.
CMD ["sieve", "demo"]
