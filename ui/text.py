"""The playground's words: control explanations, example prompts, the workshop guide and the notes on numbers."""

from __future__ import annotations

import json
from pathlib import Path

INTRO = """# ⚡ DFlash playground
You are watching a small **draft** model propose a block of tokens at once, and the **target** model check the whole
block in one pass and keep the tokens it would have chosen itself."""

EXAMPLES = [
    ("Prose", "Write a short opening paragraph for a story about a lighthouse keeper who finds a message in a bottle."),
    ("Code", "Write a Python function is_palindrome(s) that ignores case and spaces, with a docstring."),
    ("Maths", "What is 17 multiplied by 24? Work it out step by step."),
]

# Each control's name on the page (ui/layout.py); an error about a control names it so (ui/handlers.py).
LABELS = {"prompt": "Prompt", "preset": "Model preset", "block_size": "Block size", "steps": "Denoising steps",
          "confidence": "Confidence threshold", "acceptance": "Acceptance threshold", "lookup": "Copy from context",
          "adaptive": "Policy", "min_block": "Min block size", "max_block": "Max block size", "temperature": "Temperature",
          "top_p": "Top-p", "max_new_tokens": "Max new tokens", "seed": "Seed",
          "show_rejected": "Show rejected draft tokens", "step_mode": "Step mode", "mode": "Mode", "numerics": "Numerics",
          "trace_attention": "Record what the draft attends to"}

# The numerics switch's choices (ui/layout.py): the target's dtype and what it means for the output.
NUMERICS = {"float32": "float32 · exact", "bfloat16": "bfloat16 · fast", "int4": "int4 · the GGUF's 4-bit weights · fast"}

INFO = {
    "prompt": ("Your message to the model (its chat template is applied). At most 32,000 characters. Enter starts a new "
               "line; Shift+Enter generates."),
    "preset": "Model pair from the registry. The large presets need a GPU and access to the Hugging Face hub.",
    "block_size": ("Tokens per verify step: the last committed token + (block size − 1) drafted ones. Between the min and "
                   "max block size (Adaptive block length, below); its default is the draft's trained size, past which its "
                   "guesses are untrained."),
    "steps": ("Denoising passes per block (our extension). 1 = the paper's single pass; more passes unmask the most "
              "confident positions first."),
    "confidence": "With steps > 1: commit every position at least this confident at each pass (at least one per pass).",
    "acceptance": ("1.0 = exact: keep a draft token only if it is the target's own choice (lossless). Below 1.0 = LOSSY: "
                   "accept tokens within this fraction of the target's top probability."),
    "lookup": ("Where the last n committed tokens occurred earlier (prompt or answer), propose what followed them there "
               "instead of running the draft (prompt lookup; our extension). Exact like the draft: the target still "
               "checks every token. 0 = off; 2 is a good start."),
    "adaptive": ("How the next block size is chosen: fixed; slow-start (grow ×2 after a fully accepted block, halve after "
                 "an early rejection); cost (maximise expected tokens per second); auto = cost on a CPU, where a "
                 "longer verify costs more, and fixed on a GPU."),
    "min_block": "Smallest block an adaptive policy may choose.",
    "max_block": "Largest block an adaptive policy may choose (and the cap for the block size).",
    "temperature": ("0 = greedy (deterministic). Above 0 the target samples with per-position seeded noise, so DFlash and "
                    "the baseline still match — token for token in float32; in the fast bfloat16 mode they can part where "
                    "two tokens' noisy scores are a numerical tie, which Compare diagnoses (without top-p)."),
    "top_p": "Nucleus sampling: keep the smallest set of tokens whose probability adds up to this (used when temperature > 0).",
    "max_new_tokens": "Upper limit on the answer's length in tokens.",
    "seed": ("Seed of the sampling noise (same seed → same tokens in float32; in bfloat16 a rerun's block sizes, "
             "chosen by timing, can round a near-tie the other way, and below acceptance 1.0 they change which "
             "tokens are accepted)."),
    "show_rejected": "Also show the draft tokens the target rejected, struck through, before each correction.",
    "step_mode": "Record the run without animating, then step through it one draft/verify step at a time with Next ▶.",
    "trace_attention": ("Keep each draft layer's attention over the target's injected context and the block; the block "
                        "inspector shows it. Drafting does a little more work, and the trace grows."),
    "mode": ("Paper method: the draft alone at its trained block size, as the paper runs it. Fastest here: the "
             "settings the command line and the API use by default."),
    "numerics": ("float32: DFlash's answer equals plain decoding's token for token. bfloat16: faster here; the two can "
                 "part where the target's top two tokens tie in bfloat16, which Compare shows."),
}

