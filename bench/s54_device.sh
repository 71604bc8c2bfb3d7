# Sourced by session 54's device scripts (bench/s54_*.sh): session 53's preamble (loader,
# environment, /tmp/x and `save`), then `attn`, one profiled round of the attention bench.
source bench/s53_device.sh
# attn NAME BINARY SHAPES DTYPES [VAR=VALUE...]: .gpu/BINARY's bench of SHAPES and DTYPES
# with the variables set, into $x/NAME-$r.txt (its own kernel cache); prints the medians,
# the profiled stages' GPU µs and any warning.
attn() {
  local n=$1 b=$2 shapes=$3 dtypes=$4; shift 4
  env "$@" HELIOS_CACHE_DIR=/tmp/c-$n HELIOS_PROFILE=1 timeout 60 .gpu/$b bench attention \
    --shapes "$shapes" --dtypes "$dtypes" > $x/$n-$r.txt 2>&1
  echo "== $n round $r rc=$?"
  grep -E "^ *(fwd|fwdbwd) " $x/$n-$r.txt | awk '{printf "%s %s %s %s | ", $1, $2, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/$n-$r.txt | head -8 | cut -c1-90; grep -iE "warn|fail" $x/$n-$r.txt | head -3
}
