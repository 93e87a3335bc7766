# syntax=docker/dockerfile:1
# taskfleet image: one image, three roles (`taskfleet api`, `taskfleet worker`, `taskfleet migrate`).
# docker-compose.yml picks the role with `command:` and defines the health checks, because the
# right probe (port, path) depends on the role.

# --- build: install the package and its pinned dependencies into a self-contained venv ---------
# Both stages must use the same base: the venv's interpreter is a symlink into it.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/taskfleet
WORKDIR /src
# Dependencies first, from pyproject's pinned list alone, so editing the code does not reinstall
# them (this layer is rebuilt only when pyproject.toml changes).
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && /opt/taskfleet/bin/pip install -r /tmp/requirements.txt
# Then the package itself. .dockerignore admits only what `pip install .` needs (pyproject, the
# packages, the migrations), so no local .env, virtualenv or git history can end up in a layer.
# pip byte-compiles here, because at run time the unprivileged user cannot write to the venv.
COPY . .
RUN /opt/taskfleet/bin/pip install --no-deps . \
    && /opt/taskfleet/bin/pip check

# --- runtime: the venv only, run as an unprivileged user ----------------------------------------
FROM ${PYTHON_IMAGE}

ENV PATH=/opt/taskfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN groupadd --system --gid 10001 taskfleet \
    && useradd --system --uid 10001 --gid taskfleet --home-dir /home/taskfleet --create-home \
       --shell /usr/sbin/nologin taskfleet

COPY --from=build /opt/taskfleet /opt/taskfleet

USER 10001:10001
WORKDIR /home/taskfleet

# 8000: the API. 9100: a worker's /metrics, /healthz, /readyz.
EXPOSE 8000 9100

# Exec form: no shell in between, so SIGTERM from `docker stop` reaches taskfleet and a worker
# drains. Something else must be PID 1 to reap what a killed process-isolated handler left behind:
# compose runs an init (`init: true`), the Kubernetes worker pod shares its process namespace,
# and a bare `docker run` needs `--init`.
ENTRYPOINT ["taskfleet"]
CMD ["--help"]
