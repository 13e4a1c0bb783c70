"""Single-flight across gateway processes, through Redis.

Replicas sharing one Redis coalesce identical concurrent misses (same scope, exact key
and variant): the first to claim the flight leads, running the upstream and appending
every chunk to a Redis stream; the others follow, reading that stream live. Keys, under
one hash tag so that Redis Cluster keeps a flight on one node:

    semgate:flight:{<id>}:lock     the leader's token, with a lease
    semgate:flight:{<id>}:<token>  the leader's stream: chunks, then one ending entry

Each leader writes a stream of its own, named after its token, so a follower never mixes
two leaders' chunks: neither a finished flight's lingering stream nor that of a new leader
that claimed after the first one died.

A dead leader: its lease (refreshed by a heartbeat, not only per chunk, so that a slow
first token does not look like death) runs out, and a follower that finds the lock gone
or held by another token, with no ending entry, raises FlightLost. Every Redis failure
fails open: a failed claim leads alone, a failed publish stops publishing (followers see
the flight lost), a failed read raises FlightLost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT

log = logging.getLogger(__name__)

T = TypeVar("T")
Codec = tuple[Callable[[Any], bytes], Callable[[bytes], Any]]  # (encode, decode) of a chunk

ENDINGS = ("end", "error", "lost")
# KEYS: lock, stream. ARGV: token, kind ('' = heartbeat: no entry), data, stream ttl, lease.
# An ending entry releases the lock in the same atomic step, so a follower that finds the
# lock released also finds the ending entry, if there is one. Only the holder's token
# refreshes or releases the lock.
_APPEND = """
if ARGV[2] ~= '' then redis.call('XADD', KEYS[2], '*', 'kind', ARGV[2], 'data', ARGV[3]) end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[2] == 'end' or ARGV[2] == 'error' or ARGV[2] == 'lost' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
  end
