#!/usr/bin/env bash
# Run the test suite (or the tests named in the arguments) beside two CPU-spinning processes,
# as on a machine shared with other work: a test that passes here does not depend on having
# the cores to itself (no timing race decides it: issue 36). Each spinner is bounded (an
# hour) and killed when this script exits, however it exits; the exit status is pytest's.
#   tests/under_load.sh                           # the whole suite
#   tests/under_load.sh tests/test_faults.py -x   # one file
set -u
cd "$(dirname "$0")/.."
spinners=()
stop_spinners() {
    for pid in "${spinners[@]}"; do
        kill "$pid" 2>/dev/null
    done
}
trap stop_spinners EXIT
trap 'exit 130' INT TERM
for _ in 1 2; do
    timeout 3600 python3 -c 'while True: pass' &
    spinners+=("$!")
done
.venv/bin/python -m pytest "$@"
status=$?
exit "$status"
