# The Airflow image with the gpupool package installed (used by docker-compose.yaml).
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update && apt-get install -y --no-install-recommends slurm-client && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow:root requirements.txt constraints.txt /opt/gpupool/
RUN pip install --no-cache-dir -r /opt/gpupool/requirements.txt -c /opt/gpupool/constraints.txt
COPY --chown=airflow:root pyproject.toml README.md /opt/gpupool/
COPY --chown=airflow:root include /opt/gpupool/include
RUN pip install --no-cache-dir --no-deps -e /opt/gpupool
