#!/usr/bin/env bash
# docker compose: the secrets the compose file refuses to start without, generated once.
#   bash scripts/compose-secrets.sh [ENV_FILE]   (default: .env beside docker-compose.yaml)
# Appends AIRFLOW__CORE__FERNET_KEY (a Fernet key: 32 random bytes, URL-safe base64) and
# AIRFLOW__API_AUTH__JWT_SECRET to ENV_FILE where it does not set them yet; never replaces a
# value already there (a new Fernet key would make the stored connections unreadable).
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_FILE="${1:-.env}"
touch "$ENV_FILE"
chmod 600 "$ENV_FILE"
add() {
  local key="$1" value="$2"
  if grep -q "^${key}=" "$ENV_FILE"; then
    echo "compose-secrets: $key already set in $ENV_FILE, kept"
  else
    printf '%s=%s\n' "$key" "$value" >> "$ENV_FILE"
    echo "compose-secrets: $key written to $ENV_FILE"
  fi
}
PY="$(command -v python3 || command -v python)"
add AIRFLOW__CORE__FERNET_KEY "$("$PY" -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())')"
add AIRFLOW__API_AUTH__JWT_SECRET "$("$PY" -c 'import secrets; print(secrets.token_urlsafe(48))')"
