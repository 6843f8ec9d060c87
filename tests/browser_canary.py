"""Canaries for what Chromium sends by itself: a DNS server that records every name lookup, and a
loopback UDP and TCP listener that count whatever reaches them.

The browser's own resolver (its built-in DNS client or glibc's) cannot be patched from Python, so
the test launches Chromium through a wrapper (``browser_executable_path``) that gives it a mount
namespace in which ``/etc/resolv.conf`` names the recording server on 127.53.53.53 and
``/etc/nsswitch.conf`` asks only files and DNS (no mDNS multicast). Every lookup the browser makes
then lands here as a question answered "no such name", on any machine: nothing leaves loopback
even outside a network namespace. Needs root (port 53, bind mounts) and ``unshare``.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import threading
from pathlib import Path

DNS_ADDRESS = "127.53.53.53"


def unavailable() -> str | None:
    """Why the canaries cannot run here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the DNS canary needs root (port 53 and bind mounts)"
    if not shutil.which("unshare"):
        return "the DNS canary needs unshare (util-linux)"
    return None


def has_network_interface() -> bool:
    """Whether there is an interface besides loopback: without one WebRTC gathers no candidate and
    sends nothing, so a test of its UDP cannot fail (inside a loopback-only network namespace)."""
    return any(name != "lo" for _, name in socket.if_nameindex())


def _question(packet: bytes) -> str:
    labels, i = [], 12
    while i < len(packet) and packet[i]:
        labels.append(packet[i + 1:i + 1 + packet[i]].decode("ascii", "replace"))
        i += 1 + packet[i]
    return ".".join(labels)


class Canaries:
    """``names``: every DNS question asked; ``datagrams`` / ``connections``: what reached the listeners."""

    def __init__(self, workdir: Path, *, dns: bool = True):
        self.workdir = workdir
        self.names: list[str] = []
        self.datagrams: list[bytes] = []
        self.connections = 0
        self.dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if dns:
            self.dns.bind((DNS_ADDRESS, 53))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.udp_port = self.udp.getsockname()[1]
        self.tcp_port = self.tcp.getsockname()[1]
        self._stop = threading.Event()
        for sock in (self.dns, self.udp, self.tcp):
            sock.settimeout(0.2)  # the serving threads look at _stop this often
        serving = (self._serve_dns, self._serve_udp, self._serve_tcp) if dns else (self._serve_udp, self._serve_tcp)
        self._threads = [threading.Thread(target=f, daemon=True) for f in serving]

    def _serve_dns(self) -> None:
        while not self._stop.is_set():
            try:
                packet, peer = self.dns.recvfrom(4096)
            except TimeoutError:
                continue
            if len(packet) < 12:
                continue
            self.names.append(_question(packet))
            # NXDOMAIN, with the question echoed, so that resolvers stop at once instead of retrying.
            qdcount = struct.unpack("!H", packet[4:6])[0]
            self.dns.sendto(packet[:2] + b"\x81\x83" + struct.pack("!HHHH", qdcount, 0, 0, 0) + packet[12:], peer)

    def _serve_udp(self) -> None:
        while not self._stop.is_set():
            try:
                self.datagrams.append(self.udp.recvfrom(65536)[0])
            except TimeoutError:
                continue

    def _serve_tcp(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def wrap(self, executable: Path) -> Path:
        """A launcher that runs ``executable`` with the recording resolver (use as browser_executable_path)."""
        resolv, nss, script = self.workdir / "resolv.conf", self.workdir / "nsswitch.conf", self.workdir / "chromium"
        resolv.write_text(f"nameserver {DNS_ADDRESS}\noptions timeout:1 attempts:1\n")
        nss.write_text("hosts: files dns\n")
        script.write_text(
            "#!/bin/sh\n"
            f"exec unshare -m -- sh -c 'mount --bind {resolv} /etc/resolv.conf && mount --bind {nss} /etc/nsswitch.conf"
            f" && exec \"$0\" \"$@\"' {executable} \"$@\"\n")
        script.chmod(0o755)
        return script

    def __enter__(self) -> "Canaries":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2)
        for sock in (self.dns, self.udp, self.tcp):
            sock.close()
