"""Refuse and record any socket connect, send or name lookup beyond 127.0.0.0/8 and ::1.

Kept free of pytest so that a ``sitecustomize`` can install it cheaply in every Python process a
test spawns (``guard_process``); ``netguard.loopback_only`` is the in-process pytest fixture.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable

_LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost"}


def is_loopback(host) -> bool:
    try:
        ip = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def install(setattr, violations: list[str], on_violation: Callable[[str], None] = lambda what: None) -> None:
    """Patch socket connects, sends and name lookups (through ``setattr``) to refuse anything beyond loopback."""
    real_connect, real_connect_ex, real_sendto = socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto
    real_getaddrinfo = socket.getaddrinfo

    def refuse(what: str, message: str):
        violations.append(what)
        on_violation(what)
        raise AssertionError(message)

    def check(sock, address, what):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not is_loopback(address[0]):
            refuse(f"{what} to {address!r}", f"test tried to reach {address!r} beyond loopback")

    def connect(sock, address):
        check(sock, address, "connect")
        return real_connect(sock, address)

    def connect_ex(sock, address):
        check(sock, address, "connect_ex")
        return real_connect_ex(sock, address)

    def sendto(sock, data, *args):
        check(sock, args[-1], "sendto")
        return real_sendto(sock, data, *args)

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and name.lower() not in _LOOPBACK_NAMES:
            try:
                ipaddress.ip_address(str(name).split("%")[0])
            except ValueError:
                refuse(f"DNS lookup of {name!r}", f"test tried to resolve {name!r} (DNS leaves loopback)")
        return real_getaddrinfo(host, *args, **kwargs)

    setattr(socket.socket, "connect", connect)
    setattr(socket.socket, "connect_ex", connect_ex)
    setattr(socket.socket, "sendto", sendto)
    setattr(socket, "getaddrinfo", getaddrinfo)


def guard_process(log_path: str) -> None:
    """The same guard for a whole child process (installed by a ``sitecustomize`` on its PYTHONPATH, so it
    reaches every Python process a tool spawns): each attempt is refused and appended to ``log_path``."""

    def record(what: str) -> None:
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {what}\n")

    install(setattr, [], record)
