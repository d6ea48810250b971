"""Distillation into a GDN hybrid (on a tiny random Llama teacher): what the conversion carries over is exact, the
run resumes where it stopped and refuses other settings, and the stored delta rebuilds the same model — on a teacher
of the recorded hash only."""

import copy
import json
import math
import re
import shlex
import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import pretrained
from hybridmodel import delta_artifacts, hybrid_delta
from hybridmodel.distill import distill, retrieval_probe
from hybridmodel.distill_config import MIN_COPY, TEACHER_SAMPLES, DistillConfig
from hybridmodel.distill_losses import mixer_parameters
from hybridmodel.distill_windows import CopyWindows, TeacherSamples, data_seed
from hybridmodel.from_teacher import attention_layers_of, from_teacher, resplit
from hybridmodel.linear_regime import LinearRegimeSteps
from hybridmodel.tokenizer import build_tokenizer
from runtime.errors import UsageError

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
def test_kept_attention_is_the_teachers_with_the_qk_norms_in_their_linear_regime(teacher, student):
    """The output gate at 1/2 undone by the doubled ``o_proj``, full rotary at the teacher's θ, q and k scaled into
    the linear regime of Qwen3.5's q/k RMS norms: on the teacher's own input to the layer, a kept attention layer
    computes the teacher's attention, norms included, within float32 rounding and the regime's 1e-4; the same layer
    with the norms at the teacher's mean scale (the conversion this replaced) does not."""
    sample = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    seen = {}
    hook = teacher.model.layers[3].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: seen.update(x=kwargs["hidden_states"]), with_kwargs=True)
    teacher(sample)
    hook.remove()
    x, positions = seen["x"], torch.arange(40)[None]
    theirs, ours = teacher.model.layers[3].self_attn, student.model.layers[3].self_attn
    expected = theirs(hidden_states=x, position_embeddings=teacher.model.rotary_emb(x, positions),
                      attention_mask=None)[0]
    got = ours(hidden_states=x, position_embeddings=student.model.rotary_emb(x, positions), attention_mask=None)[0]
    scale = expected.abs().max()
    assert (got - expected).abs().max() <= 1e-3 * scale
    assert ours.q_proj.weight.abs().max() < 1e-2 * theirs.q_proj.weight.abs().max()  # the regime is in use
    saturated = copy.deepcopy(ours)  # q and k back at the teacher's scale: the norms normalise again
    d = theirs.head_dim
    query = theirs.q_proj.weight.unflatten(0, (-1, d))
    saturated.q_proj.weight.copy_(torch.cat([query, torch.zeros_like(query)], dim=1).flatten(0, 1))
    saturated.k_proj.weight.copy_(theirs.k_proj.weight)
    normalised = saturated(hidden_states=x, position_embeddings=student.model.rotary_emb(x, positions),
                           attention_mask=None)[0]
    assert (normalised - expected).abs().max() > 1e-2 * scale


def test_transfer_trains_the_gdn_layers_only_then_kd_every_mixer(student):
    transfer, kd = mixer_parameters(student, "transfer"), mixer_parameters(student, "kd")
    assert transfer and all(".linear_attn." in name for name in transfer)
    assert set(transfer) < set(kd) and any(".self_attn." in name for name in kd)
    assert not any("mlp" in name or "embed" in name or "layernorm" in name for name in kd)


def test_a_placement_of_ones_own_puts_attention_there(teacher):
    sample = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    placed = from_teacher(teacher, sample, attention_layers=(1, 5))
    assert attention_layers_of(placed) == (1, 5)
    assert placed.config.layer_types == ["full_attention" if i in (1, 5) else "linear_attention" for i in range(8)]


@torch.no_grad()
def test_a_resplit_keeps_the_mixers_of_unchanged_layers_and_converts_the_moved_ones(teacher, student):
    """Attention moved from layers 3, 7 to 2, 3: layer 3 keeps its (trained) attention, the GDN layers that stay
    GDN keep theirs, layer 2 takes the teacher's attention and layer 7 a GDN converted from it — each exactly what
    a fresh conversion with attention at 2, 3 would hold there."""
    sample = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    trained = copy.deepcopy(student)
    for p in hybrid_delta.mixer_state(trained).values():
        p.add_(0.01 * torch.randn_like(p))  # as if distilled: not the conversion's weights any more
    moved, fresh = resplit(trained, teacher, (2, 3), sample)
    converted = from_teacher(teacher, sample, attention_layers=(2, 3))
    assert fresh == (7,) and attention_layers_of(moved) == (2, 3)

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))

    layers, was, fresh_layers = moved.model.layers, trained.model.layers, converted.model.layers
    assert same(layers[3].self_attn, was[3].self_attn)
    assert all(same(layers[i].linear_attn, was[i].linear_attn) for i in (0, 1, 4, 5, 6))
    assert same(layers[2].self_attn, fresh_layers[2].self_attn)
    assert same(layers[7].linear_attn, fresh_layers[7].linear_attn)
    assert all(same(a.mlp, b.mlp) for a, b in zip(layers, converted.model.layers))
    names = mixer_parameters(moved, "transfer", fresh)
    assert names and all(name.startswith("model.layers.7.linear_attn.") for name in names)


@pytest.mark.slow  # ~8 s: it distils, then resumes; CI's slow run holds it
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


