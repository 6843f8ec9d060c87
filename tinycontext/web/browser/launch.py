"""Which browser the tools drive: a system Chromium found on PATH (or ``browser_executable_path``),
or an already running browser over CDP (``browser_cdp_url``). Playwright never downloads one here."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ...config import TinyContextConfig
from ...errors import ConfigError, MissingExtraError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

# Chromium keeps only the last --disable-features switch, so this list replaces Playwright's own: it
# repeats Playwright's (1.65) and adds what else made today's Chromium contact Google by itself
# (measured in a network namespace, notes/browser_network.md).
DISABLED_FEATURES = (
    # Playwright's list.
    "AvoidUnnecessaryBeforeUnloadCheckSync", "DestroyProfileOnBrowserClose", "HttpsUpgrades",
    "HttpsFirstBalancedModeAutoEnable", "LensOverlay", "MediaRouter", "PaintHolding", "ThirdPartyStoragePartitioning",
    "AvoidCorsURLLoaderRestartOnRedirect", "OptimizationHints", "NetworkTimeServiceQuerying", "AimEnabled",
    "PreconnectToSearch",
    # Ours: background fetches of models, hints, suggestions and certificates.
    "Translate", "OptimizationHintsFetching", "OptimizationGuideModelDownloading", "AutofillServerCommunication",
    "InterestFeedContentSuggestions", "DialMediaRouteProvider", "CertificateTransparencyComponentUpdater",
)
# Headless Chromium that talks to nobody but the pages it is sent to, and only through the guard's
# proxies (the browser-wide one refuses everything: see service.BrowserService._ensure_browser).
LAUNCH_ARGS = [
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--no-pings",
    "--dns-prefetch-disable",
    # No UDP: QUIC off, and WebRTC may use UDP only through a proxy that carries it (ours does not),
    # so a page's RTCPeerConnection sends nothing around the guard (measured: notes/browser_network.md).
    "--disable-quic",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    # The browser itself never resolves a name: pages reach hosts through the proxy, which resolves
    # them after the guard's check; anything else that asks gets "not found".
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--disable-features=" + ",".join(DISABLED_FEATURES),
]


def require_playwright():
    try:
        from playwright.async_api import async_playwright
    except ImportError as exc:
        raise MissingExtraError("The browser tools need Playwright: pip install 'tinycontext[browser]' "
                                "(it drives the system Chromium; no browser download needed).") from exc
    return async_playwright


def find_executable(config: TinyContextConfig) -> Path:
    """The Chromium binary to launch: the configured one, else the first on PATH."""
    if config.browser_executable_path is not None:
        path = config.browser_executable_path
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"browser_executable_path {path} is not an executable file.")
        return path
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return Path(found)
    raise ConfigError("No Chromium found on PATH (looked for " + ", ".join(CANDIDATES) + "). Install it "
                      "(Debian/Ubuntu: apt-get install chromium), or set browser_executable_path, or browser_cdp_url "
                      "to drive a running browser, or browser_backend=off.")


def sandboxed() -> bool:
    # Chromium refuses its sandbox to root; everyone else keeps it (pages are untrusted).
    return not (hasattr(os, "geteuid") and os.geteuid() == 0)


def describe(config: TinyContextConfig) -> tuple[str, dict]:
    """What ``tinycontext doctor`` says about the browser (nothing is launched or contacted)."""
    if config.browser_backend == "off":
        return "off (browser_backend=off): the browser tools are not offered", {"backend": "off"}
    require_playwright()
    from importlib.metadata import version

    details = {"backend": config.browser_backend, "playwright": version("playwright")}
    if config.browser_cdp_url:
        return (f"external browser over CDP at {config.browser_cdp_url} (Playwright {details['playwright']})",
                {**details, "cdp_url": config.browser_cdp_url})
    path = find_executable(config)
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
        browser_version = out.stdout.strip().splitlines()[0] if out.stdout.strip() else f"exit {out.returncode}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"Cannot run {path} --version: {exc}. Check browser_executable_path.") from exc
    sandbox = "sandboxed" if sandboxed() else "no sandbox (running as root)"
    return (f"{browser_version} at {path}, headless, {sandbox} (Playwright {details['playwright']})",
            {**details, "executable": str(path), "version": browser_version, "sandbox": sandboxed()})
