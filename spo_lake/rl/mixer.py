"""The stream mixer: every batch as fixed per-stream counts of lake rows and online rollouts."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spo_lake.rl.data import LakeStream
from spo_lake.rl.examples import Example
from spo_lake.rl.rollout import OnlineSource


class Mixer:
    """Draws every batch as fixed per-stream counts (fraction × batch size, spo_lake.rl.config.stream_counts),
    in stream order. Lake streams give their next rows; the online source gives the rollouts scheduled for the step
    (its worker started before the first draw). Rank `rank` of `ranks` training processes reads every lake stream's
    next `ranks` × count rows and keeps its contiguous share of them. Streams in `joined` (GRPO `inject` streams)
    come with the online source's rollouts, joined to their groups."""

    def __init__(self, counts: list[int], lake_streams: dict[int, LakeStream], online: OnlineSource | None = None, *,
                 joined: Sequence[int] = (), rank: int = 0, ranks: int = 1):
        self.counts, self.lake_streams, self.online = counts, lake_streams, online
        self.online_index = online.stream_index if online is not None else None
        self.joined = set(joined)
        self.rank, self.ranks = rank, ranks

    def draw(self, step: int) -> list[Example]:
        batch: list[Example] = []
        for index, count in enumerate(self.counts):
            if index == self.online_index:
                assert self.online is not None
                batch += self.online.take(step, count)
            elif index not in self.joined:
                batch += self.lake_streams[index].take(count * self.ranks)[self.rank * count : (self.rank + 1) * count]
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {str(i): s.state_dict() for i, s in self.lake_streams.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, s in self.lake_streams.items():
            s.load_state_dict(state[str(i)])

    def close(self) -> None:
        for stream in self.lake_streams.values():
            stream.close()
