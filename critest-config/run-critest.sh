#!/usr/bin/env bash
# Runs critest against a crius built from this checkout, offline (see README.md here).
#
#   critest-config/run-critest.sh [OUTPUT_FILE] [-- extra critest/ginkgo flags]
#
# Writes OUTPUT_FILE (default /tmp/critest-run.txt), a JUnit report beside it (.junit.xml: every
# spec with its state, which the console output only gives for failures) and crius's log
# (.crius.log).
# Needs, as root: critest on $PATH (built by you; this project ships none of cri-tools),
# crictl on $PATH, Debian's docker-registry and busybox-static, `make build` done. Everything
# it starts it stops again by PID, and it removes what it created:
# /tmp/crius-critest, /run/crius-critest, the bridge crius-critest0, the shared-memory segments
# critest's HostIpc specs make with ipcmk.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
WORK=/tmp/crius-critest
STATE=/run/crius-critest
SOCK=unix://$STATE/crius.sock
BRIDGE=crius-critest0
PORT=${CRITEST_REGISTRY_PORT:-5055}
# Where crius, crius-shim and crius-shim-helper are taken from (CRIUS_BIN_DIR to test other
# builds): where `make build` puts them.
TARGET=${CRIUS_BIN_DIR:-${CARGO_TARGET_DIR:-$REPO/target}/$(rustc -vV | sed -n 's/^host: //p')/debug}
# CRIUS_UNDER=DIR puts crius's root and state in DIR/root and DIR/state (e.g. a 0700
# `mktemp -d` directory) instead of the places crius.toml names; the socket stays in $STATE.
UNDER=${CRIUS_UNDER:-}
UNDER_ARGS=()
[ -n "$UNDER" ] && UNDER_ARGS=(--root "$UNDER/root" --state "$UNDER/state")
OUT=${1:-/tmp/critest-run.txt}
shift || true
[ "${1:-}" = "--" ] && shift

# Specs that cannot pass offline: critest pulls this image by a digest of gcr.io's build, which
# no locally built image can have.
SKIP='public image with digest should be pulled and removed'

for tool in critest crictl docker-registry; do
  command -v "$tool" >/dev/null || { echo "run-critest: $tool not found" >&2; exit 1; }
done
BINARIES="crius crius-shim crius-shim-helper"
for bin in $BINARIES; do
  [ -x "$TARGET/$bin" ] || { echo "run-critest: $TARGET/$bin missing: cargo build -p crius -p crius-shim" >&2; exit 1; }
done
if [ -e "$WORK" ] || [ -e "$STATE" ] || ip link show "$BRIDGE" >/dev/null 2>&1; then
  echo "run-critest: $WORK, $STATE or bridge $BRIDGE exists: another run, or a leftover" >&2
  exit 1
fi

REGISTRY_PID=
CRIUS_PID=
SHM_BEFORE=$(ipcs -m | awk 'NR>3 && $2 ~ /^[0-9]+$/ {print $2}' | sort)

cleanup() {
  set +e
  if [ -n "$CRIUS_PID" ] && kill -0 "$CRIUS_PID" 2>/dev/null; then
    # Let crius undo every pod (containers, network, mounts) before it stops.
    crictl --runtime-endpoint "$SOCK" --timeout 60s rmp -fa >/dev/null 2>&1
    kill -TERM "$CRIUS_PID"
    for _ in $(seq 50); do kill -0 "$CRIUS_PID" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$CRIUS_PID" 2>/dev/null && kill -KILL "$CRIUS_PID"
  fi
  # Shims outlive crius by design: stop any that a failed removal left, by their own pid files.
  for pidfile in "$STATE"/shims/*/shim.pid ${UNDER:+"$UNDER"/state/shims/*/shim.pid}; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if [ -n "$pid" ] && grep -q crius-shim "/proc/$pid/cmdline" 2>/dev/null; then
      echo "run-critest: killing leftover shim $pid ($pidfile)"
      kill -KILL "$pid"
    fi
  done
  if [ -n "$REGISTRY_PID" ]; then
    kill -TERM "$REGISTRY_PID"
    wait "$REGISTRY_PID" 2>/dev/null
  fi
  ip link del "$BRIDGE" 2>/dev/null
  # Deepest mounts first.
  findmnt -rno TARGET | grep -E "^($WORK|$STATE${UNDER:+|$UNDER})(/|$)" | sort -r | while read -r m; do
    umount -l "$m"
  done
  [ -n "$UNDER" ] && rm -rf "$UNDER/root" "$UNDER/state"
  for id in $(comm -13 <(echo "$SHM_BEFORE") \
      <(ipcs -m | awk 'NR>3 && $2 ~ /^[0-9]+$/ && $5 == 1048576 {print $2}' | sort)); do
    ipcrm -m "$id"
  done
  rm -rf "$WORK" "$STATE"
}
trap cleanup EXIT

mkdir -p "$WORK/net.d" "$WORK/ipam" "$WORK/registry" "$WORK/bin"
# Private copies: crius starts a shim (and the shim its helper) from beside itself for every pod,
# and a rebuild in the target dir during a long run must not mix versions.
for bin in $BINARIES; do cp "$TARGET/$bin" "$WORK/bin/"; done
cp "$HERE/10-crius-critest.conflist" "$WORK/net.d/"

cat >"$WORK/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $WORK/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$PORT
  secret: crius-critest-upload-secret
EOF
docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$PORT/v2/" >/dev/null 2>&1 && break
  sleep 0.1
done

# A busybox without FEATURE_SH_STANDALONE for /bin/sh (README: "MaskedPaths"), from Debian's
# busybox package, unpacked here and never installed.
SHELL_ARGS=()
if (cd "$WORK" && apt-get download busybox >/dev/null 2>&1); then
  dpkg-deb -x "$WORK"/busybox_*.deb "$WORK/busybox-deb"
  SHELL_ARGS=(--shell-busybox "$WORK/busybox-deb/bin/busybox")
else
  echo "run-critest: could not download Debian's busybox package; /bin/sh stays the static busybox" >&2
fi
(cd "$REPO" && cargo run -q -p crius-tests --bin critest-images -- \
  --registry "127.0.0.1:$PORT" --hosts-dir "$WORK/certs.d" "${SHELL_ARGS[@]}")

"$WORK/bin/crius" --config "$HERE/crius.toml" "${UNDER_ARGS[@]}" >"$WORK/crius.log" 2>&1 &
CRIUS_PID=$!
for _ in $(seq 100); do
  crictl --runtime-endpoint "$SOCK" version >/dev/null 2>&1 && break
  sleep 0.1
done
crictl --runtime-endpoint "$SOCK" version

set +e
critest --runtime-endpoint "$SOCK" --image-endpoint "$SOCK" \
  --test-images-file "$HERE/test-images.yaml" \
  --ginkgo.skip "$SKIP" --ginkgo.timeout 3h --ginkgo.no-color \
  --ginkgo.junit-report "${OUT%.txt}.junit.xml" "$@" 2>&1 | tee "$OUT"
status=${PIPESTATUS[0]}
cp "$WORK/crius.log" "${OUT%.txt}.crius.log"
exit "$status"
