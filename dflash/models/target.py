"""The target model as the engine sees it: `Target` wraps a loaded causal LM (dflash.loading.load loads it), runs one
cached forward and captures only the hidden layers the draft needs (forward hooks); and the chat template that
turns a prompt into the target's token ids.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext

import torch
from torch import nn

from dflash.models.packed import PackedLinear, float32_matmuls, layout_of, set_layout


def chat_prompt_ids(tokenizer, prompt: str | list[dict]) -> list[int]:
    """A user prompt (or a whole chat history of messages) through the tokenizer's chat template, ending with the
    assistant's generation prompt. The messages' text stays text: `<|im_end|>` typed in a prompt is tokenized as
    those characters, not as the special token, so typed text cannot fake a turn of the conversation.

    enable_thinking=False: Qwen3's template then writes an empty think block and the model answers directly, as
    the public z-lab Qwen3 drafts were trained and benchmarked; templates that never read the variable (SmolLM2,
    Llama 3.1) render exactly as without it.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    specials = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special]
    if any(isinstance(m.get("content"), str) and any(s in m["content"] for s in specials) for m in messages):
        return _ids_with_text_content(tokenizer, messages)
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False, return_dict=True)
    return list(out["input_ids"])


_SENTINEL = "\x00dflash-message-{}\x00"


def _ids_with_text_content(tokenizer, messages: list[dict]) -> list[int]:
    """The template rendered around placeholders; its own text tokenized as usual (its special tokens are real),
    each message's content with special-token strings taken as plain characters. Only for messages that hold such
    strings: elsewhere the whole rendering is tokenized at once, exactly as the drafts were trained."""
    holders = [{**m, "content": _SENTINEL.format(i)} if isinstance(m.get("content"), str) else m
               for i, m in enumerate(messages)]
    rendered = tokenizer.apply_chat_template(holders, add_generation_prompt=True, enable_thinking=False, tokenize=False)
    ids: list[int] = []
    for i, m in enumerate(messages):
        if holders[i] is m:
            continue
        before, _, rendered = rendered.partition(_SENTINEL.format(i))
        ids += tokenizer(before, add_special_tokens=False)["input_ids"] + _plain_ids(tokenizer, m["content"])
    return ids + list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def _plain_ids(tokenizer, text: str) -> list[int]:
    """`text`'s ids with no special tokens matched. A copy of the fast tokenizer's backend does it: the shared one's
    `encode_special_tokens` switch is per tokenizer, and flipping it would race with other threads' prompts."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer keeps no such shared switch
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    plain = _PLAIN_BACKENDS.get(tokenizer)
    if plain is None:
        from tokenizers import Tokenizer

        plain = _PLAIN_BACKENDS[tokenizer] = Tokenizer.from_str(backend.to_str())
        plain.encode_special_tokens = True
    return plain.encode(text, add_special_tokens=False).ids


_PLAIN_BACKENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer → its backend, specials off


def feature_module(model: nn.Module, j: int) -> nn.Module:
    """The module whose output is target feature `j` in the z-lab / transformers convention (hidden_states[j + 1]):
    decoder layer j, except the last layer's, which transformers reports after the final norm."""
    layers = model.model.layers
    return model.model.norm if j == len(layers) - 1 else layers[j]


# Architectures whose logits are exactly `lm_head(last hidden state)` (no soft-capping or logit scale), so
# `Target.forward` may run the decoder and the head separately and use `PackedLinear` for the head.
_PLAIN_HEAD = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