def _quantised(model):
    """``model`` with every 2-D mixer weight rounded as the int8 delta stores it, computed here row by row: each
    row's largest magnitude / 127 its step, every entry the nearest multiple of it; other tensors unchanged."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in hybrid_delta.mixer_state(rounded).values():
            if p.dim() == 2:
                for row in p:
                    step = row.abs().max() / 127
                    if step > 0:
                        row.copy_(torch.round(row / step) * step)
    return rounded


def test_the_delta_rebuilds_the_hybrid_on_its_teacher(teacher, student, tmp_path):
    """Stored in int8 per row: the rebuilt model equals the hybrid with its projections rounded per row (and
    every other mixer tensor exact); the file holds one byte per projection weight."""
    trained = copy.deepcopy(student)
    with torch.no_grad():
        for p in hybrid_delta.mixer_state(trained).values():
            p.add_(0.05 * torch.randn_like(p))  # as if distilled: rows of other scales than the conversion's
        next(p for p in hybrid_delta.mixer_state(trained).values() if p.dim() == 2)[0].zero_()  # a zero row
    hybrid_delta.save(trained, tmp_path, "f" * 64, {"step": 0})
    assert hybrid_delta.manifest(tmp_path)["dtype"] == hybrid_delta.STORAGE
    rebuilt = hybrid_delta.build(tmp_path, teacher)
    expected = _quantised(trained)
    wanted = hybrid_delta.mixer_state(expected)
    for name, got in hybrid_delta.mixer_state(rebuilt).items():
        assert torch.allclose(got, wanted[name], rtol=1e-6, atol=1e-9), name
    ids = torch.randint(0, 256, (1, 25), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(rebuilt(ids).logits, expected(ids).logits, atol=1e-5, rtol=0)
    projections = sum(t.numel() for t in hybrid_delta.mixer_state(student).values() if t.dim() == 2)
    others = sum(t.numel() for t in hybrid_delta.mixer_state(student).values() if t.dim() != 2)
    assert (tmp_path / hybrid_delta.MIXERS_FILE).stat().st_size < projections + 4 * others + 100_000


def test_int8_rows_keep_each_rows_peak_and_err_by_half_a_step_at_most():
    weight = torch.randn(7, 50, generator=torch.Generator().manual_seed(5)) * torch.logspace(-4, 2, 7)[:, None]
    weight[3] = 0.0
    q, scale = hybrid_delta.quantise_rows(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (7,)
    back = hybrid_delta.dequantise_rows(q, scale)
    assert (back - weight).abs().le(scale[:, None] / 2 * (1 + 1e-6)).all()
    peak = weight.abs().argmax(1)
    assert torch.allclose(back.gather(1, peak[:, None]), weight.gather(1, peak[:, None]), rtol=1e-6, atol=0)
    assert q.abs().max() == 127 and not back[3].any()


def test_an_old_bf16_delta_still_reads(teacher, student, tmp_path):
    """A delta written before int8 (every mixer tensor bfloat16, its manifest saying so) rebuilds what it always
    did: the hybrid with its mixers rounded to bf16, bit for bit."""
    from safetensors.torch import save_file

    hybrid_delta.save(student, tmp_path, "f" * 64, {"step": 0})
    save_file({name: p.detach().to(torch.bfloat16).contiguous()
               for name, p in hybrid_delta.mixer_state(student).items()}, tmp_path / hybrid_delta.MIXERS_FILE)
    recorded = hybrid_delta.manifest(tmp_path)
    (tmp_path / hybrid_delta.MANIFEST_FILE).write_text(json.dumps({**recorded, "dtype": "bfloat16"}))
    rebuilt = hybrid_delta.build(tmp_path, teacher)
    rounded = copy.deepcopy(student)
    with torch.no_grad():
        for p in hybrid_delta.mixer_state(rounded).values():
            p.copy_(p.to(torch.bfloat16).float())
    ids = torch.randint(0, 256, (1, 25), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).logits, rounded(ids).logits)


def test_an_int8_weight_without_its_scales_is_refused(student, tmp_path, teacher):
    from safetensors.torch import load_file, save_file

    hybrid_delta.save(student, tmp_path, "f" * 64, {"step": 0})
    stored = load_file(tmp_path / hybrid_delta.MIXERS_FILE)
    name = next(key for key, t in stored.items() if t.dtype == torch.int8)
    save_file({key: t for key, t in stored.items() if key != name + hybrid_delta.SCALE},
              tmp_path / hybrid_delta.MIXERS_FILE)
    with pytest.raises(ValueError, match=f"the int8 tensor {name} has no {name}.scale"):
        hybrid_delta.build(tmp_path, teacher)


def test_a_delta_of_another_teacher_file_is_refused(student, tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained.catalog, "SHIPPED_DELTAS", tmp_path)
    hybrid_delta.save(student, tmp_path / "smollm2-135m-hybrid", "0" * 64, {"step": 0})
    with pytest.raises(ValueError, match="distilled from a teacher file of SHA-256 0000"):
        hybrid_delta.rebuild(pretrained.CHECKPOINTS["smollm2-135m-hybrid"], tmp_path / "cache")



# ---- what a delta carries beside its mixers: the estimator and the calibration of its rebuilt model ----

@pytest.fixture
def catalogued(teacher, student, tmp_path, monkeypatch):
    """The catalogue's hybrid on the tiny teacher: its delta in a patched ``models/``, the teacher fetched into a
    cache (a teacher entry of the hash the delta records)."""
    import dataclasses

    from pretrained.model_cache import SOURCE_FILE, file_records

    fake_teacher = dataclasses.replace(pretrained.catalog.SMOLLM2_135M_INSTRUCT, sha256="f" * 64)
    checkpoint = pretrained.DistilledCheckpoint("smollm2-135m-hybrid", fake_teacher)
    monkeypatch.setattr(pretrained.catalog, "SHIPPED_DELTAS", tmp_path / "models")
    root = tmp_path / "cache"
    teacher.save_pretrained(root / fake_teacher.name)
    # recorded as a conversion records what it wrote (the stand-in has no tokenizer.json)
    files = file_records(root / fake_teacher.name)
    (root / fake_teacher.name / SOURCE_FILE).write_text(json.dumps({"sha256": "f" * 64, "files": files}))
    hybrid_delta.save(student, checkpoint.delta_dir, "f" * 64, {"step": 0},
                      teacher_weights=hybrid_delta.weights_digest(root / fake_teacher.name))
    return checkpoint, root


def _teacher_tokenizer(teacher_dir, write) -> None:
    """Tokenizer files written into the catalogued teacher by ``write(teacher_dir)``, recorded in its source.json as
    a conversion records what it wrote (a file that makes the model and is not recorded is damage)."""
    from pretrained.model_cache import SOURCE_FILE, file_records

    write(teacher_dir)
    source = json.loads((teacher_dir / SOURCE_FILE).read_text())
    files = {name: held for name, held in file_records(teacher_dir).items() if name != SOURCE_FILE}
    (teacher_dir / SOURCE_FILE).write_text(json.dumps({**source, "files": files}))


def _artifacts(directory, weights: str, calibration: bytes = b"calibration") -> None:
    """Stand-ins for what ``bench train`` and ``bench calibrate`` write: the estimator's record of the weights it
    describes is what the delta checks."""
    from pretrained.file_record import record_again

    (directory / "gatesight").mkdir(exist_ok=True)
    (directory / "gatesight" / "gatesight.json").write_text(json.dumps({"meta": {"weights": weights}}))
    (directory / "calibration").mkdir(exist_ok=True)
    (directory / "calibration" / "calibration.safetensors").write_bytes(calibration)
    record_again(directory)  # as the commands that write them record a recorded folder again


def _parses_every_command(message: str, commands: list[str]) -> None:
    """The bench commands ``message`` advises (in backquotes, after any variable) are ``commands``, each accepted by
    the command line as written — with --labels where it trains, and --replace where the rebuild carries what the
    delta ships already."""
    from bench.commands.cli import build_parser

    advised = [shlex.split(c.split("bench ", 1)[1]) for c in re.findall(r"`([^`]*bench [^`]*)`", message)]
    assert [argv[0] for argv in advised] == commands, message
    for argv in advised:
        args = build_parser().parse_args([word.replace("LABELS", "labels") for word in argv])
        if argv[0] in ("train", "calibrate"):
            assert args.replace
        if argv[0] == "train":
            assert "--labels" in argv


def test_shipped_artifacts_travel_with_the_delta_into_every_rebuild(catalogued, tmp_path):
    from pretrained.loading import fingerprint
    from pretrained.model_cache import installed

    checkpoint, root = catalogued
    with pytest.raises(FileNotFoundError, match="is not rebuilt from") as refused:
        delta_artifacts.ship_artifacts(checkpoint, root)
    _parses_every_command(str(refused.value), ["fetch-model", "label", "train", "calibrate"])
    rebuilt = hybrid_delta.rebuild(checkpoint, root)
    with pytest.raises(ValueError, match="holds no GateSight estimator nor calibration") as refused:
        delta_artifacts.ship_artifacts(checkpoint, root)
    _parses_every_command(str(refused.value), ["label", "train", "calibrate"])
    weights = fingerprint(rebuilt, "weights")
    _artifacts(rebuilt, weights)
    shipped = delta_artifacts.ship_artifacts(checkpoint, root)
    assert shipped == [checkpoint.delta_dir / "gatesight", checkpoint.delta_dir / "calibration"]
    assert installed(checkpoint, root) == rebuilt  # the rebuilt directory is what the delta now rebuilds
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root / checkpoint.teacher.name, elsewhere / checkpoint.teacher.name)
    again = hybrid_delta.rebuild(checkpoint, elsewhere)
    for name in ("gatesight/gatesight.json", "calibration/calibration.safetensors"):
        assert (again / name).read_bytes() == (rebuilt / name).read_bytes()
    assert fingerprint(again, "weights") == weights

    (rebuilt / "gatesight" / "gatesight.json").write_text(json.dumps({"meta": {"weights": "0" * 12}}))
    before = (checkpoint.delta_dir / "gatesight" / "gatesight.json").read_bytes()
    with pytest.raises(ValueError, match="was trained on model weights 000000000000, not"):
        delta_artifacts.ship_artifacts(checkpoint, root)
    assert (checkpoint.delta_dir / "gatesight" / "gatesight.json").read_bytes() == before

    _artifacts(rebuilt, weights, calibration=b"a new calibration")
    assert delta_artifacts.ship_artifacts(checkpoint, root) == [checkpoint.delta_dir / "calibration"]
    [aside] = checkpoint.delta_dir.glob("calibration.backup-*")
    assert (aside / "calibration.safetensors").read_bytes() == b"calibration"  # moved aside, never written over
    assert (checkpoint.delta_dir / "calibration" / "calibration.safetensors").read_bytes() == b"a new calibration"



@pytest.mark.parametrize("artifact", ["gatesight/gatesight.json", "calibration/calibration.safetensors"])
def test_a_rebuilt_hybrids_artifact_changed_in_place_is_refused_until_rebuilt(catalogued, tmp_path, artifact):
    """Probe 12: a rebuild's estimator and calibration, copied from the delta, ran changed in place (a tensor
    negated, its size kept) under the catalogued name, though the delta's files.json records their SHA-256. They are
    checked as the weights are; one a bench command writes anew is recorded anew; fetch-model's rebuild restores
    the delta's."""
    from pretrained.file_record import record_again
    from pretrained.loading import fingerprint
    from pretrained.model_cache import check_recorded, conversion_problem

    checkpoint, root = catalogued
    rebuilt = hybrid_delta.rebuild(checkpoint, root)
    _artifacts(rebuilt, fingerprint(rebuilt, "weights"))
    delta_artifacts.ship_artifacts(checkpoint, root)
    cache = tmp_path / "fresh"
    shutil.copytree(root / checkpoint.teacher.name, cache / checkpoint.teacher.name)
    fresh = hybrid_delta.rebuild(checkpoint, cache)  # records the model's files alone, as rebuilds before did
    check_recorded(fresh, checkpoint.name)
    shipped = (fresh / artifact).read_bytes()
    (fresh / artifact).write_bytes(shipped[:-1] + bytes([shipped[-1] ^ 1]))  # the size kept
    with pytest.raises(UsageError, match=re.escape(
            f"{checkpoint.name} in {fresh} is damaged: {artifact} has SHA-256 ")) as refused:
        check_recorded(fresh, checkpoint.name)
    assert f"the files.json of {checkpoint.delta_dir} recorded; run `bench fetch-model {checkpoint.name}`" \
        in str(refused.value)
    assert conversion_problem(checkpoint, cache, hashes=True).startswith(f"is damaged: {artifact} has SHA-256")
    hybrid_delta.rebuild(checkpoint, cache)
    assert (fresh / artifact).read_bytes() == shipped
    check_recorded(fresh, checkpoint.name)
    (fresh / artifact).write_bytes(b"made again by a bench command")
    record_again(fresh)  # as bench train and bench calibrate do after writing one
    check_recorded(fresh, checkpoint.name)
    (fresh / artifact).write_bytes(b"made again by a bench commanD")
    with pytest.raises(UsageError, match=re.escape(f"is damaged: {artifact} has SHA-256 ")):
        check_recorded(fresh, checkpoint.name)


