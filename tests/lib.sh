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
