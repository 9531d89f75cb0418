# Shared helpers of the shell test scripts (sourced): ok/bad record a check, finish prints the closing line
# "N passed, M failed" that CI reads and returns non-zero when anything failed.
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok     $1"; }
bad() { failed=$((failed + 1)); echo "FAILED $1"; [ -n "${2:-}" ] && echo "       $2"; }
finish() {
  echo
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

# run_ok NAME CMD... : must exit 0 (stdout in $WORK/out.txt, stderr in $WORK/err.txt).
run_ok() {
  local name="$1"; shift
  if "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"; then ok "$name"; else bad "$name" "$(head -3 "$WORK/err.txt")"; fi
}

# expect_error NAME PATTERN OUTPUT CMD... : non-zero exit, exactly one stderr line matching PATTERN,
# and OUTPUT (if not "-") does not exist afterwards, nor any temporary beside it.
expect_error() {
  local name="$1" pattern="$2" output="$3"; shift 3
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"
  local rc=$?
  local lines; lines=$(wc -l <"$WORK/err.txt")
  if [ "$rc" -eq 0 ]; then bad "$name" "exit code 0"; return; fi
  if [ "$lines" -ne 1 ]; then bad "$name" "stderr has $lines lines: $(head -3 "$WORK/err.txt")"; return; fi
  if ! grep -qE -- "$pattern" "$WORK/err.txt"; then bad "$name" "stderr '$(cat "$WORK/err.txt")' lacks /$pattern/"; return; fi
  if [ "$output" != "-" ]; then
    if [ -e "$output" ]; then bad "$name" "partial output $output left behind"; return; fi
    if ls -a "$(dirname "$output")" 2>/dev/null | grep -q "^\.$(basename "$output")\.tmp"; then bad "$name" "temporary left"; return; fi
  fi
  ok "$name"
}
