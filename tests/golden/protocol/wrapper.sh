#!/bin/bash
# Written by reproduce: runs node.sh in its own session; records pid (= process group) and exit code.
{
cd "$(dirname "$0")" || exit 1
echo $$ > pid
trap 'echo "reproduce: wrapper got SIGTERM" >&2' TERM
trap '' HUP
exec 3> >(trap '' TERM INT HUP; exec setsid env -u REPRODUCE_RUN_DIR cat >> node.log)
copier=$!
echo "$copier" > copier
bash node.sh >&3 2>&3 3>&- < /dev/null
rc=$?
exec 3>&-
for _ in $(seq 100); do kill -0 "$copier" 2>/dev/null || break; sleep 0.1; done
rm -f .secrets.env
echo "$rc" > exit_code.tmp && mv -f exit_code.tmp exit_code
exit "$rc"
}
