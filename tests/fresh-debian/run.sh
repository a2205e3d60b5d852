#!/usr/bin/env bash
# Check the test command on a truly bare Debian 12: debootstrap bookworm (variant minbase: only the
# "required" packages and apt; no git, no procps, no python3) into a directory, put a clean checkout
# of this repository (`git archive REF`) into it, and run, as root inside it:
#   1. README command 1 (venv + install + the seed's AWS dry run), then
#   2. bash tests/run.sh [pytest args...]
# Usage (as root, on a Debian or Ubuntu host with network to deb.debian.org and PyPI):
#   tests/fresh-debian/run.sh [--ref REF] [--overlay PATH]... [--root DIR] [--keep]
#                             [--mirror URL] [-- PYTEST_ARGS...]
#   --ref REF       what to check out (default HEAD); uncommitted changes are NOT included...
#   --overlay PATH  ...unless named: copy PATH from this working tree over the checkout (repeatable)
#   --root DIR      where the chroot goes (default /var/tmp/reproduce-fresh-debian/<UTC time>)
#   --keep          keep the chroot afterwards (default: delete it when everything passed)
#   --reuse         with --root DIR that already holds a debootstrapped system: skip debootstrap
#   --no-host-ca    do not carry this host's local CA certificates into the chroot (see below)
#
# Isolation (docs/testing.md): the chroot runs in its own mount and PID namespaces (`unshare`), so
# its mounts (proc, sys with the cgroup hierarchy, dev, a tmpfs /run) disappear with it and it
# neither sees nor signals the host's processes. It shares the host's network (apt and pip need
# it; the tests bind 127.0.0.1 only). Its own dockerd runs with --bridge=none --iptables=false
# (the tests' containers use --network none), so it leaves the host's docker0 and iptables alone,
# and puts its containers under a cgroup parent of its own. The chroot starts with an empty
# environment (nothing of this host's shell leaks in), with one exception: where this host reaches
# the internet through a TLS-intercepting proxy, its local CA certificates
# (/usr/local/share/ca-certificates/*.crt and the bundle built from them) are copied in and named
# by SSL_CERT_FILE and PIP_CERT, or pip could not verify PyPI. That is the site's network, not a
# package: dpkg still sees ca-certificates as missing, and tests/run.sh installs it.
# Exit status: 0 both passed; 1 the dry run failed; otherwise tests/run.sh's status.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REF=HEAD
ROOT=""
KEEP=0
REUSE=0
MIRROR="${REPRODUCE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CA=1
OVERLAYS=()
PYTEST_ARGS=()
say() { printf 'fresh-debian: %s\n' "$*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --ref) REF="$2"; shift 2 ;;
    --overlay) OVERLAYS+=("$2"); shift 2 ;;
    --root) ROOT="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --reuse) REUSE=1; shift ;;
    --mirror) MIRROR="$2"; shift 2 ;;
    --no-host-ca) HOST_CA=0; shift ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) say "unknown argument $1 (see --help)"; exit 2 ;;
  esac
done

[ "$(id -u)" -eq 0 ] || { say "run me as root (debootstrap, chroot, mounts)"; exit 2; }
command -v unshare >/dev/null || { say "unshare (util-linux) is needed"; exit 2; }
commit="$(git -C "$REPO" rev-parse --verify "$REF^{commit}")" || { say "no such ref: $REF"; exit 2; }
ROOT="${ROOT:-/var/tmp/reproduce-fresh-debian/$(date -u +%Y%m%dT%H%M%SZ)}"
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }

if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap </dev/null >/dev/null
fi

if [ "$REUSE" = 1 ] && [ -x "$ROOT/bin/bash" ]; then
  say "reusing the Debian 12 root in $ROOT"
else
  [ ! -e "$ROOT" ] || [ -z "$(ls -A "$ROOT")" ] || { say "$ROOT is not empty (use --reuse)"; exit 2; }
  mkdir -p "$ROOT"
  say "debootstrap bookworm (minbase) into $ROOT (log: $ROOT.debootstrap.log)"
  debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 \
    || { tail -n 30 "$ROOT.debootstrap.log" >&2; exit 1; }
  say "debootstrap done after $(elapsed)"
