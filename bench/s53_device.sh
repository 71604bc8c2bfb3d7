# Sourced by session 53's device scripts (bench/s53_*.sh): unpacks the Vulkan loader and GL
# dispatch libraries from .gl, switches validation and tuning off, finds NVIDIA's ICD when
# the loader does not, and sets up /tmp/x with `save`, which sends it back as $OUT/x.tgz.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
export HELIOS_VALIDATION=0 HELIOS_MATMUL_TUNE=0 HELIOS_ATTN_TUNE=0
.gpu/helios info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
x=/tmp/x; mkdir -p $x
save() { tar czf "$OUT/x.tgz" -C /tmp x; }
