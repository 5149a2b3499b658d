"""libtorrent sessions configured the way moepack uses them, and alert handling.

Gotchas encoded here: several loopback peers share one IP, so multiple connections per IP
must be allowed; alert objects die at the next pop_alerts(), so only copied values leave
`drain()`; on a loopback listen address DHT/LSD/UPnP/NAT-PMP are pointless and are switched off,
and so is uTP: its delay-based congestion control crawls on loopback (150 MB with 128 KiB
pieces: 26.7 s over uTP, 3.5 s over TCP, same run).
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field

import libtorrent as lt
from moepack.fetch.errors import FetchError

from moepack.safefs import one_line, printable

POLL_S = 0.2              # status / alert polling interval of the transfer loops
RECONNECT_EVERY_S = 3.0   # re-dial --peer addresses while none is connected (seeder starting)

_ALERTS = (
    lt.alert.category_t.error_notification
    | lt.alert.category_t.status_notification
    | lt.alert.category_t.storage_notification
    | lt.alert.category_t.piece_progress_notification
    | lt.alert.category_t.peer_notification   # peer_ban_alert: who sent data that failed
)
MAX_TROUBLE_CHARS = 160   # a web seed's reason phrase is the server's text: bounded
MAX_NAMED = 3             # web seeds and banned peers named in one line; the rest are counted


def parse_endpoint(text: str, what: str) -> tuple[str, int]:
    """'HOST:PORT' or '[v6]:PORT' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise FetchError(f"{what} {text!r}: expected HOST:PORT")
    return host, int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def make_session(listen: str, *, discovery: bool | None = None,
                 exact_port: bool = False) -> lt.session:
    """A session listening on `listen` (HOST:PORT). Discovery defaults to off on loopback.
    `exact_port`: a busy port is an error (listen_port raises) instead of libtorrent moving
    on to the next free one, which a seeder behind a forwarded port would never be reached on."""
    host, port = parse_endpoint(listen, "listen address")
    loopback = is_loopback(host)
    if discovery is None:
        discovery = not loopback
    iface = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    settings = {
        "listen_interfaces": iface,
        "enable_dht": discovery,
        "enable_lsd": discovery,
        "enable_upnp": discovery,
        "enable_natpmp": discovery,
        "allow_multiple_connections_per_ip": True,
        "enable_outgoing_utp": not loopback,
        "enable_incoming_utp": not loopback,
        "alert_mask": _ALERTS,
        "user_agent": "moepack",
        "peer_fingerprint": "-MP0100-",
    }
    if exact_port and port:
        settings.update(max_retry_port_bind=0, listen_system_port_fallback=False)
    return lt.session(settings)


def listen_port(ses: lt.session, timeout: float = 10.0) -> int:
    """The bound port (known only once the listen socket is open)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        port = ses.listen_port()
        if port:
            return int(port)
        for a in drain(ses).errors:
            raise FetchError(f"cannot listen: {a}")
        time.sleep(0.05)
    raise FetchError(f"no listening socket after {timeout:.0f} s")


@dataclass
class Alerts:
    """Copied facts from one pop_alerts() batch."""

    errors: list[str] = field(default_factory=list)
    resume_data: list[bytes] = field(default_factory=list)
    resume_failed: list[str] = field(default_factory=list)
    pieces_finished: int = 0
    hash_failures: int = 0
    metadata: bool = False
    checked: bool = False
    removed: bool = False
    web_seed_errors: list[tuple[str, str]] = field(default_factory=list)   # (URL, why)
    banned: list[str] = field(default_factory=list)     # HOST:PORT of peers banned for bad data


def drain(ses: lt.session) -> Alerts:
    out = Alerts()
    for a in ses.pop_alerts():
        if isinstance(a, lt.save_resume_data_alert):
            out.resume_data.append(bytes(lt.write_resume_data_buf(a.params)))
        elif isinstance(a, lt.save_resume_data_failed_alert):
            out.resume_failed.append(a.message())
        elif isinstance(a, lt.piece_finished_alert):
            out.pieces_finished += 1
        elif isinstance(a, lt.hash_failed_alert):
            out.hash_failures += 1
        elif isinstance(a, lt.url_seed_alert):   # the HTTP status is in error_message
            out.web_seed_errors.append((a.server_url(), a.error_message() or a.error.message()))
        elif isinstance(a, lt.peer_ban_alert):
            host, port = a.ip
            out.banned.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        elif isinstance(a, lt.metadata_received_alert):
            out.metadata = True
        elif isinstance(a, lt.torrent_checked_alert):
            out.checked = True
        elif isinstance(a, lt.torrent_removed_alert):
            out.removed = True
        elif isinstance(a, (lt.file_error_alert, lt.torrent_error_alert, lt.metadata_failed_alert,
                            lt.listen_failed_alert)):
            out.errors.append(a.message())
    return out


@dataclass
class Trouble:
    """What the sources did wrong during a transfer, to say why no data came."""

    web_seeds: dict[str, str] = field(default_factory=dict)   # URL -> its last failure
    banned: set[str] = field(default_factory=set)
    hash_failures: int = 0

    def add(self, a: Alerts) -> None:
        self.web_seeds.update(a.web_seed_errors)
        self.banned.update(a.banned)
        self.hash_failures += a.hash_failures

    def __str__(self) -> str:
        said = [f"web seed {printable(url, MAX_TROUBLE_CHARS)} failed: "
                f"{one_line(why[:MAX_TROUBLE_CHARS])}"
                for url, why in list(self.web_seeds.items())[:MAX_NAMED]]
        if len(self.web_seeds) > MAX_NAMED:
            said.append(f"{len(self.web_seeds) - MAX_NAMED} more web seeds failed")
        if self.hash_failures:
            who = f" (sent by {_some(sorted(self.banned))}, now banned)" if self.banned else ""
            said.append(f"{self.hash_failures} piece(s) received failed their hash check{who}")
        return "; ".join(said)


def _some(names: list[str]) -> str:
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return ", ".join(names[:MAX_NAMED]) + more


def connect_peers(handle: lt.torrent_handle, peers: list[tuple[str, int]]) -> None:
    for host, port in peers:
        handle.connect_peer((host, port))
