"""Distillation into a GDN hybrid (on a tiny random Llama teacher): what the conversion carries over is exact, the
run resumes where it stopped and refuses other settings, and the stored delta rebuilds the same model — on a teacher
of the recorded hash only."""

import copy
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import pretrained
from hybridmodel import hybrid_delta
from hybridmodel.distill import DistillConfig, distill, mixer_parameters
from hybridmodel.from_teacher import from_teacher
from hybridmodel.tokenizer import build_tokenizer

TINY = DistillConfig(transfer_steps=2, kd_steps=2, length=64, eval_every=2, eval_windows=1, warmup=1)


@pytest.fixture(scope="module")
def teacher():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=260, hidden_size=96, intermediate_size=192, num_hidden_layers=8,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=257, pad_token_id=259, bos_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def student(teacher):
    return from_teacher(teacher, torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1)))


def test_attention_every_fourth_layer_and_gdn_elsewhere(student):
    assert student.config.layer_types == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    assert student.config.rope_parameters["partial_rotary_factor"] == 1.0


@torch.no_grad()
def test_embeddings_mlps_and_norms_are_the_teachers(teacher, student):
    x = torch.randn(1, 7, 96, generator=torch.Generator().manual_seed(2))
    assert torch.equal(student.model.embed_tokens.weight, teacher.model.embed_tokens.weight)
    for ours, theirs in zip(student.model.layers, teacher.model.layers):
        assert torch.allclose(ours.input_layernorm(x), theirs.input_layernorm(x), atol=1e-6, rtol=0)
        assert torch.allclose(ours.post_attention_layernorm(x), theirs.post_attention_layernorm(x), atol=1e-6, rtol=0)
        assert torch.equal(ours.mlp(x), theirs.mlp(x))
    assert torch.allclose(student.model.norm(x), teacher.model.norm(x), atol=1e-6, rtol=0)


@torch.no_grad()
def test_kept_attention_is_the_teachers_but_for_qk_normalisation(teacher, student):
    """The output gate at 1/2 undone by the doubled ``o_proj``, full rotary at the teacher's θ: with Qwen3.5's q/k
    RMS norms taken out, a kept attention layer computes exactly the teacher's attention."""
    x = torch.randn(1, 30, 96, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(30)[None]
    ours = copy.deepcopy(student.model.layers[3].self_attn)
    ours.q_norm, ours.k_norm = torch.nn.Identity(), torch.nn.Identity()
    theirs = teacher.model.layers[3].self_attn
    expected = theirs(hidden_states=x, position_embeddings=teacher.model.rotary_emb(x, positions),
                      attention_mask=None)[0]
    got = ours(hidden_states=x, position_embeddings=student.model.rotary_emb(x, positions), attention_mask=None)[0]
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)


def test_transfer_trains_the_gdn_layers_only_then_kd_every_mixer(student):
    transfer, kd = mixer_parameters(student, "transfer"), mixer_parameters(student, "kd")
    assert transfer and all(".linear_attn." in name for name in transfer)
    assert set(transfer) < set(kd) and any(".self_attn." in name for name in kd)
    assert not any("mlp" in name or "embed" in name or "layernorm" in name for name in kd)


def test_a_run_resumes_where_it_stopped_and_refuses_other_settings(teacher, student, tmp_path):
    tokenizer, lines = build_tokenizer(), []
    first = copy.deepcopy(student)
    distill(teacher, tokenizer, first, TINY, tmp_path, log=lines.append, checkpoint_every_s=0, stop_after_s=0)
    assert not (tmp_path / "last.pt").exists()  # nothing trained, nothing written
    record = distill(teacher, tokenizer, first, TINY, tmp_path, log=lines.append, checkpoint_every_s=0)
    assert record["step"] == TINY.steps and "heldout_ppl" in record
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in log] == ["transfer", "transfer", "kd", "kd"]
    again = copy.deepcopy(student)
    distill(teacher, tokenizer, again, TINY, tmp_path, log=lines.append)
    assert any("resumed at step 4" in line for line in lines)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), first.parameters()))
    other = DistillConfig(**{**vars(TINY), "kd_steps": 3})
    with pytest.raises(ValueError, match="another distillation config"):
        distill(teacher, tokenizer, copy.deepcopy(student), other, tmp_path, log=lines.append)


def test_the_delta_rebuilds_the_hybrid_on_its_teacher(teacher, student, tmp_path):
    """Stored in bf16: the rebuilt model equals the hybrid with its mixers rounded to bf16, bit for bit."""
    hybrid_delta.save(student, tmp_path, "f" * 64, {"step": 0})
    rebuilt = hybrid_delta.build(tmp_path, teacher)
    rounded = copy.deepcopy(student)
    with torch.no_grad():
        for p in hybrid_delta.mixer_state(rounded).values():
            p.copy_(p.to(torch.bfloat16).float())
    ids = torch.randint(0, 256, (1, 25), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).logits, rounded(ids).logits)
    size = (tmp_path / hybrid_delta.MIXERS_FILE).stat().st_size
    assert size < 2 * sum(t.numel() for t in hybrid_delta.mixer_state(student).values()) + 100_000


def test_a_delta_of_another_teacher_file_is_refused(student, tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained.catalog, "SHIPPED_DELTAS", tmp_path)
    hybrid_delta.save(student, tmp_path / "smollm2-135m-hybrid", "0" * 64, {"step": 0})
    with pytest.raises(ValueError, match="distilled from a teacher file of SHA-256 0000"):
        hybrid_delta.rebuild(pretrained.CHECKPOINTS["smollm2-135m-hybrid"], tmp_path / "cache")
