#!/usr/bin/env bash
# Runs the whole PyTorch distributed suite on one backend, in shards, one after
# the other, each under a time limit; results accumulate in one JSON file
# (--resume skips tests already recorded, so a killed shard can be re-run).
#
#   tests/conformance/run_all.sh guard            # -> build/conformance/guard.json
#   tests/conformance/run_all.sh gloo 6 1500      # 6 shards, 25 min each at most
#
# Extra arguments after the third go to run_torch_suite.py (e.g. --profile as-is).
set -u
backend=${1:-guard}
shards=${2:-6}
limit=${3:-1500}
shift $(( $# < 3 ? $# : 3 ))
root=$(cd "$(dirname "$0")/../.." && pwd)
out_dir=${CONF_OUT_DIR:-$root/build/conformance}
tag=${CONF_TAG:-$backend}
mkdir -p "$out_dir"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
for i in $(seq 1 "$shards"); do
  echo "== $tag shard $i/$shards ($(date +%T))"
  timeout --kill-after=30 "$limit" python "$root/tests/conformance/run_torch_suite.py" \
    --backend "$backend" --shard "$i/$shards" --resume \
    --out "$out_dir/$tag.json" --log-dir "$out_dir/logs-$tag" "$@" \
    > "$out_dir/$tag-shard$i.log" 2>&1
  echo "   exit $? ($(date +%T))"
done
