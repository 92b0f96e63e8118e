"""Drafts that cost no forward pass: n-gram (prompt lookup) and suffix-trie proposers.

A proposer belongs to one request and sees its tokens (prompt, then output) as they grow;
:meth:`propose` returns the branches to verify next, best first: each a list of up to
``steps`` tokens guessed to follow the request's last token, first tokens distinct. An empty
list: no match, nothing to draft.

- :class:`NgramProposer` (prompt lookup, as vLLM's ``ngram``): the most recent earlier
  occurrence of the request's last ``n`` tokens, ``n`` from ``max_match`` down to
  ``min_match``; the chain is the ``steps`` tokens that followed it (a match running into the
  request's end continues with its own copy, so a loop is drafted whole).
- :class:`SuffixProposer` (suffix decoding, per request): a trie of every substring of up to
  ``max_match + steps + 1`` tokens with its count (+ 1: a peek guesses the bonus too). The
  longest suffix of the request (at most ``max_match``, at least ``min_match`` tokens) seen
  before with a continuation is matched; its ``topk`` most frequent next tokens start the
  branches, each continued by the most frequent child (ties: lower token id).

Both index incrementally, so a round costs the new tokens, not the request's length: the
suffix trie ``O(max_match + steps)`` dict operations a token, the n-gram tables only the sizes a
lookup consults (one a token while a request backs off). :meth:`peek` proposes past tokens not read yet
(an overlapped round's drafts, assumed accepted): it matches the request's tokens followed by
``tail`` without indexing ``tail``, and returns one chain of ``count`` tokens, the first being
the guess for the token the round in flight commits after ``tail``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphrt.engine.gate import Gate
from graphrt.engine.spec_options import SpecOptions


class _Tokens:
    """A request's tokens as the proposer has seen them, grown from ``prompt`` and ``output``."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._prompt_len = -1
        #: Tokens of the suffix the latest lookup matched (0: none).
        self.matched = 0

    def sync(self, prompt: Sequence[int], output: Sequence[int]) -> int:
        """Take the tokens not seen yet; returns how many were there before."""
        before = len(self.tokens)
        if self._prompt_len < 0:
            self._prompt_len = len(prompt)
            self.tokens.extend(prompt)
        self.tokens.extend(output[len(self.tokens) - self._prompt_len :])
        return before


class NgramProposer(_Tokens):
    """Prompt lookup: see the module docstring.

    Each n-gram size has its own table, brought up to the request's tokens only when a lookup
    consults it (:meth:`_table`): a lookup tries ``min_match`` first (unseen: no size matches)
    and then the sizes from ``max_match`` down to the first that matches, so a request that
    backs off indexes one size a token and one that copies a long run about two, not every
    size. A table consulted is exactly the one eager indexing would hold.
    """

    def __init__(self, min_match: int, max_match: int, steps: int) -> None:
        super().__init__()
        self.sizes = range(max_match, min_match - 1, -1)
        self.steps = steps
        #: Per n-gram size: n-gram -> the index of the token after its latest occurrence.
        self._tables: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        #: Per size: the tokens its table has indexed (the end positions below it).
        self._upto = dict.fromkeys(self.sizes, 0)

    @property
    def index(self) -> dict[int, dict[tuple[int, ...], int]]:
        """Every size's table, each brought up to the tokens seen (what a lookup would read)."""
        return {n: self._table(n) for n in self.sizes}

    def propose(self, prompt: Sequence[int], output: Sequence[int]) -> list[list[int]]:
        self.sync(prompt, output)
        chain = self._lookup((), self.steps)
        return [chain] if chain else []

    def peek(
        self, prompt: Sequence[int], output: Sequence[int], tail: Sequence[int], count: int
    ) -> list[int]:
        """``count`` tokens guessed to follow ``output + tail`` (``tail`` not indexed); [] if none."""
        self.sync(prompt, output)
        return self._lookup(tuple(tail), count)

    def _table(self, n: int) -> dict[tuple[int, ...], int]:
        """Size ``n``'s table, its n-grams indexed up to the request's tokens.

        NOTE: an n-gram is indexed once the token after it is known, so the request's own last
        n tokens (nothing after them yet) never match themselves.
        """
        table, toks = self._tables[n], self.tokens
        done, size = self._upto[n], len(toks)
        if done < size:
            for end in range(max(done, n), size):
                table[tuple(toks[end - n : end])] = end
            self._upto[n] = size
        return table

    def _lookup(self, tail: tuple[int, ...], count: int) -> list[int]:
        """``count`` tokens after the latest indexed occurrence of the last n-gram of the
        request's tokens followed by ``tail``."""
        seq = (*self.tokens[-self.sizes[0] :], *tail) if tail else self.tokens
        last, least = len(seq), self.sizes[-1]
        self.matched = 0
        # NOTE: every indexed n-gram's last ``min_match`` tokens were indexed with it, so when
        # those are unseen no size matches: one lookup for a request that backs off, not one a size
        if last < least or tuple(seq[last - least :]) not in self._table(least):
            return []
        for n in self.sizes:
            end = self._table(n).get(tuple(seq[last - n :])) if last >= n else None
            if end is not None:
                self.matched = n
                return self._copy(end, count, tail)
        return []

    def _copy(self, end: int, count: int, tail: tuple[int, ...]) -> list[int]:
        """``count`` tokens from ``end`` on, over the request's tokens then ``tail``; past those
        the copy reads its own output (a match overlapping the suffix: a loop continues)."""
        toks, out = self.tokens, []
        if end + count <= len(toks):  # NOTE: the usual case: the copy lies in the read tokens
            return toks[end : end + count]
        size = len(toks) + len(tail)
        for i in range(end, end + count):
            if i < len(toks):
                out.append(toks[i])
            else:
                out.append(tail[i - len(toks)] if i < size else out[i - size])
        return out


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}

    def best(self) -> list[tuple[int, _Node]]:
        """Children by count, most frequent first (ties: lower token id)."""
        return sorted(self.children.items(), key=_rank)

    def first(self) -> tuple[int, _Node]:
        """``best()[0]`` without sorting the others (a copied run's nodes have one child)."""
        children = self.children
        if len(children) == 1:
            return next(iter(children.items()))
        return min(children.items(), key=_rank)


