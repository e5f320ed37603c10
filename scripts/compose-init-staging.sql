-- docker-compose: the staging database beside Airflow's metadata database
CREATE DATABASE gpupool OWNER airflow;
