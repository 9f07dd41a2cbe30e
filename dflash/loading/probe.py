"""The host probe: times the real target's one-token step and verifies in every candidate CPU setting (dtype ×
weight layout at the most threads, then fewer threads for the leader) and keeps the lowest expected ms per committed
token. `dflash.loading.host` caches what it finds per machine and model; this module only measures.

The timings are interleaved (a slow moment of a shared machine hits every candidate alike) and the fastest of a few
reps is kept (such moments only add time); a candidate that can no longer win is dropped mid-timing, which is what
keeps a first start to a few seconds.
"""

from __future__ import annotations

import copy
import math
import time
from functools import partial

import torch
from torch import nn

from dflash.decode.adaptive import PRIOR_ALPHA, expected_tokens
from dflash.models.packed import LAYOUTS, Float32Matmul, LayoutSwitch, TransposedLinear

PROBE_VERSION = 13  # 2: fewer threads for the leading dtype only; 3: layouts interleaved, fastest rep; 4: 64-token context;
# 5: scored by expected ms per token (pair or block verify), slow candidates dropped after one timing; 6: dtypes
# interleaved too, a context cast from float32's, fewer threads dropped like the rest, float32 matmuls for prefills;
# 7: warm-ups of one token, the low-precision copy cast while copying; 8: the leader's thread counts interleaved, a
# warm-up; 9: fewer threads not timed at a verify the leader timed far behind the other (pair or block); 10: a draft
# engine's near tie goes to the faster one-token step (`choose`), a lone candidate left is not timed again; 11: the
# context's keys and values drawn at random, not prefilled (`_context`); an untimed block bounded by the pair; 12: the
# warm-up ends once the steps are `steady`; a layout far behind at one layer's products not built
# (`layouts_worth_timing`); 13: int4 (the GGUF's Q4_1 blocks in dflash.models.lean) a candidate where the target has them
CONTEXT = 64  # positions in the KV cache while timing
REPS = 2  # timed forwards per shape and candidate (the fastest is kept), after one warm-up
THREAD_REPS = 3  # the same for the leader's thread counts, timed against each other (see `_thread_rows`)
WARM_S = 1.0  # seconds of one-token forwards before any timing: right after a load, a step ran 1.7-2x slower than a
# second later and sped up over ~1 s (bfloat16, 2 threads, AVX512_BF16 EPYC: 48 ms falling to 24 ms over 25 steps),
# so whichever candidate a probe timed first looked slower
WARM_FORWARDS = 40  # ... or this many forwards, whichever comes first (a tiny model's are ~1 ms each)
STEADY, STEADY_GAIN = 3, 0.03  # ... or, after WARM_MIN_S, once no dtype's last 3 forwards set a new best by more than
# 3 % (`steady`): on an AVX2-only EPYC the step is as fast at its first forward as a second later (float32 75, 74, 76,
# 74 ms; bfloat16 56, 54, 54, 54), and the full second was a fifth of a 4.7 s probe
WARM_MIN_S = 0.3  # the least warm-up: a speed-up that pauses for a few forwards is not taken for settled at once
FLOAT32_ROWS = 16  # prefills this long or longer may run their matmuls in float32 (see `matmul_ms`); shorter
# forwards (verifies of a block) stay in the dtype: measured on an AVX2-only CPU, a whole 8-token bfloat16 forward costs
# 162 ms natively and 193 ms with float32 matmuls (casting every weight outweighs 8 rows), 16 tokens 336 vs 285 ms
MATMUL_ROWS = 64  # rows of the product that decides it: a short chat prompt
SLOW = 1.5  # a candidate this many times slower than the leader at its first timing is not timed again (the same
# candidate's fastest time varied by up to 1.3x between five probes of one AVX2-only VM in an hour, so a close call is
# still timed in full)
SLOW_SIZE = 2.0  # of a pair and the block, a verify the leader's timings put this many times behind the other per
# expected token is not timed at fewer threads: `score_ms` takes the cheaper one. On an AVX2-only EPYC bfloat16's block
# of 8 cost 2.2x its pair per token and 500 ms a forward, timed at 2 thread counts x 3 reps: ~3 s of a 11-15 s probe.
# Decided from the leader's fastest of REPS timings, not from one first timing: a shape's first forward can cost
# 2-5x its later ones