NO_DRAFT_NOTICE = ("**No trained draft is installed yet** (`assets/draft-smollm2-135m/` is missing), so this playground runs "
                   "the target **alone** — plain autoregressive decoding, one token per step, τ = 1. The draft controls are "
                   "ignored until the trained draft is added; the bundled traces below still show DFlash blocks.")

# The draft badge's words, by how its notice starts (the notices above and in ui/engines.py).
_BADGES = ((NO_DRAFT_NOTICE[:20], "no draft: plain decoding"), ("**Draft: `", "operator's draft"),
           ("**About the default draft", "trained draft"), ("Preset **", "loads on the first Generate"))


def notice_badge(notice: str) -> str:
    """A preset's notice (Markdown) as a small badge that opens onto the notice itself; "" stays "" (no badge)."""
    if not notice:
        return ""
    words = next((w for start, w in _BADGES if notice.startswith(start)), "details")
    return (f'<details class="dfl-badge"><summary>Draft: {words} <span class="more">(details)</span></summary>\n\n'
            f"{notice}\n\n</details>")


def draft_folder(directory: str) -> str:
    """How the page names a draft the operator chose: its folder's name only (the rest of the server's path is not
    the visitors' business), without backticks (it goes into a code span)."""
    return (Path(directory).resolve().name or str(directory)).replace("`", "'")


def local_draft_notice(directory: str) -> str:
    """The notice for a draft the operator chose (`dflash-playground --draft DIR`), its name as a code span (no
    Markdown or HTML in a folder name acts)."""
    name = draft_folder(directory)
    return (f"**Draft: `{name}`**, chosen by this server's operator (not the shipped draft). Its τ shows in the "
            "statistics after each run; press **Compare with autoregressive** to measure its speed here.")


def draft_notice(evaluation_file: Path) -> str:
    """The default draft's measured standing, from the evaluation file the training report writes (no typed numbers):
    its τ on MT-Bench and, on the CPU it was measured on, DFlash's speed against plain decoding."""
    try:
        doc = json.loads(evaluation_file.read_text())
        mt, default = doc["evaluations"]["mtbench"], doc.get("default_policy")
    except (OSError, KeyError, ValueError):
        return ""

    def speed(x: float) -> str:
        return f"**{x:.2f}× the speed of plain decoding ({'faster' if x > 1.0 else 'slower'})**"

    policy = (f"; with the default block-size policy (auto: on a CPU, the block that maximises expected tokens per "
              f"millisecond), in a separate benchmark run, it ran {speed(default['speedup'])}"
              if isinstance(default, dict) else "")
    return (f"**About the default draft:** it was trained on a 2-core CPU. On {mt['n_prompts']} MT-Bench prompts it "
            f"reaches τ = {mt['tau']:.2f} tokens per target step; on the CPU it was measured on ({mt['cpu']}), at its "
            f"fixed block of 8, DFlash ran {speed(mt['speedup'])}{policy} — the output is exactly the target's either "
            "way. Speed depends on your CPU: press **Compare with autoregressive** to measure it here; see TRAINING.md "
            "and BENCHMARKS.md.")


