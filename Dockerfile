# The image the Helm chart runs (helm/rlmon): rlmon from this source tree, and the Ray (and
# Python) version your RayCluster runs, which a Ray node must match.
#
#   docker build --build-arg RAY_VERSION=<your cluster's Ray version> \
#       -t registry.example.com/rlmon:0.1.0 .
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim
ARG RAY_VERSION
COPY pyproject.toml README.md /src/
COPY rlmon /src/rlmon
RUN test -n "$RAY_VERSION" || { echo "set --build-arg RAY_VERSION=<your cluster's Ray version>" >&2; exit 1; } \
    && pip install --no-cache-dir "/src[service]" "ray[default]==${RAY_VERSION}" \
    && rm -rf /src \
    && useradd -u 1000 rlmon
USER 1000
