# One image for every service: web, collector, GPU workers, Flower, migrations.
# `docker compose build` builds it; docker-compose.yml says which role each service runs
# (python -m batching_site.serve ROLE).
#
# torch==2.13.0 from PyPI on linux/amd64 is the CUDA build, which the GPU workers need.
# For a CPU-only image pass --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
FROM python:3.11-slim-bookworm

ARG PIP_EXTRA_INDEX_URL=
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=batching_site.settings \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    HF_HOME=/cache/huggingface \
    TORCH_HOME=/cache/torch

WORKDIR /app
COPY requirements.txt .
RUN pip install -r requirements.txt

COPY . .
# The batching package by its import name, dynamic_batching (pyproject.toml maps tasks/
# and gpu_workers/ into it); its dependencies came with requirements.txt above.
RUN pip install --no-deps .
# Static files for the admin, for a reverse proxy to serve from /app/staticfiles.
RUN python manage.py collectstatic --no-input -v 0 \
    && useradd --create-home --uid 10001 app \
    && mkdir -p /cache && chown app /cache
USER app

EXPOSE 8000 5555
CMD ["python", "-m", "batching_site.serve", "web"]
