"""CPU settings chosen for the host by measuring the real target: dtype, torch threads and the layout of the
decoder's linear weights.

Machines of the same kind differ (AVX2 only; AVX-512; AVX-512 with native bfloat16), and the fastest settings
on one are slow on another, so nothing here is decided from a table: `dflash.loading.probe` times the target's one-token step
and a verify of the draft's block size for each candidate and keeps the fastest. The result is cached per machine
(CPU model and flags, usable cores, torch version) and per model, so a restart reads it back in milliseconds.

What the user fixes (`--dtype`, `--threads`, DFLASH_THREADS) is never probed over. float32 is the exact mode
(greedy DFlash output equals the no-draft output token for token); bfloat16 is the fast mode, identical except
at numerical ties (the multi-token verify rounds differently from the one-token step) — the stats say which.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from dflash.models.packed import LAYOUTS
from dflash.loading.probe import PROBE_VERSION, probe

log = logging.getLogger("dflash")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


SIMD_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
              "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")


def cpu_flags() -> list[str]:
    """The SIMD flags that decide CPU speed (bfloat16 is native only with avx512_bf16 / amx_bf16)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in SIMD_FLAGS if f in have]
    except OSError:
        pass
    return []


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_problem(threads: int) -> str | None:
    """What is wrong with a thread count given by a user, or None: more threads than usable cores only contend (999 on
    a 2-core machine ran 50x slower than 2)."""
    cores = usable_cores()
    return None if 1 <= threads <= cores else f"must be in [1, {cores}] (this machine's usable cores), got {threads}"


