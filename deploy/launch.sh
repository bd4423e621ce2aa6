#!/usr/bin/env bash
# Start the splitserve processes of one host of a cluster file, wait until they are ready, restart
# one that exits, and stop them on SIGTERM / Ctrl-C.
#
#   deploy/launch.sh prefill-host deploy/two-hosts.toml    # router + prefill (by default)
#   deploy/launch.sh decode-host  deploy/two-hosts.toml    # decode + the detok pool
#   deploy/launch.sh prefill-b    deploy/four-hosts.toml   # roles = ["prefill:1"]
#
# Which processes a host runs ("decode", "prefill:1", "detok:0-1") and the CPUs each role is
# pinned to come from [hosts.<name>] in the file; tcp links use the CURVE keys of its
# [security] keys_dir (splitserve keys generate). Uses the project's .venv when there is one,
# else python3 on the PATH.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 HOST CLUSTER.toml [--log-dir DIR] [--ready-timeout S]" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${SPLITSERVE_PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$here/.venv/bin/python" ]; then python="$here/.venv/bin/python"; else python=python3; fi
fi
cd "$here"
# exec: the launcher itself receives SIGTERM and stops its children in order
exec "$python" -m splitserve.hostlaunch "$@"