LAYOUT_SKIP = 2.0  # a layout whose product through the largest linear layer costs this many times the other's, at
# one row and at the block's rows, is neither built for the whole model nor timed (`layouts_worth_timing`): on an
# AVX2-only EPYC bfloat16's transposed product cost 4.7-8.5x the linear one, and building that layout (0.2 s) and timing
# its step (0.21 s) was a tenth of a probe, while the one-layer test takes ~0.05 s. float32's layouts there are within
# 1.3x of each other at 1-8 rows, so both stay timed whole

CLOSE = 0.10  # a draft engine's candidates scoring within this fraction of the best are a tie, which the faster
# one-token step wins (`choose`). Such gaps are within a probe's noise: on an AVX2-only EPYC four first starts scored
# bfloat16 4-17 % ahead of float32 and an earlier one 8 % behind, while generation ran DFlash 1.16x and `ar` 1.3x
# faster in bfloat16, whose one-token step was the faster in every probe (59-68 ms against float32's 77-92)

def forward_ms(target, cache, n_tokens: int, gen: torch.Generator) -> float:
    """ms of one cached forward of `n_tokens` after the CONTEXT tokens in `cache` (cropped back afterwards)."""
    ids = torch.randint(0, target.vocab_size, (1, n_tokens), generator=gen)
    t0 = time.perf_counter()
    target.forward(ids, cache, capture=False)
    ms = (time.perf_counter() - t0) * 1000
    target.crop(cache, CONTEXT)
    return ms


def score_ms(ms: dict[int, float], block: int) -> float:
    """Expected ms per committed token, from forward times by token count (`ms`: 1, 2 and `block`). A no-draft
    engine takes one-token steps. A draft engine verifies blocks, and on a CPU its cost policy settles between a
    pair (the last token + one draft) and the full block, so the better of the two at the policy's prior acceptance
    scores it: a setting with a cheap pair and a slow long verify (bfloat16 on some CPUs) is worth what the policy
    makes of it. The draft's own pass is left out, small beside a verify (a few % of a block on the default models)."""
    if block == 1:
        return ms[1]
    return min(ms[n] / expected_tokens([PRIOR_ALPHA] * (n - 1)) for n in {2, block} if n in ms)  # `verifies` timed


def choose(rows: list[dict], block: int) -> dict:
    """The candidate row to run: the lowest `score_ms`; for a draft engine, of the rows within CLOSE of it (timed in
    full), the one with the fastest one-token step, since a draft engine also runs `ar` (the playground's Compare,
    `--method ar`) on its steps, and such a score gap is within the probe's noise."""
    best = min(rows, key=lambda r: r["score_ms"])
    if block == 1:
        return best
    close = [r for r in rows if "partial" not in r and r["score_ms"] <= (1 + CLOSE) * best["score_ms"]]
    return min(close or [best], key=lambda r: r["step_ms"])


def lower_bound(ms: dict[int, float], sizes: list[int], block: int) -> float:
    """`score_ms` with each size not timed yet taken at the cost of the largest size timed below it (a forward of
    more tokens costs no less): what a candidate scores at best, from its timings so far. Bounding the block by the
    pair, not the step, drops a candidate whose pair is already far behind before its block is timed (bfloat16 in
    the transposed layout on an AVX2-only EPYC: step 223 ms, pair 418, block of 8 1,500)."""
    filled, below = {}, ms[1]
    for n in sorted(sizes):
        below = filled[n] = ms.get(n, below)
    return score_ms(filled, block)