@pytest.mark.parametrize("lost", ["tokenizer.json", "model.safetensors"])
@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "rebuilt-before-records"])
def test_a_damaged_rebuild_is_not_reported_rebuilt_but_rebuilt_again(catalogued, lost, recorded):
    """A rebuilt hybrid missing a file it needs is found damaged, as a conversion is, whether its rebuild recorded
    its files or not (rebuilt before rebuilds did), and the next rebuild makes it again, the damaged one aside."""
    from pretrained.model_cache import SOURCE_FILE, installed, locate

    checkpoint, root = catalogued
    _teacher_tokenizer(root / checkpoint.teacher.name, build_tokenizer().save_pretrained)  # a rebuild takes it over
    rebuilt = hybrid_delta.rebuild(checkpoint, root)
    source = json.loads((rebuilt / SOURCE_FILE).read_text())
    assert "model.safetensors" in source["files"] and installed(checkpoint, root) == rebuilt
    if not recorded:
        del source["files"]
        (rebuilt / SOURCE_FILE).write_text(json.dumps(source))
    (rebuilt / lost).unlink()
    assert installed(checkpoint, root) is None
    said = f"{lost} is missing" if recorded else "its source.json records none of its files"
    with pytest.raises(UsageError, match=re.escape(f"in {rebuilt} is damaged: {said}")):
        locate(checkpoint.name, root)
    logged = []
    assert hybrid_delta.rebuild(checkpoint, root, log=logged.append) == rebuilt
    assert (rebuilt / lost).is_file() and not any("already rebuilt" in line for line in logged)
    [aside] = root.glob(f"{checkpoint.name}.backup-*")
    assert not (aside / lost).exists()


