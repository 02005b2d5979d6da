"""uvicorn's h11 protocol with a deadline for every request's line and headers: a connection that has not sent
them within `header_timeout_s` of opening (or of its previous response) is closed, so clients that trickle headers
(slowloris) cannot hold connections open. uvicorn itself only times out idle keep-alive connections."""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class BoundedH11Protocol(H11Protocol):
    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.header_timer: asyncio.TimerHandle | None = None
        self.arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.arm_header_timer()  # the next request on this connection gets the same time for its headers

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete and self.header_timer is not None:
            self.header_timer.cancel()  # a request's headers are in: the body has SIEVE_BODY_TIMEOUT_S
            self.header_timer = None

    def shutdown(self) -> None:
        """On SIGTERM: a connection still sending its request body is closed at once (its request has not started:
        nobody is owed an answer; uvicorn would wait for it until SIEVE_BODY_TIMEOUT_S). Idle connections are closed
        and requests whose body is in are answered, as uvicorn does."""
        if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.SEND_BODY:
            self.transport.close()
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        super().connection_lost(exc)

    def arm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        self.header_timer = self.loop.call_later(self.header_timeout_s, self.on_header_timeout)

    def on_header_timeout(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def bounded_h11(header_timeout_s: float) -> type[BoundedH11Protocol]:
    """The protocol class to hand uvicorn (`http=`), with this server's header deadline."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"header_timeout_s": header_timeout_s})
