"""Worker discovery by DNS (`[worker] discovery = "dns"`): the workers are the addresses a name resolves to.

A headless Kubernetes Service answers its name with one A (or AAAA) record per ready pod, so
scaling the worker StatefulSet changes the answer. `DnsDiscovery.run` looks the name up every
`resolve_interval_ms`, and sooner when the pool asks (`resolve_soon`: a worker was lost), and hands
the pool the set of endpoints (`tcp://ip:port`) each time: the pool connects to new ones and retires
the ones gone (gateway/worker_pool.py). A lookup that fails (a timeout, a server error) changes
nothing: the workers known stay known until a lookup answers without them. A name that does not
exist (NXDOMAIN) or has no address is an answer: no worker.

dnspython's asyncio resolver asks the configured servers (`nameservers`) or the system's
(/etc/resolv.conf); the loop's getaddrinfo could not be pointed at a server of our choosing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

from shared.config import WorkerConfig, nameserver_address

log = logging.getLogger("gateway.discovery")
LOOKUP_TIMEOUT_S = 2.0
"""Longest one lookup (both record types, retries included) may take."""
MIN_GAP_S = 0.2
"""Lookups asked for by `resolve_soon` come no closer together than this (a lost worker is seen by
every link at once)."""
RECORD_TYPES = ("A", "AAAA")


def endpoint_of(address: str, port: int) -> str:
    """The ZeroMQ endpoint of a worker at `address` (IPv6 in brackets)."""
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"tcp://{host}:{port}"


class LookupFailed(Exception):
    """The name could not be looked up now (no server answered, or one answered with an error)."""


class DnsDiscovery:
    """Looks up `service` now and then and hands the endpoints found to `on_endpoints`."""

    def __init__(self, service: str, port: int, interval_s: float, nameservers: tuple[str, ...] = ()) -> None:
        self.service, self.port, self.interval_s = service, port, interval_s
        self._nameservers = nameservers
        self._soon = asyncio.Event()
        self.lookups = 0
        """Lookups answered so far (found addresses or found none)."""

    @classmethod
    def of(cls, config: WorkerConfig) -> DnsDiscovery | None:
        """The discovery `config` asks for; None for a static list of endpoints."""
        if config.discovery != "dns":
            return None
        return cls(config.service, config.service_port, config.resolve_interval_ms / 1000.0, config.nameservers)

    def resolve_soon(self) -> None:
        """Look the name up again now (within MIN_GAP_S), not at the next interval."""
        self._soon.set()

    async def run(self, on_endpoints: Callable[[frozenset[str]], None]) -> None:
        """Forever: look up, hand over what was found, wait for the interval or `resolve_soon`."""
        resolver: dns.asyncresolver.Resolver | None = None
        while True:
            try:
                resolver = resolver or self._resolver()  # reads /etc/resolv.conf: it may be missing for now
                on_endpoints(await self.resolve(resolver))
            except (LookupFailed, dns.exception.DNSException) as exc:
                log.warning("looking up the workers at %s failed (%s); keeping the workers known", self.service, exc)
            await asyncio.sleep(MIN_GAP_S)
            try:
                await asyncio.wait_for(self._soon.wait(), max(0.0, self.interval_s - MIN_GAP_S))
            except TimeoutError:
                pass
            self._soon.clear()

    async def resolve(self, resolver: dns.asyncresolver.Resolver) -> frozenset[str]:
        """The endpoints the name resolves to now; LookupFailed when it cannot be told."""
        addresses: set[str] = set()
        for record_type in RECORD_TYPES:
            try:
                answer = await resolver.resolve(self.service, record_type, search=True, lifetime=LOOKUP_TIMEOUT_S)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue  # no such name, or no record of this type: no worker there
            except dns.exception.DNSException as exc:
                raise LookupFailed(f"{record_type}: {type(exc).__name__}: {exc}") from None
            addresses.update(record.address for record in answer)
        self.lookups += 1
        return frozenset(endpoint_of(address, self.port) for address in addresses)

    def _resolver(self) -> dns.asyncresolver.Resolver:
        """The system's resolver, or one that asks `nameservers` alone."""
        if not self._nameservers:
            return dns.asyncresolver.Resolver()
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver(*nameserver_address(s)) for s in self._nameservers]
        return resolver
