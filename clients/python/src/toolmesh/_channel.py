"""Channels to toolmesh, with the credentials the CLI reads from the environment."""

import os
from typing import Optional, Sequence, Tuple

import grpc

DEFAULT_SERVER = "127.0.0.1:50051"


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as file:
        return file.read()


def channel(target: Optional[str] = None, *, ca_cert: Optional[str] = None,
            client_cert: Optional[str] = None, client_key: Optional[str] = None,
            options: Sequence[Tuple[str, object]] = ()) -> grpc.Channel:
    """A channel to ``target`` (default ``TOOLMESH_SERVER``, else ``127.0.0.1:50051``).

    TLS, verified by the CA certificate file ``ca_cert`` (default ``TOOLMESH_CA_CERT``), when
    one is given: a router with ``[tls]``. ``client_cert`` and ``client_key`` (default
    ``TOOLMESH_CLIENT_CERT``, ``TOOLMESH_CLIENT_KEY``) add a client certificate for mutual
    TLS. Plaintext otherwise."""
    target = target or os.environ.get("TOOLMESH_SERVER") or DEFAULT_SERVER
    ca = _read(ca_cert or os.environ.get("TOOLMESH_CA_CERT"))
    if ca is None:
        return grpc.insecure_channel(target, options=list(options))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=_read(client_key or os.environ.get("TOOLMESH_CLIENT_KEY")),
        certificate_chain=_read(client_cert or os.environ.get("TOOLMESH_CLIENT_CERT")))
    return grpc.secure_channel(target, credentials, options=list(options))


def bearer(token: Optional[str] = None) -> Tuple[Tuple[str, str], ...]:
    """The ``authorization`` metadata of ``token`` (default ``TOOLMESH_TOKEN``): an API key
    or JWT for a router with ``[auth]``. Empty without one."""
    token = token if token is not None else os.environ.get("TOOLMESH_TOKEN", "")
    return (("authorization", f"Bearer {token}"),) if token else ()
