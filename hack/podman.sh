#!/usr/bin/env bash
# podman with the settings these machines need (shared FACTS.md, "Containers"); every script and
# test that runs podman goes through here:
# - runtime runc: crun 1.8 fails every container here ("cgroups in hybrid mode not supported");
# - default ulimits no higher than the hard limits the runtime inherits (podman's defaults fail
#   with "error setting rlimit type N: operation not permitted" where those are lower): nofile is
#   this shell's hard limit; nproc is this shell's capped at 32768, because conmon runs with a hard
#   RLIMIT_NPROC of 32768 here even where the shell's is higher (measured: 96364 in the shell,
#   32768 in conmon; any nproc above 32768 fails every container).
# The containers.conf is written to $RINGSEED_PODMAN_DIR (default /var/cache/ringseed/podman) and
# rewritten only when it would change. Usage: hack/podman.sh ARGS... (as `podman ARGS...`);
# `hack/podman.sh --conf` prints the containers.conf path and exits.
set -euo pipefail
dir=${RINGSEED_PODMAN_DIR:-/var/cache/ringseed/podman}
conf="$dir/containers.conf"
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
want=$(cat <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
CONF
)
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$want" ]; then
  mkdir -p "$dir"
  printf '%s\n' "$want" >"$conf.tmp.$$" && mv "$conf.tmp.$$" "$conf"
fi
if [ "${1:-}" = "--conf" ]; then echo "$conf"; exit 0; fi
export CONTAINERS_CONF="$conf"
exec podman "$@"