def _measure(variants: dict, block: int, reps: int = REPS, verifies: list[int] | None = None,
             warm: bool = True) -> dict:
    """The fastest of `reps` timings (after one warm-up forward unless `warm` is False) of one cached forward of 1,
    2 and `block` tokens (1 only without a draft) for each of `variants` (name → a function that puts that variant
    in place and returns its (target, cache)), with its score (`score_ms`), by variant name. Interleaved, so a slow
    moment of a shared machine hits every variant alike; the minimum, because such moments only add time.

    A variant that cannot win is not timed further (it would only lengthen a first start): in its first timed rep,
    once its `lower_bound` exceeds SLOW times the leader's score so far, its remaining sizes are skipped (their
    times are None, its score is that bound, `partial` says so); after that rep, a variant scoring SLOW times the
    leader is not timed again, nor a lone one left. `verifies`: time only these of the pair and the block
    (`deciding_sizes`; the score is the cheaper of those timed)."""
    sizes = [n for n in (sorted({1, 2, block}) if block > 1 else [1]) if n == 1 or verifies is None or n in verifies]
    gen = torch.Generator().manual_seed(block)
    times: dict = {(v, n): [] for v in variants for n in sizes}
    live, lead, first_score = dict(variants), math.inf, {}
    for rep in range(0 if warm else 1, reps + 1):
        for i, (name, put) in enumerate(live.items()):
            if rep == 0 and i:  # rep 0 warms up thread pools and allocator once, with its cheapest forward; a
                continue  # variant's first timing may still carry its own first-call costs, which the minimum discards
            target, cache = put()
            for n in sizes if rep else sizes[:1]:
                ms = forward_ms(target, cache, n, gen)
                if rep:
                    times[(name, n)].append(ms)
                first = {k: times[(name, k)][0] for k in sizes if times[(name, k)]}
                if rep == 1 and lower_bound(first, sizes, block) > SLOW * lead:
                    break
            if rep == 1 and len(first) == len(sizes):
                first_score[name] = score_ms(first, block)
                lead = min(lead, first_score[name])
        if rep == 1:
            live = {v: put for v, put in live.items() if first_score.get(v, math.inf) <= SLOW * lead}
            if len(live) < 2:  # nothing left to compare it with: more reps would only lengthen a first start
                break
    return {name: _timing({n: min(times[(name, n)]) for n in sizes if times[(name, n)]}, sizes, block) for name in variants}


def deciding_sizes(ms: dict[int, float], block: int) -> list[int]:
    """The sizes worth timing again after the timings `ms` (ms by token count: 1, 2 and `block`): the one-token
    step, and of the pair and the block each one within SLOW_SIZE of the other's ms per expected token (`score_ms`)."""
    sizes = sorted(ms)
    if block <= 2:
        return sizes
    per_token = {n: ms[n] / expected_tokens([PRIOR_ALPHA] * (n - 1)) for n in (2, block)}
    far = max(per_token, key=per_token.get)  # the costlier per token: dropped if far behind the other
    return [n for n in sizes if n != far or per_token[far] <= SLOW_SIZE * per_token[min(per_token, key=per_token.get)]]


def _row_ms(row: dict, block: int) -> dict[int, float]:
    """A candidate row's timings by token count (1, 2, `block`), the sizes not timed left out."""
    ms = {1: row["step_ms"]}
    if block > 1:
        ms.update({n: row[key] for n, key in ((2, "verify2_ms"), (block, "verify_ms")) if row[key] is not None})
    return ms


def _timing(ms: dict[int, float], sizes: list[int], block: int) -> dict:
    """A variant's row: its fastest time per size (None: not timed), its score (a lower bound when `partial`)."""
    def at(n):
        return (round(ms[n], 2) if n in ms else None) if block > 1 else 0.0  # no draft: no verify to time

    row = {"step_ms": round(ms[1], 2), "verify2_ms": at(2), "verify_ms": at(block),
           "score_ms": round(lower_bound(ms, sizes, block), 2)}
    return {**row, "partial": True} if len(ms) < len(sizes) else row


