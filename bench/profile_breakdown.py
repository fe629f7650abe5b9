#!/usr/bin/env python3
"""What fills a profile: bytes and frames per frame kind.

Reads the frame layout of collector/src/profile/mod.rs (`"SF" version:u8 len:u32le crc:u32le
payload`); a payload is a postcard-encoded `Frame`, whose first byte (a varint, < 128 for every
variant so far) names the variant, in the order of `Frame` in analysis/src/frame.rs.

    python3 bench/profile_breakdown.py PROFILE...
"""
import struct
import sys

KINDS = ["Header", "Series", "Samples", "Markers", "Process", "ProcessExit", "Breakdown",
         "Source", "End", "NodeClock", "NodeIteration", "NodeHealth", "Experiment",
         "NodeReport", "NodeResources", "SampleRun", "NodeGpus", "NodeNics", "NodeMeta",
         "NodeCounters", "NodeRdma", "Hang", "SamplesThinned", "Deflated"]


def breakdown(path):
    data = open(path, "rb").read()
    pos, kinds = 9, {}
    while pos + 11 <= len(data):
        if data[pos:pos + 2] != b"SF":
            pos += 1
            continue
        (length,) = struct.unpack_from("<I", data, pos + 3)
        tag = data[pos + 11] if pos + 11 < len(data) else -1
        name = KINDS[tag] if 0 <= tag < len(KINDS) else f"#{tag}"
        n, b = kinds.get(name, (0, 0))
        kinds[name] = (n + 1, b + 11 + length)
        pos += 11 + length
    return len(data), kinds


def main():
    for path in sys.argv[1:]:
        total, kinds = breakdown(path)
        print(f"{path}: {total} bytes")
        for name, (n, b) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
            print(f"  {name:14} {n:7} frames {b:10} bytes {100 * b / total:5.1f}%")


if __name__ == "__main__":
    main()
