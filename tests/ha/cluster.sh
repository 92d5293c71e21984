#!/usr/bin/env bash
# A pg_auto_failover formation by hand: monitor, primary, secondary (own ports, data in $1).
# usage: tests/ha/cluster.sh DIR MONITOR_PORT P1 P2
set -euo pipefail
dir=$1; mport=$2; p1=$3; p2=$4
export PATH=/usr/lib/postgresql/15/bin:$PATH
mkdir -p "$dir"; chown postgres "$dir"
as_pg() { runuser -u postgres -- env PATH="$PATH" XDG_CONFIG_HOME="$dir/config" XDG_DATA_HOME="$dir/data" "$@"; }
as_pg pg_autoctl create monitor --pgdata "$dir/monitor" --pgport "$mport" --hostname 127.0.0.1 --auth trust --no-ssl
as_pg bash -c "pg_autoctl run --pgdata '$dir/monitor' >'$dir/monitor.log' 2>&1 &"
murl="postgres://autoctl_node@127.0.0.1:$mport/pg_auto_failover"
sleep 2
for n in 1 2; do
  port=p$n
  as_pg pg_autoctl create postgres --pgdata "$dir/node$n" --pgport "${!port}" --hostname 127.0.0.1 \
    --name "node$n" --auth trust --no-ssl --monitor "$murl" --run >"$dir/node$n.log" 2>&1 &
  sleep 6
done
as_pg pg_autoctl show state --pgdata "$dir/monitor"
