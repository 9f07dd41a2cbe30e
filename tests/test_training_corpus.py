"""The streamed corpus reads exactly what the shards hold, only the chosen layers' columns."""

import pytest
import torch

from dflash.training.corpus import Corpus, feature_columns, frequent_vocab
from dflash.training.data import load_shards, sort_in_windows


def test_streamed_sequences_match_the_shards(data_dir):
    shards = load_shards(str(data_dir / "data"))
    corpus = Corpus(str(data_dir / "data"), [2], holdout=1)
    assert len(corpus.train) == 8 and len(corpus.heldout) == 4
    seqs = corpus.train + corpus.heldout
    i = 0
    for shard in shards:
        off = shard["offsets"].tolist()
        for a, b in zip(off, off[1:]):
            s = seqs[i]
            assert s["ids"].tolist() == shard["input_ids"][a:b].tolist() == s["labels"].tolist()
            assert torch.equal(s["feats"], shard["features"][a:b, 64:])  # layer 2 is the second stored block
            assert torch.equal(s["final"], shard["final_hidden"][a:b])
            i += 1
    assert i == len(seqs)
    assert corpus.n_tokens() == sum(len(s) - s.prompt_len for s in corpus.train)


def test_all_stored_layers_are_read_without_a_column_copy(data_dir):
    corpus = Corpus(str(data_dir / "data"), [1, 2], holdout=0)
    assert corpus.train[0]["feats"].shape[1] == 128
    assert feature_columns([1, 2], [1, 2], 64) is None
    assert feature_columns([1, 2, 5], [5, 1], 2).tolist() == [4, 5, 0, 1]
    with pytest.raises(ValueError, match=r"\[7\]"):
        Corpus(str(data_dir / "data"), [7], holdout=0)


def test_the_last_layer_is_read_from_the_final_hidden_states(data_dir):
    # The tiny target has 4 layers; the shards store layers 1, 2 and (as every shard does) the final normed state,
    # which is what layer 3 means as a feature (transformers' hidden_states[4]).
    shard = load_shards(str(data_dir / "data"))[0]
    seq = Corpus(str(data_dir / "data"), [2, 3], holdout=0).train[0]
    n = len(seq)
    assert torch.equal(seq["feats"], torch.cat([shard["features"][:n, 64:], shard["final_hidden"][:n]], -1))
    only = Corpus(str(data_dir / "data"), [3], holdout=0).train[0]
    assert torch.equal(only["feats"], shard["final_hidden"][:n])
    with pytest.raises(ValueError, match="must come last"):
        Corpus(str(data_dir / "data"), [3, 1], holdout=0)


def test_frequent_vocab_keeps_stop_ids():
    counts = torch.tensor([5, 0, 9, 1, 7])
    assert frequent_vocab(counts, 3, always=[1]).tolist() == [1, 2, 4]
    assert frequent_vocab(counts, 3, always=[2]).tolist() == [0, 2, 4]  # a kept id among the most frequent: still 3
    assert frequent_vocab(counts, 1, always=[1, 3]).tolist() == [1, 3]  # a negative slice took all but the last


def test_windowed_sort_keeps_every_row_and_sorts_each_window():
    rows = [7, 3, 9, 1, 8, 2, 6, 5, 4]
    out = sort_in_windows(rows, 4, key=lambda x: x)
    assert out == [1, 3, 7, 9, 2, 5, 6, 8, 4]
    assert sorted(out) == sorted(rows)


def test_conversation_turns_keep_the_history_and_stop_at_a_broken_turn():
    from dflash.loading.datasets import conversation_turns

    conv = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                              {"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"},
                              {"from": "gpt", "value": "again"}, {"from": "human", "value": "x"}]}
    pairs = conversation_turns(conv)
    assert [r for _, r in pairs] == ["Hello!", "4"]
    assert pairs[1][0] == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                           {"role": "user", "content": "2+2?"}]
    french = {"conversations": [{"from": "human", "value": "ça va ? éèà"}, {"from": "gpt", "value": "oui"}]}
    assert conversation_turns(french) == []
