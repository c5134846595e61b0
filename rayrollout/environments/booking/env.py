"""Booking: a hotel desk with its own small database per episode; the reward reads its end state.

The task asks for rooms ("Book a suite for 2 nights."); its ``goal`` field lists the bookings
that should exist when the episode ends. Each episode gets a fresh in-memory SQLite database
in ``setup`` (rooms from the task's ``inventory`` or the defaults) and closes it in
``close``, which runs after failed episodes too. Tools change that state turn by turn
(``book``, ``cancel``) or read it (``list_rooms``, ``list_bookings``), so the verifier scores
the whole episode: the bookings left active must be exactly the goal's, and the final answer
must quote their ids.

The tools are ordered (alphabetically, as schemas are listed) so that ``book``, which takes
the request in plain words, comes first: a policy that knows nothing of this environment
can still make a meaningful booking.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from typing import Any, ClassVar

from rayrollout.envkit import Environment, Episode, ToolError, Verification, tool

DEFAULT_INVENTORY: dict[str, dict[str, int]] = {
    "single": {"rooms": 2, "price": 80},
    "double": {"rooms": 3, "price": 120},
    "suite": {"rooms": 1, "price": 300},
}
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
_NIGHTS = re.compile(rf"\b(\d+|{'|'.join(_NUMBERS)})\s+nights?\b", re.IGNORECASE)


class BookingEnv(Environment):
    """Book, cancel and list hotel rooms in a per-episode database."""

    name = "booking"
    default_hosting = "inline"  # SQLite in memory: microseconds per call, no Serve hop needed
    max_nights: ClassVar[int] = 30
    open_databases: ClassVar[int] = 0  # per process; tests check that close always runs

    async def setup(self) -> None:
        inventory = self.task.fields.get("inventory") or DEFAULT_INVENTORY
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        BookingEnv.open_databases += 1
        self.db.execute("CREATE TABLE rooms (type TEXT PRIMARY KEY, free INTEGER, price INTEGER)")
        self.db.execute(
            "CREATE TABLE bookings (id TEXT PRIMARY KEY, type TEXT, nights INTEGER, status TEXT)"
        )
        self.db.executemany(
            "INSERT INTO rooms VALUES (?, ?, ?)",
            [(kind, int(v["rooms"]), int(v["price"])) for kind, v in inventory.items()],
        )

    async def close(self) -> None:
        if getattr(self, "db", None) is not None:
            self.db.close()
            del self.db
            BookingEnv.open_databases -= 1

    def _room_types(self) -> list[str]:
        return [row[0] for row in self.db.execute("SELECT type FROM rooms ORDER BY price")]

    @tool
    async def book(self, request: str) -> str:
        """Book one room.

        Args:
            request: What to book in plain words: the room type (single, double or suite)
                and the number of nights, e.g. "a double room for 3 nights".
        """
        text = request.lower()
        kinds = self._room_types()
        found = sorted(
            (match.start(), kind)
            for kind in kinds
            if (match := re.search(rf"\b{re.escape(kind)}\b", text))
        )
        if not found:
            raise ToolError(f"say which room to book: one of {', '.join(kinds)}")
        kind = found[0][1]
        nights_match = _NIGHTS.search(text)
        if nights_match is None:
            raise ToolError('say for how many nights, e.g. "a suite for 2 nights"')
        word = nights_match.group(1).lower()
        nights = _NUMBERS.get(word) or int(word)
        if not 1 <= nights <= self.max_nights:
            raise ToolError(f"nights must be between 1 and {self.max_nights}, got {nights}")
        free, price = self.db.execute(
            "SELECT free, price FROM rooms WHERE type = ?", (kind,)
        ).fetchone()
        if free < 1:
            raise ToolError(f"no {kind} is free; see list_rooms for what is")
        (count,) = self.db.execute("SELECT COUNT(*) FROM bookings").fetchone()
        booking_id = f"B{count + 1}"
        self.db.execute(
            "INSERT INTO bookings VALUES (?, ?, ?, 'active')", (booking_id, kind, nights)
        )
        self.db.execute("UPDATE rooms SET free = free - 1 WHERE type = ?", (kind,))
        return (
            f"Booked a {kind} for {nights} night(s): booking {booking_id}, "
            f"total {price * nights} EUR."
        )

    @tool
    async def cancel(self, booking_id: str) -> str:
        """Cancel an active booking and free its room.

        Args:
            booking_id: The id the booking was confirmed with, e.g. "B1".
        """
        row = self.db.execute(
            "SELECT type FROM bookings WHERE id = ? AND status = 'active'", (booking_id.strip(),)
        ).fetchone()
        if row is None:
            raise ToolError(f"no active booking {booking_id!r}; see list_bookings")
        self.db.execute("UPDATE bookings SET status = 'cancelled' WHERE id = ?", (booking_id,))
        self.db.execute("UPDATE rooms SET free = free + 1 WHERE type = ?", (row[0],))
        return f"Cancelled booking {booking_id}."

    @tool
    async def list_bookings(self) -> list[dict[str, Any]]:
        """List this stay's bookings, active and cancelled."""
        return self._bookings(active_only=False)

    @tool
    async def list_rooms(self) -> list[dict[str, Any]]:
        """List room types with how many are free and the price per night in EUR."""
        rows = self.db.execute("SELECT type, free, price FROM rooms ORDER BY price")
        return [{"type": t, "free": f, "price_per_night": p} for t, f, p in rows]

    def _bookings(self, active_only: bool) -> list[dict[str, Any]]:
        query = "SELECT id, type, nights, status FROM bookings"
        if active_only:
            query += " WHERE status = 'active'"
        rows = self.db.execute(query + " ORDER BY rowid")
        return [{"id": i, "type": t, "nights": n, "status": s} for i, t, n, s in rows]

    async def verify(self, episode: Episode) -> Verification:
        """Score the end state: active bookings against the goal, and the answer's ids.

        ``matched / max(len(goal), len(active))`` rewards every goal booking made and
        charges for every extra one; the reward halves when the final answer does not quote
        every active booking's id (the guest must be told). Nothing booked for an empty goal
        (the room was sold out) scores 1.0.
        """
        goal = [(g["room"], int(g["nights"])) for g in self.task.fields.get("goal", [])]
        active = self._bookings(active_only=True)
        made = Counter((b["type"], b["nights"]) for b in active)
        matched = sum((Counter(goal) & made).values())
        state = matched / max(len(goal), len(active)) if goal or active else 1.0
        answer = episode.final_answer()
        confirmed = all(re.search(rf"\b{b['id']}\b", answer) for b in active)
        return Verification(
            reward=state if confirmed else state / 2,
            details={
                "goal": [{"room": r, "nights": n} for r, n in goal],
                "bookings": json.loads(json.dumps(active)),
                "matched": matched,
                "confirmed": confirmed,
            },
        )