GUIDE = """### A five-minute tour (for workshops)
Pick an example prompt, press **Generate**, then follow one block through the four stages:

1. **Draft** — the *block inspector* shows the draft's block: the first cell is the last committed token (the
   anchor), the rest start as **MASK**. Each row is one denoising pass; shading is the draft's confidence and the
   outlined cells are the positions fixed at that pass.
2. **Verify** — the inspector's last row is the target's verdict from **one** forward pass over the whole block:
   ✓ where the draft guessed the target's own token, ✗ at the first miss (with the target's token).
3. **Accept** — in the *token stream*, the accepted draft tokens appear with a solid underline, followed by one
   token from the target itself: a **correction** (double underline) at the miss, or a **bonus** (dashed
   underline) when the whole block was right. Hover a token to see its block, position and confidence.
4. **Adapt** — the *block length* chart shows the size drafted at each step and how many tokens were committed;
   with an adaptive policy the controller's decisions are written on the curve. On a CPU the default policy
   (auto → cost) soon settles on small blocks (2–4), where it expects the most tokens per second; to watch whole
   blocks of 8 being drafted and verified, set **Policy** to *fixed* under "Adaptive block length".

**Copying** — the draft cannot copy text it has seen, but the target repeats itself (names in code, list items). Set
**Copy from context** to 2: where the last two tokens occurred before, the block proposes what followed them (wavy
underline, a "copied" row in the inspector) and the draft is not run. The target still checks every token. The
charts then show copied blocks as their own series (stars), so the draft's own acceptance stays visible.

Then press **Compare with autoregressive** to time the same request again with and without the draft, back to back,
and see the speedup and whether the answers are identical (a difference is diagnosed as a numerical tie or an error).
No compute in the room? Load a **bundled trace** in *Replay* and use **Next ▶** to walk through a recorded run step by
step.

**What the draft attends to** — tick **Record what the draft attends to** before Generate. The inspector then shows,
for each drafted slot, the context tokens it reads most. Those keys and values come from the target's hidden states:
the KV injection that conditions the draft on the target.

**Tuning by measurement** — one run is one noisy sample. The **Sweep** tab runs a grid of settings (for example block
size × copy n-gram) over several prompts and repeats, each run beside a no-draft run. It draws the median speedup per
cell, marks the fastest lossless one, and **Apply** sets the playground to it. `python -m dflash sweep` does the same
from a shell; BENCHMARKS.md shows one such sweep on the default models.
"""

NUMBERS = """### What the numbers mean
- **τ (acceptance length)** — tokens committed per target verify step, *including* the target's own bonus or
  correction token (as in the paper). τ = 1 means the draft never helped; the best possible is the block size.
- **tokens / s** — output tokens after the first, divided by the time after the first token.
- **time to first token** — reading the prompt (prefill) plus picking the first token.
- **draft / verify time** — where the decode time went: the draft's passes vs the target's block forwards.
- **speedup** — this run's tokens/s divided by the **same engine without a draft** on the same prompt and
  settings (one token per target step). Compare runs the request again and then without the draft, back to back,
  both with the page redrawn at most once a second: a live run also pays for drawing every frame, which would
  understate DFlash. The comparison shows that timed run's rate (*run tokens / s (timed)*) beside the baseline's;
  the statistics above switch to the timed run too, except for a run you stopped (or whose repeat came out
  different), which stays as it was with its own live rate. On a small CPU model a block verify
  costs more than a single step, so speedups here are smaller than on a GPU.
- **identical ✓** — with the acceptance threshold at 1.0 the output must equal the baseline's token for token;
  a lossy threshold may change it, and the first differing position is shown.
- **Histogram** — how often a step committed 1, 2, … tokens; **per-position chart** — how often the draft's
  k-th token was right given that all earlier ones were.
"""

REPLAY_HELP = ("Replay a finished run (yours, a bundled trace, or a trace JSON you exported) without any model; a "
               "loaded trace sets the prompt and the controls it was recorded with. Drag the slider, or step with "
               "◀ Prev / Next ▶ above the block inspector (keys ← →); ▶ Play (space) plays it.")
REPLAY_WAITS = "A generation is running in this session: the replay controls work again once it has finished."
