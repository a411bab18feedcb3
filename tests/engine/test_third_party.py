"""The engine on Hugging Face architectures built from a config (random weights, nothing downloaded):
every parameter's individual gradients against autograd on the individual losses of one forward pass
(float64), and the parameters each takes by the exact but slower global path, none."""

import pytest
import torch
from torch import nn

from engine.test_rules import assert_matches_autograd

transformers = pytest.importorskip(
    "transformers", reason="the hf extra is not installed (pip install '.[hf]' in a clone of cockpit-lite)")

VOCAB, B, T = 40, 3, 5


class Logits(nn.Module):
    """The model's logits for token ids (and fixed decoder ids), as a function of the batch alone."""

    def __init__(self, model, **fixed):
        super().__init__()
        self.model, self.fixed = model, fixed

    def forward(self, ids):
        return self.model(input_ids=ids, **self.fixed).logits


def _llama():
    """Rotary positions, grouped-query attention, RMSNorm, a SwiGLU MLP and a tied head."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=True, attn_implementation="sdpa"))


def _t5():
    """Encoder-decoder; one relative-position bias per stack, computed in its first layer and added to the
    scores of every layer (causally masked in the decoder); the shared embedding is never called itself."""
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=24, num_layers=3, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.0, decoder_start_token_id=0))


@pytest.mark.parametrize("build, batch", [(_llama, B), (_t5, B), (_t5, 4)], ids=["llama", "t5", "t5_decoder_as_long"])
def test_individual_gradients_match_autograd_without_the_global_path(build, batch, monkeypatch):
    """(``t5_decoder_as_long``: 4 decoder positions for 4 samples, so the decoder's bias table read
    ``[4, 4, heads]`` looks batched; it is shared because every layer's scores take it broadcast.)"""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    decoder = {"decoder_input_ids": torch.randint(0, VOCAB, (batch, 4), generator=g)} if build is _t5 else {}
    model = Logits(build().double(), **decoder)
    assert_matches_autograd(model, torch.randint(0, VOCAB, (batch, T), generator=g), monkeypatch)
