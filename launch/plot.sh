#!/usr/bin/env bash
# Plots a gpt2-train metrics.jsonl as a PNG: a 2x2 grid of train and val loss, learning rate,
# tokens/s and gradient norm against step. Needs jq and gnuplot (launch/install-deps.sh).
#   launch/plot.sh METRICS.jsonl [OUT.png]     OUT defaults to METRICS with .jsonl replaced by .png
# Lines jq cannot parse (a run killed mid-line) are skipped; null values are gaps. A panel with no
# values says so instead of failing. GPT2_PLOT_KEEP_TSV=PATH keeps the columns given to gnuplot
# (for tests): "# step loss lr tokens_per_sec grad_norm" rows, two blank lines, "# step val_loss" rows.
# Exit 1 naming the file when it is missing, empty or has no loss values; 2 on bad usage.
set -euo pipefail
width=1200
height=900

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: launch/plot.sh METRICS.jsonl [OUT.png]" >&2
  exit 2
fi
in="$1"
out="${2:-${in%.jsonl}.png}"
fail() { echo "plot.sh: $in: $*" >&2; exit 1; }
[ -f "$in" ] || fail "no such file"
[ -s "$in" ] || fail "empty file"
for tool in jq gnuplot; do
  command -v "$tool" >/dev/null || { echo "plot.sh: $tool not found (launch/install-deps.sh installs it)" >&2; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/gpt2-plot.XXXXXX")"
trap 'rm -rf "$work"' EXIT
tsv="$work/metrics.tsv"

# Two gnuplot data blocks (index 0: train lines, index 1: eval lines), so the train curve has no
# gaps at eval steps. Missing or null values become NaN, which gnuplot treats as missing.
jq -nrR '
  def num: if type == "number" then . else "NaN" end;
  [inputs | fromjson? | objects | select(.step | type == "number")] as $rows
  | "# step\tloss\tlr\ttokens_per_sec\tgrad_norm",
    ($rows[] | select(has("loss")) | [.step, .loss, .lr, .tokens_per_sec, .grad_norm] | map(num) | @tsv),
    "", "",
    "# step\tval_loss",
    ($rows[] | select(has("val_loss")) | [.step, .val_loss] | map(num) | @tsv)
' "$in" >"$tsv"
if [ -n "${GPT2_PLOT_KEEP_TSV:-}" ]; then cp "$tsv" "$GPT2_PLOT_KEEP_TSV"; fi

# Values per column: gnuplot stops on a plot with no valid points, so empty panels are drawn apart.
read -r n_loss n_lr n_tok n_grad n_val < <(awk -F'\t' '
  /^#/ { next }  NF == 0 { block = 1; next }
  block == 0 { for (i = 2; i <= 5; i++) if ($i != "NaN") n[i]++ }
  block == 1 && $2 != "NaN" { n[6]++ }
  END { print n[2] + 0, n[3] + 0, n[4] + 0, n[5] + 0, n[6] + 0 }' "$tsv")
[ "$n_loss" -gt 0 ] || fail "no training lines with a loss value"

empty='set label 1 "no data" at graph 0.5, 0.5 center; plot [0:1] [0:1] NaN notitle; unset label 1'
series() {  # series COLUMN COUNT: a train curve, or the empty panel
  if [ "$2" -gt 0 ]; then echo "plot data index 0 using 1:$1 with lines lw 1.5 notitle"; else echo "$empty"; fi
}
val_plot=""
if [ "$n_val" -gt 0 ]; then
  val_plot=', data index 1 using 1:2 with linespoints pt 7 ps 0.6 lw 1.5 title "val"'
fi
title="$(printf '%s' "$in" | tr -cd '[:alnum:]._/ -')"  # nothing gnuplot could read as syntax

gnuplot <<EOF
set terminal pngcairo size $width,$height noenhanced font ",10"
set output "$work/plot.png"
data = "$tsv"
set datafile separator "\t"
set datafile missing "NaN"
set grid
set xlabel "step"
set multiplot layout 2,2 title "$title"
set title "loss"
plot data index 0 using 1:2 with lines lw 1.5 title "train"$val_plot
set title "learning rate"
set format y "%.1e"
$(series 3 "$n_lr")
set format y "% h"
set title "tokens/s"
$(series 4 "$n_tok")
set title "grad norm"
$(series 5 "$n_grad")
unset multiplot
EOF
mv -f "$work/plot.png" "$out"
echo "plot.sh: wrote $out"
