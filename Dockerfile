# The glassbox image: the exporter (and, with EXTRAS=lab, the lab and dashboards).
#
#   docker build -t vllm-glassbox .                                  # from PyPI, in the build
#   docker build --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg VERSION=$(python3 scripts/version.py) -t vllm-glassbox .
#   scripts/build-image.sh                     # hermetic: python:3.12-slim-bookworm, the exporter
#   scripts/build-image.sh --extras lab        # the lab Job's image (…-lab)
#
# With build/wheels/ present (scripts/build-image.sh puts every wheel there, built and
# downloaded on the host for the base image's Python) nothing is downloaded during the
# build; without it, pip installs the source and its dependencies from the package index.
# The base is any image with python3 and its venv module (a slim Python image).
ARG BASE=python:3.12-slim-bookworm

FROM ${BASE} AS build
ARG EXTRAS=""
COPY . /src/
RUN python3 -m venv /opt/glassbox \
 && pip="/opt/glassbox/bin/pip install --no-cache-dir --disable-pip-version-check" \
 && if [ -d /src/build/wheels ]; then \
      $pip --no-index --find-links /src/build/wheels "vllm-glassbox${EXTRAS:+[$EXTRAS]}"; \
    else \
      $pip "/src${EXTRAS:+[$EXTRAS]}"; \
    fi \
 && /opt/glassbox/bin/pip uninstall -y -q setuptools pip

FROM ${BASE}
# The commit the image was built from: glassbox_build_info{revision} (unknown if not given).
ARG REVISION=unknown
# glassbox's version (scripts/version.py; scripts/build-image.sh and the release pass it).
ARG VERSION=unknown
LABEL org.opencontainers.image.title="vllm-glassbox" \
      org.opencontainers.image.description="The glassbox exporter for vLLM: derived series, findings, cold starts, KV headroom" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/vllm-glassbox/vllm-glassbox" \
      org.opencontainers.image.url="https://github.com/vllm-glassbox/vllm-glassbox" \
      org.opencontainers.image.documentation="https://github.com/vllm-glassbox/vllm-glassbox/blob/main/docs/install.md" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/glassbox /opt/glassbox
# Runs as non-root with a read-only root filesystem: no bytecode written at run time.
ENV PATH=/opt/glassbox/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GLASSBOX_REVISION=${REVISION}
USER 65532:65532
EXPOSE 9400
# `docker run IMAGE exporter --target URL`, `docker run IMAGE probe --exporter URL`;
# with no arguments, the exporter with its defaults.
ENTRYPOINT ["glassbox"]
CMD ["exporter"]
