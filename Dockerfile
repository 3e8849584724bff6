# One image for every role of the platform: web (gunicorn), worker and beat (Celery),
# the one-shot migrate step, and the simulated lab. docker-compose.yml picks the role.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DIAG_OUT_DIR=/data/out \
    DIAG_SIM_STATE_DIR=/data/labsim \
    STATIC_ROOT=/data/static

# WeasyPrint renders reports through Pango; DejaVu gives it fonts to embed. Poppler's
# pdftoppm draws a version's first page on the staff's approve-and-send confirmation.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fonts-dejavu-core poppler-utils \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Dependencies first, pinned by the lock file, so code changes reuse this layer.
COPY pyproject.toml requirements.lock ./
RUN python -c "import tomllib; print(chr(10).join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -c requirements.lock -r /tmp/requirements.txt

COPY . .

RUN useradd --create-home --uid 1000 diag \
    && mkdir -p /data/out /data/labsim /data/static /data/beat \
    && chown -R diag /data
USER diag

EXPOSE 8000
CMD ["gunicorn", "diagnostic.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "2", \
     "--timeout", "60", "--access-logfile", "-"]