def test_new_mixers_move_the_artifacts_of_the_old_ones_aside(catalogued, student):
    checkpoint, _ = catalogued
    delta = checkpoint.delta_dir
    _artifacts(delta, "w" * 12)
    hybrid_delta.save(student, delta, "f" * 64, {"step": 0})  # the same mixers: their artifacts stay
    assert (delta / "gatesight" / "gatesight.json").exists() and not list(delta.glob("*.backup-*"))
    changed = copy.deepcopy(student)
    with torch.no_grad():
        next(iter(hybrid_delta.mixer_state(changed).values())).add_(1.0)
    hybrid_delta.save(changed, delta, "f" * 64, {"step": 1})
    assert not (delta / "gatesight").exists() and not (delta / "calibration").exists()
    assert sorted(p.name.split(".backup-")[0] for p in delta.glob("*.backup-*")) == ["calibration", "gatesight"]


def test_a_rebuild_refuses_an_estimator_of_other_weights_and_leaves_no_partial_folder(catalogued):
    checkpoint, root = catalogued
    _artifacts(checkpoint.delta_dir, "0" * 12)
    with pytest.raises(ValueError, match="was trained on model weights 000000000000, not the model rebuilt from"):
        hybrid_delta.rebuild(checkpoint, root)
    assert sorted(p.name for p in root.iterdir()) == [checkpoint.teacher.name]  # no model, no .partial folder


def _alter(teacher_dir, change) -> None:
    """Rewrite the teacher's converted weights with ``change`` applied to its tensors (same file, same names)."""
    from safetensors.torch import load_file, save_file

    path = teacher_dir / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_rebuild_on_an_altered_teacher_names_the_teacher_before_building_anything(catalogued, monkeypatch):
    """A converted teacher changed after conversion (one weight) is refused before a model is built — not blamed on
    the estimator the delta carries, whose recorded weights no model of that teacher matches."""
    from pretrained.loading import fingerprint

    checkpoint, root = catalogued
    rebuilt = hybrid_delta.rebuild(checkpoint, root)
    _artifacts(checkpoint.delta_dir, fingerprint(rebuilt, "weights"))  # the estimator of this model
    shutil.rmtree(rebuilt)

    def nudge(tensors):
        tensors["model.layers.0.mlp.up_proj.weight"][0, 0] += 1e-3
    _alter(root / checkpoint.teacher.name, nudge)
    monkeypatch.setattr(hybrid_delta, "build", lambda *args: pytest.fail("a model was built on an altered teacher"))
    with pytest.raises(ValueError, match=f"the converted weights in {root / checkpoint.teacher.name} .* are not the "
                                         "ones .* was distilled against"):
        hybrid_delta.rebuild(checkpoint, root)
    assert sorted(p.name for p in root.iterdir()) == [checkpoint.teacher.name]


def test_a_rebuild_on_a_damaged_teacher_file_says_so(catalogued):
    checkpoint, root = catalogued
    weights = root / checkpoint.teacher.name / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # truncated
    with pytest.raises(ValueError, match=f"the teacher {checkpoint.teacher.name} in {root / checkpoint.teacher.name} "
                                         "is damaged: .*model.safetensors.*bench fetch-model"):
        hybrid_delta.rebuild(checkpoint, root)
    assert sorted(p.name for p in root.iterdir()) == [checkpoint.teacher.name]


def test_a_rebuild_removes_its_partial_folder_on_any_failure(catalogued, monkeypatch):
    """Interrupted while the model is written (here: a KeyboardInterrupt from the copy of the tokenizer files), the
    rebuild leaves nothing behind; a later rebuild completes."""
    checkpoint, root = catalogued
    _teacher_tokenizer(root / checkpoint.teacher.name, lambda d: (d / "tokenizer.json").write_text("{}"))
    real = shutil.copyfile

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(shutil, "copyfile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hybrid_delta.rebuild(checkpoint, root)
    assert sorted(p.name for p in root.iterdir()) == [checkpoint.teacher.name]
    monkeypatch.setattr(shutil, "copyfile", real)
    assert hybrid_delta.rebuild(checkpoint, root) == root / checkpoint.name


def test_a_delta_that_records_no_teacher_weights_is_not_rebuilt(catalogued):
    checkpoint, root = catalogued
    recorded = hybrid_delta.manifest(checkpoint.delta_dir)
    del recorded["teacher_weights"]
    (checkpoint.delta_dir / hybrid_delta.MANIFEST_FILE).write_text(json.dumps(recorded))
    (checkpoint.delta_dir / "files.json").unlink()  # saved before deltas recorded either
    with pytest.raises(ValueError, match="records no digest of its teacher's converted weights"):
        hybrid_delta.rebuild(checkpoint, root)
    assert not (root / checkpoint.name).exists()


def test_the_shipped_delta_records_the_digest_of_its_teachers_conversion():
    """The digest the shipped hybrid was rebuilt against where its estimator was trained (the estimator records
    the rebuilt weights); a fetched teacher, where there is one, must be that conversion."""
    import pretrained

    checkpoint = pretrained.CHECKPOINTS["smollm2-135m-hybrid"]
    recorded = hybrid_delta.manifest(checkpoint.delta_dir)
    assert len(recorded["teacher_weights"]) == 64 and recorded["teacher_sha256"] == checkpoint.teacher.sha256
    teacher_dir = pretrained.installed(checkpoint.teacher)
    if teacher_dir is None:
        pytest.skip(f"{checkpoint.teacher.name} is not fetched")
    assert hybrid_delta.weights_digest(teacher_dir) == recorded["teacher_weights"]

# ---- later phases: copy windows, teacher samples, a phase begun from a delta, the retrieval probe ----

TINY2 = DistillConfig.for_phase(2, kd_steps=3, length=64, eval_every=3, eval_windows=1, warmup=1, chat_pool=2,
                                chat_tokens=4, probe_windows=2, copy_fraction=0.5, chat_fraction=0.3)


def _fake_documents(calls):
    """Training documents of lowercase words, held-out ones of digits: a window shows which split it read."""
    import random

    def documents(source, split="train", min_chars=400):
        calls.append((source, split))
        rng = random.Random(f"{source}:{split}")
        letters = "abcdefghij" if split == "train" else "0123456789"
        return tuple((f"/{source}/{split}/{k}", " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
                                                          for _ in range(120))) for k in range(4))
    return documents


