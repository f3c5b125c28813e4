# Steps with a name, a time and a budget, for scripts/test.sh and
# scripts/long-checks.sh (sourced):
#
#   step NAME [BUDGET_S]   # ends the step before (its time kept), starts NAME
#   steps_end              # ends the last step; prints every step's time
#
# A step over its budget prints a WARNING naming it (the run goes on), so a
# step that grows is seen where it grows, before the whole run outgrows CI's
# time. On exit (any exit: set -e included) the summary is printed,
# and a failure names the step it happened in.
step_name=""
step_started=$SECONDS
step_budget=0
step_times=()
step_warnings=()

_step_close() {
  [ -n "$step_name" ] || return 0
  local took=$((SECONDS - step_started)) mark=""
  if [ "$step_budget" -gt 0 ] && [ "$took" -gt "$step_budget" ]; then
    mark="  WARNING: over its budget of $step_budget s"
    step_warnings+=("WARNING: step \"$step_name\" took $took s, over its budget of $step_budget s")
  fi
  if [ "$step_budget" -gt 0 ]; then
    step_times+=("$(printf '%5d s  (budget %4d s)  %s%s' "$took" "$step_budget" "$step_name" "$mark")")
  else
    step_times+=("$(printf '%5d s                 %s' "$took" "$step_name")")
  fi
  step_name=""
}

step() {  # step NAME [BUDGET_S]
  _step_close
  step_name=$1
  step_budget=${2:-0}
  step_started=$SECONDS
  echo "== $1"
}

steps_finish() {  # the EXIT trap: steps_finish [STATUS]
  local status=${1:-$?} failed=$step_name
  _step_close
  echo "== ${STEPS_TITLE:-time per step}:"
  [ ${#step_times[@]} -eq 0 ] || printf '   %s\n' "${step_times[@]}"
  [ ${#step_warnings[@]} -eq 0 ] || printf '%s\n' "${step_warnings[@]}"
  if [ "$status" -ne 0 ]; then
    echo "== FAILED in step: ${failed:-before the first step} (exit status $status)"
  else
    echo "== every step passed in $SECONDS s"
  fi
  return "$status"
}
