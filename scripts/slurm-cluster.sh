#!/usr/bin/env bash
# A one-node Slurm cluster with fake GPUs, on loopback, entirely inside DIR, and slurmrestd.
#
#   scripts/slurm-cluster.sh start DIR [CTLD_PORT SLURMD_PORT GPUS]
#   scripts/slurm-cluster.sh stop DIR
#
# start writes DIR/env (SLURM_CONF=..., NODE=..., RESTD_URL=unix:...) to source before running
# Slurm clients, and waits until the node is idle. The GPUs are character devices made with mknod
# (major 195 like /dev/nvidia*) so slurmd accepts them without a driver; no cgroups.
#
# slurmrestd (openapi/v0.0.38, the newest plugin of Slurm 22.05) listens on the unix socket
# DIR/restd/slurmrestd.sock with rest_auth/local, as the unprivileged `slurm` user. JWT is not an
# option with Debian's build: it ships rest_auth/jwt for slurmrestd but no auth/jwt plugin for
# slurmctld (Slurm was built without libjwt), and with AuthAltTypes=auth/jwt slurmctld stops with
# "cannot find auth plugin for auth/jwt"; rest_auth/local refuses TCP clients.
#
# Slurm's power saving is on, for parking (gpupool.actuation.power.slurm): SuspendProgram and
# ResumeProgram are DIR/power/suspend and DIR/power/resume, which append each call ("suspend
# NODES" / "resume NODES") to DIR/power/calls; resume then restarts slurmd (-b: as after a boot),
# so the node registers again as a booted node does. In 22.05 a cluster-wide SuspendTime of
# INFINITE (the default) turns power saving off and slurmctld refuses POWER_DOWN_* and POWER_UP
# ("PowerSave is disabled"); so the cluster-wide value turns it on, and the partition's
# SuspendTime=INFINITE keeps its nodes from ever powering down on their own: every other test
# sees the node as before, and only `scontrol update State=POWER_DOWN_ASAP|POWER_UP` power it
# down or up. A parked node shows `idle~` (POWERED_DOWN) in sinfo; a job sent to it wakes it.
#
# start is idempotent: a cluster already answering `scontrol ping` in DIR is left running (its
# slurmrestd started if it is not), so a second start with the same DIR only checks.
set -euo pipefail

cmd="${1:?start|stop}"; DIR="$(realpath -m "${2:?DIR}")"
CTLD_PORT="${3:-6817}"; SLURMD_PORT="${4:-6818}"; GPUS="${5:-4}"
NODE="$(hostname -s)"
# shellcheck source=scripts/_lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_lib.sh"

