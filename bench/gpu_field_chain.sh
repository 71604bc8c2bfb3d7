for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig; B=target/release/helios; $B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
L=${L:-comba30kh,comba30khr,comba30k2hr,comba30h,comba29kr,dual}
for lazy in 0 1; do
  echo "== lazy $lazy"
  HELIOS_FIELD_CHAIN_LAZY=$lazy HELIOS_CACHE_DIR=$OUT/cache$lazy HELIOS_PIPELINE_STATS=1 $B field bench --sweep --sweep-workgroups ${WG:-128} --sweep-layouts $L --budget 0.1 --sizes 64 --ops add 2>&1 | grep -E "stats fq_mul_chain|mul-chain" | sed 's/, Stack Size=0, Local Memory Size=68719476736, Shared Memory Size=0//'
done
