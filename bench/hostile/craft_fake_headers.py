"""A crafted profile for the reader's resynchronisation (issue 30, item 4): N fake frame
headers, each claiming a payload just under 16 MiB, then 16 MiB of filler. Before the fix each
candidate cost a 16 MiB CRC (17.6 s for 200 of them); now checksum work is linear in the file.

usage: python3 bench/hostile/craft_fake_headers.py N OUT.stallscope
       /usr/bin/time -f "%e s %M KB" target/release/stallscope summary OUT.stallscope
"""
import struct
import sys

n, out = int(sys.argv[1]), sys.argv[2]
claimed = 16 * 1024 * 1024 - 65536
with open(out, "wb") as f:
    f.write(b"SSPROF\r\n\x02")
    for _ in range(n):
        f.write(b"SF\x02" + struct.pack("<I", claimed) + b"\xee" * 4)
    f.write(b"x" * (16 * 1024 * 1024))