class Target:
    """A causal LM used as the DFlash target. One cached forward = `forward(ids, cache)`.

    Hidden layers the draft needs are captured by forward hooks on those decoder layers only (the output of
    decoder layer j, i.e. transformers' hidden_states[j + 1]; the last layer's after the final norm, as there).

    layout: store the decoder's linear weights "linear" (as loaded) or "transposed" (`dflash.models.packed.set_layout`;
    plain models on the CPU only, where the host probe chose it); None leaves the model as it is.
    float32_from_rows: forwards of at least this many tokens (a prompt's prefill) run the decoder's linear layers in
    float32 (`dflash.models.packed.Float32Matmul`; a low-precision dtype on the CPU only, where the host probe measured
    that it pays); 0: never.
    """

    def __init__(self, model: nn.Module, tokenizer, name: str = "", device: torch.device | None = None,
                 dtype: torch.dtype = torch.float32, layout: str | None = None, float32_from_rows: int = 0):
        self.device = device or torch.device("cpu")
        self.dtype = dtype
        if getattr(model, "hf_device_map", None) or getattr(model, "hf_quantizer", None) is not None:
            # Placed at load time (a multi-device map, or bitsandbytes): moving or casting would break it. The
            # engine's device is the embedding's; auto_device_map keeps the LM head and final norm there too.
            self.model = model.eval()
            self.device = model.get_input_embeddings().weight.device
        else:
            self.model = model.to(device=self.device, dtype=dtype).eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.hidden_size = model.config.hidden_size
        self.num_layers = model.config.num_hidden_layers
        self.max_positions = getattr(model.config, "max_position_embeddings", 2048)
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list = []
        self.layer_ids: list[int] = []
        self._capture_on = True
        head = model.get_output_embeddings()
        self.head = PackedLinear(head.weight)  # the LM head for multi-row products (verify, draft)
        # Only for plain (unplaced, unquantized) CPU models, where PackedLinear can pay; elsewhere model(...) as is.
        self._split_head = self.cpu_fast_paths = (self.device.type == "cpu" and type(model).__name__ in _PLAIN_HEAD
                            and type(head) is nn.Linear and head.bias is None and hasattr(model, "model")
                            and not getattr(model, "hf_device_map", None) and getattr(model, "hf_quantizer", None) is None)
        if layout is not None and self._split_head:  # CPU only: see dflash.models.packed.TransposedLinear
            set_layout(model.model.layers, layout)
        self.float32_from_rows = float32_from_rows if (self._split_head and dtype != torch.float32) else 0

    @property
    def numerics(self) -> str:
        """The engine's numerics as runs record them: its dtype's name ("float32", "bfloat16"), or "int4" for the
        GGUF's 4-bit weights (dflash.models.lean)."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def layout(self) -> str:
        """How the decoder's linear weights are stored: "linear" (as loaded) or "transposed" (dflash.models.packed)."""
        return layout_of(self.model.model.layers) if hasattr(self.model, "model") else "linear"

    # -- features ---------------------------------------------------------------------------------------
    def set_capture(self, layer_ids: list[int]) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks, self.layer_ids = [], list(layer_ids)
        for j in self.layer_ids:
            self._hooks.append(feature_module(self.model, j).register_forward_hook(self._make_hook(j)))

    def _make_hook(self, j: int):
        def hook(_module, _inputs, output):
            if self._capture_on:
                self._captured[j] = output[0] if isinstance(output, tuple) else output

        return hook

    def stop_capture(self) -> None:
        """Leave the feature hooks idle until the next `forward(capture=True)` (e.g. while transformers' generate runs)."""
        self._capture_on = False
        self._captured.clear()

    # -- forward ----------------------------------------------------------------------------------------
    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @staticmethod
    def cache_len(cache) -> int:
        return cache.get_seq_length()

    @staticmethod
    def crop(cache, length: int) -> None:
        """Keep the first `length` positions (transformers 5: crop takes a negative count to remove)."""
        remove = length - cache.get_seq_length()
        if remove < 0:
            cache.crop(remove)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, last_only: bool = False,
                capture: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [1, T] → (logits [T or 1, V] float32, features [1, T, k*H] or None). Extends `cache` by T."""
        self._captured.clear()
        self._capture_on = capture
        if self._split_head:
            # Same as model(...) for these architectures, with the head through PackedLinear (see its doc).
            many = 0 < self.float32_from_rows <= ids.shape[1]
            with float32_matmuls(self.model.model.layers) if many else nullcontext():
                hidden = self.model.model(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state
            logits = self.head(hidden[0, -1:] if last_only else hidden[0])  # [T or 1, V]
        else:
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1 if last_only else 0)
            logits = out.logits[0]
        feats = (torch.cat([self._captured[j].to(self.device) for j in self.layer_ids], -1)  # layers may sit on other GPUs
                 if (capture and self.layer_ids) else None)
        self._captured.clear()
        return logits.float(), feats

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight  # [V, H]

    def stop_ids(self) -> set[int]:
        """EOS ids: the config's, the tokenizer's, and the chat template's end-of-turn token when present."""
        ids: set[int] = set()
        for src in (self.model.generation_config, self.config, self.tokenizer):
            eos = getattr(src, "eos_token_id", None) if src is not None else None
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        if self.tokenizer is not None:
            for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
                tid = self.tokenizer.convert_tokens_to_ids(tok)
                if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid is not None and tid >= 0:
                    ids.add(tid)
        return ids
