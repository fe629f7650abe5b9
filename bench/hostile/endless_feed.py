"""A collector that welcomes a viewer and then sends feed parts that never say `last`
(issue 30, item 6): before the fix `stallscope feed HOST:PORT` buffered them without bound
(412 MB in 1.3 s); now it stops at 64 MiB and says so.

usage: python3 bench/hostile/endless_feed.py PORT &
       /usr/bin/time -v stallscope feed 127.0.0.1:PORT --token-file <any file>
"""
import socket
import struct
import sys


def msg(payload):
    return struct.pack(">I", len(payload)) + payload


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(1)
c, _ = srv.accept()
c.sendall(msg(bytes([5]) + varint(32) + b"n" * 32))  # Challenge
n = struct.unpack(">I", c.recv(4))[0]
c.recv(n)  # the viewer's Watch
c.sendall(msg(bytes([0]) + varint(4) + b"test"))  # Welcome
part = msg(bytes([4]) + varint(256 * 1024) + b"x" * (256 * 1024) + b"\x00")  # Feed, last=false
sent = 0
try:
    while sent < (1 << 30):
        c.sendall(part)
        sent += 256 * 1024
except OSError:
    pass
print("sent MiB", sent >> 20)
