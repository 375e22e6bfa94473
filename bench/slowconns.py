"""Holds N hostile connections to HOST:PORT for SECONDS: half slowloris (half a request header,
then one more header line every 2 s), half silent. Every connection the server closes is
reopened at once. Prints what it held and how many the server closed.

    python3 bench/slowconns.py 127.0.0.1:8080 10000 20
    python3 bench/slowconns.py 127.0.0.1:8081 10000 20 h2

With `h2` (a gRPC port) the slow half speaks HTTP/2 without ever calling: the client preface
and an empty SETTINGS frame, then a PING every 2 s; what the server sends is read and dropped.
"""
import errno
import selectors
import socket
import sys
import time

host, port = sys.argv[1].rsplit(":", 1)
n, seconds = int(sys.argv[2]), float(sys.argv[3])
h2 = len(sys.argv) > 4 and sys.argv[4] == "h2"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
PING = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"pingping"
sel = selectors.DefaultSelector()
socks = {}  # fd -> (socket, slow?)
closed = opened = failed = 0


def open_one(slow):
    global opened, failed
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((host, int(port)))
    except BlockingIOError:
        pass
    except OSError:
        failed += 1
        s.close()
        return
    socks[s.fileno()] = (s, slow)
    sel.register(s, selectors.EVENT_READ)
    opened += 1


for i in range(n):
    open_one(i % 2 == 0)
end = time.monotonic() + seconds
next_drip = time.monotonic() + 2
held = []
started = set()  # slowloris fds that sent their request line
while time.monotonic() < end:
    for key, _ in sel.select(timeout=0.1):
        s, slow = socks[key.fd]
        try:
            if s.recv(65536):
                continue  # the server spoke (HTTP/2 settings, pongs): still open
        except BlockingIOError:
            continue
        except OSError:
            pass
        del socks[key.fd]
        started.discard(key.fd)
        sel.unregister(s)
        s.close()
        closed += 1
        open_one(slow)
    if time.monotonic() >= next_drip:
        next_drip += 2
        for fd, (s, slow) in list(socks.items()):
            if not slow:
                continue
            try:
                if h2:
                    s.send(PING if fd in started else PREFACE)
                else:
                    s.send(b"X-a: b\r\n" if fd in started else b"GET / HTTP/1.1\r\nHost: h\r\n")
                started.add(fd)
            except OSError:
                pass
        held.append(len(socks))
print(f"held {min(held) if held else len(socks)}-{max(held) if held else len(socks)} connections; "
      f"the server closed {closed}; opened {opened}, failed {failed}")
