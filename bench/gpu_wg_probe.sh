for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig; B=target/release/helios; $B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
$B info 2>&1 | sed -n '/cooperative matrix/,$p' | grep -A60 'cooperative matrix 2'
export HELIOS_CACHE_DIR=$(mktemp -d)
for v in wg128x128k32w4 wg128x128k32w4p wg128x128k16w4p wg128x256k32w8 wg128x256k32w8p wg128x256k16w8p wg128x256k32w4p wg256x128k32w4p wg64x128k32w4p wg64x64k32w2p; do
  echo "== $v"; HELIOS_MATMUL_VARIANT=$v timeout 60 $B bench matmul --cases sq4096,sq2048 --dtypes f16 --samples 10 2>&1 | grep -E "^(sq|error)|rror" | head -4
done
echo "== khr coop128x256w2x4k16d1"; HELIOS_MATMUL_VARIANT=coop128x256w2x4k16d1 timeout 60 $B bench matmul --cases sq4096,sq2048 --dtypes f16 --samples 10 2>&1 | grep -E "^(sq|error)|rror" | head -4
