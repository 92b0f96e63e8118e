"""The engine thread's hand-off to the asyncio loop: updates queued in the outbox arrive in
order at one flush, with one wake-up of the loop however many there are; a stream that fell
behind joins the updates of one choice already queued (text, ids, log-probabilities) and stops
at another choice's update, an error or a reply's end."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from graphrt.replies import Completion, Update
from graphrt.runtime.logprobs import TokenLogprobs
from graphrt.serve.choices import Ask, Served
from graphrt.serve.outbox import Outbox
from graphrt.serve.protocol import RequestError


def test_one_flush_delivers_in_order_with_one_wakeup() -> None:
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        wakes = []
        real = loop.call_soon_threadsafe

        def counted(*args: Any) -> Any:
            wakes.append(args)
            return real(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        box, queue = Outbox(), asyncio.Queue[int]()
        box.bind(loop)

        def engine() -> None:
            for k in range(5):
                box.put(queue, k)
            assert queue.empty()  # NOTE: nothing moves before the flush
            box.flush()
            box.flush()  # NOTE: a wake-up is pending: no second one

        thread = threading.Thread(target=engine)
        thread.start()
        got = [await asyncio.wait_for(queue.get(), 5) for _ in range(5)]
        thread.join()
        return got, len(wakes)

    got, wakes = asyncio.run(main())
    assert got == [0, 1, 2, 3, 4]
    assert wakes == 1


def test_flush_after_the_loop_closed_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    box = Outbox()
    box.bind(loop)
    loop.close()
    box.put(asyncio.Queue(), 1)
    box.flush()  # NOTE: no RuntimeError: nobody is waiting


class _Loop:
    """What :class:`Served` needs of the engine loop: its outbox and ``submit``."""

    def __init__(self) -> None:
        self.outbox, self.jobs = Outbox(), []

    def submit(self, job: Any) -> None:
        self.jobs.append(job)

    def cancel(self, job: Any) -> None:
        pass


def _lp(token: int) -> TokenLogprobs:
    return TokenLogprobs(token, -0.5, (token,), (-0.5,))


def _update(tokens: list[int], done: Completion | None = None) -> Update:
    text = "".join(f"<{t}>" for t in tokens)
    return Update(7, text, tokens, done, [_lp(t) for t in tokens])


def _served(items: list[tuple[int, Update | Exception]], n: int = 2) -> Served:
    loop = _Loop()
    served = Served(loop, Ask([1, 2], 8, None, (), n=n))  # type: ignore[arg-type]
    loop.outbox.bind(asyncio.get_running_loop())
    for i, item in items:
        loop.jobs[i].deliver(item)
    loop.outbox.flush()
    return served


def test_a_stream_behind_joins_one_choices_queued_updates() -> None:
    end = Completion("", [1, 2, 3, 4], "length", 2, 4)

    async def main() -> list[tuple[int, Update]]:
        items = [
            (0, _update([1])),
            (0, _update([2])),
            (0, _update([3])),
            (1, _update([9])),
            (0, _update([4], end)),
        ]
        served = _served(items)
        await asyncio.sleep(0)
        out = []
        for _ in range(3):
            i, update = await served.next()
            out.append((i, served.coalesce(i, update)))
        return out

    (i0, a), (i1, b), (i2, c) = asyncio.run(main())
    assert (i0, a.token_ids, a.text) == (0, [1, 2, 3], "<1><2><3>")
    assert [e.token for e in a.logprobs or []] == [1, 2, 3]
    assert (i1, b.token_ids, i2, c.token_ids, c.done) == (1, [9], 0, [4], end)


def test_joining_stops_at_an_error_and_at_a_replys_end() -> None:
    end = Completion("", [1], "stop", 2, 1)

    async def main() -> tuple[Update, Update]:
        served = _served([(0, _update([1], end)), (0, _update([2]))], n=1)
        await asyncio.sleep(0)
        ended = served.coalesce(*(await served.next()))  # NOTE: ended: nothing joins it
        served = _served([(0, _update([5])), (0, RuntimeError("engine step failed"))], n=1)
        await asyncio.sleep(0)
        before = served.coalesce(*(await served.next()))
        with pytest.raises(RequestError, match="engine step failed"):
            await served.next()
        return ended, before

    ended, before = asyncio.run(main())
    assert (ended.token_ids, ended.done) == ([1], end)
    assert before.token_ids == [5]
