"""Automatic prefix caching: full KV pages keyed by their tokens and everything before them.

A page of a prompt is cached once the prefill that wrote it has run; a later request whose
prompt starts with the same pages adopts them (``ReqToToken.adopt``) and prefills only the
rest. Pages are reference-counted by the running requests that hold them; a cached page no
request holds is *idle* and evicted least recently used first when the pool runs out.

Keys are chain hashes (a page's key hashes its parent's key and its own tokens), but a key is
only an index: a hit is verified against the entry's tokens and its parent entry (a serial
number never reused), so a hash collision is a miss, never another prompt's KV. The ledger
pins every cached slot (:mod:`graphrt.kv.pins`): shared pages are read-only and a page in use
cannot be evicted.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: ``hash_fn(parent_key, page_tokens) -> key``; tests force collisions through it.
HashFn = Callable[[int, tuple[int, ...]], int]
#: ``pin(page, depth)`` / ``unpin(page)``: the ledger's side of caching / evicting a page.
PinFn = Callable[[int, int], None]
UnpinFn = Callable[[int], None]
ROOT = 0  # NOTE: the parent key and serial of a prompt's first page


def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """The key of a page holding ``tokens`` after the page keyed ``parent``."""
    return hash((parent, tokens))


@dataclass(frozen=True, slots=True)
class _Entry:
    key: int
    serial: int  # NOTE: unique for the cache's life: a child names its parent by it
    parent: int  # the parent entry's serial (ROOT: the first page)
    page: int
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefixStats:
    """Prefix-cache counters: prompt tokens served from cache (``hit_tokens``) out of every
    admitted prompt token (``query_tokens``), requests with a hit, pages evicted, key
    collisions refused, pages cached now (``cached_pages``, of which ``idle_pages`` unheld)."""

    hit_tokens: int = 0
    query_tokens: int = 0
    hit_requests: int = 0
    evictions: int = 0
    collisions: int = 0
    cached_pages: int = 0
    idle_pages: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PrefixCache:
    """The cached pages of one engine (see the module docstring)."""

    def __init__(self, page_size: int, pin: PinFn, unpin: UnpinFn, hash_fn: HashFn = chain_hash) -> None:
        self.page_size, self._pin, self._unpin = page_size, pin, unpin
        #: The page key function; a test may replace it (forcing collisions, say).
        self.hash_fn = hash_fn
        self._by_key: dict[int, _Entry] = {}
        self._by_page: dict[int, _Entry] = {}
        self._users: dict[int, int] = {}  # cached page -> running requests holding it
        self._idle: OrderedDict[int, None] = OrderedDict()  # unheld cached pages, LRU first
        self._serials = itertools.count(ROOT + 1)
        self._hits = self._queries = self._hit_reqs = self._evictions = self._collisions = 0

    def _pages(self, tokens: Sequence[int], start: int, stop: int) -> list[tuple[int, ...]]:
        ps = self.page_size
        return [tuple(tokens[i * ps : (i + 1) * ps]) for i in range(start, stop)]

    def match(self, prompt: Sequence[int], keys: Sequence[int]) -> list[int]:
        """The cached pages of ``prompt``'s longest cached prefix of full pages, in order.

        ``keys``: the prompt's page keys (:meth:`keys`, computed once per prompt): a match
        hashes nothing, it looks each key up and verifies the entry's tokens and parent.

        NOTE: the prompt's last token is never served from cache: its row of logits gives the
        first new token, so at least one token is computed.
        """
        ps, parent, hit = self.page_size, ROOT, []
        for i in range((len(prompt) - 1) // ps):
            entry = self._by_key.get(keys[i])
            if entry is None:
                break
            if entry.parent != parent or entry.tokens != tuple(prompt[i * ps : (i + 1) * ps]):
                self._collisions += 1
                break
            hit.append(entry.page)
            parent = entry.serial
        return hit

    def keys(self, prompt: Sequence[int]) -> list[int]:
        """The chain keys of ``prompt``'s full pages, in order."""
        key, keys = ROOT, []
        for tokens in self._pages(prompt, 0, len(prompt) // self.page_size):
            key = self.hash_fn(key, tokens)
            keys.append(key)
        return keys

    def count(self, hit_pages: int, prompt_len: int) -> None:
        """Count an admitted prompt of ``prompt_len`` tokens with ``hit_pages`` from cache."""
        self._hits += hit_pages * self.page_size
        self._queries += prompt_len
        self._hit_reqs += hit_pages > 0

    def evictable(self, keep: Sequence[int]) -> int:
        """Idle pages that could be evicted now, besides those in ``keep`` (about to be used)."""
        return len(self._idle) - sum(p in self._idle for p in keep)

    def idle(self) -> list[int]:
        """The cached pages no request holds, least recently used first."""
        return list(self._idle)

    def acquire(self, pages: Sequence[int]) -> None:
        """A request holds the cached ``pages`` (from :meth:`match`): none is evicted now."""
        for p in pages:
            self._users[p] += 1
            self._idle.pop(p, None)

    def evict(self) -> int:
        """Drop the least recently used idle page from the cache (unpinned); returns it.

        ``KeyError`` when none is idle (the pool checks :meth:`evictable` first).
        """
        if not self._idle:
            raise KeyError("no idle cached page to evict")
        page, _ = self._idle.popitem(last=False)
        self._unpin(page)
        entry = self._by_page.pop(page)
        del self._by_key[entry.key], self._users[page]
        self._evictions += 1
        return page

    def insert(
        self, prompt: Sequence[int], pages: Sequence[int], keys: Sequence[int], start: int = 0
    ) -> None:
        """Cache the full pages of ``prompt`` (held in ``pages``; ``keys``: :meth:`keys`) once
        its prefill has run, from page ``start`` on: the pages before it are the cached ones
        the request adopted (:meth:`match`, held by it, so still cached), left as they are.

        The request stays their holder. A page whose key is taken (the same prefix cached by
        another request meanwhile, or a collision) stays the request's own.
        """
        # NOTE: a hit skips its adopted pages: the work is the computed part's, not the prompt's
        parent = self._by_page[pages[start - 1]].serial if start else ROOT
        stop = len(prompt) // self.page_size
        for depth, tokens in enumerate(self._pages(prompt, start, stop), start):
            key, page = keys[depth], pages[depth]
            entry = self._by_page.get(page) or self._by_key.get(key)
            if entry is None:
                self._pin(page, depth)
                entry = _Entry(key, next(self._serials), parent, page, tokens)
                self._by_key[key] = self._by_page[page] = entry
                self._users[page] = 1
            elif entry.page != page or entry.parent != parent or entry.tokens != tokens:
                self._collisions += entry.tokens != tokens or entry.parent != parent
                return  # NOTE: the rest of the chain would hang off a page that is not cached
            parent = entry.serial

    def release(self, pages: Sequence[int]) -> list[int]:
        """A finished request lets go of ``pages``; returns those that are not cached (free)."""
        free = []
        for p in pages:
            users = self._users.get(p)
            if users is None:
                free.append(p)
                continue
            self._users[p] = users - 1
            if users == 1:
                self._idle[p] = None  # NOTE: most recently used last
        return free

    def stats(self) -> PrefixStats:
        return PrefixStats(
            self._hits,
            self._queries,
            self._hit_reqs,
            self._evictions,
            self._collisions,
            len(self._by_page),
            len(self._idle),
        )
