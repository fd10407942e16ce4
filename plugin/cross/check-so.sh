#!/usr/bin/env bash
# check-so.sh SO MAX_GLIBC EXPORTS...: the .so exports exactly EXPORTS and requires no glibc symbol
# version newer than MAX_GLIBC.  readelf reads any architecture's ELF, so one check serves
# x86_64 and aarch64.  Prints one line: "<so>: <machine>, highest GLIBC_x.y, exports OK".
set -euo pipefail
so=$1 max=$2
shift 2
want=$(printf '%s\n' "$@" | sort | tr '\n' ' ')
syms=$(readelf -W --dyn-syms "$so")
got=$(awk '$5 == "GLOBAL" && $7 != "UND" && $8 != "" {sub(/@.*/, "", $8); print $8}' <<<"$syms" | sort -u | tr '\n' ' ')
[ "$got" = "$want" ] || { echo "$so: exports [$got], want [$want]" >&2; exit 1; }
versions=$(grep -o 'GLIBC_[0-9][0-9.]*' <<<"$syms"$'\n'"$(readelf -W -V "$so")" | sed 's/GLIBC_//' | sort -uV)
highest=$(tail -1 <<<"$versions")
[ -n "$highest" ] || { echo "$so: no GLIBC symbol versions found (not linked against glibc?)" >&2; exit 1; }
if [ "$(printf '%s\n%s\n' "$highest" "$max" | sort -V | tail -1)" != "$max" ]; then
  echo "$so: requires GLIBC_$highest, newer than the GLIBC_$max baseline:" >&2
  grep "GLIBC_$highest" <<<"$syms" >&2 || true
  exit 1
fi
machine=$(readelf -h "$so" | awk -F: '/Machine/ {gsub(/^ +/, "", $2); print $2}')
echo "$so: $machine, highest GLIBC_$highest (<= GLIBC_$max), exports OK"