def _prepared(model: nn.Module, dtypes: list[str], q4=None) -> dict:
    """dtype → (Target over `model` in that dtype, its cache holding CONTEXT positions: `_context`). float32 runs on
    `model` itself, other dtypes on copies; int4 is a `LeanTarget` of the GGUF's Q4_1 layers (`q4`), sharing the
    bfloat16 copy's embedding and head."""
    from dflash.models.lean import LeanTarget, decoder_linear_weights
    from dflash.models.target import Target

    out = {}
    for dtype in dtypes:
        if dtype == "int4":  # a copy without the dense decoder weights, which the int4 layers replace
            copy_ = _copy_in(model, torch.bfloat16, skip=decoder_linear_weights(model))
            target = LeanTarget(copy_, None, dtype=torch.bfloat16, q4=q4.layers())
        else:
            target = Target(model if dtype == "float32" else _copy_in(model, getattr(torch, dtype)), None,
                            dtype=getattr(torch, dtype))
        out[dtype] = (target, _context(target))
    return out


def _context(target) -> object:
    """A cache of CONTEXT positions for `target` whose keys and values are drawn at random in its dtype: a forward's
    cost depends on the cache's length and shapes, not on its values, and filling it by a prefill cost 0.5-0.6 s of
    a 5.6 s probe on an AVX2-only EPYC (64 tokens in float32; several times that in bfloat16 there)."""
    config, gen = target.config, torch.Generator().manual_seed(CONTEXT)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = target.new_cache()
    for i in range(target.num_layers):
        keys, values = (torch.randn(1, heads, CONTEXT, head_dim, generator=gen).to(target.dtype) for _ in range(2))
        if hasattr(cache, "update"):
            cache.update(keys, values, i)
        else:  # dflash.models.lean.KVCache: [layers, heads, capacity, head_dim]
            cache.k[i, :, :CONTEXT], cache.v[i, :, :CONTEXT] = keys[0], values[0]
    if not hasattr(cache, "update"):
        cache.length = CONTEXT
    return cache


def _copy_in(model: nn.Module, dtype: torch.dtype, skip: list[torch.Tensor] = ()) -> nn.Module:
    """A copy of `model` whose parameters are cast while copying (tied ones stay tied): copying the float32
    weights first and casting them after would write every weight twice. `skip`: parameters left empty in the copy
    (the caller replaces them)."""
    empty = {id(p) for p in skip}
    memo = {id(p): nn.Parameter(p.detach().new_empty(0, dtype=dtype) if id(p) in empty else p.detach().to(dtype),
                                requires_grad=p.requires_grad) for p in model.parameters()}
    return copy.deepcopy(model, memo)


def _warm_up(prepared: dict, seconds: float, forwards: int = WARM_FORWARDS, least: float = WARM_MIN_S) -> int:
    """One-token forwards, the dtypes in turn, until `seconds` have passed, `forwards` were run, or `least` seconds
    have passed and every dtype's times are `steady` (see WARM_S); returns how many ran."""
    gen, t0, done = torch.Generator().manual_seed(0), time.perf_counter(), 0
    times: dict = {dtype: [] for dtype in prepared}

    def settled() -> bool:
        return time.perf_counter() - t0 >= least and all(map(steady, times.values()))

    while time.perf_counter() - t0 < seconds and done < forwards and not settled():
        for dtype, (target, cache) in prepared.items():
            times[dtype].append(forward_ms(target, cache, 1, gen))
            done += 1
    return done


def steady(times: list[float]) -> bool:
    """Whether a warm-up's forward times (oldest first) have settled: the last STEADY improved on the fastest before
    them by less than STEADY_GAIN. A step still speeding up (the 48 → 24 ms over 25 steps of WARM_S) keeps setting
    new bests; a settled one only repeats its best, give or take noise."""
    return len(times) > STEADY and min(times[-STEADY:]) >= (1 - STEADY_GAIN) * min(times[:-STEADY])


def _rows(timed: dict, dtypes: list[str], threads: int) -> list[dict]:
    """One candidate row per dtype from the (dtype, layout) timings: the faster layout, the other's score beside it
    (a layout timed in full before one dropped early, whose score is only a lower bound; None: not timed, see
    `layouts_worth_timing`)."""
    rows = []
    for dtype in dtypes:
        best, *other = sorted((lay for lay in LAYOUTS if (dtype, lay) in timed),
                              key=lambda lay: ("partial" in timed[(dtype, lay)], timed[(dtype, lay)]["score_ms"]))
        rows.append({"dtype": dtype, "threads": threads, "layout": best, **timed[(dtype, best)],
                     "other_layout_score_ms": timed[(dtype, other[0])]["score_ms"] if other else None})
    return rows