def thread_candidates(cores: int | None = None) -> list[int]:
    """1, half the cores and all of them: on a shared or small machine fewer threads can be faster."""
    n = cores or usable_cores()
    return sorted({1, max(1, n // 2), n})


SOURCES = ("probe", "cache", "default", "user")


@dataclass(frozen=True)
class HostSettings:
    """The CPU settings in force and where they came from.

    source: "probe" (measured now), "cache" (measured on an earlier start), "default" (DFLASH_PROBE=0: not
    measured), "user" (all fixed by the caller).
    candidates: what the probe measured, one dict per (dtype, threads): step_ms (one token), verify2_ms (two),
    verify_ms (`block` tokens), score_ms (what was minimised: `score_ms`), layout (the faster linear layout for that
    dtype), partial (present when the candidate was dropped before every size was timed: None for those, and
    score_ms is a lower bound). Every dtype at the most threads; fewer threads for the dtype that led there.
    float32_from_rows: forwards of at least this many tokens (prefills) run the decoder's matmuls in float32
    (`dflash.models.packed.Float32Matmul`), because `matmul_ms` (one decoder product of MATMUL_ROWS rows, as it is and in
    float32) measured that it pays on this machine; 0: never (float32 chosen, or the dtype's products are fast).
    layout_ms: per dtype, one decoder product in each layout by row count (`layouts_worth_timing`); a layout far
    behind there was not timed whole (its row's other_layout_score_ms is None).
    """

    dtype: str
    threads: int
    layout: str
    source: str
    block: int = 1
    probe_s: float = 0.0
    float32_from_rows: int = 0
    matmul_ms: dict = field(default_factory=dict)
    layout_ms: dict = field(default_factory=dict)
    candidates: list[dict] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    load_per_core: float | None = None  # the 1-minute load average per usable core when probed (None: not recorded)

    def __post_init__(self) -> None:
        # Also rebuilt from a JSON cache a person may have edited: a wrong value is refused here (ValueError: the
        # cache is ignored and the host probed again), not met later as threads "2" in torch.set_num_threads.
        whole = {"threads": 1, "block": 1, "float32_from_rows": 0}
        bad = [f"{k}={getattr(self, k)!r}" for k, lo in whole.items()
               if type(getattr(self, k)) is not int or getattr(self, k) < lo]
        bad += [f"{k}={getattr(self, k)!r}" for k, allowed in (("dtype", ("float32", "bfloat16", "float16", "int4")),
                                                                ("layout", LAYOUTS), ("source", SOURCES))
                if getattr(self, k) not in allowed]
        if type(self.probe_s) not in (int, float) or not isinstance(self.candidates, list) \
                or not all(isinstance(c, dict) for c in self.candidates):
            bad.append("probe_s or candidates")
        if bad:
            raise ValueError(f"host settings: {', '.join(bad)}")

    @property
    def exact(self) -> bool:
        return self.dtype == "float32"

    @property
    def mode(self) -> str:
        """"exact" (float32: greedy DFlash output equals the no-draft output token for token) or "fast"."""
        return "exact" if self.exact else "fast"

    def to_dict(self) -> dict:
        return {**asdict(self), "mode": self.mode}

    def origin(self) -> str:
        """Where the settings came from: 'probed in 3.1 s', 'probe cached', 'not probed' or 'set by the user'."""
        how = {"probe": f"probed in {self.probe_s:.1f} s", "cache": "probe cached", "default": "not probed (DFLASH_PROBE=0)",
               "user": "set by the user"}
        return how.get(self.source, self.source)

    def numbers(self) -> str:
        """The probe's timing of the chosen settings: '1-token step 45 ms, 8-token verify 86 ms (probe cached)'."""
        row = next((r for r in self.candidates if (r["dtype"], r["threads"]) == (self.dtype, self.threads)), None)
        how = self.origin()
        if row is None:
            return f"settings: {how}"
        verify = ""
        if self.block > 1:  # a fewer-threads row may have no block timed (far behind its pair): its pair, then
            n, ms = (self.block, row["verify_ms"]) if row.get("verify_ms") is not None else (2, row.get("verify2_ms"))
            verify = f", {n}-token verify {ms:.0f} ms" if ms is not None else ""
        return f"1-token step {row['step_ms']:.0f} ms{verify} ({how})"

    @property
    def weights(self) -> str:
        """How the decoder's weights are held: 'transposed layout', or for int4 'GGUF Q4_1 blocks as int4'."""
        return "GGUF Q4_1 blocks as int4" if self.dtype == "int4" else f"{self.layout} layout"

    def summary(self) -> str:
        """One line for a stats panel: 'float32 · 2 threads · transposed layout (exact; probed in 3.1 s)'."""
        mode = self.mode if self.exact else "fast mode: identical except at numerical ties"
        prompts = " · prompts in float32 matmuls" if self.float32_from_rows else ""
        return f"{self.dtype} · {self.threads} thread{'s' * (self.threads != 1)} · {self.weights}{prompts} " \
               f"({mode}; {self.origin()})"


def machine_key() -> dict:
    return {"cpu_model": cpu_model(), "cpu_flags": cpu_flags(), "cores": usable_cores(), "torch": torch.__version__,
            "probe_version": PROBE_VERSION}


def cache_key(model_id: str, block: int, dtypes: list[str], threads: list[int]) -> str:
    raw = json.dumps({**machine_key(), "model": model_id, "block": block, "dtypes": dtypes, "threads": threads},
                     sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


# A probe taken while every core was busy with other work times each candidate several times too slow, unevenly:
# its choice can be far from the fastest (seen: float32 on 1 thread at 0.6x the best setting). Such a cached choice
# is measured again once the machine is quiet; one taken quiet is kept for good (DFLASH_PROBE=refresh re-measures).
BUSY_LOAD, QUIET_LOAD = 1.0, 0.5  # 1-minute load average per usable core


def load_per_core() -> float | None:
    try:
        return round(os.getloadavg()[0] / usable_cores(), 2)
    except (AttributeError, OSError):  # no load average on this platform
        return None


def read_cached(path: Path, key: str) -> HostSettings | None:
    """The cached choice for `key`, or None to probe again: none cached, unreadable, or taken on a busy machine that
    is quiet now."""
    try:
        entry = json.loads(path.read_text()).get(key)
        found = HostSettings(**{**entry, "source": "cache"}) if isinstance(entry, dict) else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # missing, unreadable, not a table or from another version: probe again
    if found and (problem := threads_problem(found.threads)):  # an edited entry: 2**80 overflowed torch's int
        log.warning("the cached CPU settings do not fit this machine (threads: %s): measuring again", problem)
        return None
    now = load_per_core()
    if found and found.load_per_core is not None and found.load_per_core >= BUSY_LOAD and now is not None \
            and now < QUIET_LOAD:
        log.info("the cached CPU settings were measured on a busy machine (load %.2f per core); measuring again now "
                 "that it is quiet (%.2f)", found.load_per_core, now)
        return None
    return found


CACHE_ENTRIES = 32  # choices kept per file, the newest: one per model and block size in use on this machine


def write_cached(path: Path, key: str, settings: HostSettings) -> None:
    """Best effort (a read-only home must not stop a start): merge into the file, replace it atomically. Entries of
    another machine key (an older probe version or torch, a resized VM) can never be read again and are dropped, and
    only the CACHE_ENTRIES newest are kept, so the file does not grow with every model directory ever probed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        kept = [(k, v) for k, v in (table.items() if isinstance(table, dict) else ())
                if k != key and isinstance(v, dict) and v.get("machine") == settings.machine]
        table = dict(kept[-(CACHE_ENTRIES - 1):]) | {key: asdict(settings)}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def env_threads() -> int | None:
    """DFLASH_THREADS, when set: the thread count the operator fixed."""
    raw = os.environ.get("DFLASH_THREADS", "").strip()
    if not raw:
        return None
    from dflash.errors import ValidationError

    if not raw.isdigit():
        raise ValidationError("DFLASH_THREADS", f"must be a whole number >= 1, got {raw!r}")
    if problem := threads_problem(int(raw)):
        raise ValidationError("DFLASH_THREADS", problem)
    return int(raw)


def env_dtype() -> str | None:
    """DFLASH_DTYPE, when set: the dtype the operator fixed, as `--dtype` does for the CLI (e.g. float32 for long
    prompts on a CPU whose bfloat16 decodes fast but prefills slowly)."""
    raw = os.environ.get("DFLASH_DTYPE", "").strip()
    if raw in ("", "auto"):
        return None
    if raw not in ("float32", "bfloat16", "int4"):
        from dflash.errors import ValidationError

        raise ValidationError("DFLASH_DTYPE", f"must be float32, bfloat16, int4 or auto, got {raw!r}")
    return raw


PROBE_MODES = ("0", "1", "refresh")


def env_probe() -> str:
    """DFLASH_PROBE: "1" (default) probe once and cache, "0" never probe, "refresh" probe again and re-cache
    (a choice cached at a moderately busy moment is otherwise kept; see BUSY_LOAD)."""
    raw = os.environ.get("DFLASH_PROBE", "").strip() or "1"
    if raw not in PROBE_MODES:
        from dflash.errors import ValidationError

        raise ValidationError("DFLASH_PROBE", f"must be one of {', '.join(PROBE_MODES)}, got {raw!r}")
    return raw


def choose(model: nn.Module, model_id: str, block: int, cache_file: Path, dtype: str | None = None,
           threads: int | None = None, q4=None) -> HostSettings:
    """The settings for `model` on this machine: read back from `cache_file` or probed now (and written there).
    `dtype` / `threads`, when given, are fixed: only the rest is probed. DFLASH_PROBE=0 skips the probe
    (float32, the current threads, F.linear layout); DFLASH_PROBE=refresh ignores the cached choice.
    q4: the model's GGUF Q4_1 layers (`dflash.loading.load.Q4Source`), needed where `dtype` is int4. int4 is opt-in
    for now (--dtype int4, DFLASH_DTYPE=int4): not yet a candidate of the automatic choice."""
    dtypes = [dtype] if dtype else ["float32", "bfloat16"]
    counts = [threads] if threads else thread_candidates()
    mode = env_probe()
    if mode == "0":
        return HostSettings(dtype=dtypes[0], threads=counts[-1] if threads else torch.get_num_threads(),
                            layout="linear", source="default", block=block, machine=machine_key())
    key = cache_key(model_id, block, dtypes, counts)
    found = read_cached(cache_file, key) if mode == "1" else None
    if found is not None:
        return found
    load = load_per_core()  # before the probe's own work
    # Said at once (a WARNING, so that Python prints it even where no logging is set up: the CLI's first start).
    # About a second per (dtype, threads) candidate on the default 135M target (four took 2.8 s on a 2-core Xeon).
    log.warning("measuring this CPU once to choose its settings (~%d s; kept for later starts)…", len(dtypes) * len(counts))
    settings = HostSettings(**probe(model, block, dtypes, counts, q4), source="probe", block=block, machine=machine_key(),
                            load_per_core=load)
    write_cached(cache_file, key, settings)
    return settings
