"""The training corpus, streamed from disk: shards stay memory-mapped and only the feature columns of the target
layers the draft fuses are read, one sequence at a time.

Token ids, offsets and labels (8 bytes a token) are held in memory; features ([T, k*H] bf16) and the target's
final hidden states ([T, H] bf16, for the KL term) are read from the mapped files when a sequence is used, so a
corpus of millions of tokens trains in a few GB of RAM (the page cache holds what fits).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


class Sequence:
    """One training sequence: `ids`, `labels`, `prompt_len` in memory; `feats` and `final` read on access.

    `labels[p]` is the token the target itself emits at position p: the sequence token for regenerated data,
    the target's greedy prediction from p-1 for teacher-forced data (`target_pred`).
    """

    __slots__ = ("ids", "labels", "prompt_len", "_shard", "_lo", "_hi", "_cols", "_with_final")

    def __init__(self, ids, labels, prompt_len: int, shard, lo: int, hi: int, cols: torch.Tensor | None,
                 with_final: bool = False):
        self.ids, self.labels, self.prompt_len = ids, labels, prompt_len
        self._shard, self._lo, self._hi, self._cols = shard, lo, hi, cols
        self._with_final = with_final  # the target's last layer is a feature, read from `final_hidden`

    def __len__(self) -> int:
        return self._hi - self._lo

    @property
    def feats(self) -> torch.Tensor:
        """[T, k*H] bf16: the fused target layers' outputs at every position."""
        rows = self._shard.get_slice("features")[self._lo:self._hi]
        rows = rows if self._cols is None else rows[:, self._cols]
        return torch.cat([rows, self.final], -1) if self._with_final else rows

    @property
    def final(self) -> torch.Tensor:
        """[T, H] bf16: the target's last normed hidden state (teacher logits = lm_head(final))."""
        return self._shard.get_slice("final_hidden")[self._lo:self._hi]

    def __getitem__(self, key: str):  # dict-style access, as the trainer reads sequences
        return getattr(self, key)


def feature_columns(stored: list[int], wanted: list[int], hidden: int) -> torch.Tensor | None:
    """Column indices of `wanted` layers inside features stored for `stored` layers; None when they are equal."""
    missing = [j for j in wanted if j not in stored]
    if missing:
        raise ValueError(f"target layers {missing} are not in the data (stored: {stored})")
    if list(wanted) == list(stored):
        return None
    spans = [torch.arange(stored.index(j) * hidden, (stored.index(j) + 1) * hidden) for j in wanted]
    return torch.cat(spans) if spans else torch.empty(0, dtype=torch.long)


def split_last_layer(stored: list[int], wanted: list[int], num_layers: int) -> tuple[list[int], bool]:
    """(the wanted layers read from `features`, whether the target's last layer is read from `final_hidden`).

    Every shard keeps the final normed hidden state, which is what the last layer means as a feature (transformers
    reports hidden_states[L] after the final norm), so a draft may fuse it although `features` lacks it; it must
    then come last, the order `features` + `final_hidden` are concatenated in."""
    last = num_layers - 1
    if last not in wanted or last in stored:
        return list(wanted), False
    if wanted[-1] != last:
        raise ValueError(f"target layers {wanted}: the last layer ({last}) is read from final_hidden and must come last")
    return list(wanted[:-1]), True


class Corpus:
    """Sequences from one or more data directories (comma-separated). The last `holdout` shards of each
    directory are held out for the teacher-forced metrics."""

    def __init__(self, data_dirs: str, layer_ids: list[int], holdout: int):
        from safetensors import safe_open

        self.train: list[Sequence] = []
        self.heldout: list[Sequence] = []
        for data_dir in data_dirs.split(","):
            meta = json.loads((Path(data_dir) / "meta.json").read_text())
            from_features, with_final = split_last_layer(meta["layer_ids"], layer_ids, meta["num_target_layers"])
            cols = feature_columns(meta["layer_ids"], from_features, meta["hidden_size"])
            self.meta = meta
            paths = sorted(Path(data_dir).glob("shard_*.safetensors"))
            keep_out = holdout if len(paths) > holdout else 0
            for s, path in enumerate(paths):
                shard = safe_open(str(path), framework="pt")  # memory-mapped; tensors are read per slice
                dest = self.heldout if s >= len(paths) - keep_out else self.train
                dest.extend(self._sequences(shard, cols, with_final))

    @staticmethod
    def _sequences(shard, cols, with_final: bool) -> list[Sequence]:
        ids_all = shard.get_tensor("input_ids")
        off = shard.get_tensor("offsets").tolist()
        plens = shard.get_tensor("prompt_lens").tolist()
        pred = shard.get_tensor("target_pred") if "target_pred" in shard.keys() else None
        out = []
        for i in range(len(off) - 1):
            ids = ids_all[off[i]:off[i + 1]]
            labels = ids if pred is None else torch.cat([ids[:1], pred[off[i]:off[i + 1] - 1]])
            out.append(Sequence(ids, labels, int(plens[i]), shard, off[i], off[i + 1], cols, with_final))
        return out

    def n_tokens(self) -> int:
        """Response tokens in the training split (the positions a block can be anchored on)."""
        return sum(len(s) - s.prompt_len for s in self.train)

    def token_counts(self, vocab: int) -> torch.Tensor:
        counts = torch.zeros(vocab, dtype=torch.long)
        for s in self.train:
            counts += torch.bincount(s.labels[s.prompt_len:], minlength=vocab)
        return counts


def frequent_vocab(counts: torch.Tensor, size: int, always: list[int]) -> torch.Tensor:
    """`always` (stop ids) and the most frequent other response tokens (FR-Spec): `size` ids in all (more only when
    `always` alone has more), sorted."""
    keep = set(always)
    top = torch.topk(counts, min(size + len(keep), counts.numel())).indices.tolist()
    ids = sorted(set([t for t in top if t not in keep][: max(size - len(keep), 0)]) | keep)
    return torch.tensor(ids, dtype=torch.long)
