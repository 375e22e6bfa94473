"""TLS to nodes that serve their HTTP and gRPC ports with ``--tls-cert``: what the client
trusts (a CA's PEM, or the system's roots), the name it checks the nodes' certificates against,
and the channels and HTTPS context built from them.

The nodes ask for no client certificate on those ports (a client proves who it is with its
token), so there is no client certificate here."""

from __future__ import annotations

import os
import ssl
from typing import Any, List, Optional, Tuple, Union

import grpc
import grpc.aio

#: What ``tls_ca`` may be: a file's path, or the PEM itself (bytes, or text that starts as PEM).
CaSource = Union[str, "os.PathLike[str]", bytes]

_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
#: The SDK dials members itself: a proxy from the environment would be a detour.
_NO_PROXY: List[Tuple[str, Any]] = [("grpc.enable_http_proxy", 0)]


def read_ca(ca: CaSource) -> bytes:
    """The PEM bundle ``ca`` names or is; :class:`ValueError` when it cannot be read or holds
    no certificate."""
    if isinstance(ca, bytes):
        pem, what = ca, "tls_ca (PEM bytes)"
    elif isinstance(ca, str) and ca.lstrip().startswith("-----BEGIN"):
        pem, what = ca.encode("ascii", "replace"), "tls_ca (PEM text)"
    else:
        what = f"tls_ca {os.fspath(ca)!r}"
        try:
            with open(ca, "rb") as f:
                pem = f.read()
        except OSError as e:
            raise ValueError(f"{what}: cannot read it: {e}") from e
    if _PEM_CERT not in pem:
        raise ValueError(f"{what} holds no PEM certificate")
    return pem


class _NamedContext(ssl.SSLContext):
    """Checks every server's certificate against one name, whatever host was dialed
    (``urllib`` has no option for it; its HTTPS handler passes the URL's host here)."""

    server_name = ""

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["server_hostname"] = self.server_name
        return super().wrap_socket(sock, *args, **kwargs)


class Tls:
    """A client's TLS: gRPC channel credentials and options, and an HTTPS context for
    discovery, both trusting ``ca`` (the system's roots when ``None``) and checking the
    nodes' certificates against ``server_name`` when given (else against the host dialed: a
    member's advertised IP must then be in its certificate)."""

    def __init__(self, ca: Optional[CaSource] = None, server_name: Optional[str] = None) -> None:
        self.ca_pem: Optional[bytes] = read_ca(ca) if ca is not None else None
        self.server_name = server_name or None
        self.credentials = grpc.ssl_channel_credentials(root_certificates=self.ca_pem)
        self.options: List[Tuple[str, Any]] = list(_NO_PROXY)
        if self.server_name:
            # The name checked, and sent as SNI, for every member dialed.
            self.options.append(("grpc.ssl_target_name_override", self.server_name))
        ctx: ssl.SSLContext
        if self.server_name:
            named = _NamedContext(ssl.PROTOCOL_TLS_CLIENT)
            named.server_name = self.server_name
            ctx = named
        else:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            if self.ca_pem is not None:
                ctx.load_verify_locations(cadata=self.ca_pem.decode("ascii", "replace"))
            else:
                ctx.load_default_certs()
        except (ssl.SSLError, ValueError) as e:
            raise ValueError(f"tls_ca: not a usable PEM bundle: {e}") from e
        self.context = ctx


def channel(addr: str, tls: Optional[Tls]) -> grpc.Channel:
    """A channel to ``addr`` (``host:port``): over TLS with ``tls``, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(addr, options=_NO_PROXY)
    return grpc.secure_channel(addr, tls.credentials, options=tls.options)


def aio_channel(addr: str, tls: Optional[Tls]) -> grpc.aio.Channel:
    """:func:`channel` for ``grpc.aio``."""
    if tls is None:
        return grpc.aio.insecure_channel(addr, options=_NO_PROXY)
    return grpc.aio.secure_channel(addr, tls.credentials, options=tls.options)