stop() {
  # Cancel every job first, so no slurmstepd outlives its slurmd.
  if [ -f "$DIR/slurm.conf" ] && [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    export SLURM_CONF="$DIR/slurm.conf"
    jobs="$(timeout 5 squeue -h -o %i 2>/dev/null || true)"
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      timeout 5 scancel --full $jobs 2>/dev/null || true
      for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h -t R,CG -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    fi
  fi
  # TERM all daemons at once, then wait: each takes 1-2 s to wind down.
  kill_pidfiles TERM "$DIR"/slurmrestd.pid "$DIR"/slurmd.pid "$DIR"/slurmctld.pid "$DIR"/munged.pid
  # A slurmd the ResumeProgram restarted may have lost its pid file to the one it replaced
  # (a slurmd removes its pid file as it exits): this cluster's own slurmd, by its config path.
  local left
  left="$(pgrep -f -- "^slurmd -f $DIR/slurm.conf " || true)"
  if [ -n "$left" ]; then
    # shellcheck disable=SC2086
    kill -TERM $left 2>/dev/null || true
    for _ in $(seq 50); do pgrep -f -- "^slurmd -f $DIR/slurm.conf " >/dev/null || return 0; sleep 0.1; done
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
  fi
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# slurmrestd on DIR/restd/slurmrestd.sock; waits until it answers a ping through the socket.
start_restd() {
  local sock="$DIR/restd/slurmrestd.sock" user=slurm
  export SLURM_CONF="$DIR/slurm.conf"
  if alive "$DIR/slurmrestd.pid" && restd_ping "$sock"; then return 0; fi
  getent passwd "$user" >/dev/null || user=nobody
  mkdir -p "$DIR/restd"; chown "$user" "$DIR/restd"; chmod 755 "$DIR/restd"; rm -f "$sock"
  # -u/-g: serve as the unprivileged user (slurmrestd refuses to run as root); local auth then
  # identifies each client by the socket's peer credentials.
  setsid slurmrestd -u "$user" -g "$(id -g "$user")" -a rest_auth/local -s openapi/v0.0.38 \
    "unix:$sock" </dev/null >"$DIR/slurmrestd.log" 2>&1 &
  echo $! > "$DIR/slurmrestd.pid"
  for _ in $(seq 100); do
    restd_ping "$sock" && { echo "slurm-cluster: slurmrestd on unix:$sock"; return 0; }
    alive "$DIR/slurmrestd.pid" || break
    sleep 0.1
  done
  fail "slurmrestd did not answer on unix:$sock"
}

restd_ping() {
  [ -S "$1" ] && curl -sf -m 5 --unix-socket "$1" http://localhost/slurm/v0.0.38/ping 2>/dev/null \
    | grep -q '"ping": *"UP"'
}

write_env() {
  cat > "$DIR/env" <<ENV
SLURM_CONF=$DIR/slurm.conf
NODE=$NODE
RESTD_URL=unix:$DIR/restd/slurmrestd.sock
ENV
}

fail() {
  fail_with_logs slurm-cluster 15 "$*" "$DIR"/munged.log "$DIR"/slurmctld.log "$DIR"/slurmd.log \
    "$DIR"/slurmrestd.log
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR [CTLD_PORT SLURMD_PORT GPUS]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slurm-cluster: must run as root (slurmd, mknod)" >&2; exit 1; }

if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" \
   && SLURM_CONF="$DIR/slurm.conf" timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; then
  echo "slurm-cluster: already running in $DIR"
  write_env
  start_restd
  exit 0
fi

mkdir -p "$DIR"/{munge,spool/ctld,spool/d,dev}
chmod 755 "$DIR" "$DIR/munge"
chown munge:munge "$DIR/munge"

# munge: a private key and socket so this cluster never talks to another one's daemon.
if [ ! -f "$DIR/munge/munge.key" ]; then
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chown munge:munge "$DIR/munge/munge.key"; chmod 400 "$DIR/munge/munge.key"
fi
runuser -u munge -- munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
  --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
  --seed-file="$DIR/munge/munged.seed" --force || fail "munged did not start"
cp "$DIR/munge/munged.pid" "$DIR/munged.pid"

for i in $(seq 0 $((GPUS - 1))); do
  [ -e "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
done

# The power-saving programs run as SlurmUser (root here), with the node hostlist as argument.
mkdir -p "$DIR/power"
cat > "$DIR/power/suspend" <<PROG
#!/bin/sh
export PATH=$PATH
echo "suspend \$*" >> "$DIR/power/calls"
PROG
cat > "$DIR/power/resume" <<PROG
#!/bin/sh
export PATH=$PATH
echo "resume \$*" >> "$DIR/power/calls"
SLURMD_PID=\$(cat "$DIR/slurmd.pid" 2>/dev/null) && kill "\$SLURMD_PID" 2>/dev/null
for _ in \$(seq 50); do kill -0 "\$SLURMD_PID" 2>/dev/null || break; sleep 0.1; done
[ -n "\$SLURMD_PID" ] && kill -KILL "\$SLURMD_PID" 2>/dev/null
setsid slurmd -f "$DIR/slurm.conf" -N "$NODE" -b </dev/null >/dev/null 2>&1
PROG
chmod 755 "$DIR/power/suspend" "$DIR/power/resume"

cat > "$DIR/slurm.conf" <<CONF
ClusterName=gpupool-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=30
SuspendProgram=$DIR/power/suspend
ResumeProgram=$DIR/power/resume
SuspendTime=3600
SuspendTimeout=3
ResumeTimeout=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=1000 Gres=gpu:tesla:$GPUS State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP SuspendTime=INFINITE
CONF
last=$((GPUS - 1))
files="$DIR/dev/nvidia[0-$last]"; [ "$last" = 0 ] && files="$DIR/dev/nvidia0"
cat > "$DIR/gres.conf" <<CONF
AutoDetect=off
Name=gpu Type=tesla File=$files
CONF

export SLURM_CONF="$DIR/slurm.conf"
write_env

slurmctld -i -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" -N "$NODE" || fail "slurmd did not start"
for _ in $(seq 100); do
  state="$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)"
  [ "$state" = idle ] && { echo "slurm-cluster: node $NODE idle (ctld :$CTLD_PORT)"; start_restd; exit 0; }
  sleep 0.1
done
fail "node $NODE not idle after 10s (state: ${state:-none})"