def _rank(kv: tuple[int, _Node]) -> tuple[int, int]:
    return -kv[1].count, kv[0]


class SuffixProposer(_Tokens):
    """Suffix decoding over one request: see the module docstring."""

    def __init__(self, min_match: int, max_match: int, steps: int, topk: int) -> None:
        super().__init__()
        self.min_match, self.max_match, self.steps, self.topk = min_match, max_match, steps, topk
        self.depth = max_match + steps + 1  # NOTE: + 1: a peek guesses the bonus, then steps drafts
        self.root = _Node()
        #: ``active[i]``: the node of the request's last ``i`` tokens (``active[0]``: the root).
        self.active: list[_Node] = [self.root]

    def _append(self, token: int) -> None:
        grown = [self.root]
        add = grown.append
        for node in self.active[: self.depth]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            add(child)
        self.active = grown

    def propose(self, prompt: Sequence[int], output: Sequence[int]) -> list[list[int]]:
        self._index(prompt, output)
        node = self._match(self.active)
        if node is None:
            return []
        return [self._chain(t, child, self.steps) for t, child in node.best()[: self.topk]]

    def peek(
        self, prompt: Sequence[int], output: Sequence[int], tail: Sequence[int], count: int
    ) -> list[int]:
        """``count`` tokens guessed to follow ``output + tail`` (``tail`` not indexed); [] if none."""
        self._index(prompt, output)
        active = self.active
        for t in tail:
            # NOTE: a suffix seen before with ``t`` after it implies its shorter suffixes were:
            # the matched suffixes stay the lengths 0 .. k, as ``active`` holds them.
            grown = [self.root]
            for node in active[: self.depth]:
                child = node.children.get(t)
                if child is None:
                    break
                grown.append(child)
            active = grown
        node = self._match(active)
        if node is None:
            return []
        token, child = node.first()
        return self._chain(token, child, count)

    def _index(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        start = self.sync(prompt, output)
        for t in self.tokens[start:]:
            self._append(t)

    def _match(self, active: list[_Node]) -> _Node | None:
        """The node of the longest matched suffix (``min_match`` .. ``max_match``) with children."""
        for length in range(min(self.max_match, len(active) - 1), self.min_match - 1, -1):
            if active[length].children:
                self.matched = length
                return active[length]
        self.matched = 0
        return None

    def _chain(self, first: int, node: _Node, count: int) -> list[int]:
        chain = [first]
        while len(chain) < count and node.children:
            token, node = node.first()
            chain.append(token)
        return chain


Proposer = NgramProposer | SuffixProposer | Gate

#: ``method -> options -> a bare proposer`` (:data:`PROPOSERS` gates it).
BARE: dict[str, Callable[[SpecOptions], NgramProposer | SuffixProposer]] = {
    "ngram": lambda o: NgramProposer(o.min_match, o.max_match, o.geometry.num_steps),
    "suffix": lambda o: SuffixProposer(o.min_match, o.max_match, o.geometry.num_steps, o.geometry.topk),
}


def _gated(method: str) -> Callable[[SpecOptions], Proposer]:
    def make(options: SpecOptions) -> Proposer:
        bare, rate = BARE[method](options), options.backoff.min_hit_rate
        return Gate(bare, rate) if rate > 0 else bare

    return make


#: ``method -> options -> a new request's proposer`` (gated unless ``min_hit_rate`` is 0).
PROPOSERS: dict[str, Callable[[SpecOptions], Proposer]] = {m: _gated(m) for m in BARE}
