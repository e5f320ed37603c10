#!/usr/bin/env bash
# Debian tools the tests use besides the services: docker-compose (validates
# docker-compose.yaml; there is no Docker engine here) and Chromium (the pool page test).
# Idempotent and quick when everything is there.
set -euo pipefail
need=()
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
  }
fi
