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
  ``max_match + steps`` tokens with its count. The longest suffix of the request (at most
  ``max_match``, at least ``min_match`` tokens) seen before with a continuation is matched;
  its ``topk`` most frequent next tokens start the branches, each continued by the most
  frequent child (ties: lower token id).

Both index incrementally (``O(max_match)`` dict operations per new token), so a round costs
the new tokens, not the request's length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphrt.engine.spec_options import SpecOptions


class _Tokens:
    """A request's tokens as the proposer has seen them, grown from ``prompt`` and ``output``."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._prompt_len = -1

    def sync(self, prompt: Sequence[int], output: Sequence[int]) -> int:
        """Take the tokens not seen yet; returns how many were there before."""
        before = len(self.tokens)
        if self._prompt_len < 0:
            self._prompt_len = len(prompt)
            self.tokens.extend(prompt)
        self.tokens.extend(output[len(self.tokens) - self._prompt_len :])
        return before


class NgramProposer(_Tokens):
    """Prompt lookup: see the module docstring."""

    def __init__(self, min_match: int, max_match: int, steps: int) -> None:
        super().__init__()
        self.sizes = range(max_match, min_match - 1, -1)
        self.steps = steps
        #: Per n-gram size: n-gram -> the index of the token after its latest occurrence.
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}

    def propose(self, prompt: Sequence[int], output: Sequence[int]) -> list[list[int]]:
        toks = self.tokens
        start = self.sync(prompt, output)
        # NOTE: an n-gram is indexed once the token after it is known, so the request's own
        # last n tokens (nothing after them yet) never match themselves.
        for end in range(max(start, 1), len(toks)):
            for n, index in self.index.items():
                if end >= n:
                    index[tuple(toks[end - n : end])] = end
        last = len(toks)
        for n in self.sizes:
            end = self.index[n].get(tuple(toks[last - n :])) if last >= n else None
            if end is not None:
                return [self._copy(end)]
        return []

    def _copy(self, end: int) -> list[int]:
        """The ``steps`` tokens from ``end`` on; past the last token the copy reads its own
        output (a match overlapping the suffix: a loop continues as a loop)."""
        toks, out = self.tokens, []
        for i in range(end, end + self.steps):
            out.append(toks[i] if i < len(toks) else out[i - len(toks)])
        return out


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}

    def best(self) -> list[tuple[int, _Node]]:
        """Children by count, most frequent first (ties: lower token id)."""
        return sorted(self.children.items(), key=lambda kv: (-kv[1].count, kv[0]))


class SuffixProposer(_Tokens):
    """Suffix decoding over one request: see the module docstring."""

    def __init__(self, min_match: int, max_match: int, steps: int, topk: int) -> None:
        super().__init__()
        self.min_match, self.max_match, self.steps, self.topk = min_match, max_match, steps, topk
        self.depth = max_match + steps
        self.root = _Node()
        #: ``active[i]``: the node of the request's last ``i`` tokens (``active[0]``: the root).
        self.active: list[_Node] = [self.root]

    def _append(self, token: int) -> None:
        grown = [self.root]
        for node in self.active[: self.depth]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            grown.append(child)
        self.active = grown

    def propose(self, prompt: Sequence[int], output: Sequence[int]) -> list[list[int]]:
        start = self.sync(prompt, output)
        for t in self.tokens[start:]:
            self._append(t)
        longest = min(self.max_match, len(self.active) - 1)
        for length in range(longest, self.min_match - 1, -1):
            node = self.active[length]
            if node.children:
                return [self._chain(t, child) for t, child in node.best()[: self.topk]]
        return []

    def _chain(self, first: int, node: _Node) -> list[int]:
        chain = [first]
        while len(chain) < self.steps and node.children:
            token, node = node.best()[0]
            chain.append(token)
        return chain


Proposer = NgramProposer | SuffixProposer

#: ``method -> options -> a new request's proposer``.
PROPOSERS: dict[str, Callable[[SpecOptions], Proposer]] = {
    "ngram": lambda o: NgramProposer(o.min_match, o.max_match, o.geometry.num_steps),
    "suffix": lambda o: SuffixProposer(o.min_match, o.max_match, o.geometry.num_steps, o.geometry.topk),
}
