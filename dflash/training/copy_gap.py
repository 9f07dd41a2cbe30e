"""Where a draft's first proposal fails, measured with the real loop: blocks whose next token copying would give.

The target often repeats itself (names, code, lists). A lookup in the context — find the most recent earlier
occurrence of the anchor, with the token before it when possible, and propose the token that followed it — often
predicts the target's next token there. A one-layer DFlash draft cannot compute that lookup: a masked block position's
query comes from the MASK embedding and its position only, so where it attends in the context cannot depend on the
anchor. With two layers it can (the first layer brings the anchor into the masked position; the second looks it up).
This module splits the first drafted position's acceptance by what copying could have done there.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from dflash.decode.engine import Engine
from dflash.decode.events import Finished, Started, Verify
from dflash.decode.lookup import find
from dflash.training.evaluate import prompt_request

KINDS = ("bigram", "unigram", "none")  # what the context holds for the anchor: see `copy_match`


def copy_match(tokens: Sequence[int]) -> tuple[str, int | None]:
    """Where copying would copy from after tokens[-1] (the anchor): ("bigram", j) when the last two tokens occurred
    together earlier, their most recent occurrence ending at j < len - 1 (what the engine's `lookup_ngram=2`
    copies); else ("unigram", j) for the anchor's most recent earlier occurrence; else ("none", None). The copied
    token is tokens[j + 1]."""
    tokens = list(tokens)
    for kind, n in (("bigram", 2), ("unigram", 1)):
        j = find(tokens, n)
        if j is not None:
            return kind, j
    return "none", None


def copy_candidate(tokens: Sequence[int]) -> tuple[str, int | None]:
    """(kind, the token copying proposes after tokens[-1]) — see `copy_match`; ("none", None) without a match."""
    kind, j = copy_match(tokens)
    return kind, None if j is None else tokens[j + 1]


def block_rows(events: Iterable) -> list[dict]:
    """One row per verify of a request's events: the kind of position and the copy candidate, whether the first
    drafted token and the candidate equal the target's token there, and how many drafts were accepted. The
    context is the prompt and every committed token up to the anchor (the verify's `start`)."""
    events = list(events)
    prompt = next(e.prompt_ids for e in events if isinstance(e, Started))
    done = next((e for e in events if isinstance(e, Finished)), None)
    if done is None or done.reason == "error":
        raise RuntimeError(f"copy gap: the request did not finish ({done.message if done else 'no Finished event'})")
    seq = list(prompt) + list(done.output_ids)
    rows = []
    for v in events:
        if isinstance(v, Verify) and v.draft_tokens:
            kind, cand = copy_candidate(seq[: v.start + 1])
            truth = v.target_tokens[0]
            rows.append({"kind": kind, "candidate": cand, "draft": v.draft_tokens[0] == truth, "copy": cand == truth,
                         "accepted": v.accepted_len})
    return rows


def summarize(rows: list[dict]) -> dict:
    """Per kind: blocks, and the first-position hit rate of the draft, of copying, and of either; τ over all rows
    (the engine's: mean accepted + 1)."""
    out: dict = {"tau": sum(r["accepted"] + 1 for r in rows) / len(rows) if rows else 0.0}
    for kind in KINDS + ("all",):
        sel = [r for r in rows if kind in ("all", r["kind"])]
        n = len(sel)
        rate = lambda f: sum(map(f, sel)) / n if n else 0.0  # noqa: E731
        out[kind] = {"blocks": n, "share": n / len(rows) if rows else 0.0, "draft": rate(lambda r: r["draft"]),
                     "copy": rate(lambda r: r["copy"]), "either": rate(lambda r: r["draft"] or r["copy"])}
    return out


def copy_gap(engine: Engine, prompts: Iterable[Sequence[int] | str], max_new_tokens: int,
             block_size: int | None = None) -> dict:
    """Greedy DFlash on every prompt with a fixed block (as the training curve's τ), then `summarize`."""
    rows = []
    for p in prompts:
        rows += block_rows(engine.stream(prompt_request(p, max_new_tokens=max_new_tokens, block_size=block_size,
                                                        adaptive="fixed")))
    return summarize(rows)


def markdown_table(results: list[dict]) -> list[str]:
    """Rows of `summarize` results (with a `label`) as a markdown table: first-position hit rates per kind."""
    rows = ["| draft | τ | blocks | anchor bigram seen before (share): draft / copy | anchor seen before (share): "
            "draft / copy | not seen (share): draft | all: draft / copy / either |", "|---|---|---|---|---|---|---|"]
    for r in results:
        b, u, n, a = r["bigram"], r["unigram"], r["none"], r["all"]
        rows.append(f"| {r['label']} | {r['tau']:.3f} | {a['blocks']:,} | ({b['share']:.0%}) **{b['draft']:.3f}** / "
                    f"{b['copy']:.3f} | ({u['share']:.0%}) **{u['draft']:.3f}** / {u['copy']:.3f} | ({n['share']:.0%}) "
                    f"**{n['draft']:.3f}** | **{a['draft']:.3f}** / {a['copy']:.3f} / {a['either']:.3f} |")
    return rows
