"""The ad's content: ContentArch and the item content measured like every block, the
data, the switch, configs without content unchanged, and the refusals."""

import dataclasses

import pytest
import torch
from synthetic import gembench_cli, run_cli
from torch.utils.flop_counter import FlopCounterMode

from gembench.harness.train.stack import STACKS
from gembench.models.config import load_config
from gembench.models.content import ContentArch, content_arch_flops
from gembench.models.data import SyntheticData
from gembench.models.flops import batch_forward_flops
from gembench.models.gem import build_model, interaction_tokens
from gembench.models.heads import multitask_loss
from gembench.models.memory import memory_estimate
from gembench.models.zoo import ZooWorkload


def tiny_with_content(tmp_path, section: str):
    text = open(load_config("tiny").source).read() + "\n[content]\n" + section
    path = tmp_path / "tiny-content.toml"
    path.write_text(text)
    return load_config(path)


CONTENT = 'names = ["image", "text"]\nvectors = [24, 40]\ntokens = 3\ntoken_dim = 8\nmlp = [32]\nsequence_dim = 12\n'


def module_flops(counter, name: str) -> int:
    """FLOPs the counter saw inside module ``name`` (its submodules included)."""
    return int(sum(counter.get_flop_counts().get(name, {}).values()))


def test_content_blocks_count_exactly_what_the_counter_counts(tmp_path):
    cfg = tiny_with_content(tmp_path, CONTENT)
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = SyntheticData(cfg, seed=0).batch(0)
    with FlopCounterMode(display=False) as counter:
        logits = model(batch)
    analytic = batch_forward_flops(cfg, batch)
    assert module_flops(counter, "GEM.content_arch") == analytic["content_arch"] > 0
    per_sequence = sum(module_flops(counter, f"GEM.item_content.{s.name}") for s in cfg.sequences)
    assert per_sequence == analytic["item_content"] > 0
    assert counter.get_total_flops() == pytest.approx(sum(analytic.values()), rel=1e-9)
    # training through the content: the projections get gradients
    multitask_loss(logits, batch.labels).backward()
    assert model.content_arch.vectors[0]._mlp[0]._linear.weight.grad.abs().sum() > 0
    assert model.item_content["clicks"].proj.weight.grad.abs().sum() > 0


def test_content_arch_shapes_and_formula():
    cfg = dataclasses.replace(load_config("small").content)
    arch = ContentArch(cfg, dim=32)
    b = 5
    out = arch(torch.randn(b, sum(cfg.vectors)), torch.randn(b, cfg.tokens, cfg.token_dim))
    assert out.shape == (b, cfg.candidate_tokens, 32) == (b, 3, 32)
    with FlopCounterMode(display=False) as counter:
        arch(torch.randn(b, sum(cfg.vectors)), torch.randn(b, cfg.tokens, cfg.token_dim))
    assert counter.get_total_flops() == content_arch_flops(cfg, 32, b)


def test_content_data_is_seeded_unit_norm_and_counted_in_input_bytes(tmp_path):
    cfg = tiny_with_content(tmp_path, CONTENT + 'dtype = "bf16"\n')
    data = SyntheticData(cfg, seed=3)
    a, again = data.batch(0), data.batch(0)
    assert torch.equal(a.content, again.content) and torch.equal(a.item_content, again.item_content)
    assert a.content.dtype == a.content_tokens.dtype == a.item_content.dtype == torch.bfloat16
    assert a.content.shape == (64, 64) and a.content_tokens.shape == (64, 3, 8)
    assert a.item_content.shape == (int(a.seq.values().numel()), 12)  # one per item of every sequence
    norms = torch.cat([a.content[:, :24].float().norm(dim=1), a.content[:, 24:].float().norm(dim=1)])
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
    content_bytes = 2 * (a.content.numel() + a.content_tokens.numel() + a.item_content.numel())
    plain = SyntheticData(load_config("tiny"), seed=3).batch(0)
    assert a.input_bytes == plain.input_bytes + content_bytes
    # the content is drawn after everything else: the rest of the batch is tiny's own
    assert torch.equal(a.sparse.values(), plain.sparse.values()) and torch.equal(a.labels, plain.labels)
    moved = a.to("cpu")
    assert moved.content is not None and moved.item_content is not None


