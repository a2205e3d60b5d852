#!/bin/bash
# Written by reproduce: runs node.sh in its own session; records pid (= process group) and exit code.
{
cd "$(dirname "$0")" || exit 1
echo $$ > pid
trap 'echo "reproduce: wrapper got SIGTERM" >&2' TERM
trap '' HUP
bash node.sh > node.log 2>&1 < /dev/null
rc=$?
rm -f .secrets.env
echo "$rc" > exit_code.tmp && mv -f exit_code.tmp exit_code
exit "$rc"
}