def _thread_rows(rows: list[dict], lead: dict, prepared: tuple, block: int, threads: list[int]) -> list[dict]:
    """`rows` with the leader timed again at every thread count in `threads` (most first), the counts interleaved
    (THREAD_REPS reps): its row at the most threads takes the new timing and the fewer-thread rows follow. Timed
    one after the other instead, the counts met different moments of the machine and a near tie went either way
    (measured on an AVX512_BF16 EPYC: the first probe after loading timed bfloat16's step at 2 threads 38 ms and at
    1 thread 32 ms, while generation ran 1.35x faster at 2)."""
    def at(n):
        torch.set_num_threads(n)
        return prepared

    old = _row_ms(lead, block)
    verifies = deciding_sizes(old, block) if block > 2 else None  # a verify far behind: not timed again
    timed = _measure({n: partial(at, n) for n in threads}, block, reps=THREAD_REPS, verifies=verifies)
    most = threads[0]
    if all(timed[n]["score_ms"] > SLOW * timed[most]["score_ms"] for n in threads[1:]):
        # The fewer threads fell far behind at their first timing, and a lone candidate is not timed again: with
        # nothing left to compare, the most threads' row takes its fastest of both stages' timings.
        new = _row_ms(timed[most], block)
        timed[most] = _timing({n: min(ms, old.get(n, ms)) for n, ms in new.items()}, sorted(new), block)
    again = [{"dtype": lead["dtype"], "threads": n, "layout": lead["layout"], **timed[n]} for n in threads]
    # Its layouts were compared at the most threads, and its score there made it the leader (kept: the new timing
    # may well put another dtype ahead, which is then the choice); so was a verify not timed again (far behind).
    again[0].update(other_layout_score_ms=lead["other_layout_score_ms"], lead_score_ms=lead["score_ms"],
                    verify_ms=again[0]["verify_ms"] if again[0]["verify_ms"] is not None else lead["verify_ms"])
    return [again[0] if r is lead else r for r in rows] + again[1:]


def probe(model: nn.Module, block: int, dtypes: list[str], threads: list[int], q4=None) -> dict:
    """Time the candidates on `model` and return the fastest (`HostSettings` fields); a few seconds on a 135M model.

    After a warm-up (WARM_S), every dtype in each weight layout worth timing (`layouts_worth_timing`: both, unless
    one is far behind at one decoder product) at the most threads, interleaved; then the leader at every thread
    count, interleaved (fewer threads for the leader only: what keeps a first start short). float32 runs on `model`
    itself, left in its faster layout; other dtypes on copies taken before any layout switch."""
    t0 = time.perf_counter()
    before = torch.get_num_threads()
    most = max(threads)
    try:
        torch.set_num_threads(most)
        prepared = _prepared(model, dtypes, q4)
        _warm_up(prepared, WARM_S)
        dense = [d for d in dtypes if d != "int4"]  # int4's lean decoder has one arrangement of its weights
        switches = {d: LayoutSwitch(prepared[d][0].model.model.layers) for d in dense}

        def put(dtype, layout):
            if dtype in switches:
                switches[dtype].set(layout)
            return prepared[dtype]

        worth = {d: layouts_worth_timing(prepared[d][0].model.model.layers, block) for d in dense}
        worth |= {d: (["linear"], {}) for d in dtypes if d not in switches}
        # No warm-up forward: `_warm_up` has just run every dtype's one-token step (thread pools, allocator)
        timed = _measure({(d, lay): partial(put, d, lay) for d in dtypes for lay in worth[d][0]}, block, warm=False)
        rows = _rows(timed, dtypes, most)
        lead = choose(rows, block)
        for d in dense:  # each copy keeps its faster layout (float32's is `model`'s); the other's weights go
            switches[d].set(next(r["layout"] for r in rows if r["dtype"] == d))
        if len(threads) > 1:
            rows = _thread_rows(rows, lead, prepared[lead["dtype"]], block, sorted(threads, reverse=True))
        best = choose(rows, block)
        matmul = {}
        if best["dtype"] not in ("float32", "int4"):
            torch.set_num_threads(best["threads"])
            matmul = matmul_ms(prepared[best["dtype"]][0].model.model.layers, MATMUL_ROWS)
    finally:
        torch.set_num_threads(before)
    return dict(dtype=best["dtype"], threads=best["threads"], layout=best["layout"], probe_s=round(time.perf_counter() - t0, 2),
                candidates=rows, float32_from_rows=float32_rows(matmul), matmul_ms=matmul,
                layout_ms={d: ms for d, (_, ms) in worth.items()})


