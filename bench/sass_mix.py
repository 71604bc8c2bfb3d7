#!/usr/bin/env python3
"""SASS of Helios kernels, read back from the pipeline cache the NVIDIA driver filled.

Usage (on any machine, no GPU needed):
    pip install zstandard nvidia-cuda-nvdisasm   # or NVDISASM=/path/to/nvdisasm
    bench/sass_mix.py CACHE.bin [NAME_REGEX] [--dump DIR]

CACHE.bin is a Helios pipeline cache (HELIOS_CACHE_DIR/pipelines/*.bin) written on the GPU
machine (bench/gpu_field_chain.sh keeps them). For every kernel whose name matches, it prints
the instruction mix of the innermost loop (the last backward branch), or of the whole kernel
when there is none, and with --dump writes <name>.txt disassemblies to DIR.

With --control, each kernel's innermost loop is also printed instruction by instruction
with the scheduling fields of its control bits (Volta and later: bits 105-125 of the 128-bit
word): stall cycles, yield, the scoreboard it sets when its result lands (wb) or when it has
read its registers (rb), and the scoreboards it waits for (wait, a 6-bit mask). That is how
to see, e.g., that every global load of a loop shares one scoreboard, so the first use of any
load waits for all of them.

The format was read off the files, not from a specification: the driver stores each pipeline
as a zstd frame; the decompressed blob is an "NVDANVVMNVuc" container whose 32-bit words at
0x4c and 0x50 give the code size and an offset, and the code starts 8 bytes after that offset.
`nvdisasm -b SM90` decodes it (Hopper). Any other driver or GPU may differ: check that the
first instructions decode (S2R ...) before trusting a mix.
"""

import argparse
import collections
import glob
import os
import re
import struct
import subprocess
import sys
import tempfile

import zstandard


def nvdisasm():
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    for pattern in [
        os.path.join(sys.prefix, "lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm"),
        "/usr/local/lib/python3*/*-packages/nvidia/cu*/bin/nvdisasm",
        "/root/.pyenv/versions/*/lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm",
    ]:
        found = glob.glob(pattern)
        if found:
            return found[0]
    return "nvdisasm"


def kernels(cache):
    data = open(cache, "rb").read()
    frames = [m.start() for m in re.finditer(re.escape(b"\x28\xb5\x2f\xfd"), data)]
    for offset in frames:
        try:
            blob = zstandard.ZstdDecompressor().decompressobj().decompress(data[offset:])
        except zstandard.ZstdError:
            continue
        if not blob.startswith(b"NVDANVVMNVuc"):
            continue
        names = re.findall(rb"([a-z][a-z0-9_]+?)_\d+nv", blob)
        if not names:
            continue
        size, start = struct.unpack("<II", blob[0x4C:0x54])
        yield names[0].decode(), blob[start + 8 : start + 8 + size]


def disassemble(code, tool):
    with tempfile.NamedTemporaryFile(suffix=".sass") as f:
        f.write(code)
        f.flush()
        out = subprocess.run([tool, "-b", "SM90", f.name], capture_output=True, text=True)
    return out.stdout


def instructions(text):
    ins = []
    for line in text.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    return ins


def innermost_loop(ins):
    """(first, last) address of the last backward branch's loop, or the whole kernel."""
    lo, hi = 0, 1 << 62
    for addr, t in ins:
        if re.search(r"\bBRA\b", t):
            target = re.search(r"0x([0-9a-f]+)", t.split("BRA")[1])
            if target and int(target.group(1), 16) < addr:
                lo, hi = int(target.group(1), 16), addr
    return lo, hi


def control(code, addr):
    """Scheduling fields of the instruction at `addr`: (stall, yield, wb, rb, wait mask)."""
    c = struct.unpack_from("<Q", code, addr + 8)[0] >> 41
    return c & 0xF, (c >> 4) & 1 == 0, (c >> 5) & 7, (c >> 8) & 7, (c >> 11) & 0x3F


def print_control(code, text):
    ins = instructions(text)
    lo, hi = innermost_loop(ins)
    sb = lambda v: "-" if v == 7 else str(v)
    for addr, t in ins:
        if lo <= addr <= hi:
            stall, yld, wb, rb, wait = control(code, addr)
            waits = ",".join(str(i) for i in range(6) if wait >> i & 1) or "-"
            print(f"  {addr:05x} stall {stall:2d} {'Y' if yld else ' '} wb {sb(wb)} rb {sb(rb)} "
                  f"wait {waits:11s} {t}")


def loop_mix(text):
    ins = instructions(text)
    lo, hi = innermost_loop(ins)
    mix = collections.Counter()
    for addr, t in ins:
        if lo <= addr <= hi:
            mix[re.sub(r"^@!?U?P\w+\s+", "", t).split()[0]] += 1
    return mix


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache")
    ap.add_argument("pattern", nargs="?", default=".")
    ap.add_argument("--dump")
    ap.add_argument("--control", action="store_true",
                    help="print the innermost loop with each instruction's scheduling fields")
    args = ap.parse_args()
    tool = nvdisasm()
    print("| kernel | loop instructions | IMAD.WIDE | other IMAD | rest | 4·wide + 2·IMAD + rest |")
    print("|---|---|---|---|---|---|")
    for name, code in sorted(kernels(args.cache)):
        if not re.search(args.pattern, name):
            continue
        text = disassemble(code, tool)
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            open(os.path.join(args.dump, name + ".txt"), "w").write(text)
        mix = loop_mix(text)
        total = sum(mix.values())
        wide = mix["IMAD.WIDE.U32"] + mix["IMAD.WIDE"]
        imad = sum(v for k, v in mix.items() if k.startswith("IMAD")) - wide
        rest = total - wide - imad
        print(f"| {name} | {total} | {wide} | {imad} | {rest} | {4 * wide + 2 * imad + rest} |")
        if args.control:
            print_control(code, text)


if __name__ == "__main__":
    main()
