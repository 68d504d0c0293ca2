#!/usr/bin/env bash
# Packed against unpacked prefill passes in one run: two `clef-tt serve` of the same model, one
# with packing on (CLEF_PACK_TOKENS=2048, or CLEF_BENCH_PACK_TOKENS) and one with it off
# (CLEF_PACK_TOKENS=0), and `clef-tt bench http` sending distinct short states (about 300 input
# tokens, three questions) from 1, 4, 16 and 64 clients to each in turn: requests/s, p50, p99.
#
#   benches/packing.sh [--bin target/release/clef-tt] [--model DIR] [--requests 256]
#                      [--clients 1,4,16,64] [--tokens 300] [--json FILE]
#
# Both servers run one worker with a queue of 128 (every client's request waits, none is
# refused) and no prefix cache (every state is new anyway). The servers take turns: each
# client count runs on the packed one, then on the unpacked one.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/clef-tt
model=()
requests=256
clients=1,4,16,64
tokens=300
json=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --model) model=(--model "$2"); shift 2 ;;
    --requests) requests="$2"; shift 2 ;;
    --clients) clients="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --json) json=(--json "$2"); shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "$bin: build it first (cargo build --release --bin clef-tt)" >&2; exit 1; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# serve PORT PACK_TOKENS: start a server and wait for /health.
serve() {
  CLEF_PACK_TOKENS="$2" CLEF_WORKERS=1 CLEF_MAX_QUEUE=128 CLEF_PREFIX_CACHE=0 \
    "$bin" serve "${model[@]}" --port "$1" > "/tmp/clef-pack-bench-$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    curl -fsS "http://127.0.0.1:$1/health" > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "the server on port $1 did not start: /tmp/clef-pack-bench-$1.log" >&2
  exit 1
}
on=18411
off=18412
serve "$on" "${CLEF_BENCH_PACK_TOKENS:-2048}"
serve "$off" 0
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); flags: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -xE 'fma|avx2|avx512f|avx512_bf16' | tr '\n' ' ')"
"$bin" bench http --url "http://127.0.0.1:$on" --compare "http://127.0.0.1:$off" \
  --skip-latency --short-tokens "$tokens" --clients "$clients" --requests "$requests" \
  "${json[@]}"