def matmul_ms(layers: nn.Module, rows: int, reps: int = 3) -> dict:
    """ms of one product of `rows` rows through the largest linear layer under `layers` (in the model's dtype and
    layout) as it is and as `Float32Matmul`: the fastest of `reps`, interleaved, after a warm-up of each."""
    layer = _largest_linear(layers)
    best = _fastest_ms({"native": layer, "float32": Float32Matmul(layer)}, _rows_in(layer, [rows]), reps)
    return {"rows": rows, **{way: ms for (way, _), ms in best.items()}}


def layouts_worth_timing(layers: nn.Module, block: int, reps: int = 2) -> tuple[list[str], dict]:
    """The layouts worth building for all of `layers` and timing whole: both, unless a product through the largest
    linear layer in one costs LAYOUT_SKIP times the other's at one row and at `block` rows (a copy of that layer in
    the other layout is built to tell). Returns them and that product's ms, {layout: {rows: ms}}."""
    layer = _largest_linear(layers)
    transposed = type(layer) is TransposedLinear
    ways = dict(zip(LAYOUTS, (layer.to_linear(), layer) if transposed else (layer, TransposedLinear(layer)), strict=True))
    best = _fastest_ms(ways, _rows_in(layer, sorted({1, block})), reps)
    # row counts as strings: what a JSON round trip (the cache, --json) makes of them
    ms = {lay: {str(n): t for (way, n), t in best.items() if way == lay} for lay in LAYOUTS}
    behind = [lay for lay in LAYOUTS if all(ms[lay][n] > LAYOUT_SKIP * min(ms[o][n] for o in LAYOUTS) for n in ms[lay])]
    return [lay for lay in LAYOUTS if lay not in behind], ms


def _largest_linear(layers: nn.Module) -> nn.Module:
    return max((m for m in layers.modules() if type(m) in (nn.Linear, TransposedLinear)),
               key=lambda m: next(m.parameters()).numel())


def _rows_in(layer: nn.Module, counts: list[int]) -> dict[int, torch.Tensor]:
    """Random inputs of each row count for `layer`, in its weights' dtype."""
    gen, dtype = torch.Generator().manual_seed(max(counts)), next(layer.parameters()).dtype
    return {n: torch.randn(n, layer.in_features, generator=gen).to(dtype) for n in counts}


def _fastest_ms(ways: dict, inputs: dict, reps: int) -> dict:
    """{(way, input name): ms}: the fastest of `reps` timings of each function in `ways` on each of `inputs`,
    interleaved, after a warm-up of each."""
    best = {(way, name): math.inf for way in ways for name in inputs}
    with torch.inference_mode():
        for rep in range(reps + 1):
            for way, f in ways.items():
                for name, x in inputs.items():
                    t = time.perf_counter()
                    f(x)
                    if rep:
                        best[(way, name)] = min(best[(way, name)], (time.perf_counter() - t) * 1000)
    return {k: round(v, 3) for k, v in best.items()}


def float32_rows(matmul: dict) -> int:
    """FLOAT32_ROWS when float32 products clearly beat the dtype's own (under 0.8× its time), else 0 (never)."""
    return FLOAT32_ROWS if matmul and matmul["float32"] < 0.8 * matmul["native"] else 0
