# Stage timing for the CI scripts (sourced, not run). `stage NAME CMD...` runs CMD, records its
# wall time and returns its status; `stage_table` prints the stages this script recorded. Where
# BMOE_STAGE_LOG names a file (.ci/run sets it), every script also appends there, so .ci/run can
# print one table over all of them, even after a failure: `stage_table "$BMOE_STAGE_LOG"`.
# Each record is one line: NAME<TAB>SECONDS<TAB>ok|failed.

STAGE_OWN_LOG="$(mktemp "${TMPDIR:-/tmp}/bmoe-stages.XXXXXX")"

stage() {
  local name="$1"; shift
  local t0="$EPOCHREALTIME" rc=0
  "$@" || rc=$?
  local line
  line="$(awk -v n="$name" -v a="$t0" -v b="$EPOCHREALTIME" -v rc=$rc \
          'BEGIN { printf "%s\t%.1f\t%s", n, b - a, (rc == 0 ? "ok" : "failed") }')"
  echo "$line" >> "$STAGE_OWN_LOG"
  if [ -n "${BMOE_STAGE_LOG:-}" ]; then echo "$line" >> "$BMOE_STAGE_LOG"; fi
  return $rc
}

# Prints a table of the records in FILE and their total (stages named "... (background)" ran
# beside others and are left out of it); without FILE, this script's own records, once (at its
# end: the file is removed).
stage_table() {
  local file="${1:-$STAGE_OWN_LOG}"
  [ -s "$file" ] && awk -F'\t' '
    function mmss(s) { return sprintf("%d:%04.1f", int(s / 60), s - 60 * int(s / 60)) }
    { printf "  %-34s %9s  %s\n", $1, mmss($2), ($3 == "ok" ? "" : $3); if ($1 !~ /\(background\)$/) total += $2 }
    END { printf "  %-34s %9s\n", "total", mmss(total) }' "$file"
  if [ $# -eq 0 ]; then rm -f "$STAGE_OWN_LOG"; fi
  return 0
}
