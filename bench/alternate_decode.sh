#!/bin/bash
# Alternate `needle bench decode` between binaries, round after round, and
# summarise each binary's figures (min, median, max of the rounds).
#
# A shared VM drifts by 20% between phases, so two binaries are compared
# only inside one run like this one, never across runs.
#
#   bench/alternate_decode.sh [-r ROUNDS] [-t THREADS] [-p PROMPT] [-g GEN]
#                             NEEDLE... -- ARCHIVE...
#
# Each round runs every binary on every archive with
#   --prompt PROMPT --gen GEN --threads THREADS --iters 5
# (defaults 4 rounds, 2 threads, 256 and 128: issue 36's benchmark) and
# prints one line; the summary takes the medians bench decode prints (its
# rounds after the first).
set -euo pipefail

usage() {
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

rounds=4
threads=2
prompt=256
gen=128
while getopts "r:t:p:g:h" o; do
    case $o in
    r) rounds=$OPTARG ;;
    t) threads=$OPTARG ;;
    p) prompt=$OPTARG ;;
    g) gen=$OPTARG ;;
    h) usage 0 ;;
    *) usage 2 ;;
    esac
done
shift $((OPTIND - 1))
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    bins+=("$1")
    shift
done
[ $# -gt 0 ] && shift
archives=("$@")
if [ ${#bins[@]} -eq 0 ] || [ ${#archives[@]} -eq 0 ]; then
    echo "alternate_decode.sh: give binaries, then --, then archives" >&2
    usage 2
fi
for b in "${bins[@]}"; do
    [ -x "$b" ] || { echo "alternate_decode.sh: $b: not an executable" >&2; exit 2; }
done
for a in "${archives[@]}"; do
    [ -r "$a" ] || { echo "alternate_decode.sh: $a: cannot read it" >&2; exit 2; }
done

lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
for r in $(seq "$rounds"); do
    for b in "${bins[@]}"; do
        for a in "${archives[@]}"; do
            out=$("$b" bench decode --weights "$a" --prompt "$prompt" --gen "$gen" --threads "$threads" \
                --iters 5 2>&1) || { echo "$out" >&2; exit 1; }
            # the medians: the last field of the prefill and decode lines
            p=$(echo "$out" | awk '/^prefill/{gsub(/\)/, "", $NF); print $NF}')
            d=$(echo "$out" | awk '/^decode/{gsub(/\)/, "", $NF); print $NF}')
            rss=$(echo "$out" | awk '/^peak RSS/{print $3}')
            echo "round $r  $b  $a  prefill $p  decode $d  peak RSS $rss MB" | tee -a "$lines"
        done
    done
done

echo
echo "binary  archive  prefill min/median/max  decode min/median/max (tokens/s)"
for b in "${bins[@]}"; do
    for a in "${archives[@]}"; do
        awk -v b="$b" -v a="$a" '
            BEGIN { n = 0 }
            $3 == b && $4 == a { p[n] = $6; d[n] = $8; n++ }
            function med(x, n,   i, j, t) {
                for (i = 0; i < n; i++)
                    for (j = i + 1; j < n; j++)
                        if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
                return n % 2 ? x[int(n / 2)] : (x[n / 2 - 1] + x[n / 2]) / 2
            }
            END {
                mp = med(p, n); md = med(d, n)
                printf "%s  %s  %.0f / %.0f / %.0f  %.0f / %.0f / %.0f\n",
                    b, a, p[0], mp, p[n - 1], d[0], md, d[n - 1]
            }' "$lines"
    done
done
