"""An authoritative DNS server for the world, over UDP and TCP, in dnspython's wire format.

It answers every name in the world itself (no delegation, no recursion): domains get their MX,
A/AAAA and TXT records, hosts their A (or AAAA) record, everything else NXDOMAIN. A name that
exists but lacks the asked type is NOERROR with no data; both negative answers carry an SOA so
resolvers can cache them for the TTL, as they would with a real zone. An alias (a domain with
``cname``) is answered like an authoritative server does: the CNAME chain in the answer
section, followed until it leaves the world, loops, or reaches ``MAX_CNAME_CHAIN`` links,
then the asked records of the last name. An answer too big for UDP is sent truncated (TC)
so the resolver retries over TCP; one too big even for TCP is a SERVFAIL.
"""

from __future__ import annotations

import asyncio
import ipaddress
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.CNAME
import dns.rdtypes.ANY.MX
import dns.rdtypes.ANY.SOA
import dns.rdtypes.ANY.TXT
import dns.rdtypes.IN.A
import dns.rdtypes.IN.AAAA
import dns.rrset

from verimail.testbed.world import World, is_ip_literal, normalise_name

IN = dns.rdataclass.IN
MAX_CNAME_CHAIN = 32  # links the server follows itself; a resolver gives up sooner (16)
SOA_MNAME = dns.name.from_text("ns.verimail-testbed.test.")
SOA_RNAME = dns.name.from_text("hostmaster.verimail-testbed.test.")


@dataclass
class Authority:
    """The world plus the address of every host: all a lookup needs, swapped as one object."""

    world: World
    addresses: Mapping[str, str]

    def _ips(self, target: str) -> list[str]:
        """Addresses a name in an ``a`` list stands for (a literal, or a host's address)."""
        if is_ip_literal(target):
            return [target]
        address = self.addresses.get(target)
        return [address] if address else []

    def answer(self, query: dns.message.Message) -> tuple[dns.message.Message, float]:
        """The response to ``query`` and how long to wait before sending it."""
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        world = self.world
        if query.opcode() != dns.opcode.QUERY:
            response.set_rcode(dns.rcode.NOTIMP)
            return response, 0.0
        if len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
            return response, 0.0
        question = query.question[0]
        qname, rdtype = question.name, question.rdtype
        name = normalise_name(qname.to_text())
        domain = world.domains.get(name)
        host = world.hosts.get(name)
        zone = self._zone_of(name)
        zone_spec = world.domains.get(zone)
        delay = world.dns_delay
        ttl = world.dns_ttl
        if zone_spec is not None:
            delay = zone_spec.dns_delay if zone_spec.dns_delay is not None else delay
            ttl = zone_spec.ttl if zone_spec.ttl is not None else ttl
        if domain is not None and domain.cname is not None and rdtype != dns.rdatatype.CNAME:
            return self._alias(query, response, name, ttl), delay
        if domain is not None and domain.servfail:
            response.set_rcode(dns.rcode.SERVFAIL)
            response.flags &= ~dns.flags.AA
            return response, delay
        if domain is None and host is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
            response.authority.append(self._soa(zone, ttl))
            return response, delay

        rdatas: list[dns.rdata.Rdata] = []
        ips: list[str] = []
        if domain is not None:
            for target in domain.a:
                ips += self._ips(target)
        if host is not None:
            ips += self._ips(host.name)
        if rdtype == dns.rdatatype.MX and domain is not None:
            for pref, target in domain.mx:
                exchange = dns.name.root if target == "." else dns.name.from_text(target + ".")
                rdatas.append(dns.rdtypes.ANY.MX.MX(IN, rdtype, pref, exchange))
        elif rdtype == dns.rdatatype.A:
            for ip in dict.fromkeys(ips):
                if ipaddress.ip_address(ip).version == 4:
                    rdatas.append(dns.rdtypes.IN.A.A(IN, rdtype, ip))
        elif rdtype == dns.rdatatype.AAAA:
            for ip in dict.fromkeys(ips):
                if ipaddress.ip_address(ip).version == 6:
                    rdatas.append(dns.rdtypes.IN.AAAA.AAAA(IN, rdtype, ip))
        elif rdtype == dns.rdatatype.TXT and domain is not None:
            for text in domain.txt:
                data = text.encode()
                chunks = [data[i : i + 255] for i in range(0, len(data), 255)] or [b""]
                rdatas.append(dns.rdtypes.ANY.TXT.TXT(IN, rdtype, chunks))
        elif rdtype == dns.rdatatype.CNAME and domain is not None and domain.cname is not None:
            rdatas.append(self._cname_rdata(domain.cname))
        elif rdtype == dns.rdatatype.SOA and domain is not None:
            response.answer.append(self._soa(name, ttl))
            return response, delay

        if rdatas:
            rrset = dns.rrset.RRset(qname, IN, rdtype)
            for rdata in rdatas:
                rrset.add(rdata, ttl)
            response.answer.append(rrset)
        else:
            response.authority.append(self._soa(zone, ttl))
        return response, delay

    @staticmethod
    def _cname_rdata(target: str) -> dns.rdata.Rdata:
        return dns.rdtypes.ANY.CNAME.CNAME(
            IN, dns.rdatatype.CNAME, dns.name.from_text(target + ".")
        )

    def _alias(
        self, query: dns.message.Message, response: dns.message.Message, name: str, ttl: int
    ) -> dns.message.Message:
        """The CNAME chain from ``name``, then the asked records of where it ends."""
        question = query.question[0]
        current, seen = name, set()
        while len(seen) < MAX_CNAME_CHAIN:
            spec = self.world.domains.get(current)
            if spec is None or spec.cname is None or current in seen:
                break
            seen.add(current)
            rrset = dns.rrset.RRset(dns.name.from_text(current + "."), IN, dns.rdatatype.CNAME)
            rrset.add(self._cname_rdata(spec.cname), ttl)
            response.answer.append(rrset)
            current = spec.cname
        spec = self.world.domains.get(current)
        if spec is not None and spec.cname is not None:
            return response  # a loop (or a very long chain): the chain is all there is
        tail, _ = self.answer(dns.message.make_query(current + ".", question.rdtype))
        response.answer.extend(tail.answer)
        if not tail.answer:
            response.authority.extend(tail.authority)
        if tail.rcode() != dns.rcode.NOERROR:
            response.set_rcode(tail.rcode())
        return response

    def _zone_of(self, name: str) -> str:
        """The world domain ``name`` lies in, else its last two labels (e.g. ``acme.test``)."""
        labels = name.split(".")
        for i in range(len(labels)):
            candidate = ".".join(labels[i:])
            if candidate in self.world.domains:
                return candidate
        return ".".join(labels[-2:])

    @staticmethod
    def _soa(zone: str, ttl: int) -> dns.rrset.RRset:
        owner = dns.name.from_text(zone + ".") if zone and zone != "." else dns.name.root
        soa = dns.rdtypes.ANY.SOA.SOA(
            IN, dns.rdatatype.SOA, SOA_MNAME, SOA_RNAME, 1, 3600, 600, 86400, ttl
        )
        rrset = dns.rrset.RRset(owner, IN, dns.rdatatype.SOA)
        rrset.add(soa, ttl)
        return rrset


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: DnsServer) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.server.spawn(self._reply(data, addr))

    async def _reply(self, data: bytes, addr: tuple[str, int]) -> None:
        result = await self.server.handle(data)
        if result is None or self.transport is None or self.transport.is_closing():
            return
        response, query = result
        limit = max(512, query.payload) if query.edns >= 0 else 512
        try:
            wire = response.to_wire(max_size=limit)
        except dns.exception.TooBig:
            # Classic truncation: an empty answer with TC set tells the client to retry on TCP.
            response.answer.clear()
            response.authority.clear()
            response.additional.clear()
            response.flags |= dns.flags.TC
            wire = response.to_wire()
        self.transport.sendto(wire, addr)