@pytest.fixture
def fake_corpus(monkeypatch):
    calls = []
    monkeypatch.setattr("hybridmodel.distill_windows.documents", _fake_documents(calls))
    return calls


def test_old_phase_one_configs_still_compare_equal():
    """Checkpoints and deltas written before the phase fields existed resume under the phase-1 defaults."""
    old = {"transfer_steps": 300, "kd_steps": 1500, "length": 1024, "transfer_lr": 0.001, "kd_lr": 0.0002,
           "warmup": 20, "seed": 0, "eval_every": 50, "eval_windows": 6}
    assert DistillConfig.from_dict(old) == DistillConfig() == DistillConfig.for_phase(1)
    assert DistillConfig.from_dict({**old, "kd_steps": 3}) != DistillConfig()
    with pytest.raises(ValueError, match="unknown fields"):
        DistillConfig.from_dict({**old, "mystery": 1})
    with pytest.raises(ValueError, match="--transfer-steps 5 \\(transfer_steps\\): phase 2 starts from a converted "
                                         "delta, so give --transfer-steps 0, unless .*--attention-layers"):
        DistillConfig.for_phase(2, transfer_steps=5)


def test_a_copy_window_repeats_its_span_and_depends_on_seed_and_step_only(fake_corpus):
    tokenizer = build_tokenizer()
    windows = CopyWindows(tokenizer, "train", 200, seed=3)
    seen = set()
    for step in range(20):
        ids, first, repeat = windows(step)
        assert ids.shape == (1, 200)
        assert first[1] < repeat[0] and repeat[1] <= 200 and first[1] - first[0] == repeat[1] - repeat[0] >= 2
        assert torch.equal(ids[0, first[0]:first[1]], ids[0, repeat[0]:repeat[1]])
        sep = tokenizer.eos_token_id
        assert ids[0, first[0] - 1] == ids[0, first[1]] == ids[0, repeat[0] - 1] == ids[0, repeat[1]] == sep
        again = CopyWindows(tokenizer, "train", 200, seed=3)(step)
        assert torch.equal(again[0], ids) and again[1:] == (first, repeat)
        seen.add((tuple(ids[0].tolist()), first, repeat))
    assert len(seen) == 20  # every step another window
    assert not torch.equal(CopyWindows(tokenizer, "train", 200, seed=4)(0)[0], windows(0)[0])


def test_phase_two_trains_on_training_sources_only(teacher, student, fake_corpus, monkeypatch, tmp_path):
    """Every document read for training is of a training source's train split, and no window that trains (plain,
    copy, or a teacher sample's prompt) holds a held-out character; the held-out split serves the evaluation."""
    import hybridmodel.distill as module
    from workloads.corpus import EXTRA_LABEL_SOURCES, HAYSTACK_SOURCES, SOURCES

    tokenizer, trained = build_tokenizer(), []
    real_kd = module.kd_loss
    monkeypatch.setattr(module, "kd_loss", lambda s, t, ids: trained.append(ids) or real_kd(s, t, ids))
    cfg = DistillConfig.for_phase(2, kd_steps=8, length=64, eval_every=8, eval_windows=1, warmup=1, chat_pool=2,
                                  chat_tokens=2, probe_windows=1, copy_fraction=0.5, chat_fraction=0.25, seed=1)
    kinds = [module.window_kind(cfg, k) for k in range(cfg.steps)]
    assert {"plain", "copy", "chat"} <= set(kinds)
    origin = {"delta": "d", "sha256": "0" * 64, "record": {"step": 5, "config": {}}, "log": None}
    distill(teacher, tokenizer, copy.deepcopy(student), cfg, tmp_path, log=lambda line: None, origin=origin)
    assert {source for source, _ in fake_corpus} <= set(SOURCES)
    assert not set(SOURCES) & (set(HAYSTACK_SOURCES) | set(EXTRA_LABEL_SOURCES))
    digits = set(tokenizer("0123456789", add_special_tokens=False)["input_ids"])
    assert len(trained) == cfg.steps
    for kind, ids in zip(kinds, trained):
        if kind != "chat":
            assert not digits & set(ids[0].tolist()), kind
    samples = TeacherSamples(teacher, tokenizer, "train", data_seed(cfg), 2, 2, 64)
    for index in range(2):
        prompt = tokenizer.decode(samples.prompt(index))
        assert "<|im_start|>user" in prompt and not any(ch in prompt for ch in "0123456789")


def test_phase_four_distils_recall_windows_of_their_own_lengths(teacher, student, fake_corpus, monkeypatch, tmp_path):
    """Recall windows take their share of the steps, each of one of ``recall_lengths`` tokens (the one
    :func:`window_length` names), and the log counts the tokens every window had."""
    import hybridmodel.distill as module

    tokenizer, trained = build_tokenizer(), []
    real_kd = module.kd_loss
    monkeypatch.setattr(module, "kd_loss", lambda s, t, ids: trained.append(ids) or real_kd(s, t, ids))
    cfg = DistillConfig.for_phase(4, kd_steps=6, length=64, eval_every=6, eval_windows=1, warmup=1, chat_pool=2,
                                  chat_tokens=2, probe_windows=1, copy_fraction=0.1, chat_fraction=0.1,
                                  recall_fraction=0.7, recall_lengths=(384, 512), attention_layers=(3, 7), seed=2)
    kinds = [module.window_kind(cfg, k) for k in range(cfg.steps)]
    lengths = [module.window_length(cfg, k) for k in range(cfg.steps)]
    assert "recall" in kinds and {n for kind, n in zip(kinds, lengths) if kind == "recall"} == {384, 512}
    assert all(n == 64 for kind, n in zip(kinds, lengths) if kind != "recall")
    origin = {"delta": "d", "sha256": "0" * 64, "record": {"step": 5, "tokens": 320, "config": {}}, "log": None}
    distill(teacher, tokenizer, copy.deepcopy(student), cfg, tmp_path, log=lambda line: None, origin=origin)
    assert [ids.shape[1] for ids in trained] == lengths
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in log[1:]] == kinds
    assert [r["tokens"] for r in log[1:]] == [320 + sum(lengths[:k + 1]) for k in range(cfg.steps)]
    assert module.tokens_before(cfg, cfg.steps) == sum(lengths)


