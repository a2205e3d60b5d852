_trusted_dir() {
  local me owner mode link_owner
  me="$(id -u)"
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then
    mkdir -p -m 700 "$1" 2>/dev/null \
      || sudo -n install -d -m 700 -o "$me" -g "$(id -g)" "$1" \
      || { echo "reproduce: cannot create $1" >&2; return 1; }
  fi
  owner="$(stat -L -c %u "$1" 2>/dev/null)" && mode="$(stat -L -c %a "$1" 2>/dev/null)" \
    && link_owner="$(stat -c %u "$1" 2>/dev/null)" \
    || { echo "reproduce: cannot inspect $1" >&2; return 1; }
  if [ ! -d "$1" ] || [ "$owner" != "$me" ] || [ "$link_owner" != "$me" ] \
    || (( 8#$mode & 8#022 )); then
    echo "reproduce: refusing $1: it must be a directory owned by uid $me and writable" \
      "by no one else, but its owner is uid $owner and its mode $mode;" \
      "remove it or fix its owner and mode" >&2
    return 1
  fi
}
_trusted_dir /var/tmp/reproduce && _trusted_dir /var/tmp/reproduce/runs || exit 3
if [ -e /var/tmp/reproduce/runs/20260101T000000Z-abcdef ] || [ -L /var/tmp/reproduce/runs/20260101T000000Z-abcdef ]; then
  echo 'reproduce: '/var/tmp/reproduce/runs/20260101T000000Z-abcdef' already exists on the node: a run with this id was started there before; start this one with another --run-id' >&2; exit 3
fi
mkdir -m 700 /var/tmp/reproduce/runs/20260101T000000Z-abcdef /var/tmp/reproduce/runs/20260101T000000Z-abcdef/scripts /var/tmp/reproduce/runs/20260101T000000Z-abcdef/state /var/tmp/reproduce/runs/20260101T000000Z-abcdef/out