fi
# the security and updates suites, as on any installed Debian 12
cat >"$ROOT/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
CA_EXPORTS=""
if [ "$HOST_CA" = 1 ] && compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null \
   && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  say "carrying this host's local CA certificates in: $(cd /usr/local/share/ca-certificates && echo *.crt)"
  mkdir -p "$ROOT/usr/local/share/ca-certificates" "$ROOT/etc/ssl/certs"
  cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
  cp -L /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
  bundle=/etc/ssl/certs/ca-certificates.crt
  CA_EXPORTS="export SSL_CERT_FILE=$bundle PIP_CERT=$bundle REQUESTS_CA_BUNDLE=$bundle"
fi

SRC=/src/reproduce
rm -rf "${ROOT:?}$SRC"
mkdir -p "$ROOT$SRC"
git -C "$REPO" archive "$commit" | tar -x -C "$ROOT$SRC"
for path in "${OVERLAYS[@]}"; do
  say "overlay from the working tree: $path"
  mkdir -p "$(dirname "$ROOT$SRC/$path")"
  cp -a "$REPO/$path" "$ROOT$SRC/$path"
done
say "checkout of $(git -C "$REPO" rev-parse --short "$commit") in $ROOT$SRC"

# What runs inside: README command 1 exactly, then the test command. Commands are printed as run.
quoted_args=""
[ "${#PYTEST_ARGS[@]}" -eq 0 ] || quoted_args="$(printf ' %q' "${PYTEST_ARGS[@]}")"
cat >"$ROOT/fresh-debian-inside.sh" <<EOF
#!/bin/bash
set -uo pipefail
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
export DEBIAN_FRONTEND=noninteractive CI=true
$CA_EXPORTS
cd $SRC
t0=\$(date +%s)
# README command 1 needs python3 with venv: the README names that prerequisite
apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
echo "fresh-debian: README prerequisite (python3, python3-venv) installed after \$((\$(date +%s) - t0))s"
t1=\$(date +%s)
python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/reproduce recipes/qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k.yaml --cluster aws --dry-run >/tmp/dry-run.txt
rc=\$?
echo "fresh-debian: README command 1 exit \$rc after \$((\$(date +%s) - t1))s (\$(wc -l </tmp/dry-run.txt) lines printed)"
[ \$rc -eq 0 ] || exit 1
t2=\$(date +%s)
REPRODUCE_DOCKERD_ARGS="--bridge=none --iptables=false --ip6tables=false --cgroup-parent=/reproduce-fresh-debian" \\
  bash tests/run.sh$quoted_args
rc=\$?
echo "fresh-debian: bash tests/run.sh exit \$rc after \$((\$(date +%s) - t2))s"
if [ \$rc -eq 0 ]; then
  t3=\$(date +%s)
  bash tests/run.sh --collect-only -q >/dev/null
  echo "fresh-debian: a second bash tests/run.sh (--collect-only) exit \$? after \$((\$(date +%s) - t3))s"
fi
# end what tests/run.sh started (its dockerd), so the namespace's mounts can go
if [ -f /run/docker.pid ]; then kill "\$(cat /run/docker.pid)" 2>/dev/null; sleep 5; fi
exit \$rc
EOF
chmod +x "$ROOT/fresh-debian-inside.sh"

say "running README command 1, then bash tests/run.sh, inside the chroot"
set +e
unshare --mount --pid --fork --propagation private -- bash -c '
  set -e
  root=$1
  # "/" must be a mount point inside: dockerd remounts it (rslave) to unpack image layers
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=0755 tmpfs "$root/run"
  # not exec: this shell stays PID 1 of the namespace and reaps the orphans the tests leave
  # SIGINT back to its default: started from a background job (`cmd &`), this script inherits it
  # ignored, which a terminal or a CI runner would not pass on to the tests (they send Ctrl-C)
  chroot "$root" /usr/bin/env -i --default-signal=INT TERM=dumb /fresh-debian-inside.sh
' fresh-debian "$ROOT"
status=$?
set -e
# the (empty) cgroups the chroot's dockerd made under its own parent
for dir in /sys/fs/cgroup/reproduce-fresh-debian /sys/fs/cgroup/*/reproduce-fresh-debian; do
  if [ -d "$dir" ]; then find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
done
say "finished with exit $status after $(elapsed) (chroot: $ROOT)"
if [ "$status" -eq 0 ] && [ "$KEEP" = 0 ]; then
  rm -rf --one-file-system "${ROOT:?}" "$ROOT.debootstrap.log"
  say "removed $ROOT"
fi
exit "$status"