def test_recall_settings_are_checked():
    with pytest.raises(ValueError, match="recall_lengths=\\(128,\\): expected window lengths of at least 256"):
        DistillConfig.for_phase(4, recall_lengths=(128,))
    with pytest.raises(ValueError, match="copy_fraction \\+ chat_fraction \\+ recall_fraction = 1.1: over 1"):
        DistillConfig.for_phase(4, copy_fraction=0.5, chat_fraction=0.1, recall_fraction=0.5)
    with pytest.raises(ValueError, match="recall windows of length 64: give recall_lengths"):
        DistillConfig(length=64, recall_fraction=0.5)
    assert DistillConfig.from_dict({**vars(DistillConfig.for_phase(4)), "recall_lengths": [4096, 2048]}) == \
        DistillConfig.for_phase(4)  # as a JSON log writes it


@pytest.mark.parametrize("uses", [{"copy_fraction": 0.5}, {"probe_windows": 1}])
def test_copy_windows_shorter_than_two_spans_and_separators_are_refused(uses, fake_corpus):
    """A copy window holds two copies of a span of 2 tokens or more and 4 separators: the shortest that does is
    made for every step (the copies equal), one shorter is refused by the config, naming the minimum."""
    for length in range(1, MIN_COPY):
        with pytest.raises(ValueError, match=f"length={length}: .* needs windows of at least {MIN_COPY} tokens"):
            DistillConfig(length=length, **uses)
    DistillConfig(length=MIN_COPY, **uses)
    for step in range(5):
        ids, first, repeat = CopyWindows(build_tokenizer(), "train", MIN_COPY, seed=0)(step)
        assert ids.shape == (1, MIN_COPY) and first[1] - first[0] == repeat[1] - repeat[0] >= 2
        assert torch.equal(ids[0, first[0]:first[1]], ids[0, repeat[0]:repeat[1]])


def test_teacher_samples_are_seeded_and_cached(teacher, fake_corpus, tmp_path):
    tokenizer, cache = build_tokenizer(), tmp_path / "teacher_samples.jsonl"
    samples = TeacherSamples(teacher, tokenizer, "train", 7, pool=3, max_new_tokens=5, length=64, cache=cache)
    window = samples(0)
    assert window.shape == (1, 64) and cache.exists() and samples.samples
    fresh = TeacherSamples(teacher, tokenizer, "train", 7, pool=3, max_new_tokens=5, length=64)  # no cache
    assert torch.equal(fresh(0), window)  # deterministic in (seed, index)
    cached = TeacherSamples(teacher, tokenizer, "train", 7, pool=3, max_new_tokens=5, length=64, cache=cache)

    class NoGeneration:
        config = teacher.config

        def generate(self, *args, **kwargs):
            raise AssertionError("a cached conversation was generated again")
    cached.teacher = NoGeneration()
    assert torch.equal(cached(0), window)
    other = TeacherSamples(teacher, tokenizer, "train", 8, pool=3, max_new_tokens=5, length=64, cache=cache)
    assert not set(other.samples)  # another seed's conversations are not read back


def test_general_requests_take_their_share_of_the_pool_and_leave_the_rest_as_it_was(teacher, fake_corpus):
    """``general_fraction`` turns about that share of the pool into plain requests about a training word; every
    other conversation's user turn is the one a pool without them has (so is its cache key), and a share outside
    [0, 1] is refused."""
    from hybridmodel.distill_windows import GENERAL_INSTRUCTIONS

    tokenizer = build_tokenizer()
    plain = TeacherSamples(teacher, tokenizer, "train", 7, pool=200, max_new_tokens=5, length=64)
    mixed = TeacherSamples(teacher, tokenizer, "train", 7, pool=200, max_new_tokens=5, length=64,
                           general_fraction=0.75)
    openings = tuple(template.split("{")[0] for template in GENERAL_INSTRUCTIONS)
    general = [i for i in range(200) if mixed.message(i) != plain.message(i)]
    assert 120 <= len(general) <= 180
    assert all(mixed.message(i).startswith(openings) and "\n" not in mixed.message(i) for i in general)
    assert all(any(word in mixed.message(i) for word in mixed.topics) for i in general)
    assert "general_fraction" not in plain.key and mixed.key["general_fraction"] == 0.75
    assert DistillConfig.for_phase(5).chat_general_fraction == 0.75
    assert DistillConfig.for_phase(4).chat_general_fraction == 0.0  # phase 4's pool as it was generated
    with pytest.raises(ValueError, match="chat_general_fraction=1.5: expected a share in \\[0, 1\\]"):
        DistillConfig.for_phase(5, chat_general_fraction=1.5)


def test_general_requests_share_no_four_words_with_the_benchmarks_or_the_chat_check():
    """The plain requests are written apart from what the hybrid is judged on: the benchmark tasks' strings and the
    chat check's twenty questions (benchmarks/chat_answers.py)."""
    import importlib.util

    from bench.store.project_modules import ROOT
    from hybridmodel.distill_windows import GENERAL_INSTRUCTIONS
    from tests.model.test_recall_windows import _benchmark_grams, _grams

    spec = importlib.util.spec_from_file_location("chat_answers", ROOT / "benchmarks" / "chat_answers.py")
    chat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chat)
    judged = _benchmark_grams() | _grams(list(chat.QUESTIONS + chat.NEW_QUESTIONS))
    assert len(_grams(list(chat.QUESTIONS + chat.NEW_QUESTIONS))) > 20  # the questions were read
    for template in GENERAL_INSTRUCTIONS:
        pieces = template.replace("{topic}", "|").replace("{other}", "|").split("|")
        assert not _grams(pieces) & judged, template
        assert not _grams(pieces, 3) & _grams(list(chat.QUESTIONS + chat.NEW_QUESTIONS), 3), template


