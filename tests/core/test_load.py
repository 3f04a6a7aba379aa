"""Load accounting: the router's own in-flight figures blended with the engines' reports."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.core.load import EngineReport, Load, LoadBook

E = "e"


def test_loadbook_no_report_own_figures() -> None:
    book = LoadBook()
    book.acquire(E, 100, now=1.0)
    assert book.requests([E], now=2.0) == [1]
    assert book.signals([E], now=2.0) == ([0], [0.0])


def test_loadbook_report_sees_work_the_router_did_not_send() -> None:
    book = LoadBook()
    book.engine_report(E, EngineReport(running=3, waiting=50, kv_usage=0.5), at=1.0)
    assert book.requests([E], now=1.2) == [53]
    assert book.signals([E], now=1.2) == ([50], [0.5])
    assert book.requests([E]) == [0]  # without a time: the router's own figure


def test_loadbook_sent_after_report_added_not_double_counted() -> None:
    book = LoadBook()
    book.acquire(E, 10, now=0.5)  # in flight when the scrape is taken: the engine counts it
    book.engine_report(E, EngineReport(running=4), at=1.0)
    assert book.requests([E], now=1.1) == [4]
    book.acquire(E, 10, now=1.2)  # sent after the scrape: the report cannot know it
    book.acquire(E, 10, now=1.3)
    assert book.requests([E], now=1.4) == [6]
    book.release(E, 10, sent_at=1.2)
    assert book.requests([E], now=1.5) == [5]
    book.release(E, 10, sent_at=0.5)  # was in the report, has finished since
    assert book.requests([E], now=1.6) == [4]


def test_loadbook_queue_seen_at_a_handoff_is_gone_once_local_requests_finish() -> None:
    book = LoadBook()
    assert book.queued(E, now=1.0) is None  # no report: nothing known
    book.acquire(E, 10, now=0.5)
    book.acquire(E, 10, now=0.6)
    book.engine_report(E, EngineReport(running=8, waiting=2), at=1.0)
    assert book.queued(E, now=1.1) == 2
    book.release(E, 10, sent_at=0.5)  # its slot went to one of the waiting requests
    assert book.queued(E, now=1.2) == 1
    book.release(E, 10, sent_at=0.6)
    book.acquire(E, 10, now=1.3)
    book.release(E, 10, sent_at=1.3)  # sent after the report: it never was in its queue
    assert book.queued(E, now=1.4) == 0
    assert book.queued(E, now=1.0 + book.stale_after + 0.1) is None  # stale: unknown


def test_loadbook_batch_limit_learned_from_two_reports_with_a_queue() -> None:
    book = LoadBook()
    book.engine_report(E, EngineReport(running=5, waiting=1), at=1.0)
    assert book.slots(E) is None  # one queue may be a request that arrived mid-step
    book.engine_report(E, EngineReport(running=8, waiting=2), at=1.5)
    assert book.slots(E) == 8
    book.engine_report(E, EngineReport(running=10), at=2.0)
    assert book.slots(E) == 10  # it took more than it was seen full at
    book.engine_report(E, EngineReport(running=3), at=2.5)
    assert book.slots(E) == 10  # a quiet report says nothing of the limit
    book.drop_engine_report(E)
    assert book.slots(E) is None


def backlog(book: LoadBook, now: float) -> int:
    """The batch slots a request sent to ``E`` now would wait for, as decisions see it."""
    return book.signals([E], now)[0][0]


def test_loadbook_backlog_counts_what_was_sent_into_a_full_batch() -> None:
    book = LoadBook()
    assert backlog(book, 0.0) == 0  # nothing known: nothing to wait for
    for at in (1.0, 1.5):
        book.engine_report(E, EngineReport(running=8, waiting=1), at=at)
    assert backlog(book, 1.6) == 2  # one waits already; a new one is second
    book.engine_report(E, EngineReport(running=8), at=2.0)  # exactly full, nobody waiting
    assert backlog(book, 2.1) == 1  # yet a new request waits for a slot
    assert book.signals([E], now=2.1) == ([1], [0.0])
    book.acquire(E, 10, now=2.2)  # sent after the report: it waits
    book.acquire(E, 10, now=2.3)
    assert backlog(book, 2.4) == 3
    book.release(E, 10, sent_at=2.2)
    assert backlog(book, 2.5) == 2
    book.engine_report(E, EngineReport(running=4), at=3.0)
    assert backlog(book, 3.1) == 0
    assert backlog(book, 3.0 + book.stale_after + 0.1) == 0  # stale: unknown


def test_loadbook_never_below_own_in_flight() -> None:
    book = LoadBook()
    for t in (0.1, 0.2, 0.3):
        book.acquire(E, 1, now=t)
    book.engine_report(E, EngineReport(running=0), at=1.0)  # it has not seen them arrive yet
    assert book.requests([E], now=1.1) == [3]


def test_loadbook_fresh_report_stands_in_for_the_peers_figures() -> None:
    book = LoadBook()
    book.peer_report("peer", {E: Load(5, 50), "quiet": Load(3, 30)})
    book.acquire(E, 10, now=0.5)
    assert book.requests([E, "quiet"], now=0.6) == [6, 3]
    assert book.tokens([E, "quiet"]) == [60, 30]
    # The engine's own report counts every replica's requests at its time; the peer's late
    # figures are not added to it, nor its queued tokens; the engine with no report keeps them.
    book.engine_report(E, EngineReport(running=4, waiting=2), at=1.0)
    assert book.requests([E, "quiet"], now=1.1) == [6, 3]
    assert book.tokens([E, "quiet"]) == [10, 30]
    book.peer_report("peer", {E: Load(9, 90), "quiet": Load(1, 10)})
    assert book.requests([E, "quiet"], now=1.2) == [6, 1]
    # This replica's own traffic since the report is exact, and counts.
    book.acquire(E, 10, now=1.3)
    book.release(E, 10, sent_at=0.5)  # in flight at the report, finished since
    assert book.requests([E], now=1.4) == [6] and book.queued(E, now=1.4) == 1
    # Stale, the report gives way to the figures of every replica again.
    later = 1.0 + book.stale_after + 0.1
    assert book.requests([E], now=later) == [10]
    assert book.tokens([E]) == [100]


def test_loadbook_report_never_below_own_with_peers_about() -> None:
    book = LoadBook()
    book.peer_report("peer", {E: Load(5, 50)})
    for t in (1.1, 1.2, 1.3):
        book.acquire(E, 1, now=t)
    book.engine_report(E, EngineReport(running=1), at=1.0)
    assert book.requests([E], now=1.4) == [4]  # its one, and the three sent since
    book.drop_engine_report(E)
    assert book.requests([E], now=1.5) == [8] and book.tokens([E]) == [53]


def test_loadbook_prefilled_tokens_leave_the_queue_not_the_request() -> None:
    book = LoadBook()
    book.acquire(E, 100, now=1.0)
    book.acquire(E, 30, now=1.0)
    book.prefilled(E, 100)
    assert book.local(E) == Load(2, 30)
    book.prefilled(E, 500)  # more than is counted: never below zero
    assert book.local(E) == Load(2, 0)
    book.prefilled("other", 10)  # an engine with nothing in flight: nothing to take
    book.release(E, 0, sent_at=1.0)
    book.release(E, 0, sent_at=1.0)
    assert book.local_all() == {}


def test_loadbook_heat_local_and_peers_summed_and_never_negative() -> None:
    book = LoadBook()
    for _ in range(3):
        book.acquire("e", 10, prefix=42)
    book.acquire("e", 10)  # behind no prefix
    book.peer_report("peer", {"e": Load(2, 0)}, {42: 2, 7: 1})
    assert (book.heat(42), book.heat(7)) == (5, 1)
    assert book.hottest(1) == {42: 3}  # what this replica reports: its own share only
    for _ in range(5):  # more releases than acquires: the count stops at zero
        book.release("e", 10, prefix=42)
    book.release("e", 10)
    assert book.heat(42) == 2 and book.hottest(8) == {}
    book.peer_report("peer", {}, {7: 4})  # a newer report replaces the peer's prefixes
    assert (book.heat(42), book.heat(7)) == (0, 4)
    book.forget_peer("peer")
    assert book.heat(7) == 0


def test_loadbook_stale_report_falls_back() -> None:
    book = LoadBook(stale_after=2.0)
    book.engine_report(E, EngineReport(running=1, waiting=40, kv_usage=0.9), at=1.0)
    assert book.requests([E], now=3.0) == [41]
    assert book.requests([E], now=3.01) == [0]
    assert book.engine_reported(E, 3.01) is None
    assert book.signals([E], now=3.01) == ([0], [0.0])


def test_loadbook_drop_engine_report_forgets_it() -> None:
    book = LoadBook()
    book.engine_report(E, EngineReport(running=9), at=1.0)
    assert book.reporting_engines() == (E,)
    book.drop_engine_report(E)
    assert book.reporting_engines() == () and book.requests([E], now=1.0) == [0]


@given(
    st.lists(
        st.tuples(st.sampled_from(["acquire", "release", "report"]), st.integers(0, 20)),
        max_size=60,
    )
)
def test_loadbook_blend_bounded_by_own_and_report(ops: list[tuple[str, int]]) -> None:
    """Whatever the order: own <= blended <= report + own, and nothing leaks after release."""
    book = LoadBook(stale_after=1e9)
    sent: list[float] = []
    last: EngineReport | None = None
    for step, (op, n) in enumerate(ops):
        now = float(step)
        if op == "acquire":
            book.acquire(E, n, now)
            sent.append(now)
        elif op == "release" and sent:
            book.release(E, n, sent.pop(n % len(sent)))
        elif op == "report":
            last = EngineReport(running=n, waiting=n // 3)
            book.engine_report(E, last, now)
        blended = book.requests([E], now)[0]
        assert len(sent) <= blended <= (last.requests if last else 0) + len(sent)
    for t in list(sent):
        book.release(E, 0, t)
    assert book.local(E) == Load()


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["acquire", "release", "report", "wait"]),
            st.integers(0, 2),  # engine
            st.integers(0, 30),
        ),
        max_size=80,
    )
)
def test_loadbook_fleet_figures_follow_each_engines_fresh_report(
    ops: list[tuple[str, int, int]],
) -> None:
    """The fleet's figures, read in one pass, equal each engine's own blend: its fresh
    report's requests, less those finished since that were in flight at the report, plus
    those sent after it; never below the router's own. Reports go stale and come back."""
    engines = ["a", "b", "c"]
    book = LoadBook(stale_after=2.0)
    now = 0.0
    sent: dict[str, list[float]] = {e: [] for e in engines}
    report: dict[str, tuple[EngineReport, float]] = {}
    done = dict.fromkeys(engines, 0)  # released since the report, sent before it
    for op, i, n in ops:
        e = engines[i]
        now += 0.1
        if op == "wait":
            now += n / 10  # up to 3 s: reports pass their age
        elif op == "acquire":
            book.acquire(e, 1, now)
            sent[e].append(now)
        elif op == "release" and sent[e]:
            t = sent[e].pop(n % len(sent[e]))
            book.release(e, 1, t)
            if e in report and t <= report[e][1]:
                done[e] += 1
        elif op == "report":
            rep = EngineReport(running=n, waiting=n % 4)
            book.engine_report(e, rep, now)
            report[e], done[e] = (rep, now), 0
        expected = []
        for x in engines:
            own = len(sent[x])
            if x in report and now - report[x][1] <= 2.0:
                rep, at = report[x]
                since = sum(1 for t in sent[x] if t > at)
                own = max(own, rep.requests - done[x] + since)
            expected.append(own)
        assert book.requests(engines, now) == expected