class DnsServer:
    """Serves an ``Authority`` on a bound UDP socket and a bound, listening TCP socket."""

    def __init__(self, authority: Authority, on_query: Callable[[str, str], None]) -> None:
        self.authority = authority
        self.on_query = on_query
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    def spawn(self, coro: object) -> None:
        """Run a reply in its own task so one delayed answer never holds up the others."""
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def handle(self, data: bytes) -> tuple[dns.message.Message, dns.message.Message] | None:
        """Parse, count, wait out the configured delay, answer; None for undecodable junk."""
        try:
            query = dns.message.from_wire(data)
        except Exception:
            return None
        if query.question:
            q = query.question[0]
            self.on_query(normalise_name(q.name.to_text()), dns.rdatatype.to_text(q.rdtype))
        response, delay = self.authority.answer(query)
        if delay > 0:
            await asyncio.sleep(delay)
        return response, query

    async def start(self, udp_sock: object, tcp_sock: object) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _UdpProtocol(self),
            sock=udp_sock,  # type: ignore[arg-type]
        )
        self._udp = transport
        self._tcp = await asyncio.start_server(self._serve_tcp, sock=tcp_sock)  # type: ignore[arg-type]

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """RFC 7766: length-prefixed messages, several per connection, answered in order."""
        self._writers.add(writer)
        try:
            while True:
                try:
                    (length,) = struct.unpack("!H", await reader.readexactly(2))
                    data = await reader.readexactly(length)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                result = await self.handle(data)
                if result is None:
                    return
                try:
                    wire = result[0].to_wire()
                except dns.exception.TooBig:  # over 64 KiB: no transport can carry it
                    failure = dns.message.make_response(result[1])
                    failure.set_rcode(dns.rcode.SERVFAIL)
                    wire = failure.to_wire()
                writer.write(struct.pack("!H", len(wire)) + wire)
                await writer.drain()
        except ConnectionError:
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def stop(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._tcp is not None:
            await self._tcp.wait_closed()
            self._tcp = None
