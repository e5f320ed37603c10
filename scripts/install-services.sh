#!/usr/bin/env bash
# Install the real services the integration tests run on loopback: Prometheus, Slurm
# (slurmctld, slurmd, client, munge, slurmrestd), Keystone + Placement + Gnocchi in their
# own virtualenv (.services/openstack-venv), and sushy-tools' Redfish BMC emulator in another
# (.services/sushy-venv). Idempotent and quick when everything is there: it only calls
# apt-get / pip for what is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERVICES="${GPUPOOL_SERVICES_DIR:-$ROOT/.services}"
VENV="$SERVICES/openstack-venv"
REQS="$ROOT/scripts/openstack-requirements.txt"
SUSHY_VENV="${GPUPOOL_SUSHY_VENV:-$SERVICES/sushy-venv}"
SUSHY_REQS="$ROOT/scripts/sushy-requirements.txt"
PYTHON="${PYTHON:-python3}"

need_apt=()
for bin in prometheus:prometheus promtool:prometheus slurmctld:slurmctld slurmd:slurmd \
           sbatch:slurm-client scontrol:slurm-client munged:munge slurmrestd:slurmrestd curl:curl; do
  command -v "${bin%%:*}" >/dev/null 2>&1 || need_apt+=("${bin##*:}")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-services: need root to apt-get install ${need_apt[*]}" >&2
    exit 1
  fi
  # slurm-wlm pulls the plugins slurmd loads (gres/gpu, select/cons_tres).
  pkgs=(prometheus slurm-wlm slurmctld slurmd slurm-client munge slurmrestd curl)
  echo "install-services: apt-get install ${pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

# The virtualenv is rebuilt only when the pinned requirements changed since the last install.
stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$REQS" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/gunicorn" ] || [ ! -x "$VENV/bin/keystone-manage" ] || [ ! -x "$VENV/bin/gnocchi-upgrade" ] \
   || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "install-services: building $VENV"
  mkdir -p "$SERVICES"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQS"
  echo "$want" > "$stamp"
fi
# The Redfish emulator's virtualenv, likewise rebuilt only when its pins changed.
sushy_stamp="$SUSHY_VENV/.requirements.sha256"
sushy_want="$(sha256sum "$SUSHY_REQS" | cut -d' ' -f1)"
if [ ! -x "$SUSHY_VENV/bin/sushy-emulator" ] || [ "$(cat "$sushy_stamp" 2>/dev/null)" != "$sushy_want" ]; then
  echo "install-services: building $SUSHY_VENV"
  mkdir -p "$(dirname "$SUSHY_VENV")"
  "$PYTHON" -m venv "$SUSHY_VENV"
  "$SUSHY_VENV/bin/pip" install -q --disable-pip-version-check -r "$SUSHY_REQS"
  echo "$sushy_want" > "$sushy_stamp"
fi
echo "install-services: prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}'), slurm $(slurmctld -V | awk '{print $2}'), keystone+placement+gnocchi in $VENV, sushy-emulator in $SUSHY_VENV"
