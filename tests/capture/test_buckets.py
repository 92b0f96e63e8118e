"""Bucket ladder and the bucket a batch of ``bs`` requests is padded to."""

from __future__ import annotations

import pytest

from graphrt.capture import BucketPolicy, default_buckets

LADDER_256 = (
    1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128,
    136, 144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256,
)  # fmt: skip


def smallest_at_least(buckets: tuple[int, ...], bs: int) -> int | None:
    """Reference for ``bucket_for``: a linear scan."""
    return next((b for b in buckets if b >= bs), None)


def test_ladder_256() -> None:
    assert len(LADDER_256) == 36
    assert default_buckets(256) == LADDER_256


def test_ladder_past_256_steps_by_16_and_ends_at_max() -> None:
    assert default_buckets(300) == (*LADDER_256, 272, 288, 300)
    assert default_buckets(288) == (*LADDER_256, 272, 288)
    assert default_buckets(512)[-3:] == (480, 496, 512)
    assert len(default_buckets(512)) == 36 + 16


@pytest.mark.parametrize(
    ("max_bs", "ladder"),
    [
        (1, (1,)),
        (2, (1, 2)),
        (3, (1, 2, 3)),
        (5, (1, 2, 4, 5)),
        (8, (1, 2, 4, 8)),
        (13, (1, 2, 4, 8, 12, 13)),
        (20, (1, 2, 4, 8, 12, 16, 20)),
        (24, (1, 2, 4, 8, 12, 16, 24)),
        (250, (*LADDER_256[:-1], 250)),
        (257, (*LADDER_256, 257)),
    ],
)
def test_small_and_odd_maxima(max_bs: int, ladder: tuple[int, ...]) -> None:
    assert default_buckets(max_bs) == ladder


def test_max_always_included_and_sorted() -> None:
    for max_bs in range(1, 601):
        ladder = default_buckets(max_bs)
        assert ladder[-1] == max_bs
        assert ladder[0] == 1
        assert ladder == tuple(sorted(set(ladder)))


@pytest.mark.parametrize("max_bs", [0, -4])
def test_default_rejects_nonpositive(max_bs: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        default_buckets(max_bs)


def test_policy_default_is_the_ladder() -> None:
    assert BucketPolicy.create(256).buckets == LADDER_256
    assert BucketPolicy.create(5).largest == 5


def test_policy_user_list_sorted_deduplicated_and_max_added() -> None:
    assert BucketPolicy.create(16, [8, 2, 8, 4]).buckets == (2, 4, 8, 16)
    assert BucketPolicy.create(16, [16, 1]).buckets == (1, 16)
    assert BucketPolicy.create(16, (3,)).largest == 16


@pytest.mark.parametrize("buckets", [[0, 4], [-1], [4, 17], [17], []])
def test_policy_user_list_out_of_range(buckets: list[int]) -> None:
    with pytest.raises(ValueError, match=r"1\.\.16"):
        BucketPolicy.create(16, buckets)


@pytest.mark.parametrize(
    ("max_bs", "buckets"), [(256, None), (300, None), (5, None), (1, None), (16, [2, 5, 9]), (40, [40])]
)
def test_bucket_for_every_bs(max_bs: int, buckets: list[int] | None) -> None:
    policy = BucketPolicy.create(max_bs, buckets)
    for bs in range(1, max_bs + 1):
        bucket = policy.bucket_for(bs)
        assert bucket == smallest_at_least(policy.buckets, bs), bs
        assert bucket is not None and bucket >= bs
    for bs in (max_bs + 1, max_bs + 2, 10 * max_bs):
        assert policy.bucket_for(bs) is None


def test_bucket_for_examples() -> None:
    policy = BucketPolicy.create(300)
    assert [policy.bucket_for(bs) for bs in (1, 2, 3, 5, 9, 13, 17, 255, 257, 273, 289, 300, 301)] == [
        1, 2, 4, 8, 12, 16, 24, 256, 272, 288, 300, 300, None,
    ]  # fmt: skip
    user = BucketPolicy.create(16, [2, 5, 9])
    assert [user.bucket_for(bs) for bs in range(1, 18)] == [2, 2, 5, 5, 5, 9, 9, 9, 9, *[16] * 7, None]
