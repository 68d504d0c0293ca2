#!/usr/bin/env bash
# schemathesis (PyPI, pinned) against a live `clef-tt serve` on the built-in model, once without
# and once with CLEF_API_KEY: every operation of /openapi.json (the Workers AI ones included, in
# both runs), positive and negative cases, every check but positive_data_acceptance — among
# them negative_data_rejection (a body the document forbids must be refused: the document
# says no less than the server accepts), not_a_server_error, status_code_conformance,
# content_type_conformance, response_headers_conformance, response_schema_conformance,
# unsupported_method and ignored_auth. (positive_data_acceptance is left out: the server
# refuses some bodies the document allows, each documented as a 422 — images that are not
# pictures, prompts over the token limits, an empty question id whose instructions render to
# nothing.) Fails on any failure, on a server that does not exit cleanly on SIGTERM, or on
# fewer than EXAMPLES requests generated for POST /v1/systemone in a run.
#
#   tests/schemathesis/run.sh [BINARY] [EXAMPLES] [SEED] [RUNS]
#
# CI: `tests/schemathesis/run.sh target/debug/clef-tt 300` (a few minutes). The README's long
# runs: EXAMPLES=20000 and 2000. SCHEMATHESIS_VENV reuses a virtualenv.
set -euo pipefail
cd "$(dirname "$0")/../.."

bin="${1:-target/debug/clef-tt}"
examples="${2:-300}"
seed="${3:-20261201}"
runs="${4:-open key}" # open: no CLEF_API_KEY; key: with one
version="4.32.5"
venv="${SCHEMATHESIS_VENV:-$(mktemp -d)/venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c "import schemathesis, sys; sys.exit(schemathesis.__version__ != '$version')" 2>/dev/null ||
  "$venv/bin/pip" install --quiet "schemathesis==$version"

work="$(mktemp -d)"
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null || true' EXIT

run() { # NAME KEY
  local name="$1" key="$2" port log
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  log="$work/$name.log"
  CLEF_API_KEY="$key" "$bin" serve --port "$port" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.5
  done
  local auth=()
  [ -n "$key" ] && auth=(--header "Authorization: Bearer $key")
  local started=$SECONDS
  # From the work directory: schemathesis keeps a cache (.schemathesis/) where it runs.
  (cd "$work" && "$venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" "${auth[@]}" \
    --checks all --exclude-checks positive_data_acceptance --mode all --max-examples "$examples" --seed "$seed" \
    --generation-database none --no-color --report har --report-dir "$work/$name" \
    >"$work/$name.out" 2>&1) || { cat "$work/$name.out"; tail -n 50 "$log"; exit 1; }
  grep -E "generated|Seed:" "$work/$name.out" | tr -s ' ' | paste -sd' '
  "$venv/bin/python" - "$work/$name" "$examples" "$name" "$((SECONDS - started))" <<'EOF'
import collections, glob, json, sys
report, least, name, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
entries = [e for f in glob.glob(report + "/*.json") for e in json.load(open(f))["log"]["entries"]]
decide = [e for e in entries
          if e["request"]["method"] == "POST" and e["request"]["url"].endswith("/v1/systemone")]
statuses = collections.Counter(e["response"]["status"] for e in decide)
hosted = [e for e in entries if e["request"]["method"] == "POST" and "/ai/run/" in e["request"]["url"]]
hosted_statuses = collections.Counter(e["response"]["status"] for e in hosted)
print(f"{name}: {len(entries)} requests in {seconds} s, POST /v1/systemone {len(decide)}: "
      + ", ".join(f"{s} x{n}" for s, n in sorted(statuses.items()))
      + f"; Workers AI routes {len(hosted)}: "
      + ", ".join(f"{s} x{n}" for s, n in sorted(hosted_statuses.items())))
if len(decide) < least:
    sys.exit(f"only {len(decide)} requests for POST /v1/systemone (wanted {least})")
if any(s >= 500 for s in statuses) or any(s >= 500 for s in hosted_statuses):
    sys.exit("a 5xx answer")
EOF
  kill -TERM "$server"
  wait "$server" || { echo "serve did not exit cleanly on SIGTERM"; tail -n 50 "$log"; exit 1; }
  server=""
}

for name in $runs; do
  case "$name" in
    open) run open "" ;;
    key) run key "schemathesis-key" ;;
    *) echo "unknown run $name (open, key)"; exit 2 ;;
  esac
done
