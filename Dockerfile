# syntax=docker/dockerfile:1
#
# gpumon container image: the daemon (`gpumon serve`) and the rest of the CLI, as a non-root user.
#
#   docker build -t gpumon .
#   docker run --rm --gpus all -p 9478:9478 gpumon                            # the host's GPUs
#   docker run --rm -p 9478:9478 gpumon serve --simulate 8xH100-SXM --sim-job llama-70b:0-7   # no GPU needed
#
# NVML (libnvidia-ml.so.1) is not in this image: it belongs to the host's NVIDIA driver and must match it.
# The NVIDIA Container Toolkit mounts it in, with the /dev/nvidia* device nodes, when the container runs
# with `--gpus all` (or `--runtime nvidia`, or on Kubernetes through the NVIDIA device plugin / GPU
# Operator). NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES below tell the toolkit which GPUs and
# which driver parts: "utility" is NVML and nvidia-smi, all that monitoring needs (no CUDA, no graphics).
#
# Both stages use the same base, pinned by exact version. For reproducible builds pin its digest as well
# (python:3.12.8-slim-bookworm@sha256:...), which a registry-aware updater (Renovate, Dependabot) keeps.

# ---- builder: gpumon's wheel and the wheels of all its dependencies -----------------------------------
FROM python:3.12.8-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# Only what the build reads (pyproject.toml's readme is README.md); .dockerignore keeps the rest out.
COPY pyproject.toml README.md ./
COPY gpumon ./gpumon
# Every dependency ships manylinux wheels for CPython 3.12 (grpcio, uvloop, httptools, psutil, bcrypt,
# pyyaml), so nothing is compiled and no compiler is needed even here. The kubernetes extra (grpcio) gives
# pod names through the kubelet's pod-resources API.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[kubernetes]"

# ---- runtime: no compiler, no build dependencies, no pip cache ------------------------------------------
FROM python:3.12.8-slim-bookworm

# Keep in step with gpumon/__init__.py (tests/deploy/test_docker.py checks): the label and the pinned install.
ARG GPUMON_VERSION=0.1.0

LABEL org.opencontainers.image.title="gpumon" \
      org.opencontainers.image.description="Per-node GPU monitoring daemon and Prometheus exporter for machines that train and serve large models" \
      org.opencontainers.image.source="https://github.com/gpumon/gpumon" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${GPUMON_VERSION}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    GPUMON_BASELINES=/var/lib/gpumon/baselines.toml

# A fixed numeric user and group, 10001:10001, which the Kubernetes manifests name in runAsUser/runAsGroup
# and fsGroup. Its home is the baseline library's directory (mount a volume or a ConfigMap there).
RUN groupadd --gid 10001 gpumon \
    && useradd --uid 10001 --gid 10001 --home-dir /var/lib/gpumon --no-create-home --no-log-init \
       --shell /usr/sbin/nologin gpumon \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/gpumon

# The wheels are bind-mounted from the builder for this one step, so they never land in a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "gpumon[kubernetes]==${GPUMON_VERSION}"

USER 10001:10001
WORKDIR /var/lib/gpumon

# gpumon's default port (gpumon.config.DEFAULT_PORT).
EXPOSE 9478

# Liveness through /healthz, without curl. Where: --listen on the daemon's command line (PID 1), else
# GPUMON_LISTEN, else 9478, a wildcard address probed on loopback. How: HTTPS when the web config (--web-config
# or GPUMON_WEB_CONFIG) has tls_server_config, without verifying the certificate, which names the host and not
# loopback; the probes need no basic auth. A web config that demands client certificates needs a probe of
# its own. An HTTP error or no answer within 4 s exits 1 (unhealthy).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, ssl, yaml, urllib.request as u; a = open('/proc/1/cmdline', 'rb').read().decode(errors='replace').split(chr(0)); o = lambda n, d: ([x[len(n) + 1:] for x in a if x.startswith(n + '=')] + [a[i + 1] for i, x in enumerate(a[:-1]) if x == n] or [d])[-1]; h, _, p = o('--listen', os.environ.get('GPUMON_LISTEN', '')).rpartition(':'); w = o('--web-config', os.environ.get('GPUMON_WEB_CONFIG', '')); s = 'https' if w and 'tls_server_config' in (yaml.safe_load(open(w)) or {}) else 'http'; h = h.strip('[]'); h = {'': '127.0.0.1', '0.0.0.0': '127.0.0.1', '::': '::1'}.get(h, h); c = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE; u.urlopen('%s://%s:%s/healthz' % (s, '[%s]' % h if ':' in h else h, p or 9478), timeout=4, context=c)"]

ENTRYPOINT ["gpumon"]
CMD ["serve"]
