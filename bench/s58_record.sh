#!/usr/bin/env bash
# Session 58: the tensor cores' throughput at the attention kernels' shapes (the NVX probe's
# test 8 with m64n64k16 and m64n128k16 lines added, SS and RS: .gpu/probe/nvxprobe, built
# from ../shared/probes/nvx with gen_peak_ptx.py's WGMMA list and perf.rs's WG_VARIANTS
# extended), then the figures of record with .gpu/helios (d68fffe: the turns).
source bench/s54_device.sh
(cd .gpu/probe && XDG_RUNTIME_DIR=/tmp timeout 120 ./nvxprobe --only 8 > $x/probe.txt 2>&1)
echo "== probe rc=$?"; grep -E "\[8" $x/probe.txt | cut -c1-330 | head -30
save
record
