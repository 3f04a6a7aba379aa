"""The engine model's interference (prefill slows decoding beside it) and its roles."""

from __future__ import annotations

import pytest

from router.core.engine_model import EngineClock, EngineSpec, Occupancy


def slow(stall: float = 0.0, max_batch: int = 4, capacity_tokens: int = 400_000) -> EngineSpec:
    """100 prefill tokens a second, 10 decode tokens a second: round numbers in seconds."""
    return EngineSpec(
        capacity_tokens=capacity_tokens,
        prefill_tokens_per_s=100.0,
        decode_tokens_per_s=10.0,
        max_batch=max_batch,
        decode_stall=stall,
    )


def clocks() -> tuple[EngineClock, EngineClock]:
    return EngineClock(slow()), EngineClock(slow(1.0))


def test_a_long_prefill_raises_a_decoding_neighbours_tpot() -> None:
    off, on = clocks()
    # Prefill 0-1 s, then 20 tokens in 2 s.
    a_off, a_on = (clock.start(0.0, uncached_tokens=100, output_tokens=20) for clock in (off, on))
    quiet = off.start(1.5, 300, 5)
    loud = on.start(1.5, 300, 5)  # prefill 1.5-4.5 s, while the first one decodes
    assert a_off.done == 3.0 and a_off.tpot == pytest.approx(0.1)
    assert a_on.done == pytest.approx(6.0)  # stalled the 3 s of the prefill beside it
    assert a_on.tpot == pytest.approx(0.25) and a_on.tpot > a_off.tpot
    # The prefilling request itself is not slowed by its own prefill.
    assert loud.first_token == quiet.first_token == 4.5 and loud.done == quiet.done


def test_opt_in_off_changes_nothing() -> None:
    off = EngineClock(slow())
    before = [off.admit(t, u, o) for t, u, o in ((0.0, 100, 30), (0.2, 400, 5), (0.4, 50, 9))]
    again = EngineClock(slow(0.0))
    runs = [again.start(t, u, o) for t, u, o in ((0.0, 100, 30), (0.2, 400, 5), (0.4, 50, 9))]
    assert [r.done for r in runs] == [s.done for s in before]
    assert [r.schedule for r in runs] == before
    assert EngineSpec().decode_stall == 0.0


def test_a_finished_request_is_not_stalled_and_a_stall_scales_with_the_factor() -> None:
    half = EngineClock(slow(0.5))
    done_early = half.start(0.0, 10, 2)  # decodes from 0.1 s to 0.3 s
    long = half.start(0.0, 10, 50)  # prefills 0.1-0.2 s beside it, decodes to 5.2 s
    assert done_early.done == pytest.approx(0.3 + 0.5 * 0.1)
    half.start(1.0, 200, 1)  # prefill 1-3 s: the first has ended
    assert done_early.done == pytest.approx(0.35)
    assert long.done == pytest.approx(5.2 + 0.5 * 2.0)


def test_a_slot_waits_for_the_stalled_end() -> None:
    on = EngineClock(slow(1.0, max_batch=1))
    a = on.start(0.0, 0, 10)  # decodes 0-1 s, the only slot
    b = on.start(0.5, 100, 1)  # waits for the slot: a is not decoding beside it
    assert a.done == 1.0 and b.prefill_start == 1.0 and b.first_token == 2.0


def test_a_received_request_waits_for_its_transfer_and_prefills_nothing() -> None:
    decode = EngineClock(slow(1.0))
    r = decode.receive(0.0, kv_sent_at=1.0, transfer_seconds=0.25, output_tokens=11)
    assert r.prefill_start == 1.0 and r.first_token == 1.25 and r.ttft == 1.25
    assert r.done == pytest.approx(2.35) and r.tpot == pytest.approx(0.1)
    # A prefill that overlaps only part of its decode stalls it for that part.
    decode.start(0.0, 150, 1)  # prefill 0-1.5 s
    assert r.done == pytest.approx(2.35 + 0.25)
    assert decode.busy_seconds == pytest.approx(1.1 + 1.5 + 0.1)


def test_a_transfer_landing_during_a_queued_prefill_is_stalled_for_the_overlap() -> None:
    decode = EngineClock(slow(1.0))
    decode.start(0.0, 200, 1)  # prefill 0-2 s
    r = decode.receive(0.5, kv_sent_at=0.5, transfer_seconds=0.5, output_tokens=10)
    assert r.first_token == 1.0 and r.done == pytest.approx(1.0 + 1.0 + 1.0)
    later = decode.receive(3.0, kv_sent_at=3.0, transfer_seconds=0.0, output_tokens=10)
    assert later.done == pytest.approx(4.0)  # the prefill was over


def test_a_prefill_engines_request_leaves_at_its_first_token() -> None:
    prefill = EngineClock(slow(1.0))
    r = prefill.start(0.0, 200, 0)
    assert r.first_token == r.done == 2.0 and r.tpot == 0.0
    assert prefill.running(2.0) == 0


def test_occupancy_follows_a_stalled_end() -> None:
    spec = slow(1.0, capacity_tokens=10_000)
    clock, occ = EngineClock(spec), Occupancy(spec)
    a = clock.start(0.0, 100, 20)  # would end at 3 s
    occ.add(a, 100, 0)
    clock.start(1.5, 200, 1)  # prefill 1.5-3.5 s: a now ends at 5 s
    assert occ.report(4.0)[0] == 1  # still running past its planned end


def test_the_stall_factor_is_bounded() -> None:
    with pytest.raises(ValueError):
        EngineSpec(decode_stall=-1.0)
    assert EngineSpec(decode_stall=1.0).pooled(4).decode_stall == 1.0
