#!/usr/bin/env bash
# Runs the three regions of deploy/local/*.toml as three separate
# `cascade serve` processes (from the repository root), until Ctrl-C.
#
#   deploy/local/run.sh            # build (release) and start eu-west, us-east, ap-south
#   cascade --server https://127.0.0.1:50051 --ca-cert data/local/certs/ca.pem list
#   cascade check --config deploy/local/eu-west.toml   # as eu-west, with its certificate
#
# The nodes talk mutual TLS: a development CA and one certificate per region
# are generated into data/local/certs on the first run (kept afterwards).
# Data lives in data/local/<region>; delete it to start over. Logs go to
# data/local/<region>.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --quiet
bin=target/release/cascade
mkdir -p data/local
"$bin" dev-certs --out data/local/certs eu-west us-east ap-south >/dev/null
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM
for region in eu-west us-east ap-south; do
  "$bin" serve --config "deploy/local/$region.toml" >"data/local/$region.out" 2>"data/local/$region.log" &
  pids+=("$!")
done
for region in eu-west us-east ap-south; do
  for _ in $(seq 100); do
    grep -q "listening on" "data/local/$region.out" 2>/dev/null && break
    sleep 0.1
  done
  echo "$region: $(head -n1 "data/local/$region.out")"
done
echo "three regions running; Ctrl-C stops them"
wait
