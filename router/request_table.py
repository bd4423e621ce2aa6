"""The live requests of the router core by id, and the one owner of request-id reuse.

The ids the workers see (core ids) are the router's, never a client's alone: each carries this
router's own random tag, drawn at its start, so that no request of a client of this router is
ever matched to a request of another router, or of this router's predecessor, that the workers
still hold (a client may send any X-Request-Id, and may repeat another client's).
Workers remember an ended request's id for lifecycle.state_ttl_s and drop whatever arrives for it,
so an id is never used again within that time (plus a margin for messages still in flight):
- the core refuses a request id that is live, reserved or ended moments ago;
- an HTTP request claims the core ids of its choices under its X-Request-Id (`<id>.<tag>`, or
  `<id>.<tag>-<i>` for several choices); an X-Request-Id still in flight is refused, and one
  reused within the TTL gets a fresh suffix on its core ids (`<id>.<tag>.<hex>`), still findable
  in the logs by the client's id.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator

from router.requests import InvalidRequest, RequestHandle
from splitserve.tombstones import Tombstones

ID_REUSE_MARGIN_S = 5.0  # past the workers' memory: for messages in flight when a request ended
ROUTER_TAG_CHARS = 8  # 32 random bits: this router's part of every core id


class RequestTable:
    def __init__(self, state_ttl_s: float):
        self.tag = secrets.token_hex(ROUTER_TAG_CHARS // 2)
        self.live: dict[str, RequestHandle] = {}
        self.recent = Tombstones(state_ttl_s + ID_REUSE_MARGIN_S)  # ended ids, still remembered
        self._reserved: set[str] = set()  # claimed or being admitted, not live yet
        self._http_ids: set[str] = set()  # X-Request-Ids with requests in flight

    # ---- claims of the HTTP layer ----
    def claim(self, http_id: str, count: int) -> list[str]:
        """The core ids for an HTTP request's `count` choices, reserved until release()."""
        if http_id in self._http_ids:
            raise InvalidRequest(
                f"request id {http_id!r} is already in flight", "X-Request-Id",
                code="duplicate_request_id",
            )  # fmt: skip
        self.recent.prune()
        ids = _ids(f"{http_id}.{self.tag}", count)
        if not all(self._free(i) for i in ids):
            ids = _ids(f"{http_id}.{self.tag}.{uuid.uuid4().hex[:8]}", count)
        self._http_ids.add(http_id)
        self._reserved.update(ids)
        return ids

    def release(self, http_id: str, ids: list[str]) -> None:
        """The HTTP request is done: its id and unused core ids may be claimed again."""
        self._http_ids.discard(http_id)
        self._reserved.difference_update(ids)

    # ---- the core's own ----
    def new_id(self) -> str:
        """A core id for a request that brings none."""
        return f"req-{uuid.uuid4().hex}.{self.tag}"

    def reserve(self, request_id: str, claimed: bool) -> None:
        """Hold an id while its request is admitted. `claimed`: the HTTP layer claimed it."""
        if claimed and request_id in self._reserved and request_id not in self.live:
            return
        if request_id in self.live or request_id in self._reserved:
            raise InvalidRequest(f"request id {request_id!r} is already in flight", "request_id")
        self.recent.prune()
        if request_id in self.recent:
            raise InvalidRequest(f"request id {request_id!r} was used moments ago", "request_id")
        self._reserved.add(request_id)

    def unreserve(self, request_id: str) -> None:
        """A reserved id whose request never started (refused, or its client left)."""
        self._reserved.discard(request_id)

    def add(self, handle: RequestHandle) -> None:
        self._reserved.discard(handle.request_id)
        self.live[handle.request_id] = handle

    def end(self, handle: RequestHandle) -> None:
        """The request ended: it leaves the table; its id is remembered for the TTL."""
        self.live.pop(handle.request_id, None)
        self.recent.add(handle.request_id)

    def reserved(self) -> frozenset[str]:
        """The ids held for requests not live yet (for checks that nothing leaked)."""
        return frozenset(self._reserved)

    def get(self, request_id: str) -> RequestHandle | None:
        return self.live.get(request_id)

    def handles(self) -> list[RequestHandle]:
        """A copy: callers end requests while they walk it."""
        return list(self.live.values())

    def prune(self) -> None:
        self.recent.prune()

    def __len__(self) -> int:
        return len(self.live)

    def __iter__(self) -> Iterator[RequestHandle]:
        return iter(self.live.values())

    def _free(self, request_id: str) -> bool:
        return (
            request_id not in self.live
            and request_id not in self._reserved
            and request_id not in self.recent
        )


def _ids(base: str, count: int) -> list[str]:
    return [base] if count == 1 else [f"{base}-{i}" for i in range(count)]
