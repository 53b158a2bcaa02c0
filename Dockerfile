# The glassbox image: the exporter (and, with EXTRAS=lab, the lab and dashboards).
#
#   scripts/build-image.sh                     # python:3.12-slim-bookworm, the exporter
#   scripts/build-image.sh --extras lab        # the lab Job's image (…-lab)
#
# Hermetic: nothing is downloaded during the build. build/wheels/ holds every wheel,
# built and downloaded on the host for the base image's Python (scripts/build-image.sh).
# The base is any image with python3 and its venv module (a slim Python image).
ARG BASE=python:3.12-slim-bookworm

FROM ${BASE} AS build
ARG EXTRAS=""
COPY build/wheels/ /wheels/
RUN python3 -m venv /opt/glassbox \
 && /opt/glassbox/bin/pip install --no-index --find-links /wheels --no-cache-dir \
      --disable-pip-version-check "vllm-glassbox${EXTRAS:+[$EXTRAS]}" \
 && /opt/glassbox/bin/pip uninstall -y -q setuptools pip

FROM ${BASE}
LABEL org.opencontainers.image.title="vllm-glassbox" \
      org.opencontainers.image.source="https://github.com/vllm-glassbox/vllm-glassbox" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/glassbox /opt/glassbox
# Runs as non-root with a read-only root filesystem: no bytecode written at run time.
ENV PATH=/opt/glassbox/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9400
ENTRYPOINT []
CMD ["glassbox", "exporter"]
