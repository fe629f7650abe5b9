#!/usr/bin/env python3
"""What fills a profile: bytes and frames per frame kind.

Reads the frame layout of collector/src/profile/mod.rs (`"SF" version:u8 len:u32le crc:u32le
payload`); a payload is a postcard-encoded `Frame`, whose first byte (a varint, < 128 for every
variant so far) names the variant, in the order of `Frame` in analysis/src/frame.rs.
The frames a `Deflated` packs are inflated and counted too, by their bytes before deflating. For a
run kept by `bench/run_cost.py --keep` (a `.json` summary beside it), it also prints the bytes of the
markers and breakdowns per rank-iteration.

    python3 bench/profile_breakdown.py PROFILE...
"""
import json
import os
import struct
import sys
import zlib

KINDS = ["Header", "Series", "Samples", "Markers", "Process", "ProcessExit", "Breakdown",
         "Source", "End", "NodeClock", "NodeIteration", "NodeHealth", "Experiment",
         "NodeReport", "NodeResources", "SampleRun", "NodeGpus", "NodeNics", "NodeMeta",
         "NodeCounters", "NodeRdma", "Hang", "NodeFlows", "SamplesThinned", "Deflated",
         "NodeHang", "IterationPack", "IterationTotals"]
DEFLATED = KINDS.index("Deflated")


def varint(data, pos):
    value, shift = 0, 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def name_of(tag):
    return KINDS[tag] if 0 <= tag < len(KINDS) else f"#{tag}"


def inner_kinds(payload, inner):
    """Counts the frames a Deflated payload packs: (frames, bytes before deflating) per kind."""
    length, at = varint(payload, 1)
    packed = zlib.decompress(payload[at:at + length], -15)
    pos = 0
    while pos + 4 <= len(packed):
        (n,) = struct.unpack_from("<I", packed, pos)
        name = name_of(packed[pos + 4]) if n else "?"
        k, b = inner.get(name, (0, 0))
        inner[name] = (k + 1, b + 4 + n)
        pos += 4 + n


def breakdown(path):
    data = open(path, "rb").read()
    pos, kinds, inner = 9, {}, {}
    while pos + 11 <= len(data):
        if data[pos:pos + 2] != b"SF":
            pos += 1
            continue
        (length,) = struct.unpack_from("<I", data, pos + 3)
        tag = data[pos + 11] if pos + 11 < len(data) else -1
        name = name_of(tag)
        n, b = kinds.get(name, (0, 0))
        kinds[name] = (n + 1, b + 11 + length)
        if tag == DEFLATED:
            inner_kinds(data[pos + 11:pos + 11 + length], inner)
        pos += 11 + length
    return len(data), kinds, inner


PER_ITERATION = {"Markers", "Breakdown", "IterationPack", "IterationTotals"}


def per_iteration_bytes(path):
    """The per-iteration frames' bytes (markers, breakdowns, their packs and totals): raw, and
    deflated as the writer's chunks hold them (each chunk's share deflated alone)."""
    data = open(path, "rb").read()
    pos, chunks = 9, []
    while pos + 11 <= len(data):
        if data[pos:pos + 2] != b"SF":
            pos += 1
            continue
        (length,) = struct.unpack_from("<I", data, pos + 3)
        payload = data[pos + 11:pos + 11 + length]
        if payload[0] == DEFLATED:
            n, at = varint(payload, 1)
            packed = zlib.decompress(payload[at:at + n], -15)
            p, keep = 0, b""
            while p + 4 <= len(packed):
                (m,) = struct.unpack_from("<I", packed, p)
                if m and name_of(packed[p + 4]) in PER_ITERATION:
                    keep += packed[p:p + 4 + m]
                p += 4 + m
            chunks.append(keep)
        elif name_of(payload[0]) in PER_ITERATION:
            chunks.append(payload)
        pos += 11 + length
    raw = sum(map(len, chunks))
    # zlib's header and checksum (6 bytes) are not in a Deflated frame.
    deflated = sum(len(zlib.compress(c, 6)) - 6 for c in chunks if c)
    return raw, deflated


def main():
    for path in sys.argv[1:]:
        summary = path.rsplit(".", 1)[0] + ".json"
        if os.path.exists(summary):
            # A run kept by bench/run_cost.py: per rank-iteration (warm-up included).
            with open(summary) as f:
                s = json.load(f)
            its = sum(r["iterations"] for r in s["ranks"]) + len(s["ranks"]) * s["warmup_iterations"]
            raw, deflated = per_iteration_bytes(path)
            print(f"{path}: {its} rank-iterations; their markers and breakdowns {raw} B raw, "
                  f"{deflated} B deflated: {raw / its:.0f} / {deflated / its:.0f} B each")
        total, kinds, inner = breakdown(path)
        print(f"{path}: {total} bytes")
        for name, (n, b) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
            print(f"  {name:14} {n:7} frames {b:10} bytes {100 * b / total:5.1f}%")
        if inner:
            raw = sum(b for _, b in inner.values())
            print(f"  inside Deflated, before deflating ({raw} bytes):")
            for name, (n, b) in sorted(inner.items(), key=lambda kv: -kv[1][1]):
                print(f"    {name:14} {n:7} frames {b:10} bytes {100 * b / raw:5.1f}%")


if __name__ == "__main__":
    main()
