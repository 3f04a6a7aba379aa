"""Who is in the fleet and in what state: SWIM's member table, with no I/O.

A rumour about a member replaces the table's entry when its (incarnation, state rank) is
greater, ranking ALIVE < SUSPECT < DEAD (``PRECEDENCE``). Only a member raises its own
incarnation, so a live member that hears it is suspected (or dead) refutes with ALIVE at a
higher incarnation, which wins everywhere. The node drives the clock: it marks members suspect
after failed probes, calls ``expire`` to turn overdue suspects dead and ``reap`` to forget the
long dead.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from enum import IntEnum


class State(IntEnum):
    """Member states; the values are the protocol's MemberState numbers."""

    ALIVE = 1
    SUSPECT = 2
    DEAD = 3


# Ties at equal incarnation go to the worse news: a suspicion overrides an alive of the same
# incarnation, a death overrides both.
PRECEDENCE: dict[State, int] = {State.ALIVE: 0, State.SUSPECT: 1, State.DEAD: 2}


@dataclass(frozen=True, slots=True)
class Member:
    """One member as this node believes it; ``since`` is when it entered its state (local)."""

    id: str
    address: str
    incarnation: int
    state: State
    since: float = 0.0

    def outranks(self, other: Member) -> bool:
        """Whether this rumour replaces ``other``."""
        return (self.incarnation, PRECEDENCE[self.state]) > (
            other.incarnation,
            PRECEDENCE[other.state],
        )


@dataclass(frozen=True, slots=True)
class Change:
    """A rumour that changed the table: spread ``member``; ``before`` is the old entry."""

    member: Member
    before: Member | None

    @property
    def died(self) -> bool:
        was_dead = self.before is not None and self.before.state is State.DEAD
        return self.member.state is State.DEAD and not was_dead


class MemberTable:
    """The members this node knows, itself included, bounded by ``max_members``."""

    def __init__(self, node_id: str, address: str, now: float, max_members: int) -> None:
        self.max_members = max_members
        self.refused = 0
        self.leaving = False
        self._members: dict[str, Member] = {node_id: Member(node_id, address, 0, State.ALIVE, now)}
        self._self_id = node_id
        self._probe_order: list[str] = []

    @property
    def local(self) -> Member:
        return self._members[self._self_id]

    def get(self, node_id: str) -> Member | None:
        return self._members.get(node_id)

    def all(self) -> list[Member]:
        return list(self._members.values())

    def peers(self, *states: State) -> list[Member]:
        """Other members in any of ``states`` (all states when none is given)."""
        return [
            m
            for m in self._members.values()
            if m.id != self._self_id and (not states or m.state in states)
        ]

    def live_count(self) -> int:
        """Members not known dead, this node included (the N of the retransmit limit)."""
        return sum(1 for m in self._members.values() if m.state is not State.DEAD)

    def counts(self) -> dict[str, int]:
        """Peers per state name (this node excluded)."""
        out = {s.name.lower(): 0 for s in State}
        for m in self.peers():
            out[m.state.name.lower()] += 1
        return out

    def address_known(self, address: str) -> bool:
        """Whether a live member (or this node) listens at ``address``."""
        return any(
            m.address == address and m.state is not State.DEAD for m in self._members.values()
        )

    # -- rumours -------------------------------------------------------------------------------

    def merge(self, rumour: Member, now: float) -> Change | None:
        """Apply a rumour; the change to spread, or None when it was old news."""
        if rumour.id == self._self_id:
            return self._about_me(rumour, now)
        known = self._members.get(rumour.id)
        if known is None:
            # A death of someone we never knew teaches nothing worth spreading.
            if rumour.state is State.DEAD:
                return None
            if len(self._members) >= self.max_members:
                self.refused += 1
                return None
        elif not rumour.outranks(known):
            return None
        member = replace(rumour, since=now)
        self._members[rumour.id] = member
        return Change(member, known)

    def _about_me(self, rumour: Member, now: float) -> Change | None:
        me = self.local
        if self.leaving:
            return None
        if rumour.incarnation > me.incarnation:
            incarnation = rumour.incarnation + 1
        elif rumour.incarnation == me.incarnation and (
            rumour.state is not State.ALIVE or rumour.address != me.address
        ):
            incarnation = me.incarnation + 1
        else:
            return None
        refuted = Member(me.id, me.address, incarnation, State.ALIVE, now)
        self._members[me.id] = refuted
        return Change(refuted, me)

    # -- failure detection ---------------------------------------------------------------------

    def suspect(self, node_id: str, now: float) -> Change | None:
        """Mark a live member suspect (its probes failed); the rumour to spread."""
        known = self._members.get(node_id)
        if known is None or known.state is not State.ALIVE or node_id == self._self_id:
            return None
        member = replace(known, state=State.SUSPECT, since=now)
        self._members[node_id] = member
        return Change(member, known)

    def expire(self, now: float, timeout: float) -> list[Change]:
        """Declare dead every suspect that has not refuted within ``timeout``."""
        out = []
        for m in list(self._members.values()):
            if m.state is State.SUSPECT and now - m.since >= timeout:
                dead = replace(m, state=State.DEAD, since=now)
                self._members[m.id] = dead
                out.append(Change(dead, m))
        return out

    def reap(self, now: float, after: float) -> list[str]:
        """Forget members dead for longer than ``after``; their ids."""
        gone = [
            m.id for m in self._members.values() if m.state is State.DEAD and now - m.since > after
        ]
        for node_id in gone:
            del self._members[node_id]
        return gone

    def leave(self, now: float) -> Member:
        """This node is leaving: the DEAD rumour about itself to announce."""
        self.leaving = True
        me = replace(self.local, state=State.DEAD, since=now)
        self._members[me.id] = me
        return me

    def next_probe(self, rng: random.Random) -> Member | None:
        """The next member to probe, in randomised round-robin order (SWIM)."""
        for _ in range(2):
            while self._probe_order:
                m = self._members.get(self._probe_order.pop())
                if m is not None and m.state is not State.DEAD and m.id != self._self_id:
                    return m
            self._probe_order = [m.id for m in self.peers(State.ALIVE, State.SUSPECT)]
            rng.shuffle(self._probe_order)
        return None
