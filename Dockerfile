# casetrail: one image, every component (`casetrail api|worker|consumer|...`).
# Build stage compiles wheels; the final stage has no compilers and runs as non-root.
# Base images are pinned to an exact version (pin the digest where you build: it
# cannot be looked up from where this file was written).
FROM python:3.11.11-slim-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY consumers ./consumers
# Every optional part (service/extras.py): the image serves reports and S3 archives.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[all]'

FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CASETRAIL_MIGRATIONS_DIR=/app/migrations \
    CASETRAIL_API_HOST=0.0.0.0
# fonts-dejavu-core: the case report's fonts (all of Unicode; service/audit/report.py).
RUN apt-get update && apt-get install -y --no-install-recommends fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/* && useradd --create-home --uid 10001 casetrail
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY migrations ./migrations
# Mount points of the key volumes (the worker's signing key, the API's action key) and
# of their public halves, of the ledger's state and of the archive, owned by the user
# that writes them (a new named volume takes its owner from the image's directory).
RUN mkdir /keys /public /action-public /state /archive \
    && chown casetrail /keys /public /action-public /state /archive
USER casetrail
# The API, and each component's metrics port (api, worker, consumer, capability worker).
EXPOSE 8000 9101 9102 9103 9104 9105
ENTRYPOINT ["casetrail"]
CMD ["up"]