def test_configs_without_content_are_unchanged_and_the_switch_drops_it(tmp_path):
    tiny = load_config("tiny")
    assert tiny.content is None and tiny.hash == "8f5ac4d00086513a"  # the committed baseline's
    assert "content_arch" not in batch_forward_flops(tiny, SyntheticData(tiny, seed=0).batch(0))
    cfg = tiny_with_content(tmp_path, CONTENT)
    assert cfg.hash != tiny.hash
    assert interaction_tokens(cfg) == interaction_tokens(tiny) + 3  # image, text, the token bag
    off = dataclasses.replace(STACKS["optimized"], content="off")
    ran = ZooWorkload(cfg).for_stack(off)  # the model content=off runs
    assert ran.fingerprint() == dataclasses.replace(cfg, content=None).hash
    model = ran.build(torch.device("cpu"))
    assert model.content_arch is None and model.item_content is None
    on, without = (memory_estimate(c, 64, None, STACKS["optimized"], "cuda")["activations"] for c in (cfg, ran.cfg))
    assert on > without  # the content's inputs and saved activations


def test_describe_shows_the_content_block(capsys):
    code, out, err = run_cli(["describe", "--config", "medium"], capsys)
    assert code == 0, err
    section = out[out.index("content (the ad's, from frozen encoders)") :].splitlines()
    rows = {line.split()[0]: line.split()[-1] for line in section[2:] if line.strip()}
    assert (rows["image"], rows["text"], rows["dtype"]) == ("512", "768", "bf16") and "item" in section[4]
    line = next(x for x in out.splitlines() if x.startswith("content_arch"))
    assert "787,712" in line  # its parameters: two MLPs 512->512->128 and 768->512->128


@pytest.mark.parametrize(
    "section, message",
    [
        ("vectors = [64, 0]\n", "'content.vectors' must be positive widths"),
        ("vectors = [64]\ntokens = -1\n", "'content.tokens' must be 0 (none) or a positive count"),
    ],
)
def test_bad_content_is_one_line_naming_the_field(tmp_path, capsys, section, message):
    path = tmp_path / "bad.toml"
    path.write_text(open(load_config("tiny").source).read() + "\n[content]\n" + section)
    code, _, err = run_cli(["describe", "--config", str(path)], capsys)
    assert code == 2 and message in err and str(path) in err
    assert len(err.strip().splitlines()) == 1


def test_content_on_a_dlrm_config_is_refused(tmp_path, capsys):
    path = tmp_path / "dlrm-content.toml"
    path.write_text(open(load_config("dlrm").source).read() + "\n[content]\nvectors = [64]\n")
    code, _, err = run_cli(["run", "--config", str(path)], capsys)
    assert code == 2 and "'content' is read by GEM's ContentArch only" in err
    assert len(err.strip().splitlines()) == 1


def test_content_runs_on_ranks_through_torchrecs_pipeline(tmp_path):
    """The content rides in the batch through TrainPipelineSparseDist (moved, streams recorded) and
    its blocks are FSDP/DDP dense blocks like the others; the result counts its FLOPs and input bytes."""
    import json

    cfg = tiny_with_content(tmp_path, CONTENT)
    out = tmp_path / "r.json"
    proc = gembench_cli(
        "run",
        "--config",
        cfg.source,
        "--nproc",
        "2",
        "--pipeline",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--set",
        "compile=off",
        "--out",
        str(out),
        "--quiet",
        timeout=300,
        library_warnings=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["config"]["hash"] == cfg.hash and r["flops"]["per_block"]["content_arch"] > 0
    plain = SyntheticData(load_config("tiny"), seed=0, batch_size=32).batch(0).input_bytes
    assert r["summary"]["input_bytes_per_step"] > 2 * plain  # two ranks' batches, each with its content
    assert "input bytes/step" in proc.stdout and "the ad's content" in proc.stdout