def test_phase_two_begins_from_a_delta_records_it_and_refuses_other_configs(teacher, student, fake_corpus,
                                                                           tmp_path):
    import hashlib
    from dataclasses import asdict

    from bench.commands.distill_commands import _start_from

    delta, run, lines = tmp_path / "delta", tmp_path / "phase2", []
    tokenizer = build_tokenizer()
    hybrid_delta.save(student, delta, "f" * 64, {"step": 7, "train_seconds": 10.0, "tokens": 448,
                                                 "teacher_ppl": 5.0, "config": asdict(TINY)})
    (delta / "training_log.jsonl").write_text("".join(json.dumps({"step": k, "stage": "kd", "loss": 1.0}) + "\n"
                                                      for k in range(1, 10)))  # 8, 9: logged after the delta's step
    assert _start_from(delta, TINY) == (hybrid_delta.manifest(delta)["training"], None)  # the same run continued
    with pytest.raises(ValueError, match="a later --phase"):
        _start_from(delta, DistillConfig(**{**vars(TINY), "kd_steps": 9}))
    start, origin = _start_from(delta, TINY2)
    assert start is None and origin["record"]["step"] == 7 and origin["delta"] == str(delta)
    assert origin["sha256"] == hashlib.sha256((delta / hybrid_delta.MIXERS_FILE).read_bytes()).hexdigest()
    hybrid = hybrid_delta.build(delta, teacher)
    record = distill(teacher, tokenizer, hybrid, TINY2, run, log=lines.append, checkpoint_every_s=0, origin=origin)
    assert record["step"] == 7 + TINY2.steps and record["phase"] == 2 and record["phase_step"] == TINY2.steps
    assert record["origin"] == {key: value for key, value in origin.items() if key != "log"}
    assert record["tokens"] == 448 + TINY2.steps * TINY2.length
    assert {"probe_acc", "probe_nll", "teacher_probe_acc", "heldout_ppl"} <= set(record)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    # the delta's history, the phase's evaluation of its start (at the delta's step), then the phase's steps
    assert [r["step"] for r in log] == list(range(1, 8)) + [7, 8, 9, 10]
    assert [r.get("phase_step") for r in log[7:]] == [0, 1, 2, 3] and {"probe_acc", "heldout_ppl"} <= set(log[7])
    state = torch.load(run / "last.pt", weights_only=False)
    assert state["origin"]["sha256"] == origin["sha256"] and state["offset"] == 7
    saved = hybrid_delta.save(hybrid, tmp_path / "out", "f" * 64, record).parent
    assert hybrid_delta.manifest(saved)["training"]["origin"]["delta"] == str(delta)
    from hybridmodel.distill_report import plot
    plot(run / "log.jsonl", tmp_path / "curves.png")
    # resumed: the phase's own config only
    again = copy.deepcopy(student)
    distill(teacher, tokenizer, again, TINY2, run, log=lines.append)
    assert any("resumed at step 3 of phase 2 (started from" in line for line in lines)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), hybrid.parameters()))
    for other in (DistillConfig(**{**vars(TINY2), "copy_fraction": 0.4}), TINY):
        with pytest.raises(ValueError, match="another distillation config"):
            distill(teacher, tokenizer, copy.deepcopy(student), other, run, log=lines.append)


def test_the_retrieval_probe_counts_what_a_brute_force_count_does(student, fake_corpus):
    tokenizer = build_tokenizer()
    windows = [CopyWindows(tokenizer, "heldout", 48, seed=5)(k) for k in range(3)]
    got = retrieval_probe(student, windows)
    hits, nll, count = 0, 0.0, 0
    with torch.no_grad():
        for ids, _, (start, end) in windows:
            logits = student(ids).logits[0]
            for position in range(start + 1, end):  # the repeat's tokens after its first
                row = logits[position - 1]
                hits += int(max(range(row.numel()), key=lambda v: row[v].item()) == ids[0, position].item())
                nll -= torch.log_softmax(row.double(), -1)[ids[0, position]].item()
                count += 1
    assert got["tokens"] == count and got["acc"] == pytest.approx(hits / count, abs=1e-12)
    assert got["nll"] == pytest.approx(nll / count, rel=1e-4)


def _distill_cli(monkeypatch, teacher):
    """``bench distill``'s parser, with the tiny teacher and the byte tokenizer standing in for the catalogued
    teacher."""
    import argparse

    import pretrained.loading
    from bench.commands.distill_commands import add_distill_arguments

    monkeypatch.setattr(pretrained.loading, "load", lambda spec: (teacher, build_tokenizer(), None))
    monkeypatch.setattr(pretrained.loading, "resolve", lambda spec: None)
    monkeypatch.setattr(pretrained.loading, "read_config", lambda directory: teacher.config.to_dict())
    monkeypatch.setattr(hybrid_delta, "weights_digest", lambda directory: "teacher-weights-digest")
    parser = argparse.ArgumentParser()
    add_distill_arguments(parser)
    return parser


