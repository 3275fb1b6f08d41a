# Sourced by the train_gpt tests that compare runs (train_gpt_resume.sh, train_gpt_grad_accum.sh,
# train_gpt_pp.sh).
# Before sourcing, the caller sets cpprun, gpt (the two programs) and small (the flags every run
# takes); this gives it $tmp (removed at exit) and:
#   fail MESSAGE          prints FAIL: MESSAGE and the last run's output, exits 1
#   run NAME NPROC ARGS   train_gpt ARGS on NPROC ranks (1: without the launcher), 240 s at most; its
#                         output in $tmp/NAME.out (and $tmp/out), its per-step losses in
#                         $tmp/NAME.loss, its held-out loss in $tmp/NAME.val
#   same A B WHAT         the numbers of files A and B (one a line) agree within $tolerance
#                         (default 1e-10), and there are some
#   refused NPROC WHAT ARGS  train_gpt ARGS on NPROC ranks (1: without the launcher) exits 1 within
#                         $refused_within s (default 60), naming WHAT, before any step
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tolerance=${tolerance:-1e-10}
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$tmp/out" 2>/dev/null; exit 1; }
run() {
  local name=$1 nproc=$2
  shift 2
  local launch=()
  [ "$nproc" -gt 1 ] && launch=("$cpprun" --standalone --nproc_per_node="$nproc")
  timeout 240 "${launch[@]}" "$gpt" "${small[@]}" "$@" --losses-out "$tmp/$name.loss" >"$tmp/out" 2>&1 ||
    fail "exit code $? from: ${launch[*]} train_gpt $*"
  cp "$tmp/out" "$tmp/$name.out"
  sed -nE 's/.*held-out loss ([0-9.]+)$/\1/p' "$tmp/out" >"$tmp/$name.val"
  [ -s "$tmp/$name.val" ] || fail "train_gpt $* printed no held-out loss"
  echo "$name: held-out loss $(cat "$tmp/$name.val"), step losses $(tr '\n' ' ' <"$tmp/$name.loss")"
}
same() {
  paste -d' ' "$1" "$2" | awk -v tol="$tolerance" '
    NF != 2 { bad = 1; exit } { d = $1 - $2; if (d < 0) d = -d; if (d > max) max = d; n++ }
    END { printf "max difference %.3g over %d numbers\n", max, n; exit bad || n == 0 || max > tol }' ||
    fail "$3: $1 and $2 differ by more than $tolerance"
}
refused() {
  local nproc=$1 what=$2
  shift 2
  local launch=()
  [ "$nproc" -gt 1 ] && launch=("$cpprun" --standalone --nproc_per_node="$nproc")
  timeout "${refused_within:-60}" "${launch[@]}" "$gpt" "${small[@]}" "$@" >"$tmp/out" 2>&1
  local rc=$?
  [ $rc -eq 1 ] || fail "train_gpt $* exited $rc, not 1"
  grep -qF -- "$what" "$tmp/out" || fail "train_gpt $* did not name '$what'"
  ! grep -q "^step\|first loss" "$tmp/out" || fail "train_gpt $* trained"
  echo "refused: train_gpt $* ($(grep -m1 -F -- "$what" "$tmp/out" | sed 's/^.*error: //'))"
}
