_stage_begin() { _STAGE=$1; export REPRODUCE_STAGE=$1; printf '##reproduce stage=%s event=start t=%s n=%s\n' "$1" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"; }
_stage_end() { printf '##reproduce stage=%s event=end status=ok t=%s n=%s\n' "$_STAGE" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"; _STAGE=''; REPRODUCE_STAGE=''; }
_on_exit() {
  local rc=$? status=failed
  if [ -n "${_STAGE:-}" ]; then
    [ -e "$NODE_RUN_DIR/state/cancelled" ] && status=cancelled  # `reproduce cancel` marks the run first
    printf '##reproduce stage=%s event=end status=%s rc=%s t=%s n=%s\n' "$_STAGE" "$status" "$rc" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"
  fi
  _cleanup; "${_AFTER_CLEANUP:-:}"  # the container's leftovers (plan/leftovers.py)
  exit "$rc"
}
