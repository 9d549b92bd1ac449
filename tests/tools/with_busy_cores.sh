#!/bin/sh
# Run a command while background processes load the cores in random bursts; always stop them.
#   tests/tools/with_busy_cores.sh PYTHON COMMAND [ARGS...]     (used by `make test-busy`)
# BUSY_PROCESSES (default 2) spinners run tests/tools/busy.py for at most BUSY_SECONDS (default
# 3600). They are stopped when COMMAND ends, fails, or the run is interrupted (Ctrl-C, TERM);
# should this script be killed outright, each spinner sees its parent gone and stops by itself.
set -u
python=$1
shift
here=$(dirname "$0")
pids=""
# KILL, not TERM: a spinner has nothing to clean up, and a TERM that arrives between the
# shell's fork and Python's start is lost (the spinner would then run on until BUSY_SECONDS).
stop() {
    if [ -n "$pids" ]; then
        kill -KILL $pids 2>/dev/null
        wait $pids 2>/dev/null
        pids=""
    fi
}
trap 'stop' EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
i=0
while [ "$i" -lt "${BUSY_PROCESSES:-2}" ]; do
    "$python" "$here/busy.py" --seconds "${BUSY_SECONDS:-3600}" --seed "$i" --parent $$ &
    pids="$pids $!"
    i=$((i + 1))
done
echo "busy: ${BUSY_PROCESSES:-2} processes load the cores in bursts (pids$pids)" >&2
"$@"