def test_the_cli_begins_phase_two_from_a_delta_resumes_it_and_exports_it(teacher, student, fake_corpus, monkeypatch,
                                                                         tmp_path):
    """``bench distill --phase 2 --init-from DELTA``, the same command again (resumed), then ``--hours 0 --out``:
    the exported delta records its origin and its log ends at its step."""
    from dataclasses import asdict

    from bench.commands.distill_commands import run_distill

    parser = _distill_cli(monkeypatch, teacher)
    delta, run, out = tmp_path / "delta", tmp_path / "phase2", tmp_path / "out"
    hybrid_delta.save(student, delta, "f" * 64, {"step": 4, "train_seconds": 1.0, "tokens": 256,
                                                 "teacher_ppl": 5.0, "config": asdict(TINY)})
    common = ["--phase", "2", "--checkpoints", str(run), "--kd-steps", "2", "--length", "64", "--eval-every", "2",
              "--chat-pool", "2", "--chat-tokens", "2", "--probe-windows", "1"]
    with pytest.raises(ValueError, match="give --init-from"):
        run_distill(parser.parse_args(common))
    with pytest.raises(ValueError, match="--hours 0 trains nothing"):  # the delta would be untrained
        run_distill(parser.parse_args([*common, "--init-from", str(delta), "--hours", "0", "--out", str(out)]))
    assert not (run / "last.pt").exists() and not out.exists()
    run_distill(parser.parse_args([*common, "--init-from", str(delta)]))
    assert (run / "last.pt").exists()
    with pytest.raises(ValueError, match="another distillation config"):
        run_distill(parser.parse_args([*common[:-2], "--probe-windows", "2"]))
    hybrid_delta.save(student, out, "f" * 64, {"step": 4, "config": asdict(TINY)})
    with pytest.raises(ValueError, match="holds the delta of another distillation"):
        run_distill(parser.parse_args([*common, "--hours", "0", "--out", str(out)]))
    with open(run / TEACHER_SAMPLES, "a") as samples:  # whatever the two steps sampled, and a line of another key
        samples.write(json.dumps({"key": "another run's"}) + "\n")
    run_distill(parser.parse_args([*common, "--hours", "0", "--out", str(out), "--replace"]))
    training = hybrid_delta.manifest(out)["training"]
    assert training["step"] == 6 and training["phase_step"] == 2 and training["origin"]["delta"] == str(delta)
    assert DistillConfig.from_dict(training["config"]).phase == 2
    steps = [json.loads(line)["step"] for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert max(steps) == 6 and (out / "curves.png").exists()
    # the delta carries the teacher's samples; a fresh run going on from it takes them and the whole log
    assert (out / TEACHER_SAMPLES).read_bytes() == (run / TEACHER_SAMPLES).read_bytes()
    fresh = tmp_path / "fresh"
    run_distill(parser.parse_args([*common[:2], "--checkpoints", str(fresh), *common[4:], "--init-from", str(out),
                                   "--hours", "0"]))
    assert (fresh / TEACHER_SAMPLES).read_bytes() == (out / TEACHER_SAMPLES).read_bytes()
    assert (fresh / "log.jsonl").read_text() == (out / "training_log.jsonl").read_text()


def test_the_cli_moves_the_attention_of_a_delta_and_trains_the_new_gdn_layers_first(teacher, student, fake_corpus,
                                                                                    monkeypatch, tmp_path):
    """``bench distill --phase 3 --attention-layers 2,3 --init-from DELTA`` (a delta with attention at 3, 7):
    attention transfer on layer 7 alone (the one that became GDN), then distillation of every mixer; the exported
    delta holds the new placement, and a run that would move nothing refuses attention transfer."""
    from dataclasses import asdict

    from bench.commands.distill_commands import run_distill

    parser = _distill_cli(monkeypatch, teacher)
    delta, run, out = tmp_path / "delta", tmp_path / "phase3", tmp_path / "out"
    hybrid_delta.save(student, delta, "f" * 64, {"step": 4, "train_seconds": 1.0, "tokens": 256,
                                                 "teacher_ppl": 5.0, "config": asdict(TINY2)})
    common = ["--phase", "3", "--checkpoints", str(run), "--transfer-steps", "2", "--kd-steps", "1", "--length", "64",
              "--eval-every", "3", "--chat-pool", "2", "--chat-tokens", "2", "--probe-windows", "1",
              "--init-from", str(delta)]
    with pytest.raises(ValueError, match="the teacher has layers 0..7"):
        run_distill(parser.parse_args([*common, "--attention-layers", "3,8"]))
    with pytest.raises(SystemExit):  # argparse's own error line: a layer named twice
        parser.parse_args([*common, "--attention-layers", "3,3"])
    with pytest.raises(ValueError, match="trains no attention transfer"):
        run_distill(parser.parse_args([*common, "--attention-layers", "3,7"]))
    run_distill(parser.parse_args([*common, "--attention-layers", "2,3", "--out", str(out), "--replace"]))
    state = torch.load(run / "last.pt", weights_only=False)
    assert state["transfer_layers"] == (7,) and state["step"] == 3
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r.get("stage") for r in log if r.get("phase") == 3][1:] == ["transfer", "transfer", "kd"]
    assert attention_layers_of(hybrid_delta.build(out, teacher)) == (2, 3)
    with pytest.raises(ValueError, match=r"another distillation config \(attention_layers 2, 3 there, 2, 4 here\)"):
        run_distill(parser.parse_args([*common, "--attention-layers", "2,4"]))


def _one_adamw_step(model, lr: float):
    """One AdamW step of every mixer of ``model`` on a next-token loss, through :class:`LinearRegimeSteps`; returns
    the regime helper's view and the weights before the step."""
    params = list(hybrid_delta.mixer_state(model).values())
    for p in params:
        p.requires_grad_(True)
    before = {id(p): p.detach().clone() for p in params}
    regime = LinearRegimeSteps(model)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(5))
    logits = model(ids).logits
    torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()
    grads = {id(p): p.grad.detach().clone() for p in params}
    regime.scale_gradients()
    regime.step(optimizer)
    regime.remove()
    return before, grads


def test_linear_regime_rows_train_as_their_effective_weights_would(student):
    """A first AdamW step moves every weight by lr · sign(gradient); on the q/k rows in the norms' linear regime
    (scale c) the effective weights u = W / c must move so — W by c · lr — and every other row by lr."""
    model, lr = copy.deepcopy(student), 1e-3
    attention = model.model.layers[3].self_attn
    before, grads = _one_adamw_step(model, lr)
    c_k = math.sqrt(attention.k_norm.eps) / (1 + attention.k_norm.weight.detach()).mean().item()
    moved = attention.k_proj.weight.detach() - before[id(attention.k_proj.weight)]
    strong = grads[id(attention.k_proj.weight)].abs() > 1e-3 * grads[id(attention.k_proj.weight)].abs().max()
    assert torch.allclose(moved[strong], -c_k * lr * grads[id(attention.k_proj.weight)][strong].sign(), rtol=1e-2,
                          atol=0)
    d = attention.head_dim
    q_moved = (attention.q_proj.weight.detach() - before[id(attention.q_proj.weight)]).unflatten(0, (-1, 2, d))
    c_q = math.sqrt(attention.q_norm.eps) / (1 + attention.q_norm.weight.detach()).mean().item()
    assert q_moved[:, 0].abs().max() <= c_q * lr * 1.01  # query rows: the regime's rate
    assert q_moved[:, 1].abs().max() > 0.5 * lr  # output-gate rows: the ordinary rate
    out_moved = attention.o_proj.weight.detach() - before[id(attention.o_proj.weight)]
    assert out_moved.abs().max() > 0.5 * lr


def test_a_saturated_norm_trains_at_the_ordinary_rate(student):
    """q/k at the teacher's scale (norms saturated, as in deltas of phases 1-3): nothing is rescaled."""
    model, lr = copy.deepcopy(student), 1e-3
    attention = model.model.layers[3].self_attn
    with torch.no_grad():
        attention.k_proj.weight.mul_(1e4)
        attention.k_norm.weight.fill_(0.0)
    before, _ = _one_adamw_step(model, lr)
    moved = attention.k_proj.weight.detach() - before[id(attention.k_proj.weight)]
    assert moved.abs().max() > 0.5 * lr
