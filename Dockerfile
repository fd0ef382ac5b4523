# vaeserve container: one image per JAX flavour, its Python packages installed from the flavour's
# lock file (locks/FLAVOUR.txt: exact versions and their hashes).
#   make image FLAVOUR=cpu|tpu|cuda                        (docker, or buildah where no daemon runs)
#   docker build --build-arg JAX_FLAVOUR=tpu -t vaeserve:tpu .
#   docker build -t vaeserve:cpu .                        (the default flavour)
# BASE replaces the Python image (any Debian-based image with Python 3.12 or newer and pip on PATH).
# Settings come from VAESERVE_* environment variables or flags after `vaeserve serve`.
ARG BASE=python:3.12-slim

# The wheel is built in a stage of its own, so the build backend never reaches the image.
FROM ${BASE} AS wheel
# Build-time only (an ARG, not an ENV): pip runs as root here, and says so for every install.
ARG PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY models ./models
COPY sharding ./sharding
COPY service ./service
# vaeserve/ links the three folders into the one package the wheel installs.
COPY vaeserve ./vaeserve
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${BASE}
# cpu: the base dependencies (plain jax); tpu / cuda: with the pyproject extras of the same name.
ARG JAX_FLAVOUR=cpu
ARG PIP_ROOT_USER_ACTION=ignore

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VAESERVE_HOST=0.0.0.0 \
    VAESERVE_PORT=8000 \
    VAESERVE_COMPILE_CACHE=/var/cache/vaeserve/jax \
    VAESERVE_EMBEDDED_WEIGHTS_CACHE=/var/cache/vaeserve/embedded-weights

# The locked dependencies first: their layer is reused until the lock changes.
COPY locks /tmp/locks
RUN test -f "/tmp/locks/$JAX_FLAVOUR.txt" \
        || { echo "JAX_FLAVOUR must be one of: $(ls /tmp/locks | sed 's/\.txt$//' | xargs) (got $JAX_FLAVOUR)" >&2; exit 1; } \
 && pip install --require-hashes -r "/tmp/locks/$JAX_FLAVOUR.txt" \
 && rm -rf /tmp/locks

# PyAV wheels bundle FFmpeg with libx264, so no system codec packages are needed. `pip check`
# fails the build when the lock lacks something the wheel requires (a stale lock).
COPY --from=wheel /dist /tmp/dist
RUN pip install --no-deps /tmp/dist/*.whl \
 && pip check \
 && rm -rf /tmp/dist \
 && useradd --create-home --uid 10001 vaeserve \
 && mkdir -p /var/cache/vaeserve/jax /var/cache/vaeserve/embedded-weights /models \
 && chown -R vaeserve /var/cache/vaeserve

USER vaeserve
EXPOSE 8000
# Mount a volume here: compiled programs and the embedded model's drawn weights survive restarts
# (docs/deployment.md).
VOLUME ["/var/cache/vaeserve"]

# /healthz is liveness only (the model may still be compiling: /readyz says when it is ready).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import os,sys,urllib.request; port=os.environ.get('VAESERVE_PORT','8000'); sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status != 200)"

CMD ["vaeserve", "serve"]