end
"""


class FlightLost(RuntimeError):
    """The leader stopped without finishing (its process died, it lost Redis, or every
    listener in its own process left): the follower did not get the whole answer."""


class FlightError(RuntimeError):
    """The leader's upstream failed; the message is the leader's error message."""


@dataclass(frozen=True)
class Claim:
    flight_id: str
    owner: str  # the leader's token
    leader: bool  # this process leads (also when Redis failed: fail open)
    shared: bool = True  # False when Redis failed: lead alone, publish nothing


async def aclose(stream: AsyncIterator[Any]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


class SharedFlights:
    def __init__(
        self,
        client: aioredis.Redis,
        lease: float = 30.0,
        linger: float = 30.0,
        poll: float = 1.0,
        stall: float | None = None,
        timeout: float = 1.0,
    ) -> None:
        """`client` must return bytes (no decode_responses), with a socket timeout above
        `poll` (each XREAD blocks up to `poll`). A dead leader is noticed within `lease` +
        `poll`; a finished stream lingers `linger` seconds for followers still reading.
        `stall`: also give up after that long without an entry (off by default: a live
        leader is waited for, as in-process, however slow its upstream). A claim or a
        publish slower than `timeout` fails (open), so a hung Redis never holds up a leader."""
        self.client = client
        self.lease, self.linger, self.poll, self.stall = lease, linger, poll, stall
        self.timeout = timeout
        self._append = client.register_script(_APPEND)

    @staticmethod
    def flight_id(exact_key: str, variant: Hashable = None) -> str:
        """Joins identical questions only: the exact key (scope + normalised prompt) and
        the variant's repr, which must read the same in every process (str, int, None,
        tuples of them)."""
        return hashlib.sha256(f"{exact_key}\0{variant!r}".encode()).hexdigest()[:32]

    @staticmethod
    def _keys(flight_id: str, owner: str) -> list[str]:
        """[lock, stream]; `{id}` is a Redis Cluster hash tag: one slot for both."""
        base = f"semgate:flight:{{{flight_id}}}"
        return [f"{base}:lock", f"{base}:{owner}"]

    async def claim(self, flight_id: str) -> Claim:
        """Leads if no one does, else names the leader. Never raises: on a Redis failure
        this process leads alone."""
        token = uuid.uuid4().hex
        lock = self._keys(flight_id, token)[0]
        try:  # SET NX GET (Redis 7): takes the lock, or reads its holder, in one step
            async with asyncio.timeout(self.timeout):
                held = await self.client.set(
                    lock, token, nx=True, px=int(self.lease * 1000), get=True
                )
        except Exception as exc:
            log.warning("shared flight claim failed open (leading alone): %r", exc)
            return Claim(flight_id, token, leader=True, shared=False)
        holder = cast(bytes | None, held)  # the client returns bytes (no decode_responses)
        if holder is None:
            return Claim(flight_id, token, leader=True)
        return Claim(flight_id, holder.decode(), leader=False)

    async def publish(
        self, claim: Claim, chunks: AsyncIterator[T], encode: Callable[[T], bytes]
    ) -> AsyncIterator[T]:
        """Passes `chunks` through, appending each to the stream once handed on, then an
        ending: 'end', 'error' (the exception's message) or 'lost' (closed or cancelled
        first); releases the lock. Publishing stops for good at the first failure, so a
        stream never has a gap: what followers read is always a prefix of the answer."""
        beat = asyncio.get_running_loop().create_task(self._heartbeat(claim))
        live, ending, message = True, "lost", "every listener of the leader's flight left"
        try:
            async for chunk in chunks:
                yield chunk
                if live and not await self._add(claim, "chunk", chunk, encode):
                    live = False
                    beat.cancel()
                    await self._add(claim, "lost", "the leader could not publish")
            ending, message = "end", ""
        except Exception as exc:
            ending, message = "error", str(exc) or type(exc).__name__
            raise
        finally:
            beat.cancel()
            if live:
                await self._add(claim, ending, message)
            await aclose(chunks)

    async def _heartbeat(self, claim: Claim) -> None:
        while True:  # a failed beat is only logged: the next one may succeed
            await asyncio.sleep(self.lease / 3)
            await self._add(claim, "")

    async def _add(
        self, claim: Claim, kind: str, value: Any = "", encode: Callable[[Any], bytes] = str.encode
    ) -> bool:
        """Appends one entry and keeps the lease, or ends the flight; False on failure."""
        ttl = self.linger if kind in ENDINGS else self.lease
        args: list[EncodableT] = [claim.owner, kind, b"", int(ttl * 1000), int(self.lease * 1000)]
        try:
            args[2] = encode(value)
            keys = self._keys(claim.flight_id, claim.owner)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the flight's
            # cancellation when the reply lands at the same moment, leaving the upstream
            # running with no one listening.
            async with asyncio.timeout(self.timeout):
                await self._append(keys=keys, args=args)
        except Exception as exc:
            log.warning("shared flight %s: %s not published: %r", claim.flight_id, kind, exc)
            return False
        return True

    async def follow(self, claim: Claim) -> AsyncIterator[bytes]:
        """The leader's chunks until its ending. Reads from id 0, so a follower that joins
        late first replays every chunk it missed, then reads live. Raises FlightError with
        the leader's message if its upstream failed, FlightLost if the leader stopped
        without an ending (lock gone or taken over, `stall` passed, or Redis failed)."""
        lock, stream = self._keys(claim.flight_id, claim.owner)
        loop = asyncio.get_running_loop()
        last, since = b"0", loop.time()
        while True:
            try:
                entries = await self._read(stream, last, block=True)
                if not entries:
                    if await self.client.get(lock) != claim.owner.encode():
                        # Released: the ending, if written, is there now (same atomic step).
                        entries = await self._read(stream, last, block=False)
                        if not entries:
                            raise FlightLost("the leader stopped before finishing")
                    elif self.stall is not None and loop.time() - since > self.stall:
                        raise FlightLost(f"the leader sent nothing for {self.stall:g}s")
            except (RedisError, OSError) as exc:
                raise FlightLost(f"cannot read the leader's stream: {exc!r}") from exc
            if entries:
                since = loop.time()
            for entry_id, fields in entries:
                last, kind, data = entry_id, fields[b"kind"], fields[b"data"]
                if kind == b"chunk":
                    yield data
                elif kind == b"end":
                    return
                elif kind == b"error":
                    raise FlightError(data.decode(errors="replace"))
                else:
                    raise FlightLost(data.decode(errors="replace"))

    async def _read(self, stream: str, last: bytes, block: bool) -> list[Any]:
        wait = int(self.poll * 1000) if block else None
        # [[stream, entries]] as RESP2 replies, or None when `block` passed with nothing.
        reply = cast(list[list[Any]] | None, await self.client.xread({stream: last}, block=wait))
        return reply[0][1] if reply else []
