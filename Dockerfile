# vaeserve container: one image per JAX flavour.
#   docker build --build-arg JAX_FLAVOUR=tpu  -t vaeserve:tpu  .
#   docker build --build-arg JAX_FLAVOUR=cuda -t vaeserve:cuda .
#   docker build -t vaeserve:cpu .                       (the default)
# Settings come from VAESERVE_* environment variables or flags after `vaeserve serve`.
FROM python:3.11-slim

# cpu: plain `jax` from the base dependencies; tpu / cuda: the pyproject extras of the same name.
ARG JAX_FLAVOUR=cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VAESERVE_HOST=0.0.0.0 \
    VAESERVE_PORT=8000 \
    VAESERVE_COMPILE_CACHE=/var/cache/vaeserve/jax

WORKDIR /app
COPY pyproject.toml README.md ./
COPY models ./models
COPY sharding ./sharding
COPY service ./service

# PyAV wheels bundle FFmpeg with libx264, so no system codec packages are needed.
RUN case "$JAX_FLAVOUR" in \
        cpu) EXTRA="" ;; \
        tpu|cuda) EXTRA="[$JAX_FLAVOUR]" ;; \
        *) echo "JAX_FLAVOUR must be cpu, tpu or cuda (got $JAX_FLAVOUR)" >&2; exit 1 ;; \
    esac \
 && pip install ".${EXTRA}" \
 && useradd --create-home --uid 10001 vaeserve \
 && mkdir -p /var/cache/vaeserve/jax /models \
 && chown -R vaeserve /var/cache/vaeserve

USER vaeserve
EXPOSE 8000
# Mount a volume here so compiled decode programs survive restarts (see README, TPU VMs).
VOLUME ["/var/cache/vaeserve/jax"]

# /healthz is liveness only (the model may still be compiling: /readyz says when it is ready).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import os,sys,urllib.request; port=os.environ.get('VAESERVE_PORT','8000'); sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status != 200)"

CMD ["vaeserve", "serve"]
