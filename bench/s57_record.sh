#!/usr/bin/env bash
# For session 57: the figures of record with main (.gpu/helios-base, 67727e1) beside
# PyTorch in the same call, after the session's three producer/softmax experiments lost.
source bench/s54_device.sh
cp .gpu/helios-base .gpu/helios
record
